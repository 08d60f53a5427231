//! `berth deploy`: starts a deployment on a running server and follows it to
//! its end — by its events, or by polling when the event stream fails — then
//! prints the outcome. Ctrl-C cancels the deployment on the server.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::api::{Api, Error, Events, Received};
use super::progress::ProgressView;
use super::text;

/// How often to ask for the deployment when there are no events.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// With events flowing but none about this deployment for this long, ask for
/// it directly: an event may have been lost (a slow subscriber loses old
/// events), and a deployment that ended must not be waited on forever.
const QUIET_CHECK: Duration = Duration::from_secs(10);
/// While polling, how many failed requests in a row (at `POLL_EVERY`) to
/// put up with before giving up: a restarting server comes back.
const POLL_RETRIES: u32 = 20;
/// The exit status of a process stopped by Ctrl-C, as shells report it.
const INTERRUPTED: u8 = 130;

pub struct DeployRequest {
    pub model: String,
    pub deployer: String,
    pub options: Map<String, Value>,
    pub json: bool,
}

pub async fn run(api: &Api, request: DeployRequest) -> Result<ExitCode, Error> {
    let interrupted = CancellationToken::new();
    let on_ctrl_c = interrupted.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });

    let model = super::find_model(api, &request.model).await?;
    let model_id = model["id"].as_i64().unwrap_or_default();
    // Subscribe first, so that no event of the new deployment can be missed.
    let events = match api.events().await {
        Ok(events) => Some(events),
        Err(e @ Error::Unreachable { .. }) => return Err(e),
        Err(e) => {
            eprintln!(
                "cannot follow the server's events ({e}); asking for the deployment every 500 ms instead"
            );
            None
        }
    };
    if interrupted.is_cancelled() {
        return Ok(ExitCode::from(INTERRUPTED));
    }
    let body = json!({ "deployer": request.deployer, "options": request.options });
    let started = api
        .post(
            &format!("/v1/models/{model_id}/deployments?wait=false"),
            &body,
        )
        .await?;
    let Some(deploy_id) = started["id"].as_i64() else {
        return Err(Error::Invalid(format!(
            "{} started a deployment but did not say its id",
            api.server()
        )));
    };

    let mut view = ProgressView::new(format!("deployment {deploy_id}"));
    view.say(&format!(
        "deployment {deploy_id}: {} is deploying model {model_id} ({})",
        request.deployer,
        model["job_id"].as_str().unwrap_or("?")
    ));
    let ended = if interrupted.is_cancelled() {
        None
    } else {
        tokio::select! {
            ended = follow(api, deploy_id, events, &mut view) => Some(ended),
            () = interrupted.cancelled() => None,
        }
    };
    view.clear();
    let Some(ended) = ended else {
        return cancel(api, deploy_id, request.json).await;
    };
    let deployment = ended?;
    print(&deployment, request.json);
    Ok(if deployment["status"] == "completed" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Waits for the deployment to end, showing its progress; returns its row.
async fn follow(
    api: &Api,
    deploy_id: i64,
    events: Option<Events>,
    view: &mut ProgressView,
) -> Result<Value, Error> {
    if let Some(mut events) = events {
        let mut quiet_until = Instant::now() + QUIET_CHECK;
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                () = tokio::time::sleep_until(quiet_until) => {
                    if let Some(ended) = ended(api, deploy_id).await? {
                        return Ok(ended);
                    }
                    quiet_until = Instant::now() + QUIET_CHECK;
                    continue;
                }
            };
            match next {
                None => {
                    view.say("the server closed its event stream; asking for the deployment every 500 ms instead");
                    break;
                }
                Some(Err(reason)) => {
                    view.say(&format!("the event stream broke ({reason}); asking for the deployment every 500 ms instead"));
                    break;
                }
                Some(Ok(Received::Missed)) => {
                    if let Some(ended) = ended(api, deploy_id).await? {
                        return Ok(ended);
                    }
                }
                Some(Ok(Received::Event { kind, data })) if data["deploy_id"] == deploy_id => {
                    quiet_until = Instant::now() + QUIET_CHECK;
                    match kind.as_str() {
                        "deployment.progress" => {
                            view.update(
                                data["phase"].as_str().unwrap_or("running"),
                                &data["progress"],
                            );
                        }
                        // The row is written before its event is published,
                        // so the poll below finds it ended at once.
                        "deployment.completed" | "deployment.failed" => break,
                        _ => {}
                    }
                }
                Some(Ok(Received::Event { .. })) => {}
            }
        }
    }
    poll(api, deploy_id, view).await
}

/// Completed or failed: queued and running rows have more to come.
fn is_over(deployment: &Value) -> bool {
    deployment["status"] == "completed" || deployment["status"] == "failed"
}

/// The deployment's row if it has ended.
async fn ended(api: &Api, deploy_id: i64) -> Result<Option<Value>, Error> {
    let deployment = api.get(&format!("/v1/deployments/{deploy_id}")).await?;
    Ok(is_over(&deployment).then_some(deployment))
}

async fn poll(api: &Api, deploy_id: i64, view: &mut ProgressView) -> Result<Value, Error> {
    let mut failures = 0;
    loop {
        match api.get(&format!("/v1/deployments/{deploy_id}")).await {
            Ok(deployment) if is_over(&deployment) => return Ok(deployment),
            Ok(deployment) => {
                failures = 0;
                if let Some(phase) = deployment["phase"].as_str() {
                    view.update(phase, &deployment["progress"]);
                }
            }
            Err(e @ Error::Unreachable { .. }) if failures < POLL_RETRIES => {
                if failures == 0 {
                    view.say(&format!("{e}; trying again"));
                }
                failures += 1;
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Ctrl-C: asks the server to cancel, shows how the deployment ended, and
/// exits as an interrupted process does. A second Ctrl-C stops waiting.
async fn cancel(api: &Api, deploy_id: i64, json: bool) -> Result<ExitCode, Error> {
    eprintln!("interrupted: cancelling deployment {deploy_id} (Ctrl-C again to stop waiting)");
    let path = format!("/v1/deployments/{deploy_id}/cancel");
    let nothing = json!({});
    let cancelled = tokio::select! {
        answer = api.post(&path, &nothing) => answer,
        _ = tokio::signal::ctrl_c() => return Ok(ExitCode::from(INTERRUPTED)),
    };
    match cancelled {
        Ok(deployment) => print(&deployment, json),
        // It ended before the cancel arrived: show how.
        Err(Error::Refused { status, .. }) if status == reqwest::StatusCode::CONFLICT => {
            match api.get(&format!("/v1/deployments/{deploy_id}")).await {
                Ok(deployment) => print(&deployment, json),
                Err(e) => eprintln!("error: {e}"),
            }
        }
        Err(e) => eprintln!("error: cannot cancel deployment {deploy_id}: {e}"),
    }
    Ok(ExitCode::from(INTERRUPTED))
}

/// The deployment's outcome on stdout: the row as JSON, or its fields that
/// matter to a person.
fn print(deployment: &Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(deployment).unwrap_or_default()
        );
        return;
    }
    let field = |name: &str| match &deployment[name] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let mut lines = vec![
        ("id", field("id")),
        ("status", field("status")),
        ("model", field("model_id")),
        ("deployer", field("deployer")),
    ];
    if deployment["status"] == "completed" {
        lines.push(("ref", field("ref")));
        lines.push(("details", field("details")));
        lines.push(("out dir", field("out_dir")));
    } else {
        lines.push(("error", field("error")));
    }
    if let Some(ms) = deployment["duration_ms"].as_i64() {
        lines.push(("duration", text::duration_ms(ms)));
    }
    for (name, value) in lines {
        println!("{name:<9} {value}");
    }
}

//! `berth deploy`: starts a deployment on a running server and follows it to
//! its end — by its events, or by polling when the event stream fails — then
//! prints the outcome. Ctrl-C cancels the deployment on the server.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::api::{Answer, Api, Error, Events, Received};
use super::progress::ProgressView;
use super::{text, word};
use crate::http::json::{DeployBody, Deployment, EventData, Status};

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
    let model_id = model.id;
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
    let body = DeployBody {
        deployer: Some(request.deployer.clone()),
        options: Some(Value::Object(request.options)),
    };
    let started: Answer<Deployment> = api
        .post(
            &format!("/v1/models/{model_id}/deployments?wait=false"),
            &body,
        )
        .await?;
    let deploy_id = started.body.id;

    let mut view = ProgressView::new(format!("deployment {deploy_id}"));
    view.say(&format!(
        "deployment {deploy_id}: {} is deploying model {model_id} ({})",
        request.deployer, model.job_id
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
    Ok(if deployment.body.status == Status::Completed {
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
) -> Result<Answer<Deployment>, Error> {
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
                // A kind this build does not know (a newer server's), or
                // data it cannot read, reads as `None` and is passed over:
                // the quiet check still finds the deployment's end.
                Some(Ok(Received::Event { kind, data })) => match EventData::read(&kind, data) {
                    Some(event) if event.deploy_id() == Some(deploy_id) => {
                        quiet_until = Instant::now() + QUIET_CHECK;
                        match event {
                            EventData::DeploymentProgress(p) => view.update(p.phase, &p.progress),
                            // The row is written before its event is
                            // published, so the poll below finds it ended
                            // at once.
                            EventData::DeploymentCompleted(_) | EventData::DeploymentFailed(_) => {
                                break;
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                },
            }
        }
    }
    poll(api, deploy_id, view).await
}

/// The deployment's row if it has ended.
async fn ended(api: &Api, deploy_id: i64) -> Result<Option<Answer<Deployment>>, Error> {
    let deployment: Answer<Deployment> = api.get(&format!("/v1/deployments/{deploy_id}")).await?;
    Ok(deployment.body.status.is_final().then_some(deployment))
}

async fn poll(
    api: &Api,
    deploy_id: i64,
    view: &mut ProgressView,
) -> Result<Answer<Deployment>, Error> {
    let mut failures = 0;
    loop {
        match api
            .get::<Deployment>(&format!("/v1/deployments/{deploy_id}"))
            .await
        {
            Ok(deployment) if deployment.body.status.is_final() => return Ok(deployment),
            Ok(deployment) => {
                failures = 0;
                if let Some(phase) = deployment.body.phase {
                    view.update(phase, &deployment.body.progress);
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
        answer = api.post::<Deployment>(&path, &nothing) => answer,
        _ = tokio::signal::ctrl_c() => return Ok(ExitCode::from(INTERRUPTED)),
    };
    match cancelled {
        Ok(deployment) => print(&deployment, json),
        // It ended before the cancel arrived: show how.
        Err(Error::Refused { status, .. }) if status == reqwest::StatusCode::CONFLICT => {
            match api
                .get::<Deployment>(&format!("/v1/deployments/{deploy_id}"))
                .await
            {
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
fn print(deployment: &Answer<Deployment>, json: bool) {
    if json {
        super::print_json(&deployment.raw);
        return;
    }
    let d = &deployment.body;
    let mut lines = vec![
        ("id", d.id.to_string()),
        ("status", word(d.status)),
        ("model", d.model_id.to_string()),
        ("deployer", d.deployer.clone()),
    ];
    if d.status == Status::Completed {
        lines.push(("ref", d.reference.clone().unwrap_or_default()));
        lines.push(("details", d.details.to_string()));
        lines.push(("out dir", d.out_dir.clone()));
    } else {
        lines.push(("error", d.error.clone().unwrap_or_default()));
    }
    if let Some(ms) = d.duration_ms {
        lines.push(("duration", text::duration_ms(ms)));
    }
    // Kept when it failed halfway: what it did put is somewhere now.
    for p in &d.published {
        lines.push((
            "published",
            format!(
                "{} ({}, sha256 {})",
                p.url,
                crate::human::size(p.bytes),
                p.sha256
            ),
        ));
    }
    let more = d.published_total.files.saturating_sub(d.published.len());
    if more > 0 {
        lines.push((
            "published",
            format!(
                "… and {more} more ({} in all): GET /v1/deployments/{}/published pages them",
                crate::human::size(d.published_total.bytes),
                d.id
            ),
        ));
    }
    for (name, value) in lines {
        println!("{name:<9} {value}");
    }
}

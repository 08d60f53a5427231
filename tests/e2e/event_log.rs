//! The event log behind `GET /v1/events`: every event has an id, a
//! subscriber resumes exactly after the id it names (`?after=`,
//! `Last-Event-ID`), a cursor that is not an id is refused, retention
//! prunes and says so to a cursor left behind, and servers sharing a
//! PostgreSQL database stream each other's events.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};

use crate::support::events::{Event, ended};
use crate::support::files::FileServer;
use crate::support::router::App;
use crate::support::server::{Backend, Berth, Shared};
use crate::support::{adapter_files, assert_error, eventually, model, on_both_backends};

on_both_backends!(events_carry_ids_and_a_subscriber_resumes_exactly_after_its_cursor);

/// What identifies an event in the log: id, kind, data.
fn entries(events: &[Event]) -> Vec<(i64, String, Value)> {
    events
        .iter()
        .map(|e| {
            let id =
                e.id.unwrap_or_else(|| panic!("an event without an id: {e:?}"));
            (id, e.kind.clone(), e.data.clone())
        })
        .collect()
}

#[track_caller]
fn assert_ids_increase(events: &[Event]) {
    let ids: Vec<i64> = entries(events).into_iter().map(|(id, ..)| id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids increase, each once: {ids:?}"
    );
}

/// The lifecycle kinds of deployment `id` among `events`, in order.
fn lifecycle_of<'a>(events: &'a [Event], id: &Value) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e.data["deploy_id"] == *id && e.kind != "deployment.progress")
        .map(|e| e.kind.as_str())
        .collect()
}

async fn events_carry_ids_and_a_subscriber_resumes_exactly_after_its_cursor(backend: Backend) {
    let files = FileServer::start().await;
    let app = App::start(backend).await;
    let id = app
        .register(&model(&files, "job-log", &adapter_files()))
        .await;
    let mut live = app.events().await;
    let deployments = format!("/v1/models/{id}/deployments");
    let mut ids = Vec::new();
    for deployer in ["archive", "misbehave"] {
        let (status, done) = app
            .post(&deployments, &json!({ "deployer": deployer }))
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        ids.push(done["id"].clone());
    }
    let all = live
        .until(|e| ids.iter().all(|id| ended(e, id)))
        .await
        .to_vec();
    assert_ids_increase(&all);
    assert_eq!(
        lifecycle_of(&all, &ids[0]),
        ["deployment.started", "deployment.completed"]
    );

    // From the middle: exactly what followed, whichever way the cursor
    // is given; the header wins over the parameter.
    let half = all.len() / 2;
    let cursor = all[half - 1].id.unwrap();
    let expected = entries(&all[half..]);
    let header = cursor.to_string();
    for (query, last_event_id) in [
        (format!("?after={cursor}"), None),
        (String::new(), Some(header.as_str())),
        ("?after=0".to_string(), Some(header.as_str())),
    ] {
        let mut resumed = app.events_from(&query, last_event_id).await;
        let got = resumed.until(|e| e.len() >= expected.len()).await;
        assert_eq!(
            entries(got),
            expected,
            "resuming with {query:?} and Last-Event-ID {last_event_id:?}"
        );
    }
    // From the start of the log: the model's registration (stored with
    // its row, before the subscription above began), then everything
    // above.
    let mut whole = app.events_from("?after=0", None).await;
    let got = whole.until(|e| ids.iter().all(|id| ended(e, id))).await;
    assert_eq!(got[0].kind, "model.registered");
    assert_eq!(got[0].data["model_id"], id);
    assert_eq!(entries(&got[1..]), entries(&all));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_that_is_not_an_event_id_is_refused() {
    let app = App::start(Backend::Sqlite).await;
    #[rustfmt::skip]
    app.check(&[
        (Method::GET, "/v1/events?after=abc", None, StatusCode::BAD_REQUEST, r#"after: "abc" is not an event id"#),
        (Method::GET, "/v1/events?after=-1", None, StatusCode::BAD_REQUEST, r#"after: "-1" is not an event id"#),
        (Method::GET, "/v1/events?after=1.5", None, StatusCode::BAD_REQUEST, r#"after: "1.5" is not"#),
        (Method::GET, "/v1/events?after=", None, StatusCode::BAD_REQUEST, r#"after: "" is not"#),
        (Method::GET, "/v1/events?since=3", None, StatusCode::BAD_REQUEST, "unknown field `since`"),
    ])
    .await;
    let request = Request::get("/v1/events?after=3")
        .header("last-event-id", "seven")
        .body(Body::empty())
        .unwrap();
    assert_error(
        &app.send(request).await,
        StatusCode::BAD_REQUEST,
        r#"the Last-Event-ID header: "seven" is not an event id; give the id of the last event received"#,
    );
}

/// Events older than the retention are pruned; a subscriber whose cursor
/// is older is told what it missed and goes on with what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_and_a_cursor_left_behind_is_told_so() {
    let files = FileServer::start().await;
    let berth = Berth::start_with(Backend::Sqlite, &["--events-retention-s", "3"]).await;
    let id = berth
        .register(&model(&files, "job-pruned", &adapter_files()))
        .await;
    let (status, first) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let mut before = berth.events_from("?after=0", None).await;
    let kept = before.until(|e| ended(e, &first["id"])).await.to_vec();
    let last = kept.last().unwrap().id.unwrap();
    eventually(
        || format!("the events pruned; log:\n{}", berth.log()),
        async || {
            berth
                .log()
                .contains("pruned events older than the retention")
                .then_some(())
        },
    )
    .await;
    // Wait for the whole first deployment to go.
    let missed = eventually(
        || "a cursor of 0 told it missed the first deployment".to_string(),
        async || {
            let mut stream = berth.events_from("?after=0", None).await;
            let comment = stream.until_comment("missed events").await;
            comment
                .starts_with(&format!("missed events 1 to {last}"))
                .then_some(comment)
        },
    )
    .await;
    assert!(
        missed.contains(
            "the event log no longer keeps them (its retention); continuing from the oldest kept"
        ),
        "{missed}"
    );

    let mut left_behind = berth.events_from("", Some(1)).await;
    let told = left_behind.until_comment("missed events").await;
    assert!(told.starts_with("missed events 2 to "), "{told}");
    let (status, second) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let after = left_behind.until(|e| ended(e, &second["id"])).await;
    assert_ids_increase(after);
    assert!(after[0].id.unwrap() > last, "{:?}", after[0]);
    assert_eq!(
        lifecycle_of(after, &second["id"]),
        ["deployment.started", "deployment.completed"]
    );
}

/// Three servers on one PostgreSQL database: a subscriber on A sees the
/// deployments run on B and C; after a while away, it reconnects with
/// `Last-Event-ID` and receives every event it missed, in order, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_streams_every_servers_events_and_a_reconnect_misses_none() {
    let shared = Shared::new().await;
    let start = || Berth::options(Backend::Postgres).shared(&shared).start();
    let (a, b, c) = (start().await, start().await, start().await);
    let files = FileServer::start().await;
    let id = b
        .register(&model(&files, "job-shared-events", &adapter_files()))
        .await;

    let mut on_a = a.events().await;
    let (status, on_b) = b.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{on_b}");
    let (status, on_c) = c.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "{on_c}");
    let seen = on_a
        .until(|e| ended(e, &on_b["id"]) && ended(e, &on_c["id"]))
        .await
        .to_vec();
    assert_ids_increase(&seen);
    for deployment in [&on_b, &on_c] {
        assert_eq!(
            lifecycle_of(&seen, &deployment["id"]),
            ["deployment.started", "deployment.completed"],
            "{deployment}"
        );
    }
    let cursor = seen.last().unwrap().id.unwrap();
    drop(on_a);

    // Away: deployments on B and C end meanwhile.
    let mut missed = Vec::new();
    for (server, deployer, options) in [
        (&b, "archive", json!({})),
        (&c, "misbehave", json!({"mode": "error"})),
        (&b, "misbehave", json!({"mode": "ok"})),
    ] {
        let (_, deployment) = server.deploy(id, deployer, options).await;
        missed.push(deployment["id"].clone());
    }
    let mut again = a.events_from("", Some(cursor)).await;
    let got = again
        .until(|e| missed.iter().all(|id| ended(e, id)))
        .await
        .to_vec();
    assert!(got[0].id.unwrap() > cursor, "{:?}", got[0]);
    assert_ids_increase(&got);
    for (id, ending) in missed.iter().zip([
        "deployment.completed",
        "deployment.failed",
        "deployment.completed",
    ]) {
        assert_eq!(
            lifecycle_of(&got, id),
            ["deployment.started", ending],
            "deployment {id}"
        );
    }
    // The same log, read from C after the same cursor: nothing more,
    // nothing less.
    let mut from_c = c.events_from(&format!("?after={cursor}"), None).await;
    let truth = from_c.until(|e| e.len() >= got.len()).await;
    assert_eq!(entries(truth), entries(&got));
}

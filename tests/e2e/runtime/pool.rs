//! The instance pool: a call past its slots waits for one instead of
//! failing, and a cancel ends the wait.

use std::time::Duration;

use berth::runtime::{CallError, Compiler, Engines, Limits, Runtime};
use serde_json::json;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use super::optimized::{deploy_call, load, log_reporter, small_model};
use crate::support::plugins;

/// A hang guard, far above any wait the pool should make here.
const HANG_GUARD: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_pool_waits_for_a_slot_and_a_cancel_ends_the_wait() {
    let engines = Engines {
        compiler: Compiler::Optimized,
        pool: Some(1),
    };
    let runtime = Runtime::new(Limits::default(), None, engines).unwrap();
    let plugin = load(&runtime, &plugins::test_plugin("misbehave")).await;
    let model = small_model();
    let out = TempDir::new().unwrap();
    // Far longer than the test: the slot is freed only by cancelling this.
    let sleep = json!({"mode": "sleep", "ms": 600_000}).to_string();
    let (stop_holding, cancel) = (CancellationToken::new(), CancellationToken::new());

    // The only slot, taken until cancelled.
    let holding = runtime.deploy(
        &plugin,
        deploy_call(&model, out.path(), 1, &sleep),
        log_reporter(1),
        &stop_holding,
    );
    tokio::pin!(holding);
    let check = runtime.check_options(&plugin, r#"{"mode":"ok"}"#);
    tokio::pin!(check);
    // Biased: the deployment must be polled first so that it, not the
    // question, takes the slot.
    tokio::select! {
        biased;
        ended = &mut holding => panic!("the sleeping deployment ended early: {ended:?}"),
        checked = &mut check => panic!("check-options ran while the only slot was taken: {checked:?}"),
        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
    }
    // A deployment waiting for the slot is cancelled while it waits, the
    // slot still taken: only the cancel can end its wait.
    let out2 = TempDir::new().unwrap();
    let ok = json!({"mode": "ok"}).to_string();
    let waiting = runtime.deploy(
        &plugin,
        deploy_call(&model, out2.path(), 2, &ok),
        log_reporter(2),
        &cancel,
    );
    tokio::pin!(waiting);
    tokio::select! {
        ended = &mut waiting => panic!("a deployment ran while the only slot was taken: {ended:?}"),
        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
    }
    cancel.cancel();
    let ended = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("the cancel ended the wait for the slot");
    assert_eq!(ended.unwrap_err(), CallError::Cancelled);
    let written: Vec<_> = std::fs::read_dir(out2.path()).unwrap().collect();
    assert!(
        written.is_empty(),
        "the cancelled deployment ran: {written:?}"
    );

    // Freed, the slot serves the question that waited for it.
    stop_holding.cancel();
    assert_eq!(holding.await.unwrap_err(), CallError::Cancelled);
    tokio::time::timeout(HANG_GUARD, check)
        .await
        .expect("check-options got the freed slot")
        .expect("check-options runs once the slot is free");
}

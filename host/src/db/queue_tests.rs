//! The queue's statements against a SQLite database of their own: who
//! claims which row, what the sweeps fail and what they leave, and what a
//! cancel does to each status.

use super::{Beat, CancelAsked, Claim, Runnable};
use crate::db::events::{Kinds, NewEvent, Report};
use crate::db::testing::{model, open, queue};
use crate::db::{Db, NewDeployment, now_ms};
use crate::model::{Deployment, Phase, Status};

fn runnable(keys: &[&str]) -> Runnable {
    Runnable(keys.iter().map(|k| k.to_string()).collect())
}

/// What `server` claims of what `keys` name, leased until `lease_until`:
/// the rows as claimed.
async fn claim(
    db: &Db,
    server: &str,
    keys: &[&str],
    lease_until: i64,
    limit: usize,
) -> Vec<Deployment> {
    db.claim(
        server,
        &runnable(keys),
        lease_until,
        |id| format!("/out/{id}"),
        limit,
        None,
    )
    .await
    .unwrap()
}

/// A report of each row's end, its data the row's id.
fn ended_report() -> Report {
    Report {
        server_id: "s".into(),
        events: Box::new(|row| {
            vec![NewEvent {
                kind: "deployment.failed".into(),
                data: row.id.to_string(),
                created_at: crate::db::now(),
            }]
        }),
        wake: None,
    }
}

/// The ids the stored `deployment.failed` events name, in order.
async fn failed_events(db: &Db) -> Vec<i64> {
    let events = db.events_after(0, Kinds::All, 100).await.unwrap();
    events
        .iter()
        .filter(|e| e.kind == "deployment.failed")
        .map(|e| e.data.parse().unwrap())
        .collect()
}

fn ids(rows: &[Deployment]) -> Vec<i64> {
    rows.iter().map(|d| d.id).collect()
}

async fn stored(db: &Db, id: i64) -> Deployment {
    db.deployment(id).await.unwrap().unwrap()
}

/// Records `server` as alive at `seen_ms`, named `name`, able to run `keys`.
async fn beat(db: &Db, server: &str, name: &str, keys: &[&str], seen_ms: i64) {
    let beat = Beat {
        server_id: server.into(),
        name: name.into(),
        runnable: runnable(keys),
        now_ms: seen_ms,
        lease_until: seen_ms + 1_000,
        live: Vec::new(),
    };
    db.beat(beat).await.unwrap();
}

#[tokio::test]
async fn queued_rows_are_claimed_in_order_once_by_the_server_that_runs_their_version() {
    let (_dir, db) = open().await;
    let model_id = db.insert_model(&model("job")).await.unwrap().id;
    let first = queue(&db, model_id, "a", "1").await;
    let second = queue(&db, model_id, "a", "1").await;
    let other_deployer = queue(&db, model_id, "b", "2").await;
    let third = queue(&db, model_id, "a", "1").await;
    let other_version = queue(&db, model_id, "a", "9").await;
    assert_eq!(first.status, Status::Queued);
    assert_eq!(first.server, None);

    let taken = claim(&db, "s1", &["a@1"], 5_000, 2).await;
    assert_eq!(ids(&taken), [first.id, second.id], "the oldest first");
    for row in &taken {
        assert_eq!(row.status, Status::Running);
        assert_eq!(row.server.as_deref(), Some("s1"));
        assert_eq!(row.phase, Some(Phase::Fetching));
        assert_eq!(row.out_dir, format!("/out/{}", row.id));
        assert!(row.started_at.is_some());
        assert_eq!(&stored(&db, row.id).await, row, "as stored");
    }
    let rest = claim(&db, "s2", &["a@1", "c@3"], 5_000, 10).await;
    assert_eq!(ids(&rest), [third.id], "claimed rows are not claimed again");
    assert_eq!(rest[0].server.as_deref(), Some("s2"));
    assert!(claim(&db, "s1", &["a@1"], 5_000, 10).await.is_empty());
    for id in [other_deployer.id, other_version.id] {
        let row = stored(&db, id).await;
        assert_eq!(row.status, Status::Queued, "nobody runs its version");
        assert_eq!(row.server, None);
    }
    assert!(claim(&db, "s1", &[], 5_000, 10).await.is_empty());
    assert!(claim(&db, "s1", &["b@2"], 5_000, 0).await.is_empty());
}

/// Servers claiming at once take each row once, and a row runs on the
/// server whose claim returned it.
/// A deployment recorded with a claim of `server`: running there at once
/// unless something is queued before it.
async fn take_at_once(db: &Db, model_id: i64, server: &str) -> Deployment {
    let new = NewDeployment {
        model_id,
        deployer: "a",
        options_json: "{}",
        dir: "/m",
        plugin_sha256: "1",
        created_by: None,
    };
    let claim = Claim {
        server_id: server.into(),
        lease_until: 5_000,
        phase: Phase::Deploying,
        out_dir: Box::new(|id| format!("/out/{id}")),
    };
    db.insert_deployment(new, Some(claim), None).await.unwrap()
}

#[tokio::test]
async fn a_claim_at_insert_holds_only_with_nothing_queued_before_it() {
    let (_dir, db) = open().await;
    let model_id = db.insert_model(&model("job")).await.unwrap().id;
    let taken = take_at_once(&db, model_id, "s1").await;
    assert_eq!(taken.status, Status::Running);
    assert_eq!(taken.server.as_deref(), Some("s1"));
    assert_eq!(taken.phase, Some(Phase::Deploying));
    assert_eq!(taken.out_dir, format!("/out/{}", taken.id));
    assert!(taken.started_at.is_some());
    assert_eq!(stored(&db, taken.id).await, taken, "as stored");

    let waiting = queue(&db, model_id, "a", "1").await;
    let behind = take_at_once(&db, model_id, "s1").await;
    assert_eq!(
        behind.status,
        Status::Queued,
        "it does not overtake {}",
        waiting.id
    );
    assert_eq!(behind.server, None);
    assert_eq!(behind.phase, None);
    assert_eq!(behind.out_dir, "");
    assert_eq!(behind.started_at, None);
    assert_eq!(stored(&db, behind.id).await, behind, "as stored");

    let claimed = claim(&db, "s2", &["a@1"], 5_000, 2).await;
    assert_eq!(ids(&claimed), [waiting.id, behind.id], "in order");
    let again = take_at_once(&db, model_id, "s1").await;
    assert_eq!(again.status, Status::Running, "nothing is queued any more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_claiming_at_once_take_each_row_once() {
    let (_dir, db) = open().await;
    let model_id = db.insert_model(&model("job")).await.unwrap().id;
    let mut queued = Vec::new();
    for _ in 0..12 {
        queued.push(queue(&db, model_id, "a", "1").await.id);
    }
    let mut claims = tokio::task::JoinSet::new();
    for server in 0..16 {
        let db = db.clone();
        claims.spawn(async move {
            let server = format!("s{server}");
            let rows = claim(&db, &server, &["a@1"], 5_000, 1).await;
            (server, rows)
        });
    }
    let mut claimed = Vec::new();
    while let Some(joined) = claims.join_next().await {
        let (server, rows) = joined.unwrap();
        for row in rows {
            assert_eq!(stored(&db, row.id).await.server, Some(server.clone()));
            claimed.push(row.id);
        }
    }
    claimed.sort();
    assert_eq!(claimed, queued, "each row once, none left");
}

#[tokio::test]
async fn the_sweep_fails_only_rows_whose_lease_ran_out_naming_their_owner() {
    let (_dir, db) = open().await;
    let model_id = db.insert_model(&model("job")).await.unwrap().id;
    for _ in 0..4 {
        queue(&db, model_id, "a", "1").await;
    }
    beat(&db, "s1", "alpha", &["a@1"], now_ms()).await;
    let named = claim(&db, "s1", &["a@1"], 1_000, 1).await.remove(0);
    // A server that never beat: known by its id alone.
    let unnamed = claim(&db, "s2", &["a@1"], 1_000, 1).await.remove(0);
    let leased = claim(&db, "s1", &["a@1"], 3_000, 1).await.remove(0);
    db.mark_deploying(vec![unnamed.id]).await.unwrap();

    let mut failed = db
        .fail_expired(
            2_000,
            |owner, phase| format!("{owner} lost it ({phase:?})"),
            Some(ended_report()),
        )
        .await
        .unwrap();
    failed.sort_by_key(|d| d.id);
    assert_eq!(ids(&failed), [named.id, unnamed.id]);
    // Each end's event was stored in the sweep's own transaction.
    let mut reported = failed_events(&db).await;
    reported.sort();
    assert_eq!(reported, ids(&failed));
    let errors: Vec<_> = failed.iter().map(|d| d.error.as_deref()).collect();
    assert_eq!(
        errors,
        [
            Some("alpha (s1) lost it (Some(Fetching))"),
            Some("s2 lost it (Some(Deploying))"),
        ]
    );
    for row in &failed {
        assert_eq!(row.status, Status::Failed);
        assert_eq!(row.phase, None);
        assert!(row.completed_at.is_some());
        assert_eq!(&stored(&db, row.id).await, row, "as stored");
    }
    assert_eq!(stored(&db, leased.id).await.status, Status::Running);
    let queued = db.queued_count().await.unwrap();
    assert_eq!(queued, 1, "a queued row has no lease to run out");
    let again = db
        .fail_expired(2_000, |_, _| String::new(), None)
        .await
        .unwrap();
    assert!(again.is_empty(), "an ended row is not failed twice");
}

#[tokio::test]
async fn the_sweep_fails_queued_rows_that_no_live_server_can_run() {
    let (_dir, db) = open().await;
    let model_id = db.insert_model(&model("job")).await.unwrap().id;
    let running = queue(&db, model_id, "x", "0").await;
    claim(&db, "s0", &["x@0"], i64::MAX, 1).await;
    let runnable = queue(&db, model_id, "a", "1").await;
    let stale_only = queue(&db, model_id, "b", "2").await;
    let nobody = queue(&db, model_id, "c", "3").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let queued_before = crate::db::now();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let young = queue(&db, model_id, "c", "3").await;
    beat(&db, "live", "live", &["a@1"], 10_000).await;
    beat(&db, "stale", "stale", &["b@2"], 1_000).await;

    let failed = db
        .fail_unrunnable(
            queued_before,
            5_000,
            |deployer, sha256| format!("nobody runs {deployer}@{sha256}"),
            Some(ended_report()),
        )
        .await
        .unwrap();
    assert_eq!(ids(&failed), [stale_only.id, nobody.id]);
    assert_eq!(failed_events(&db).await, ids(&failed), "stored with them");
    let errors: Vec<_> = failed.iter().map(|d| d.error.as_deref()).collect();
    assert_eq!(errors, [Some("nobody runs b@2"), Some("nobody runs c@3")]);
    for row in &failed {
        assert_eq!(row.status, Status::Failed);
        assert_eq!(row.started_at, None, "it never ran");
    }
    for (id, status) in [
        (runnable.id, Status::Queued),
        (young.id, Status::Queued),
        (running.id, Status::Running),
    ] {
        assert_eq!(stored(&db, id).await.status, status, "deployment {id}");
    }
}

#[tokio::test]
async fn a_cancel_dequeues_a_queued_row_and_asks_the_owner_of_a_running_one() {
    let (_dir, db) = open().await;
    let model_id = db.insert_model(&model("job")).await.unwrap().id;
    let running = queue(&db, model_id, "a", "1").await;
    claim(&db, "s1", &["a@1"], i64::MAX, 1).await;
    let queued = queue(&db, model_id, "a", "1").await;

    let asked = db.request_cancel(queued.id, "why", "dequeued", None).await;
    let CancelAsked::Dequeued(row) = asked.unwrap() else {
        panic!("a queued row is dequeued");
    };
    assert_eq!(
        (row.status, row.error.as_deref()),
        (Status::Failed, Some("dequeued"))
    );
    let again = db.request_cancel(queued.id, "why", "dequeued", None).await;
    assert!(
        matches!(again, Ok(CancelAsked::Ended(Status::Failed))),
        "{again:?}"
    );

    for reason in ["first", "second"] {
        let asked = db
            .request_cancel(running.id, reason, "dequeued", None)
            .await;
        assert!(
            matches!(&asked, Ok(CancelAsked::Running { server }) if server == "s1"),
            "{asked:?}"
        );
    }
    let reason = db.cancel_reason(running.id).await.unwrap();
    assert_eq!(reason.as_deref(), Some("first"), "the first asked wins");
    assert_eq!(stored(&db, running.id).await.status, Status::Running);
    let unknown = db.request_cancel(999, "why", "dequeued", None).await;
    assert!(matches!(unknown, Ok(CancelAsked::Unknown)), "{unknown:?}");
}

//! The event queue's own rules, on a SQLite log: past the limit, progress
//! events are dropped and the others kept; a refused write is offered
//! again, nothing reordered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Connection;

use super::*;
use crate::db::events::Kinds;
use crate::loops::Loops;
use crate::model::{Phase, Progress};

async fn log(dir: &tempfile::TempDir) -> (Db, String) {
    let url = format!("sqlite://{}", dir.path().join("events.db").display());
    (Db::connect(&url).await.unwrap(), url)
}

fn encode(event: &Event) -> String {
    format!("{event:?}")
}

fn loaded(name: &str) -> Event {
    Event::PluginLoaded { name: name.into() }
}

fn progress(deploy_id: i64) -> Event {
    Event::DeploymentProgress {
        deploy_id,
        model_id: 1,
        phase: Phase::Fetching,
        progress: Progress::default(),
    }
}

#[tokio::test]
async fn past_the_limit_progress_events_are_dropped_and_the_others_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = log(&dir).await;
    let events = Events::stored(db, "test".into(), encode, &Loops::new(Default::default()));
    // The appender runs on this thread, which does not yield meanwhile:
    // nothing is stored, everything waits.
    events.publish(progress(1));
    for i in 1..MAX_WAITING {
        events.publish(loaded(&i.to_string()));
    }
    events.publish(progress(2));
    events.publish(loaded("kept"));
    events.publish(progress(3));

    let waiting = events.shared.waiting.lock().unwrap();
    assert_eq!(waiting.events.len(), MAX_WAITING + 1);
    assert_eq!(waiting.dropped, 2);
    assert_eq!(waiting.events[0].data, encode(&progress(1)));
    assert_eq!(waiting.events[MAX_WAITING].data, encode(&loaded("kept")));
}

/// What this thread's tracing writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn says(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.0.lock().unwrap()).contains(text)
    }
}

#[tokio::test]
async fn a_refused_write_is_offered_again_in_publishing_order() {
    let dir = tempfile::tempdir().unwrap();
    let (db, url) = log(&dir).await;
    let mut other = sqlx::AnyConnection::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse BEFORE INSERT ON events \
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
    )
    .execute(&mut other)
    .await
    .unwrap();
    // The appender is a task of this thread's runtime: it logs here.
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    // More than one batch waits when the first is refused, and one more
    // event comes after.
    let names: Vec<String> = (0..BATCH + 2).map(|i| i.to_string()).collect();
    let events = Events::stored(
        db.clone(),
        "test".into(),
        encode,
        &Loops::new(Default::default()),
    );
    for name in &names[..=BATCH] {
        events.publish(loaded(name));
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        while !captured.says("could not store events") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the appender tried to store the first batch");
    events.publish(loaded(&names[BATCH + 1]));
    sqlx::query("DROP TRIGGER refuse")
        .execute(&mut other)
        .await
        .unwrap();
    events.close(Duration::from_secs(60)).await;

    let stored: Vec<String> = db
        .events_after(0, Kinds::All, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.data)
        .collect();
    let published: Vec<String> = names.iter().map(|name| encode(&loaded(name))).collect();
    assert!(stored == published, "stored out of order or incomplete");
}

#[test]
fn every_kind_reads_back_by_its_name_and_the_rules_old_spellings_too() {
    for kind in EventKind::ALL {
        assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
    }
    assert_eq!(
        EventKind::parse("model_registered"),
        Some(EventKind::ModelRegistered)
    );
    assert_eq!(
        EventKind::parse("deployment_completed"),
        Some(EventKind::DeploymentCompleted)
    );
    assert_eq!(EventKind::parse("model.deleted"), None);
    assert_eq!(EventKind::parse(""), None);
}

/// The page's event stream handles every kind the server sends: a kind
/// added here and not there is found here.
#[test]
fn the_pages_stream_knows_every_kind() {
    let stream = include_str!("../http/page/stream.js");
    for kind in EventKind::ALL {
        assert!(
            stream.contains(&format!("case \"{}\":", kind.as_str())),
            "stream.js has no case for {}",
            kind.as_str()
        );
    }
}

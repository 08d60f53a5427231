//! `berth serve` when its database is not there yet: it keeps trying for
//! `--database-wait-s`, saying so each time, starts as soon as the database
//! answers, and gives up with a sentence naming the database when it never
//! does. A real PostgreSQL server behind a loopback forwarder that starts
//! late stands for one that is restarting.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::support::server::fresh_postgres_database;

/// A loopback port nothing listens on (bound, then let go).
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

fn serve(database_url: &str, wait_s: u64) -> tokio::process::Command {
    let dir = tempfile::tempdir().unwrap().keep();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--plugins-dir")
        .arg(dir.join("plugins"))
        .args(["--database-wait-s", &wait_s.to_string()])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn serve_gives_up_on_a_database_it_never_reaches_and_says_why() {
    let url = format!("postgres://berth@127.0.0.1:{}/berth", closed_port().await);
    // Each try waits for a connection for a few seconds (the pool's
    // acquire timeout): 7 s leaves room for a second one.
    let run = tokio::time::timeout(Duration::from_secs(60), serve(&url, 7).output())
        .await
        .expect("serve gave up within a minute")
        .unwrap();
    assert!(!run.status.success(), "{run:?}");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        log.contains(&format!("cannot reach the database {url} yet")),
        "{log}"
    );
    assert!(log.contains("trying again in"), "{log}");
    assert!(
        log.contains(&format!("cannot reach the database {url}; gave up after")),
        "{log}"
    );
}

/// Every line serve writes, stdout and stderr alike, as it writes them.
fn lines_of(child: &mut tokio::process::Child) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    for stream in [
        Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(line);
            }
        });
    }
    rx
}

/// Reads lines until one holds `needle`; panics with what was said if
/// serve ends first or a minute passes (a hang guard).
async fn wait_for(
    lines: &mut mpsc::UnboundedReceiver<String>,
    said: &mut Vec<String>,
    needle: &str,
) {
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.recv().await {
            let hit = line.contains(needle);
            said.push(line);
            if hit {
                return true;
            }
        }
        false
    })
    .await;
    assert!(found == Ok(true), "serve never said {needle:?}: {said:#?}");
}

#[tokio::test]
async fn serve_starts_once_its_database_answers() {
    let real = url::Url::parse(&fresh_postgres_database().await).unwrap();
    let real_port = real.port().unwrap_or(5432);
    let port = closed_port().await;
    let mut late = real.clone();
    late.set_port(Some(port)).unwrap();
    let mut child = serve(late.as_str(), 60).spawn().unwrap();
    let mut lines = lines_of(&mut child);
    let mut said = Vec::new();

    // The database "comes up" once serve has said it is waiting for it.
    wait_for(&mut lines, &mut said, "trying again in").await;
    let forwarder = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = forwarder.accept().await {
            tokio::spawn(async move {
                let mut outbound = TcpStream::connect(("127.0.0.1", real_port)).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    wait_for(&mut lines, &mut said, "berth is listening").await;
    child.kill().await.unwrap();
}

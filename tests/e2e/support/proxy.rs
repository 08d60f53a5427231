//! A TCP proxy on loopback between one server and its database, that a
//! test can cut: the network between them, not the database, fails. A cut
//! is silent, as a partition is: nothing is forwarded any more, in either
//! direction, and no connection is closed or refused, so the server hears
//! nothing until it gives up by itself. Healed, connections made during the
//! cut are closed and new ones go through. It counts the connections it
//! accepts, and may cap each one's rate each way, as CDNs and object
//! stores do (a registry's, to see a blob read over several; an upload's,
//! to stop it halfway).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards what reaches `addr` to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::capped(upstream, None).await
    }

    /// Forwards what reaches `addr` to `upstream`, sending at most
    /// `bytes_per_s` on each connection each way.
    pub async fn capped(upstream: SocketAddr, bytes_per_s: Option<u64>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, _) = watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let cut = cut.clone();
            let accepted = accepted.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(forward(client, upstream, cut.subscribe(), bytes_per_s));
                }
            }
        });
        Self {
            addr,
            accepted,
            cut,
            task,
        }
    }

    /// How many connections it has accepted.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// `url` (a database URL naming a host and port) through this proxy.
    pub fn url_of(&self, url: &str) -> String {
        let mut parsed = url::Url::parse(url).unwrap();
        parsed.set_host(Some("127.0.0.1")).unwrap();
        parsed.set_port(Some(self.addr.port())).unwrap();
        parsed.to_string()
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The socket address of a database URL's host and port.
pub fn upstream_of(url: &str) -> SocketAddr {
    let parsed = url::Url::parse(url).unwrap();
    let host = parsed.host_str().unwrap();
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{}", parsed.port().unwrap_or(5432))
        .parse()
        .unwrap()
}

/// One connection: bytes both ways until either side closes, or a cut.
/// Cut, it holds both sockets without a byte until healed, then closes
/// them: the client learns of the cut only by its own timeouts.
async fn forward(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut cut: watch::Receiver<bool>,
    cap: Option<u64>,
) {
    if *cut.borrow_and_update() {
        let _ = cut.wait_for(|cut| !cut).await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let copied = async {
        match cap {
            None => drop(tokio::io::copy_bidirectional(&mut client, &mut server).await),
            Some(rate) => {
                let (mut from_client, mut to_client) = client.split();
                let (mut from_server, mut to_server) = server.split();
                let up = throttled(&mut from_client, &mut to_server, rate);
                let down = throttled(&mut from_server, &mut to_client, rate);
                let _ = tokio::join!(up, down);
            }
        }
    };
    let was_cut = tokio::select! {
        _ = copied => false,
        _ = cut.wait_for(|cut| *cut) => true,
    };
    if was_cut {
        let _ = cut.wait_for(|cut| !cut).await;
        let _ = client.shutdown().await;
    }
}

/// Copies `from` to `to` at most `rate` bytes a second.
async fn throttled(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    rate: u64,
) -> std::io::Result<()> {
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        sent += n as u64;
        let due = started + std::time::Duration::from_secs_f64(sent as f64 / rate as f64);
        tokio::time::sleep_until(due).await;
    }
}

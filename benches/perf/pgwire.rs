//! A counting proxy in front of PostgreSQL (benchmark 12's coordination
//! counts): it forwards bytes both ways untouched and reads the protocol
//! as it passes, so the servers it serves run exactly as they would
//! against the database directly, with nothing counted inside them. A
//! round trip is the client's `Sync` or simple `Query` (each waits for the
//! server's `ReadyForQuery`); a commit is a `COMMIT`, or an INSERT, UPDATE
//! or DELETE outside a transaction block (it commits itself). Connections
//! must not use TLS: `url` turns it off.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    round_trips: AtomicU64,
    commits: AtomicU64,
}

/// What the proxy has counted since it started.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted {
    pub round_trips: u64,
    pub commits: u64,
}

impl std::ops::Sub for Counted {
    type Output = Counted;

    fn sub(self, earlier: Counted) -> Counted {
        Counted {
            round_trips: self.round_trips - earlier.round_trips,
            commits: self.commits - earlier.commits,
        }
    }
}

pub struct Proxy {
    addr: SocketAddr,
    counts: Arc<Counts>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Proxy {
    /// Listens on loopback, forwarding to the server of `url`.
    pub async fn start(url: &str) -> anyhow::Result<Self> {
        let parsed = reqwest::Url::parse(url).with_context(|| format!("{url} is not a URL"))?;
        let upstream = format!(
            "{}:{}",
            parsed.host_str().context("a PostgreSQL URL names a host")?,
            parsed.port().unwrap_or(5432)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let counting = counts.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (counts, upstream) = (counting.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, counts).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            counts,
            accepting,
        })
    }

    /// `url` (a database on the proxied server) through the proxy, without
    /// TLS, which would hide the messages.
    pub fn url(&self, url: &str) -> anyhow::Result<String> {
        let mut parsed = reqwest::Url::parse(url)?;
        parsed
            .set_ip_host(self.addr.ip())
            .map_err(|()| anyhow::anyhow!("{url}: cannot set its host"))?;
        parsed
            .set_port(Some(self.addr.port()))
            .map_err(|()| anyhow::anyhow!("{url}: cannot set its port"))?;
        parsed.query_pairs_mut().append_pair("sslmode", "disable");
        Ok(parsed.to_string())
    }

    pub fn counted(&self) -> Counted {
        Counted {
            round_trips: self.counts.round_trips.load(Ordering::Relaxed),
            commits: self.counts.commits.load(Ordering::Relaxed),
        }
    }
}

/// Forwards both ways until either side closes, reading each direction's
/// messages as they pass.
async fn relay(client: TcpStream, server: TcpStream, counts: Arc<Counts>) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // The transaction status of the last ReadyForQuery: `I` idle, `T` in
    // a block, `E` in a failed one.
    let status = Arc::new(AtomicU8::new(b'I'));
    let (up_counts, down_counts, down_status) = (counts.clone(), counts, status.clone());
    let up = async move {
        // The startup message has no type byte; every later one has.
        let mut messages = Messages::new(false);
        let mut buffer = vec![0u8; 64 << 10];
        while let Ok(n) = client_read.read(&mut buffer).await {
            if n == 0 || server_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            messages.feed(&buffer[..n], |kind, _| {
                if matches!(kind, b'S' | b'Q') {
                    up_counts.round_trips.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let _ = server_write.shutdown().await;
    };
    let down = async move {
        let mut messages = Messages::new(true);
        let mut buffer = vec![0u8; 64 << 10];
        while let Ok(n) = server_read.read(&mut buffer).await {
            if n == 0 || client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            messages.feed(&buffer[..n], |kind, body| match kind {
                b'Z' => {
                    if let Some(&now) = body.first() {
                        down_status.store(now, Ordering::Relaxed);
                    }
                }
                b'C' => {
                    let tag = body.split(|&b| b == 0).next().unwrap_or_default();
                    let outside = down_status.load(Ordering::Relaxed) == b'I';
                    let writes = [&b"INSERT"[..], b"UPDATE", b"DELETE"]
                        .iter()
                        .any(|w| tag.starts_with(w));
                    if tag == b"COMMIT" || (outside && writes) {
                        down_counts.commits.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {}
            });
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Splits one direction's bytes into messages: a type byte (but for the
/// client's first), a big-endian length counting itself, the body.
struct Messages {
    typed: bool,
    pending: Vec<u8>,
}

impl Messages {
    fn new(typed: bool) -> Self {
        Self {
            typed,
            pending: Vec::new(),
        }
    }

    fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(u8, &[u8])) {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let header = if self.typed { 5 } else { 4 };
            let Some(head) = self.pending.get(at..at + header) else {
                break;
            };
            // A length counts its own 4 bytes: less is a stream out of step.
            let length = u32::from_be_bytes(head[header - 4..].try_into().expect("4 bytes")).max(4);
            let end = at + header - 4 + length as usize;
            if end > self.pending.len() {
                break;
            }
            if self.typed {
                each(head[0], &self.pending[at + header..end]);
            }
            self.typed = true;
            at = end;
        }
        self.pending.drain(..at);
    }
}

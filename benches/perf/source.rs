//! The loopback model source the fetch benchmarks download from: a plain
//! HTTP/1.1 file server, one thread per connection, bodies sent with
//! `sendfile` (std's `io::copy` from a file to a socket) so the source costs
//! as little CPU as possible and the same for every client. Understands
//! `Range: bytes=N-` and `bytes=N-M`; `/cut/N/PATH` sends N bytes of PATH's
//! answer, then drops the connection (an interrupted download), and
//! `/cap/R/PATH` sends it at no more than R MB/s per connection, as object
//! stores and CDNs do.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};

pub struct Source {
    pub addr: SocketAddr,
}

impl Source {
    /// Serves the files under `root` until the process ends.
    pub fn start(root: &Path) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let root = root.to_path_buf();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let root = root.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &root);
                });
            }
        });
        Ok(Self { addr })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }
}

fn serve(stream: TcpStream, root: &Path) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request)? == 0 {
            return Ok(());
        }
        let mut range = None;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("range")
            {
                range = value
                    .trim()
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(first, last)| {
                        Some((first.parse::<u64>().ok()?, last.parse::<u64>().ok()))
                    });
            }
        }
        let target = request
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .split('?')
            .next()
            .unwrap_or("/");
        let (mut cut, mut cap) = (None, None);
        let mut path = target.trim_start_matches('/');
        loop {
            if let Some((n, rest)) = prefixed("cut/", path) {
                (cut, path) = (Some(n), rest);
            } else if let Some((n, rest)) = prefixed("cap/", path) {
                (cap, path) = (Some(n), rest);
            } else {
                break;
            }
        }
        let file = resolve(root, path).and_then(|p| std::fs::File::open(p).ok());
        let Some(file) = file else {
            out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        };
        let len = file.metadata()?.len();
        let span = range
            .filter(|(from, _)| *from < len)
            .map(|(from, last)| (from, last.map_or(len, |last| (last + 1).min(len))));
        let mut head = match span {
            Some((from, end)) => format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{len}\r\nContent-Length: {}\r\n",
                end - 1,
                end - from
            ),
            None => format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n"),
        };
        head.push_str("Accept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n\r\n");
        out.write_all(head.as_bytes())?;
        let (from, end) = span.unwrap_or((0, len));
        let mut body = file;
        std::io::Seek::seek(&mut body, std::io::SeekFrom::Start(from))?;
        let send = cut.map_or(end - from, |n| n.min(end - from));
        match cap {
            None => {
                std::io::copy(&mut body.take(send), &mut out)?;
            }
            Some(mb_per_s) => send_capped(&mut body, &mut out, send, mb_per_s)?,
        }
        if cut.is_some() {
            let _ = out.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}

/// `PREFIX/N/REST` → `(N, REST)`.
fn prefixed<'a>(prefix: &str, path: &'a str) -> Option<(u64, &'a str)> {
    let (n, rest) = path.strip_prefix(prefix)?.split_once('/')?;
    Some((n.parse().ok()?, rest))
}

/// Sends `len` bytes of `body` at no more than `mb_per_s` MB/s: a block at
/// a time, each waiting until the rate allows it.
fn send_capped(
    body: &mut std::fs::File,
    out: &mut TcpStream,
    len: u64,
    mb_per_s: u64,
) -> std::io::Result<()> {
    const BLOCK: u64 = 256 * 1024;
    let started = std::time::Instant::now();
    let rate = (mb_per_s.max(1) * 1_000_000) as f64;
    let mut sent = 0;
    while sent < len {
        let n = BLOCK.min(len - sent);
        std::io::copy(&mut (&mut *body).take(n), out)?;
        sent += n;
        let due = std::time::Duration::from_secs_f64(sent as f64 / rate);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// A request path under the root, refusing anything that climbs out.
fn resolve(root: &Path, path: &str) -> Option<PathBuf> {
    let path = Path::new(path);
    path.components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
        .then(|| root.join(path))
}

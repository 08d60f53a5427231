//! The loopback model source the fetch benchmarks download from: a plain
//! HTTP/1.1 file server, one thread per connection, bodies sent with
//! `sendfile` (std's `io::copy` from a file to a socket) so the source costs
//! as little CPU as possible and the same for every client. Understands
//! `Range: bytes=N-`, and `/cut/N/PATH` sends N bytes of PATH's answer, then
//! drops the connection (an interrupted download).

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
                    .and_then(|r| r.trim_end_matches('-').parse::<u64>().ok());
            }
        }
        let target = request
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .split('?')
            .next()
            .unwrap_or("/");
        let (cut, path) = match target
            .strip_prefix("/cut/")
            .and_then(|rest| rest.split_once('/'))
        {
            Some((n, path)) => (n.parse::<u64>().ok(), path),
            None => (None, target.trim_start_matches('/')),
        };
        let file = resolve(root, path).and_then(|p| std::fs::File::open(p).ok());
        let Some(file) = file else {
            out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        };
        let len = file.metadata()?.len();
        let from = range.filter(|from| *from < len);
        let mut head = match from {
            Some(from) => format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{len}\r\nContent-Length: {}\r\n",
                len - 1,
                len - from
            ),
            None => format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n"),
        };
        head.push_str("Accept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n\r\n");
        out.write_all(head.as_bytes())?;
        let from = from.unwrap_or(0);
        let mut body = file;
        std::io::Seek::seek(&mut body, std::io::SeekFrom::Start(from))?;
        let send = cut.map_or(len - from, |n| n.min(len - from));
        std::io::copy(&mut body.take(send), &mut out)?;
        if cut.is_some() {
            let _ = out.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}

/// A request path under the root, refusing anything that climbs out.
fn resolve(root: &Path, path: &str) -> Option<PathBuf> {
    let path = Path::new(path);
    path.components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
        .then(|| root.join(path))
}

//! Guests' outgoing HTTP over a connection opened here, to exactly the
//! address the gate checked: TCP to that `SocketAddr`, for `https` TLS with
//! the requested host as SNI and as the name the certificate must carry
//! (trusting the public roots wasmtime-wasi-http's own sender trusts, plus
//! `--ca-file`), then one HTTP/1.1 exchange. wasi:http's request options
//! (connect, first-byte and between-bytes timeouts) bound it as they bound
//! wasmtime's default sender. Never resolves a name, so what was checked is
//! what is reached; never decides who may connect (`http_gate` does).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep, timeout};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use crate::trust::Trust;

/// wasmtime-wasi-http's default for each timeout a guest leaves unset.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The answer wasmtime expects of a send: the response, and the future
/// that carries the connection's remaining I/O.
pub(crate) type Sent = (
    http::Response<WasiBody>,
    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
);

/// Why a request was not answered: the error the guest sees, and the
/// sentence for the server's log.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: Error,
    pub(crate) reason: String,
}

impl Failure {
    fn new(error: Error, reason: impl Into<String>) -> Self {
        Self {
            error,
            reason: reason.into(),
        }
    }
}

/// The TLS settings of every guest's HTTPS requests, shared by all stores.
#[derive(Clone)]
pub(crate) struct Connector {
    tls: tokio_rustls::TlsConnector,
}

impl Connector {
    pub(crate) fn new(trust: &Trust) -> Self {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls' default protocol versions")
        .with_root_certificates(trust.roots())
        .with_no_client_auth();
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// Sends `request` to `addr`; over TLS for `tls_name`, the host name
    /// (or address) the server's certificate must be for.
    pub(crate) async fn send(
        &self,
        mut request: http::Request<WasiBody>,
        addr: SocketAddr,
        tls_name: Option<&str>,
        options: Option<RequestOptions>,
    ) -> Result<Sent, Failure> {
        let limit = |pick: fn(&RequestOptions) -> Option<Duration>| {
            options.as_ref().and_then(pick).unwrap_or(DEFAULT_TIMEOUT)
        };
        let connect_limit = limit(|o| o.connect_timeout);
        let first_byte = limit(|o| o.first_byte_timeout);
        let between_bytes = limit(|o| o.between_bytes_timeout);

        let tls_name = tls_name
            .map(|name| {
                ServerName::try_from(name.to_string()).map_err(|e| {
                    Failure::new(
                        Error::InvalidDnsNameError(e),
                        format!("{name} is not a name a certificate can be for"),
                    )
                })
            })
            .transpose()?;
        let connect = async {
            let tcp = TcpStream::connect(addr).await.map_err(|e| {
                let reason = format!("cannot connect to {addr}: {e}");
                Failure::new(Error::Connect(e), reason)
            })?;
            let io: Box<dyn Io> = match tls_name {
                None => Box::new(tcp),
                Some(name) => Box::new(
                    self.tls
                        .connect(name.clone(), tcp)
                        .await
                        .map_err(|e| tls_failure(e, &name, addr))?,
                ),
            };
            hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| {
                    let reason = format!("HTTP with {addr} failed: {e}");
                    Failure::new(Error::Hyper(e), reason)
                })
        };
        let (mut sender, connection) = timeout(connect_limit, connect).await.map_err(|_| {
            Failure::new(
                Error::ConnectionTimeout,
                format!("no connection to {addr} within {}", crate::human::duration(connect_limit)),
            )
        })??;

        // The request line carries the path only: scheme and authority are
        // for proxies, and the Host header (set by wasmtime) names the host.
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .expect("a path and query is a URI");
        *request.uri_mut() = path;

        // The connection must be driven while the answer is awaited; what
        // is left of it afterwards goes back to wasmtime, which drives it
        // while the guest reads the body.
        let mut connection = Box::pin(connection);
        let mut connection_ended = false;
        let answer = timeout(first_byte, sender.send_request(request));
        tokio::pin!(answer);
        let answer = loop {
            tokio::select! {
                answer = &mut answer => break answer,
                ended = &mut connection, if !connection_ended => {
                    connection_ended = true;
                    if let Err(e) = ended {
                        let reason = format!("the connection to {addr} broke off: {e}");
                        return Err(Failure::new(Error::Hyper(e), reason));
                    }
                }
            }
        };
        let response = answer
            .map_err(|_| {
                Failure::new(
                    Error::ConnectionReadTimeout,
                    format!(
                        "{addr} sent no answer within {}",
                        crate::human::duration(first_byte)
                    ),
                )
            })?
            .map_err(|e| {
                let reason = format!("{addr} did not answer: {e}");
                Failure::new(Error::Hyper(e), reason)
            })?;
        let response = response.map(|incoming| Paced::new(incoming, between_bytes).boxed_unsync());
        let rest: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
            if connection_ended {
                Box::new(async { Ok(()) })
            } else {
                Box::new(async move {
                    connection.await.map_err(|e| match e.is_timeout() {
                        true => Error::HttpResponseTimeout,
                        false => Error::Hyper(e),
                    })
                })
            };
        Ok((response, rest))
    }
}

/// A TLS handshake's failure in the words and the error code that fit it:
/// a certificate problem says which name and which roots.
fn tls_failure(e: std::io::Error, name: &ServerName<'_>, addr: SocketAddr) -> Failure {
    let name = name.to_str();
    match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(problem)) => Failure::new(
            Error::TlsCertificateError,
            format!(
                "the certificate of {name} (at {addr}) is not trusted: {problem:?}; \
                 a private CA must be given to the server with --ca-file"
            ),
        ),
        Some(rustls::Error::AlertReceived(alert)) => Failure::new(
            Error::TlsAlertReceived {
                alert_id: Some(u8::from(*alert)),
                alert_message: Some(format!("{alert:?}")),
            },
            format!("{name} (at {addr}) ended the TLS handshake: {alert:?}"),
        ),
        _ => {
            let reason = format!("TLS with {name} (at {addr}) failed: {e}");
            Failure::new(Error::Tls(e), reason)
        }
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A response body that fails once the server pauses longer than the
/// guest's between-bytes timeout.
struct Paced {
    incoming: Incoming,
    gap: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Paced {
    fn new(incoming: Incoming, gap: Duration) -> Self {
        Self {
            incoming,
            gap,
            deadline: Box::pin(tokio::time::sleep(gap)),
        }
    }
}

impl Body for Paced {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.deadline.as_mut().reset(Instant::now() + this.gap);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) if e.is_timeout() => {
                Poll::Ready(Some(Err(Error::HttpResponseTimeout)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::Hyper(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                ready!(this.deadline.as_mut().poll(cx));
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

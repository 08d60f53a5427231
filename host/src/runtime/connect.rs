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
                format!(
                    "no connection to {addr} within {}",
                    crate::human::duration(connect_limit)
                ),
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

/// A TLS handshake's failure, with the error code that fits it and a
/// sentence that says which name and address, and how to trust an
/// internal CA when that is what is missing.
fn tls_failure(e: std::io::Error, name: &ServerName<'_>, addr: SocketAddr) -> Failure {
    let reason = format!(
        "TLS with {} at {addr} failed: {e}{}",
        name.to_str(),
        crate::trust::hint(&e)
    );
    let error = match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(_)) => Error::TlsCertificateError,
        Some(rustls::Error::AlertReceived(alert)) => Error::TlsAlertReceived {
            alert_id: Some(u8::from(*alert)),
            alert_message: Some(format!("{alert:?}")),
        },
        _ => Error::Tls(e),
    };
    Failure::new(error, reason)
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

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::HeaderMap;
    use http_body_util::Empty;

    use super::*;
    use crate::test_tls::{self, TestCa};

    /// An HTTPS server for `names`, signed by `ca`, that answers with the
    /// `Host` header and the request target it got.
    async fn server(ca: &TestCa, names: &[&str]) -> SocketAddr {
        let app = Router::new().fallback(|headers: HeaderMap, uri: http::Uri| async move {
            format!("{} {uri}", headers["host"].to_str().unwrap())
        });
        test_tls::serve(app, ca.server(names)).await
    }

    fn trusting(ca: &TestCa) -> Connector {
        let dir = tempfile::tempdir().unwrap();
        Connector::new(&Trust::load(&ca.write(dir.path(), "ca.pem")).unwrap())
    }

    fn get(url: &str) -> http::Request<WasiBody> {
        let uri: http::Uri = url.parse().unwrap();
        http::Request::get(&uri)
            .header("host", uri.authority().unwrap().as_str())
            .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
            .unwrap()
    }

    async fn text(sent: Sent) -> (http::StatusCode, String) {
        let (response, rest) = sent;
        tokio::spawn(Box::into_pin(rest));
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_name_is_verified_at_the_checked_address_without_being_resolved() {
        let ca = TestCa::new("berth test CA");
        // berth.test resolves nowhere: only the address given is reached.
        let addr = server(&ca, &["berth.test"]).await;
        let url = format!("https://berth.test:{}/models/a?x=1", addr.port());
        let sent = trusting(&ca)
            .send(get(&url), addr, Some("berth.test"), None)
            .await
            .unwrap();
        assert_eq!(
            text(sent).await,
            (
                http::StatusCode::OK,
                format!("berth.test:{} /models/a?x=1", addr.port())
            )
        );
    }

    #[tokio::test]
    async fn a_certificate_for_another_name_or_from_an_unknown_ca_is_refused() {
        let ca = TestCa::new("berth test CA");
        let addr = server(&ca, &["berth.test"]).await;
        let url = format!("https://berth.test:{}/", addr.port());

        let other = trusting(&ca)
            .send(get(&url), addr, Some("other.test"), None)
            .await
            .err()
            .unwrap();
        assert!(
            matches!(other.error, Error::TlsCertificateError),
            "{other:?}"
        );
        assert_eq!(
            other.reason,
            format!(
                "TLS with other.test at {addr} failed: invalid peer certificate: certificate not \
                 valid for name \"other.test\"; certificate is only valid for DnsName(\"berth.test\")"
            )
        );

        let stranger = TestCa::new("another CA");
        for connector in [trusting(&stranger), Connector::new(&Trust::default())] {
            let unknown = connector
                .send(get(&url), addr, Some("berth.test"), None)
                .await
                .err()
                .unwrap();
            assert!(
                matches!(unknown.error, Error::TlsCertificateError),
                "{unknown:?}"
            );
            assert_eq!(
                unknown.reason,
                format!(
                    "TLS with berth.test at {addr} failed: invalid peer certificate: UnknownIssuer \
                     (the certificate is signed by a CA berth does not trust: give the server that \
                     CA with --ca-file)"
                )
            );
        }
    }

    #[tokio::test]
    async fn plain_http_goes_to_the_address_with_the_requested_host() {
        let app = Router::new().fallback(|headers: HeaderMap| async move {
            headers["host"].to_str().unwrap().to_string()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let sent = Connector::new(&Trust::default())
            .send(get("http://mirror.test/x"), addr, None, None)
            .await
            .unwrap();
        assert_eq!(
            text(sent).await,
            (http::StatusCode::OK, "mirror.test".to_string())
        );
    }

    #[tokio::test]
    async fn a_server_that_does_not_answer_in_the_first_byte_timeout_fails_the_request() {
        // Accepts and keeps the connection, never answering.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move { listener.accept().await.unwrap() });
        let options = RequestOptions {
            first_byte_timeout: Some(Duration::from_millis(50)),
            ..RequestOptions::default()
        };
        let failure = Connector::new(&Trust::default())
            .send(get("http://mirror.test/x"), addr, None, Some(options))
            .await
            .err()
            .unwrap();
        assert!(
            matches!(failure.error, Error::ConnectionReadTimeout),
            "{failure:?}"
        );
        assert_eq!(failure.reason, format!("{addr} sent no answer within 50ms"));
        drop(held);
    }
}

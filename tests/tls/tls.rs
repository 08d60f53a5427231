//! A throwaway certificate authority and HTTPS servers on loopback, for
//! tests: the CA's PEM is what `--ca-file` is given, and a server presents
//! a certificate the CA signed for the names it is started with (host
//! names or IP addresses). Included with `#[path]` by the unit tests that
//! need it and by the e2e tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    /// A new CA, `name` its common name.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    /// The CA's certificate in PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA's PEM to `dir/NAME` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.pem()).unwrap();
        path
    }

    /// A server's TLS settings: a certificate for `names`, signed by this CA.
    pub fn server(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = KeyPair::generate().unwrap();
        let certificate = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        let chain: Vec<CertificateDer<'static>> = vec![certificate.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        Arc::new(config)
    }
}

/// Serves `app` over HTTPS on a free loopback port with `tls`; returns the
/// address. A client that fails the handshake is dropped.
pub async fn serve(app: axum::Router, tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = Listener {
        tcp,
        acceptor: TlsAcceptor::from(tls),
    };
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Listener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

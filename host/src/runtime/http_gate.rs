//! The one place that decides whether a plugin may make an outgoing HTTP
//! request: the allow-list of its manifest, checked against every request's
//! scheme, host and port, and the http(s) publishing targets it is granted,
//! each of which opens its own URL (`http_targets`: same scheme, host and
//! port, a path under the target's). wasmtime's HTTP client connects from
//! the host and ignores WASI socket permissions, so this hook is the only
//! gate.
//!
//! A request under a granted target passes only where the target's
//! `call` (the operator's, in the sources file) allows its method and
//! path; it then gets the target's headers (its credentials), added here
//! at send time, after the checks and the address resolution: the guest
//! never holds them. Its bytes count against the target's `max_gib` and
//! it is recorded (`own_calls`); every answer a guest reads is masked of
//! its targets' credentials. A guest that sets a header of the same name
//! itself is refused with a sentence naming the header, never its value;
//! a path at a target's host that a server could read as another one
//! (`..;`, `%2e`, …) is refused; a request to the target's host outside
//! its path gets no headers and passes only if `allowed_hosts` lets it.
//!
//! Every refusal is said in the server's log and in the call's own log
//! (`Reporter::host_line`, the deployment's log), since many guests only
//! see a closed stream; neither names a query string or a header value.
//!
//! Redirects are not followed by wasi:http: a guest that follows one makes a
//! new request, which passes through here again. The `Host` header is on
//! wasmtime's forbidden list, so the authority checked is the one used.
//!
//! A granted host *name* is resolved here and every address it resolves to
//! is checked: one on this machine, a private network, link-local (cloud
//! metadata at 169.254.169.254) or unspecified is refused unless the
//! manifest grants that address itself (`127.0.0.1:9000`), or the name is
//! that of a granted target's URL: the operator wrote that URL into the
//! sources file, naming the host as surely as an address in the manifest
//! does, and an internal mirror is what a target usually is; the plugin's
//! own manifest cannot add such a name. The request then
//! goes to exactly the address checked, plain HTTP and HTTPS alike
//! (`connect`: the name is never resolved again, so a DNS answer that
//! changes in between reaches nothing); HTTPS still verifies the
//! certificate for the requested name.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use wasmtime_wasi_http::{WasiBody, WasiHttpHooks};

use super::connect::{Connector, Failure, Sent};
use super::http_targets::{Covering, HttpTarget, HttpTargets};
use super::own_calls::{self, Meter};
use super::report::Reporter;
use super::spending::Spending;
use crate::model::OwnCall;
use crate::scrub::Scrubber;

/// One entry of a manifest's `allowed_hosts`: `host`, `host:port` or
/// `scheme://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    scheme: Option<String>,
    host: String,
    /// `None`: the scheme's default port (80 for http, 443 for https).
    port: Option<u16>,
}

impl AllowedHost {
    pub fn parse(entry: &str) -> Result<Self, String> {
        let (scheme, rest) = match entry.split_once("://") {
            Some((scheme, rest)) => {
                let scheme = scheme.to_ascii_lowercase();
                if scheme != "http" && scheme != "https" {
                    return Err(format!(
                        "allowed host {entry:?}: scheme must be http or https"
                    ));
                }
                (Some(scheme), rest)
            }
            None => (None, entry),
        };
        if rest.is_empty()
            || rest.contains(['/', '?', '#', '@', '*'])
            || rest.contains(char::is_whitespace)
        {
            return Err(format!(
                "allowed host {entry:?}: expected host, host:port or scheme://host:port (no paths, users or wildcards)"
            ));
        }
        let authority: http::uri::Authority = rest
            .parse()
            .map_err(|_| format!("allowed host {entry:?}: not a valid host[:port]"))?;
        let port_text = match rest.strip_prefix('[') {
            Some(v6) => v6.split_once("]:").map(|(_, port)| port),
            None => rest.rsplit_once(':').map(|(_, port)| port),
        };
        if port_text.is_some_and(|p| !p.parse::<u16>().is_ok_and(|p| p > 0)) {
            return Err(format!(
                "allowed host {entry:?}: the port must be a number from 1 to 65535"
            ));
        }
        let host = normalize_host(authority.host());
        if host.is_empty() {
            return Err(format!("allowed host {entry:?}: names no host"));
        }
        // `http` takes any text in brackets; only an IPv6 address belongs there.
        if rest.starts_with('[') && host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "allowed host {entry:?}: only an IPv6 address goes in brackets"
            ));
        }
        Ok(Self {
            scheme,
            host,
            port: authority.port_u16(),
        })
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        if self.scheme.as_deref().is_some_and(|s| s != scheme) {
            return false;
        }
        let wanted_port = self
            .port
            .unwrap_or(default_port(self.scheme.as_deref().unwrap_or(scheme)));
        self.host == host && wanted_port == port
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = &self.scheme {
            write!(f, "{scheme}://")?;
        }
        // An IPv6 address is bracketed, as it was written, so that the text
        // reads back as this entry.
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "http" { 80 } else { 443 }
}

/// Lowercase, without a trailing dot or IPv6 brackets, so `Mirror.Internal.`
/// and `mirror.internal` are one host and `[::1]` matches `::1`.
fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// The hooks wasmtime calls for each outgoing request of one plugin call.
pub(crate) struct HttpGate {
    plugin: String,
    allowed: Vec<AllowedHost>,
    targets: HttpTargets,
    connector: Connector,
    /// The call's log, where refusals are said.
    reporter: Arc<dyn Reporter>,
    /// What the call's requests under targets spend.
    spending: Arc<Spending>,
    /// Finds the call's targets' credentials in the answers.
    scrubber: Scrubber,
}

/// Where a request is going: scheme, host (normalized) and port.
struct Endpoint {
    scheme: String,
    host: String,
    port: u16,
}

impl Endpoint {
    /// `host:port`, as refusals name it (an IPv6 address bracketed).
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl HttpGate {
    pub(crate) fn new(
        plugin: &str,
        allowed: Vec<AllowedHost>,
        targets: HttpTargets,
        connector: Connector,
        reporter: Arc<dyn Reporter>,
        spending: Arc<Spending>,
        scrubber: Scrubber,
    ) -> Self {
        Self {
            plugin: plugin.to_string(),
            allowed,
            targets,
            connector,
            reporter,
            spending,
            scrubber,
        }
    }

    /// The scheme, host and port of `uri`; `None` when it names no host,
    /// or user info: wasmtime's sender connects to the raw authority, and
    /// with user info in it what connects is not the host checked here.
    fn endpoint(uri: &http::Uri) -> Option<Endpoint> {
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        let host = uri
            .host()
            .filter(|_| !uri.authority().is_some_and(|a| a.as_str().contains('@')))?;
        let port = uri.port_u16().unwrap_or(default_port(&scheme));
        Some(Endpoint {
            host: normalize_host(host),
            scheme,
            port,
        })
    }

    fn allows(&self, to: &Endpoint) -> bool {
        self.allowed
            .iter()
            .any(|a| a.allows(&to.scheme, &to.host, to.port))
    }

    /// Why a request passes neither check, for the logs: what would let
    /// it pass.
    fn not_allowed(&self) -> String {
        let hosts: Vec<String> = self.allowed.iter().map(|a| a.to_string()).collect();
        let mut reason = format!(
            "not in allowed_hosts (the plugin's manifest grants: {})",
            if hosts.is_empty() {
                "none".to_string()
            } else {
                hosts.join(", ")
            }
        );
        if !self.targets.is_empty() {
            reason.push_str(&format!(
                ", and under none of its targets: {}",
                self.targets.listed()
            ));
        }
        reason
    }
}

/// Says a refusal in the server's log and the call's own.
fn refused(plugin: &str, reporter: &dyn Reporter, to: &str, reason: &str) {
    let sentence = format!("outgoing request to {to} refused: {reason}");
    tracing::warn!(plugin, "{sentence}");
    reporter.host_line(&sentence);
}

/// Whether a host name may not lead a plugin to `ip` without the address
/// itself being granted: this machine, a private or shared network,
/// link-local, unspecified or broadcast.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                // 100.64.0.0/10, carrier-grade NAT: someone's private network.
                || (a == 100 && (b & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                // fc00::/7 unique local, fe80::/10 link-local.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(|v4| internal(IpAddr::V4(v4)))
        }
    }
}

/// Where a granted host may be reached: the address itself when the grant
/// is one, else the name's first resolved address, or why not (a refused
/// address, or no answer). `named_by_operator`: the name is a granted
/// target's, so an internal address is as good as granted (see the top).
async fn resolve(host: &str, port: u16, named_by_operator: bool) -> Result<SocketAddr, Failure> {
    // An address in the grant is the address granted.
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| Failure {
            error: wasmtime_wasi_http::Error::DnsError {
                rcode: Some(e.to_string()),
                info_code: None,
            },
            reason: format!("{host} does not resolve: {e}"),
        })?
        .collect();
    if !named_by_operator && let Some(refused) = addrs.iter().find(|a| internal(a.ip())) {
        return Err(Failure {
            error: wasmtime_wasi_http::Error::DestinationIpProhibited,
            reason: format!(
                "{host} resolves to {}, an internal address; grant the address itself in allowed_hosts to reach it",
                refused.ip()
            ),
        });
    }
    addrs.first().copied().ok_or_else(|| Failure {
        error: wasmtime_wasi_http::Error::DnsError {
            rcode: None,
            info_code: None,
        },
        reason: format!("{host} resolves to no address"),
    })
}

/// Scheme, host, port and path only: a query string may carry a secret.
fn loggable(uri: &http::Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("https"),
        uri.host().unwrap_or("?"),
        uri.port().map(|p| format!(":{p}")).unwrap_or_default()
    ) + uri.path()
}

type SendResult = wasmtime_wasi_http::Result<Sent>;

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let denied = || Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        let Some(to) = Self::endpoint(request.uri()) else {
            let reason = "it names no host, or a user name before the host";
            refused(
                &self.plugin,
                &*self.reporter,
                &loggable(request.uri()),
                reason,
            );
            return denied();
        };
        // A refusal the guest is told the reason of, besides the logs.
        let told = |gate: &Self, reason: String| -> Box<dyn Future<Output = SendResult> + Send> {
            refused(&gate.plugin, &*gate.reporter, &to.authority(), &reason);
            let guest = format!("refused by berth: {reason}");
            Box::new(async move { Err(wasmtime_wasi_http::Error::InternalError(Some(guest))) })
        };
        let covering: Option<Arc<HttpTarget>> = match self.targets.covering(request.uri()) {
            Covering::Outside => None,
            Covering::Ambiguous { why } => {
                return told(
                    self,
                    format!(
                        "{why}; at a target's host berth sends no path a server could read as \
                         another"
                    ),
                );
            }
            Covering::Under { target, relative } => {
                if let Err(reason) = target.allows(request.method(), &relative) {
                    return told(self, reason);
                }
                if let Some(header) = target.clash(request.headers()) {
                    let reason = format!(
                        "it sets its own {header} header under target {:?} ({}), whose \
                         credentials berth adds; leave the header out",
                        target.name(),
                        target.url()
                    );
                    return told(self, reason);
                }
                if let Err(reason) = self.spending.call() {
                    return told(self, reason);
                }
                Some(target)
            }
        };
        if covering.is_none() && !self.allows(&to) {
            refused(
                &self.plugin,
                &*self.reporter,
                &to.authority(),
                &self.not_allowed(),
            );
            return denied();
        }
        let meter = covering.as_ref().map(|target| {
            Meter::new(
                OwnCall {
                    target: target.name().to_string(),
                    method: request.method().to_string(),
                    url: loggable(request.uri()),
                    status: None,
                    sent: 0,
                    received: 0,
                    stopped: None,
                },
                self.spending.clone(),
                self.reporter.clone(),
            )
        });
        if let Some(meter) = &meter {
            let (parts, body) = request.into_parts();
            request = http::Request::from_parts(parts, own_calls::request(body, meter.clone()));
        }
        let scrubber = self.scrubber.clone();
        // Unused, as by wasmtime's default sender: errors reach the guest
        // through the answer and the response body.
        drop(fut);
        let plugin = self.plugin.clone();
        let connector = self.connector.clone();
        let reporter = self.reporter.clone();
        Box::new(async move {
            let path = loggable(request.uri());
            let addr = match resolve(&to.host, to.port, covering.is_some()).await {
                Ok(addr) => addr,
                Err(Failure { error, reason }) => {
                    refused(&plugin, &*reporter, &to.authority(), &reason);
                    if let Some(meter) = &meter {
                        meter.stopped(&reason);
                    }
                    return Err(error);
                }
            };
            // After every check: the credentials go to exactly the
            // address checked, and nothing of them reaches the guest.
            if let Some(target) = &covering {
                target.add_headers(request.headers_mut());
            }
            tracing::debug!(
                plugin = %plugin,
                to = %path,
                %addr,
                via_target = ?covering.as_ref().map(|t| t.name()),
                "outgoing request allowed"
            );
            let tls_name = (to.scheme == "https").then_some(to.host.as_str());
            let (response, rest) = connector
                .send(request, addr, tls_name, options)
                .await
                .map_err(|Failure { error, reason }| {
                    let sentence =
                        format!("outgoing request to {} failed: {reason}", to.authority());
                    tracing::warn!(plugin = %plugin, to = %path, "{sentence}");
                    reporter.host_line(&sentence);
                    if let Some(meter) = &meter {
                        meter.stopped(&reason);
                    }
                    error
                })?;
            if let Some(meter) = &meter {
                meter.answered(response.status().as_u16());
            }
            Ok((own_calls::response(response, &scrubber, meter), rest))
        })
    }
}

#[cfg(test)]
#[path = "http_gate_tests.rs"]
mod tests;

//! The gate's rules, one table line per case, and its `allowed_hosts`
//! entries over generated text (`props`).

use super::*;
use crate::scrub::Scrubber;
use crate::targets::Targets;

#[test]
fn internal_addresses_are_told_apart_from_public_ones() {
    for (ip, expected) in [
        ("127.0.0.1", true),
        ("10.1.2.3", true),
        ("172.16.0.1", true),
        ("192.168.1.1", true),
        ("169.254.169.254", true),
        ("100.64.0.1", true),
        ("0.0.0.0", true),
        ("::1", true),
        ("fd00::1", true),
        ("fe80::1", true),
        ("::ffff:127.0.0.1", true),
        ("8.8.8.8", false),
        ("100.128.0.1", false),
        ("2001:4860:4860::8888", false),
    ] {
        assert_eq!(internal(ip.parse().unwrap()), expected, "{ip}");
    }
}

#[tokio::test]
async fn a_name_that_resolves_to_an_internal_address_is_refused() {
    let Failure { error, reason } = resolve("localhost", 80, false).await.unwrap_err();
    assert!(matches!(
        error,
        wasmtime_wasi_http::Error::DestinationIpProhibited
    ));
    assert!(
        reason.starts_with("localhost resolves to ")
            && reason.ends_with(
                "an internal address; grant the address itself in allowed_hosts to reach it"
            ),
        "{reason}"
    );
}

/// A name a granted target's URL holds is reached even when it
/// resolves to this machine: the operator named it.
#[tokio::test]
async fn a_targets_name_may_resolve_to_an_internal_address() {
    let addr = resolve("localhost", 80, true).await.unwrap();
    assert!(internal(addr.ip()), "{addr}");
}

fn gate(allowed: Vec<AllowedHost>) -> HttpGate {
    let reporter = Arc::new(crate::runtime::LogReporter::new("test", None));
    HttpGate::new(
        "test",
        allowed,
        HttpTargets::default(),
        Connector::new(&Default::default()),
        reporter,
        Arc::new(Spending::new(
            Arc::new(Targets::default()),
            Default::default(),
        )),
        Scrubber::default(),
    )
}

/// Whether the allow-list lets `uri` pass.
fn passes(gate: &HttpGate, uri: &str) -> bool {
    HttpGate::endpoint(&uri.parse().unwrap()).is_some_and(|to| gate.allows(&to))
}

#[track_caller]
fn check(allowed: &[&str], uri: &str, expected: bool) {
    let allowed = allowed
        .iter()
        .map(|a| AllowedHost::parse(a).unwrap())
        .collect();
    assert_eq!(passes(&gate(allowed), uri), expected, "{uri}");
}

#[test]
fn requests_pass_only_to_listed_scheme_host_and_port() {
    check(&[], "http://anything/", false);
    check(
        &["mirror.internal:8443"],
        "https://mirror.internal:8443/x",
        true,
    );
    check(
        &["mirror.internal:8443"],
        "http://mirror.internal:8443/x",
        true,
    );
    check(
        &["mirror.internal:8443"],
        "https://mirror.internal/x",
        false,
    );
    check(
        &["mirror.internal:8443"],
        "https://MIRROR.internal.:8443/x",
        true,
    );
    check(
        &["mirror.internal:8443"],
        "https://evil.internal:8443/x",
        false,
    );
    check(
        &["mirror.internal:8443"],
        "https://mirror.internal.evil.com:8443/",
        false,
    );
    check(&["mirror.internal"], "https://mirror.internal/x", true);
    check(&["mirror.internal"], "http://mirror.internal/x", true);
    check(&["mirror.internal"], "http://mirror.internal:8080/x", false);
    check(
        &["https://mirror.internal"],
        "http://mirror.internal:443/x",
        false,
    );
    check(
        &["https://mirror.internal"],
        "https://mirror.internal/x",
        true,
    );
    check(&["127.0.0.1:9000"], "http://127.0.0.1:9000/", true);
    check(&["127.0.0.1:9000"], "http://localhost:9000/", false);
    check(&["127.0.0.1:9000"], "http://2130706433:9000/", false);
    check(&["[::1]:9000"], "http://[::1]:9000/", true);
    check(
        &["mirror.internal:8443"],
        "http://user@mirror.internal:8443/",
        false,
    );
}

#[test]
fn a_refusal_names_what_the_manifest_grants() {
    let none = gate(Vec::new());
    assert_eq!(
        none.not_allowed(),
        "not in allowed_hosts (the plugin's manifest grants: none)"
    );
    let allowed = ["mirror.internal:8443", "[::1]:9000"]
        .iter()
        .map(|a| AllowedHost::parse(a).unwrap())
        .collect();
    let sources = "[[target]]\nname = \"mirror\"\nurl = \"https://m.internal/up/\"\n\
                   headers = { Authorization = \"Bearer s3cret\" }\n";
    let targets = crate::targets::Targets::parse(sources, "sources.toml", |_| None).unwrap();
    let mut granted = gate(allowed);
    granted.targets = HttpTargets::granted(&targets, "test", &["mirror".to_string()]);
    let reason = granted.not_allowed();
    assert_eq!(
        reason,
        "not in allowed_hosts (the plugin's manifest grants: mirror.internal:8443, [::1]:9000), \
         and under none of its targets: mirror (https://m.internal/up/)"
    );
    assert!(!reason.contains("s3cret"));
}

#[test]
fn logged_addresses_leave_out_user_info_and_queries() {
    let uri = "https://u:p@mirror.internal:8443/up/x?token=s3cret"
        .parse()
        .unwrap();
    assert_eq!(loggable(&uri), "https://mirror.internal:8443/up/x");
}

/// Found by `props::an_entry_reads_back_from_its_text_…`: an IPv6
/// entry was shown without its brackets (`::1:9000`), which reads as
/// nothing, in `berth plugin check` and `GET /v1/deployers`.
#[test]
fn an_ipv6_entry_is_shown_as_written() {
    for entry in ["[::1]:9000", "https://[::ffff:0.0.0.0]", "[fd00::1]"] {
        let parsed = AllowedHost::parse(entry).unwrap();
        assert_eq!(parsed.to_string(), entry);
        assert_eq!(AllowedHost::parse(&parsed.to_string()), Ok(parsed));
    }
}

#[test]
fn bad_entries_are_refused_with_the_entry_named() {
    for entry in [
        "",
        "ftp://x",
        "x/path",
        "*.example.com",
        "a b",
        "host:notaport",
        "u@host",
        // Found by `props::any_entry_is_answered`: taken as hosts `a:`
        // and the empty name.
        "[a:]",
        ".",
    ] {
        let err = AllowedHost::parse(entry).expect_err(entry);
        assert!(err.contains(&format!("{entry:?}")), "{err}");
    }
}

/// `allowed_hosts` entries over generated hosts, ports and schemes: each
/// reads back from its own text, and grants the requests it names.
mod props {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::super::*;
    use super::{gate, passes};
    use crate::strategies;

    fn host() -> impl Strategy<Value = String> {
        prop_oneof![
            r"[a-zA-Z][a-zA-Z0-9-]{0,8}(\.[a-zA-Z0-9-]{1,8}){0,3}\.?",
            any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
            any::<Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
        ]
    }

    /// An entry as a person writes it: `[scheme://]host[:port]`.
    fn entry() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just(""),
                Just("http://"),
                Just("https://"),
                Just("HTTPS://")
            ],
            host(),
            prop::option::of(1..=u16::MAX),
        )
            .prop_map(|(scheme, host, port)| match port {
                Some(port) => format!("{scheme}{host}:{port}"),
                None => format!("{scheme}{host}"),
            })
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn an_entry_reads_back_from_its_text_and_grants_what_it_names(entry in entry()) {
            let parsed = AllowedHost::parse(&entry).map_err(TestCaseError::fail)?;
            let shown = parsed.to_string();
            prop_assert_eq!(AllowedHost::parse(&shown), Ok(parsed.clone()), "shown as {}", shown);
            let scheme = parsed.scheme.clone().unwrap_or("https".into());
            let port = parsed.port.unwrap_or(default_port(&scheme));
            let host = match parsed.host.parse::<IpAddr>() {
                Ok(IpAddr::V6(ip)) => format!("[{ip}]"),
                _ => parsed.host.clone(),
            };
            let gate = gate(vec![parsed]);
            let uri = format!("{scheme}://{host}:{port}/x");
            prop_assert!(passes(&gate, &uri), "{uri} refused");
        }

        /// Whatever the text, it is parsed or refused naming the entry, and
        /// what is parsed reads back from its own text.
        #[test]
        fn any_entry_is_answered(entry in prop_oneof![entry(), strategies::text()]) {
            match AllowedHost::parse(&entry) {
                Ok(parsed) => prop_assert_eq!(AllowedHost::parse(&parsed.to_string()), Ok(parsed)),
                Err(e) => prop_assert!(e.contains(&format!("{entry:?}")), "{e}"),
            }
        }
    }
}

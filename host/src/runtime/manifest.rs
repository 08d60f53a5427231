//! A plugin's optional manifest, `NAME.toml` beside `NAME.wasm`: the
//! capabilities it is granted, and the sha256 its `.wasm` must have. Parsing resolves `${VAR}` against the
//! environment given (`host_env`). Does no I/O of its own. The publishing
//! targets it grants are names only, checked against the server's targets
//! when one is opened (`crate::targets`), so one manifest stored over the
//! API loads on every server of the database.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::http_gate::AllowedHost;
use super::spending::Caps;
use crate::host_env::expand;
use crate::targets::check_name;

/// What a manifest grants. `Default` is the empty grant: no network, no
/// environment, the server's limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifest {
    pub description: Option<String>,
    pub allowed_hosts: Vec<AllowedHost>,
    /// Resolved values. Secrets: never log or store them.
    pub env: Vec<(String, String)>,
    /// The publishing targets it may open, by name, as written.
    pub targets: Vec<String>,
    pub memory_mib: Option<u64>,
    pub timeout: Option<Duration>,
    pub out_mib: Option<u64>,
    /// What one deployment may make the host record: puts, requests of
    /// its own under targets, and the record's size (`max_puts`,
    /// `max_calls`, `max_records_kib`; `runtime::spending` has the
    /// defaults).
    pub records: Caps,
    /// The `.wasm` this manifest is for, pinned by its sha256 (64 lowercase
    /// hex digits): another build is refused, so a manifest's grants never
    /// pass to a plugin they were not written for.
    pub sha256: Option<String>,
    /// It loads pickle files safely (or never loads them): under
    /// `--pickle refuse`, models holding pickles may still be deployed by
    /// it. berth itself never unpickles.
    pub accepts_pickle: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    description: Option<String>,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    targets: Vec<String>,
    memory_mib: Option<u64>,
    timeout_s: Option<u64>,
    out_mib: Option<u64>,
    max_puts: Option<u64>,
    max_calls: Option<u64>,
    max_records_kib: Option<u64>,
    sha256: Option<String>,
    #[serde(default)]
    accepts_pickle: bool,
}

/// Caps of a deployment's records beyond which the record itself is the
/// burden: a million puts, a million requests, 1 GiB of record.
const MAX_RECORD_CAPS: [(&str, u64); 3] = [
    ("max_puts", 1_000_000),
    ("max_calls", 1_000_000),
    ("max_records_kib", 1 << 20),
];

/// At most this much memory may be granted: 16 GiB, far beyond a deployer's needs.
const MAX_MEMORY_MIB: u64 = 16 * 1024;
/// An out-dir quota of a TiB is as good as none; more is a typo.
pub const MAX_OUT_MIB: u64 = 1 << 20;
/// At most this long a call may be granted, by a manifest or a flag: a
/// week, far beyond a deploy's needs, and a deadline the clock can hold
/// (adding some 2^63 seconds to an `Instant` panics).
pub const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;

impl Manifest {
    /// Parses a manifest's text. `lookup` reads the host environment.
    pub fn parse(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let raw: RawManifest = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let mut problems = Vec::new();

        let allowed_hosts = raw
            .allowed_hosts
            .iter()
            .filter_map(|entry| AllowedHost::parse(entry).map_err(|e| problems.push(e)).ok())
            .collect();

        let mut env = Vec::new();
        for (name, template) in &raw.env {
            if !is_env_name(name) {
                problems.push(format!(
                    "env: {name:?} is not a valid variable name (letters, digits and _, not starting with a digit)"
                ));
                continue;
            }
            match expand(template, &lookup) {
                Ok(value) => env.push((name.clone(), value)),
                Err(e) => problems.push(format!("env.{name}: {e}")),
            }
        }

        let mut targets: Vec<String> = Vec::new();
        for name in &raw.targets {
            if let Err(e) = check_name(name) {
                problems.push(format!("targets: {e}"));
            } else if targets.contains(name) {
                problems.push(format!("targets: {name:?} is listed twice"));
            } else {
                targets.push(name.clone());
            }
        }

        if let Some(mib) = raw.memory_mib
            && !(1..=MAX_MEMORY_MIB).contains(&mib)
        {
            problems.push(format!(
                "memory_mib = {mib}: must be between 1 and {MAX_MEMORY_MIB}"
            ));
        }
        if let Some(mib) = raw.out_mib
            && !(1..=MAX_OUT_MIB).contains(&mib)
        {
            problems.push(format!(
                "out_mib = {mib}: must be between 1 and {MAX_OUT_MIB}"
            ));
        }
        for ((key, max), value) in
            MAX_RECORD_CAPS
                .iter()
                .zip([raw.max_puts, raw.max_calls, raw.max_records_kib])
        {
            if let Some(value) = value
                && !(1..=*max).contains(&value)
            {
                problems.push(format!("{key} = {value}: must be between 1 and {max}"));
            }
        }
        if let Some(seconds) = raw.timeout_s
            && !(1..=MAX_TIMEOUT_S).contains(&seconds)
        {
            problems.push(format!(
                "timeout_s = {seconds}: must be between 1 and {MAX_TIMEOUT_S} (a week)"
            ));
        }
        if raw
            .description
            .as_deref()
            .is_some_and(|d| d.trim().is_empty())
        {
            problems.push("description is empty: remove it to use the plugin's own".to_string());
        }

        if let Some(sha256) = &raw.sha256
            && !(sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            problems.push(format!(
                "sha256 = {sha256:?}: must be 64 hex digits (`sha256sum NAME.wasm` prints them)"
            ));
        }

        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(Self {
            description: raw.description,
            allowed_hosts,
            env,
            targets,
            memory_mib: raw.memory_mib,
            timeout: raw.timeout_s.map(Duration::from_secs),
            out_mib: raw.out_mib,
            records: Caps {
                max_puts: raw.max_puts,
                max_calls: raw.max_calls,
                max_records_kib: raw.max_records_kib,
            },
            sha256: raw.sha256.map(|s| s.to_ascii_lowercase()),
            accepts_pickle: raw.accepts_pickle,
        })
    }
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_string())
    }

    #[test]
    fn a_full_manifest_is_resolved() {
        let m = Manifest::parse(
            r#"
            description = "Publishes"
            allowed_hosts = ["mirror.internal:8443"]
            env = { MIRROR_TOKEN = "Bearer ${TOKEN}", PLAIN = "x$$y" }
            targets = ["releases", "team-mirror"]
            memory_mib = 256
            timeout_s = 600
            out_mib = 64
            sha256 = "ABab000000000000000000000000000000000000000000000000000000000000"
            accepts_pickle = true
            "#,
            env,
        )
        .unwrap();
        assert_eq!(m.description.as_deref(), Some("Publishes"));
        assert_eq!(m.allowed_hosts[0].to_string(), "mirror.internal:8443");
        assert_eq!(
            m.env,
            [
                ("MIRROR_TOKEN".to_string(), "Bearer s3cret".to_string()),
                ("PLAIN".to_string(), "x$y".to_string())
            ]
        );
        assert_eq!(m.targets, ["releases", "team-mirror"]);
        assert_eq!(m.memory_mib, Some(256));
        assert_eq!(m.timeout, Some(Duration::from_secs(600)));
        assert_eq!(m.out_mib, Some(64));
        // Compared with the digest berth prints, which is lowercase.
        assert_eq!(m.sha256, Some(format!("abab{}", "0".repeat(60))));
        assert!(m.accepts_pickle);
        assert_eq!(Manifest::parse("", env).unwrap(), Manifest::default());
    }

    #[test]
    fn each_bad_manifest_says_what_is_wrong() {
        let cases = [
            ("colour = 1", "unknown field `colour`"),
            ("memory_mib = \"big\"", "invalid type"),
            ("memory_mib = 0", "memory_mib = 0: must be between"),
            ("out_mib = 0", "out_mib = 0: must be between 1 and 1048576"),
            ("out_mib = 1048577", "out_mib = 1048577: must be between"),
            (
                "max_puts = 0",
                "max_puts = 0: must be between 1 and 1000000",
            ),
            (
                "max_calls = 1000001",
                "max_calls = 1000001: must be between",
            ),
            (
                "max_records_kib = 0",
                "max_records_kib = 0: must be between 1 and 1048576",
            ),
            (
                "timeout_s = 0",
                "timeout_s = 0: must be between 1 and 604800",
            ),
            // Found by `props::an_accepted_manifest_grants_limits_…`: the
            // deploy call's deadline overflowed and panicked.
            (
                "timeout_s = 9223372036854775807",
                "timeout_s = 9223372036854775807: must be between 1 and 604800 (a week)",
            ),
            (
                "env = { T = \"${MISSING}\" }",
                "env.T: the host environment variable MISSING is not set",
            ),
            ("env = { T = \"${TOKEN\" }", "unclosed"),
            ("env = { T = \"$TOKEN\" }", "write ${NAME}"),
            ("env = { \"1X\" = \"a\" }", "not a valid variable name"),
            ("allowed_hosts = [\"a/b\"]", "allowed host \"a/b\""),
            ("description = \" \"", "description is empty"),
            (
                "targets = [\"a/b\"]",
                "targets: target name \"a/b\" is not a plain name",
            ),
            ("targets = [\"r\", \"r\"]", "targets: \"r\" is listed twice"),
            ("targets = \"releases\"", "invalid type"),
            (
                "sha256 = \"abc\"",
                "sha256 = \"abc\": must be 64 hex digits (`sha256sum NAME.wasm` prints them)",
            ),
            (
                "sha256 = \"000000000000000000000000000000000000000000000000000000000000000g\"",
                "must be 64 hex digits",
            ),
            ("sha256 = 5", "invalid type"),
            ("this is not toml", "expected"),
        ];
        for (text, expected) in cases {
            let err = Manifest::parse(text, env).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}

/// Manifests over generated TOML: any text is parsed or refused, never a
/// panic, and what is accepted grants only limits the runtime can apply.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use toml::{Table, Value};

    use super::*;
    use crate::strategies;

    /// A TOML value of any type, mostly of the kind each key expects.
    fn value(expected: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => expected,
            1 => any::<i64>().prop_map(Value::Integer),
            1 => strategies::text().prop_map(Value::String),
            1 => any::<bool>().prop_map(Value::Boolean),
            1 => any::<f64>().prop_map(Value::Float),
        ]
    }

    fn number() -> BoxedStrategy<Value> {
        prop_oneof![0..=2 * MAX_MEMORY_MIB as i64, any::<i64>()]
            .prop_map(Value::Integer)
            .boxed()
    }

    fn entries() -> BoxedStrategy<Value> {
        let entry = prop_oneof![
            r"(https?://)?[a-z][a-z0-9.-]{0,10}(:[0-9]{1,5})?",
            r"\[[0-9a-f:]{2,12}\](:[0-9]{1,5})?",
            strategies::text(),
        ];
        prop::collection::vec(entry.prop_map(Value::String), 0..4)
            .prop_map(Value::Array)
            .boxed()
    }

    fn env() -> BoxedStrategy<Value> {
        let name = prop_oneof![r"[A-Z_][A-Z0-9_]{0,6}", strategies::text()];
        let template = prop_oneof![
            r"[a-z$]{0,4}(\$\{(HOME|PATH|NOPE)\}?)?[a-z$]{0,4}",
            strategies::text()
        ];
        prop::collection::vec((name, template.prop_map(Value::String)), 0..4)
            .prop_map(|pairs| Value::Table(pairs.into_iter().collect()))
            .boxed()
    }

    /// Mostly digests, some a digit short or with a letter past `f`.
    fn digest() -> BoxedStrategy<Value> {
        r"[0-9a-fA-F]{63,64}|[0-9a-g]{64}"
            .prop_map(Value::String)
            .boxed()
    }

    fn manifest() -> impl Strategy<Value = String> {
        let text = || strategies::text().prop_map(Value::String).boxed();
        (
            prop::option::of(value(text())),
            prop::option::of(value(entries())),
            prop::option::of(value(env())),
            prop::option::of(value(number())),
            prop::option::of(value(number())),
            prop::option::of(value(digest())),
            prop::option::of(value(text())),
        )
            .prop_map(
                |(description, hosts, env, memory, timeout, sha256, unknown)| {
                    let mut table = Table::new();
                    for (key, value) in [
                        ("description", description),
                        ("allowed_hosts", hosts),
                        ("env", env),
                        ("memory_mib", memory),
                        ("timeout_s", timeout),
                        ("sha256", sha256),
                        ("colour", unknown),
                    ] {
                        if let Some(value) = value {
                            table.insert(key.into(), value);
                        }
                    }
                    toml::to_string(&table).unwrap()
                },
            )
    }

    fn lookup(name: &str) -> Option<String> {
        matches!(name, "HOME" | "PATH").then(|| format!("value of {name}"))
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn an_accepted_manifest_grants_limits_the_runtime_can_apply(
            text in prop_oneof![4 => manifest(), 1 => strategies::text()],
        ) {
            let Ok(manifest) = Manifest::parse(&text, lookup) else {
                return Ok(());
            };
            if let Some(mib) = manifest.memory_mib {
                prop_assert!((1..=MAX_MEMORY_MIB).contains(&mib), "memory_mib {mib}");
            }
            if let Some(timeout) = manifest.timeout {
                prop_assert!(
                    (1..=MAX_TIMEOUT_S).contains(&timeout.as_secs()),
                    "timeout {timeout:?}"
                );
                // The runtime's deadline, and its bound on a blocked call.
                prop_assert!(std::time::Instant::now().checked_add(timeout * 2).is_some());
            }
            prop_assert!(manifest.description.is_none_or(|d| !d.trim().is_empty()));
            // A pin is comparable with the digest berth computes.
            if let Some(pin) = &manifest.sha256 {
                let digits = pin.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                prop_assert!(pin.len() == 64 && digits, "sha256 {pin:?}");
            }
            for (name, _) in &manifest.env {
                prop_assert!(is_env_name(name), "{name:?}");
            }
            for host in &manifest.allowed_hosts {
                prop_assert_eq!(&AllowedHost::parse(&host.to_string()), &Ok(host.clone()));
            }
        }
    }
}

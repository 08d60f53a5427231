//! A plugin's optional manifest, `NAME.toml` beside `NAME.wasm`: the
//! capabilities it is granted. Parsing resolves `${VAR}` against the
//! environment given (`host_env`). Does no I/O of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::http_gate::AllowedHost;
use crate::host_env::expand;

/// What a manifest grants. `Default` is the empty grant: no network, no
/// environment, the server's limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifest {
    pub description: Option<String>,
    pub allowed_hosts: Vec<AllowedHost>,
    /// Resolved values. Secrets: never log or store them.
    pub env: Vec<(String, String)>,
    pub memory_mib: Option<u64>,
    pub timeout: Option<Duration>,
    pub out_mib: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    description: Option<String>,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    memory_mib: Option<u64>,
    timeout_s: Option<u64>,
    out_mib: Option<u64>,
}

/// At most this much memory may be granted: 16 GiB, far beyond a deployer's needs.
const MAX_MEMORY_MIB: u64 = 16 * 1024;
/// An out-dir quota of a TiB is as good as none; more is a typo.
pub const MAX_OUT_MIB: u64 = 1 << 20;

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
        if raw.timeout_s == Some(0) {
            problems.push("timeout_s = 0: must be at least 1 second".to_string());
        }
        if raw
            .description
            .as_deref()
            .is_some_and(|d| d.trim().is_empty())
        {
            problems.push("description is empty: remove it to use the plugin's own".to_string());
        }

        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(Self {
            description: raw.description,
            allowed_hosts,
            env,
            memory_mib: raw.memory_mib,
            timeout: raw.timeout_s.map(Duration::from_secs),
            out_mib: raw.out_mib,
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
            memory_mib = 256
            timeout_s = 600
            out_mib = 64
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
        assert_eq!(m.memory_mib, Some(256));
        assert_eq!(m.timeout, Some(Duration::from_secs(600)));
        assert_eq!(m.out_mib, Some(64));
        assert_eq!(Manifest::parse("", env).unwrap(), Manifest::default());
    }

    #[test]
    fn each_bad_manifest_says_what_is_wrong() {
        let cases = [
            ("colour = 1", "unknown field `colour`"),
            ("memory_mib = \"big\"", "invalid type"),
            ("memory_mib = 0", "memory_mib = 0: must be between"),
            ("timeout_s = 0", "timeout_s = 0"),
            ("out_mib = 0", "out_mib = 0: must be between 1 and 1048576"),
            ("out_mib = 1048577", "out_mib = 1048577: must be between"),
            (
                "env = { T = \"${MISSING}\" }",
                "env.T: the host environment variable MISSING is not set",
            ),
            ("env = { T = \"${TOKEN\" }", "unclosed"),
            ("env = { T = \"$TOKEN\" }", "write ${NAME}"),
            ("env = { \"1X\" = \"a\" }", "not a valid variable name"),
            ("allowed_hosts = [\"a/b\"]", "allowed host \"a/b\""),
            ("description = \" \"", "description is empty"),
            ("this is not toml", "expected"),
        ];
        for (text, expected) in cases {
            let err = Manifest::parse(text, env).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}

//! What `berth plugin run` puts in place of a server's configuration: the
//! `--env` values a manifest's `${VAR}`s read before the environment, the
//! publishing targets of `--targets-file`, and the deployment's id. What a
//! run would not get on a server (an `--env` the manifest never reads, a
//! granted target the file lacks) is said on stderr, not silently dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::runtime::Plugin;
use crate::targets::Targets;

/// `--env K=V`: `K` a variable name, as a manifest's `${K}` writes it.
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=VALUE, like MIRROR_TOKEN=dev-token"))?;
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(format!(
            "{name:?} is not a variable name (letters, digits and _, not starting with a digit)"
        ));
    }
    Ok((name.to_string(), value.to_string()))
}

/// The `--env` values, and which of them the manifest read.
#[derive(Clone)]
pub struct EnvValues {
    values: Arc<BTreeMap<String, String>>,
    read: Arc<Mutex<BTreeSet<String>>>,
}

impl EnvValues {
    /// The last of a repeated name wins, as in a shell.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Self {
            values: Arc::new(pairs.into_iter().collect()),
            read: Arc::default(),
        }
    }

    /// The manifest's lookup: `--env` first, then this process's
    /// environment.
    pub fn lookup(&self) -> impl Fn(&str) -> Option<String> + Send + 'static {
        let this = self.clone();
        move |name| {
            this.read
                .lock()
                .expect("env lookup lock")
                .insert(name.to_string());
            this.values
                .get(name)
                .cloned()
                .or_else(|| std::env::var(name).ok())
        }
    }

    /// Says on stderr each `--env` the manifest of `plugin` never read:
    /// the plugin does not see it, as a server would not pass it.
    pub fn warn_unread(&self, plugin: &str) {
        let read = self.read.lock().expect("env lookup lock");
        for name in self.values.keys().filter(|n| !read.contains(*n)) {
            eprintln!(
                "--env {name}: the manifest {plugin}.toml reads no ${{{name}}}, so the plugin does \
                 not see it (a manifest grants variables: env = {{ {name} = \"${{{name}}}\" }})"
            );
        }
    }
}

/// The targets of `--targets-file` (none without one).
pub fn targets(file: Option<&Path>) -> anyhow::Result<Targets> {
    match file {
        Some(file) => Targets::load(file).context("--targets-file"),
        None => Ok(Targets::default()),
    }
}

/// Says on stderr each target the plugin's manifest grants that it will
/// not reach here, and why.
pub fn warn_unreachable_targets(plugin: &Plugin, targets: &Targets, file: Option<&Path>) {
    let granted = &plugin.manifest.targets;
    if file.is_none() {
        if !granted.is_empty() {
            eprintln!(
                "plugin {}: its manifest grants targets {}, but no --targets-file configures them",
                plugin.name,
                granted.join(", ")
            );
        }
        return;
    }
    for name in granted {
        if let Err(e) = targets.open(&plugin.name, granted, name) {
            eprintln!("{e}");
        }
    }
}

/// `plugin check`'s line of the targets a manifest grants, each with what
/// the local sources file (`FILE`, if one is given) says of it.
pub fn granted_targets(granted: &[String], local: Option<(&Path, &Targets)>) -> String {
    if granted.is_empty() {
        return "none".into();
    }
    let each: Vec<String> = granted
        .iter()
        .map(|name| match local {
            None => name.clone(),
            Some((file, targets)) => match targets.get(name) {
                Some(target) => format!("{name} ({})", target.url()),
                None => format!("{name} (not in {})", file.display()),
            },
        })
        .collect();
    match local {
        Some(_) => each.join(", "),
        None => format!(
            "{} (no --targets-file or BERTH_SOURCES_FILE to look them up in)",
            each.join(", ")
        ),
    }
}

/// The id a run's deployment gets without `--deploy-id`: the time in
/// milliseconds. A server counts its deployments from 1, so a trial run
/// never writes the keys a server's deployment later will (every trial
/// was deployment 1 before), two runs get two ids, and the ids sort by
/// when they ran. Milliseconds, not a random 63-bit number: a
/// JavaScript guest holds the id in a double, exact only up to 2^53.
pub fn default_deploy_id() -> i64 {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |since| since.as_millis());
    i64::try_from(millis).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_are_name_equals_value() {
        for (text, expected) in [
            ("A=1", Ok(("A", "1"))),
            ("MIRROR_TOKEN=a=b", Ok(("MIRROR_TOKEN", "a=b"))),
            ("_X=", Ok(("_X", ""))),
            ("A", Err("expected NAME=VALUE")),
            ("1A=x", Err("is not a variable name")),
            ("=x", Err("is not a variable name")),
            ("A-B=x", Err("is not a variable name")),
        ] {
            match (parse_env(text), expected) {
                (Ok((name, value)), Ok((n, v))) => {
                    assert_eq!((name.as_str(), value.as_str()), (n, v))
                }
                (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{text}: {e}"),
                (got, _) => panic!("{text}: {got:?}"),
            }
        }
    }

    #[test]
    fn env_values_come_before_the_environment_and_reads_are_noted() {
        let env = EnvValues::new(vec![
            ("PATH".to_string(), "given".to_string()),
            ("UNREAD".to_string(), "x".to_string()),
        ]);
        let lookup = env.lookup();
        assert_eq!(lookup("PATH").as_deref(), Some("given"));
        assert_eq!(lookup("BERTH_TEST_NEVER_SET"), None);
        let read = env.read.lock().unwrap().clone();
        assert!(read.contains("PATH") && !read.contains("UNREAD"));
    }

    #[test]
    fn granted_targets_say_whether_the_local_file_defines_them() {
        let file = Path::new("sources.toml");
        let targets = Targets::parse(
            "[[target]]\nname = \"demo\"\nurl = \"file:///srv/published/\"\n",
            "sources.toml",
            |_| None,
        )
        .unwrap();
        let granted = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        for (names, local, expected) in [
            (&[][..], Some((file, &targets)), "none"),
            (
                &["demo", "releases"][..],
                Some((file, &targets)),
                "demo (file:///srv/published/), releases (not in sources.toml)",
            ),
            (
                &["demo"][..],
                None,
                "demo (no --targets-file or BERTH_SOURCES_FILE to look them up in)",
            ),
        ] {
            assert_eq!(granted_targets(&granted(names), local), expected);
        }
    }

    #[test]
    fn the_default_id_is_far_above_a_servers_and_exact_in_a_double() {
        let id = default_deploy_id();
        assert!(id > 1_000_000_000_000, "{id}");
        assert!(id < 1 << 53, "{id}");
    }
}

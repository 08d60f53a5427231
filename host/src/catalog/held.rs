//! Versions held for asking more: what a new version of a stored deployer
//! grants beyond the version it replaces (`widening`, pure: hosts, env
//! vars, publishing targets from its manifest; memory, time, out-dir quota
//! as this server applies them), and an admin's approval, which serves it.
//! `Catalog::push` stores a wider version held, not served.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Catalog, Error, ROLLBACK_HINT};
use crate::db::StoredVersion;
use crate::runtime::{Limits, Manifest, Plugin};

impl Catalog {
    /// Approves the newest version of `name` held for asking more than
    /// the one served, and serves it (as a rollback to it would).
    pub async fn approve(&self, name: &str) -> Result<(Arc<Plugin>, StoredVersion), Error> {
        let (versions, _) = self.stored_versions(name, ROLLBACK_HINT).await?;
        let held = versions
            .iter()
            .rev()
            .find(|v| v.held.is_some())
            .ok_or_else(|| Error::NothingHeld(name.to_string()))?;
        if !self.db.release_held(name, held.id).await? {
            return Err(Error::NothingHeld(name.to_string()));
        }
        tracing::info!(plugin = %name, version = held.number, "held deployer version approved");
        self.rollback(name, Some(&held.sha256)).await
    }
}

/// Each grant of `new` beyond `old`, one phrase each; empty when it asks
/// for the same or less.
pub fn widening(old: (&Manifest, &Limits), new: (&Manifest, &Limits)) -> Vec<String> {
    let ((old, old_limits), (new, new_limits)) = (old, new);
    let mut more = Vec::new();
    let added = |old: BTreeSet<String>, new: BTreeSet<String>| -> Vec<String> {
        new.difference(&old).cloned().collect()
    };
    let hosts = |m: &Manifest| m.allowed_hosts.iter().map(|h| h.to_string()).collect();
    for host in added(hosts(old), hosts(new)) {
        more.push(format!("allowed host {host}"));
    }
    let env = |m: &Manifest| m.env.iter().map(|(k, _)| k.clone()).collect();
    for var in added(env(old), env(new)) {
        more.push(format!("env var {var}"));
    }
    let targets = |m: &Manifest| m.targets.iter().cloned().collect();
    for target in added(targets(old), targets(new)) {
        more.push(format!("publishing target {target}"));
    }
    for (what, unit, old, new) in [
        (
            "memory",
            "MiB",
            old_limits.memory_mib,
            new_limits.memory_mib,
        ),
        (
            "time",
            "s",
            old_limits.timeout.as_secs(),
            new_limits.timeout.as_secs(),
        ),
        ("out quota", "MiB", old_limits.out_mib, new_limits.out_mib),
    ] {
        if new > old {
            more.push(format!("{what} {new} {unit} (was {old} {unit})"));
        }
    }
    more
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(text: &str) -> Manifest {
        Manifest::parse(text, |_| Some("x".into())).unwrap()
    }

    #[test]
    fn only_what_is_added_counts() {
        let limits = Limits::default();
        let more = Limits {
            memory_mib: limits.memory_mib * 2,
            ..limits
        };
        #[rustfmt::skip]
        let cases: &[(&str, Limits, &str, Limits, &[&str])] = &[
            ("", limits, "", limits, &[]),
            ("allowed_hosts = [\"a.example\"]", limits, "", limits, &[]),
            ("", limits, "allowed_hosts = [\"a.example\"]", limits, &["allowed host a.example"]),
            ("allowed_hosts = [\"a.example\"]", limits, "allowed_hosts = [\"a.example\", \"b.example\"]", limits, &["allowed host b.example"]),
            ("", limits, "targets = [\"releases\"]", limits, &["publishing target releases"]),
            ("", limits, "[env]\nTOKEN = \"${TOKEN}\"", limits, &["env var TOKEN"]),
            ("", more, "", limits, &[]),
            ("", limits, "", more, &["memory 1024 MiB (was 512 MiB)"]),
        ];
        for (old, old_limits, new, new_limits, expected) in cases {
            assert_eq!(
                widening((&manifest(old), old_limits), (&manifest(new), new_limits)),
                *expected,
                "{old:?} → {new:?}"
            );
        }
    }
}

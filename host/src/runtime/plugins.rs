//! The plugins folder: which files become deployers, and why the others did
//! not. A bad file is skipped with its reason; it never stops the others.
//! Never reads a plugin's bytes itself (`load` does).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::{Plugin, Runtime};

/// A file of the plugins folder that did not become a deployer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// File name within the plugins folder.
    pub file: String,
    pub reason: String,
}

/// The deployers a server offers, by name, and the files it refused.
#[derive(Debug, Default, Clone)]
pub struct PluginSet {
    pub deployers: BTreeMap<String, Arc<Plugin>>,
    pub rejected: Vec<Rejection>,
}

const MAX_NAME_LEN: usize = 64;

/// A deployer's name is its file's stem: letters, digits, `_`, `-`, `.`,
/// starting with a letter or digit, at most 64 characters.
pub fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err("has an empty name".into());
    };
    if !first.is_ascii_alphanumeric() {
        return Err(format!("name {name:?} must start with a letter or digit"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "name {name:?} is longer than {MAX_NAME_LEN} characters"
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "name {name:?} contains {bad:?}; use letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

impl Runtime {
    /// Loads every `*.wasm` of `dir`, in name order, up to `max` deployers.
    /// A folder that cannot be read yields an empty set and one rejection.
    pub async fn load_dir(&self, dir: &Path, max: usize) -> PluginSet {
        let mut set = PluginSet::default();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                set.rejected.push(Rejection {
                    file: dir.display().to_string(),
                    reason: format!("the plugins folder cannot be read: {e}"),
                });
                return set;
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();

        for file in &names {
            if let Some(stem) = file.strip_suffix(".toml")
                && !names.contains(&format!("{stem}.wasm"))
            {
                set.rejected.push(Rejection {
                    file: file.clone(),
                    reason: format!(
                        "a manifest without a plugin: there is no {stem}.wasm beside it"
                    ),
                });
            }
            let Some(name) = file.strip_suffix(".wasm") else {
                continue;
            };
            if set.deployers.len() >= max {
                set.rejected.push(Rejection {
                    file: file.clone(),
                    reason: format!(
                        "too many deployers: this server loads at most {max} (--max-deployers)"
                    ),
                });
                continue;
            }
            match self.load_file(&dir.join(file), name).await {
                Ok(plugin) => {
                    tracing::info!(
                        plugin = name,
                        sha256 = %plugin.sha256,
                        origin = ?plugin.origin,
                        "loaded deployer: {}",
                        plugin.description
                    );
                    set.deployers.insert(name.to_string(), Arc::new(plugin));
                }
                Err(reason) => {
                    tracing::warn!(file, "skipped plugin: {reason}");
                    set.rejected.push(Rejection {
                        file: file.clone(),
                        reason,
                    });
                }
            }
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_file_stem_rules() {
        let long = "a".repeat(65);
        let cases: [(&str, Option<&str>); 8] = [
            ("archive", None),
            ("http-publish.v2_b", None),
            ("9lives", None),
            ("", Some("empty name")),
            ("-dash", Some("must start with a letter or digit")),
            (".hidden", Some("must start with a letter or digit")),
            ("has space", Some("contains ' '")),
            (&long, Some("longer than 64")),
        ];
        for (name, expected) in cases {
            match (check_name(name), expected) {
                (Ok(()), None) => {}
                (Err(e), Some(part)) => assert!(e.contains(part), "{name}: {e}"),
                (got, _) => panic!("{name:?}: unexpected {got:?}"),
            }
        }
    }
}

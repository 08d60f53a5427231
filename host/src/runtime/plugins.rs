//! The plugins folder: which files become deployers, and why the others did
//! not. `reconcile` holds the folder rules, for the first load and for every
//! change the watcher applies. A bad file is skipped with its reason; it
//! never stops the others. Never reads a plugin's bytes itself (`load` does)
//! and never watches the folder (`watch` does).

use std::collections::{BTreeMap, BTreeSet};
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

/// The folder's plugin files now, by file name, and which files differ from
/// the ones the served set was made from: at the first load, all of them;
/// later, those added, changed or removed.
#[derive(Debug)]
pub(crate) struct Folder {
    pub(crate) files: BTreeSet<String>,
    pub(crate) changed: BTreeSet<String>,
}

/// One thing a reconcile changed, for the log and the event stream.
#[derive(Debug)]
pub(crate) enum Change {
    Loaded { name: String, replaced: bool },
    Removed { name: String },
    Rejected(Rejection),
}

/// What the folder rules need of a served deployer: it can stay serving, and
/// its `.wasm` digest names it in a message.
trait Served: Clone {
    fn sha256(&self) -> &str;
}

impl Served for Arc<Plugin> {
    fn sha256(&self) -> &str {
        &self.sha256
    }
}

/// The set after a reconcile, and its changes in the order they were decided.
struct Reconciled<P> {
    deployers: BTreeMap<String, P>,
    rejected: Vec<Rejection>,
    changes: Vec<Change>,
}

/// The plugins-folder rules, in one place. Reconsiders, in name order, every
/// deployer name with a changed file and leaves the others as they are (their
/// deployer, or their rejection, carries over):
///
/// - `NAME.wasm` gone: the deployer is dropped, and a `NAME.toml` or
///   `NAME.wasm.sig` left behind is rejected as a manifest or a signature
///   without a plugin;
/// - a new name beyond `max` deployers, or one that is not a valid name, is
///   rejected without loading it (in that order);
/// - otherwise `load(NAME)` decides; when a served deployer's new version
///   fails, the old one stays serving and the rejection says so.
///
/// A served deployer keeps its place under `max` while its `.wasm` stays, so
/// new names only take the places left. Only `load` does I/O.
async fn reconcile<P: Served, F: Future<Output = Result<P, String>>>(
    folder: &Folder,
    served: &BTreeMap<String, P>,
    rejected: &[Rejection],
    max: usize,
    mut load: impl FnMut(String) -> F,
) -> Reconciled<P> {
    let stale: BTreeSet<&str> = folder.changed.iter().filter_map(|f| stem(f)).collect();
    let mut next = Reconciled {
        deployers: served
            .iter()
            .filter(|(name, _)| !stale.contains(name.as_str()))
            .map(|(name, plugin)| (name.clone(), plugin.clone()))
            .collect(),
        rejected: rejected
            .iter()
            .filter(|r| !stem(&r.file).is_some_and(|name| stale.contains(name)))
            .cloned()
            .collect(),
        changes: Vec::new(),
    };
    let wasm_of = |name: &str| format!("{name}.wasm");
    let mut taken = next.deployers.len()
        + stale
            .iter()
            .filter(|name| served.contains_key(**name) && folder.files.contains(&wasm_of(name)))
            .count();
    for name in stale {
        let wasm = wasm_of(name);
        let previous = served.get(name);
        if !folder.files.contains(&wasm) {
            for (file, what) in [
                (format!("{name}.toml"), "a manifest"),
                (format!("{wasm}.sig"), "a signature"),
            ] {
                if folder.files.contains(&file) {
                    let reason = format!("{what} without a plugin: there is no {wasm} beside it");
                    next.reject(file, reason);
                }
            }
            if previous.is_some() {
                next.changes.push(Change::Removed {
                    name: name.to_string(),
                });
            }
            continue;
        }
        if previous.is_none() {
            if taken >= max {
                let reason = format!(
                    "too many deployers: this server loads at most {max} (--max-deployers)"
                );
                next.reject(wasm, reason);
                continue;
            }
            if let Err(reason) = check_name(name) {
                next.reject(wasm, reason);
                continue;
            }
        }
        match (load(name.to_string()).await, previous) {
            (Ok(plugin), _) => {
                taken += usize::from(previous.is_none());
                next.deployers.insert(name.to_string(), plugin);
                next.changes.push(Change::Loaded {
                    name: name.to_string(),
                    replaced: previous.is_some(),
                });
            }
            (Err(reason), Some(old)) => {
                next.deployers.insert(name.to_string(), old.clone());
                let reason = format!(
                    "{reason} (still serving the previous version, sha256 {})",
                    old.sha256()
                );
                next.reject(wasm, reason);
            }
            (Err(reason), None) => next.reject(wasm, reason),
        }
    }
    next
}

impl<P> Reconciled<P> {
    fn reject(&mut self, file: String, reason: String) {
        let rejection = Rejection { file, reason };
        self.rejected.push(rejection.clone());
        self.changes.push(Change::Rejected(rejection));
    }
}

/// The names of the files in the plugins folder.
fn folder_files(dir: &Path) -> Result<BTreeSet<String>, Rejection> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect()),
        Err(e) => Err(Rejection {
            file: dir.display().to_string(),
            reason: format!("the plugins folder cannot be read: {e}"),
        }),
    }
}

/// The deployer names the plugins folder holds a plugin or a manifest for
/// (`NAME.wasm`, `NAME.toml`), in name order; none if it cannot be read. A
/// signature alone names no deployer to wait for.
pub fn folder_names(dir: &Path) -> BTreeSet<String> {
    folder_files(dir)
        .unwrap_or_default()
        .iter()
        .filter(|f| !f.ends_with(SIGNATURE))
        .filter_map(|f| stem(f))
        .map(str::to_string)
        .collect()
}

/// A folder plugin's detached signature is `NAME.wasm.sig`.
const SIGNATURE: &str = ".wasm.sig";

/// The deployer name a plugin file belongs to (`NAME.wasm`, `NAME.toml`,
/// `NAME.wasm.sig`); `None` for other files.
fn stem(file: &str) -> Option<&str> {
    file.strip_suffix(SIGNATURE)
        .or_else(|| file.strip_suffix(".wasm"))
        .or_else(|| file.strip_suffix(".toml"))
}

/// Whether a change of `file` is a change of a deployer: what the watcher
/// looks at.
pub(crate) fn is_plugin_file(file: &str) -> bool {
    stem(file).is_some()
}

impl Runtime {
    /// Loads every `*.wasm` of `dir`, in name order, up to `max` deployers.
    /// A folder that cannot be read yields an empty set and one rejection.
    pub async fn load_dir(&self, dir: &Path, max: usize) -> PluginSet {
        self.load_dir_each(dir, max, |_, _, _| {}).await
    }

    /// `load_dir`, one deployer name at a time (the same rules, the same
    /// result): `each` is handed every name with the set so far and what
    /// it changed, so a server can serve each deployer as soon as it is
    /// compiled.
    pub(crate) async fn load_dir_each(
        &self,
        dir: &Path,
        max: usize,
        mut each: impl FnMut(&str, &PluginSet, Vec<Change>),
    ) -> PluginSet {
        let files = match folder_files(dir) {
            Ok(files) => files,
            Err(rejection) => {
                return PluginSet {
                    deployers: BTreeMap::new(),
                    rejected: vec![rejection],
                };
            }
        };
        let names: BTreeSet<&str> = files.iter().filter_map(|f| stem(f)).collect();
        let mut set = PluginSet::default();
        for name in names {
            let folder = Folder {
                changed: [
                    format!("{name}.wasm"),
                    format!("{name}.toml"),
                    format!("{name}{SIGNATURE}"),
                ]
                .into_iter()
                .filter(|f| files.contains(f))
                .collect(),
                files: files.clone(),
            };
            let changes;
            (set, changes) = self.reconcile_dir(dir, &folder, &set, max).await;
            each(name, &set, changes);
        }
        set
    }

    /// Brings `served` in line with `folder` (see `reconcile`), loading from
    /// `dir`, and logs each change.
    pub(crate) async fn reconcile_dir(
        &self,
        dir: &Path,
        folder: &Folder,
        served: &PluginSet,
        max: usize,
    ) -> (PluginSet, Vec<Change>) {
        let load = |name: String| async move {
            let path = dir.join(format!("{name}.wasm"));
            self.load_file(&path, &name).await.map(Arc::new)
        };
        let next = reconcile(folder, &served.deployers, &served.rejected, max, load).await;
        for change in &next.changes {
            match change {
                Change::Loaded { name, replaced } => {
                    let plugin = &next.deployers[name];
                    tracing::info!(
                        plugin = %name,
                        sha256 = %plugin.sha256,
                        origin = ?plugin.origin,
                        "{} deployer: {}",
                        if *replaced { "replaced" } else { "loaded" },
                        plugin.description
                    );
                }
                Change::Removed { name } => {
                    tracing::info!(plugin = %name, "deployer removed: its file left the plugins folder");
                }
                Change::Rejected(Rejection { file, reason }) => {
                    tracing::warn!(file, "skipped plugin: {reason}");
                }
            }
        }
        let set = PluginSet {
            deployers: next.deployers,
            rejected: next.rejected,
        };
        (set, next.changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case a line: the folder's files | the changed files (`*`: all) |
    /// what is served (deployers at version `old`, `!FILE` a rejection made
    /// earlier) | max || the deployers | the rejections as `FILE:rule` | the
    /// changes (`+` loaded, `~` replaced, `-` removed, `!` rejected). Loading
    /// yields version `new`, or fails with `broken` for names starting so.
    const RULES: &str = "
        # the first load: everything changed, nothing served
        a.wasm b.wasm                    | *             |             | 9 || a=new b=new | | +a +b
        a.wasm a.toml notes.txt          | *             |             | 9 || a=new | | +a
        a.wasm a.wasm.sig a.sig          | *             |             | 9 || a=new | | +a
        a.toml                           | *             |             | 9 || | a.toml:orphan | !a.toml
        a.wasm.sig                       | *             |             | 9 || | a.wasm.sig:orphan-sig | !a.wasm.sig
        a.toml a.wasm.sig                | *             |             | 9 || | a.toml:orphan a.wasm.sig:orphan-sig | !a.toml !a.wasm.sig
        -a.wasm                          | *             |             | 9 || | -a.wasm:bad-name | !-a.wasm
        broken.wasm                      | *             |             | 9 || | broken.wasm:broken | !broken.wasm
        a.wasm b.wasm c.wasm             | *             |             | 2 || a=new b=new | c.wasm:too-many | +a +b !c.wasm
        a.wasm broken.wasm c.wasm d.wasm | *             |             | 2 || a=new c=new | broken.wasm:broken d.wasm:too-many | +a !broken.wasm +c !d.wasm
        -a.wasm                          | *             |             | 0 || | -a.wasm:too-many | !-a.wasm
        # while serving: only the changed names are reconsidered
        a.wasm b.wasm z.toml             | b.wasm        | a b !z.toml | 9 || a=old b=new | z.toml:earlier | ~b
        a.wasm a.toml                    | a.toml        | a           | 9 || a=new | | ~a
        a.wasm                           | b.wasm        | a b         | 9 || a=old | | -b
        b.toml                           | b.wasm        | b           | 9 || | b.toml:orphan | !b.toml -b
        b.wasm.sig                       | b.wasm        | b           | 9 || | b.wasm.sig:orphan-sig | !b.wasm.sig -b
        # a signature added, replaced or removed: its deployer loads again
        a.wasm a.wasm.sig                | a.wasm.sig    | a           | 9 || a=new | | ~a
        a.wasm                           | a.wasm.sig    | a           | 9 || a=new | | ~a
        a.wasm a.wasm.sig                | a.wasm.sig    | !a.wasm     | 9 || a=new | | +a
        a.wasm a.wasm.sig                | a.wasm        | !a.wasm.sig | 9 || a=new | | +a
        broken.wasm                      | broken.wasm   | broken      | 9 || broken=old | broken.wasm:broken-old-serves | !broken.wasm
                                         | broken.wasm   | !broken.wasm| 9 || | |
        a.wasm                           | a.wasm        | !a.wasm     | 9 || a=new | | +a
        # the limit: a served deployer keeps its place, a removal frees one
        a.wasm b.wasm c.wasm             | b.wasm c.wasm | a b         | 2 || a=old b=new | c.wasm:too-many | ~b !c.wasm
        a.wasm c.wasm                    | b.wasm c.wasm | a b         | 2 || a=old c=new | | -b +c
        a.wasm c.wasm                    | b.wasm        | a b !c.wasm | 2 || a=old | c.wasm:earlier | -b
    ";

    /// A served deployer of the table: its version is its "sha256".
    #[derive(Debug, Clone)]
    struct Fake(&'static str);

    impl Served for Fake {
        fn sha256(&self) -> &str {
            self.0
        }
    }

    #[test]
    fn the_folder_rules() {
        let cases = RULES
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'));
        for case in cases {
            let (given, expected) = case.split_once("||").expect("a case has given || expected");
            let [files, changed, served, max] = columns(given);
            assert_eq!(
                reconciled(files, changed, served, max),
                columns::<3>(expected),
                "{case}"
            );
        }
    }

    fn columns<const N: usize>(text: &str) -> [String; N] {
        let columns: Vec<String> = text
            .split('|')
            .map(|column| column.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        columns.try_into().expect("the number of columns")
    }

    fn words(text: &str) -> impl Iterator<Item = String> {
        text.split_whitespace().map(String::from)
    }

    fn reconciled(files: String, changed: String, served: String, max: String) -> [String; 3] {
        let files: BTreeSet<String> = words(&files).collect();
        let changed = match changed.as_str() {
            "*" => files.clone(),
            _ => words(&changed).collect(),
        };
        let folder = Folder { files, changed };
        let (mut deployers, mut rejected) = (BTreeMap::new(), Vec::new());
        for word in words(&served) {
            match word.strip_prefix('!') {
                Some(file) => rejected.push(Rejection {
                    file: file.to_string(),
                    reason: "earlier".to_string(),
                }),
                None => drop(deployers.insert(word, Fake("old"))),
            }
        }
        let load = |name: String| async move {
            match name.starts_with("broken") {
                true => Err("broken".to_string()),
                false => Ok(Fake("new")),
            }
        };
        let max = max.parse().expect("max is a number");
        let next =
            futures::executor::block_on(reconcile(&folder, &deployers, &rejected, max, load));

        let deployers = next
            .deployers
            .iter()
            .map(|(name, plugin)| format!("{name}={}", plugin.0));
        let rejected = next
            .rejected
            .iter()
            .map(|r| format!("{}:{}", r.file, rule(&r.reason)));
        let changes = next.changes.iter().map(|change| match change {
            Change::Loaded {
                name,
                replaced: false,
            } => format!("+{name}"),
            Change::Loaded {
                name,
                replaced: true,
            } => format!("~{name}"),
            Change::Removed { name } => format!("-{name}"),
            Change::Rejected(r) => format!("!{}", r.file),
        });
        [
            deployers.collect::<Vec<_>>().join(" "),
            rejected.collect::<Vec<_>>().join(" "),
            changes.collect::<Vec<_>>().join(" "),
        ]
    }

    /// Which rule a rejection's reason comes from.
    fn rule(reason: &str) -> &'static str {
        let kept = reason.ends_with("(still serving the previous version, sha256 old)");
        match reason {
            _ if reason.starts_with("a manifest without a plugin: there is no ") => "orphan",
            _ if reason.starts_with("a signature without a plugin: there is no ") => "orphan-sig",
            _ if reason.starts_with("too many deployers: this server loads at most ") => "too-many",
            _ if reason.starts_with("name ") => "bad-name",
            _ if reason.starts_with("broken") && kept => "broken-old-serves",
            "broken" => "broken",
            "earlier" => "earlier",
            _ => panic!("unexpected reason {reason:?}"),
        }
    }

    #[test]
    fn a_signature_alone_names_no_deployer_to_wait_for() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["a.wasm", "a.wasm.sig", "b.toml", "c.wasm.sig", "notes.txt"] {
            std::fs::write(dir.path().join(file), "").unwrap();
        }
        assert_eq!(
            folder_names(dir.path()),
            BTreeSet::from(["a".to_string(), "b".to_string()])
        );
        let watched: Vec<_> = ["a.wasm", "a.wasm.sig", "a.toml", "a.sig", "a.wasm.sig.tmp"]
            .into_iter()
            .filter(|f| is_plugin_file(f))
            .collect();
        assert_eq!(watched, ["a.wasm", "a.wasm.sig", "a.toml"]);
    }

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

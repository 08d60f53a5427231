//! The served set's own rules, without a server: how the folder's and the
//! stored deployers merge, that a name the folder declares never comes
//! from the API, and which versions stay runnable for the queue.

use std::collections::HashSet;
use std::sync::OnceLock;

use super::*;
use crate::runtime::{Compiler, Engines, Limits};

/// One real plugin, loaded once; every plugin here is its code as
/// another deployer's version.
fn template() -> &'static (Arc<Runtime>, Plugin) {
    static TEMPLATE: OnceLock<(Arc<Runtime>, Plugin)> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let engines = Engines {
            compiler: Compiler::Baseline,
            pool: None,
        };
        let runtime = Arc::new(Runtime::new(Limits::default(), None, engines).unwrap());
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-plugins/misbehave.wasm");
        let plugin = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(runtime.load_file(&path, "misbehave"))
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (scripts/build-plugins builds it; make test runs it)",
                    path.display()
                )
            });
        (runtime, plugin)
    })
}

fn plugin(name: &str, sha256: &str) -> Arc<Plugin> {
    Arc::new(template().1.as_version(name, sha256))
}

/// A folder's set: `served` as `(name, sha256)`, and refused files.
fn folder(served: &[(&str, &str)], refused: &[&str]) -> PluginSet {
    PluginSet {
        deployers: served
            .iter()
            .map(|(name, sha256)| (name.to_string(), plugin(name, sha256)))
            .collect(),
        rejected: refused
            .iter()
            .map(|file| Rejection {
                file: file.to_string(),
                reason: "refused".to_string(),
            })
            .collect(),
    }
}

fn version(id: i64, name: &str, sha256: &str) -> StoredVersion {
    StoredVersion {
        id,
        name: name.to_string(),
        number: id,
        sha256: sha256.to_string(),
        size: 1,
        manifest: None,
        signature: None,
        source: None,
        added_by: None,
        added_at: String::new(),
        held: None,
    }
}

/// Stored deployers, each loaded at the version it serves.
fn api(loaded: &[(i64, &str, &str)]) -> ApiSet {
    let mut api = ApiSet::default();
    for (id, name, sha256) in loaded {
        let version = version(*id, name, sha256);
        api.stored.insert(name.to_string(), version.clone());
        api.loaded
            .insert(name.to_string(), (plugin(name, sha256), version));
    }
    api
}

fn deployers(set: PluginSet) -> Deployers {
    Deployers::new(template().0.clone(), PathBuf::from("plugins"), set)
}

/// What deployments run: name → sha256.
fn served(deployers: &Deployers) -> Vec<(String, String)> {
    deployers
        .current()
        .deployers
        .values()
        .map(|p| (p.name.clone(), p.sha256.clone()))
        .collect()
}

fn pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn runnable(deployers: &Deployers) -> Vec<String> {
    deployers.runnable().into_keys().collect()
}

#[test]
fn the_served_set_is_the_folders_and_the_stored_ones_each_with_its_source() {
    let deployers = deployers(folder(&[("archive", "f1")], &[]));
    let mut stored = api(&[(1, "pushed", "s1")]);
    // A stored version that failed to load here: listed, never served.
    let failed = version(2, "broken", "s2");
    stored.stored.insert("broken".into(), failed.clone());
    let why = Rejection {
        file: "broken.wasm".into(),
        reason: "describe failed".into(),
    };
    stored
        .failed
        .insert("broken".into(), (failed.clone(), why.clone()));
    deployers.replace_api(stored);

    assert_eq!(
        served(&deployers),
        pairs(&[("archive", "f1"), ("pushed", "s1")])
    );
    let view = deployers.view();
    let sources: Vec<(String, Source)> = view
        .deployers
        .iter()
        .map(|(plugin, source)| (plugin.name.clone(), source.clone()))
        .collect();
    assert_eq!(
        sources,
        [
            ("archive".to_string(), Source::Folder),
            (
                "pushed".to_string(),
                Source::Api(Box::new(version(1, "pushed", "s1")))
            ),
        ]
    );
    assert_eq!(view.rejected, [(why, Source::Api(Box::new(failed)))]);
}

#[test]
fn a_name_the_folder_declares_never_comes_from_the_api() {
    // The folder serves `archive`, refused `bad.wasm` and has `slow` still
    // to load; the API stores all three names and one of its own.
    let names = BTreeSet::from(["archive".to_string(), "slow".to_string()]);
    let deployers = Deployers::loading(
        template().0.clone(),
        PathBuf::from("plugins"),
        names,
        BTreeSet::from(["pushed".to_string()]),
    );
    assert_eq!(deployers.still_loading(), ["archive", "pushed", "slow"]);
    deployers.loaded("archive", folder(&[("archive", "f1")], &["bad.wasm"]));
    deployers.replace_api(api(&[
        (1, "archive", "s1"),
        (2, "bad", "s2"),
        (3, "slow", "s3"),
        (4, "pushed", "s4"),
    ]));
    assert_eq!(deployers.still_loading(), ["slow"]);
    assert!(deployers.is_loading("slow") && !deployers.is_loading("pushed"));

    assert_eq!(
        served(&deployers),
        pairs(&[("archive", "f1"), ("pushed", "s4")])
    );
    for name in ["archive", "bad", "slow"] {
        assert!(deployers.declared(name), "{name}");
    }
    assert!(!deployers.declared("pushed"));
    let shadowed: Vec<(String, i64)> = deployers
        .view()
        .rejected
        .into_iter()
        .filter_map(|(rejection, source)| match source {
            Source::Api(version) => {
                assert!(
                    rejection
                        .reason
                        .contains("declared in this server's plugins folder"),
                    "{}",
                    rejection.reason
                );
                Some((rejection.file, version.id))
            }
            Source::Folder => None,
        })
        .collect();
    assert_eq!(
        shadowed,
        [
            ("archive.wasm".to_string(), 1),
            ("bad.wasm".to_string(), 2),
            ("slow.wasm".to_string(), 3),
        ]
    );

    // Once the first load is over without it, `slow` is the API's.
    deployers.finish_loading();
    assert_eq!(
        served(&deployers),
        pairs(&[("archive", "f1"), ("pushed", "s4"), ("slow", "s3")])
    );
}

#[test]
fn a_version_that_stops_being_served_stays_runnable_until_no_queued_deployment_asks_for_it() {
    let deployers = deployers(folder(&[("archive", "v1")], &[]));
    deployers.replace_api(api(&[(1, "pushed", "p1")]));
    assert_eq!(runnable(&deployers), ["archive@v1", "pushed@p1"]);
    assert!(!deployers.has_retired());

    // Replaced in the folder, replaced over the API.
    deployers.replace(folder(&[("archive", "v2")], &[]));
    deployers.replace_api(api(&[(2, "pushed", "p2")]));
    assert_eq!(
        runnable(&deployers),
        ["archive@v1", "archive@v2", "pushed@p1", "pushed@p2"]
    );
    assert_eq!(
        served(&deployers),
        pairs(&[("archive", "v2"), ("pushed", "p2")])
    );

    // Kept while queued or within the grace, dropped after.
    let queued = HashSet::from(["archive@v1".to_string()]);
    deployers.drop_retired(&queued, Duration::from_secs(3600));
    assert_eq!(runnable(&deployers).len(), 4);
    deployers.drop_retired(&queued, Duration::ZERO);
    assert_eq!(
        runnable(&deployers),
        ["archive@v1", "archive@v2", "pushed@p2"]
    );
    deployers.drop_retired(&HashSet::new(), Duration::ZERO);
    assert_eq!(runnable(&deployers), ["archive@v2", "pushed@p2"]);
    assert!(!deployers.has_retired());

    // Removed, then served again: retired meanwhile, not after.
    deployers.replace_api(ApiSet::default());
    assert_eq!(runnable(&deployers), ["archive@v2", "pushed@p2"]);
    assert!(deployers.has_retired());
    deployers.replace_api(api(&[(2, "pushed", "p2")]));
    assert!(!deployers.has_retired());
}

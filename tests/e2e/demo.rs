//! `make run`'s configuration: the three publishing examples with the
//! manifests checked in under `plugins/` (each granting the target `demo`)
//! and a sources file whose `demo` is a folder, as `scripts/demo` writes
//! it. Each deploys with no options at all (the only granted target filled
//! in) and its files land in the folder byte for byte; `berth plugin run`
//! fills in the target the same way and `plugin check` lists it.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{berth_command, expect_success, lossy, path};
use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model, plugins, tree};

const PUBLISHERS: [&str; 3] = ["http-publish", "s3-publish", "oci-publish"];

/// The manifest `make run` serves `name` with.
fn demo_manifest(name: &str) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(format!("{name}.toml"));
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// A sources file defining `demo` as the folder `published` under `temp`,
/// as scripts/demo writes it.
fn demo_sources(temp: &TempDir) -> (PathBuf, PathBuf) {
    let published = temp.path().join("published");
    std::fs::create_dir_all(&published).unwrap();
    let sources = temp.path().join("demo-sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"demo\"\nurl = \"file://{}/\"\n",
            published.display()
        ),
    )
    .unwrap();
    (sources, published)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publishing_example_deploys_into_the_demo_folder_with_no_options() {
    let files = FileServer::start().await;
    let temp = TempDir::new().unwrap();
    let (sources, published) = demo_sources(&temp);
    let mut options = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(path(&sources));
    for name in PUBLISHERS {
        options = options
            .plugin(name, plugins::example(name))
            .plugins_file(&format!("{name}.toml"), demo_manifest(name));
    }
    let berth = options.start().await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-demo", &contents)).await;

    let mut expected = std::collections::BTreeMap::new();
    for name in PUBLISHERS {
        let (status, deployment) = berth.deploy(id, name, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{name}: {deployment}");
        assert_eq!(deployment["status"], "completed", "{name}: {deployment}");
        assert_eq!(deployment["options"], json!({ "target": "demo" }), "{name}");
        let deploy_id = deployment["id"].as_i64().unwrap();
        // Each example's own layout under the target.
        let folder = match name {
            "oci-publish" => "job-demo-adapter:job-demo".to_string(),
            _ => format!("job-demo/deploy-{deploy_id}"),
        };
        let url = format!("file://{}/{folder}/", published.display());
        match name {
            // Their ref: the url of the folder key, ending in /.
            "http-publish" | "oci-publish" => assert_eq!(deployment["ref"], url, "{name}"),
            _ => assert_eq!(deployment["ref"], format!("{url}manifest.json"), "{name}"),
        }
        for (file, bytes) in &contents {
            expected.insert(format!("{folder}/{file}"), bytes.clone());
        }
        if name == "s3-publish" {
            let manifest = std::fs::read(published.join(&folder).join("manifest.json")).unwrap();
            expected.insert(format!("{folder}/manifest.json"), manifest);
        }
        let puts = published_urls(&deployment);
        assert_eq!(
            puts.len(),
            contents.len() + usize::from(name == "s3-publish")
        );
        assert!(puts.iter().all(|u| u.starts_with(&url)), "{name}: {puts:?}");
    }
    assert_eq!(tree(&published), expected);
}

fn published_urls(deployment: &Value) -> Vec<String> {
    deployment["published"]
        .as_array()
        .unwrap_or_else(|| panic!("no published list: {deployment}"))
        .iter()
        .map(|p| p["url"].as_str().unwrap().to_string())
        .collect()
}

/// `plugin check` lists the demo manifest's target and where the local
/// sources file puts it, or that it does not; `plugin run` fills in the
/// only granted target, as the server does, and the files land there.
#[test]
fn plugin_check_and_run_take_the_only_granted_target() {
    let temp = TempDir::new().unwrap();
    let (sources, published) = demo_sources(&temp);
    let wasm = temp.path().join("http-publish.wasm");
    std::fs::copy(plugins::example("http-publish"), &wasm).unwrap();
    std::fs::write(
        temp.path().join("http-publish.toml"),
        demo_manifest("http-publish"),
    )
    .unwrap();
    let model = temp.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("weights.bin"), b"weights").unwrap();

    let check = |flags: &[&str]| {
        let mut command = berth_command(&["plugin", "check"], &wasm, flags);
        command.env_remove("BERTH_SOURCES_FILE");
        expect_success(&command.output().unwrap())
    };
    let url = format!("file://{}/", published.display());
    let said = check(&["--targets-file", path(&sources)]);
    assert!(
        said.contains(&format!("targets:     demo ({url})\n")),
        "{said}"
    );
    let elsewhere = temp.path().join("other.toml");
    std::fs::write(&elsewhere, "").unwrap();
    let said = check(&["--targets-file", path(&elsewhere)]);
    assert!(
        said.contains(&format!(
            "targets:     demo (not in {})\n",
            elsewhere.display()
        )),
        "{said}"
    );

    let output = berth_command(
        &["plugin", "run"],
        &wasm,
        &[
            "--dir",
            path(&model),
            "--targets-file",
            path(&sources),
            "--deploy-id",
            "7",
        ],
    )
    .output()
    .unwrap();
    let result: Value = serde_json::from_str(&expect_success(&output)).unwrap();
    assert_eq!(result["ref"], format!("{url}model/deploy-7/"));
    assert!(
        lossy(&output.stderr).contains(
            "plugin http-publish: option \"target\" is \"demo\", the only target its manifest grants"
        ),
        "{}",
        lossy(&output.stderr)
    );
    assert_eq!(
        std::fs::read(published.join("model/deploy-7/weights.bin")).unwrap(),
        b"weights"
    );
}

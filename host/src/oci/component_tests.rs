//! A component pulled from the CNCF registry (`tests/registry`): pinned
//! to its manifest's digest, bounded before it is read, verified as it is.

use super::component::{PullError, WASM_CONFIG, WASM_LAYER, pull};
use super::manifest::OCI_MANIFEST;
use super::{Reference, Registry};

use super::test_registry as real;

/// Pushes `wasm` in the wasm artifact layout under `repo:tag`; answers
/// the manifest's and the layer's sha256.
async fn push(registry: &real::Registry, repo: &str, tag: &str, wasm: &[u8]) -> (String, String) {
    let config = registry.push_blob(repo, b"{}".to_vec()).await;
    let layer = registry.push_blob(repo, wasm.to_vec()).await;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": WASM_CONFIG, "digest": format!("sha256:{config}"), "size": 2},
        "layers": [{"mediaType": WASM_LAYER, "digest": format!("sha256:{layer}"), "size": wasm.len()}],
    });
    (registry.push_manifest(repo, tag, &manifest).await, layer)
}

fn client(registry: &real::Registry) -> Registry {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    Registry::new(http, &registry.host, None, None)
}

/// Against the CNCF registry: the bytes come back pinned to the
/// manifest's digest; a layer over the bound is refused before it is
/// read; a damaged blob is refused.
#[tokio::test]
async fn a_component_is_pulled_whole_bounded_and_verified() {
    let registry = real::Registry::start();
    let wasm = b"\0asm\x0d\0\x01\0 a component, or so it says".repeat(100);
    let (digest, layer) = push(&registry, "team/packer", "v1", &wasm).await;
    let reference = Reference::parse(&format!("oci://{}/team/packer:v1", registry.host)).unwrap();
    let client = client(&registry);
    let pulled = pull(&client, &reference, 1 << 20).await.unwrap();
    assert_eq!(pulled.wasm, wasm);
    assert_eq!(
        pulled.pinned.to_string(),
        format!("oci://{}/team/packer@sha256:{digest}", registry.host)
    );
    let by_digest = pull(&client, &pulled.pinned, 1 << 20).await.unwrap();
    assert_eq!(by_digest.pinned, pulled.pinned);

    match pull(&client, &reference, wasm.len() - 1).await {
        Err(PullError::TooLarge { size, .. }) => assert_eq!(size, wasm.len() as u64),
        other => panic!("{other:?}"),
    }

    let mut damaged = wasm.clone();
    damaged[10] ^= 1;
    std::fs::write(registry.blob_file(&layer), &damaged).unwrap();
    match pull(&client, &reference, 1 << 20).await {
        Err(PullError::Registry(e)) => assert!(
            e.contains(&format!(
                "for the blob sha256:{layer} ({} bytes): refused",
                wasm.len()
            )),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }

    let missing = Reference::parse(&format!("oci://{}/team/packer:v2", registry.host)).unwrap();
    match pull(&client, &missing, 1 << 20).await {
        Err(PullError::Registry(e)) => assert!(e.contains("has no manifest"), "{e}"),
        other => panic!("{other:?}"),
    }
}

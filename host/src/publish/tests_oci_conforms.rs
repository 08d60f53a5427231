//! The conformance suite (`conformance`) run against an OCI registry
//! target behind a login: files are read back from the artifact with
//! berth's own client, and open upload sessions from the registry's
//! access log.

use std::sync::Arc;

use super::Key;
use super::conformance::{Target, conforms};
use super::testing::key;
use super::tests_oci::registry::{self, Registry};
use super::tests_oci::{reader, target};

/// Upload sessions berth left open: written to (`PATCH`) and neither
/// completed (`PUT`) nor cancelled (`DELETE`, answered 204), by the
/// registry's access log.
async fn open_sessions(registry: &Registry) -> Vec<String> {
    let requests = registry.requests().await;
    let session = |r: &String| {
        let path = r.split(' ').nth(1)?;
        let (_, rest) = path.split_once("/blobs/uploads/")?;
        let id = rest.split('?').next()?;
        (!id.is_empty()).then(|| id.to_string())
    };
    let closed = |id: &String| {
        requests.iter().any(|r| {
            session(r).as_ref() == Some(id)
                && (r.starts_with("PUT ") || (r.starts_with("DELETE ") && r.ends_with(" 204")))
        })
    };
    let mut open: Vec<String> = requests
        .iter()
        .filter_map(session)
        .filter(|id| !closed(id))
        .collect();
    open.dedup();
    open.iter()
        .map(|id| {
            format!(
                "{id}: {:?}",
                requests
                    .iter()
                    .filter(|r| r.contains(id.as_str()))
                    .collect::<Vec<_>>()
            )
        })
        .collect()
}

/// The file `key` (`REPO:TAG/PATH`) of the artifact the registry has,
/// read with berth's own client as a fetch would.
async fn artifact_file(client: Arc<crate::oci::Registry>, key: Key) -> Option<Vec<u8>> {
    let (repo, rest) = key.as_str().split_once(':').unwrap();
    let (tag, path) = rest.split_once('/').unwrap();
    let repository = format!("team/{repo}");
    let (_, manifest, _) = client.manifest_if_any(&repository, tag).await.unwrap()?;
    let file = manifest
        .files()
        .unwrap()
        .into_iter()
        .find(|f| f.path == path)?;
    let blob = client.blob(&repository, &file.sha256, None).await.unwrap();
    Some(blob.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn oci_conforms() {
    let registry = Arc::new(Registry::with_login());
    let logged = registry.clone();
    let wrong = "not-the-password-9f2";
    let reading = Arc::new(reader(&registry));
    let target = Target {
        publisher: target(&registry, Some((registry::USER, registry::PASSWORD))),
        key: |check, path| key(&format!("{check}:t/{path}")),
        read_back: Box::new(move |k| Box::pin(artifact_file(reading.clone(), k))),
        leftovers: Box::new(move || {
            let registry = logged.clone();
            Box::pin(async move { open_sessions(&registry).await })
        }),
        secret: Some(registry::PASSWORD.to_string()),
        stranger: Some((
            target(&registry, Some((registry::USER, wrong))),
            wrong.to_string(),
        )),
        refused_key: Some((
            "m/a.bin",
            "key \"m/a.bin\" is not REPO:TAG/PATH, e.g. \"llama-ft:job-7/adapter_model.safetensors\", \
             which an oci target's keys are: it has no :TAG",
        )),
        told_while_sending: true,
    };
    conforms(&target).await;
}

//! A signature attached to an artifact berth wrote, as OCI 1.1 attaches
//! one thing to another: a manifest whose `subject` is the artifact's
//! manifest, its one layer the OpenSSF model signing bundle (`model.sig`),
//! its artifact type the Sigstore bundle's. A registry with the referrers
//! API indexes it by its subject, and says so (`OCI-Subject`); for one
//! without (the CNCF distribution 2.x, for one), the spec's fallback: the
//! image index tagged `sha256-HEX` (HEX the subject's digest) lists it,
//! beside what it listed already. `oras discover` finds it either way.

use std::collections::BTreeMap;

use bytes::Bytes;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Failed, Place, Registry, created_now, said};
use crate::oci::manifest::{Descriptor, Manifest, OCI_INDEX, OCI_MANIFEST, TITLE};
use crate::oci::registry::{MAX_MANIFEST, limited};
use crate::publish::{Content, Error, Key, Put, Subject, Tally};
use crate::signing::SIGNATURE_FILE;

/// The artifact type (and layer media type) of a Sigstore bundle, which an
/// OpenSSF model signature is.
pub const SIGNATURE_ARTIFACT: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// An image index: here, the referrers of one manifest.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

impl Registry {
    /// Attaches `signature` to the artifact `key` (`REPO:TAG`) whose
    /// manifest's sha256 and size are `to`, as its referrer: the url of
    /// the signature's manifest and what was put.
    pub(in crate::publish) async fn refer(
        &self,
        subject: &Subject,
        key: &Key,
        to: (&str, u64),
        signature: Bytes,
        cancel: &CancellationToken,
    ) -> Result<(String, Put), Error> {
        let place = Place::folder(&self.namespace, key).map_err(|reason| Error::Key {
            target: subject.target.clone(),
            reason,
        })?;
        let repository = place.repository.as_str();
        let what = format!("the signature of {}", key.as_str());
        let config = self
            .empty_config(subject, &what, (key, repository), cancel)
            .await?;
        let sha256 = crate::publish::sha256_hex(&signature);
        let never = |_: u64| {};
        self.push_blob(
            subject,
            &what,
            (key, repository),
            (signature.len() as u64, &sha256),
            &Content::Bytes(signature.clone()),
            None,
            &Tally::new(&never),
            cancel,
        )
        .await?;
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_string()),
            artifact_type: Some(SIGNATURE_ARTIFACT.to_string()),
            config,
            layers: vec![Descriptor {
                media_type: SIGNATURE_ARTIFACT.to_string(),
                digest: format!("sha256:{sha256}"),
                size: signature.len() as u64,
                artifact_type: None,
                annotations: BTreeMap::from([(TITLE.to_string(), SIGNATURE_FILE.to_string())]),
            }],
            subject: Some(Descriptor {
                media_type: OCI_MANIFEST.to_string(),
                digest: format!("sha256:{}", to.0),
                size: to.1,
                artifact_type: None,
                annotations: BTreeMap::new(),
            }),
            annotations: created_now(),
        };
        let body = Bytes::from(serde_json::to_vec(&manifest).expect("a manifest is JSON"));
        let digest = crate::publish::sha256_hex(&body);
        let at = (repository, format!("sha256:{digest}"));
        let (_, headers) = self
            .put_manifest(subject, &what, (at.0, &at.1), (OCI_MANIFEST, &body), cancel)
            .await?;
        if !headers.contains_key("oci-subject") {
            let listed = Descriptor {
                media_type: OCI_MANIFEST.to_string(),
                digest: format!("sha256:{digest}"),
                size: body.len() as u64,
                artifact_type: Some(SIGNATURE_ARTIFACT.to_string()),
                annotations: BTreeMap::new(),
            };
            self.list_referrer(subject, &what, repository, to.0, listed, cancel)
                .await?;
        }
        let reference = self.reference(repository, &place.tag, Some(&digest));
        Ok((
            reference.to_string(),
            Put {
                bytes: body.len() as u64,
                etag: Some(format!("sha256:{digest}")),
                sha256: digest,
            },
        ))
    }

    /// The referrers tag schema: adds `referrer` to the index tagged
    /// `sha256-HEX` (`of`'s hex) in `repository`, written anew if there is
    /// none.
    async fn list_referrer(
        &self,
        subject: &Subject,
        what: &str,
        repository: &str,
        of: &str,
        referrer: Descriptor,
        cancel: &CancellationToken,
    ) -> Result<(), Error> {
        let tag = format!("sha256-{of}");
        let url = self.client.url(repository, &format!("manifests/{tag}"));
        let answer = self
            .request(subject, what, repository, cancel, |http| {
                http.get(url.clone())
                    .header(reqwest::header::ACCEPT, OCI_INDEX)
            })
            .await
            .map_err(|failed| match failed {
                Failed::Stop(e) => e,
                Failed::Again(why) => said(subject, what, why),
            })?;
        let mut index = match answer.status() {
            StatusCode::NOT_FOUND => Index {
                schema_version: 2,
                media_type: Some(OCI_INDEX.to_string()),
                manifests: Vec::new(),
            },
            status if status.is_success() => {
                let body = limited(answer, MAX_MANIFEST)
                    .await
                    .map_err(|e| subject.refused(what, format!("reading the index {tag}: {e}")))?;
                serde_json::from_slice(&body).map_err(|e| {
                    subject.refused(
                        what,
                        format!("the tag {tag} holds no image index of referrers: {e}"),
                    )
                })?
            }
            _ => {
                return Err(
                    match self.answered(subject, what, repository, answer).await {
                        Failed::Stop(e) => e,
                        Failed::Again(why) => said(subject, what, why),
                    },
                );
            }
        };
        if index.manifests.iter().any(|m| m.digest == referrer.digest) {
            return Ok(());
        }
        index.manifests.push(referrer);
        let body = Bytes::from(serde_json::to_vec(&index).expect("an index is JSON"));
        self.put_manifest(
            subject,
            what,
            (repository, &tag),
            (OCI_INDEX, &body),
            cancel,
        )
        .await
        .map(drop)
    }
}

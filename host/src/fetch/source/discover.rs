//! A registration's files found at its source rather than given: what
//! `POST /v1/models` does when a body leaves `files` out. Dispatches on
//! the source's scheme; only schemes whose sources can be listed answer
//! (`s3`, `gs`, `az` and Azure's `https://ACCOUNT.blob.core.windows.net`:
//! an object store's prefix, listed by `buckets/list.rs`; `oci`: a
//! manifest's layers; `mlflow`: a registered model's version, `mlflow.rs`).
//! Never reads a
//! file's bytes, and knows nothing of the registration rules: what it
//! finds is checked by them afterwards, as given files are.

use super::{Location, Sources, fill};
use crate::cloud::Bucket;

/// What a source holds: the files found and the template to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Discovered {
    /// The source as a model records it: a template ending in `{path}`,
    /// with `{job_id}` where the registration wrote it.
    pub(crate) source: String,
    /// Sorted by path.
    pub(crate) files: Vec<Found>,
    /// Where an MLflow registry's version came from, to record.
    pub(crate) origin: Option<crate::mlflow::Origin>,
}

/// One file found at a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Relative to the listed prefix, `/`-separated.
    pub(crate) path: String,
    pub(crate) size_bytes: u64,
    /// Lowercase hex, when the source keeps the digest of the whole file.
    pub(crate) sha256: Option<String>,
}

/// The most files a listing may find: a model of more is refused rather
/// than registered in part.
pub(crate) const MAX_FILES: usize = 10_000;

/// What the refusal for a scheme that cannot be listed names.
const LISTABLE: &str =
    "s3://, gs:// and az:// prefixes, oci:// references and mlflow:// model versions";

impl Sources {
    /// The files at `source` (filled in for `job_id` as a file's location
    /// is), and the template that finds each of them again. The error is
    /// a sentence for the person registering.
    pub(crate) async fn discover(&self, source: &str, job_id: &str) -> Result<Discovered, String> {
        let scheme = scheme(source);
        let in_a_bucket = matches!(scheme.as_deref(), Some("s3" | "gs" | "az"))
            || matches!(fill(source, job_id, ""), Ok(Location::Store { .. }));
        match scheme.as_deref() {
            Some(_) if in_a_bucket => self.list_bucket(source, job_id).await,
            Some("mlflow" | "mlflow+http") => {
                let reference = crate::mlflow::Reference::parse(source)?;
                self.mlflow(&reference, None)
                    .await
                    .map_err(|e| format!("source {source:?}: {e}"))
            }
            Some("oci") => {
                let reference = crate::oci::Reference::parse(source)?;
                let listed = self.list_manifest(&reference).await?;
                if listed.files.len() > MAX_FILES {
                    return Err(format!(
                        "{reference} has {} files, more than the {MAX_FILES} a model may have",
                        listed.files.len()
                    ));
                }
                Ok(Discovered {
                    origin: None,
                    source: listed.pinned.to_string(),
                    files: listed
                        .files
                        .into_iter()
                        .map(|f| Found {
                            path: f.path,
                            size_bytes: f.size,
                            sha256: Some(f.sha256),
                        })
                        .collect(),
                })
            }
            Some(other) => Err(format!(
                "source {source:?}: the files of a {other}: source must be given in the \
                 registration (berth lists files itself only at {LISTABLE})"
            )),
            None => Err(format!(
                "source {source:?} is not a URL: write s3://BUCKET/PREFIX/ (or gs://, or \
                 az://ACCOUNT/CONTAINER/PREFIX/) or oci://REGISTRY/REPOSITORY:TAG to have the \
                 files listed, or give the files in the registration"
            )),
        }
    }
}

impl Sources {
    /// The objects under a bucket's prefix (see `bucket_prefix`), with the
    /// sources file's credentials for it.
    pub(super) async fn list_bucket(
        &self,
        source: &str,
        job_id: &str,
    ) -> Result<Discovered, String> {
        let (stored, url, bucket, key) = bucket_prefix(source, job_id)?;
        let credentials = self.access.covering(&url);
        let files = self.stores.list(&url, &bucket, &key, credentials).await?;
        Ok(Discovered {
            source: stored,
            files,
            origin: None,
        })
    }
}

/// The scheme of a URL template, lowercase, if it starts with one.
fn scheme(source: &str) -> Option<String> {
    let (scheme, _) = source.split_once(':')?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then(|| scheme.to_ascii_lowercase())
}

/// An object store's source as listed: `s3://BUCKET/PREFIX/` or
/// `s3://BUCKET/PREFIX/{path}` (`{job_id}` allowed in the prefix), and the
/// same of `gs://` and `az://` (or Azure's `https://`) URLs. Gives the
/// template to record (`…/{path}`), the prefix's URL with the job id
/// filled in, its bucket and its key (empty for the bucket's root).
fn bucket_prefix(
    source: &str,
    job_id: &str,
) -> Result<(String, url::Url, Bucket, object_store::path::Path), String> {
    let stored = if source.ends_with('/') {
        format!("{source}{{path}}")
    } else {
        source.to_string()
    };
    let listed = stored.strip_suffix("{path}").filter(|prefix| {
        prefix.ends_with('/')
            && !prefix.contains("{path}")
            && prefix
                .split_once("://")
                .is_some_and(|(_, rest)| rest.len() > 1)
    });
    if listed.is_none() {
        return Err(format!(
            "source {source:?} is not a prefix berth can list: write s3://BUCKET/PREFIX/ or \
             s3://BUCKET/PREFIX/{{path}} ({{path}} last, after a /; gs:// alike, \
             az://ACCOUNT/CONTAINER/PREFIX/), or give the files in the registration"
        ));
    }
    // The prefix is where `{path}` goes, filled in as for a file.
    match fill(&stored, job_id, "")? {
        Location::Store { url, .. } if url.query().is_some() || url.fragment().is_some() => {
            Err(format!(
                "source {source:?}: a bucket's URL is a bucket and a key, with no query or fragment"
            ))
        }
        Location::Store { url, bucket, key } => Ok((stored, url, bucket, key)),
        other => unreachable!("a bucket's template located {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3_source_names_the_prefix_listed_and_the_template_recorded() {
        // Source, job id: template recorded, prefix URL, bucket, key.
        let cases = [
            (
                "s3://models/runs/",
                "j",
                "s3://models/runs/{path}",
                "s3://models/runs/",
                "models",
                "runs",
            ),
            (
                "s3://models/runs/{job_id}/{path}",
                "job-1",
                "s3://models/runs/{job_id}/{path}",
                "s3://models/runs/job-1/",
                "models",
                "runs/job-1",
            ),
            (
                "s3://models/{job_id}/",
                "job.2",
                "s3://models/{job_id}/{path}",
                "s3://models/job.2/",
                "models",
                "job.2",
            ),
            (
                "s3://models/",
                "j",
                "s3://models/{path}",
                "s3://models/",
                "models",
                "",
            ),
            (
                "s3://models/w%20x/",
                "j",
                "s3://models/w%20x/{path}",
                "s3://models/w%20x/",
                "models",
                "w x",
            ),
        ];
        for (source, job, stored, url, bucket, key) in cases {
            let (s, u, b, k) = bucket_prefix(source, job).unwrap();
            assert_eq!(
                (s.as_str(), u.as_str(), b, k.as_ref()),
                (stored, url, Bucket::S3(bucket.into()), key),
                "{source}"
            );
        }
    }

    #[test]
    fn an_s3_source_that_is_no_prefix_is_refused() {
        for source in [
            "s3://models/runs",
            "s3://models/runs/model-{path}",
            "s3://models/{path}/x/{path}",
            "s3://",
            "s3:///",
        ] {
            let error = bucket_prefix(source, "j").unwrap_err();
            assert!(
                error.contains("is not a prefix berth can list")
                    || error.contains("names no bucket"),
                "{source}: {error}"
            );
        }
        let error = bucket_prefix("s3://models/runs/?x=1#/", "j").unwrap_err();
        assert!(error.contains("no query or fragment"), "{error}");
    }

    #[tokio::test]
    async fn a_source_of_another_scheme_needs_its_files() {
        let sources = Sources::new(crate::trust::Trust::default()).unwrap();
        let cases = [
            (
                "https://files.local/{job_id}/{path}",
                "source \"https://files.local/{job_id}/{path}\": the files of a https: source \
                 must be given in the registration (berth lists files itself only at s3://, gs:// \
                 and az:// prefixes, oci:// references and mlflow:// model versions)",
            ),
            (
                "file:///srv/models/",
                "source \"file:///srv/models/\": the files of a file: source must be given in \
                 the registration (berth lists files itself only at s3://, gs:// and az:// \
                 prefixes, oci:// references and mlflow:// model versions)",
            ),
            (
                "models/{path}",
                "source \"models/{path}\" is not a URL: write s3://BUCKET/PREFIX/ (or gs://, or \
                 az://ACCOUNT/CONTAINER/PREFIX/) or oci://REGISTRY/REPOSITORY:TAG to have the \
                 files listed, or give the files in the registration",
            ),
        ];
        for (source, expected) in cases {
            assert_eq!(
                sources.discover(source, "j").await.unwrap_err(),
                expected,
                "{source}"
            );
        }
    }
}

//! What a target is, by its url's scheme, with the credentials of its
//! kind: object-store options (`s3`, `gs`, `az`), a registry login
//! (`oci`), headers (`http`, `https`), or nothing (`file`). Resolves a
//! `[[target]]`'s `options` and `headers` for its kind and names the
//! values that are secrets.

use std::collections::BTreeMap;

use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use reqwest::header::HeaderMap;
use toml::Spanned;

use super::call::Call;
use crate::cloud::{azure_option, gcs_option};
use crate::host_env::{expand, header_value, registry_login, s3_option};
use crate::oci::Login;
use crate::scrub::Secret;

/// How a target is written to, with the credentials of its kind.
pub enum Kind {
    /// An S3-compatible bucket: object_store settings applied on top of
    /// the environment's, as `[[source]]` options are.
    S3 {
        options: Vec<(AmazonS3ConfigKey, String)>,
    },
    /// A Google Cloud Storage bucket (`gs://BUCKET/PREFIX/`): object_store
    /// GCS settings on top of the environment's `GOOGLE_*`.
    Gcs {
        options: Vec<(GoogleConfigKey, String)>,
    },
    /// An Azure Blob container (`az://ACCOUNT/CONTAINER/PREFIX/`):
    /// object_store Azure settings on top of the environment's `AZURE_*`.
    Azure {
        account: String,
        container: String,
        options: Vec<(AzureConfigKey, String)>,
    },
    /// A mirror that takes `PUT`; the values are marked sensitive.
    /// `call`: the deployer's own requests under the url that carry the
    /// headers; none unless the operator says so.
    Http {
        headers: HeaderMap,
        call: Option<Call>,
    },
    /// An OCI registry (`oci://REGISTRY/NAMESPACE/`): keys are
    /// `REPO:TAG/PATH`, repositories under the namespace; the login, if
    /// any, from the options `username` and `password`.
    Oci {
        /// `host[:port]`, lowercased.
        registry: String,
        /// The repositories' common prefix, without `/` at either end;
        /// empty for the registry's top level.
        namespace: String,
        login: Option<Login>,
    },
    /// A folder on this server.
    File,
}

impl Kind {
    /// The kind a checked url names (`super::parse_url`: its scheme is
    /// one of the kinds', an `az://` url names a container), without
    /// credentials yet.
    pub(super) fn of(url: &url::Url) -> Self {
        match url.scheme() {
            "s3" => Kind::S3 {
                options: Vec::new(),
            },
            "gs" => Kind::Gcs {
                options: Vec::new(),
            },
            "az" => Kind::Azure {
                account: url.host_str().unwrap_or_default().to_string(),
                container: url
                    .path()
                    .trim_start_matches('/')
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                options: Vec::new(),
            },
            "oci" => Kind::Oci {
                registry: super::registry_of(url),
                namespace: url.path().trim_matches('/').to_string(),
                login: None,
            },
            "http" | "https" => Kind::Http {
                headers: HeaderMap::new(),
                call: None,
            },
            _ => Kind::File,
        }
    }

    /// Which table of the entry holds this kind's credentials.
    pub(super) fn table(&self) -> &'static str {
        match self {
            Kind::Http { .. } | Kind::File => "headers",
            _ => "options",
        }
    }

    /// Why a table the entry fills is not this kind's, if one is: whether
    /// it is `headers` (else `options`), and the words after the target.
    pub(super) fn refuses(
        &self,
        kind_name: &str,
        headers: bool,
        options: bool,
    ) -> Option<(bool, String)> {
        match self {
            Kind::Oci { .. } if headers => Some((
                true,
                "headers are for http and https targets; an oci target takes options username \
                 and password"
                    .into(),
            )),
            Kind::S3 { .. } | Kind::Gcs { .. } | Kind::Azure { .. } | Kind::File if headers => {
                Some((
                    true,
                    format!(
                        "headers are for http and https targets; a {kind_name} target takes none"
                    ),
                ))
            }
            Kind::Http { .. } | Kind::File if options => Some((
                false,
                format!(
                    "options are for s3, gs, az and oci targets; a {kind_name} target takes none"
                ),
            )),
            _ => None,
        }
    }

    /// Resolves the entry's credentials into this kind; each problem with
    /// the key it is about (`None`: the table as a whole).
    pub(super) fn resolve<'k>(
        &mut self,
        headers: &'k BTreeMap<Spanned<String>, String>,
        options: &'k BTreeMap<Spanned<String>, String>,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Vec<(Option<&'k Spanned<String>>, String)> {
        let mut problems = Vec::new();
        let mut each = |resolve: &mut dyn FnMut(&str, &str) -> Result<(), String>,
                        table: &'k BTreeMap<Spanned<String>, String>| {
            for (key, template) in table {
                if let Err(e) = resolve(key.get_ref(), template) {
                    problems.push((Some(key), e));
                }
            }
        };
        match self {
            Kind::Http { headers: into, .. } => each(
                &mut |header, template| {
                    let (name, value) = header_value(header, template, lookup)?;
                    into.append(name, value);
                    Ok(())
                },
                headers,
            ),
            Kind::S3 { options: into } => each(
                &mut |option, template| {
                    into.push(s3_option(option, template, "the target's url", lookup)?);
                    Ok(())
                },
                options,
            ),
            Kind::Gcs { options: into } => each(
                &mut |option, template| {
                    let value =
                        expand(template, lookup).map_err(|e| format!("options.{option}: {e}"))?;
                    into.push(gcs_option(option, value)?);
                    Ok(())
                },
                options,
            ),
            Kind::Azure { options: into, .. } => each(
                &mut |option, template| {
                    let value =
                        expand(template, lookup).map_err(|e| format!("options.{option}: {e}"))?;
                    into.push(azure_option(option, value)?);
                    Ok(())
                },
                options,
            ),
            Kind::Oci { login, .. } => {
                let options: BTreeMap<String, String> = options
                    .iter()
                    .map(|(k, v)| (k.get_ref().clone(), v.clone()))
                    .collect();
                match registry_login(&options, lookup) {
                    Ok(found) => *login = found,
                    Err(e) => problems.push((None, e)),
                }
            }
            Kind::File => {}
        }
        problems
    }

    /// Its credentials, each in the forms `crate::scrub` looks for.
    pub(super) fn secrets(&self) -> Vec<Secret<'_>> {
        match self {
            Kind::Http { headers, .. } => headers
                .values()
                .map(|v| Secret::Header(v.as_bytes()))
                .collect(),
            Kind::S3 { options } => options
                .iter()
                .filter(|(key, _)| {
                    matches!(
                        key,
                        AmazonS3ConfigKey::SecretAccessKey | AmazonS3ConfigKey::Token
                    )
                })
                .map(|(_, value)| Secret::Value(value))
                .collect(),
            Kind::Gcs { options } => options
                .iter()
                .filter(|(key, _)| *key == GoogleConfigKey::ServiceAccountKey)
                .flat_map(|(_, value)| service_account_secrets(value))
                .collect(),
            Kind::Azure { options, .. } => options
                .iter()
                .filter(|(key, _)| {
                    matches!(
                        key,
                        AzureConfigKey::AccessKey
                            | AzureConfigKey::SasKey
                            | AzureConfigKey::Token
                            | AzureConfigKey::ClientSecret
                    )
                })
                .flat_map(|(key, value)| match key {
                    AzureConfigKey::SasKey => sas_secrets(value),
                    _ => vec![Secret::Value(value)],
                })
                .collect(),
            Kind::Oci { login, .. } => login
                .iter()
                .map(|l| Secret::Login {
                    username: &l.username,
                    password: &l.password,
                })
                .collect(),
            Kind::File => Vec::new(),
        }
    }
}

/// A service-account key file's text and its private key, which is what
/// a message could quote of it.
fn service_account_secrets(json: &str) -> Vec<Secret<'_>> {
    let mut secrets = vec![Secret::Value(json)];
    // The PEM's base64 lines, each a secret: a quoted key is cut anywhere.
    let lines = json
        .split("\\n")
        .filter(|line| line.len() >= 32 && !line.contains("-----"));
    secrets.extend(lines.map(Secret::Value));
    secrets
}

/// A SAS token and its signature (`sig=`), which a URL in a message would
/// carry escaped or not.
fn sas_secrets(sas: &str) -> Vec<Secret<'_>> {
    let mut secrets = vec![Secret::Value(sas)];
    let signature = sas
        .trim_start_matches('?')
        .split('&')
        .find_map(|pair| pair.strip_prefix("sig="));
    secrets.extend(signature.map(Secret::Value));
    secrets
}

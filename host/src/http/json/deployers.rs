//! `/v1/deployers`' shapes: a deployer as it serves (with the targets it
//! is granted, names and URLs only), a refused plugin, the versions stored
//! over the API; a pull's and a rollback's bodies in.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::db::StoredVersion;
use crate::deployers::Source;
use crate::runtime::{self, Plugin, Rejection};
use crate::targets::Targets;

/// Which compiler made the code a deployer's new calls run: `baseline`
/// (Winch, for the seconds after the plugin arrived, while Cranelift
/// compiles it in the background) or `optimized` (Cranelift).
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Baseline,
    Optimized,
}

impl From<runtime::Tier> for Tier {
    fn from(tier: runtime::Tier) -> Self {
        match tier {
            runtime::Tier::Baseline => Tier::Baseline,
            runtime::Tier::Optimized => Tier::Optimized,
        }
    }
}

/// Where a deployer comes from: `folder` (the server's plugins folder,
/// which wins every conflict) or `api` (stored over the API, shared by the
/// servers on one database).
#[derive(Serialize, Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    Folder,
    Api,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Deployer {
    /// When the version it serves was pushed; null for a folder deployer.
    #[schema(format = DateTime, required = true)]
    pub added_at: Option<String>,
    /// The API token that pushed the version it serves; null for a folder
    /// deployer or without tokens.
    #[schema(required = true)]
    pub added_by: Option<String>,
    pub allowed_hosts: Vec<String>,
    pub description: String,
    /// The names of the environment variables its manifest grants.
    pub env: Vec<String>,
    pub memory_mib: u64,
    pub name: String,
    /// The JSON Schema its options are checked against (any JSON the
    /// deployer gave), or null.
    #[schema(value_type = Value, required = true)]
    pub options_schema: Option<Value>,
    pub origin: Origin,
    /// What a deployment's output directory may hold, in MiB.
    pub out_mib: u64,
    /// Of the `.wasm` file.
    pub sha256: String,
    /// The id of the trusted key (`--trusted-key`) whose signature over
    /// its bytes it loaded with, as minisign prints it; null when it loaded
    /// without a verified signature.
    #[schema(
        required = true,
        pattern = "^[0-9A-F]{16}$",
        example = "C3A9D84E0B7F1265"
    )]
    pub signed_by: Option<String>,
    /// The registry manifest the version it serves was pulled from, pinned
    /// by digest; null for an upload or a folder deployer.
    #[schema(
        required = true,
        example = "oci://registry.example.com/team/archive@sha256:…"
    )]
    pub source: Option<String>,
    /// The publishing targets its manifest grants, in its order.
    pub targets: Vec<GrantedTarget>,
    pub tier: Tier,
    pub timeout_s: u64,
    /// Which of its versions it serves (1 is the first pushed); null for
    /// a folder deployer.
    #[schema(required = true, minimum = 1)]
    pub version: Option<i64>,
    /// The `berth:deployer` version it was built for.
    pub wit_version: String,
}

/// A publishing target a deployer's manifest grants: its name and where
/// it publishes, never its credentials.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct GrantedTarget {
    pub name: String,
    /// Where its keys land (ends with `/`); null when this server does not
    /// configure a target of that name, so the grant cannot be used here.
    #[schema(required = true, example = "s3://team-releases/models/")]
    pub url: Option<String>,
}

impl Deployer {
    /// `p` as it serves from `source`, its granted targets looked up in
    /// this server's `targets`.
    pub fn new(p: &Plugin, source: &Source, targets: &Targets) -> Self {
        let stored = match source {
            Source::Folder => None,
            Source::Api(version) => Some(&**version),
        };
        Deployer {
            added_at: stored.map(|v| v.added_at.clone()),
            added_by: stored.and_then(|v| v.added_by.clone()),
            allowed_hosts: p
                .manifest
                .allowed_hosts
                .iter()
                .map(|h| h.to_string())
                .collect(),
            description: p.description.clone(),
            env: p
                .manifest
                .env
                .iter()
                .map(|(name, _)| name.clone())
                .collect(),
            memory_mib: p.limits.memory_mib,
            name: p.name.clone(),
            options_schema: p
                .options_schema
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok()),
            origin: match source {
                Source::Folder => Origin::Folder,
                Source::Api(_) => Origin::Api,
            },
            out_mib: p.limits.out_mib,
            sha256: p.sha256.clone(),
            signed_by: p.signed_by.clone(),
            source: stored.and_then(|v| v.source.clone()),
            targets: p
                .manifest
                .targets
                .iter()
                .map(|name| GrantedTarget {
                    name: name.clone(),
                    url: targets.get(name).map(|t| t.url().to_string()),
                })
                .collect(),
            tier: p.tier().into(),
            timeout_s: p.limits.timeout.as_secs(),
            version: stored.map(|v| v.number),
            wit_version: p.wit_version.clone(),
        }
    }
}

/// A file in the plugins folder that is not serving, and why.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Rejected {
    /// The plugin file in the folder, or `NAME.wasm` for a deployer stored
    /// over the API.
    pub file: String,
    pub origin: Origin,
    pub reason: String,
    /// Of the refused version stored over the API; null for a folder file.
    #[schema(required = true)]
    pub sha256: Option<String>,
}

impl Rejected {
    pub fn new(r: &Rejection, source: &Source) -> Self {
        let (origin, sha256) = match source {
            Source::Folder => (Origin::Folder, None),
            Source::Api(version) => (Origin::Api, Some(version.sha256.clone())),
        };
        Rejected {
            file: r.file.clone(),
            origin,
            reason: r.reason.clone(),
            sha256,
        }
    }
}

/// One version of a deployer stored over the API.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeployerVersion {
    #[schema(format = DateTime)]
    pub added_at: String,
    /// The API token that pushed it; null without tokens.
    #[schema(required = true)]
    pub added_by: Option<String>,
    /// Whether the deployer serves this version now.
    pub current: bool,
    /// What it grants beyond the version served when it was pushed, while
    /// it waits for an admin's approval; null once approved, or when it
    /// asked for nothing more.
    #[serde(default)]
    #[schema(required = true)]
    pub held: Option<Vec<String>>,
    /// Whether a manifest came with it.
    pub manifest: bool,
    /// 1 for the first version pushed, then 2, …
    #[schema(minimum = 1)]
    pub number: i64,
    pub sha256: String,
    /// Whether a detached signature came with it.
    pub signed: bool,
    /// Of the `.wasm`, in bytes.
    pub size: i64,
    /// The registry manifest it was pulled from, pinned by digest
    /// (`oci://REGISTRY/REPOSITORY@sha256:…`); null for an upload.
    #[schema(
        required = true,
        example = "oci://registry.example.com/team/archive@sha256:…"
    )]
    pub source: Option<String>,
}

/// A pushed version held for approval: what it adds.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct HeldVersion {
    /// Each grant it has beyond the version served.
    pub adds: Vec<String>,
    pub name: String,
    pub number: i64,
    pub sha256: String,
}

impl HeldVersion {
    pub fn new(v: &StoredVersion) -> Self {
        HeldVersion {
            adds: v.held.clone().unwrap_or_default(),
            name: v.name.clone(),
            number: v.number,
            sha256: v.sha256.clone(),
        }
    }
}

impl DeployerVersion {
    pub fn new(v: &StoredVersion, current: &StoredVersion) -> Self {
        DeployerVersion {
            added_at: v.added_at.clone(),
            added_by: v.added_by.clone(),
            current: v.id == current.id,
            held: v.held.clone(),
            manifest: v.manifest.is_some(),
            number: v.number,
            sha256: v.sha256.clone(),
            signed: v.signature.is_some(),
            size: v.size,
            source: v.source.clone(),
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeployerVersions {
    pub name: String,
    /// Oldest first.
    pub versions: Vec<DeployerVersion>,
}

/// `PUT /v1/deployers/{name}` with a JSON body: the component to pull
/// from a registry, and what goes with it.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullBody {
    /// The manifest's TOML text (what `NAME.toml` holds beside a folder
    /// plugin); absent: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// The component in a registry, in the wasm OCI artifact layout.
    #[schema(example = "oci://registry.example.com/team/archive:1.2.0")]
    pub oci: String,
    /// The detached signature's text over the component's bytes
    /// (minisign's format, what `berth plugin sign` writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// `POST /v1/deployers/{name}/rollback`: which version to serve again.
#[derive(Serialize, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    /// The version to serve (its sha256); absent: the one before the
    /// version served now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Deployers {
    pub deployers: Vec<Deployer>,
    /// Plugin files still compiling after a start: deployers soon.
    pub loading: Vec<String>,
    pub rejected: Vec<Rejected>,
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::*;

    #[test]
    fn deployers_keep_their_bytes() {
        let sha256 = || "ef".repeat(32);
        check(
            Deployers {
                deployers: vec![Deployer {
                    added_at: Some("2026-12-01T10:00:00.000Z".into()),
                    added_by: Some("ci".into()),
                    allowed_hosts: vec!["api.example.com".into()],
                    description: "Packs the files".into(),
                    env: vec!["TOKEN".into()],
                    memory_mib: 64,
                    name: "archive".into(),
                    options_schema: Some(serde_json::json!({"type": "object"})),
                    origin: Origin::Api,
                    out_mib: 1024,
                    sha256: sha256(),
                    signed_by: None,
                    source: Some(format!("oci://r.example/team/archive@sha256:{}", sha256())),
                    targets: vec![
                        GrantedTarget {
                            name: "releases".into(),
                            url: Some("s3://team-releases/models/".into()),
                        },
                        GrantedTarget {
                            name: "elsewhere".into(),
                            url: None,
                        },
                    ],
                    tier: Tier::Optimized,
                    timeout_s: 600,
                    version: Some(2),
                    wit_version: "0.1.0".into(),
                }],
                loading: vec!["slow.wasm".into()],
                rejected: vec![Rejected {
                    file: "broken.wasm".into(),
                    origin: Origin::Folder,
                    reason: "not a component".into(),
                    sha256: None,
                }],
            },
            r#"{"deployers":[{"added_at":"2026-12-01T10:00:00.000Z","added_by":"ci","allowed_hosts":["api.example.com"],"description":"Packs the files","env":["TOKEN"],"memory_mib":64,"name":"archive","options_schema":{"type":"object"},"origin":"api","out_mib":1024,"sha256":"efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef","signed_by":null,"source":"oci://r.example/team/archive@sha256:efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef","targets":[{"name":"releases","url":"s3://team-releases/models/"},{"name":"elsewhere","url":null}],"tier":"optimized","timeout_s":600,"version":2,"wit_version":"0.1.0"}],"loading":["slow.wasm"],"rejected":[{"file":"broken.wasm","origin":"folder","reason":"not a component","sha256":null}]}"#,
        );
        check(
            DeployerVersions {
                name: "archive".into(),
                versions: vec![DeployerVersion {
                    added_at: "2026-12-01T10:00:00.000Z".into(),
                    added_by: None,
                    current: true,
                    held: None,
                    manifest: false,
                    number: 1,
                    sha256: sha256(),
                    signed: true,
                    size: 1000,
                    source: None,
                }],
            },
            r#"{"name":"archive","versions":[{"added_at":"2026-12-01T10:00:00.000Z","added_by":null,"current":true,"held":null,"manifest":false,"number":1,"sha256":"efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef","signed":true,"size":1000,"source":null}]}"#,
        );
        check(
            PullBody {
                manifest: None,
                oci: "oci://r.example/team/archive:1.2.0".into(),
                signature: Some("untrusted comment: …".into()),
            },
            r#"{"oci":"oci://r.example/team/archive:1.2.0","signature":"untrusted comment: …"}"#,
        );
    }
}

//! `/v1/models`' shapes: a registration in; a model with its files out,
//! and a refused registration's problems, each with its field.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::object;
use crate::model::{self, TrainedModel};
use crate::validate::{self, Problems};

// Every field is optional here so that a missing one is reported by
// validation with the others, not by serde alone; the schemas say which
// ones a registration needs.

/// A trained model to register: what it is, where its files live, and
/// each file's size and (optionally) sha256. Also what `berth models
/// register` sends: a field it has no value for is left out.
#[derive(Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Registration)]
pub struct RegisterBody {
    #[schema(value_type = String, required = true, min_length = 1, max_length = 1024, example = "support-bot-lora")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Names the model's directory: letters, digits, `_`, `-`, `.`,
    /// starting with a letter or digit. Registered once.
    #[schema(value_type = String, required = true, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", example = "ft-2026-11-29-a")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[schema(max_length = 1024)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
    #[schema(max_length = 1024)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_size: Option<String>,
    #[schema(max_length = 1024)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_examples: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_train_steps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_loss: Option<f64>,
    /// Training parameters, kept as given.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
    /// An `http`, `https`, `s3` or `file` URL template: `{path}` is
    /// replaced by each file's path, `{job_id}` by the job id. Without
    /// `files`, an `s3://BUCKET/PREFIX/` prefix (`{job_id}` allowed in
    /// it), recorded as `s3://BUCKET/PREFIX/{path}`; or a version of an
    /// MLflow registry, `mlflow://SERVER/NAME/VERSION` or
    /// `mlflow://SERVER/NAME@ALIAS` (`mlflow+http://` for plain HTTP), its
    /// alias pinned and its files listed through the tracking server,
    /// recorded as the artifact proxy's URL template.
    #[schema(value_type = String, required = true, pattern = r"\{path\}|/$", example = "http://files.internal/{job_id}/{path}")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Left out, the server lists them itself where the source can list
    /// them (`s3://` prefixes: every object under the prefix, at most
    /// 10000, folder markers skipped; each one's size, and its sha256 only
    /// where the store keeps one, `x-amz-checksum-sha256`); given (even
    /// empty), they are the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<FileBody>>,
    /// Given `files` are looked for at the source before the model is
    /// stored (each file's size, from one byte of it): `false` stores it
    /// unchecked, for files that are not there yet. Default `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_source: Option<bool>,
    /// The model's OpenSSF signature: the contents of the `model.sig`
    /// that `model_signing sign` wrote (a Sigstore bundle, as JSON or as a
    /// string of it). Verified against the files registered and the
    /// server's `--model-signer`s; the outcome is the model's `signature`.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<Value>,
}

#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RegistrationFile)]
pub struct FileBody {
    /// Relative and `/`-separated; no `..`, no empty segments.
    #[schema(value_type = String, required = true, min_length = 1, max_length = 1024, example = "adapter_config.json")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[schema(value_type = u64, required = true, example = 412)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[schema(pattern = "^[0-9a-fA-F]{64}$")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Model {
    /// null when the registration did not say (as for every training
    /// value here: unknown is null, never 0 or "").
    #[schema(required = true)]
    pub base_model: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The name of the API token that registered it; null without tokens.
    #[schema(required = true)]
    pub created_by: Option<String>,
    #[schema(required = true)]
    pub dataset: Option<String>,
    pub files: Vec<ModelFile>,
    #[schema(required = true)]
    pub final_loss: Option<f64>,
    pub id: i64,
    pub job_id: String,
    #[schema(required = true)]
    pub model_size: Option<String>,
    pub name: String,
    #[schema(required = true)]
    pub num_examples: Option<u64>,
    #[schema(required = true)]
    pub num_train_steps: Option<u64>,
    #[schema(value_type = Object)]
    pub params: Value,
    /// The signature given with the registration and what verifying it
    /// said; null when none was given (or the server ignores signatures).
    #[schema(required = true)]
    pub signature: Option<Signature>,
    pub source: String,
}

/// A model's signature, as verified at its registration.
#[derive(Serialize, Deserialize, ToSchema)]
#[schema(as = ModelSignature)]
pub struct Signature {
    /// Whether a trusted signer's signature covers exactly the model's
    /// files.
    pub verified: bool,
    /// `bare public key` or `certificate chain`; null unless verified.
    #[schema(required = true)]
    pub method: Option<String>,
    /// `key sha256:HEX` (the sha256 of the public key's PEM), or the
    /// certificate's subject, names and issuer; null unless verified.
    #[schema(required = true, example = "key sha256:5f0c…")]
    pub signer: Option<String>,
    #[schema(required = true, format = DateTime)]
    pub verified_at: Option<String>,
    /// Why the signature does not vouch for the model; null if it does.
    #[schema(required = true)]
    pub error: Option<String>,
}

impl From<TrainedModel> for Model {
    fn from(m: TrainedModel) -> Self {
        Model {
            base_model: m.base_model,
            created_at: m.created_at,
            created_by: m.created_by,
            dataset: m.dataset,
            files: m.files.into_iter().map(ModelFile::from).collect(),
            final_loss: m.final_loss,
            id: m.id,
            job_id: m.job_id,
            model_size: m.model_size,
            name: m.name,
            num_examples: m.num_examples,
            num_train_steps: m.num_train_steps,
            params: object(&m.params_json),
            signature: m.signature.map(|s| Signature {
                verified: s.verified_at.is_some(),
                method: s.method,
                signer: s.signer,
                verified_at: s.verified_at,
                error: s.error,
            }),
            source: m.source,
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct ModelFile {
    /// What its bytes are, told from them (never from its name) by the
    /// first fetch that verified them; null until then. One of
    /// `safetensors`, `pickle`, `zip-pickle` (as `torch.save` writes),
    /// `gguf`, `json`, `other`; a client should take a value it does not
    /// know as `other`. `pickle` and `zip-pickle` run code when loaded.
    #[schema(required = true, value_type = Option<String>, example = "safetensors")]
    #[serde(default)]
    pub format: Option<String>,
    pub path: String,
    /// Lowercase hex; null when the registration gave only the size.
    #[schema(required = true)]
    pub sha256: Option<String>,
    pub size_bytes: u64,
}

impl From<model::ModelFile> for ModelFile {
    fn from(f: model::ModelFile) -> Self {
        ModelFile {
            format: f.format.map(|format| format.as_str().to_string()),
            path: f.path,
            sha256: f.sha256,
            size_bytes: f.size_bytes,
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Models {
    pub models: Vec<Model>,
}

impl From<Vec<TrainedModel>> for Models {
    fn from(models: Vec<TrainedModel>) -> Self {
        Models {
            models: models.into_iter().map(Model::from).collect(),
        }
    }
}

/// A registration's refusal: the sentence, and every problem on its own
/// with the field it is about, for a form to show beside that field.
#[derive(Serialize, Deserialize, ToSchema)]
#[schema(as = RegistrationError)]
pub struct ProblemsBody {
    /// `invalid model: ` and every problem's message, `; `-separated.
    pub error: String,
    /// Absent when the body is not a registration at all (not JSON, an
    /// unknown field, a field of the wrong type): then `error` says why.
    #[serde(default)]
    pub problems: Vec<Problem>,
}

/// One problem of a registration.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// As the registration names it: `name`, `files[2].path`; `files` for
    /// a conflict between two files.
    #[schema(example = "files[0].path")]
    pub field: String,
    /// A sentence that starts with the field.
    #[schema(example = "files[0].path \"/etc/passwd\": must be relative, not absolute")]
    pub message: String,
}

/// The sentence a registration's problems make.
pub fn invalid_model(problems: &Problems) -> String {
    format!("invalid model: {problems}")
}

impl From<Problems> for ProblemsBody {
    fn from(problems: Problems) -> Self {
        ProblemsBody {
            error: invalid_model(&problems),
            problems: problems.0.into_iter().map(Problem::from).collect(),
        }
    }
}

impl From<validate::Problem> for Problem {
    fn from(p: validate::Problem) -> Self {
        Problem {
            field: p.field,
            message: p.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::*;

    #[test]
    fn models_keep_their_bytes() {
        let mut model = TrainedModel::from_files(
            "ft-1",
            "http://files.local/{job_id}/{path}".into(),
            vec![
                model::ModelFile {
                    path: "a.bin".into(),
                    size_bytes: 10,
                    sha256: Some("ab".repeat(32)),
                    format: None,
                },
                model::ModelFile {
                    path: "b/c.json".into(),
                    size_bytes: 2,
                    sha256: None,
                    format: Some(model::Format::Json),
                },
            ],
        );
        model.final_loss = Some(0.5);
        model.params_json = r#"{"rank":8}"#.into();
        model.created_at = "2026-12-01T10:00:00.000Z".into();
        check(
            Model::from(model),
            r#"{"base_model":null,"created_at":"2026-12-01T10:00:00.000Z","created_by":null,"dataset":null,"files":[{"format":null,"path":"a.bin","sha256":"abababababababababababababababababababababababababababababababab","size_bytes":10},{"format":"json","path":"b/c.json","sha256":null,"size_bytes":2}],"final_loss":0.5,"id":1,"job_id":"ft-1","model_size":null,"name":"ft-1","num_examples":null,"num_train_steps":null,"params":{"rank":8},"signature":null,"source":"http://files.local/{job_id}/{path}"}"#,
        );
    }

    #[test]
    fn problems_keep_their_fields() {
        let problems = Problems(vec![
            validate::Problem {
                field: "name".into(),
                message: "name is required".into(),
            },
            validate::Problem {
                field: "files[0].path".into(),
                message: "files[0].path \"..\": must not contain ..".into(),
            },
        ]);
        check(
            ProblemsBody::from(problems),
            r#"{"error":"invalid model: name is required; files[0].path \"..\": must not contain ..","problems":[{"field":"name","message":"name is required"},{"field":"files[0].path","message":"files[0].path \"..\": must not contain .."}]}"#,
        );
    }
}

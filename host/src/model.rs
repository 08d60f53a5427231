//! The domain's nouns — a trained model and its files, deployments — as
//! every layer sees them. No I/O; `http/json/` owns the wire's JSON
//! shapes. `Phase` and `Progress` derive serde only as the database's
//! storage format for progress.

/// One file of a trained model, as recorded at registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFile {
    /// Relative, `/`-separated, checked by `validate` (never absolute, no `..`).
    pub path: String,
    pub size_bytes: u64,
    /// Lowercase hex; `None` when the registration recorded only the size.
    pub sha256: Option<String>,
    /// What its bytes are, sniffed by the first fetch that verified them;
    /// `None` until then (registration reads no byte).
    pub format: Option<Format>,
}

/// What a file's bytes are, by their first bytes, never by its name
/// (`crate::formats` sniffs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    Safetensors,
    /// A bare pickle stream, protocol 2 or later (`\x80\x02`..`\x80\x05`):
    /// loading it runs whatever code it names.
    Pickle,
    /// A zip holding a `*/data.pkl`, as `torch.save` writes: a pickle too.
    ZipPickle,
    Gguf,
    Json,
    Other,
}

impl Format {
    pub const ALL: [Format; 6] = [
        Format::Safetensors,
        Format::Pickle,
        Format::ZipPickle,
        Format::Gguf,
        Format::Json,
        Format::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Pickle => "pickle",
            Format::ZipPickle => "zip-pickle",
            Format::Gguf => "gguf",
            Format::Json => "json",
            Format::Other => "other",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == text)
    }

    /// Loading it unpickles: it can run code of its author's choosing.
    pub fn is_pickle(self) -> bool {
        matches!(self, Format::Pickle | Format::ZipPickle)
    }
}

/// A trained model as recorded in the database.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedModel {
    pub id: i64,
    pub name: String,
    pub job_id: String,
    // The training values are `None` when nobody said: unknown, never a
    // made-up 0 or "".
    pub base_model: Option<String>,
    pub model_size: Option<String>,
    pub dataset: Option<String>,
    pub num_examples: Option<u64>,
    pub num_train_steps: Option<u64>,
    pub final_loss: Option<f64>,
    /// A JSON object, kept as text: berth never looks inside.
    pub params_json: String,
    /// URL template with `{job_id}` and `{path}`, a registry's manifest,
    /// or `UPLOADED`.
    pub source: String,
    pub files: Vec<ModelFile>,
    /// RFC 3339, set by the database layer when the model is recorded.
    pub created_at: String,
    /// The name of the API token that registered it (none without tokens).
    pub created_by: Option<String>,
    /// The `model.sig` given with the registration and what its
    /// verification said; none when none was given (or signatures are off).
    pub signature: Option<Signature>,
}

/// A model's OMS signature as recorded: who signed it once verified, or
/// why it does not vouch for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// `bare public key` or `certificate chain`, once verified.
    pub method: Option<String>,
    /// `key sha256:HEX`, or the certificate's subject, names and issuer.
    pub signer: Option<String>,
    /// RFC 3339, when it was verified; none when it was not.
    pub verified_at: Option<String>,
    /// Why it does not vouch for the model's files.
    pub error: Option<String>,
    /// The `model.sig` as given (a Sigstore bundle, JSON).
    pub bundle: String,
}

/// The source of a model whose files came by upload (`berth models push`):
/// there is nowhere to fetch them again from, so they are linked from the
/// blob store, where they are pinned, or not at all.
pub const UPLOADED: &str = "upload:";

impl TrainedModel {
    /// The signer of its signature, if it was verified.
    pub fn signed_by(&self) -> Option<&str> {
        self.signature
            .as_ref()
            .filter(|s| s.verified_at.is_some())
            .and_then(|s| s.signer.as_deref())
    }

    /// Whether the files came by upload (`UPLOADED`).
    pub fn uploaded(&self) -> bool {
        self.source == UPLOADED
    }

    /// A model known only by its files, with no training metadata: what
    /// `berth plugin run` hands a deployer, and what tests and benchmarks use.
    pub fn from_files(job_id: &str, source: String, files: Vec<ModelFile>) -> Self {
        Self {
            id: 1,
            name: job_id.to_string(),
            job_id: job_id.to_string(),
            base_model: None,
            model_size: None,
            dataset: None,
            num_examples: None,
            num_train_steps: None,
            final_loss: None,
            params_json: "{}".to_string(),
            source,
            files,
            created_at: String::new(),
            created_by: None,
            signature: None,
        }
    }
}

/// Where a deployment stands: `AwaitingApproval` → `Queued` → `Running`
/// → `Completed` | `Failed`, never back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Recorded by a rule whose step needs an admin's approval: nothing
    /// runs it until it is approved (then queued), rejected or expired
    /// (then failed).
    AwaitingApproval,
    /// Recorded, waiting for a server with room to claim it.
    Queued,
    Running,
    Completed,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::AwaitingApproval => "awaiting_approval",
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }

    /// Completed or failed: the row will not change again.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Completed | Status::Failed)
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "awaiting_approval" => Some(Status::AwaitingApproval),
            "queued" => Some(Status::Queued),
            "running" => Some(Status::Running),
            "completed" => Some(Status::Completed),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }
}

/// One deployment of a model by a deployer, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub id: i64,
    pub model_id: i64,
    pub deployer: String,
    /// The request's options object, as JSON text.
    pub options_json: String,
    pub status: Status,
    /// While running: what it is doing.
    pub phase: Option<Phase>,
    pub progress: Progress,
    /// Host directory of the model's verified files.
    pub dir: String,
    /// Host directory the deployer wrote into.
    pub out_dir: String,
    pub reference: Option<String>,
    /// A JSON object, as text (`{}` until completed).
    pub details_json: String,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub created_at: String,
    pub completed_at: Option<String>,
    /// The name of the API token that asked for it (none without tokens).
    pub created_by: Option<String>,
    /// The sha256 of the deployer's `.wasm` it runs: the version asked for.
    pub plugin_sha256: Option<String>,
    /// The id of the server that runs (or ran) it; none while queued.
    pub server: Option<String>,
    /// When a server claimed it.
    pub started_at: Option<String>,
    /// What it put into publishing targets, in order.
    pub published: Vec<Receipt>,
    /// The rule that asked for it, if one did (`created_by` is then
    /// `rule:NAME`).
    pub cause: Option<Cause>,
    /// An admin's decision on a step that needed one.
    pub approval: Option<Approval>,
}

/// Why a rule recorded a deployment: the rule, and the stored event that
/// fired it (a model's registration, or the completion of the deployment
/// `previous`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub rule: String,
    pub event_id: i64,
    pub previous: Option<i64>,
}

/// What an admin decided about a deployment awaiting approval. Stored as
/// JSON in the deployment's row (serde is that storage format).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Approval {
    pub decision: Decision,
    /// The name of the admin's token (none on a server without tokens).
    pub by: Option<String>,
    /// RFC 3339, when it was decided.
    pub at: String,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approved,
    Rejected,
}

/// What one put into a publishing target left there, as the deployment
/// records it. Stored as JSON in the deployment's row (serde is that
/// storage format).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The target's name.
    pub target: String,
    pub key: String,
    /// Where it is, for people: the target's url joined with the key.
    pub url: String,
    pub bytes: u64,
    /// Lowercase hex, of the bytes read and sent (verified against the
    /// expected one when one was given).
    pub sha256: String,
    /// As the destination said it, quotes and all; a folder has none.
    pub etag: Option<String>,
}

/// One request of a deployer's own under a target, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnCall {
    pub target: String,
    pub method: String,
    /// Scheme, host, port and path: a query may hold a secret.
    pub url: String,
    /// The answer's status, if one came.
    pub status: Option<u16>,
    /// Body bytes sent and received.
    pub sent: u64,
    pub received: u64,
    /// Why it stopped short, if it did.
    pub stopped: Option<String>,
}

impl std::fmt::Display for OwnCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "request {} {} (target {:?}): ",
            self.method, self.url, self.target
        )?;
        match self.status {
            Some(status) => write!(f, "answered {status}")?,
            None => f.write_str("no answer")?,
        }
        write!(
            f,
            ", {} sent, {} received",
            crate::human::size(self.sent),
            crate::human::size(self.received)
        )?;
        if let Some(why) = &self.stopped {
            write!(f, "; stopped: {why}")?;
        }
        Ok(())
    }
}

/// What a deployment put into publishing targets, in all: its puts and
/// their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    pub files: usize,
    pub bytes: u64,
}

impl Published {
    pub fn of(receipts: &[Receipt]) -> Self {
        Self {
            files: receipts.len(),
            bytes: receipts.iter().map(|r| r.bytes).sum(),
        }
    }
}

/// How a deployment ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed {
        reference: String,
        details_json: String,
    },
    Failed {
        error: String,
    },
}

/// What a running deployment is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Fetching,
    Deploying,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Fetching => "fetching",
            Phase::Deploying => "deploying",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fetching" => Some(Phase::Fetching),
            "deploying" => Some(Phase::Deploying),
            _ => None,
        }
    }
}

/// How far a deployment has come. Stored as JSON in the deployment's row
/// (serde here is that storage format, kept flat and additive).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: usize,
    pub files_total: usize,
    /// The deployer's own `progress` calls: units are its choice.
    pub deployer_done: u64,
    pub deployer_total: u64,
    pub deployer_note: String,
    /// Put into publishing targets so far (`published` lists each put).
    pub published_bytes: u64,
    pub published_files: usize,
    /// The deployer's own requests under targets so far, and their body
    /// bytes each way (the deployment's log has a line for each).
    pub calls: u64,
    pub calls_sent_bytes: u64,
    pub calls_received_bytes: u64,
}

//! The API's JSON shapes both ways — request bodies and query parameters
//! in; models, deployments, deployers, events, the webhook's state,
//! artifacts, uploaded blobs, storage and errors out — with their OpenAPI schemas, one file per
//! resource. The one set of wire types: the handlers answer with them, the
//! CLI client (`cli/client`) reads the answers back into them, so a renamed
//! field breaks both at compile time. Handlers convert to domain types by
//! hand; nothing here does I/O or knows a status code.
//!
//! Answers serialize with their fields in alphabetical order: the order
//! they had when they were built as `serde_json` maps, kept so their bytes
//! stay the same (each file's tests pin them). Answers read back ignore
//! fields they do not know, so a client reads a newer server's answers.

mod artifacts;
mod blobs;
mod deployers;
mod deployments;
mod events;
mod models;
mod rules;
mod storage;
mod webhook;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

pub use artifacts::{Artifact, Artifacts};
pub use blobs::Blob;
pub use deployers::{
    Deployer, DeployerVersion, DeployerVersions, Deployers, GrantedTarget, HeldVersion, Origin,
    PullBody, Rejected, RollbackBody, Tier,
};
pub use deployments::{
    Approval, CallsProgress, Cause, Decision, DecisionBody, DeployBody, DeployParams,
    DeployerProgress, Deployment, Deployments, ListParams, PUBLISHED_SHOWN, Phase, Progress,
    Published, PublishedPage, PublishedParams, PublishedProgress, Status,
};
pub use events::{
    DeploymentApproved, DeploymentAwaitingApproval, DeploymentCompleted, DeploymentFailed,
    DeploymentProgress, DeploymentStarted, EventData, EventsParams, ModelRegistered, PluginNamed,
    PluginRejected, RuleFailed, event,
};
pub use models::{
    FileBody, Model, ModelFile, Models, Problem, ProblemsBody, RegisterBody, Signature,
    invalid_model,
};
pub use rules::{Rule, RuleBody, RuleFiring, Rules};
pub use storage::{ModelStorage, Storage};
pub use webhook::{MlflowDelivery, WebhookFailing, WebhookState, webhook_body};

/// Every refusal: a sentence saying what is wrong and what to do.
#[derive(Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    pub error: String,
}

/// Stored JSON text (always an object when berth wrote it) back as JSON.
fn object(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| json!({}))
}

/// That `answer` serializes to exactly `expected`, and that `expected`
/// reads back into `T` and serializes the same: what the server sends, a
/// client reads, field for field.
#[cfg(test)]
#[track_caller]
fn check<T: Serialize + serde::de::DeserializeOwned>(answer: T, expected: &str) {
    assert_eq!(serde_json::to_string(&answer).unwrap(), expected);
    let read: T = serde_json::from_str(expected).expect("the answer reads back");
    assert_eq!(serde_json::to_string(&read).unwrap(), expected, "read back");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_bytes() {
        check(
            ErrorBody {
                error: "model 9 does not exist".into(),
            },
            r#"{"error":"model 9 does not exist"}"#,
        );
    }
}

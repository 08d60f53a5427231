//! Rules' shapes: a rule in (its written form, `rules::Spec`, the rules
//! file's `[[rule]]` as JSON) and out, with where it comes from and its
//! last firings; and what `/v1/rules` lists.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::db::FiringRow;
use crate::rules::set::Listed;

/// A rule as `POST /v1/rules` and `PUT /v1/rules/{name}` take it; a
/// field it does not know is refused, naming it, as the rules file does
/// (a misspelt `require_approval` must not store a rule without one).
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RuleRequest, example = json!({
    "name": "check",
    "when": {"event": "model.registered"},
    "match": {"base_model": "meta-llama/*", "final_loss": {"max": 0.5}},
    "deploy": {"deployer": "safetensors-check", "options": {}},
    "require_approval": false
}))]
pub struct RuleBody {
    /// Lowercase letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// `{"event": "model.registered"}` or `{"event": "deployment.completed", "deployer": NAME}`
    /// (`model_registered` and `deployment_completed` are taken too).
    #[schema(value_type = Object)]
    pub when: Value,
    /// Globs on the model's `name`, `job_id`, `base_model`, `dataset`;
    /// `params` values; `final_loss` `{min, max}`; the previous deployment's
    /// `details` values.
    #[serde(default, rename = "match")]
    #[schema(value_type = Option<Object>)]
    pub matches: Option<Value>,
    /// `{"deployer": NAME, "options": {…}}`; option strings may hold
    /// `${model.job_id}`, `${previous.ref}`, `${previous.details.KEY}`, …
    #[schema(value_type = Object)]
    pub deploy: Value,
    #[serde(default)]
    pub require_approval: bool,
    #[serde(default)]
    pub disabled: bool,
}

/// A rule, where it comes from and what it did last.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Rule {
    /// Who stored it; null for a declared one.
    #[schema(required = true)]
    pub created_by: Option<String>,
    #[schema(value_type = Object)]
    pub deploy: Value,
    pub disabled: bool,
    /// Its last firings, newest first (at most 10).
    pub firings: Vec<RuleFiring>,
    #[serde(rename = "match")]
    #[schema(value_type = Object)]
    pub matches: Value,
    pub name: String,
    /// `file`: declared in the server's rules file (wins over the API);
    /// `api`: stored over the API, shared by every server.
    pub origin: String,
    pub require_approval: bool,
    #[schema(format = DateTime, required = true)]
    pub updated_at: Option<String>,
    #[schema(value_type = Object)]
    pub when: Value,
}

impl Rule {
    pub fn new(listed: Listed, firings: Vec<FiringRow>) -> Self {
        let spec = serde_json::to_value(&listed.spec).unwrap_or_default();
        Rule {
            created_by: listed.created_by,
            deploy: spec["deploy"].clone(),
            disabled: listed.spec.disabled,
            firings: firings.into_iter().map(RuleFiring::from).collect(),
            matches: spec
                .get("match")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({})),
            name: listed.spec.name,
            origin: if listed.declared { "file" } else { "api" }.into(),
            require_approval: listed.spec.require_approval,
            updated_at: listed.updated_at,
            when: spec["when"].clone(),
        }
    }
}

/// One firing: the event and the deployment it recorded, or why none.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct RuleFiring {
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(required = true)]
    pub deployment_id: Option<i64>,
    #[schema(required = true)]
    pub error: Option<String>,
    pub event_id: i64,
    pub model_id: i64,
}

impl From<FiringRow> for RuleFiring {
    fn from(f: FiringRow) -> Self {
        RuleFiring {
            created_at: f.created_at,
            deployment_id: f.deployment_id,
            error: f.error,
            event_id: f.event_id,
            model_id: f.model_id,
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Rules {
    pub rules: Vec<Rule>,
}

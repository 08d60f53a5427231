//! The deployer's options: one table of `Spec`s gives both the JSON Schema
//! that `describe` publishes and the checks `check_options` and `deploy` run,
//! so the two never disagree. Errors are sentences for the person deploying.

use serde_json::{Map, Value, json};

/// The JSON type of an option, and its bounds.
pub enum Kind {
    String,
    Boolean,
    Integer {
        minimum: Option<i64>,
        maximum: Option<i64>,
    },
}

/// One option.
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    pub description: &'static str,
}

/// The JSON Schema of the options object: these properties and no others.
pub fn schema(specs: &[Spec]) -> String {
    let properties: Map<String, Value> = specs
        .iter()
        .map(|spec| {
            let mut property = match spec.kind {
                Kind::String => json!({ "type": "string" }),
                Kind::Boolean => json!({ "type": "boolean" }),
                Kind::Integer { minimum, maximum } => {
                    let mut integer = json!({ "type": "integer" });
                    if let Some(minimum) = minimum {
                        integer["minimum"] = minimum.into();
                    }
                    if let Some(maximum) = maximum {
                        integer["maximum"] = maximum.into();
                    }
                    integer
                }
            };
            property["description"] = spec.description.into();
            (spec.name.to_string(), property)
        })
        .collect();
    json!({ "type": "object", "properties": properties, "additionalProperties": false })
        .to_string()
}

/// The options object, once every key is known and every value has its
/// spec's type and bounds; absent options are absent.
pub fn parse(deployer: &str, specs: &[Spec], options_json: &str) -> Result<Map<String, Value>, String> {
    let options: Value = serde_json::from_str(options_json)
        .map_err(|e| format!("options are not valid JSON: {e}"))?;
    let Value::Object(options) = options else {
        return Err("options must be a JSON object".to_string());
    };
    let mut unknown: Vec<&String> = options
        .keys()
        .filter(|key| !specs.iter().any(|spec| spec.name == key.as_str()))
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        let names: Vec<String> = unknown.iter().map(|key| quoted(key)).collect();
        let known: Vec<String> = specs.iter().map(|spec| quoted(spec.name)).collect();
        return Err(format!(
            "unknown option{} {}: the {deployer} deployer accepts only {}",
            if names.len() > 1 { "s" } else { "" },
            names.join(", "),
            known.join(", ")
        ));
    }
    for spec in specs {
        if let Some(value) = options.get(spec.name) {
            check(spec, value)?;
        }
    }
    Ok(options)
}

fn check(spec: &Spec, value: &Value) -> Result<(), String> {
    let (fits, expected) = match spec.kind {
        Kind::String => (value.is_string(), "a string".to_string()),
        Kind::Boolean => (value.is_boolean(), "true or false".to_string()),
        Kind::Integer { minimum, maximum } => {
            let fits = value.as_i64().is_some_and(|n| {
                minimum.is_none_or(|minimum| n >= minimum) && maximum.is_none_or(|maximum| n <= maximum)
            });
            let expected = match (minimum, maximum) {
                (Some(minimum), Some(maximum)) => format!("an integer from {minimum} to {maximum}"),
                (Some(minimum), None) => format!("an integer of at least {minimum}"),
                (None, Some(maximum)) => format!("an integer of at most {maximum}"),
                (None, None) => "an integer".to_string(),
            };
            (fits, expected)
        }
    };
    if fits {
        Ok(())
    } else {
        Err(format!("option {} must be {expected}, not {value}", quoted(spec.name)))
    }
}

fn quoted(name: &str) -> String {
    Value::from(name).to_string()
}

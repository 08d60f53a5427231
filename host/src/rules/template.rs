//! `${…}` in a rule's options: the model's fields and the previous
//! deployment's result, filled in when the rule fires. A value that is not
//! there fails the firing with a sentence; it never becomes an empty
//! string. Pure.

use serde_json::{Map, Value};

use crate::model::{Deployment, TrainedModel};

/// The names a `${…}` may use, for the sentences.
const KNOWN: &str = "model.id, model.name, model.job_id, model.base_model, model.model_size, \
                     model.dataset, model.final_loss, model.params.KEY, previous.id, previous.ref, \
                     previous.deployer, previous.details.KEY";

/// What is wrong with the `${…}` of `options`, one sentence each;
/// `registered`: the rule fires on a registration, with no previous
/// deployment.
pub fn problems(options: &Map<String, Value>, registered: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for_each_string(options, &mut |text| match references(text) {
        Err(e) => problems.push(e),
        Ok(names) => {
            for name in names {
                if !known(&name) {
                    problems.push(format!(
                        "${{{name}}} is not a value rules know: use one of {KNOWN}"
                    ));
                } else if registered && name.starts_with("previous.") {
                    problems.push(format!(
                        "${{{name}}}: a rule fired by model.registered has no previous deployment; only deployment.completed rules may use previous.*"
                    ));
                }
            }
        }
    });
    problems
}

/// Whether `options` hold any `${…}`.
pub fn has_references(options: &Map<String, Value>) -> bool {
    let mut any = false;
    for_each_string(options, &mut |text| any |= text.contains("${"));
    any
}

/// `options` with every `${…}` filled from `model` and `previous`.
pub fn expand(
    options: &Map<String, Value>,
    model: &TrainedModel,
    previous: Option<&Deployment>,
) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for (key, value) in options {
        out.insert(key.clone(), expand_value(value, model, previous)?);
    }
    Ok(out)
}

fn expand_value(
    value: &Value,
    model: &TrainedModel,
    previous: Option<&Deployment>,
) -> Result<Value, String> {
    Ok(match value {
        Value::String(text) => Value::String(fill(text, model, previous)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| expand_value(v, model, previous))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(expand(map, model, previous)?),
        other => other.clone(),
    })
}

fn fill(text: &str, model: &TrainedModel, previous: Option<&Deployment>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{text:?} opens a ${{ it never closes"))?;
        out.push_str(&lookup(&after[..end], model, previous)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of `${name}`, as text.
fn lookup(
    name: &str,
    model: &TrainedModel,
    previous: Option<&Deployment>,
) -> Result<String, String> {
    let missing = |why: String| format!("${{{name}}} has no value: {why}");
    if let Some(field) = name.strip_prefix("model.") {
        let value = match field {
            "id" => Some(model.id.to_string()),
            "name" => Some(model.name.clone()),
            "job_id" => Some(model.job_id.clone()),
            "base_model" => model.base_model.clone(),
            "model_size" => model.model_size.clone(),
            "dataset" => model.dataset.clone(),
            "final_loss" => model.final_loss.map(|l| l.to_string()),
            _ => match field.strip_prefix("params.") {
                Some(path) => {
                    let params: Value =
                        serde_json::from_str(&model.params_json).unwrap_or_default();
                    walk(&params, path)
                }
                None => {
                    return Err(format!(
                        "${{{name}}} is not a value rules know: use one of {KNOWN}"
                    ));
                }
            },
        };
        return value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| missing(format!("model {} has no {field}", model.id)));
    }
    if let Some(field) = name.strip_prefix("previous.") {
        let Some(previous) = previous else {
            return Err(missing(
                "the rule fired on a registration, with no previous deployment".into(),
            ));
        };
        let value = match field {
            "id" => Some(previous.id.to_string()),
            "ref" => previous.reference.clone(),
            "deployer" => Some(previous.deployer.clone()),
            _ => match field.strip_prefix("details.") {
                Some(path) => {
                    let details: Value =
                        serde_json::from_str(&previous.details_json).unwrap_or_default();
                    walk(&details, path)
                }
                None => {
                    return Err(format!(
                        "${{{name}}} is not a value rules know: use one of {KNOWN}"
                    ));
                }
            },
        };
        return value.filter(|v| !v.is_empty()).ok_or_else(|| {
            missing(format!(
                "deployment {} ({}) reported no {field}",
                previous.id, previous.deployer
            ))
        });
    }
    Err(format!(
        "${{{name}}} is not a value rules know: use one of {KNOWN}"
    ))
}

/// The text of the value at `path` (dot-separated keys) under `value`:
/// a string as it is, a number or a boolean written out; nothing for an
/// object, an array or null.
fn walk(value: &Value, path: &str) -> Option<String> {
    let found = path.split('.').try_fold(value, |v, key| v.get(key))?;
    match found {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn known(name: &str) -> bool {
    matches!(
        name,
        "model.id"
            | "model.name"
            | "model.job_id"
            | "model.base_model"
            | "model.model_size"
            | "model.dataset"
            | "model.final_loss"
            | "previous.id"
            | "previous.ref"
            | "previous.deployer"
    ) || ["model.params.", "previous.details."]
        .iter()
        .any(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
}

/// The names inside each `${…}` of `text`.
fn references(text: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{text:?} opens a ${{ it never closes"))?;
        names.push(after[..end].trim().to_string());
        rest = &after[end + 1..];
    }
    Ok(names)
}

fn for_each_string(options: &Map<String, Value>, f: &mut impl FnMut(&str)) {
    fn visit(value: &Value, f: &mut impl FnMut(&str)) {
        match value {
            Value::String(s) => f(s),
            Value::Array(items) => items.iter().for_each(|v| visit(v, f)),
            Value::Object(map) => map.values().for_each(|v| visit(v, f)),
            _ => {}
        }
    }
    options.values().for_each(|v| visit(v, f));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn model() -> TrainedModel {
        let mut model = TrainedModel::from_files("ft-7", String::new(), Vec::new());
        model.id = 7;
        model.base_model = Some("meta-llama/Llama-3.1-8B".into());
        model.params_json = r#"{"rank": 16, "nested": {"tag": "v1"}}"#.into();
        model
    }

    fn previous() -> Deployment {
        Deployment {
            id: 3,
            model_id: 7,
            deployer: "safetensors-check".into(),
            options_json: "{}".into(),
            status: crate::model::Status::Completed,
            phase: None,
            progress: Default::default(),
            dir: String::new(),
            out_dir: String::new(),
            reference: Some("ok:ft-7".into()),
            details_json: r#"{"tensors": 12, "dtype": "F16", "empty": ""}"#.into(),
            error: None,
            duration_ms: Some(1),
            created_at: String::new(),
            completed_at: None,
            created_by: None,
            plugin_sha256: None,
            server: None,
            started_at: None,
            published: Vec::new(),
            cause: None,
            approval: None,
        }
    }

    fn options(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn references_are_filled_or_fail_with_a_sentence() {
        #[rustfmt::skip]
        let cases: Vec<(Value, Result<Value, &str>)> = vec![
            (json!({"plain": "x", "n": 3}), Ok(json!({"plain": "x", "n": 3}))),
            (json!({"key": "${model.job_id}/${model.id}"}), Ok(json!({"key": "ft-7/7"}))),
            (json!({"r": "${previous.ref}", "t": "${previous.details.tensors}"}), Ok(json!({"r": "ok:ft-7", "t": "12"}))),
            (json!({"deep": {"list": ["${previous.details.dtype}"]}}), Ok(json!({"deep": {"list": ["F16"]}}))),
            (json!({"p": "${model.params.nested.tag}-${model.params.rank}"}), Ok(json!({"p": "v1-16"}))),
            (json!({"x": "${previous.details.url}"}), Err("${previous.details.url} has no value: deployment 3 (safetensors-check) reported no details.url")),
            (json!({"x": "${previous.details.empty}"}), Err("${previous.details.empty} has no value")),
            (json!({"x": "${model.final_loss}"}), Err("${model.final_loss} has no value: model 7 has no final_loss")),
            (json!({"x": "${model.nope}"}), Err("is not a value rules know")),
            (json!({"x": "${model.job_id"}), Err("opens a ${ it never closes")),
        ];
        for (given, expected) in cases {
            let got = expand(&options(given.clone()), &model(), Some(&previous()));
            match (got, expected) {
                (Ok(got), Ok(want)) => assert_eq!(Value::Object(got), want, "{given}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{given}: {got}"),
                (got, want) => panic!("{given}: got {got:?}, expected {want:?}"),
            }
        }
        let on_registration = expand(&options(json!({"r": "${previous.ref}"})), &model(), None);
        assert!(
            on_registration
                .unwrap_err()
                .contains("no previous deployment")
        );
    }

    #[test]
    fn problems_are_found_before_a_rule_is_stored() {
        #[rustfmt::skip]
        let cases: Vec<(Value, bool, &[&str])> = vec![
            (json!({"a": "${model.job_id}"}), true, &[]),
            (json!({"a": "${previous.details.url}"}), false, &[]),
            (json!({"a": "${previous.details.url}"}), true, &["only deployment.completed rules may use previous.*"]),
            (json!({"a": ["${previous.colour}"]}), false, &["${previous.colour} is not a value rules know"]),
            (json!({"a": "${model.params.}"}), false, &["is not a value rules know"]),
            (json!({"a": "${oops"}), false, &["never closes"]),
        ];
        for (given, registered, expected) in cases {
            let found = problems(&options(given.clone()), registered);
            assert_eq!(found.len(), expected.len(), "{given}: {found:?}");
            for (f, e) in found.iter().zip(expected) {
                assert!(f.contains(e), "{given}: {f}");
            }
        }
    }
}

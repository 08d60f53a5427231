//! Whether a model, and a completed deployment, match a rule's `match`.
//! Pure.

use serde_json::Value;

use super::Match;
use crate::model::{Deployment, TrainedModel};

/// Whether `text` matches `pattern`: `*` any run of characters, `?` one,
/// everything else itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic two-pointer walk, going back to the last `*` on a miss.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// Whether `wanted` (from a rule) matches `value` (from a record): a
/// string is a glob over a string; numbers compare as numbers; anything
/// else must be equal.
fn value_matches(wanted: &Value, value: Option<&Value>) -> bool {
    match (wanted, value) {
        (_, None) => false,
        (Value::String(pattern), Some(Value::String(text))) => glob(pattern, text),
        (Value::Number(a), Some(Value::Number(b))) => a.as_f64() == b.as_f64(),
        (a, Some(b)) => a == b,
    }
}

/// Whether `model` (and, for a completed deployment, `previous`) matches.
pub fn matches(rule: &Match, model: &TrainedModel, previous: Option<&Deployment>) -> bool {
    // A pattern asks for a value: an unknown one matches none.
    let text = |pattern: &Option<String>, value: Option<&str>| {
        pattern
            .as_deref()
            .is_none_or(|p| value.is_some_and(|v| glob(p, v)))
    };
    if !(text(&rule.name, Some(&model.name))
        && text(&rule.job_id, Some(&model.job_id))
        && text(&rule.base_model, model.base_model.as_deref())
        && text(&rule.dataset, model.dataset.as_deref())
        && text(&rule.signed_by, model.signed_by()))
    {
        return false;
    }
    if let Some(bounds) = rule.final_loss {
        let Some(loss) = model.final_loss else {
            return false;
        };
        if bounds.min.is_some_and(|min| loss < min) || bounds.max.is_some_and(|max| loss > max) {
            return false;
        }
    }
    if !rule.params.is_empty() {
        let params: Value = serde_json::from_str(&model.params_json).unwrap_or(Value::Null);
        if !rule
            .params
            .iter()
            .all(|(k, v)| value_matches(v, params.get(k)))
        {
            return false;
        }
    }
    if !rule.details.is_empty() {
        let Some(previous) = previous else {
            return false;
        };
        let details: Value = serde_json::from_str(&previous.details_json).unwrap_or(Value::Null);
        if !rule
            .details
            .iter()
            .all(|(k, v)| value_matches(v, details.get(k)))
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Bounds;
    use serde_json::json;

    #[test]
    fn globs() {
        #[rustfmt::skip]
        let cases = [
            ("meta-llama/*", "meta-llama/Llama-3.1-8B", true),
            ("meta-llama/*", "mistralai/Mistral-7B", false),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("ft-?", "ft-1", true),
            ("ft-?", "ft-12", false),
            ("*-8B", "meta-llama/Llama-3.1-8B", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(glob(pattern, text), expected, "{pattern:?} on {text:?}");
        }
    }

    fn model() -> TrainedModel {
        let mut model = TrainedModel::from_files("ft-1", String::new(), Vec::new());
        model.base_model = Some("meta-llama/Llama-3.1-8B".into());
        model.dataset = Some("support-tickets".into());
        model.final_loss = Some(0.42);
        model.params_json = r#"{"lr": 0.0002, "rank": 16, "kind": "lora"}"#.into();
        model
    }

    #[test]
    fn a_model_matches_on_each_field() {
        let loss = |min, max| Some(Bounds { min, max });
        #[rustfmt::skip]
        let cases: Vec<(Match, bool)> = vec![
            (Match::default(), true),
            (Match { base_model: Some("meta-llama/*".into()), ..Default::default() }, true),
            (Match { base_model: Some("mistralai/*".into()), ..Default::default() }, false),
            (Match { job_id: Some("ft-*".into()), name: Some("ft-?".into()), ..Default::default() }, true),
            (Match { dataset: Some("support-tickets".into()), ..Default::default() }, true),
            (Match { dataset: Some("other".into()), ..Default::default() }, false),
            (Match { final_loss: loss(None, Some(0.5)), ..Default::default() }, true),
            (Match { final_loss: loss(None, Some(0.4)), ..Default::default() }, false),
            (Match { final_loss: loss(Some(0.42), Some(0.42)), ..Default::default() }, true),
            (Match { params: [("rank".into(), json!(16))].into(), ..Default::default() }, true),
            (Match { params: [("rank".into(), json!(16.0))].into(), ..Default::default() }, true),
            (Match { params: [("rank".into(), json!(8))].into(), ..Default::default() }, false),
            (Match { params: [("kind".into(), json!("lo*"))].into(), ..Default::default() }, true),
            (Match { params: [("missing".into(), json!(1))].into(), ..Default::default() }, false),
            (Match { details: [("verdict".into(), json!("ok"))].into(), ..Default::default() }, false),
        ];
        for (rule, expected) in cases {
            assert_eq!(matches(&rule, &model(), None), expected, "{rule:?}");
        }
        let mut no_loss = model();
        no_loss.final_loss = None;
        let bounded = Match {
            final_loss: loss(None, Some(1.0)),
            ..Default::default()
        };
        assert!(
            !matches(&bounded, &no_loss, None),
            "no loss is not within bounds"
        );
    }

    #[test]
    fn signed_by_matches_only_a_verified_signer() {
        let rule = Match {
            signed_by: Some("key sha256:ab*".into()),
            ..Default::default()
        };
        let signed = |verified_at: Option<&str>, signer: &str| {
            let mut model = model();
            model.signature = Some(crate::model::Signature {
                method: Some("bare public key".into()),
                signer: Some(signer.into()),
                verified_at: verified_at.map(str::to_string),
                error: None,
                bundle: "{}".into(),
            });
            model
        };
        let now = Some("2026-12-05T00:00:00Z");
        assert!(matches(&rule, &signed(now, "key sha256:abcd"), None));
        assert!(!matches(&rule, &signed(now, "key sha256:cdef"), None));
        assert!(
            !matches(&rule, &signed(None, "key sha256:abcd"), None),
            "a signature that failed vouches for no one"
        );
        assert!(!matches(&rule, &model(), None), "unsigned");
    }
}

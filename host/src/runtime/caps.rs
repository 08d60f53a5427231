//! The caps on what a plugin hands back — its `ref`, `details` and error,
//! each log line and progress note — and the copy budget that holds them
//! before the bytes leave the guest. wasmtime charges every string and list
//! a guest passes out (a host call's arguments, a call's result) against the
//! store's hostcall fuel and refuses the copy past it; each cap here is far
//! below that budget, so whatever gets through is checked here, cut with a
//! note or refused with a sentence naming the output and its cap. Never
//! decides where an output goes.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::CallError;
use crate::human;

/// The most a guest passes to the host in one piece: one host call's
/// arguments, or one call's result. It is the store's hostcall fuel, and
/// above every cap below, so that a 10 MiB log line is cut, not refused.
pub const COPY_BYTES: usize = 16 << 20;
/// A deployment's `ref` names where the model went; past this it fails.
pub const REF_BYTES: usize = 4 << 10;
/// A deployer's error (or a refusal of options) is cut to this, with a note.
pub const ERROR_BYTES: usize = 32 << 10;
/// A deployment's `details-json`; past this it fails.
pub const DETAILS_BYTES: usize = 1 << 20;
/// How deeply `details-json` may nest arrays and objects; past this it fails.
pub const DETAILS_DEPTH: usize = 64;
/// One log line (a `log` call, or a line of stdout or stderr) is cut to this,
/// with a note; a long line never fails a deployment.
pub const LOG_LINE_BYTES: usize = 16 << 10;
/// A progress note is for a progress bar: cut to this.
pub const NOTE_BYTES: usize = 200;

/// Whether `e` is wasmtime refusing a copy past the hostcall fuel. Its
/// error type is private, so the words are matched; the e2e test of a huge
/// `ref` pins them to the pinned wasmtime.
pub(crate) fn is_copy_refusal(e: &wasmtime::Error) -> bool {
    e.chain()
        .any(|cause| cause.to_string().contains("fuel allocated for hostcalls"))
}

/// The reason for a copy refused by the budget. Inside a host call the
/// guest was running (the error crossed its frames and carries their
/// backtrace); otherwise wasmtime was lifting the call's result.
pub(crate) fn copy_refused(e: &wasmtime::Error) -> CallError {
    let budget = human::size(COPY_BYTES as u64);
    CallError::OverCap(if e.downcast_ref::<wasmtime::WasmBacktrace>().is_some() {
        format!(
            "passed more than {budget} to one host call (a log line, a progress note or a \
             single write), the most berth copies out of a deployer in one piece"
        )
    } else {
        format!(
            "returned a result larger than {budget}, the most berth copies out of a deployer \
             in one piece (a ref may be at most {}, details {}, an error {})",
            human::size(REF_BYTES as u64),
            human::size(DETAILS_BYTES as u64),
            human::size(ERROR_BYTES as u64),
        )
    })
}

/// The deployer's own error, cut to `ERROR_BYTES` with a note.
pub(crate) fn error(text: String) -> String {
    match truncated(&text, ERROR_BYTES, "the error") {
        Cow::Borrowed(_) => text,
        Cow::Owned(cut) => cut,
    }
}

/// One log line, cut to `LOG_LINE_BYTES` with a note.
pub(crate) fn log_line(text: &str) -> Cow<'_, str> {
    truncated(text, LOG_LINE_BYTES, "the line")
}

/// A progress note, cut to `NOTE_BYTES`.
pub(crate) fn note(text: &str) -> &str {
    prefix(text, NOTE_BYTES)
}

/// `text` itself if it fits `cap`, else its first `cap` bytes (at a
/// character boundary) and a note of what was cut.
pub(crate) fn truncated<'a>(text: &'a str, cap: usize, what: &str) -> Cow<'a, str> {
    if text.len() <= cap {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!(
        "{}{}",
        prefix(text, cap),
        cut_note(what, text.len(), cap)
    ))
}

/// What follows the kept part of a text cut from `total` to `cap` bytes.
pub(crate) fn cut_note(what: &str, total: usize, cap: usize) -> String {
    format!(
        "… [truncated: {what} was {}, berth keeps {}]",
        human::size(total as u64),
        human::size(cap as u64)
    )
}

/// The longest prefix of `text` of at most `cap` bytes that ends on a
/// character boundary.
fn prefix(text: &str, cap: usize) -> &str {
    if text.len() <= cap {
        return text;
    }
    let end = (0..=cap)
        .rev()
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(0);
    &text[..end]
}

/// A deployment's `ref`, refused past `REF_BYTES`.
pub(crate) fn check_reference(reference: &str) -> Result<(), CallError> {
    if reference.len() > REF_BYTES {
        return Err(CallError::OverCap(format!(
            "returned a ref of {}; a ref may be at most {} (put the rest into details)",
            human::size(reference.len() as u64),
            human::size(REF_BYTES as u64)
        )));
    }
    Ok(())
}

/// A deployment's `details-json`: empty for `{}`, else a JSON object within
/// `DETAILS_BYTES` and `DETAILS_DEPTH`.
pub(crate) fn parse_details(text: &str) -> Result<Map<String, Value>, CallError> {
    if text.len() > DETAILS_BYTES {
        return Err(CallError::OverCap(format!(
            "returned details-json of {}; details may be at most {}",
            human::size(text.len() as u64),
            human::size(DETAILS_BYTES as u64)
        )));
    }
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    // Measured before parsing, so the parser never recurses past the cap.
    if nesting(text) > DETAILS_DEPTH {
        return Err(CallError::OverCap(format!(
            "returned details-json nested more than {DETAILS_DEPTH} levels deep; details may \
             nest arrays and objects at most {DETAILS_DEPTH} levels"
        )));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => within_once_stored(map),
        Ok(other) => Err(CallError::BadResult(format!(
            "returned details-json that is not a JSON object: {}",
            prefix_for_people(&other.to_string())
        ))),
        Err(e) => Err(CallError::BadResult(match lone_surrogate(text) {
            Some((at, escape)) => format!(
                "returned details-json that is not valid JSON: {escape} at byte {at} is a lone \
                 UTF-16 surrogate, which encodes no character (a string cut inside a surrogate \
                 pair?)"
            ),
            None => format!(
                "returned details-json that is not valid JSON ({e}): {}",
                prefix_for_people(text)
            ),
        })),
    }
}

/// Details are stored and answered as serde_json writes them, which can be
/// longer than the deployer's text (`1e15` is written out in full), so the
/// cap holds for that form too.
fn within_once_stored(map: Map<String, Value>) -> Result<Map<String, Value>, CallError> {
    // A map of JSON values always serializes.
    let stored = serde_json::to_string(&map).map_or(usize::MAX, |text| text.len());
    if stored > DETAILS_BYTES {
        return Err(CallError::OverCap(format!(
            "returned details-json that takes {} once stored (its numbers written out in \
             full); details may be at most {}",
            human::size(stored as u64),
            human::size(DETAILS_BYTES as u64)
        )));
    }
    Ok(map)
}

/// The first 200 characters, enough to recognise the text in an error.
fn prefix_for_people(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// How deeply arrays and objects nest in JSON text, outside strings; the
/// scan stops once past `DETAILS_DEPTH`.
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in text.bytes() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if in_string => escaped = true,
            b'"' => in_string = !in_string,
            b'[' | b'{' if !in_string => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > DETAILS_DEPTH {
                    break;
                }
            }
            b']' | b'}' if !in_string => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The first `\uXXXX` escape in JSON text that is half a surrogate pair
/// without its other half: where it starts, and its text.
fn lone_surrogate(text: &str) -> Option<(usize, &str)> {
    let bytes = text.as_bytes();
    let code = |at: usize| -> Option<u32> {
        let escape = text.get(at..at + 6)?;
        let hex = escape.strip_prefix("\\u")?;
        u32::from_str_radix(hex, 16).ok()
    };
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        match code(at) {
            Some(0xD800..=0xDBFF) => match code(at + 6) {
                Some(0xDC00..=0xDFFF) => at += 12,
                _ => return Some((at, &text[at..at + 6])),
            },
            Some(0xDC00..=0xDFFF) => return Some((at, &text[at..at + 6])),
            Some(_) => at += 6,
            // Any other escape is two bytes: `\"`, `\\`, `\n`, ...
            None => at += 2,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_must_be_a_json_object_or_empty() {
        assert!(parse_details("").unwrap().is_empty());
        assert_eq!(parse_details(r#"{"a": 1}"#).unwrap()["a"], 1);
        let err = parse_details("[1, 2, 3]").unwrap_err().to_string();
        assert_eq!(
            err,
            "returned details-json that is not a JSON object: [1,2,3]"
        );
        let err = parse_details("{not json").unwrap_err().to_string();
        assert!(
            err.starts_with("returned details-json that is not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn details_past_a_cap_are_refused_naming_it() {
        let deep = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        let at_cap = format!(r#"{{"a": {}}}"#, deep(DETAILS_DEPTH - 1));
        assert!(parse_details(&at_cap).is_ok());
        let over = format!(r#"{{"a": {}}}"#, deep(DETAILS_DEPTH));
        assert_eq!(
            parse_details(&over).unwrap_err().to_string(),
            "returned details-json nested more than 64 levels deep; details may nest arrays \
             and objects at most 64 levels"
        );
        // Brackets inside strings are text, not nesting.
        let quoted = format!(r#"{{"a": "{}\"{}"}}"#, "[".repeat(100), "{".repeat(100));
        assert!(parse_details(&quoted).is_ok());
        let big = format!(r#"{{"a": "{}"}}"#, "x".repeat(DETAILS_BYTES));
        assert_eq!(
            parse_details(&big).unwrap_err().to_string(),
            "returned details-json of 1.0 MiB; details may be at most 1 MiB"
        );
        // Within the cap as written, past it as stored: `1e15` is stored
        // as 1000000000000000.0.
        let grown = format!(r#"{{"n": [{}1]}}"#, "1e15,".repeat(100_000));
        assert!(grown.len() < DETAILS_BYTES);
        assert_eq!(
            parse_details(&grown).unwrap_err().to_string(),
            "returned details-json that takes 1.8 MiB once stored (its numbers written out in \
             full); details may be at most 1 MiB"
        );
    }

    /// Found by `props::an_object_within_the_caps_is_kept_…`: serde_json's
    /// default float parser kept this one unit in the last place off.
    #[test]
    fn details_keep_every_number_exactly() {
        let map = parse_details(r#"{"x": -2.428529001515464e242}"#).unwrap();
        assert_eq!(map["x"].as_f64(), Some(-2.428529001515464e242));
    }

    #[test]
    fn a_lone_surrogate_is_named() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<(usize, &str)>)] = &[
            (r#"{"a": "\ud83d\ude00"}"#, None),
            (r#"{"a": "\\ud83d"}"#, None),
            (r#"{"a": "\ud83d"}"#, Some((7, r"\ud83d"))),
            (r#"{"a": "x\ude00"}"#, Some((8, r"\ude00"))),
            (r#"{"a": "\ud83d\u0041"}"#, Some((7, r"\ud83d"))),
            (r#"{"a": "\u00e9"}"#, None),
        ];
        for &(text, expected) in cases {
            assert_eq!(lone_surrogate(text), expected, "{text}");
        }
        let err = parse_details(r#"{"name": "half \ud83d of an emoji"}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            r"returned details-json that is not valid JSON: \ud83d at byte 15 is a lone UTF-16 surrogate, which encodes no character (a string cut inside a surrogate pair?)"
        );
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary_with_a_note() {
        assert_eq!(truncated("short", 10, "the line"), "short");
        assert_eq!(
            truncated("ééé", 3, "the line"),
            "é… [truncated: the line was 6 bytes, berth keeps 3 bytes]"
        );
        let line = log_line(&"l".repeat(10 << 20)).into_owned();
        assert!(
            line.starts_with(&"l".repeat(LOG_LINE_BYTES)),
            "{}",
            &line[..20]
        );
        assert!(
            line.ends_with("l… [truncated: the line was 10 MiB, berth keeps 16 KiB]"),
            "{}",
            &line[line.len() - 80..]
        );
        assert_eq!(note(&"n".repeat(1000)).len(), NOTE_BYTES);
        assert_eq!(error("no".into()), "no");
        assert!(error("e".repeat(ERROR_BYTES + 1)).ends_with("berth keeps 32 KiB]"));
    }

    #[test]
    fn a_ref_past_its_cap_is_refused_naming_it() {
        assert!(check_reference(&"r".repeat(REF_BYTES)).is_ok());
        assert_eq!(
            check_reference(&"r".repeat(10 << 20))
                .unwrap_err()
                .to_string(),
            "returned a ref of 10 MiB; a ref may be at most 4 KiB (put the rest into details)"
        );
    }
}

/// The caps over generated text and JSON: a cut never splits a character
/// and never passes its cap by more than its note, what fits is kept as it
/// is, and details are parsed or refused, never past their depth.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::strategies::{self, json};

    /// Text around a cap: short, or a few bytes over it, in characters of
    /// one to four bytes.
    fn text_around(cap: usize) -> impl Strategy<Value = String> {
        let unit = prop_oneof![Just("a"), Just("é"), Just("€"), Just("😀"), Just("\n")];
        (prop::collection::vec(unit, 0..24), 0..cap + 8).prop_map(move |(units, fill)| {
            let mut text = "x".repeat(fill.saturating_sub(units.len()));
            text.extend(units);
            text
        })
    }

    /// How deeply arrays and objects nest in `value`.
    fn depth(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    fn nested(levels: usize, inner: Value) -> Value {
        (0..levels).fold(inner, |value, i| {
            if i % 2 == 0 {
                Value::Array(vec![value])
            } else {
                serde_json::json!({ "k": value })
            }
        })
    }

    #[track_caller]
    fn check_cut(text: &str, cap: usize, what: &str, out: &str) -> Result<(), TestCaseError> {
        if text.len() <= cap {
            prop_assert_eq!(out, text);
            return Ok(());
        }
        let note = cut_note(what, text.len(), cap);
        let kept = out
            .strip_suffix(&note)
            .ok_or_else(|| TestCaseError::fail("no note"))?;
        prop_assert!(text.starts_with(kept));
        // The longest prefix on a character boundary: a character is at
        // most four bytes.
        prop_assert!(
            kept.len() <= cap && kept.len() + 4 > cap,
            "kept {}",
            kept.len()
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn a_cut_keeps_whole_characters_and_adds_only_its_note(
            (cap, text) in (0..64usize).prop_flat_map(|cap| (Just(cap), text_around(cap))),
        ) {
            check_cut(&text, cap, "the line", &truncated(&text, cap, "the line"))?;
        }

        #[test]
        fn each_output_is_cut_at_its_own_cap(
            line in text_around(LOG_LINE_BYTES),
            error_text in text_around(ERROR_BYTES),
            progress in text_around(NOTE_BYTES),
            reference in text_around(REF_BYTES),
        ) {
            check_cut(&line, LOG_LINE_BYTES, "the line", &log_line(&line))?;
            check_cut(&error_text, ERROR_BYTES, "the error", &error(error_text.clone()))?;
            let kept = note(&progress);
            prop_assert!(progress.starts_with(kept) && kept.len() <= NOTE_BYTES);
            prop_assert!(kept.len() == progress.len() || kept.len() + 4 > NOTE_BYTES);
            prop_assert_eq!(check_reference(&reference).is_ok(), reference.len() <= REF_BYTES);
        }

        /// Any text is parsed or refused; what is accepted nests within the
        /// depth cap and is stored within the size cap.
        #[test]
        fn any_details_are_answered_within_the_caps(
            text in prop_oneof![
                json(6).prop_map(|v| v.to_string()),
                json(3).prop_map(|v| format!("{{\"a\": {}}}", nested(70, v))),
                r#"[\[\]{}"\\:,a-z0-9 ]{0,200}"#,
                strategies::text(),
            ],
        ) {
            if let Ok(map) = parse_details(&text) {
                let value = Value::Object(map);
                prop_assert!(depth(&value) <= DETAILS_DEPTH);
                prop_assert!(value.to_string().len() <= DETAILS_BYTES);
            }
        }

        #[test]
        fn an_object_within_the_caps_is_kept_and_one_past_the_depth_refused(
            inner in json(3),
            levels in 0..80usize,
        ) {
            let value = serde_json::json!({ "a": nested(levels, inner) });
            let text = value.to_string();
            match parse_details(&text) {
                Ok(map) => {
                    prop_assert!(depth(&value) <= DETAILS_DEPTH, "depth {}", depth(&value));
                    prop_assert_eq!(Value::Object(map), value);
                }
                Err(CallError::OverCap(reason)) => {
                    prop_assert!(depth(&value) > DETAILS_DEPTH, "{reason}");
                    prop_assert!(reason.contains("nested more than 64 levels"), "{reason}");
                }
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}

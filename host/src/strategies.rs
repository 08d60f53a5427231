//! What the property tests (`mod props` beside a module's unit tests) share:
//! generators of arbitrary JSON and the case count. Test-only.

use proptest::prelude::*;
use proptest::test_runner::{Config, contextualize_config};
use serde_json::{Map, Value};

/// `cases` a property, unless `PROPTEST_CASES` says otherwise (scripts/props
/// sets it for the long run). `Config::with_cases` alone would override the
/// variable.
pub fn cases(cases: u32) -> Config {
    contextualize_config(Config {
        cases,
        ..Config::default()
    })
}

/// Any JSON value, nested up to `depth` arrays and objects, with strings that
/// hold quotes, backslashes, brackets, control characters and any Unicode.
pub fn json(depth: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Strings that stress JSON and path handling: mostly the characters that
/// mean something to them, some of any kind.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => r#"[a-z"\\\[\]{}/.:%\x00-\x1f\u{7f} é😀]{0,12}"#,
        1 => any::<String>(),
    ]
}

/// A segment of a file path that registration accepts: no `/`, `\` or
/// control character, not `.`, `..` or a `.fetch-` name; often with the
/// characters that mean something in a URL.
pub fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_ é😀-][a-zA-Z0-9_. é😀-]{0,8}",
        r"\.[a-z][a-z.]{0,5}",
        r#"[a-z?#%&=+:@;,\[\]{}'"<>^|`~!$()* ][a-z?#%&=+:@;,\[\]{}'"<>^|`~!$()* .]{0,8}"#,
        r"[^/\\\p{Cc}.][^/\\\p{Cc}]{0,8}",
    ]
}

/// A file path that registration accepts: 1 to 4 segments.
pub fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(segment(), 1..5).prop_map(|segments| segments.join("/"))
}

/// A job id that registration accepts.
pub fn job_id() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}"
}

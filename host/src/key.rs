//! A key under a target: checked once, where a plugin's text becomes one,
//! so every backend joins it under its prefix without looking again. The
//! same rule judges the path of a deployer's own request under a target's
//! url (`Key::of_request_path`): what a server might normalise into
//! another path (`..;`, `%2e`, `%252e`, empty or dot segments) is refused
//! in both, so a key and a request stay where they say.

/// A key is at most this long, in bytes (S3's own limit on a whole key).
pub const MAX_KEY_BYTES: usize = 1024;

/// A checked key: relative, '/'-separated, no empty/'.'/'..' segment, no
/// leading '/', no '\\', '?', '#', '%', ';', no control chars, at most
/// 1,024 bytes. Anything else could leave the target's prefix, mean
/// another object than the one written (`%2e%2e`, a query, `..;` which
/// Tomcat-style servers read as `..`) or be read differently by each kind
/// of store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key(String);

impl Key {
    /// The key `text`, or a sentence saying what is wrong with it.
    pub fn parse(text: &str) -> Result<Key, String> {
        let refuse = |why: &str| Err(format!("key {text:?} {why}"));
        if text.is_empty() {
            return Err(
                "the key is empty: name the object, e.g. \"models/adapter.safetensors\"".into(),
            );
        }
        if text.len() > MAX_KEY_BYTES {
            return Err(format!(
                "the key ({} bytes, starting {:?}) is longer than {MAX_KEY_BYTES} bytes",
                text.len(),
                text.chars().take(40).collect::<String>()
            ));
        }
        if text.starts_with('/') {
            return refuse("starts with /: a key is relative to its target's url");
        }
        if let Some(c) = text.chars().find(|c| c.is_control()) {
            return refuse(&format!("has a control character ({:?})", c));
        }
        if let Some(c) = text
            .chars()
            .find(|c| matches!(c, '\\' | '?' | '#' | '%' | ';'))
        {
            return refuse(&format!(
                "has {c:?}, which is not allowed in a key (\\, ?, #, % and ; are refused)"
            ));
        }
        for segment in text.split('/') {
            match segment {
                "" => return refuse("has an empty segment (// or a trailing /)"),
                "." | ".." => {
                    return refuse(&format!(
                        "has a {segment:?} segment: a key stays under its target's url"
                    ));
                }
                _ => {}
            }
        }
        Ok(Key(text.to_string()))
    }

    /// The key a request path names, `relative` being the path as sent
    /// past the target's url (percent-encoded): each segment decoded once
    /// and the whole held to the key's rule, so `%2e%2e`, `%252e` (`%`
    /// after decoding) and an encoded `/` are refused like `..` itself.
    pub fn of_request_path(relative: &str) -> Result<Key, String> {
        let mut decoded = Vec::new();
        for segment in relative.split('/') {
            let text = percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .map_err(|_| format!("the path {relative:?} does not decode to UTF-8"))?;
            if text.contains('/') {
                return Err(format!(
                    "the path {relative:?} has an encoded /, which servers read differently"
                ));
            }
            decoded.push(text);
        }
        Key::parse(&decoded.join("/")).map_err(|e| format!("the path {relative:?}: {e}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its segments, in order; none is empty, `.` or `..`.
    pub(crate) fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(text: &str, expected: Result<(), &str>) {
        let got = Key::parse(text);
        match expected {
            Ok(()) => assert_eq!(got.map(|k| k.as_str().to_string()), Ok(text.to_string())),
            Err(sentence) => assert_eq!(got, Err(sentence.to_string()), "for {text:?}"),
        }
    }

    #[test]
    fn keys_are_relative_plain_and_short() {
        let long = "a".repeat(2048);
        let at_limit = format!("{}/b", "a".repeat(MAX_KEY_BYTES - 2));
        let cases: &[(&str, Result<(), &str>)] = &[
            ("model.safetensors", Ok(())),
            ("job-1/deploy-3/adapter_model.safetensors", Ok(())),
            ("a b/ünïcode: ok=,+@!~*'()[]", Ok(())),
            ("a:b", Ok(())),
            ("...", Ok(())),
            (".hidden/x..y", Ok(())),
            (&at_limit, Ok(())),
            (
                "",
                Err("the key is empty: name the object, e.g. \"models/adapter.safetensors\""),
            ),
            (
                "/abs",
                Err("key \"/abs\" starts with /: a key is relative to its target's url"),
            ),
            (
                "a//b",
                Err("key \"a//b\" has an empty segment (// or a trailing /)"),
            ),
            (
                "a/",
                Err("key \"a/\" has an empty segment (// or a trailing /)"),
            ),
            (
                ".",
                Err("key \".\" has a \".\" segment: a key stays under its target's url"),
            ),
            (
                "..",
                Err("key \"..\" has a \"..\" segment: a key stays under its target's url"),
            ),
            (
                "a/../../b",
                Err("key \"a/../../b\" has a \"..\" segment: a key stays under its target's url"),
            ),
            (
                "a/./b",
                Err("key \"a/./b\" has a \".\" segment: a key stays under its target's url"),
            ),
            (
                "a\\b",
                Err(
                    "key \"a\\\\b\" has '\\\\', which is not allowed in a key (\\, ?, #, % and ; are refused)",
                ),
            ),
            (
                "..\\x",
                Err(
                    "key \"..\\\\x\" has '\\\\', which is not allowed in a key (\\, ?, #, % and ; are refused)",
                ),
            ),
            (
                "a?x=1",
                Err(
                    "key \"a?x=1\" has '?', which is not allowed in a key (\\, ?, #, % and ; are refused)",
                ),
            ),
            (
                "a#frag",
                Err(
                    "key \"a#frag\" has '#', which is not allowed in a key (\\, ?, #, % and ; are refused)",
                ),
            ),
            (
                "%2e%2e/x",
                Err(
                    "key \"%2e%2e/x\" has '%', which is not allowed in a key (\\, ?, #, % and ; are refused)",
                ),
            ),
            (
                "..;/shared/x",
                Err(
                    "key \"..;/shared/x\" has ';', which is not allowed in a key (\\, ?, #, % and ; are refused)",
                ),
            ),
            ("a\nb", Err("key \"a\\nb\" has a control character ('\\n')")),
            ("a\0b", Err("key \"a\\0b\" has a control character ('\\0')")),
            (
                "a\u{7f}",
                Err("key \"a\\u{7f}\" has a control character ('\\u{7f}')"),
            ),
            (
                "a\u{85}",
                Err("key \"a\\u{85}\" has a control character ('\\u{85}')"),
            ),
        ];
        for (text, expected) in cases {
            check(text, *expected);
        }
        assert_eq!(
            Key::parse(&long),
            Err(format!(
                "the key (2048 bytes, starting {:?}) is longer than 1024 bytes",
                "a".repeat(40)
            ))
        );
        for path in [
            "..%3b/shared",
            "..;/shared",
            "%2e%2e/admin",
            "%2E/a",
            "%252e%252e/x",
            "a/..%2Fb",
            "a%5c..%5cb",
            "a//b",
            "a/",
            "%ff",
        ] {
            assert!(Key::of_request_path(path).is_err(), "{path}");
        }
        assert_eq!(
            Key::of_request_path("job%201/a%3Ab.bin").map(|k| k.0),
            Ok("job 1/a:b.bin".to_string())
        );
        let over = format!("{at_limit}c");
        assert!(
            Key::parse(&over)
                .unwrap_err()
                .starts_with("the key (1025 bytes, starting "),
            "one byte over the limit is refused"
        );
    }
}

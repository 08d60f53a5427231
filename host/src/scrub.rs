//! Credentials cut out of anything a plugin may read: one scrubber for
//! every answer, error sentence and header that reaches a deployer from a
//! target (http, s3, oci, file) or from its own requests under one.
//!
//! A credential is looked for in every form a server may echo it in: the
//! value itself, the token without its scheme word (`Bearer t` → `t`), a
//! Basic value's `user:password` and password, and each of those
//! percent-encoded (either case of hex, `+` for a space), base64-encoded
//! (standard and URL-safe, padded or not) and JSON-escaped. A stream is
//! scrubbed across its chunks (`Stream` holds back what could be the start
//! of a credential), and text is scrubbed before it is cut short, so a cut
//! never leaves part of one behind. A stream or a header is masked
//! (`*` for each byte of a credential), so its length, and any
//! `Content-Length` said of it, stays true.

use std::borrow::Cow;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

/// What a credential is replaced with.
pub const REDACTED: &str = "(redacted)";

/// A credential as a target holds it.
pub enum Secret<'a> {
    /// A header's value: `Bearer TOKEN`, `Basic BASE64`, or a bare token.
    Header(&'a [u8]),
    /// A user name and password (an OCI registry's login).
    Login {
        username: &'a str,
        password: &'a str,
    },
    /// A secret as it is (an S3 secret key or session token).
    Value(&'a str),
}

/// Finds every form of a set of credentials. Cheap to clone.
#[derive(Clone, Default)]
pub struct Scrubber {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    matcher: AhoCorasick,
    /// The longest form, in bytes: what a stream holds back.
    longest: usize,
}

impl Scrubber {
    pub fn new<'a>(secrets: impl IntoIterator<Item = Secret<'a>>) -> Self {
        let mut forms: Vec<Vec<u8>> = Vec::new();
        for secret in secrets {
            for base in bases(secret) {
                forms.extend(encodings(&base));
            }
        }
        forms.retain(|f| !f.is_empty());
        forms.sort();
        forms.dedup();
        Self::of_forms(forms)
    }

    fn of_forms(forms: Vec<Vec<u8>>) -> Self {
        let Some(longest) = forms.iter().map(Vec::len).max() else {
            return Self::default();
        };
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&forms)
            .expect("a few hundred short patterns build");
        Self {
            inner: Some(Arc::new(Inner { matcher, longest })),
        }
    }

    /// `text` with every credential form replaced by `REDACTED`.
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match self.bytes(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(scrubbed) => Cow::Owned(String::from_utf8_lossy(&scrubbed).into_owned()),
        }
    }

    /// `bytes` with every credential form replaced by `REDACTED`.
    pub fn bytes<'b>(&self, bytes: &'b [u8]) -> Cow<'b, [u8]> {
        self.replace(bytes, false)
    }

    /// `bytes` with every byte of a credential form replaced by `*`.
    pub fn mask<'b>(&self, bytes: &'b [u8]) -> Cow<'b, [u8]> {
        self.replace(bytes, true)
    }

    fn replace<'b>(&self, bytes: &'b [u8], mask: bool) -> Cow<'b, [u8]> {
        let Some(inner) = &self.inner else {
            return Cow::Borrowed(bytes);
        };
        if !inner.matcher.is_match(bytes) {
            return Cow::Borrowed(bytes);
        }
        let mut out = Vec::with_capacity(bytes.len());
        inner
            .matcher
            .replace_all_with_bytes(bytes, &mut out, |found, _, out| {
                replacement(found.len(), mask, out);
                true
            });
        Cow::Owned(out)
    }

    /// `text` scrubbed, then cut to at most `max` bytes (at a character
    /// boundary), whitespace runs made single spaces: a remote answer
    /// quoted in a sentence.
    pub fn quote(&self, text: &[u8], max: usize) -> String {
        let scrubbed = self.bytes(text);
        let text = String::from_utf8_lossy(&scrubbed);
        let mut cut = text.len().min(max);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text[..cut].split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// How many bytes beyond a quote's length must be read so that a
    /// credential starting inside it is read whole.
    pub fn longest(&self) -> usize {
        self.inner.as_ref().map_or(0, |i| i.longest)
    }

    /// A masker of a stream's chunks.
    pub fn stream(&self) -> Stream {
        Stream {
            scrubber: self.clone(),
            held: Vec::new(),
        }
    }

    /// Whether it finds anything at all.
    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }
}

/// A stream masked as it goes: each chunk's output holds back the bytes
/// that may begin a credential the next chunk completes.
pub struct Stream {
    scrubber: Scrubber,
    held: Vec<u8>,
}

impl Stream {
    /// What may be passed on of everything pushed so far.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let Some(inner) = self.scrubber.inner.clone() else {
            return chunk.to_vec();
        };
        self.held.extend_from_slice(chunk);
        let buffer = std::mem::take(&mut self.held);
        // A credential starting before `safe` lies wholly in the buffer.
        let safe = buffer.len().saturating_sub(inner.longest - 1);
        let mut out = Vec::with_capacity(buffer.len());
        let mut at = 0;
        for found in inner.matcher.find_iter(&buffer) {
            if found.start() >= safe {
                break;
            }
            out.extend_from_slice(&buffer[at..found.start()]);
            replacement(found.len(), true, &mut out);
            at = found.end();
        }
        if at < safe {
            out.extend_from_slice(&buffer[at..safe]);
            at = safe;
        }
        self.held = buffer[at..].to_vec();
        out
    }

    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    /// The rest, at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        self.scrubber.mask(&held).into_owned()
    }
}

/// What stands for a credential of `len` bytes.
fn replacement(len: usize, mask: bool, out: &mut Vec<u8>) {
    if mask {
        out.resize(out.len() + len, b'*');
    } else {
        out.extend_from_slice(REDACTED.as_bytes());
    }
}

/// The plain texts a credential is made of.
fn bases(secret: Secret<'_>) -> Vec<Vec<u8>> {
    match secret {
        Secret::Value(value) => vec![value.as_bytes().to_vec()],
        Secret::Login { username, password } => vec![
            format!("{username}:{password}").into_bytes(),
            password.as_bytes().to_vec(),
        ],
        Secret::Header(value) => {
            let mut bases = vec![value.to_vec()];
            let text = String::from_utf8_lossy(value);
            if let Some((scheme, token)) = text.trim().split_once(' ') {
                let token = token.trim();
                bases.push(token.as_bytes().to_vec());
                if scheme.eq_ignore_ascii_case("basic")
                    && let Ok(pair) = STANDARD.decode(token)
                {
                    if let Some(colon) = pair.iter().position(|&b| b == b':') {
                        bases.push(pair[colon + 1..].to_vec());
                    }
                    bases.push(pair);
                }
            }
            bases
        }
    }
}

/// `base` and its encodings.
fn encodings(base: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = vec![base.to_vec()];
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        forms.push(engine.encode(base).into_bytes());
    }
    if let Ok(text) = std::str::from_utf8(base) {
        let upper = utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
        forms.push(lower_hex(&upper).into_bytes());
        forms.push(upper.replace("%20", "+").into_bytes());
        forms.push(upper.into_bytes());
        let json = serde_json::to_string(text).expect("a string is JSON");
        forms.push(json.as_bytes()[1..json.len() - 1].to_vec());
        forms.push(json[1..json.len() - 1].replace('/', "\\/").into_bytes());
    }
    forms
}

/// A percent-encoded text with its hex digits in lower case.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut digits = 0;
    for c in encoded.chars() {
        if c == '%' {
            digits = 2;
            out.push(c);
        } else if digits > 0 {
            digits -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "tok/en+with=odd chars";

    fn bearer() -> Scrubber {
        Scrubber::new([Secret::Header(format!("Bearer {TOKEN}").as_bytes())])
    }

    #[test]
    fn every_form_of_a_token_is_found() {
        let scrubber = bearer();
        let upper = utf8_percent_encode(TOKEN, NON_ALPHANUMERIC).to_string();
        for form in [
            format!("Bearer {TOKEN}"),
            TOKEN.to_string(),
            upper.clone(),
            lower_hex(&upper),
            upper.replace("%20", "+"),
            STANDARD.encode(TOKEN),
            URL_SAFE_NO_PAD.encode(TOKEN),
            "tok\\/en+with=odd chars".to_string(),
        ] {
            let text = format!("echo: [{form}] end");
            assert_eq!(scrubber.text(&text), "echo: [(redacted)] end", "{form}");
        }
        assert_eq!(scrubber.text("nothing here"), "nothing here");
        assert!(matches!(scrubber.text("nothing"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_basic_value_and_a_login_are_found_as_pair_password_and_base64() {
        let value = format!("Basic {}", STANDARD.encode("robot:pa55-word"));
        let from_header = Scrubber::new([Secret::Header(value.as_bytes())]);
        let login = Scrubber::new([Secret::Login {
            username: "robot",
            password: "pa55-word",
        }]);
        for scrubber in [from_header, login] {
            for text in [
                value.clone(),
                STANDARD.encode("robot:pa55-word"),
                "robot:pa55-word".to_string(),
                "password=pa55-word".to_string(),
                "robot%3Apa55%2Dword".to_string(),
            ] {
                let scrubbed = scrubber.text(&text);
                assert!(!scrubbed.contains("pa55"), "{text} → {scrubbed}");
                assert!(
                    !scrubbed.contains(&STANDARD.encode("robot:pa55-word")),
                    "{scrubbed}"
                );
            }
        }
    }

    #[test]
    fn a_stream_is_scrubbed_across_any_cut_of_its_chunks() {
        let scrubber = bearer();
        let text = format!("a{TOKEN}b Bearer {TOKEN} {}.", STANDARD.encode(TOKEN));
        let whole = String::from_utf8(scrubber.mask(text.as_bytes()).into_owned()).unwrap();
        assert!(!whole.contains("tok"), "{whole}");
        assert_eq!(whole.len(), text.len());
        for size in 1..text.len() {
            let mut stream = scrubber.stream();
            let mut out = Vec::new();
            for chunk in text.as_bytes().chunks(size) {
                out.extend(stream.push(chunk));
            }
            out.extend(stream.finish());
            assert_eq!(String::from_utf8(out).unwrap(), whole, "chunks of {size}");
        }
    }

    #[test]
    fn a_quote_is_scrubbed_before_it_is_cut() {
        let scrubber = bearer();
        // The token straddles the cut: 42 of its 43 bytes would be left.
        let body = format!("{}{TOKEN}", "x".repeat(20));
        let quoted = scrubber.quote(body.as_bytes(), 25);
        assert_eq!(quoted, format!("{}(reda", "x".repeat(20)));
        assert!(!quoted.contains("tok"));
        assert_eq!(Scrubber::default().quote(b"a  b\n c", 100), "a b c");
    }
}

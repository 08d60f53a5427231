//! Plugin signatures: the public keys this server trusts, whether it loads
//! only signed plugins, and the verdict on one plugin's bytes and its
//! detached signature — **the one place of the signature rules**, whichever
//! source the plugin came from (the plugins folder's `NAME.wasm.sig`, an API
//! upload). The format is minisign's (ed25519), so authors may sign with
//! `berth plugin sign` or the `minisign` tool. Reads no file: it is handed
//! the bytes and the signature's text.

use std::io::Cursor;

use minisign::{PublicKey, SignatureBox};

/// A public key this server trusts (`--trusted-key`).
#[derive(Clone)]
pub struct TrustedKey {
    id: String,
    key: PublicKey,
}

impl TrustedKey {
    /// Parses a minisign public key as its base64 text: the second line of
    /// its `.pub` file (`RW…`, 56 characters).
    pub fn parse(text: &str) -> Result<Self, String> {
        let key = PublicKey::from_base64(text.trim()).map_err(|e| {
            format!(
                "{text:?} is not a minisign public key ({e}); give the second line of the key's .pub file"
            )
        })?;
        Ok(Self {
            id: key_id(key.keynum()),
            key,
        })
    }

    /// The key id as minisign prints it: 16 uppercase hex digits.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TrustedKey").field(&self.id).finish()
    }
}

/// A key id in minisign's spelling: its 8 bytes as a little-endian number,
/// in 16 uppercase hex digits.
pub fn key_id(keynum: &[u8]) -> String {
    keynum.iter().rev().map(|b| format!("{b:02X}")).collect()
}

/// Whose signatures a server accepts, and whether it requires one.
#[derive(Debug, Clone, Default)]
pub struct Signers {
    keys: Vec<TrustedKey>,
    required: bool,
}

/// What a plugin's signature showed, when it may load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No signature came with it (and none is required).
    Unsigned,
    /// Signed by a key this server does not trust (and none is required):
    /// it loads unverified.
    Untrusted { key_id: String },
    /// Signed over exactly these bytes by a trusted key.
    Trusted { key_id: String },
}

impl Signers {
    /// Requiring signatures without a trusted key would refuse every plugin.
    pub fn new(keys: Vec<TrustedKey>, required: bool) -> Result<Self, String> {
        if required && keys.is_empty() {
            return Err(
                "--require-signed needs at least one --trusted-key (BERTH_TRUSTED_KEYS): \
                 without a trusted key no plugin could load"
                    .into(),
            );
        }
        Ok(Self { keys, required })
    }

    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }

    pub fn required(&self) -> bool {
        self.required
    }

    /// The rules, for the plugin `name`'s bytes and the text of its detached
    /// signature, if one came with it. The error is the reason it may not
    /// load:
    ///
    /// - no signature: loads unless signatures are required;
    /// - a signature that cannot be read: never loads;
    /// - by a key that is not trusted: loads unverified unless required;
    /// - by a trusted key but over other bytes: **never loads**, required or
    ///   not — a trusted key's signature that does not match is never
    ///   ignored;
    /// - by a trusted key over these bytes: loads, signed by that key.
    pub fn check(
        &self,
        name: &str,
        wasm: &[u8],
        signature: Option<&str>,
    ) -> Result<Verdict, String> {
        let Some(text) = signature else {
            return match self.required {
                false => Ok(Verdict::Unsigned),
                true => Err(format!(
                    "is not signed, and this server loads only signed plugins (--require-signed): \
                     sign it with `berth plugin sign {name}.wasm` and give its signature with it \
                     ({name}.wasm.sig beside it in the plugins folder, or with its upload)"
                )),
            };
        };
        let unreadable = |why: &dyn std::fmt::Display| {
            format!(
                "its signature cannot be read ({why}): give the text `berth plugin sign` \
                 (or `minisign -S`) wrote"
            )
        };
        let signature = SignatureBox::from_string(text).map_err(|e| unreadable(&e))?;
        // minisign 0.10 slices the 64 bytes of the global signature (the
        // fourth line, over the trusted comment) without checking that there
        // are 64, and a cut one panics; 86 base64 characters hold 64 bytes.
        if text
            .lines()
            .nth(3)
            .is_none_or(|line| line.trim().len() < 86)
        {
            return Err(unreadable(
                &"its fourth line, the global signature, is cut short",
            ));
        }
        let key_id = key_id(signature.keynum());
        let Some(trusted) = self.keys.iter().find(|k| k.id == key_id) else {
            return match self.required {
                false => Ok(Verdict::Untrusted { key_id }),
                true => Err(format!(
                    "is signed by key {key_id}, which this server does not trust (it trusts {}; \
                     --trusted-key): sign it with a trusted key, or trust this one",
                    self.keys
                        .iter()
                        .map(|k| k.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            };
        };
        // Quiet, no copy to stdout; legacy (not prehashed) signatures are
        // still ed25519 over every byte, so minisign's older output loads.
        minisign::verify(
            &trusted.key,
            &signature,
            Cursor::new(wasm),
            true,
            false,
            true,
        )
        .map_err(|e| {
            format!(
                "its signature by trusted key {key_id} does not match its bytes ({e}): \
                     was it changed or rebuilt after signing? Sign this build again"
            )
        })?;
        Ok(Verdict::Trusted { key_id })
    }
}

#[cfg(test)]
mod tests {
    use minisign::KeyPair;

    use super::*;

    struct Author {
        pair: KeyPair,
    }

    impl Author {
        fn new() -> Self {
            Self {
                pair: KeyPair::generate_unencrypted_keypair().unwrap(),
            }
        }

        fn key(&self) -> TrustedKey {
            TrustedKey::parse(&self.pair.pk.to_base64()).unwrap()
        }

        fn sign(&self, bytes: &[u8]) -> String {
            minisign::sign(Some(&self.pair.pk), &self.pair.sk, bytes, None, None)
                .unwrap()
                .into_string()
        }
    }

    const WASM: &[u8] = b"\0asm\x0d\0\x01\0 the plugin";

    /// One case a line: what came with the bytes, and the verdict with
    /// signatures optional and required (`Ok` a verdict, `Err` a fragment
    /// of the reason).
    #[test]
    fn the_signature_rules() {
        let (trusted, stranger) = (Author::new(), Author::new());
        let (ours, theirs) = (trusted.key().id, stranger.key().id);
        let mut flipped = WASM.to_vec();
        flipped[9] ^= 1;
        let trusted_id = || Verdict::Trusted {
            key_id: ours.clone(),
        };
        let untrusted_id = || Verdict::Untrusted {
            key_id: theirs.clone(),
        };
        type Expected = Result<Verdict, String>;
        let cases: Vec<(&str, Option<String>, Expected, Expected)> = vec![
            (
                "unsigned",
                None,
                Ok(Verdict::Unsigned),
                Err("is not signed, and this server loads only signed plugins (--require-signed): sign it with `berth plugin sign p.wasm` and give its signature with it (p.wasm.sig beside it in the plugins folder, or with its upload)".into()),
            ),
            (
                "an untrusted key",
                Some(stranger.sign(WASM)),
                Ok(untrusted_id()),
                Err(format!("is signed by key {theirs}, which this server does not trust (it trusts {ours}; --trusted-key): sign it with a trusted key, or trust this one")),
            ),
            (
                "an untrusted key, other bytes",
                Some(stranger.sign(&flipped)),
                Ok(untrusted_id()),
                Err(format!("is signed by key {theirs}, which this server does not trust")),
            ),
            (
                "tampered: a trusted key over other bytes",
                Some(trusted.sign(&flipped)),
                Err(format!("its signature by trusted key {ours} does not match its bytes (Signature verification failed): was it changed or rebuilt after signing? Sign this build again")),
                Err(format!("its signature by trusted key {ours} does not match its bytes")),
            ),
            (
                "valid",
                Some(trusted.sign(WASM)),
                Ok(trusted_id()),
                Ok(trusted_id()),
            ),
            (
                "garbage",
                Some("not a signature".into()),
                Err("its signature cannot be read (Missing signature): give the text `berth plugin sign` (or `minisign -S`) wrote".into()),
                Err("its signature cannot be read (Missing signature)".into()),
            ),
            (
                "bad base64",
                Some("untrusted comment: x\n!!!\ntrusted comment: y\nAAAA\n".into()),
                Err("its signature cannot be read (".into()),
                Err("its signature cannot be read (".into()),
            ),
        ];
        for (case, signature, optional, required) in cases {
            for (required_now, expected) in [(false, optional), (true, required)] {
                let signers = Signers::new(vec![trusted.key()], required_now).unwrap();
                let got = signers.check("p", WASM, signature.as_deref());
                match (&got, &expected) {
                    (Ok(got), Ok(want)) => assert_eq!(got, want, "{case}, required {required_now}"),
                    (Err(got), Err(fragment)) => assert!(
                        got.starts_with(fragment.as_str()),
                        "{case}, required {required_now}: {got}"
                    ),
                    _ => panic!("{case}, required {required_now}: got {got:?}, want {expected:?}"),
                }
            }
        }
    }

    /// Written by the minisign tool (0.11: `minisign -G -W`, then `minisign
    /// -Sm` and, legacy, `minisign -Sl`) over `WASM`: the format is
    /// minisign's, and what it writes is checked the same.
    const MINISIGN_PUBLIC_KEY: &str = "RWRmRlLOVJoMswUJrxe6bDt3p0Iiq+Uwf5JFK7Jq9wpviZ1ROsDe6Vy/";
    const MINISIGN_SIGNATURE: &str = "untrusted comment: signature from minisign secret key
RURmRlLOVJoMs9A1DuNmHMy24UERRJ2S3mZbXG8TRs3HyeakRJsL41o7EfNT5Mgk5/YnbGWvq8wr3KSboio6UxlFLfYye+acMw4=
trusted comment: fixture for berth
fEWyk5Fllb3O4w8T5ZeMDdxCr8vdTneKz3jYHXaUW9YKsbYx1TEIjoluJYHFpu1uWFbHMesJLIkeXrf/tVjWCA==
";
    const MINISIGN_LEGACY_SIGNATURE: &str = "untrusted comment: signature from minisign secret key
RWRmRlLOVJoMs/4dED5EtnX3ODo+SgJ8+SS6d2QVE1ye5wmq75/UYwqWaq/5ktr5JGMRRXgMohpmGRv7UgvVHBOQX3m1Uz/eow8=
trusted comment: fixture for berth, legacy
AIGV+N20m28ryzyo8Ep9tnTifcGo9CnSdGns8DfiDEApFds/+Gi8OHzeBDoHd77vHu/l+1DUrO+4ZQNHY5P6DA==
";

    #[test]
    fn signatures_the_minisign_tool_wrote_are_checked_the_same() {
        let key = TrustedKey::parse(MINISIGN_PUBLIC_KEY).unwrap();
        // minisign's `.pub` comment: "minisign public key B30C9A54CE524666".
        assert_eq!(key.id(), "B30C9A54CE524666");
        let signers = Signers::new(vec![key], true).unwrap();
        let mut flipped = WASM.to_vec();
        flipped[9] ^= 1;
        for signature in [MINISIGN_SIGNATURE, MINISIGN_LEGACY_SIGNATURE] {
            assert_eq!(
                signers.check("p", WASM, Some(signature)),
                Ok(Verdict::Trusted {
                    key_id: "B30C9A54CE524666".into()
                })
            );
            let err = signers.check("p", &flipped, Some(signature)).unwrap_err();
            assert!(
                err.starts_with("its signature by trusted key B30C9A54CE524666 does not match"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_cut_global_signature_is_refused_not_a_panic() {
        // The fourth line signs the trusted comment; minisign 0.10 reads its
        // 64 bytes without checking that there are 64.
        let author = Author::new();
        let signature = author.sign(WASM);
        let lines: Vec<&str> = signature.lines().collect();
        let signers = Signers::new(vec![author.key()], false).unwrap();
        for cut in ["AAAA", "", &lines[3][..84]] {
            let text = format!("{}\n{}\n{}\n{cut}\n", lines[0], lines[1], lines[2]);
            let err = signers.check("p", WASM, Some(&text)).unwrap_err();
            assert!(
                err.starts_with("its signature cannot be read ("),
                "{cut:?}: {err}"
            );
        }
    }

    #[test]
    fn keys_are_read_or_refused_naming_the_value() {
        let author = Author::new();
        let text = author.pair.pk.to_base64();
        let key = TrustedKey::parse(&format!(" {text}\n")).unwrap();
        // minisign's own spelling of the id, from the .pub file's comment.
        let comment = author.pair.pk.to_box().unwrap().into_string();
        assert!(
            comment.contains(&format!("minisign public key: {}", key.id())),
            "{comment}"
        );
        assert_eq!(key.id().len(), 16);

        let err = TrustedKey::parse("RWQnotakey").unwrap_err();
        assert!(
            err.starts_with("\"RWQnotakey\" is not a minisign public key ("),
            "{err}"
        );
        assert!(
            err.ends_with("give the second line of the key's .pub file"),
            "{err}"
        );
    }

    #[test]
    fn requiring_signatures_needs_a_trusted_key() {
        let err = Signers::new(Vec::new(), true).unwrap_err();
        assert!(
            err.starts_with("--require-signed needs at least one --trusted-key"),
            "{err}"
        );
        assert!(!Signers::new(Vec::new(), false).unwrap().required());
    }
}

/// Signature texts from anywhere (an API upload is anyone's text): every
/// one is answered with a verdict or one of the rules' sentences, never a
/// panic (minisign 0.10 itself panics on a cut global signature).
#[cfg(test)]
mod props {
    use std::sync::LazyLock;

    use minisign::KeyPair;
    use proptest::prelude::*;

    use super::*;
    use crate::strategies;

    const WASM: &[u8] = b"\0asm\x0d\0\x01\0 the plugin";

    /// One key pair for every case: key generation is not under test.
    static AUTHOR: LazyLock<(KeyPair, String)> = LazyLock::new(|| {
        let pair = KeyPair::generate_unencrypted_keypair().unwrap();
        let signature = minisign::sign(Some(&pair.pk), &pair.sk, WASM, None, None)
            .unwrap()
            .into_string();
        (pair, signature)
    });

    fn signers(required: bool) -> Signers {
        let key = TrustedKey::parse(&AUTHOR.0.pk.to_base64()).unwrap();
        Signers::new(vec![key], required).unwrap()
    }

    /// The real signature with one line replaced, or cut anywhere.
    fn damaged() -> impl Strategy<Value = String> {
        let line = prop_oneof![r"[A-Za-z0-9+/=]{0,100}", strategies::text()];
        prop_oneof![
            (0..4usize, line).prop_map(|(at, line)| {
                let mut lines: Vec<String> = AUTHOR.1.lines().map(String::from).collect();
                lines[at] = line;
                lines.join("\n")
            }),
            (0..=AUTHOR.1.len()).prop_map(|cut| AUTHOR.1[..cut].to_string()),
        ]
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn any_signature_text_is_answered(
            text in prop_oneof![strategies::text(), damaged()],
            required in any::<bool>(),
        ) {
            match signers(required).check("p", WASM, Some(&text)) {
                Ok(_) => {}
                Err(reason) => prop_assert!(
                    [
                        "its signature cannot be read (",
                        "is signed by key ",
                        "its signature by trusted key ",
                    ]
                    .iter()
                    .any(|rule| reason.starts_with(rule)),
                    "{}", reason
                ),
            }
        }
    }
}

//! `berth plugin keygen` and `berth plugin sign`: a plugin author's signing
//! key and the detached signature a server with `--trusted-key` checks. The
//! files are minisign's (an unencrypted secret key, a `.pub` file, a
//! `.minisig`-format signature), so `minisign -G -W` keys and `minisign -Sm`
//! signatures work as well. Never verifies: the server's rules
//! (`runtime::Signers`) do.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use ct_codecs::{Base64, Decoder};
use minisign::{KeyPair, PublicKey, SecretKey};

use crate::runtime::key_id;

/// Where `keygen` writes and `sign` reads the secret key by default.
const DEFAULT_KEY: &str = "berth-plugin.key";

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// The secret key's file; the public key goes to PATH.pub. The secret
    /// key is not encrypted: keep it secret (mode 0600). Existing files
    /// are never overwritten.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_KEY)]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The plugin's .wasm file (any file can be signed).
    file: PathBuf,
    /// The secret key: made by `berth plugin keygen`, or by `minisign -G -W`
    /// (unencrypted; password-protected keys are not supported).
    #[arg(long, env = "BERTH_PLUGIN_KEY", value_name = "PATH", default_value = DEFAULT_KEY)]
    key: PathBuf,
    /// Where the signature goes (default: FILE.sig, beside the plugin,
    /// where a server's plugins folder looks for it).
    #[arg(long, value_name = "FILE.sig")]
    out: Option<PathBuf>,
}

pub fn keygen(args: &KeygenArgs) -> anyhow::Result<()> {
    let secret = &args.out;
    let public = with_suffix(secret, ".pub");
    for path in [secret, &public] {
        anyhow::ensure!(
            !path.exists(),
            "{} already exists: not overwriting a key; choose another --out",
            path.display()
        );
    }
    let KeyPair { pk, sk } =
        KeyPair::generate_unencrypted_keypair().context("cannot make a key pair")?;
    let id = key_id(pk.keynum());
    let secret_text = sk
        .to_box(Some(&format!(
            "berth plugin signing key {id}: unencrypted, keep it secret"
        )))?
        .into_string();
    let public_text = pk.to_box()?.into_string();
    write_new(secret, secret_text.as_bytes(), 0o600)?;
    write_new(&public, public_text.as_bytes(), 0o644)?;
    let line = pk.to_base64();
    println!(
        "wrote the secret key {} (unencrypted: keep it secret) and the public key {}",
        secret.display(),
        public.display()
    );
    println!("key id:     {id}");
    println!("public key: {line}");
    println!("trust it:   berth serve --trusted-key {line}");
    println!(
        "sign with:  berth plugin sign NAME.wasm --key {}",
        secret.display()
    );
    Ok(())
}

pub fn sign(args: &SignArgs) -> anyhow::Result<()> {
    let sk = read_secret_key(&args.key)?;
    let pk = PublicKey::from_secret_key(&sk)
        .with_context(|| format!("{}: the key holds no public key", args.key.display()))?;
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let file_name = args
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let id = key_id(pk.keynum());
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    // The trusted comment is signed too; minisign writes the same fields.
    let trusted = format!("timestamp:{timestamp}\tfile:{file_name}");
    let untrusted = format!("signature from berth plugin sign, key {id}");
    let signature = minisign::sign(
        Some(&pk),
        &sk,
        bytes.as_slice(),
        Some(&trusted),
        Some(&untrusted),
    )
    .with_context(|| {
        format!(
            "cannot sign {} with {} (is the key damaged?)",
            args.file.display(),
            args.key.display()
        )
    })?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| with_suffix(&args.file, ".sig"));
    // Whole or not at all: a server watching the folder may read it any
    // time (a `.tmp` is no plugin file to it).
    let temp = with_suffix(&out, ".tmp");
    std::fs::write(&temp, signature.into_string())
        .and_then(|()| std::fs::rename(&temp, &out))
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!(
        "signed {} with key {id}: wrote {}",
        args.file.display(),
        out.display()
    );
    Ok(())
}

/// An unencrypted minisign secret key; an encrypted one is refused with
/// what to do instead (asking for its password is not worth a prompt in a
/// build script). Read field by field (`SecretKey::from_bytes`) rather than
/// through the crate's key box, which insists on a checksum that `minisign
/// -G -W` leaves zero (minisign checks it only on a password-protected
/// key); a damaged key still fails, as a signature its own public key
/// refuses (`minisign::sign` checks that).
fn read_secret_key(path: &Path) -> anyhow::Result<SecretKey> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read the secret key {} (make one with `berth plugin keygen`)",
            path.display()
        )
    })?;
    let not_a_key = |why: &dyn std::fmt::Display| {
        anyhow::anyhow!("{}: not a minisign secret key ({why})", path.display())
    };
    let line = text.lines().nth(1).unwrap_or_default().trim();
    let bytes = Base64::decode_to_vec(line, None).map_err(|e| not_a_key(&e))?;
    let sk = SecretKey::from_bytes(&bytes).map_err(|e| not_a_key(&e))?;
    anyhow::ensure!(
        !sk.is_encrypted(),
        "{}: encrypted keys are not supported; make one with `minisign -G -W` or `berth plugin keygen`",
        path.display()
    );
    Ok(sk)
}

/// `path` with `suffix` added to its file name: `a.wasm` → `a.wasm.sig`.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Writes a file that must not exist yet, with `mode`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Signers, TrustedKey, Verdict};

    /// Written by the minisign tool (0.11): `minisign -G -W`, its public
    /// key, and `minisign -G` with the password "pw". Test keys only.
    const UNENCRYPTED: &str = "untrusted comment: minisign encrypted secret key
RWQAAEIyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAZkZSzlSaDLO5YBDzzIR5Pmeq8COutSXuOczA62xF3ITZgqsywZ/eLgUJrxe6bDt3p0Iiq+Uwf5JFK7Jq9wpviZ1ROsDe6Vy/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
";
    const UNENCRYPTED_PUBLIC: &str = "RWRmRlLOVJoMswUJrxe6bDt3p0Iiq+Uwf5JFK7Jq9wpviZ1ROsDe6Vy/";
    const ENCRYPTED: &str = "untrusted comment: minisign encrypted secret key
RWRTY0Iy6u+AcrL3S5LbDATHnUTzdLg9P8RlLpg8EGhYJp2Ly8oAAAACAAAAAAAAAEAAAAAAFaCFhSNo6moczMzkQabER8IXnM7U4VYpEtvP4Q1CwQg+dcPBHqFmQtQ6po49gA6KM6O0lT6QDs+RhfypA+NQZ+6rVrEUUKMf16VlXaF27uu0dCpRGyPgjztbNoXraDnfB4W8mG1w2Is=
";

    #[test]
    fn keys_the_minisign_tool_wrote_sign_or_are_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let wasm = dir.path().join("p.wasm");
        std::fs::write(&wasm, b"\0asm\x0d\0\x01\0 the plugin").unwrap();
        let key = |text: &str| {
            let path = dir.path().join("k");
            std::fs::write(&path, text).unwrap();
            path
        };

        // Its checksum is zero (minisign writes none without a password).
        sign(&SignArgs {
            file: wasm.clone(),
            key: key(UNENCRYPTED),
            out: None,
        })
        .unwrap();
        let signature = std::fs::read_to_string(dir.path().join("p.wasm.sig")).unwrap();
        let signers =
            Signers::new(vec![TrustedKey::parse(UNENCRYPTED_PUBLIC).unwrap()], true).unwrap();
        let bytes = std::fs::read(&wasm).unwrap();
        assert_eq!(
            signers.check("p", &bytes, Some(&signature)),
            Ok(Verdict::Trusted {
                key_id: "B30C9A54CE524666".into()
            })
        );

        let refused = |text: &str| {
            let path = key(text);
            let err = read_secret_key(&path).unwrap_err().to_string();
            err.strip_prefix(&format!("{}: ", path.display()))
                .unwrap_or(&err)
                .to_string()
        };
        assert_eq!(
            refused(ENCRYPTED),
            "encrypted keys are not supported; make one with `minisign -G -W` or `berth plugin keygen`"
        );
        let public_key_file =
            format!("untrusted comment: minisign public key\n{UNENCRYPTED_PUBLIC}\n");
        assert!(
            refused(&public_key_file).starts_with("not a minisign secret key ("),
            "{}",
            refused(&public_key_file)
        );
        assert!(refused("").starts_with("not a minisign secret key ("));
    }
}

//! API tokens: who may call the API, and with what role. A token file
//! holds `name role sha256-of-token` lines, so it holds no secret; a
//! presented token is hashed and compared with every entry in constant
//! time. `BERTH_API_TOKEN` adds one token for the single-operator case.
//! Knows nothing of HTTP: `http::auth` asks it who a bearer is.

use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do. Ordered: each role may do what the ones before it
/// may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// GET endpoints and the event stream.
    Read,
    /// Register, deploy, cancel, delete.
    Deploy,
    /// Everything, including the deployer catalog (push, remove, roll
    /// back).
    Admin,
}

impl Role {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Role::Read),
            "deploy" => Some(Role::Deploy),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// What the role allows, for a refusal.
    pub fn may(self) -> &'static str {
        match self {
            Role::Read => "only read",
            Role::Deploy => "register, deploy, cancel and delete, but not change the deployers",
            Role::Admin => "do everything",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Deploy => "deploy",
            Role::Admin => "admin",
        }
    }
}

/// Who made a request: the name of the token it carried, and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

/// One accepted token, known by its hash.
#[derive(Clone)]
struct Entry {
    caller: Caller,
    sha256: [u8; 32],
}

/// The name `BERTH_API_TOKEN`'s token is recorded under.
pub const ENV_TOKEN_NAME: &str = "BERTH_API_TOKEN";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("cannot read the API tokens file {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{path}:{line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    #[error(
        "BERTH_API_TOKEN is too short: use at least {MIN_TOKEN_CHARS} characters (`berth token new NAME` makes one)"
    )]
    ShortEnvToken,
}

/// A token shorter than this is refused: it could be guessed.
const MIN_TOKEN_CHARS: usize = 16;

/// Names are what `created_by` records and logs show.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'))
}

/// The accepted tokens: the file's, and `BERTH_API_TOKEN`'s. The file is
/// read again when it changes, so a token is added or revoked without a
/// restart.
pub struct Tokens {
    file: Option<PathBuf>,
    env: Option<Entry>,
    current: RwLock<Loaded>,
}

struct Loaded {
    entries: Vec<Entry>,
    /// What the file looked like when read: a change means read it again.
    seen: Option<FileState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileState {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

fn file_state(path: &Path) -> Option<FileState> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileState {
        modified: meta.modified().ok(),
        len: meta.len(),
        ino: meta.ino(),
    })
}

impl Tokens {
    /// The tokens of `file` and `env_token`; `None` if neither is given
    /// (then the API is open, and only served on loopback).
    pub fn load(file: Option<&Path>, env_token: Option<&str>) -> Result<Option<Self>, Error> {
        if file.is_none() && env_token.is_none() {
            return Ok(None);
        }
        let env = match env_token {
            Some(token) if token.chars().count() < MIN_TOKEN_CHARS => {
                return Err(Error::ShortEnvToken);
            }
            Some(token) => Some(Entry {
                caller: Caller {
                    name: ENV_TOKEN_NAME.into(),
                    role: Role::Admin,
                },
                sha256: Sha256::digest(token.as_bytes()).into(),
            }),
            None => None,
        };
        let (entries, seen) = match file {
            Some(path) => (read_file(path)?, file_state(path)),
            None => (Vec::new(), None),
        };
        Ok(Some(Self {
            file: file.map(Path::to_path_buf),
            env,
            current: RwLock::new(Loaded { entries, seen }),
        }))
    }

    /// Who `token` belongs to, if anyone. Every entry is compared, in
    /// constant time, so timing tells nothing about which one matched.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let current = self.current.read().expect("tokens lock");
        let mut found = None;
        for entry in current.entries.iter().chain(&self.env) {
            if bool::from(entry.sha256.ct_eq(&presented)) {
                found = Some(entry.caller.clone());
            }
        }
        found
    }

    /// Reads the file again if it changed since it was last read. A file
    /// that became unreadable or wrong keeps the tokens it had: the error
    /// is returned for the log, and nobody is locked out by a typo.
    pub fn reload(&self) -> Result<bool, Error> {
        let Some(path) = &self.file else {
            return Ok(false);
        };
        let state = file_state(path);
        if state == self.current.read().expect("tokens lock").seen {
            return Ok(false);
        }
        let read = read_file(path);
        let mut current = self.current.write().expect("tokens lock");
        current.seen = state;
        current.entries = read?;
        Ok(true)
    }

    /// How many tokens are accepted now.
    pub fn len(&self) -> usize {
        self.current.read().expect("tokens lock").entries.len() + usize::from(self.env.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
}

fn read_file(path: &Path) -> Result<Vec<Entry>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Unreadable {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(&text).map_err(|(line, reason)| Error::Line {
        path: path.display().to_string(),
        line,
        reason,
    })
}

/// The entries of a token file; a bad line is refused with its number.
fn parse(text: &str) -> Result<Vec<Entry>, (usize, String)> {
    let mut entries: Vec<Entry> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line_no = number + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, role, sha256] = fields[..] else {
            return Err((
                line_no,
                format!(
                    "expected `NAME ROLE SHA256` (three fields), found {}; `berth token new NAME --role ROLE` prints a line",
                    fields.len()
                ),
            ));
        };
        if !valid_name(name) {
            return Err((
                line_no,
                format!("token name {name:?}: use 1 to 64 letters, digits, `_`, `-`, `.` or `@`"),
            ));
        }
        let role = Role::parse(role).ok_or_else(|| {
            (
                line_no,
                format!("role {role:?} is not one of read, deploy, admin"),
            )
        })?;
        let digest = hex::decode(sha256)
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .ok_or_else(|| {
                (
                    line_no,
                    "the third field must be the token's sha256 in hex (64 characters), not the token itself".to_string(),
                )
            })?;
        if entries.iter().any(|e| e.caller.name == name) {
            return Err((line_no, format!("token name {name:?} is used twice")));
        }
        entries.push(Entry {
            caller: Caller {
                name: name.into(),
                role,
            },
            sha256: digest,
        });
    }
    Ok(entries)
}

/// A fresh token and the token-file line that accepts it.
pub fn new_token(name: &str, role: Role) -> Result<(String, String), String> {
    if !valid_name(name) {
        return Err(format!(
            "token name {name:?}: use 1 to 64 letters, digits, `_`, `-`, `.` or `@`"
        ));
    }
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("cannot get random bytes: {e}"))?;
    let token = format!("berth_{}", hex::encode(secret));
    let line = format!(
        "{name} {} {}",
        role.as_str(),
        hex::encode(Sha256::digest(token.as_bytes()))
    );
    Ok((token, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_for(name: &str, role: &str, token: &str) -> String {
        format!("{name} {role} {}", hex::encode(Sha256::digest(token)))
    }

    #[test]
    fn token_file_lines_are_read_or_refused_with_their_number() {
        let good = line_for("ci", "deploy", "t1");
        // (file, Ok(names) | Err((line, fragment of the reason)))
        /// The names read, or the refused line and a fragment of why.
        type Expected = Result<Vec<&'static str>, (usize, &'static str)>;
        let cases: Vec<(String, Expected)> = vec![
            (format!("# comment\n\n{good}\n"), Ok(vec!["ci"])),
            (
                format!("{good}\n{}", line_for("viewer", "read", "t2")),
                Ok(vec!["ci", "viewer"]),
            ),
            ("ci deploy".into(), Err((1, "three fields"))),
            (
                format!("\n{}", line_for("ci", "owner", "t")),
                Err((2, "role \"owner\" is not one of read, deploy, admin")),
            ),
            (
                "ci read berth_secret".into(),
                Err((1, "not the token itself")),
            ),
            (
                line_for("bad name!", "read", "t").replace("bad name!", "bad!"),
                Err((1, "token name \"bad!\"")),
            ),
            (
                format!("{good}\n{}", line_for("ci", "read", "t2")),
                Err((2, "used twice")),
            ),
        ];
        for (file, expected) in cases {
            match (parse(&file), expected) {
                (Ok(entries), Ok(names)) => {
                    let got: Vec<&str> = entries.iter().map(|e| e.caller.name.as_str()).collect();
                    assert_eq!(got, names, "{file}");
                }
                (Err((line, reason)), Err((want_line, fragment))) => {
                    assert_eq!(line, want_line, "{file}: {reason}");
                    assert!(reason.contains(fragment), "{file}: {reason}");
                }
                (got, expected) => panic!(
                    "{file}: got {:?}, expected {expected:?}",
                    got.map(|e| e.len())
                ),
            }
        }
    }

    #[test]
    fn a_token_is_known_by_its_hash_and_its_role_comes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        let (token, line) = new_token("ci", Role::Deploy).unwrap();
        std::fs::write(&file, format!("{line}\n")).unwrap();
        let tokens = Tokens::load(Some(&file), Some("an-operator-token-1"))
            .unwrap()
            .unwrap();
        assert_eq!(
            tokens.caller(&token),
            Some(Caller {
                name: "ci".into(),
                role: Role::Deploy
            })
        );
        assert_eq!(
            tokens.caller("an-operator-token-1").map(|c| c.role),
            Some(Role::Admin)
        );
        assert_eq!(tokens.caller("berth_wrong"), None);
        assert_eq!(tokens.caller(&token[..token.len() - 1]), None);
        assert!(!std::fs::read_to_string(&file).unwrap().contains(&token));
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_old_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, line_for("one", "read", "token-one")).unwrap();
        let tokens = Tokens::load(Some(&file), None).unwrap().unwrap();
        assert!(!tokens.reload().unwrap(), "unchanged");

        std::fs::write(&file, line_for("two", "deploy", "token-two-longer")).unwrap();
        assert!(tokens.reload().unwrap());
        assert_eq!(tokens.caller("token-one"), None, "revoked");
        assert!(tokens.caller("token-two-longer").is_some());

        std::fs::write(&file, "two deploy not-a-hash").unwrap();
        let error = tokens.reload().unwrap_err().to_string();
        assert!(error.ends_with(":1: the third field must be the token's sha256 in hex (64 characters), not the token itself"), "{error}");
        assert!(
            tokens.caller("token-two-longer").is_some(),
            "a broken file locks nobody out"
        );
    }

    #[test]
    fn no_tokens_means_none_and_a_short_env_token_is_refused() {
        assert!(Tokens::load(None, None).unwrap().is_none());
        assert_eq!(
            Tokens::load(None, Some("short")).err(),
            Some(Error::ShortEnvToken)
        );
        let missing = Tokens::load(Some(Path::new("/nonexistent/tokens")), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            missing.starts_with("cannot read the API tokens file /nonexistent/tokens"),
            "{missing}"
        );
    }
}

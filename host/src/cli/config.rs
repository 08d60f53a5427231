//! The configuration file (`--config berth.toml`, env `BERTH_CONFIG`): every
//! setting of `berth serve`, under its flag's name in snake case
//! (`fetch_connections = 16`). It slots in below flags and environment and
//! above the built-in defaults: each value in the file becomes that flag's
//! default before the command line is parsed, so precedence is clap's own
//! (flag > env > default) and a new flag is a config key without a line of
//! its own. A flag that may be repeated takes a list (`trusted_key =
//! ["RW…", "RW…"]`), handed to clap as one value split at its delimiter. `berth config` prints the effective settings and where each
//! came from, secrets redacted, and the publishing targets of the sources
//! file (`crate::targets`) with names only.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};

use super::serve::ServeArgs;
use crate::targets::Targets;

/// `berth config`: serve's settings, and what to print of them.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Print the reference of every setting (flag, environment variable,
    /// config key, default, help) as the book's Markdown page
    /// docs/src/operating/reference.md, instead of the effective settings.
    #[arg(long)]
    pub reference: bool,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The subcommands that take `berth serve`'s settings.
pub const SUBCOMMANDS: [&str; 2] = ["serve", "config"];

/// Settings whose values are never printed.
const SECRETS: [&str; 2] = ["webhook_secret", "api_token"];

/// One setting from the file: its value as the command line would spell
/// it, and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub value: String,
    pub line: usize,
}

/// A read configuration file.
#[derive(Debug, Default)]
pub struct File {
    pub path: PathBuf,
    pub settings: BTreeMap<String, Setting>,
}

/// The config file named by `--config FILE` / `--config=FILE` in `argv`
/// after one of `SUBCOMMANDS`, else by `BERTH_CONFIG`.
pub fn named(argv: &[OsString]) -> Option<PathBuf> {
    let after = argv
        .iter()
        .position(|a| SUBCOMMANDS.iter().any(|s| a == s))?;
    let mut args = argv[after + 1..].iter();
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("BERTH_CONFIG").map(PathBuf::from)
}

/// Reads `path`, refusing keys `berth serve` does not have and values its
/// flags would refuse, each with the file's line.
pub fn read(path: &Path) -> anyhow::Result<File> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the config file {}: {e}", path.display()))?;
    let settings = parse(&text).map_err(|(line, reason)| match line {
        Some(line) => anyhow::anyhow!("{}:{line}: {reason}", path.display()),
        None => anyhow::anyhow!("{}: {reason}", path.display()),
    })?;
    Ok(File {
        path: path.to_path_buf(),
        settings,
    })
}

type Refusal = (Option<usize>, String);

fn parse(text: &str) -> Result<BTreeMap<String, Setting>, Refusal> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let table: BTreeMap<toml::Spanned<String>, toml::Spanned<toml::Value>> = toml::from_str(text)
        .map_err(|e| {
        let line = e.span().map(|span| line_of(span.start));
        (line, format!("not valid TOML: {}", e.message()))
    })?;
    let serve = serve_command();
    let mut settings = BTreeMap::new();
    for (key, value) in table {
        let line = line_of(key.span().start);
        let key = key.into_inner();
        let arg = serve
            .get_arguments()
            .find(|a| a.get_id() == key.as_str() && a.get_long().is_some())
            .filter(|_| key != "config");
        let Some(arg) = arg else {
            return Err((Some(line), unknown(&key, &serve)));
        };
        let value = match (value.into_inner(), list_delimiter(arg)) {
            (toml::Value::String(s), _) => s,
            (toml::Value::Integer(i), _) => i.to_string(),
            (toml::Value::Float(f), _) => f.to_string(),
            (toml::Value::Boolean(b), _) => b.to_string(),
            (toml::Value::Array(items), Some(delimiter)) => {
                let mut values = Vec::new();
                for item in items {
                    match item {
                        toml::Value::String(s) if !s.contains(delimiter) && !s.is_empty() => {
                            values.push(s)
                        }
                        _ => {
                            return Err((
                                Some(line),
                                format!("{key} must be a list of strings without {delimiter:?}"),
                            ));
                        }
                    }
                }
                // An empty list sets nothing: the flag's own default.
                if values.is_empty() {
                    continue;
                }
                values.join(&delimiter.to_string())
            }
            _ => {
                return Err((
                    Some(line),
                    format!("{key} must be a single value (a string, number or true/false)"),
                ));
            }
        };
        check(&serve, arg, &value)
            .map_err(|reason| (Some(line), format!("{key} = {value:?}: {reason}")))?;
        settings.insert(key, Setting { value, line });
    }
    Ok(settings)
}

/// The delimiter clap splits a repeatable flag's values at, which a list
/// in the file is joined with; `None` for a flag of one value.
fn list_delimiter(arg: &clap::Arg) -> Option<char> {
    matches!(arg.get_action(), clap::ArgAction::Append)
        .then(|| arg.get_value_delimiter())
        .flatten()
}

/// Whether `serve` would take `value` for `arg` on its command line.
fn check(serve: &Command, arg: &clap::Arg, value: &str) -> Result<(), String> {
    let long = arg.get_long().unwrap_or_default();
    let mut probe = vec!["serve".to_string()];
    if arg.get_action().takes_values() {
        probe.push(format!("--{long}={value}"));
    } else {
        match value {
            "true" => probe.push(format!("--{long}")),
            "false" => {}
            _ => return Err(format!("--{long} is on or off: write true or false")),
        }
    }
    // Without the environment: only this value is on trial.
    serve
        .clone()
        .mut_args(|arg| arg.env(clap::builder::Resettable::Reset))
        .try_get_matches_from(probe)
        .map(drop)
        .map_err(|e| {
            // clap's own first line: "error: invalid value '0' for '--x <X>': why".
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            first.trim_start_matches("error: ").to_string()
        })
}

/// The sentence for a key `serve` has no flag for, with the nearest one.
fn unknown(key: &str, serve: &Command) -> String {
    let known: Vec<&str> = serve
        .get_arguments()
        .filter(|a| a.get_long().is_some() && a.get_id() != "config")
        .map(|a| a.get_id().as_str())
        .collect();
    let nearest = known
        .iter()
        .map(|k| (strsim::levenshtein(key, k), *k))
        .min()
        .filter(|(d, _)| *d <= 3)
        .map(|(_, k)| format!(" (did you mean {k}?)"))
        .unwrap_or_default();
    format!(
        "unknown setting {key:?}{nearest}; settings are `berth serve`'s flags in snake case: {}",
        known.join(", ")
    )
}

pub(super) fn serve_command() -> Command {
    ServeArgs::augment_args(Command::new("serve"))
}

/// `command` with the file's values as the defaults of `SUBCOMMANDS`'
/// flags.
pub fn with_defaults(command: Command, file: &File) -> Command {
    SUBCOMMANDS.iter().fold(command, |command, name| {
        command.mut_subcommand(*name, |mut sub| {
            for (key, setting) in &file.settings {
                let value = setting.value.clone();
                sub = sub.mut_arg(key.as_str(), |arg| arg.default_value(value));
            }
            sub
        })
    })
}

/// `berth config`: every setting with its effective value and where it
/// came from, as a config file would say it; then the publishing targets
/// of the sources file, redacted. A sources file `serve` would refuse is
/// refused here with the same sentence.
pub fn describe(matches: &ArgMatches, file: Option<&File>) -> anyhow::Result<String> {
    let serve = serve_command();
    let mut lines = Vec::new();
    if let Some(file) = file {
        lines.push(format!(
            "# berth serve's settings; file {}",
            file.path.display()
        ));
    } else {
        lines.push("# berth serve's settings; no config file (--config, BERTH_CONFIG)".into());
    }
    for arg in serve.get_arguments().filter(|a| a.get_long().is_some()) {
        let id = arg.get_id().as_str();
        if id == "config" {
            continue;
        }
        let values: Vec<String> = matches
            .get_raw(id)
            .map(|values| values.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let value = match (values.first(), list_delimiter(arg)) {
            // Flags set to false, and options nobody set.
            (None, _) => None,
            (Some(_), _) if SECRETS.contains(&id) => Some("\"(redacted)\"".to_string()),
            (Some(_), Some(_)) => Some(toml_list(&values)),
            (Some(url), None) if id == "database_url" => {
                Some(toml_value(&super::serve::redact(url)))
            }
            (Some(value), None) => Some(toml_value(value)),
        };
        let env = arg
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_default();
        let from = match matches.value_source(id) {
            Some(ValueSource::CommandLine) => format!("flag --{}", arg.get_long().unwrap_or(id)),
            Some(ValueSource::EnvVariable) => format!("env {env}"),
            Some(ValueSource::DefaultValue) => match file.and_then(|f| f.settings.get(id)) {
                Some(setting) => format!(
                    "file {}:{}",
                    file.map(|f| f.path.display().to_string())
                        .unwrap_or_default(),
                    setting.line
                ),
                None => "default".into(),
            },
            _ => "default".into(),
        };
        let line = match value {
            None => format!("# {id} is not set"),
            Some(value) => format!("{id} = {value}"),
        };
        lines.push(format!("{line:<48} # {from}"));
    }
    if let Some(path) = matches.get_one::<PathBuf>("sources_file") {
        let targets = Targets::load(path)?;
        let file = path.display().to_string();
        lines.push(String::new());
        if targets.is_empty() {
            lines.push(format!(
                "# no publishing targets in the sources file {file}"
            ));
        } else {
            lines.push(format!(
                "# publishing targets, from the sources file {file} (values redacted)"
            ));
            lines.push(targets.describe(&file));
        }
        let mlflow = crate::mlflow::Servers::load(path)?;
        if !mlflow.is_empty() {
            lines.push(String::new());
            lines.push(format!(
                "# MLflow tracking servers followed, from the sources file {file} (secrets redacted)"
            ));
            lines.push(mlflow.describe());
        }
    }
    Ok(lines.join("\n") + "\n")
}

/// A repeatable flag's values as a TOML list of strings.
fn toml_list(values: &[String]) -> String {
    toml::Value::Array(values.iter().cloned().map(toml::Value::String).collect()).to_string()
}

/// A value as TOML writes it: numbers and booleans bare, the rest quoted.
fn toml_value(value: &str) -> String {
    if value.parse::<i64>().is_ok() || value == "true" || value == "false" {
        value.to_string()
    } else {
        toml::Value::String(value.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_read_or_refused_with_their_line() {
        // (file, Ok(key, value, line) of the first setting | Err(line, fragment))
        /// The first setting read (key, value, line), or the refused line
        /// and a fragment of why.
        type Expected = Result<(&'static str, &'static str, usize), (Option<usize>, &'static str)>;
        let cases: &[(&str, Expected)] = &[
            (
                "listen = \"0.0.0.0:7878\"\n",
                Ok(("listen", "0.0.0.0:7878", 1)),
            ),
            (
                "\n# c\nfetch_connections = 16\n",
                Ok(("fetch_connections", "16", 3)),
            ),
            (
                "insecure_no_auth = true",
                Ok(("insecure_no_auth", "true", 1)),
            ),
            (
                "listen = \"a\"\nlisen = \"b\"",
                Err((Some(2), "unknown setting \"lisen\" (did you mean listen?)")),
            ),
            (
                "[server]\nlisten = \"a\"",
                Err((Some(1), "unknown setting \"server\"")),
            ),
            (
                "config = \"other.toml\"",
                Err((Some(1), "unknown setting \"config\"")),
            ),
            (
                "fetch_connections = 0",
                Err((
                    Some(1),
                    "fetch_connections = \"0\": invalid value '0' for '--fetch-connections <FETCH_CONNECTIONS>': 0 is not in 1..=64",
                )),
            ),
            (
                "timeout_s = \"soon\"",
                Err((Some(1), "timeout_s = \"soon\": invalid value")),
            ),
            (
                "listen = [1]",
                Err((Some(1), "listen must be a single value")),
            ),
            ("listen = ", Err((Some(1), "not valid TOML"))),
            (
                "trusted_key = [\"RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3\", \"RWRzq51bKcS8oJvZ4xEm+nRvGYPdsNRD3ciFPu1YJEL8Bl/3daWaj72r\"]",
                Ok((
                    "trusted_key",
                    "RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3,RWRzq51bKcS8oJvZ4xEm+nRvGYPdsNRD3ciFPu1YJEL8Bl/3daWaj72r",
                    1,
                )),
            ),
            (
                "trusted_key = \"RWRzq51bKcS8oJvZ4xEm+nRvGYPdsNRD3ciFPu1YJEL8Bl/3daWaj72r\"",
                Ok((
                    "trusted_key",
                    "RWRzq51bKcS8oJvZ4xEm+nRvGYPdsNRD3ciFPu1YJEL8Bl/3daWaj72r",
                    1,
                )),
            ),
            (
                "trusted_key = [\"RWQnotakey\"]",
                Err((
                    Some(1),
                    "trusted_key = \"RWQnotakey\": invalid value 'RWQnotakey' for '--trusted-key <KEY>': \"RWQnotakey\" is not a minisign public key",
                )),
            ),
            (
                "trusted_key = [1]",
                Err((Some(1), "trusted_key must be a list of strings without ','")),
            ),
            ("require_signed = true", Ok(("require_signed", "true", 1))),
        ];
        for (text, expected) in cases {
            match (parse(text), expected) {
                (Ok(settings), Ok((key, value, line))) => {
                    let setting = &settings[*key];
                    assert_eq!(
                        (setting.value.as_str(), setting.line),
                        (*value, *line),
                        "{text}"
                    );
                }
                (Err((line, reason)), Err((want_line, fragment))) => {
                    assert_eq!(line, *want_line, "{text}: {reason}");
                    assert!(reason.contains(fragment), "{text}: {reason}");
                }
                (got, _) => panic!("{text}: got {got:?}"),
            }
        }
    }

    #[test]
    fn the_config_file_is_found_after_the_subcommand() {
        let argv = |args: &[&str]| args.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            named(&argv(&["berth", "serve", "--config", "a.toml"])),
            Some("a.toml".into())
        );
        assert_eq!(
            named(&argv(&[
                "berth",
                "config",
                "--listen",
                "x",
                "--config=b.toml"
            ])),
            Some("b.toml".into())
        );
    }
}

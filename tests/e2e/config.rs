//! The config file: `berth config` shows each setting's effective value and
//! its source across all four (flag > environment > file > default), with
//! secrets redacted; a wrong file is refused with its line; and `berth
//! serve --config` runs with the file's settings.

use std::process::Command;

use reqwest::StatusCode;

use berth::auth::{Role, new_token};

use crate::support::server::{Backend, Berth};

/// `berth ARGS` with the given environment and none of berth's own.
fn berth(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    for (name, _) in std::env::vars() {
        if name.starts_with("BERTH_") {
            command.env_remove(name);
        }
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// The line of `berth config`'s output that sets `key`.
#[track_caller]
fn setting<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} ")))
        .unwrap_or_else(|| panic!("no line for {key} in:\n{out}"))
}

#[test]
fn each_setting_comes_from_the_strongest_source_and_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        "# the team's settings\n\
         data_dir = \"/srv/berth\"\n\
         fetch_connections = 12\n\
         timeout_s = 60\n\
         webhook_secret = \"file-secret-value\"\n\
         database_url = \"postgres://berth:file-password@db.internal/berth\"\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let run = berth(
        &["config", "--config", path, "--fetch-connections", "3"],
        &[
            ("BERTH_TIMEOUT_S", "77"),
            ("BERTH_WEBHOOK_SECRET", "env-secret-value"),
        ],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out = String::from_utf8_lossy(&run.stdout);
    let expect = |key: &str, value: &str, source: &str| {
        let line = setting(&out, key);
        assert!(
            line.starts_with(&format!("{key} = {value} "))
                && line.ends_with(&format!("# {source}")),
            "{key}: {line}"
        );
    };
    expect("fetch_connections", "3", "flag --fetch-connections");
    expect("timeout_s", "77", "env BERTH_TIMEOUT_S");
    expect("data_dir", "\"/srv/berth\"", &format!("file {path}:2"));
    expect("memory_mib", "512", "default");
    expect(
        "webhook_secret",
        "\"(redacted)\"",
        "env BERTH_WEBHOOK_SECRET",
    );
    expect(
        "database_url",
        "\"postgres://berth:***@db.internal/berth\"",
        &format!("file {path}:6"),
    );
    assert!(setting(&out, "webhook_url").starts_with("# webhook_url is not set"));
    for secret in ["file-secret-value", "env-secret-value", "file-password"] {
        assert!(!out.contains(secret), "{secret} printed:\n{out}");
    }

    // BERTH_CONFIG names the file as --config does.
    let run = berth(&["config"], &[("BERTH_CONFIG", path)]);
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(setting(&out, "fetch_connections").starts_with("fetch_connections = 12 "));
}

#[test]
fn a_wrong_config_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.toml");
    let path = file.to_str().unwrap();
    for (text, expected) in [
        (
            "listen = \"127.0.0.1:7878\"\nmax_deployer = 3\n",
            format!("{path}:2: unknown setting \"max_deployer\" (did you mean max_deployers?)"),
        ),
        (
            "memory_mib = \"lots\"\n",
            format!("{path}:1: memory_mib = \"lots\": invalid value 'lots' for '--memory-mib"),
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        for command in ["config", "serve"] {
            let run = berth(&[command, "--config", path], &[]);
            assert_eq!(run.status.code(), Some(2), "{command}: {text}");
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert!(stderr.contains(&expected), "{command}: {stderr}");
        }
    }
    let run = berth(&["serve", "--config", "/nonexistent/berth.toml"], &[]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&run.stderr)
            .contains("cannot read the config file /nonexistent/berth.toml"),
    );
}

#[tokio::test]
async fn the_server_runs_with_the_config_files_settings() {
    let dir = tempfile::tempdir().unwrap();
    let (token, line) = new_token("ops", Role::Read).unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{line}\n")).unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        format!("api_tokens_file = {:?}\n", tokens.display().to_string()),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--config")
        .arg(file.to_str().unwrap())
        .start()
        .await;
    let (status, _) = berth.get("/v1/models").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the file's tokens are required"
    );
    let status = berth
        .client()
        .get(format!("{}/v1/models", berth.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn berth_config_shows_the_publishing_targets_by_name_only() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources.toml");
    let path = sources.to_str().unwrap();
    std::fs::write(
        &sources,
        "[[source]]\n\
         prefix = \"https://hub.internal/\"\n\
         \n\
         [[target]]\n\
         name = \"mirror\"\n\
         url = \"https://mirror.internal/base/\"\n\
         headers = { Authorization = \"Bearer ${TEST_MIRROR_TOKEN}\" }\n\
         max_gib = 20\n",
    )
    .unwrap();
    let run = berth(
        &["config", "--sources-file", path],
        &[("TEST_MIRROR_TOKEN", "header-secret-value")],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out = String::from_utf8_lossy(&run.stdout);
    let block: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("# publishing targets"))
        .map(str::trim_end)
        .collect();
    assert_eq!(
        block,
        [
            format!("# publishing targets, from the sources file {path} (values redacted)")
                .as_str(),
            format!("{:<48} # file {path}:4", "[[target]]").as_str(),
            "name = \"mirror\"",
            "url = \"https://mirror.internal/base/\"",
            "headers = { Authorization = \"(redacted)\" }",
            "max_gib = 20",
        ],
        "{out}"
    );
    assert!(!out.contains("header-secret-value"), "{out}");

    // A variable missing stops `config` as it stops `serve`, with the line.
    for command in ["config", "serve"] {
        let run = berth(&[command, "--sources-file", path], &[]);
        let code = if command == "config" { 2 } else { 1 };
        assert_eq!(run.status.code(), Some(code), "{command}");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            stderr.contains(&format!(
                "{path}:7: target \"mirror\": headers.Authorization: the host environment variable TEST_MIRROR_TOKEN is not set"
            )),
            "{command}: {stderr}"
        );
    }
}

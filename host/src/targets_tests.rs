use super::*;
use object_store::aws::AmazonS3ConfigKey;

fn env(name: &str) -> Option<String> {
    match name {
        "MIRROR_TOKEN" => Some("mirror-s3cret".to_string()),
        "RELEASES_SECRET" => Some("bucket-s3cret".to_string()),
        "REGISTRY_PASSWORD" => Some("registry-s3cret".to_string()),
        _ => None,
    }
}

const FILE: &str = r#"
[[source]]
prefix = "https://hub.internal/models/"

[[target]]
name = "releases"
url = "s3://team-releases/models/"
options = { endpoint = "http://127.0.0.1:9000", region = "us-east-1", secret_access_key = "${RELEASES_SECRET}" }
max_gib = 50

[[target]]
name = "mirror"
url = "https://mirror.internal/base/"
headers = { Authorization = "Bearer ${MIRROR_TOKEN}" }
call = { methods = ["post"], paths = ["/hooks/*"] }

[[target]]
name = "scratch"
url = "file:///srv/published/"

[[target]]
name = "registry"
url = "oci://Registry.Internal:5000/team/models/"
options = { username = "ci", password = "${REGISTRY_PASSWORD}" }
"#;

#[test]
fn targets_are_resolved_by_kind() {
    let targets = Targets::parse(FILE, "ops.toml", env).unwrap();
    let releases = targets.get("releases").unwrap();
    assert_eq!(releases.url().as_str(), "s3://team-releases/models/");
    assert_eq!(releases.max_bytes(), Some(50 << 30));
    let Kind::S3 { options } = releases.kind() else {
        panic!("{releases:?}")
    };
    assert!(options.contains(&(
        AmazonS3ConfigKey::SecretAccessKey,
        "bucket-s3cret".to_string()
    )));
    let mirror = targets.get("mirror").unwrap();
    let Kind::Http { headers, call } = mirror.kind() else {
        panic!("{mirror:?}")
    };
    assert_eq!(headers["authorization"], "Bearer mirror-s3cret");
    assert!(headers["authorization"].is_sensitive());
    let call = call.as_ref().unwrap();
    assert_eq!(call.said(), "POST at /hooks/*");
    assert!(call.allows(&http::Method::POST, "/hooks/a/b"));
    assert!(!call.allows(&http::Method::POST, "/hook"));
    assert!(!call.allows(&http::Method::GET, "/hooks/a"));
    let scratch = targets.get("scratch").unwrap();
    assert!(matches!(scratch.kind(), Kind::File));
    assert_eq!(scratch.max_bytes(), None);
    let registry = targets.get("registry").unwrap();
    let Kind::Oci {
        registry: host,
        namespace,
        login: Some(login),
    } = registry.kind()
    else {
        panic!("{registry:?}")
    };
    assert_eq!(
        (host.as_str(), namespace.as_str()),
        ("registry.internal:5000", "team/models")
    );
    assert_eq!(
        (login.username.as_str(), login.password.as_str()),
        ("ci", "registry-s3cret")
    );
    let top = Targets::parse(
        "[[target]]\nname = \"top\"\nurl = \"oci://127.0.0.1:5000/\"",
        "f",
        env,
    )
    .unwrap();
    let Kind::Oci {
        namespace, login, ..
    } = top.get("top").unwrap().kind()
    else {
        panic!()
    };
    assert_eq!((namespace.as_str(), login.is_none()), ("", true));
    assert!(targets.get("other").is_none());
    // No file, or one of sources only: no target.
    assert!(Targets::parse("", "f", env).unwrap().is_empty());
    assert!(
        Targets::parse("[[source]]\nprefix = \"s3://b/\"", "f", env)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn values_are_never_shown() {
    let targets = Targets::parse(FILE, "ops.toml", env).unwrap();
    let debug = format!("{targets:?}");
    let described = targets.describe("ops.toml");
    for shown in [&debug, &described, &targets.summary()] {
        for secret in [
            "mirror-s3cret",
            "bucket-s3cret",
            "registry-s3cret",
            "127.0.0.1:9000",
            "us-east-1",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
    assert!(debug.contains("Authorization = ***"), "{debug}");
    assert!(debug.contains("secret_access_key = ***"), "{debug}");
    let lines: Vec<&str> = described.lines().map(str::trim_end).collect();
    assert_eq!(
        lines,
        [
            format!("{:<48} # file ops.toml:5", "[[target]]").as_str(),
            "name = \"releases\"",
            "url = \"s3://team-releases/models/\"",
            "options = { endpoint = \"(redacted)\", region = \"(redacted)\", secret_access_key = \"(redacted)\" }",
            "max_gib = 50",
            format!("{:<48} # file ops.toml:11", "[[target]]").as_str(),
            "name = \"mirror\"",
            "url = \"https://mirror.internal/base/\"",
            "headers = { Authorization = \"(redacted)\" }",
            "call = { methods = [\"POST\"], paths = [\"/hooks/*\"] }",
            format!("{:<48} # file ops.toml:17", "[[target]]").as_str(),
            "name = \"scratch\"",
            "url = \"file:///srv/published/\"",
            format!("{:<48} # file ops.toml:21", "[[target]]").as_str(),
            "name = \"registry\"",
            "url = \"oci://Registry.Internal:5000/team/models/\"",
            "options = { password = \"(redacted)\", username = \"(redacted)\" }",
        ]
    );
}

#[test]
fn each_bad_target_is_refused_with_its_file_and_line() {
    let target = |body: &str| format!("[[target]]\nname = \"t\"\n{body}");
    #[rustfmt::skip]
    let cases = [
        (target("url = \"https://h/\"\nheaders = { A = \"${MISSING}\" }"),
         "f.toml:4: target \"t\": headers.A: the host environment variable MISSING is not set"),
        (target("url = \"s3://b/\"\noptions = { region = \"${MISSING}\" }"),
         "f.toml:4: target \"t\": options.region: the host environment variable MISSING is not set"),
        (target("url = \"https://h/\"\nheders = { A = \"b\" }"), "f.toml:4: unknown field `heders`"),
        ("[[targets]]\nname = \"t\"".to_string(), "unknown field `targets`"),
        ("[[target]]\nurl = \"https://h/\"".to_string(), "f.toml:1: missing field `name`"),
        ("[[target]]\nname = \"t\"".to_string(), "f.toml:1: missing field `url`"),
        ("[[target]]\nname = \"1st\"\nurl = \"https://h/\"".to_string(),
         "f.toml:2: target name \"1st\" is not a plain name"),
        ("[[target]]\nname = \"a.b\"\nurl = \"https://h/\"".to_string(), "target name \"a.b\" is not a plain name"),
        (format!("[[target]]\nname = \"{}\"\nurl = \"https://h/\"", "a".repeat(65)), "at most 64 characters"),
        (target("url = \"mirror.internal/\""), "f.toml:3: target \"t\": url \"mirror.internal/\" is not a URL"),
        (target("url = \"oci://registry.internal/Models/\""),
         "f.toml:3: target \"t\": url \"oci://registry.internal/Models/\": its namespace is a repository prefix, and the repository \"Models\" must be lowercase"),
        (target("url = \"oci://registry.internal/models\""), "must end with /"),
        (target("url = \"oci://r.io/\"\nheaders = { A = \"b\" }"),
         "f.toml:4: target \"t\": headers are for http and https targets; an oci target takes options username and password"),
        (target("url = \"oci://r.io/\"\noptions = { username = \"u\" }"),
         "f.toml:4: target \"t\": a registry login needs both options.username and options.password"),
        (target("url = \"oci://r.io/\"\noptions = { region = \"r\" }"),
         "options.region is not a registry option (username, password)"),
        (target("url = \"oci://r.io/\"\noptions = { username = \"u\", password = \"${MISSING}\" }"),
         "f.toml:4: target \"t\": options.password: the host environment variable MISSING is not set"),
        (target("url = \"ftp://h/\""), "scheme ftp is not a target kind"),
        (target("url = \"gs://b/m/\"\noptions = { skip_signature = \"true\" }"),
         "f.toml:4: target \"t\": options.skip_signature: write anonymous = true"),
        (target("url = \"gs://b/m/\"\noptions = { service_account_key = \"${MISSING}\" }"),
         "f.toml:4: target \"t\": options.service_account_key: the host environment variable MISSING is not set"),
        (target("url = \"az://a/\""), "f.toml:3: target \"t\": url \"az://a/\": the URL az://a/ names no container"),
        (target("url = \"az://a/c/\"\noptions = { use_emulator = \"true\" }"),
         "options.use_emulator: it signs with the emulator's built-in key"),
        (target("url = \"az://a/c/\"\nheaders = { A = \"b\" }"),
         "f.toml:4: target \"t\": headers are for http and https targets; a az target takes none"),
        (target("url = \"s3:///\""), "f.toml:3: target \"t\": url \"s3:///\" names no host (or bucket)"),
        (target("url = \"file://host/dir/\""), "a file target is a folder on this server, written file:///abs/dir/"),
        (target("url = \"https://h/base\""), "f.toml:3: target \"t\": url \"https://h/base\" must end with /"),
        (target("url = \"https://h/?a=b\""), "must not have a query"),
        (target("url = \"https://u:p@h/\""), "must not have a query, fragment or user name"),
        (target("url = \"https://h/\"\noptions = { region = \"r\" }"),
         "f.toml:4: target \"t\": options are for s3, gs, az and oci targets; a https target takes none"),
        (target("url = \"file:///d/\"\noptions = { region = \"r\" }"), "a file target takes none"),
        (target("url = \"s3://b/\"\nheaders = { A = \"b\" }"),
         "f.toml:4: target \"t\": headers are for http and https targets; a s3 target takes none"),
        (target("url = \"s3://b/\"\noptions = { endpoint_url_x = \"b\" }"),
         "f.toml:4: target \"t\": options.endpoint_url_x is not an S3 setting"),
        (target("url = \"s3://b/\"\noptions = { bucket = \"other\" }"), "the bucket comes from the target's url"),
        (target("url = \"https://h/\"\nheaders = { \"a b\" = \"c\" }"), "headers.a b is not a valid header name"),
        (target("url = \"https://h/\"\nheaders = { A = \"x\\ny\" }"), "headers.A: is not a valid header value"),
        (target("url = \"s3://b/\"\nmax_gib = 0"), "f.toml:4: target \"t\": max_gib = 0: must be between 1 and 1048576"),
        (target("url = \"s3://b/\"\nmax_gib = -1"), "max_gib = -1: must be between"),
        (target("url = \"s3://b/\"\nmax_gib = \"lots\""), "f.toml:4: invalid type"),
        (format!("{}\n{}", target("url = \"s3://b/\""), target("url = \"s3://c/\"")),
         "f.toml:4: target \"t\" is already defined on line 1: names are unique"),
    ];
    for (text, expected) in cases {
        let err = Targets::parse(&text, "f.toml", env).unwrap_err();
        assert!(err.contains(expected), "{text}\n=> {err}");
    }
    // Every problem at once, and no value quoted.
    let two = format!(
        "{}\n{}",
        target("url = \"https://h/\"\nheaders = { A = \"${X}\", B = \"${MIRROR_TOKEN}\\n\" }"),
        "[[target]]\nname = \"u\"\nurl = \"s3://b/\"\noptions = { token = \"${Y}\" }"
    );
    let err = Targets::parse(&two, "f.toml", env).unwrap_err();
    assert!(
        err.contains("f.toml:4: target \"t\": headers.A: the host environment variable X")
            && err.contains("headers.B: is not a valid header value")
            && err
                .contains("f.toml:8: target \"u\": options.token: the host environment variable Y"),
        "{err}"
    );
    assert!(!err.contains("mirror-s3cret"), "{err}");
}

#[test]
fn opening_a_target_needs_a_grant_and_the_servers_configuration() {
    let targets = Targets::parse(FILE, "ops.toml", env).unwrap();
    let granted = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    #[rustfmt::skip]
    let cases: [(&[&str], &str, Result<&str, &str>); 4] = [
        (&["releases"], "releases", Ok("s3://team-releases/models/")),
        (&[], "releases",
         Err("plugin pub: target \"releases\" is not granted to it (its manifest's targets: none)")),
        (&["mirror"], "releases",
         Err("plugin pub: target \"releases\" is not granted to it (its manifest's targets: mirror)")),
        (&["elsewhere"], "elsewhere",
         Err("plugin pub: target \"elsewhere\" is granted but this server does not configure it (its targets: releases, mirror, scratch, registry)")),
    ];
    for (grants, name, expected) in cases {
        let opened = targets
            .open("pub", &granted(grants), name)
            .map(|t| t.url().as_str());
        match expected {
            Ok(url) => assert_eq!(opened, Ok(url), "{name}"),
            Err(fragment) => {
                let err = opened.unwrap_err();
                assert!(err.starts_with(fragment), "{name}: {err}");
            }
        }
    }
}

#[test]
fn a_call_grant_is_checked_and_trace_and_connect_are_never_allowed() {
    let file = |call: &str, url: &str| {
        format!("[[target]]\nname = \"m\"\nurl = \"{url}\"\ncall = {call}\n")
    };
    for (call, url, expected) in [
        (
            r#"{ methods = ["TRACE"] }"#,
            "http://h/",
            "s.toml:4: target \"m\": call.methods: TRACE is never allowed (TRACE echoes the \
             request with its credentials; CONNECT tunnels past berth's gate)",
        ),
        (
            r#"{ methods = ["connect"] }"#,
            "http://h/",
            "s.toml:4: target \"m\": call.methods: connect is never allowed (TRACE echoes the \
             request with its credentials; CONNECT tunnels past berth's gate)",
        ),
        (
            r#"{ methods = ["FETCH"] }"#,
            "http://h/",
            "s.toml:4: target \"m\": call.methods: \"FETCH\" is not one of GET, HEAD, POST, PUT, \
             PATCH, DELETE, OPTIONS",
        ),
        (
            r#"{ methods = [] }"#,
            "http://h/",
            "s.toml:4: target \"m\": call.methods is empty: name the methods the deployer may \
             send (e.g. [\"POST\"]), or leave call out",
        ),
        (
            r#"{ methods = ["POST"], paths = ["hooks"] }"#,
            "http://h/",
            "s.toml:4: target \"m\": call.paths: \"hooks\" must start with / (the target's url)",
        ),
        (
            r#"{ methods = ["POST"], paths = ["/a/..;/b"] }"#,
            "http://h/",
            "s.toml:4: target \"m\": call.paths: \"/a/..;/b\": key \"a/..;/b\" has ';', which is \
             not allowed in a key (\\, ?, #, % and ; are refused)",
        ),
        (
            r#"{ methods = ["POST"] }"#,
            "s3://bucket/",
            "s.toml:4: target \"m\": call is for http and https targets: a deployer reaches a s3 \
             target through the publish interface only",
        ),
    ] {
        let text = file(call, url);
        assert_eq!(
            Targets::parse(&text, "s.toml", |_| None).unwrap_err(),
            expected,
            "{call}"
        );
    }
}

#[test]
fn a_targets_scrubber_knows_each_kind_of_credential() {
    let targets = Targets::parse(FILE, "ops.toml", env).unwrap();
    let all: Vec<String> = ["releases", "mirror", "scratch", "registry"]
        .map(String::from)
        .to_vec();
    let scrubber = targets.scrubber(&all);
    let text = "mirror-s3cret bucket-s3cret registry-s3cret Y2k6cmVnaXN0cnktczNjcmV0";
    assert_eq!(
        scrubber.text(text),
        "(redacted) (redacted) (redacted) (redacted)"
    );
    // Only the targets named.
    let mirror = targets.scrubber(&["mirror".to_string()]);
    assert_eq!(
        mirror.text(text),
        "(redacted) bucket-s3cret registry-s3cret Y2k6cmVnaXN0cnktczNjcmV0"
    );
    assert!(targets.scrubber(&["scratch".to_string()]).is_empty());
}

#[test]
fn cloud_targets_keep_their_keys_tokens_and_signatures_secret() {
    let text = "[[target]]\nname = \"g\"\nurl = \"gs://bucket/models/\"\n\
                options = { service_account_key = \"${GCS_KEY}\" }\n\
                [[target]]\nname = \"a\"\nurl = \"https://acct.blob.core.windows.net/models/ft/\"\n\
                options = { sas_token = \"${AZ_SAS}\" }\n\
                [[target]]\nname = \"k\"\nurl = \"az://acct/models/\"\n\
                options = { account_key = \"${AZ_KEY}\" }\n";
    let key_line = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7";
    let lookup = |var: &str| match var {
        "GCS_KEY" => Some(format!(
            "{{\"private_key\": \"-----BEGIN PRIVATE KEY-----\\n{key_line}\\n-----END PRIVATE KEY-----\\n\"}}"
        )),
        "AZ_SAS" => Some("sv=2024-11-04&ss=b&sig=c2lnbmF0dXJlLW9mLXRoZS1zYXM%3D".into()),
        "AZ_KEY" => Some("YWNjb3VudC1rZXktbm9ib2R5LWhhcw==".into()),
        _ => None,
    };
    let targets = Targets::parse(text, "ops.toml", lookup).unwrap();
    // The https:// form is the container's az:// target.
    assert_eq!(
        targets.get("a").unwrap().url().as_str(),
        "az://acct/models/ft/"
    );
    assert!(matches!(
        targets.get("a").unwrap().kind(),
        Kind::Azure { account, container, .. } if account == "acct" && container == "models"
    ));
    let all = ["g", "a", "k"].map(String::from).to_vec();
    let said = format!(
        "key {key_line}; url https://acct.blob.core.windows.net/models/x?sv=2024-11-04&ss=b\
         &sig=c2lnbmF0dXJlLW9mLXRoZS1zYXM%3D; account YWNjb3VudC1rZXktbm9ib2R5LWhhcw=="
    );
    let scrubbed = targets.scrubber(&all).text(&said).into_owned();
    for secret in [
        key_line,
        "c2lnbmF0dXJlLW9mLXRoZS1zYXM",
        "YWNjb3VudC1rZXktbm9ib2R5LWhhcw",
    ] {
        assert!(!scrubbed.contains(secret), "{scrubbed}");
    }
    let described = targets.describe("ops.toml");
    assert!(
        described.contains("options = { sas_token = \"(redacted)\" }"),
        "{described}"
    );
    assert!(!described.contains("sig="), "{described}");
}

//! The Google Cloud Storage and Azure Blob Storage clients berth builds,
//! beside `s3`'s: where a `gs://BUCKET/KEY`, `az://ACCOUNT/CONTAINER/KEY`
//! or `https://ACCOUNT.blob.core.windows.net/CONTAINER/KEY` URL points
//! (`Bucket::locate`), a store's settings (the environment's `GOOGLE_*` or
//! `AZURE_*` variables, then the sources file's options, then berth's
//! rules), and where its credential comes from, in words. **Never
//! anonymous unless the entry says `anonymous = true`**: the settings that
//! would make a client skip signing, or use an emulator's built-in key,
//! are refused in a file and ignored in the environment; with no
//! credential named, object_store's own chain is asked (application
//! default credentials, the metadata server or managed identity), and its
//! failure is a refusal naming the entry. Does no I/O but building clients.

use std::str::FromStr;
use std::time::Duration;

use object_store::ClientConfigKey;
use object_store::ClientOptions;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path as Key;

use crate::trust::Trust;

/// The store a URL names: an S3 bucket, a GCS bucket or an Azure account's
/// container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Bucket {
    S3(String),
    Gcs(String),
    Azure { account: String, container: String },
}

impl Bucket {
    /// Where `url` points, if it names an object store: the bucket, the URL
    /// as berth writes it (an Azure `https://` URL becomes its `az://`
    /// form, which credentials are matched against) and the object's key.
    pub(crate) fn locate(url: &url::Url) -> Option<Result<(Bucket, url::Url, Key), String>> {
        let host = url.host_str().unwrap_or_default();
        let azure_host = host.strip_suffix(".blob.core.windows.net");
        let kind = match (url.scheme(), azure_host) {
            ("s3", _) => "s3",
            ("gs", _) => "gs",
            ("az", _) => "az",
            ("https", Some(_)) => "https",
            _ => return None,
        };
        Some(Self::split(url, kind, host, azure_host))
    }

    fn split(
        url: &url::Url,
        kind: &str,
        host: &str,
        azure_host: Option<&str>,
    ) -> Result<(Bucket, url::Url, Key), String> {
        if host.is_empty() {
            return Err(format!("the URL {url} names no bucket"));
        }
        let key_of = |path: &str| {
            Key::from_url_path(path)
                .map_err(|e| format!("the URL {url} is not a valid object key: {e}"))
        };
        match kind {
            "s3" => Ok((Bucket::S3(host.into()), url.clone(), key_of(url.path())?)),
            "gs" => Ok((Bucket::Gcs(host.into()), url.clone(), key_of(url.path())?)),
            _ => {
                // Both forms' paths are `/CONTAINER/KEY`; the account is
                // the az:// host or the https:// host's first label.
                let account = azure_host.unwrap_or(host);
                let path = url.path();
                let (container, key) = path
                    .strip_prefix('/')
                    .and_then(|p| p.split_once('/'))
                    .filter(|(container, _)| !container.is_empty())
                    .ok_or_else(|| {
                        format!(
                            "the URL {url} names no container: write \
                             az://ACCOUNT/CONTAINER/KEY"
                        )
                    })?;
                let mut written = url::Url::parse(&format!("az://{account}{path}"))
                    .map_err(|e| format!("the URL {url} names no account: {e}"))?;
                written.set_query(url.query());
                let bucket = Bucket::Azure {
                    account: account.into(),
                    container: container.into(),
                };
                Ok((bucket, written, key_of(&format!("/{key}"))?))
            }
        }
    }
}

/// One `options` entry of a `gs://` prefix or target: an object_store GCS
/// setting, resolved; what the URL says or `anonymous` decides is refused.
pub(crate) fn gcs_option(option: &str, value: String) -> Result<(GoogleConfigKey, String), String> {
    match GoogleConfigKey::from_str(option) {
        Ok(GoogleConfigKey::Bucket) => Err(format!(
            "options.{option}: the bucket comes from the prefix's URL"
        )),
        Ok(GoogleConfigKey::SkipSignature) => Err(format!(
            "options.{option}: write anonymous = true for a bucket read without credentials"
        )),
        Ok(key) => Ok((key, value)),
        Err(_) => Err(format!(
            "options.{option} is not a Google Cloud Storage setting (object_store's \
             GoogleConfigKey: service_account, service_account_key, application_credentials, \
             base_url, …)"
        )),
    }
}

/// One `options` entry of an `az://` prefix or target: an object_store
/// Azure setting, resolved; what the URL says or `anonymous` decides is
/// refused.
pub(crate) fn azure_option(
    option: &str,
    value: String,
) -> Result<(AzureConfigKey, String), String> {
    match AzureConfigKey::from_str(option) {
        Ok(AzureConfigKey::AccountName | AzureConfigKey::ContainerName) => Err(format!(
            "options.{option}: the account and container come from the prefix's URL"
        )),
        Ok(AzureConfigKey::SkipSignature) => Err(format!(
            "options.{option}: write anonymous = true for a container read without credentials"
        )),
        Ok(AzureConfigKey::UseEmulator) => Err(format!(
            "options.{option}: it signs with the emulator's built-in key; give an emulator's \
             endpoint and account_key instead"
        )),
        Ok(key) => Ok((key, value)),
        Err(_) => Err(format!(
            "options.{option} is not an Azure Blob setting (object_store's AzureConfigKey: \
             account_key, sas_token, client_id, client_secret, tenant_id, \
             federated_token_file, endpoint, …)"
        )),
    }
}

/// Client options every cloud store berth builds starts from: `trust`'s
/// certificates, and no whole-request timeout (object_store's default of
/// 30 s, body included, would cut every large object; a fetch and a
/// publish have their own limits). An entry's options may set one.
fn client(trust: &Trust) -> object_store::Result<ClientOptions> {
    trust.object_store(ClientOptions::new().with_timeout(Duration::from_secs(24 * 3600)))
}

/// A few quick retries: an unreachable endpoint is reported in seconds,
/// not after object_store's default ten.
pub(crate) fn retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 4,
        retry_timeout: Duration::from_secs(180),
        ..object_store::RetryConfig::default()
    }
}

/// A GCS bucket's client settings: the environment's `GOOGLE_*` (less
/// `GOOGLE_SKIP_SIGNATURE`), then `options`, then skipping signatures only
/// if `anonymous`. A `base_url` written with http:// (an emulator) is
/// allowed.
pub(crate) fn gcs(
    bucket: &str,
    trust: &Trust,
    options: &[(GoogleConfigKey, String)],
    anonymous: bool,
) -> object_store::Result<GoogleCloudStorageBuilder> {
    let mut builder = GoogleCloudStorageBuilder::new().with_client_options(client(trust)?);
    for (name, value) in std::env::vars() {
        if let Some(key) = name
            .strip_prefix("GOOGLE_")
            .and_then(|_| name.to_ascii_lowercase().parse().ok())
            .filter(|key| *key != GoogleConfigKey::SkipSignature)
        {
            builder = builder.with_config(key, value);
        }
    }
    for (key, value) in options {
        builder = builder.with_config(*key, value);
    }
    if builder
        .get_config_value(&GoogleConfigKey::BaseUrl)
        .is_some_and(|url| url.starts_with("http://"))
    {
        builder = builder.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
    }
    Ok(builder
        .with_bucket_name(bucket)
        .with_skip_signature(anonymous)
        .with_retry(retries()))
}

/// An Azure container's client settings: the environment's `AZURE_*` (less
/// skipping signatures and the emulator's key), then `options`, then
/// skipping signatures only if `anonymous`. An `endpoint` written with
/// http:// (an emulator: `http://HOST:PORT/ACCOUNT`) is allowed.
pub(crate) fn azure(
    account: &str,
    container: &str,
    trust: &Trust,
    options: &[(AzureConfigKey, String)],
    anonymous: bool,
) -> object_store::Result<MicrosoftAzureBuilder> {
    let mut builder = MicrosoftAzureBuilder::new().with_client_options(client(trust)?);
    for (name, value) in std::env::vars() {
        if let Some(key) = name
            .strip_prefix("AZURE_")
            .and_then(|_| name.to_ascii_lowercase().parse().ok())
            .filter(|key| {
                !matches!(
                    key,
                    AzureConfigKey::SkipSignature
                        | AzureConfigKey::UseEmulator
                        | AzureConfigKey::AccountName
                        | AzureConfigKey::ContainerName
                )
            })
        {
            builder = builder.with_config(key, value);
        }
    }
    if let Ok(endpoint) = std::env::var("IDENTITY_ENDPOINT") {
        builder = builder.with_msi_endpoint(endpoint);
    }
    for (key, value) in options {
        builder = builder.with_config(*key, value);
    }
    if builder
        .get_config_value(&AzureConfigKey::Endpoint)
        .is_some_and(|url| url.starts_with("http://"))
    {
        builder = builder.with_config(AzureConfigKey::Client(ClientConfigKey::AllowHttp), "true");
    }
    Ok(builder
        .with_account(account)
        .with_container_name(container)
        .with_skip_signature(anonymous)
        .with_retry(retries()))
}

/// Where a GCS client's credential comes from, for messages: never its
/// value. `entry` is the sources file's prefix or target that set
/// `options`, if any.
pub(crate) fn gcs_credential(
    entry: Option<&str>,
    options: &[(GoogleConfigKey, String)],
    anonymous: bool,
) -> String {
    let named = |key: &GoogleConfigKey| {
        matches!(
            key,
            GoogleConfigKey::ServiceAccount
                | GoogleConfigKey::ServiceAccountKey
                | GoogleConfigKey::ApplicationCredentials
        )
    };
    let env = [
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ]
    .into_iter()
    .find(|name| std::env::var_os(name).is_some());
    described(
        entry,
        anonymous,
        options
            .iter()
            .any(|(key, _)| named(key))
            .then_some("the service account"),
        env,
        "the application default credentials file of gcloud, or the metadata server \
         (workload identity)",
    )
}

/// Where an Azure client's credential comes from, for messages: never its
/// value.
pub(crate) fn azure_credential(
    entry: Option<&str>,
    options: &[(AzureConfigKey, String)],
    anonymous: bool,
) -> String {
    let kind = |key: &AzureConfigKey| match key {
        AzureConfigKey::AccessKey => Some("the account key"),
        AzureConfigKey::SasKey => Some("the SAS token"),
        AzureConfigKey::Token => Some("the bearer token"),
        AzureConfigKey::ClientSecret => Some("the service principal (client secret)"),
        AzureConfigKey::FederatedTokenFile => Some("the workload identity (federated token file)"),
        _ => None,
    };
    let env = [
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_STORAGE_TOKEN",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
    ]
    .into_iter()
    .find(|name| std::env::var_os(name).is_some());
    described(
        entry,
        anonymous,
        options.iter().find_map(|(key, _)| kind(key)),
        env,
        "managed identity (the instance metadata service)",
    )
}

fn described(
    entry: Option<&str>,
    anonymous: bool,
    in_entry: Option<&str>,
    in_env: Option<&str>,
    chain: &str,
) -> String {
    match (entry, anonymous, in_entry, in_env) {
        (Some(entry), true, _, _) => {
            format!("none: the sources file's entry {entry} says anonymous = true")
        }
        (Some(entry), _, Some(what), _) => format!("{what} of {entry} in the sources file"),
        (_, _, _, Some(var)) => format!("the credential in {var}"),
        (Some(entry), _, None, None) => format!(
            "none named (the sources file's entry {entry} names none, nor does the \
             environment), so {chain}"
        ),
        (None, _, _, None) => format!(
            "none named (no sources-file entry covers it, and the environment names none), \
             so {chain}"
        ),
    }
}

/// Whether `e` is a client's failure to get a credential (a token
/// request to the metadata server, managed identity or an identity
/// provider), rather than the store's answer.
pub(crate) fn no_credential(e: &object_store::Error) -> bool {
    crate::causes::causes(e).any(|e| {
        let text = e.to_string();
        text.contains("token request") || text.contains("token response")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_located_in_their_bucket() {
        let azure = |container: &str| Bucket::Azure {
            account: "acct".into(),
            container: container.into(),
        };
        let cases = [
            ("s3://b/k/x", Bucket::S3("b".into()), "s3://b/k/x", "k/x"),
            (
                "gs://b/k/x%20y",
                Bucket::Gcs("b".into()),
                "gs://b/k/x%20y",
                "k/x y",
            ),
            ("az://acct/c/k/x", azure("c"), "az://acct/c/k/x", "k/x"),
            (
                "https://acct.blob.core.windows.net/c/k/x",
                azure("c"),
                "az://acct/c/k/x",
                "k/x",
            ),
        ];
        for (url, bucket, written, key) in cases {
            let (found, at, found_key) = Bucket::locate(&url::Url::parse(url).unwrap())
                .unwrap()
                .unwrap();
            assert_eq!(
                (found, at.as_str(), found_key.as_ref()),
                (bucket, written, key),
                "{url}"
            );
        }
        for refused in [
            "az://acct/",
            "az://acct/c",
            "https://acct.blob.core.windows.net/",
        ] {
            let url = url::Url::parse(refused).unwrap();
            let error = Bucket::locate(&url).unwrap().unwrap_err();
            assert!(error.contains("names no container"), "{refused}: {error}");
        }
        assert!(Bucket::locate(&url::Url::parse("https://example.com/c/k").unwrap()).is_none());
    }

    #[test]
    fn options_that_would_go_anonymous_or_elsewhere_are_refused() {
        let cases = [
            ("skip_signature", "anonymous = true"),
            ("bucket", "comes from the prefix's URL"),
            ("endpoint_x", "not a Google Cloud Storage setting"),
        ];
        for (option, said) in cases {
            let error = gcs_option(option, "v".into()).unwrap_err();
            assert!(error.contains(said), "{option}: {error}");
        }
        let cases = [
            ("skip_signature", "anonymous = true"),
            ("use_emulator", "built-in key"),
            ("account_name", "from the prefix's URL"),
            ("container_name", "from the prefix's URL"),
            ("bucket", "not an Azure Blob setting"),
        ];
        for (option, said) in cases {
            let error = azure_option(option, "v".into()).unwrap_err();
            assert!(error.contains(said), "{option}: {error}");
        }
        assert!(gcs_option("service_account", "/k.json".into()).is_ok());
        assert!(azure_option("sas_token", "sv=1".into()).is_ok());
    }
}

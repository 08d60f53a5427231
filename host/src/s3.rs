//! The S3 client berth builds, for reading sources (`fetch::source::s3`)
//! and for publishing targets (`publish::s3`): a store's settings (the
//! environment's, the sources file's or the target's options on top, and
//! berth's own rules), and what its errors say.

use object_store::ClientConfigKey;
use object_store::ClientOptions;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

use crate::trust::Trust;

/// A store's settings: the environment's (`from_env`) with `options` (a
/// sources-file entry's or a target's) on top, and berth's rules for every
/// store it builds.
pub(crate) fn configured(
    trust: &Trust,
    options: &[(AmazonS3ConfigKey, String)],
) -> object_store::Result<AmazonS3Builder> {
    configured_over(ClientOptions::new(), trust, options)
}

/// `configured`, on the client options `client` rather than the defaults.
pub(crate) fn configured_over(
    client: ClientOptions,
    trust: &Trust,
    options: &[(AmazonS3ConfigKey, String)],
) -> object_store::Result<AmazonS3Builder> {
    let mut builder = from_env(client, trust)?;
    for (key, value) in options {
        builder = builder.with_config(*key, value);
    }
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
    // An endpoint written with http:// is the operator's choice of a
    // plain-HTTP store (MinIO, Ceph on a private network); object_store
    // would otherwise refuse it.
    if endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"))
    {
        builder = builder.with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp),
            "true",
        );
    }
    // object_store's default ends a request after 30 s, body included,
    // which would cut every object that takes longer to download (or
    // upload); a fetch has its own limit (--fetch-timeout-s), a publish
    // its deployment's. Kept if set.
    let timeout = AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
    if builder.get_config_value(&timeout)
        == ClientOptions::new().get_config_value(&ClientConfigKey::Timeout)
    {
        builder = builder.with_config(timeout, "24h");
    }
    Ok(builder)
}

/// `AmazonS3Builder::from_env`, on `client` options that trust `trust`'s
/// certificates: the builder has no way to add one to options it holds, and
/// giving it options replaces them whole, so they come first and the
/// environment is read over them as `from_env` reads it. Proxies are left
/// to reqwest, which reads `HTTPS_PROXY`/`NO_PROXY` itself unless a
/// `proxy_url` option is set.
fn from_env(client: ClientOptions, trust: &Trust) -> object_store::Result<AmazonS3Builder> {
    let options = trust.object_store(client)?;
    let mut builder = AmazonS3Builder::new().with_client_options(options);
    for (name, value) in std::env::vars() {
        if name.starts_with("AWS_")
            && let Ok(key) = name.to_ascii_lowercase().parse()
        {
            builder = builder.with_config(key, value);
        }
    }
    Ok(builder)
}

/// Whether the request never got an answer.
pub(crate) fn unreachable(e: &object_store::Error) -> bool {
    crate::causes::causes(e).any(|e| {
        e.downcast_ref::<object_store::client::HttpError>()
            .is_some_and(|e| e.kind() == object_store::client::HttpErrorKind::Connect)
    })
}

/// An S3 error answer is an XML document; its code and message are what
/// people need ("InvalidAccessKeyId: The AWS Access Key Id you provided
/// does not exist in our records."), not the document.
pub(crate) fn store_said(text: &str) -> String {
    let element = |name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&close)?;
        Some(text[start..start + len].trim().to_string())
    };
    match (element("Code"), element("Message")) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code,
        // An answer without a body (a HEAD's) leaves "…: 403 Forbidden: ".
        _ => text.trim_end().trim_end_matches(':').to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_s3_error_document_is_told_by_its_code_and_message() {
        let said = super::store_said(
            "Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?>\n\
             <Error><Code>InvalidAccessKeyId</Code><Message>The key does not exist.</Message></Error>",
        );
        assert_eq!(said, "InvalidAccessKeyId: The key does not exist.");
        assert_eq!(
            super::store_said("Server returned non-2xx status code: 403 Forbidden: "),
            "Server returned non-2xx status code: 403 Forbidden"
        );
        assert_eq!(
            super::store_said("Connection refused"),
            "Connection refused"
        );
    }
}

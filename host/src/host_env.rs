//! `${NAME}` in configuration values (plugin manifests, the sources file),
//! resolved against the environment given when the file is loaded, so a
//! missing secret is a load error, never a surprise in the middle of a
//! deployment; and the credentials the sources file's `[[source]]`s and
//! `[[target]]`s resolve alike (a header, an S3 option, a registry login),
//! and the one rule of where such a credential may go (`under`). Does no
//! I/O of its own.

use std::collections::BTreeMap;
use std::str::FromStr;

use object_store::aws::AmazonS3ConfigKey;
use reqwest::header::{HeaderName, HeaderValue};

use crate::oci::Login;

/// Replaces each `${NAME}` with the host's value; `$$` is a literal `$`.
pub(crate) fn expand(
    template: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or_else(|| format!("{template:?} has an unclosed ${{"))?;
            let name = &after[..end];
            let value = lookup(name).ok_or_else(|| {
                format!(
                    "the host environment variable {name} is not set (set it before starting berth)"
                )
            })?;
            out.push_str(&value);
            rest = &after[end + 1..];
        } else {
            return Err(format!(
                "{template:?}: write ${{NAME}} for a variable, $$ for a literal $"
            ));
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// One `headers` entry, resolved and marked sensitive.
pub(crate) fn header_value(
    header: &str,
    template: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(HeaderName, HeaderValue), String> {
    let name = HeaderName::from_bytes(header.as_bytes())
        .map_err(|_| format!("headers.{header} is not a valid header name"))?;
    let value = expand(template, lookup).map_err(|e| format!("headers.{header}: {e}"))?;
    // The error must not quote the value: it may be the secret.
    let mut value = HeaderValue::from_str(&value).map_err(|_| {
        format!("headers.{header}: is not a valid header value (control characters?)")
    })?;
    value.set_sensitive(true);
    Ok((name, value))
}

/// One `options` entry: an object_store S3 setting, resolved; the bucket
/// is refused, as it comes from `bucket_from` (the entry's URL).
pub(crate) fn s3_option(
    option: &str,
    template: &str,
    bucket_from: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(AmazonS3ConfigKey, String), String> {
    let key = match AmazonS3ConfigKey::from_str(option) {
        Ok(AmazonS3ConfigKey::Bucket) => {
            return Err(format!(
                "options.{option}: the bucket comes from {bucket_from}"
            ));
        }
        Ok(key) => key,
        Err(_) => {
            return Err(format!(
                "options.{option} is not an S3 setting (object_store's AmazonS3ConfigKey: \
                 endpoint, region, access_key_id, secret_access_key, token, allow_http, …)"
            ));
        }
    };
    let value = expand(template, lookup).map_err(|e| format!("options.{option}: {e}"))?;
    Ok((key, value))
}

/// An `oci://` prefix's or target's options: `username` and `password`,
/// both or neither (a registry that needs no login needs no entry).
pub(crate) fn registry_login(
    options: &BTreeMap<String, String>,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Login>, String> {
    if let Some(other) = options
        .keys()
        .find(|k| !matches!(k.as_str(), "username" | "password"))
    {
        return Err(format!(
            "options.{other} is not a registry option (username, password)"
        ));
    }
    let value = |key: &str| {
        options
            .get(key)
            .map(|template| expand(template, lookup).map_err(|e| format!("options.{key}: {e}")))
            .transpose()
    };
    match (value("username")?, value("password")?) {
        (Some(username), Some(password)) => Ok(Some(Login { username, password })),
        (None, None) => Ok(None),
        _ => Err("a registry login needs both options.username and options.password".into()),
    }
}

/// Whether `url` is under `prefix`, where the prefix's credentials may go:
/// same scheme, host and port, and a path that is the prefix's or
/// continues it (`/models` covers `/models/a`, not `/models2`). Both are
/// `url::Url`s, so `.` and `..` segments are already resolved.
pub(crate) fn under(prefix: &url::Url, url: &url::Url) -> bool {
    let (prefix_path, path) = (prefix.path(), url.path());
    prefix.scheme() == url.scheme()
        && prefix.host_str() == url.host_str()
        && prefix.port_or_known_default() == url.port_or_known_default()
        && path.starts_with(prefix_path)
        && (prefix_path.ends_with('/')
            || path.len() == prefix_path.len()
            || path[prefix_path.len()..].starts_with('/'))
}

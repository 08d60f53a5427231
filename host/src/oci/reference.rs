//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`: what names a manifest
//! in a registry, checked by the distribution spec's grammar, and the
//! registry's base URL (plain HTTP only for a loopback registry, as Docker
//! and ORAS treat `localhost`). Pure.

use std::fmt;

/// A manifest in a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`, lowercased.
    pub registry: String,
    /// `ns/name`, lowercase path components.
    pub repository: String,
    pub tag: Option<String>,
    /// The manifest's sha256, 64 lowercase hex characters; wins over the tag.
    pub digest: Option<String>,
}

/// The tag a reference with neither tag nor digest means, as every client does.
const LATEST: &str = "latest";

impl Reference {
    /// Parses `oci://…`; the error says what is wrong and shows the shape.
    pub fn parse(text: &str) -> Result<Self, String> {
        let shape = "oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:DIGEST";
        let rest = text
            .strip_prefix("oci://")
            .ok_or_else(|| format!("{text:?} is not an oci:// reference ({shape})"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| format!("{text:?} names no repository ({shape})"))?;
        check_registry(registry).map_err(|e| format!("{text:?}: the registry {e} ({shape})"))?;
        let (path, digest) = match path.split_once('@') {
            Some((path, digest)) => {
                let hex = digest.strip_prefix("sha256:").ok_or_else(|| {
                    format!("{text:?}: the digest must be sha256:HEX, got {digest:?}")
                })?;
                (
                    path,
                    Some(checked_hex(hex).map_err(|e| format!("{text:?}: {e}"))?),
                )
            }
            None => (path, None),
        };
        // A colon after the last slash starts the tag (one before it is a port).
        let (repository, tag) = match path.rfind(':') {
            Some(at) if !path[at..].contains('/') => (&path[..at], Some(&path[at + 1..])),
            _ => (path, None),
        };
        check_repository(repository).map_err(|e| format!("{text:?}: {e}"))?;
        if let Some(tag) = tag {
            check_tag(tag).map_err(|e| format!("{text:?}: {e}"))?;
        }
        Ok(Self {
            registry: registry.to_ascii_lowercase(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// What to ask the registry for: the digest when there is one, else
    /// the tag (`latest` when neither is given).
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => format!("sha256:{digest}"),
            (None, Some(tag)) => tag.clone(),
            (None, None) => LATEST.to_string(),
        }
    }

    /// The same manifest named by its digest alone: what a record keeps, so
    /// a tag moved later changes nothing.
    pub fn pinned(&self, digest: &str) -> Self {
        Self {
            tag: None,
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// The registry's API root: `https://REGISTRY/v2/`, or `http://` for
    /// a loopback registry.
    pub fn api(&self) -> url::Url {
        api_of(&self.registry)
    }

    /// The same registry and repository as an `oci://` prefix URL, which
    /// the sources file's credentials are matched against.
    pub fn url(&self) -> url::Url {
        url::Url::parse(&format!("oci://{}/{}", self.registry, self.repository))
            .expect("a checked reference is a URL")
    }
}

/// `https://HOST/v2/`, plain HTTP for loopback hosts.
pub fn api_of(registry: &str) -> url::Url {
    let host = registry
        .rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(registry, |(host, _)| host);
    let loopback = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let scheme = if loopback { "http" } else { "https" };
    url::Url::parse(&format!("{scheme}://{registry}/v2/")).expect("a checked registry is a host")
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@sha256:{digest}")?;
        }
        Ok(())
    }
}

fn check_registry(registry: &str) -> Result<(), String> {
    if registry.is_empty() {
        return Err("is missing".into());
    }
    let parsed = url::Url::parse(&format!("http://{registry}/"))
        .map_err(|e| format!("{registry:?} is not a host[:port]: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty)
        || !parsed.username().is_empty()
        || parsed.path() != "/"
    {
        return Err(format!("{registry:?} is not a host[:port]"));
    }
    Ok(())
}

/// Path components of `[a-z0-9]+` joined by `.`, `_`, `__` or `-`s.
pub(crate) fn check_repository(repository: &str) -> Result<(), String> {
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && c.bytes()
                .last()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && c.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    };
    if repository.is_empty() || repository.len() > 255 || !repository.split('/').all(component_ok) {
        return Err(format!(
            "the repository {repository:?} must be lowercase letters, digits and . _ - between /"
        ));
    }
    Ok(())
}

pub(crate) fn check_tag(tag: &str) -> Result<(), String> {
    let ok = (1..=128).contains(&tag.len())
        && tag
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the tag {tag:?} must be 1 to 128 letters, digits, _ . - (not starting with . or -)"
        ))
    }
}

/// 64 lowercase hex characters, or the sentence saying what it is not.
pub(crate) fn checked_hex(hex: &str) -> Result<String, String> {
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(format!("a sha256 digest is 64 hex characters, got {hex:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_parse_into_their_parts() {
        let r = Reference::parse("oci://127.0.0.1:5000/team/llama-ft:job-7").unwrap();
        assert_eq!(
            (
                r.registry.as_str(),
                r.repository.as_str(),
                r.tag.as_deref(),
                r.digest.as_deref()
            ),
            ("127.0.0.1:5000", "team/llama-ft", Some("job-7"), None)
        );
        assert_eq!(r.manifest_ref(), "job-7");
        assert_eq!(r.api().as_str(), "http://127.0.0.1:5000/v2/");

        let r = Reference::parse(&format!("oci://Registry.example.com/m@sha256:{D}")).unwrap();
        assert_eq!(r.registry, "registry.example.com");
        assert_eq!(r.manifest_ref(), format!("sha256:{D}"));
        assert_eq!(r.api().as_str(), "https://registry.example.com/v2/");

        let r = Reference::parse("oci://localhost/a/b/c").unwrap();
        assert_eq!(r.manifest_ref(), "latest");
        assert_eq!(r.api().as_str(), "http://localhost/v2/");

        let pinned = Reference::parse("oci://r.io/m:t").unwrap().pinned(D);
        assert_eq!(pinned.to_string(), format!("oci://r.io/m@sha256:{D}"));
        assert_eq!(pinned.url().as_str(), "oci://r.io/m");
    }

    #[test]
    fn bad_references_say_what_is_wrong() {
        let cases = [
            ("https://r.io/m:t", "is not an oci:// reference"),
            ("oci://r.io", "names no repository"),
            ("oci:///m:t", "the registry is missing"),
            ("oci://r.io/Team/m", "must be lowercase"),
            ("oci://r.io/m//n", "must be lowercase"),
            ("oci://r.io/m:-t", "the tag \"-t\""),
            ("oci://r.io/m@sha512:ab", "must be sha256:HEX"),
            ("oci://r.io/m@sha256:abc", "64 hex characters"),
            ("oci://u@r.io/m", "is not a host[:port]"),
        ];
        for (text, wanted) in cases {
            let e = Reference::parse(text).unwrap_err();
            assert!(e.contains(wanted), "{text}: {e}");
        }
    }
}

//! STUB for the lead's compile only; replaced by h-publish's module on merge.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::targets::Targets;
use crate::trust::Trust;

pub struct Key(String);
impl Key {
    pub fn parse(text: &str) -> Result<Key, String> {
        Ok(Key(text.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub target: String,
    pub key: String,
    pub url: String,
    pub bytes: u64,
    pub sha256: String,
    pub etag: Option<String>,
}
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectInfo {
    pub bytes: u64,
    pub etag: Option<String>,
}
pub enum Body {
    File {
        path: PathBuf,
        bytes: u64,
        sha256: Option<String>,
    },
    Bytes {
        bytes: bytes::Bytes,
        content_type: String,
    },
}
pub struct Publishers {
    targets: Arc<Targets>,
}
impl Publishers {
    pub fn new(targets: Arc<Targets>, _trust: &Trust) -> Self {
        Self { targets }
    }
    pub fn get(&self, name: &str) -> Result<Publisher, Error> {
        let _ = &self.targets;
        Ok(Publisher {
            name: name.to_string(),
        })
    }
}
#[derive(Clone)]
pub struct Publisher {
    name: String,
}
impl Publisher {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn url(&self, key: &Key) -> String {
        key.0.clone()
    }
    pub async fn put(
        &self,
        _key: &Key,
        _body: Body,
        _progress: &(dyn Fn(u64) + Send + Sync),
        _cancel: &CancellationToken,
    ) -> Result<Receipt, Error> {
        Err(Error::Cancelled)
    }
    pub async fn stat(&self, _key: &Key) -> Result<Option<ObjectInfo>, Error> {
        Ok(None)
    }
}
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cancelled")]
    Cancelled,
}

//! The blocks of an Azure upload that stopped before its commit, dropped:
//! Azure has no request for that, so an empty block list is committed
//! where no blob was (which drops them) and the empty blob that makes is
//! deleted at once; over an existing blob they are left for Azure to
//! remove within a week, and the log says so.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ETAG, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use tokio_util::task::TaskTracker;

use super::super::Subject;
use super::{Signing, name};
use crate::causes::innermost;

/// How long the cleanup of a put that stopped waits for its block
/// requests to end (each is bounded by the client's retries).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(600);
/// How long a failed or cancelled put waits for its blocks to be dropped
/// before leaving it to a task of its own.
const ABORT_WAIT: Duration = Duration::from_secs(5);
/// The blocks of an upload not yet committed: dropped when the put fails
/// or is cancelled (`drop_blocks`), or, if its future is dropped first,
/// by a task spawned on drop.
pub(super) struct Staged {
    pub(super) signing: Signing,
    pub(super) url: url::Url,
    /// Whether a blob was there before: its blocks cannot be dropped
    /// without replacing it, so they are left, and the log says so.
    pub(super) existed: bool,
    /// The upload's block requests, let finish when the put stopped.
    pub(super) tracker: TaskTracker,
    pub(super) armed: bool,
}

impl Staged {
    /// Drops the blocks now, waiting at most `ABORT_WAIT`; past that, the
    /// drop leaves it to a task. Blocks that land later are looked for
    /// on a task of its own (`late`).
    pub(super) async fn drop_blocks(&mut self, subject: &Subject) {
        if self.existed {
            self.armed = false;
            tracing::warn!(target_name = %subject.target, "{}", left_behind(&self.url, EXISTED));
            return;
        }
        let dropped = commit_nothing(&self.signing, &self.url);
        if let Ok(outcome) = tokio::time::timeout(ABORT_WAIT, dropped).await {
            self.armed = false;
            match outcome {
                Ok(()) => {
                    let tracker = self.tracker.clone();
                    tokio::spawn(late(self.signing.clone(), self.url.clone(), tracker));
                }
                Err(e) => tracing::warn!(
                    target_name = %subject.target,
                    "{}",
                    left_behind(&self.url, &e)
                ),
            }
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (signing, url, existed) = (self.signing.clone(), self.url.clone(), self.existed);
        let tracker = self.tracker.clone();
        let discard = async move {
            if existed {
                return Err(left_behind(&url, EXISTED));
            }
            commit_nothing(&signing, &url)
                .await
                .map_err(|e| left_behind(&url, &e))?;
            late(signing, url, tracker).await;
            Ok(())
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = discard.await {
                        tracing::warn!("{e}");
                    }
                });
            }
            Err(_) => tracing::warn!(
                "an upload's uncommitted blocks are left for Azure to remove within a week: no \
                 runtime to drop them on"
            ),
        }
    }
}

/// Why blocks cannot be dropped over a blob that was there.
const EXISTED: &str = "a blob was there before, which dropping them would replace";

fn left_behind(url: &url::Url, why: &str) -> String {
    format!(
        "the uncommitted blocks of {} are left for Azure to remove within a week: {why}",
        url.path()
    )
}

/// Drops again the blocks that landed after the put stopped: once every
/// block request it sent has been answered or has failed (a request
/// already sent may be stored after the first drop), the blob's blocks
/// are looked at, and dropped if there are any.
async fn late(signing: Signing, url: url::Url, tracker: TaskTracker) {
    tracker.close();
    if tokio::time::timeout(IN_FLIGHT_WAIT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("{}", left_behind(&url, "its block requests did not end"));
        return;
    }
    let mut blocks = url.clone();
    blocks
        .query_pairs_mut()
        .append_pair("comp", "blocklist")
        .append_pair("blocklisttype", "uncommitted");
    let listed = match signing
        .request(Method::GET, &blocks, HeaderMap::new(), Bytes::new())
        .await
    {
        Ok(request) => request.send().await,
        Err(e) => return tracing::warn!("{}", left_behind(&url, &e)),
    };
    match listed {
        Ok(answer) if answer.status() == StatusCode::NOT_FOUND => {}
        Ok(_) => {
            if let Err(e) = commit_nothing(&signing, &url).await {
                tracing::warn!("{}", left_behind(&url, &e));
            }
        }
        Err(e) => tracing::warn!("{}", left_behind(&url, &innermost(&e.without_url()))),
    }
}

/// Drops the uncommitted blocks of the blob at `url`: commits an empty
/// list where no blob is (`If-None-Match: *`), which drops every block,
/// then deletes the empty blob that made, if it is still that one.
async fn commit_nothing(signing: &Signing, url: &url::Url) -> Result<(), String> {
    let mut list = url.clone();
    list.query_pairs_mut().append_pair("comp", "blocklist");
    let mut headers = HeaderMap::new();
    headers.insert(name("if-none-match"), HeaderValue::from_static("*"));
    let empty =
        Bytes::from_static(b"<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList></BlockList>");
    let committed = signing
        .request(Method::PUT, &list, headers, empty)
        .await?
        .send()
        .await
        .map_err(|e| innermost(&e.without_url()))?;
    if !committed.status().is_success() {
        return Err(format!(
            "committing no block was answered {}",
            committed.status()
        ));
    }
    let mut headers = HeaderMap::new();
    if let Some(etag) = committed.headers().get(ETAG) {
        headers.insert(name("if-match"), etag.clone());
    }
    let deleted = signing
        .request(Method::DELETE, url, headers, Bytes::new())
        .await?
        .send()
        .await
        .map_err(|e| {
            format!(
                "the empty blob it made is left: {}",
                innermost(&e.without_url())
            )
        })?;
    match deleted.status().is_success() {
        true => Ok(()),
        false => Err(format!(
            "the empty blob it made is left: deleting it was answered {}",
            deleted.status()
        )),
    }
}

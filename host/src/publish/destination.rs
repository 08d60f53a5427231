//! What every kind of target does with a key, named once: `Destination`,
//! implemented by `s3::Bucket`, `http::Mirror`, `oci::Registry` and
//! `file::Folder`. `Publisher` is the only caller: it scrubs errors and
//! writes receipts; a destination never sees the caller's `progress` but
//! through `Tally`, and knows nothing of the others.
//!
//! Dispatched statically (`Backend`'s match, `on_destination!`), not as
//! `dyn`: the set is closed, and async fns in a trait then need no boxed
//! future and keep each put's future `Send` as its destination's is.

use tokio_util::sync::CancellationToken;

use super::oci::pending::Slot;
use super::{Body, Error, Key, ObjectInfo, Pending, Put, Subject, Tally};

/// One kind of target.
pub(super) trait Destination {
    /// Where `key` lands, for people: the target's url joined with the
    /// key. A destination with keys of its own shape refuses others here.
    fn url(&self, subject: &Subject, key: &Key) -> Result<String, Error> {
        Ok(subject.join(key).to_string())
    }

    /// Where the keys under the folder `key` land, ending in `/`.
    fn folder_url(&self, subject: &Subject, key: &Key) -> Result<String, Error> {
        Ok(format!("{}/", subject.join(key)))
    }

    /// What a put of `key` takes when it is made, before it is first
    /// polled: on an oci target, its layer's place in `pending`'s manifest.
    fn reserve<'p>(
        &self,
        _subject: &Subject,
        _pending: &'p Pending,
        _key: &Key,
    ) -> Result<Option<Slot<'p>>, Error> {
        Ok(None)
    }

    /// Puts `body` at `key`, its bytes told to `tally` as they go, and
    /// checked against its digest; leaves nothing under `key` if it fails
    /// or is cancelled. The url that landed, and what was put.
    async fn put(
        &self,
        subject: &Subject,
        key: &Key,
        layer: Option<Slot<'_>>,
        body: Body,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Put), Error>;

    /// The object at `key`, if there is one.
    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error>;

    /// Writes what `pending` holds: key, url and what was put of each.
    /// Nothing but on an oci target.
    async fn finish(
        &self,
        _subject: &Subject,
        _pending: &Pending,
        _cancel: &CancellationToken,
    ) -> Result<Vec<(String, String, Put)>, Error> {
        Ok(Vec::new())
    }
}

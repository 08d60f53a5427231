//! The models volume's keeping, under the fetch: the blob store that holds
//! each verified file once (`blobs`), the disk budget (`budget`) and what
//! the volume holds (`usage`), the verification record (`stamp`), the
//! per-directory lock (`lock`), adopting an older models dir (`adopt`) and
//! dropping a model's copy (`copy`). Reads and writes the volume only;
//! knows nothing of sources.

pub(super) mod adopt;
pub(super) mod blobs;
pub(super) mod budget;
pub(super) mod copy;
pub(super) mod lock;
pub(super) mod stamp;
pub mod usage;

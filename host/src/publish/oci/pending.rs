//! The manifests a deployment's puts make, layer by layer, until
//! `finish` writes them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Place;
use crate::oci::Reference;
use crate::oci::manifest::Descriptor;

/// What a deployment's puts to one oci target leave for `finish` to write:
/// a manifest per `REPO:TAG`, in the order they were first put to, each
/// with its layers in the order the puts were made. A put of the same
/// PATH again replaces the layer. Nothing is written until `finish`: a
/// pending manifest never finished is simply not written (its blobs stay
/// unreferenced, for the registry's garbage collection). Empty for other
/// kinds of target. One per deployment and target.
#[derive(Default)]
pub struct Pending {
    /// Where the deployment's model came from, when that is an `oci://`
    /// reference: a blob of the same registry may be mounted from it.
    pub(super) origin: Option<Reference>,
    manifests: Mutex<Vec<Manifested>>,
    next_id: AtomicU64,
}

/// One manifest being made.
pub(super) struct Manifested {
    pub(super) repo: String,
    pub(super) repository: String,
    pub(super) tag: String,
    pub(super) layers: Vec<Layer>,
}

/// One put's layer: reserved when the put starts, filled when it lands.
pub(super) struct Layer {
    id: u64,
    title: String,
    pub(super) descriptor: Option<Descriptor>,
}

impl Pending {
    /// For a deployment whose model's `source` is `model_source`.
    pub fn new(model_source: &str) -> Self {
        Self {
            origin: Reference::parse(model_source).ok(),
            ..Self::default()
        }
    }

    /// Whether no put waits for a manifest.
    pub fn is_empty(&self) -> bool {
        self.manifests.lock().expect("never poisoned").is_empty()
    }

    /// Reserves `place`'s layer, after those reserved before.
    pub(super) fn reserve(&self, place: &Place) -> Slot<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut manifests = self.manifests.lock().expect("never poisoned");
        let index = match manifests
            .iter()
            .position(|m| m.repository == place.repository && m.tag == place.tag)
        {
            Some(index) => index,
            None => {
                manifests.push(Manifested {
                    repo: place.repo.clone(),
                    repository: place.repository.clone(),
                    tag: place.tag.clone(),
                    layers: Vec::new(),
                });
                manifests.len() - 1
            }
        };
        manifests[index].layers.push(Layer {
            id,
            title: place.path.clone(),
            descriptor: None,
        });
        Slot {
            pending: self,
            id,
            filled: false,
        }
    }

    /// Layer `id` landed as `descriptor`; an earlier layer of the same
    /// title is replaced by it.
    fn fill(&self, id: u64, descriptor: Descriptor) {
        let mut manifests = self.manifests.lock().expect("never poisoned");
        for manifest in manifests.iter_mut() {
            let Some(at) = manifest.layers.iter().position(|l| l.id == id) else {
                continue;
            };
            let title = manifest.layers[at].title.clone();
            manifest.layers[at].descriptor = Some(descriptor);
            manifest
                .layers
                .retain(|l| l.id == id || l.title != title || l.descriptor.is_none());
            return;
        }
    }

    /// Layer `id` will not land: its place is given up, and a manifest
    /// left with no layer with it.
    fn release(&self, id: u64) {
        let mut manifests = self.manifests.lock().expect("never poisoned");
        for manifest in manifests.iter_mut() {
            manifest.layers.retain(|l| l.id != id);
        }
        manifests.retain(|m| !m.layers.is_empty());
    }

    /// The next manifest to write, taken out (`restore` puts it back).
    pub(super) fn take(&self) -> Option<Manifested> {
        let mut manifests = self.manifests.lock().expect("never poisoned");
        (!manifests.is_empty()).then(|| manifests.remove(0))
    }

    pub(super) fn restore(&self, manifest: Manifested) {
        self.manifests
            .lock()
            .expect("never poisoned")
            .insert(0, manifest);
    }
}

/// A put's reserved layer: given up when dropped unfilled (the put failed,
/// was cancelled or dropped).
pub(in crate::publish) struct Slot<'a> {
    pending: &'a Pending,
    id: u64,
    filled: bool,
}

impl Slot<'_> {
    /// Where the deployment's model came from (`Pending::origin`).
    pub(super) fn origin(&self) -> Option<&Reference> {
        self.pending.origin.as_ref()
    }

    pub(super) fn fill(mut self, descriptor: Descriptor) {
        self.pending.fill(self.id, descriptor);
        self.filled = true;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.filled {
            self.pending.release(self.id);
        }
    }
}

//! SHA-256 whose state can be written down and picked up again, so an
//! interrupted download can continue its hash without reading back what it
//! kept: sha2's own hasher, saved through digest's `SerializableState`.
//! Knows nothing of files.

use serde::{Deserialize, Serialize};
use sha2::Digest;
use sha2::digest::common::hazmat::{SerializableState, SerializedState};

/// A running hash and how many bytes it covers: sha2 counts them too but
/// does not tell.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(into = "Saved", try_from = "Saved")]
pub(crate) struct Sha256 {
    hasher: sha2::Sha256,
    len: u64,
}

impl Sha256 {
    /// How many bytes this hash covers.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        self.hasher.update(data);
    }

    /// The lowercase hex digest.
    pub(crate) fn finalize(self) -> String {
        hex::encode(self.hasher.finalize())
    }
}

/// How a hash is written down. `state` is sha2's serialized state in hex,
/// whose layout sha2 keeps only within one minor version (0.11): a sha2
/// that lays it out differently needs a new checkpoint format
/// (`partial::CHECKPOINT_FORMAT`); the test below pins the layout.
#[derive(Serialize, Deserialize)]
struct Saved {
    len: u64,
    state: String,
}

impl From<Sha256> for Saved {
    fn from(hash: Sha256) -> Self {
        Self {
            len: hash.len,
            state: hex::encode(hash.hasher.serialize()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "saved hash state: not a SHA-256 state written by sha2 0.11; the bytes it covers are hashed again"
)]
struct UnreadableState;

impl TryFrom<Saved> for Sha256 {
    type Error = UnreadableState;

    fn try_from(saved: Saved) -> Result<Self, UnreadableState> {
        let bytes = hex::decode(&saved.state).map_err(|_| UnreadableState)?;
        let state = SerializedState::<sha2::Sha256>::try_from(bytes.as_slice())
            .map_err(|_| UnreadableState)?;
        let hasher = sha2::Sha256::deserialize(&state).map_err(|_| UnreadableState)?;
        Ok(Self {
            hasher,
            len: saved.len,
        })
    }
}

/// The sha256 of the file at `path`, read through.
pub(super) fn hash_file(path: &std::path::Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        match std::io::Read::read(&mut file, &mut buf)? {
            0 => return Ok(hex::encode(hasher.finalize())),
            n => hasher.update(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_written_down_midway_and_picked_up_again_ends_the_same() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 999, 1000] {
            let expected = hex::encode(sha2::Sha256::digest(&data[..len]));
            for split in [0, 1, 3, 63, 64, 65, 500].into_iter().filter(|s| *s <= len) {
                let mut hasher = Sha256::default();
                hasher.update(&data[..split]);
                let saved = serde_json::to_string(&hasher).unwrap();
                let mut hasher: Sha256 = serde_json::from_str(&saved).unwrap();
                hasher.update(&data[split..len]);
                assert_eq!(hasher.len(), len as u64);
                assert_eq!(
                    hasher.finalize(),
                    expected,
                    "length {len}, split at {split}"
                );
            }
        }
    }

    /// Checkpoints on disk outlive the binary that wrote them: if this
    /// fails after a sha2 upgrade, the saved layout changed, and
    /// `CHECKPOINT_FORMAT` must change with it (then update this text).
    #[test]
    fn the_saved_layout_is_the_one_checkpoints_are_written_in() {
        let mut hasher = Sha256::default();
        hasher.update(b"abc");
        let state = concat!(
            // The eight state words (little-endian), then whole blocks so far.
            "67e6096a85ae67bb72f36e3c3af54fa57f520e518c68059babd9831f19cde05b",
            "0000000000000000",
            // The pending bytes: how many, then the block they start.
            "03616263",
        );
        let expected = format!(r#"{{"len":3,"state":"{state}{}"}}"#, "00".repeat(60));
        assert_eq!(serde_json::to_string(&hasher).unwrap(), expected);
    }

    #[test]
    fn a_state_of_another_shape_is_refused() {
        for state in ["", "zz", &"00".repeat(103), &"00".repeat(105)] {
            let saved = format!(r#"{{"len": 0, "state": "{state}"}}"#);
            assert!(serde_json::from_str::<Sha256>(&saved).is_err(), "{state:?}");
        }
    }
}

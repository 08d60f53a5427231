//! SHA-256 whose state can be written down and picked up again, so an
//! interrupted download can continue its hash without reading back what it
//! kept. sha2 0.10 cannot export its state, so this wraps its compression
//! function (`compress256`, SHA-NI when the CPU has it) with the padding of
//! FIPS 180-4. Knows nothing of files.

use serde::{Deserialize, Serialize};
use sha2::digest::generic_array::GenericArray;
use sha2::digest::typenum::U64;

const INITIAL: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// A running hash: the state after every whole 64-byte block so far, and
/// the bytes of the block not yet whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Sha256 {
    state: [u32; 8],
    /// Bytes hashed so far, the pending ones included.
    len: u64,
    pending: Vec<u8>,
}

impl Default for Sha256 {
    fn default() -> Self {
        Self {
            state: INITIAL,
            len: 0,
            pending: Vec::with_capacity(64),
        }
    }
}

impl Sha256 {
    /// How many bytes this hash covers.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.pending.is_empty() {
            let take = (64 - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() < 64 {
                return;
            }
            compress(&mut self.state, &self.pending);
            self.pending.clear();
        }
        let whole = data.len() / 64 * 64;
        compress(&mut self.state, &data[..whole]);
        self.pending.extend_from_slice(&data[whole..]);
    }

    /// The lowercase hex digest.
    pub(crate) fn finalize(mut self) -> String {
        let bits = self.len.wrapping_mul(8);
        let mut tail = std::mem::take(&mut self.pending);
        tail.push(0x80);
        let padded = if tail.len() <= 56 { 64 } else { 128 };
        tail.resize(padded - 8, 0);
        tail.extend_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &tail);
        self.state
            .iter()
            .map(|word| format!("{word:08x}"))
            .collect()
    }
}

/// Runs the compression function over `data`, a whole number of blocks.
fn compress(state: &mut [u32; 8], data: &[u8]) {
    debug_assert_eq!(data.len() % 64, 0);
    // SAFETY: `GenericArray<u8, U64>` is a `repr(transparent)` `[u8; 64]`
    // (alignment 1), and `data` holds exactly `data.len() / 64` of them; sha2
    // itself casts the other way inside `compress256`.
    let blocks = unsafe {
        std::slice::from_raw_parts(
            data.as_ptr().cast::<GenericArray<u8, U64>>(),
            data.len() / 64,
        )
    };
    sha2::compress256(state, blocks);
}

#[cfg(test)]
mod tests {
    use sha2::Digest;

    use super::*;

    #[test]
    fn agrees_with_sha2_at_every_length_and_split_and_after_a_round_trip() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 999, 1000] {
            let expected = hex::encode(sha2::Sha256::digest(&data[..len]));
            for split in [0, 1, 3, 63, 64, 65, 500].into_iter().filter(|s| *s <= len) {
                let mut hasher = Sha256::default();
                hasher.update(&data[..split]);
                // Written down and picked up again midway.
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
}

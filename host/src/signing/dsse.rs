//! DSSE (Dead Simple Signing Envelope) v1: the pre-authentication encoding
//! the signature is over, and the ECDSA check of it.

use super::keys::PublicKey;

/// The only payload type OMS signs: an in-toto statement.
pub(super) const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// `DSSEv1 <len(type)> <type> <len(payload)> <payload>`, lengths in ASCII
/// decimal bytes. The type is always in-toto's, as `model_signing` encodes it
/// (its `pae()` hard-codes it), so an envelope claiming another type fails.
pub(super) fn pae(payload: &[u8]) -> Vec<u8> {
    let head = format!(
        "DSSEv1 {} {} {} ",
        IN_TOTO_PAYLOAD_TYPE.len(),
        IN_TOTO_PAYLOAD_TYPE,
        payload.len()
    );
    let mut out = Vec::with_capacity(head.len() + payload.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// Whether `signature` (ASN.1 DER ECDSA, as the tool writes it) is `key`'s
/// over the payload's encoding. model_signing before 1.0 signed another,
/// buggy encoding; such signatures are not accepted (re-sign with 1.x).
pub(super) fn verifies(key: &PublicKey, payload: &[u8], signature: &[u8]) -> bool {
    key.verifies(&pae(payload), signature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_the_dsse_v1_encoding() {
        assert_eq!(
            pae(b"{}"),
            b"DSSEv1 28 application/vnd.in-toto+json 2 {}".to_vec()
        );
        assert_eq!(
            pae(b""),
            b"DSSEv1 28 application/vnd.in-toto+json 0 ".to_vec()
        );
    }
}

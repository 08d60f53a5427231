//! A file's missing bytes cut into pieces, one range request each, as the
//! connections of a download in pieces (`pieces`) claim them. Pure.

use std::collections::VecDeque;

use super::source::Span;

/// The bytes `start..end` of the file, asked for with one range request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Piece {
    pub(crate) fn span(&self) -> Span {
        Span {
            start: self.start,
            end: Some(self.end),
        }
    }
}

/// The missing ranges, cut into pieces of at most `piece_bytes` as the
/// connections claim them, in file order, so that the run of written bytes
/// from the start, which the hash follows, grows first. Cut one at a time:
/// a file costs one entry per missing range whatever its size (a recorded
/// size of 2^61 bytes once asked for 2^37 pieces up front, found by
/// schemathesis).
#[derive(Debug, Clone)]
pub(crate) struct Pieces {
    missing: VecDeque<(u64, u64)>,
    piece_bytes: u64,
}

pub(crate) fn pieces(missing: &[(u64, u64)], piece_bytes: u64) -> Pieces {
    Pieces {
        missing: missing
            .iter()
            .copied()
            .filter(|(start, end)| start < end)
            .collect(),
        piece_bytes: piece_bytes.max(1),
    }
}

impl Pieces {
    /// Puts back the bytes `start..end` that a connection claimed but did
    /// not get: the next claim takes them.
    pub(super) fn give_back(&mut self, start: u64, end: u64) {
        if start < end {
            self.missing.push_front((start, end));
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.missing.is_empty()
    }
}

impl Iterator for Pieces {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let (start, end) = self.missing.pop_front()?;
        let piece = Piece {
            start,
            end: end.min(start.saturating_add(self.piece_bytes)),
        };
        if piece.end < end {
            self.missing.push_front((piece.end, end));
        }
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ranges_are_cut_into_pieces_in_file_order() {
        let piece = |start, end| Piece { start, end };
        assert_eq!(
            pieces(&[(0, 10), (15, 16), (20, 45)], 10).collect::<Vec<_>>(),
            [
                piece(0, 10),
                piece(15, 16),
                piece(20, 30),
                piece(30, 40),
                piece(40, 45)
            ]
        );
        assert_eq!(pieces(&[], 10).next(), None);
        // The largest file costs no more than the smallest.
        let mut huge = pieces(&[(0, u64::MAX)], 16 << 20);
        assert_eq!(huge.next(), Some(piece(0, 16 << 20)));
        assert_eq!(huge.next(), Some(piece(16 << 20, 32 << 20)));
    }
}

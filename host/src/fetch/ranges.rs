//! Which bytes of a partial file are written: a set of byte ranges, kept
//! sorted and merged, so that a download in pieces knows what it still
//! needs and how far the written bytes run unbroken from the start. Pure;
//! knows nothing of files.

use serde::{Deserialize, Serialize};

/// Disjoint, non-adjacent, non-empty `[start, end)` ranges, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<(u64, u64)>", into = "Vec<(u64, u64)>")]
pub(crate) struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// The first `len` bytes.
    pub(crate) fn prefix(len: u64) -> Self {
        let mut ranges = Self::default();
        ranges.insert(0, len);
        ranges
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `[start, end)`, merging it with the ranges it touches.
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // The ranges before it end before `start`; those after it begin
        // after `end`; the ones between are merged into it.
        let first = self.0.partition_point(|&(_, e)| e < start);
        let last = self.0.partition_point(|&(s, _)| s <= end);
        let (mut start, mut end) = (start, end);
        if first < last {
            start = start.min(self.0[first].0);
            end = end.max(self.0[last - 1].1);
        }
        self.0.splice(first..last, [(start, end)]);
    }

    /// Where the bytes written without a gap from byte 0 end.
    pub(crate) fn contiguous(&self) -> u64 {
        match self.0.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }

    /// Whether the written bytes are one run from byte 0 (or none at all).
    pub(crate) fn is_prefix(&self) -> bool {
        self.0.len() <= 1 && self.0.first().is_none_or(|&(start, _)| start == 0)
    }

    /// How many bytes are written.
    pub(crate) fn len(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// The last byte written, plus one.
    pub(crate) fn end(&self) -> u64 {
        self.0.last().map_or(0, |&(_, end)| end)
    }

    /// The ranges of `[0, size)` not written.
    pub(crate) fn missing(&self, size: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut at = 0;
        for &(start, end) in &self.0 {
            if start > at {
                gaps.push((at, start.min(size)));
            }
            at = at.max(end);
        }
        if at < size {
            gaps.push((at, size));
        }
        gaps.retain(|(s, e)| s < e);
        gaps
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().copied()
    }
}

impl From<Ranges> for Vec<(u64, u64)> {
    fn from(ranges: Ranges) -> Self {
        ranges.0
    }
}

#[derive(Debug, thiserror::Error)]
#[error("written ranges: not sorted, disjoint, non-empty ranges")]
pub(crate) struct Unordered;

impl TryFrom<Vec<(u64, u64)>> for Ranges {
    type Error = Unordered;

    /// Read back from a checkpoint: trusted only in the shape `insert`
    /// keeps.
    fn try_from(ranges: Vec<(u64, u64)>) -> Result<Self, Unordered> {
        let ordered = ranges.iter().all(|(s, e)| s < e)
            && ranges.windows(2).all(|pair| pair[0].1 < pair[1].0);
        ordered.then_some(Self(ranges)).ok_or(Unordered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Spans = &'static [(u64, u64)];

    #[test]
    fn inserted_ranges_are_merged_with_those_they_touch() {
        // (inserted in this order, expected set)
        let cases: &[(Spans, Spans)] = &[
            (&[(0, 10)], &[(0, 10)]),
            (&[(0, 10), (10, 20)], &[(0, 20)]),
            (&[(10, 20), (0, 10)], &[(0, 20)]),
            (&[(0, 5), (10, 15)], &[(0, 5), (10, 15)]),
            (&[(0, 5), (10, 15), (5, 10)], &[(0, 15)]),
            (&[(0, 5), (10, 15), (20, 25), (3, 22)], &[(0, 25)]),
            (&[(10, 15), (11, 12)], &[(10, 15)]),
            (&[(10, 15), (5, 5)], &[(10, 15)]),
            (&[(30, 40), (10, 20), (0, 5)], &[(0, 5), (10, 20), (30, 40)]),
        ];
        for (inserted, expected) in cases {
            let mut ranges = Ranges::default();
            for &(s, e) in *inserted {
                ranges.insert(s, e);
            }
            assert_eq!(ranges.iter().collect::<Vec<_>>(), *expected, "{inserted:?}");
        }
    }

    #[test]
    fn what_is_missing_and_how_far_the_prefix_runs() {
        // (set, size, missing, contiguous, is_prefix)
        let cases: &[(Spans, u64, Spans, u64, bool)] = &[
            (&[], 100, &[(0, 100)], 0, true),
            (&[(0, 100)], 100, &[], 100, true),
            (&[(0, 40)], 100, &[(40, 100)], 40, true),
            (&[(20, 40)], 100, &[(0, 20), (40, 100)], 0, false),
            (&[(0, 10), (50, 60)], 100, &[(10, 50), (60, 100)], 10, false),
            (&[(0, 10), (90, 100)], 100, &[(10, 90)], 10, false),
        ];
        for &(set, size, missing, contiguous, is_prefix) in cases {
            let ranges = Ranges::try_from(set.to_vec()).unwrap();
            assert_eq!(ranges.missing(size), missing, "{set:?}");
            assert_eq!(ranges.contiguous(), contiguous, "{set:?}");
            assert_eq!(ranges.is_prefix(), is_prefix, "{set:?}");
            let missing_len: u64 = missing.iter().map(|(s, e)| e - s).sum();
            assert_eq!(ranges.len() + missing_len, size, "{set:?}");
        }
    }

    #[test]
    fn only_ordered_disjoint_ranges_are_read_back() {
        for bad in [
            vec![(5, 5)],
            vec![(6, 5)],
            vec![(0, 10), (10, 20)],
            vec![(10, 20), (0, 5)],
        ] {
            assert!(Ranges::try_from(bad.clone()).is_err(), "{bad:?}");
        }
        let saved = serde_json::to_string(&Ranges::try_from(vec![(0, 5), (9, 12)]).unwrap());
        assert_eq!(saved.unwrap(), "[[0,5],[9,12]]");
    }
}

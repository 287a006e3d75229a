//! Stable row-id sequences: the row id of every physical row of a fragment, stored compactly.
//!
//! Freshly inserted rows get consecutive ids, so a fragment's sequence is usually one range.
//! Updates (which keep a row's id but move the row) and merges produce arbitrary ids; runs of
//! consecutive ids inside them still collapse to ranges, and only the rest is stored one id at a
//! time. This module is pure arithmetic, no IO.

use serde::{Deserialize, Serialize};

/// Runs shorter than this are cheaper stored as plain ids than as their own range segment.
const MIN_RUN: usize = 4;

/// One piece of a fragment's row-id sequence, covering consecutive physical rows: a range of
/// consecutive ids, or ids listed one by one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RowIdSegment {
    /// `start..end`, end exclusive.
    Range {
        /// The id of the piece's first row.
        start: u64,
        /// One past the id of its last row; the piece covers `end - start` rows.
        end: u64,
    },
    /// Ids listed one per row, for ids that do not form runs worth a range.
    Ids {
        /// The rows' ids, in offset order.
        ids: Vec<u64>,
    },
}

impl RowIdSegment {
    fn len(&self) -> u64 {
        match self {
            RowIdSegment::Range { start, end } => end - start,
            RowIdSegment::Ids { ids } => ids.len() as u64,
        }
    }
}

/// The row ids of one fragment's physical rows, in offset order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowIdSequence {
    segments: Vec<RowIdSegment>,
}

impl RowIdSequence {
    /// The `len` consecutive ids `start..start + len` (empty when `len` is 0).
    pub fn from_range(start: u64, len: u64) -> Self {
        if len == 0 {
            return Self::default();
        }
        Self {
            segments: vec![RowIdSegment::Range {
                start,
                end: start + len,
            }],
        }
    }

    /// Builds a sequence from arbitrary ids, collapsing runs of consecutive ids into ranges.
    pub fn from_ids(ids: impl IntoIterator<Item = u64>) -> Self {
        let ids: Vec<u64> = ids.into_iter().collect();
        let mut seq = Self::default();
        let mut loose: Vec<u64> = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let mut j = i + 1;
            while j < ids.len() && ids[j - 1].checked_add(1) == Some(ids[j]) {
                j += 1;
            }
            if j - i >= MIN_RUN {
                if !loose.is_empty() {
                    seq.segments.push(RowIdSegment::Ids {
                        ids: std::mem::take(&mut loose),
                    });
                }
                seq.segments.push(RowIdSegment::Range {
                    start: ids[i],
                    end: ids[j - 1] + 1,
                });
            } else {
                loose.extend_from_slice(&ids[i..j]);
            }
            i = j;
        }
        if !loose.is_empty() {
            seq.segments.push(RowIdSegment::Ids { ids: loose });
        }
        seq
    }

    /// How many ids the sequence holds: one per physical row of its fragment.
    pub fn len(&self) -> u64 {
        self.segments.iter().map(RowIdSegment::len).sum()
    }

    /// Whether the sequence holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sequence's pieces, in offset order.
    pub fn segments(&self) -> &[RowIdSegment] {
        &self.segments
    }

    /// Every id, in row (offset) order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments
            .iter()
            .flat_map(|s| -> Box<dyn Iterator<Item = u64> + '_> {
                match s {
                    RowIdSegment::Range { start, end } => Box::new(*start..*end),
                    RowIdSegment::Ids { ids } => Box::new(ids.iter().copied()),
                }
            })
    }

    /// The ids of offsets `offset..offset + len`, appended to `out`.
    pub fn extend_slice(&self, offset: u64, len: u64, out: &mut Vec<u64>) {
        let mut skip = offset;
        let mut want = len;
        for seg in &self.segments {
            if want == 0 {
                break;
            }
            let n = seg.len();
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = (n - skip).min(want);
            match seg {
                RowIdSegment::Range { start, .. } => {
                    out.extend(start + skip..start + skip + take);
                }
                RowIdSegment::Ids { ids } => {
                    out.extend_from_slice(&ids[skip as usize..(skip + take) as usize]);
                }
            }
            want -= take;
            skip = 0;
        }
    }

    /// The ids of rows `offset..offset + len`, as a new sequence (cut short at the end of
    /// this one).
    pub fn slice(&self, offset: u64, len: u64) -> Self {
        let mut ids = Vec::with_capacity(len as usize);
        self.extend_slice(offset, len, &mut ids);
        Self::from_ids(ids)
    }

    /// The largest id in the sequence, if any.
    pub fn max_id(&self) -> Option<u64> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                RowIdSegment::Range { end, .. } => Some(end - 1),
                RowIdSegment::Ids { ids } => ids.iter().copied().max(),
            })
            .max()
    }

    /// Checks segment shape (non-empty ranges, a total length that fits a `u64`); used when
    /// a manifest is opened, and required before [`len`](Self::len) on decoded data.
    pub fn validate(&self) -> Result<(), String> {
        let mut total = 0u64;
        for seg in &self.segments {
            if let RowIdSegment::Range { start, end } = seg
                && end <= start
            {
                return Err(format!("empty or inverted row-id range {start}..{end}"));
            }
            total = total
                .checked_add(seg.len())
                .ok_or("row-id sequence is longer than u64::MAX ids")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fuzz::mutated;
    use proptest::prelude::*;

    /// Row-id sequences are persisted as JSON inside the manifest: whatever deserializes and
    /// validates must be usable without panicking, and re-serialize to an equal value.
    fn check_decoded(bytes: &[u8]) {
        let Ok(seq) = serde_json::from_slice::<RowIdSequence>(bytes) else {
            return;
        };
        if seq.validate().is_err() {
            return;
        }
        let len = seq.len();
        let max = seq.max_id();
        assert_eq!(max.is_none(), len == 0);
        let mut window = Vec::new();
        seq.extend_slice(len.saturating_sub(3), 8, &mut window);
        assert_eq!(window.len() as u64, len.min(3));
        let again: RowIdSequence =
            serde_json::from_slice(&serde_json::to_vec(&seq).unwrap()).unwrap();
        assert_eq!(again, seq);
    }

    #[test]
    fn overlong_sequences_are_invalid_not_overflowed() {
        let json = br#"{"segments": [
            {"kind": "range", "start": 0, "end": 18446744073709551615},
            {"kind": "range", "start": 0, "end": 2}]}"#;
        let seq: RowIdSequence = serde_json::from_slice(json).unwrap();
        assert!(seq.validate().unwrap_err().contains("longer than"));
    }

    fn valid_json() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(0u64..60, 0..40)
            .prop_map(|ids| serde_json::to_vec(&RowIdSequence::from_ids(ids)).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_row_id_sequence_never_panics_on_arbitrary_bytes(
            bytes in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..200),
                // Well-formed JSON of the right shape with arbitrary numbers.
                prop::collection::vec(
                    (any::<bool>(), any::<u64>(), any::<u64>()), 0..4,
                ).prop_map(|segs| {
                    let segs: Vec<String> = segs.iter().map(|&(r, a, b)| if r {
                        format!(r#"{{"kind":"range","start":{a},"end":{b}}}"#)
                    } else {
                        format!(r#"{{"kind":"ids","ids":[{a},{b}]}}"#)
                    }).collect();
                    format!(r#"{{"segments":[{}]}}"#, segs.join(",")).into_bytes()
                }),
            ],
        ) {
            check_decoded(&bytes);
        }

        #[test]
        fn prop_row_id_sequence_never_panics_on_mutated_valid_input(
            bytes in valid_json().prop_flat_map(mutated),
        ) {
            check_decoded(&bytes);
        }
    }

    #[test]
    fn consecutive_ids_collapse_to_one_range() {
        let seq = RowIdSequence::from_ids(10..1010);
        assert_eq!(
            seq.segments(),
            &[RowIdSegment::Range {
                start: 10,
                end: 1010
            }]
        );
        assert_eq!(seq.len(), 1000);
    }

    #[test]
    fn short_runs_stay_loose() {
        let seq = RowIdSequence::from_ids([5, 9, 10, 20, 21, 22, 23, 24, 3]);
        assert_eq!(
            seq.segments(),
            &[
                RowIdSegment::Ids {
                    ids: vec![5, 9, 10]
                },
                RowIdSegment::Range { start: 20, end: 25 },
                RowIdSegment::Ids { ids: vec![3] },
            ]
        );
    }

    proptest! {
        #[test]
        fn round_trips_and_slices_match_a_plain_vector(
            ids in prop::collection::vec(0u64..200, 0..300),
            a in 0usize..300, b in 0usize..300,
        ) {
            let seq = RowIdSequence::from_ids(ids.iter().copied());
            prop_assert_eq!(seq.iter().collect::<Vec<_>>(), ids.clone());
            prop_assert_eq!(seq.len() as usize, ids.len());
            let (lo, hi) = (a.min(b).min(ids.len()), a.max(b).min(ids.len()));
            let sliced = seq.slice(lo as u64, (hi - lo) as u64);
            prop_assert_eq!(sliced.iter().collect::<Vec<_>>(), ids[lo..hi].to_vec());
            prop_assert_eq!(seq.max_id(), ids.iter().copied().max());
        }
    }
}

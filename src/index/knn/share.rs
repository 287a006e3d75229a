//! Part of a KNN search: a *share* searches some of an index's segments and scores the
//! unowned rows of some fragments, so a search can be split into tasks (on other machines)
//! whose answers merge into the whole search's answer.
//!
//! A [`KnnShare`] names segments (by id) and fragments (by id). Its *rows* are, with an
//! index, the rows its segments own (their ownership as on one machine, see
//! [`crate::index::ownership`]) plus the rows of its fragments that no segment owns; without
//! an index (exact search), all rows of its fragments.
//!
//! Invariants (what makes a split exact):
//! * When every segment of the index is in exactly one share of a split and every fragment
//!   of the snapshot in exactly one share, the shares' rows partition the table's rows:
//!   ownerships of one index's segments never overlap, and a row no segment owns belongs to
//!   the share of its fragment (`prop_shares_partition_rows`).
//! * A share applies the ownership, deletion and filter rules of the single-machine search
//!   to its rows unchanged, and its answer is its local top-k of owned, live, qualifying
//!   rows. Merging the shares' answers by distance gives the single-machine answer whenever
//!   both take the same path; the paths that look at all rows at once (scoring few masked
//!   rows exactly, the exact fallback when the index returns too few rows) are decided per
//!   share over its own rows, which can only make a share's answer more exact.
//!
//! A *sliced* split ([`Slice`]) spreads one index over tasks when it has fewer segments than
//! tasks (one segment after `OPTIMIZE INDEX ... MERGE`): every share names every segment and
//! every fragment, and share `i` of `n` searches the partitions `p` with `p % n == i` of each
//! segment, and scores by brute force the unowned rows at offsets `o % n == i`. Its rows for
//! the exact paths (few masked rows scored exactly, the exact fallback) are the rows at
//! offsets `o % n == i` ([`ShareRows::resolve`]). So that the shares of a sliced split never
//! take different paths over the same rows, every decision the single-machine search makes
//! from counts (score the mask exactly, probe further partitions, fall back to exact) is
//! made by each sliced share from the whole table's counts, as the single machine makes it:
//! the WHERE mask is evaluated over every fragment, and a share whose own slice is short
//! counts the other slices' rows (see [`crate::index::knn`]). A sliced split's merged
//! answer is therefore the single-machine answer, whatever the path.
//!
//! Resolution is pure: ownerships are computed by the caller (through the index cache).

use std::collections::{BTreeMap, BTreeSet};

use roaring::{RoaringBitmap, RoaringTreemap};

use crate::format::Fragment;
use crate::index::row_mask::Deletions;
use crate::ledger::ids::split_row_address;
use crate::ledger::{Coverage, SegmentOwnership};

/// The segments and fragments one part of a split KNN search answers for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnnShare {
    /// Segments (ids) searched, each under its whole ownership.
    pub segments: BTreeSet<u64>,
    /// Fragments (ids) whose rows no segment owns are scored here by brute force (all their
    /// rows when the search uses no index).
    pub fragments: BTreeSet<u64>,
    /// Set in a sliced split: the part of every segment and fragment this share answers for.
    pub slice: Option<Slice>,
}

impl KnnShare {
    /// Whether the share has nothing to search.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.fragments.is_empty()
    }
}

/// Share `index` of a sliced split into `of` shares: partitions `p % of == index` of every
/// segment, rows at offsets `o % of == index` for brute force and the exact paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slice {
    /// This slice's position, from 0.
    pub index: u32,
    /// How many slices the split has.
    pub of: u32,
}

impl Slice {
    /// `None` unless `index < of`.
    pub fn new(index: u32, of: u32) -> Option<Self> {
        (index < of).then_some(Self { index, of })
    }

    /// Whether IVF partition `p` is searched by this slice.
    pub fn has_partition(&self, p: usize) -> bool {
        p % self.of as usize == self.index as usize
    }

    /// Whether the row at fragment offset `offset` is this slice's (brute force, exact paths).
    pub fn has_offset(&self, offset: u64) -> bool {
        offset % u64::from(self.of) == u64::from(self.index)
    }

    /// How many offsets below `physical_rows` are this slice's.
    fn count(&self, physical_rows: u64) -> u64 {
        physical_rows
            .saturating_sub(u64::from(self.index))
            .div_ceil(u64::from(self.of))
    }

    /// The offsets below `physical_rows` that are not this slice's.
    pub fn others(&self, physical_rows: u64) -> RoaringBitmap {
        let end = u32::try_from(physical_rows).unwrap_or(u32::MAX);
        (0..end)
            .filter(|o| !self.has_offset(u64::from(*o)))
            .collect()
    }
}

/// The rows of a share, per fragment of the snapshot (fragments without any are absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShareRows {
    rows: BTreeMap<u64, Coverage>,
    /// A sliced share: of each fragment in `rows` (all `Whole`), the offsets of this slice.
    /// Kept as arithmetic: a query must not build a bitmap of half the table.
    slice: Option<Slice>,
}

impl ShareRows {
    /// The rows of `share` in a snapshot with `fragments`, given each segment's ownership
    /// (`None`: the search uses no index, so a share's rows are its fragments' rows).
    pub fn resolve(
        share: &KnnShare,
        fragments: &[Fragment],
        owners: Option<&BTreeMap<u64, SegmentOwnership>>,
    ) -> Self {
        let mut rows: BTreeMap<u64, Coverage> = BTreeMap::new();
        if let Some(slice) = share.slice {
            for f in fragments.iter().filter(|f| share.fragments.contains(&f.id)) {
                if slice.count(f.physical_rows) > 0 {
                    rows.insert(f.id, Coverage::Whole);
                }
            }
            return Self {
                rows,
                slice: Some(slice),
            };
        }
        let Some(owners) = owners else {
            for f in fragments.iter().filter(|f| share.fragments.contains(&f.id)) {
                rows.insert(f.id, Coverage::Whole);
            }
            return Self { rows, slice: None };
        };
        for (segment, ownership) in owners {
            if !share.segments.contains(segment) {
                continue;
            }
            for (f, coverage) in &ownership.fragments {
                union_into(&mut rows, *f, coverage);
            }
        }
        for f in fragments.iter().filter(|f| share.fragments.contains(&f.id)) {
            // Rows of this fragment that some segment (of any share) owns.
            let mut owned = RoaringBitmap::new();
            let mut whole = false;
            for ownership in owners.values() {
                match ownership.fragments.get(&f.id) {
                    Some(Coverage::Whole) => whole = true,
                    Some(Coverage::Rows(r)) => owned |= r,
                    None => {}
                }
            }
            if whole {
                continue;
            }
            if owned.is_empty() {
                union_into(&mut rows, f.id, &Coverage::Whole);
            } else {
                let unowned = all_rows(f.physical_rows) - owned;
                if !unowned.is_empty() {
                    union_into(&mut rows, f.id, &Coverage::Rows(unowned));
                }
            }
        }
        Self { rows, slice: None }
    }

    /// The slice of a sliced share's rows.
    pub fn slice(&self) -> Option<Slice> {
        self.slice
    }

    /// Whether the row at `addr` is one of the share's.
    pub fn contains(&self, addr: u64) -> bool {
        let (f, o) = split_row_address(addr);
        if self.slice.is_some_and(|s| !s.has_offset(o)) {
            return false;
        }
        match self.rows.get(&f) {
            Some(Coverage::Whole) => true,
            Some(Coverage::Rows(r)) => u32::try_from(o).is_ok_and(|o| r.contains(o)),
            None => false,
        }
    }

    /// Whether the share holds any row of this fragment.
    pub fn contains_fragment(&self, fragment: u64) -> bool {
        self.rows.contains_key(&fragment)
    }

    /// Fragments (ids) holding at least one of the share's rows.
    pub fn fragments(&self) -> impl Iterator<Item = u64> + '_ {
        self.rows.keys().copied()
    }

    /// The addresses of `mask` that are the share's rows.
    pub fn restrict(&self, mask: &RoaringTreemap) -> RoaringTreemap {
        mask.iter().filter(|a| self.contains(*a)).collect()
    }

    /// Live rows of the share (`deletions`: the deletion vectors of fragments with one).
    pub fn live_rows(&self, fragments: &[Fragment], deletions: &Deletions) -> u64 {
        fragments
            .iter()
            .filter_map(|f| self.rows.get(&f.id).map(|c| (f, c)))
            .map(|(f, coverage)| match (coverage, self.slice) {
                (Coverage::Whole, Some(slice)) => {
                    let deleted = deletions.get(&f.id).map_or(0, |d| {
                        d.iter().filter(|o| slice.has_offset(u64::from(*o))).count() as u64
                    });
                    slice.count(f.physical_rows).saturating_sub(deleted)
                }
                (Coverage::Whole, None) => f.live_rows(),
                (Coverage::Rows(r), _) => match deletions.get(&f.id) {
                    Some(d) => r.difference_len(d),
                    None => r.len(),
                },
            })
            .sum()
    }

    /// For brute force over the share's fragments: the rows of each to skip (not the
    /// share's). Fragments the share holds wholly have no entry.
    pub fn skipped<'f>(
        &self,
        fragments: impl IntoIterator<Item = &'f Fragment>,
    ) -> std::collections::HashMap<u64, RoaringBitmap> {
        fragments
            .into_iter()
            .filter_map(|f| match (self.rows.get(&f.id), self.slice) {
                (Some(Coverage::Whole), Some(slice)) => Some((f.id, slice.others(f.physical_rows))),
                (Some(Coverage::Rows(r)), _) => Some((f.id, all_rows(f.physical_rows) - r)),
                _ => None,
            })
            .collect()
    }
}

fn all_rows(physical_rows: u64) -> RoaringBitmap {
    let mut all = RoaringBitmap::new();
    all.insert_range(0..u32::try_from(physical_rows).unwrap_or(u32::MAX));
    all
}

fn union_into(rows: &mut BTreeMap<u64, Coverage>, fragment: u64, coverage: &Coverage) {
    match (rows.get_mut(&fragment), coverage) {
        (None, c) => {
            rows.insert(fragment, c.clone());
        }
        (Some(Coverage::Whole), _) => {}
        (Some(slot), Coverage::Whole) => *slot = Coverage::Whole,
        (Some(Coverage::Rows(have)), Coverage::Rows(more)) => *have |= more,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ids::row_address;
    use proptest::prelude::*;

    fn fragment(id: u64, rows: u64) -> Fragment {
        Fragment {
            id,
            files: vec![],
            physical_rows: rows,
            deletion: None,
            row_ids: None,
        }
    }

    /// Each row's owner: `Some(segment)` or `None` (unowned), per fragment.
    type Owners = Vec<Vec<Option<u64>>>;

    fn ownerships(owners: &Owners) -> BTreeMap<u64, SegmentOwnership> {
        let mut out: BTreeMap<u64, SegmentOwnership> = BTreeMap::new();
        for segment in 0..3u64 {
            out.insert(segment, SegmentOwnership::default());
        }
        for (f, rows) in owners.iter().enumerate() {
            for segment in 0..3u64 {
                let mine: RoaringBitmap = rows
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| **o == Some(segment))
                    .map(|(i, _)| i as u32)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let coverage = if mine.len() == rows.len() as u64 {
                    Coverage::Whole
                } else {
                    Coverage::Rows(mine)
                };
                out.get_mut(&segment)
                    .expect("segment")
                    .fragments
                    .insert(f as u64, coverage);
            }
        }
        out
    }

    fn owners_strategy() -> impl Strategy<Value = Owners> {
        prop::collection::vec(
            prop::collection::vec(prop::option::of(0..3u64), 1..12),
            0..6,
        )
    }

    proptest! {
        /// The shares of a split partition the table's rows, and each row is in the share
        /// of its owning segment (or of its fragment when no segment owns it). If this
        /// fails, a split search counts a row twice or never.
        #[test]
        fn prop_shares_partition_rows(
            owners in owners_strategy(),
            segment_share in prop::collection::vec(0..3usize, 3),
            fragment_share in prop::collection::vec(0..3usize, 6),
        ) {
            let fragments: Vec<Fragment> = owners
                .iter()
                .enumerate()
                .map(|(f, rows)| fragment(f as u64, rows.len() as u64))
                .collect();
            let owned = ownerships(&owners);
            let mut shares = vec![KnnShare::default(); 3];
            for (segment, share) in segment_share.iter().enumerate() {
                shares[*share].segments.insert(segment as u64);
            }
            for f in &fragments {
                shares[fragment_share[f.id as usize]].fragments.insert(f.id);
            }
            let rows: Vec<ShareRows> = shares
                .iter()
                .map(|s| ShareRows::resolve(s, &fragments, Some(&owned)))
                .collect();
            for (f, row_owners) in owners.iter().enumerate() {
                for (offset, owner) in row_owners.iter().enumerate() {
                    let addr = row_address(f as u64, offset as u64);
                    let holders: Vec<usize> =
                        (0..3).filter(|s| rows[*s].contains(addr)).collect();
                    let expected = match owner {
                        Some(segment) => segment_share[*segment as usize],
                        None => fragment_share[f],
                    };
                    prop_assert_eq!(holders, vec![expected]);
                }
            }
        }

        /// Without an index a share's rows are exactly its fragments' rows.
        #[test]
        fn prop_exact_share_is_its_fragments(
            sizes in prop::collection::vec(1..20u64, 0..6),
            mine in prop::collection::vec(any::<bool>(), 6),
        ) {
            let fragments: Vec<Fragment> =
                sizes.iter().enumerate().map(|(f, n)| fragment(f as u64, *n)).collect();
            let share = KnnShare {
                segments: BTreeSet::new(),
                fragments: fragments.iter().filter(|f| mine[f.id as usize]).map(|f| f.id).collect(),
                slice: None,
            };
            let rows = ShareRows::resolve(&share, &fragments, None);
            for f in &fragments {
                for o in 0..f.physical_rows {
                    prop_assert_eq!(rows.contains(row_address(f.id, o)), mine[f.id as usize]);
                }
            }
        }
    }

    proptest! {
        /// A sliced share's rows, kept as arithmetic, are exactly the rows at its offsets
        /// of its fragments: membership, live count and the rows brute force skips agree
        /// with a naive reference, and the slices of a split partition the rows.
        #[test]
        fn prop_sliced_share_rows_match_a_naive_reference(
            sizes in prop::collection::vec(0..40u64, 1..5),
            deleted in prop::collection::vec(0..40u32, 0..20),
            of in 1..5u32,
        ) {
            let fragments: Vec<Fragment> =
                sizes.iter().enumerate().map(|(f, n)| fragment(f as u64, *n)).collect();
            let deletions: Deletions =
                [(0u64, std::sync::Arc::new(deleted.iter().copied().filter(|o| u64::from(*o) < sizes[0]).collect()))]
                    .into_iter()
                    .collect();
            let all: BTreeSet<u64> = fragments.iter().map(|f| f.id).collect();
            let mut holders = std::collections::HashMap::<u64, u32>::new();
            for index in 0..of {
                let share = KnnShare {
                    segments: BTreeSet::new(),
                    fragments: all.clone(),
                    slice: Slice::new(index, of),
                };
                let rows = ShareRows::resolve(&share, &fragments, None);
                let mut live = 0;
                for f in &fragments {
                    let skipped = rows.skipped(&fragments).remove(&f.id).unwrap_or_default();
                    for o in 0..f.physical_rows {
                        let addr = row_address(f.id, o);
                        let mine = o % u64::from(of) == u64::from(index);
                        prop_assert_eq!(rows.contains(addr), mine);
                        // (Brute force visits only the fragments the share holds rows of.)
                        if rows.contains_fragment(f.id) {
                            prop_assert_eq!(skipped.contains(o as u32), !mine);
                        }
                        if mine {
                            *holders.entry(addr).or_default() += 1;
                            if !deletions.get(&f.id).is_some_and(|d| d.contains(o as u32)) {
                                live += 1;
                            }
                        }
                    }
                }
                prop_assert_eq!(rows.live_rows(&fragments, &deletions), live);
            }
            let total: u64 = sizes.iter().sum();
            prop_assert_eq!(holders.len() as u64, total);
            prop_assert!(holders.values().all(|n| *n == 1));
        }
    }

    #[test]
    fn partly_owned_fragment_splits_between_segment_and_fragment_shares() {
        // Fragment 0 has 4 rows: segment 7 owns rows 1 and 2, rows 0 and 3 are unowned.
        let fragments = vec![fragment(0, 4)];
        let mut owned = BTreeMap::new();
        let mut ownership = SegmentOwnership::default();
        ownership
            .fragments
            .insert(0, Coverage::Rows([1u32, 2].into_iter().collect()));
        owned.insert(7, ownership);
        let by_segment = KnnShare {
            segments: [7].into(),
            fragments: BTreeSet::new(),
            slice: None,
        };
        let by_fragment = KnnShare {
            segments: BTreeSet::new(),
            fragments: [0].into(),
            slice: None,
        };
        let a = ShareRows::resolve(&by_segment, &fragments, Some(&owned));
        let b = ShareRows::resolve(&by_fragment, &fragments, Some(&owned));
        let holds = |r: &ShareRows| {
            (0..4)
                .filter(|o| r.contains(row_address(0, *o)))
                .collect::<Vec<_>>()
        };
        assert_eq!(holds(&a), vec![1, 2]);
        assert_eq!(holds(&b), vec![0, 3]);
        assert_eq!(
            b.skipped(&fragments)[&0].iter().collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(b.live_rows(&fragments, &Default::default()), 2);
    }
}

//! A segment's row mask: which rows of a segment a search may return ([`RowMask`]), and a
//! cursor that asks it row after row, for rows that come in address order.
//!
//! [`RowMask::verdict`] answers one row from scratch: a search of the owned fragments, a
//! hash lookup of the fragment's deleted rows and a search of that bitmap. Scoring an index
//! partition asks it for every row, and on a live table (deletions in most fragments) that
//! was 9% of the server's CPU under `perf`. The rows of a partition come in address order
//! (fragment, then offset) as a segment is written, so a cursor keeps what it found for the
//! previous row's fragment and walks that fragment's deleted rows forward with the rows; a
//! row whose offset goes back (rows placed by a translation need not be in order) is
//! answered by a plain lookup, and the walk starts again after it. Pure computation, the
//! same verdicts as [`RowMask::verdict`] for any order of rows (property test below).

use std::collections::HashMap;
use std::sync::Arc;

use roaring::bitmap::Iter;
use roaring::{RoaringBitmap, RoaringTreemap};

use crate::ledger::ids::split_row_address;

/// Why a row was dropped before scoring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The row may be returned.
    Keep,
    /// The segment no longer owns the row.
    NotOwned,
    /// The row was deleted.
    Deleted,
    /// The row fails the WHERE filter.
    Filtered,
}

/// Deleted rows by fragment id, for the fragments that have any: the database's cached
/// deletion vectors themselves, shared, not copied per query.
pub type Deletions = HashMap<u64, Arc<RoaringBitmap>>;

/// Which rows of a segment may be returned.
#[derive(Debug, Default)]
pub struct RowMask<'a> {
    /// Fragments the segment owns and that are still in the table, ascending (a segment
    /// owns few fragments: halving a short list beats hashing on every row).
    pub owned: Vec<u64>,
    /// Deleted rows, per owned fragment.
    pub deletions: Option<&'a Deletions>,
    /// Addresses that pass the query's WHERE filter; `None` = no filter.
    pub allowed: Option<&'a RoaringTreemap>,
}

impl RowMask<'_> {
    /// Whether the row at `addr` may be returned, and if not why.
    #[inline]
    pub fn verdict(&self, addr: u64) -> Verdict {
        let (frag, offset) = split_row_address(addr);
        if self.owned.binary_search(&frag).is_err() {
            return Verdict::NotOwned;
        }
        if let Some(d) = self.deletions.and_then(|d| d.get(&frag))
            && d.contains(offset as u32)
        {
            return Verdict::Deleted;
        }
        if let Some(a) = self.allowed
            && !a.contains(addr)
        {
            return Verdict::Filtered;
        }
        Verdict::Keep
    }
}

/// [`RowMask::verdict`] for a run of rows, cheapest when they come in address order.
pub struct MaskCursor<'m, 'a> {
    mask: &'m RowMask<'a>,
    /// The previous row's fragment, and what the mask holds for it.
    fragment: Option<Fragment<'a>>,
}

/// What the mask holds for one fragment, and the walk over its deleted rows.
struct Fragment<'a> {
    id: u64,
    owned: bool,
    deleted: Option<&'a RoaringBitmap>,
    /// The previous row's offset in the fragment.
    last_offset: u32,
    /// The deleted rows from the previous row's offset on: the iterator past the first of
    /// them, and that first one (`None`: no deleted row is left).
    walk: Option<(Iter<'a>, Option<u32>)>,
}

impl<'m, 'a> MaskCursor<'m, 'a> {
    /// A cursor over `mask`, before any row.
    pub fn new(mask: &'m RowMask<'a>) -> Self {
        Self {
            mask,
            fragment: None,
        }
    }

    /// Whether the row at `addr` may be returned, and if not why: what
    /// [`RowMask::verdict`] says.
    #[inline]
    pub fn verdict(&mut self, addr: u64) -> Verdict {
        let (id, offset) = split_row_address(addr);
        let offset = offset as u32;
        let mask = self.mask;
        let fragment = match &mut self.fragment {
            Some(f) if f.id == id => f,
            slot => slot.insert(Fragment {
                id,
                owned: mask.owned.binary_search(&id).is_ok(),
                deleted: mask.deletions.and_then(|d| d.get(&id)).map(|d| d.as_ref()),
                last_offset: offset,
                walk: None,
            }),
        };
        if !fragment.owned {
            return Verdict::NotOwned;
        }
        if fragment.is_deleted(offset) {
            return Verdict::Deleted;
        }
        if let Some(a) = mask.allowed
            && !a.contains(addr)
        {
            return Verdict::Filtered;
        }
        Verdict::Keep
    }
}

impl Fragment<'_> {
    fn is_deleted(&mut self, offset: u32) -> bool {
        let Some(deleted) = self.deleted else {
            return false;
        };
        let went_back = offset < self.last_offset;
        self.last_offset = offset;
        if went_back {
            self.walk = None;
            return deleted.contains(offset);
        }
        let (rest, next) = self.walk.get_or_insert_with(|| {
            let mut rest = deleted.iter();
            rest.advance_to(offset);
            let next = rest.next();
            (rest, next)
        });
        if next.is_some_and(|n| n < offset) {
            rest.advance_to(offset);
            *next = rest.next();
        }
        *next == Some(offset)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ledger::ids::row_address;

    fn bitmap(offsets: &[u32]) -> RoaringBitmap {
        offsets.iter().copied().collect()
    }

    proptest! {
        /// The cursor's verdicts are `RowMask::verdict`'s, for rows in order, out of
        /// order, repeated, and across fragments owned or not, with deletions (including
        /// offsets past 65,535, in a second bitmap container) and a filter.
        #[test]
        fn cursor_verdicts_equal_the_masks(
            owned in prop::collection::btree_set(0u64..6, 0..6),
            deleted in prop::collection::vec(
                (0u64..6, prop::collection::vec(
                    prop_oneof![0u32..200, 65_530u32..65_700], 0..80)), 0..6),
            allowed in prop::option::of(prop::collection::vec((0u64..6, 0u32..200), 0..200)),
            rows in prop::collection::vec((0u64..6, prop_oneof![0u32..200, 65_530u32..65_700]), 0..400),
            sort in any::<bool>(),
        ) {
            let deletions: Deletions =
                deleted.iter().map(|(f, o)| (*f, Arc::new(bitmap(o)))).collect();
            let allowed: Option<RoaringTreemap> = allowed
                .map(|a| a.iter().map(|(f, o)| row_address(*f, *o as u64)).collect());
            let mask = RowMask {
                owned: owned.iter().copied().collect(),
                deletions: Some(&deletions),
                allowed: allowed.as_ref(),
            };
            let mut addrs: Vec<u64> = rows.iter().map(|(f, o)| row_address(*f, *o as u64)).collect();
            if sort {
                addrs.sort_unstable();
            }
            let mut cursor = MaskCursor::new(&mask);
            for addr in addrs {
                prop_assert_eq!(cursor.verdict(addr), mask.verdict(addr), "row {:#x}", addr);
            }
        }
    }

    #[test]
    fn a_walk_finds_every_deleted_row_of_an_ordered_run() {
        let deletions = Deletions::from([(1, Arc::new(bitmap(&[0, 2, 3, 70_000])))]);
        let mask = RowMask {
            owned: vec![1],
            deletions: Some(&deletions),
            allowed: None,
        };
        let mut cursor = MaskCursor::new(&mask);
        let deleted: Vec<u64> = (0..4)
            .chain([69_999, 70_000, 70_001])
            .filter(|o| cursor.verdict(row_address(1, *o)) == Verdict::Deleted)
            .collect();
        assert_eq!(deleted, vec![0, 2, 3, 70_000]);
        assert_eq!(cursor.verdict(row_address(2, 0)), Verdict::NotOwned);
    }
}

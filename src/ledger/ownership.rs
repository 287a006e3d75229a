//! Which current rows an index segment may answer for, after rewrites moved its rows.
//!
//! A segment owns `fragment_bitmap − invalidated_fragments`, in the fragment ids its file
//! was written with. Each transition passes ownership on: when the segment owns every source
//! wholly, it owns every destination wholly (compaction bins never straddle coverage, so this
//! is the common case and costs one set lookup per source); when it owns only some rows, it
//! owns exactly their images, as row bitmaps (a RECLUSTER destination mixes rows of every
//! source). A destination later rewritten in place is in `invalidated_fragments` and passes
//! nothing on. Ownership is disjoint across an index's segments because translation is
//! injective and the starting ownerships are disjoint.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use roaring::RoaringBitmap;

use super::Result;
use super::translate::{LedgerView, LoadedMapping};
use crate::ledger::ids::split_row_address;

/// How much of one current fragment a segment owns.
#[derive(Clone, Debug, PartialEq)]
pub enum Coverage {
    /// The segment owns every row of the fragment.
    Whole,
    /// The segment owns these rows, as offsets within the fragment's files.
    Rows(RoaringBitmap),
}

/// A segment's ownership over the current fragments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SegmentOwnership {
    /// Coverage per current fragment id; a fragment the segment owns no row of is absent.
    pub fragments: BTreeMap<u64, Coverage>,
}

impl SegmentOwnership {
    /// Whether the segment owns at least one row of `fragment` (a current fragment id).
    pub fn owns_fragment(&self, fragment: u64) -> bool {
        self.fragments.contains_key(&fragment)
    }

    /// Whether the segment owns this row (of a fragment still in the table).
    pub fn covers(&self, addr: u64) -> bool {
        let (f, o) = split_row_address(addr);
        match self.fragments.get(&f) {
            Some(Coverage::Whole) => true,
            Some(Coverage::Rows(rows)) => rows.contains(o as u32),
            None => false,
        }
    }

    /// True when every owned fragment is owned wholly.
    pub fn is_whole(&self) -> bool {
        self.fragments
            .values()
            .all(|c| matches!(c, Coverage::Whole))
    }
}

impl LedgerView {
    /// Ownership in current fragment ids. `owned` is the segment's own ownership,
    /// `invalidated` its invalidated fragments (in any id domain), `current` says which
    /// fragments are still in the table.
    pub async fn ownership(
        &self,
        owned: &BTreeSet<u64>,
        invalidated: &BTreeSet<u64>,
        current: &HashSet<u64>,
    ) -> Result<SegmentOwnership> {
        let mut map: BTreeMap<u64, Coverage> = owned
            .iter()
            .filter(|f| !invalidated.contains(f))
            .map(|f| (*f, Coverage::Whole))
            .collect();
        for (t, loaded) in self.transitions().enumerate() {
            let tr = &loaded.transition;
            let taken: Vec<(usize, Coverage)> = tr
                .sources
                .iter()
                .enumerate()
                .filter_map(|(p, s)| map.remove(&s.id).map(|c| (p, c)))
                .collect();
            if taken.is_empty() {
                continue;
            }
            let all_whole = taken.len() == tr.sources.len()
                && taken.iter().all(|(_, c)| matches!(c, Coverage::Whole));
            let mut images: BTreeMap<u64, RoaringBitmap> = BTreeMap::new();
            if !all_whole {
                for (p, coverage) in &taken {
                    let source = tr.sources[*p].id;
                    let rows = match coverage {
                        Coverage::Whole => None,
                        Coverage::Rows(r) => Some(r),
                    };
                    match &loaded.mapping {
                        LoadedMapping::Ordered(remap) => {
                            for (d, bits) in remap.image(source, rows)? {
                                *images.entry(d).or_default() |= bits;
                            }
                        }
                        LoadedMapping::Partition(map) => {
                            let range = self.source_rows(t, *p);
                            let positions: Vec<u64> = match rows {
                                None => range.collect(),
                                Some(r) => r.iter().map(|o| range.start + o as u64).collect(),
                            };
                            for label in map.lookup(&positions).await?.into_iter().flatten() {
                                let (d, off) = label;
                                if let Some(dest) = tr.destinations.get(d as usize) {
                                    images.entry(dest.id).or_default().insert(off);
                                }
                            }
                        }
                    }
                }
            }
            for dest in &tr.destinations {
                if invalidated.contains(&dest.id) || dest.physical_rows == 0 {
                    continue;
                }
                let coverage = if all_whole {
                    Coverage::Whole
                } else {
                    match images.remove(&dest.id) {
                        None => continue,
                        Some(bits) if bits.len() == dest.physical_rows => Coverage::Whole,
                        Some(bits) => Coverage::Rows(bits),
                    }
                };
                // A segment may hold some of a fragment's rows directly and others through
                // the ledger: it owns the union.
                let merged = match (map.remove(&dest.id), coverage) {
                    (Some(Coverage::Whole), _) | (_, Coverage::Whole) => Coverage::Whole,
                    (Some(Coverage::Rows(a)), Coverage::Rows(b)) => {
                        let rows = a | b;
                        if rows.len() == dest.physical_rows {
                            Coverage::Whole
                        } else {
                            Coverage::Rows(rows)
                        }
                    }
                    (None, c) => c,
                };
                map.insert(dest.id, merged);
            }
        }
        map.retain(|f, _| current.contains(f));
        Ok(SegmentOwnership { fragments: map })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ids::row_address;
    use crate::ledger::ordered::OrderedRemap;
    use crate::ledger::transition::tests::ordered;
    use crate::ledger::translate::LoadedTransition;

    fn view(ts: Vec<crate::ledger::Transition>) -> LedgerView {
        LedgerView::new(
            ts.into_iter()
                .map(|t| LoadedTransition {
                    mapping: LoadedMapping::Ordered(
                        OrderedRemap::new(&t, vec![RoaringBitmap::new(); t.sources.len()]).unwrap(),
                    ),
                    transition: t,
                })
                .collect(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn ownership_follows_whole_and_partial_rewrites() {
        // 1,2 -> 3; then 3,4 -> 5 where the segment owns 1, 2 but not 4.
        let v = view(vec![
            ordered(1, &[(1, 3), (2, 2)], &[(3, 5)]),
            ordered(2, &[(3, 5), (4, 2)], &[(5, 7)]),
        ]);
        let all: HashSet<u64> = [3, 5].into();
        let own = v
            .ownership(&BTreeSet::from([1, 2]), &BTreeSet::new(), &all)
            .await
            .unwrap();
        assert_eq!(
            own.fragments,
            BTreeMap::from([(5, Coverage::Rows((0..5).collect()))])
        );
        assert!(own.covers(row_address(5, 4)) && !own.covers(row_address(5, 5)));
        // Fragment 3 rewritten in place after the first compaction: nothing passes on.
        let stale = v
            .ownership(&BTreeSet::from([1, 2]), &BTreeSet::from([3]), &all)
            .await
            .unwrap();
        assert!(stale.fragments.is_empty());
        let whole = v
            .ownership(&BTreeSet::from([1, 2, 4]), &BTreeSet::new(), &all)
            .await
            .unwrap();
        assert_eq!(whole.fragments, BTreeMap::from([(5, Coverage::Whole)]));
    }
}

//! Translation through an order-preserving rewrite (compaction), by rank arithmetic.
//!
//! The surviving rows of the sources, in source order then offset order, are numbered
//! 0, 1, 2, ... and fill the destinations in order. So a surviving row at `offset` of source
//! `s` is row `k = before(s) + offset − removed_before(offset)` of the concatenated
//! destinations, and a binary search over the destinations' cumulative row counts finds
//! its fragment. Memory is one entry per source and destination plus the sources' removed
//! rows (compressed bitmaps), whatever the row count.

use std::collections::HashMap;

use roaring::RoaringBitmap;

use super::transition::{Mapping, Transition};
use super::{LedgerError, Result};
use crate::ledger::ids::row_address;

/// Where one source row went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its fragment was not rewritten.
    Unchanged,
    /// It was deleted before the rewrite, so it did not move.
    Deleted,
    /// Its new row address.
    Moved(u64),
}

#[derive(Debug)]
struct Source {
    physical_rows: u64,
    removed: RoaringBitmap,
    /// Surviving rows of the earlier sources.
    before: u64,
}

/// The arithmetic of one `OrderedCompaction` transition.
#[derive(Debug)]
pub struct OrderedRemap {
    transition: u64,
    sources: Vec<Source>,
    position: HashMap<u64, usize>,
    /// `(fragment id, rows of earlier destinations)`, empty destinations skipped.
    destinations: Vec<(u64, u64)>,
}

impl OrderedRemap {
    /// `removed[i]` are the rows of source `i` that did not move (its deletion vector as
    /// the rewrite read it). Checked against the digests.
    pub fn new(t: &Transition, removed: Vec<RoaringBitmap>) -> Result<Self> {
        let bad = |reason: String| LedgerError::Transition {
            transition: t.id,
            reason,
        };
        if !matches!(t.mapping, Mapping::OrderedCompaction { .. }) {
            return Err(bad("is not an ordered compaction".into()));
        }
        t.check()?;
        if removed.len() != t.sources.len() {
            return Err(bad("removed rows not given for every source".into()));
        }
        let mut sources = Vec::with_capacity(removed.len());
        let mut position = HashMap::new();
        let mut before = 0;
        for (i, (digest, removed)) in t.sources.iter().zip(removed).enumerate() {
            if removed.len() != digest.deleted_rows {
                return Err(bad(format!(
                    "source {} should have {} removed rows, its deletion vector has {}",
                    digest.id,
                    digest.deleted_rows,
                    removed.len()
                )));
            }
            if removed
                .max()
                .is_some_and(|m| m as u64 >= digest.physical_rows)
            {
                return Err(bad(format!(
                    "source {} removes a row past its {} rows",
                    digest.id, digest.physical_rows
                )));
            }
            position.insert(digest.id, i);
            sources.push(Source {
                physical_rows: digest.physical_rows,
                removed,
                before,
            });
            before += digest.live_rows();
        }
        let mut destinations = Vec::new();
        let mut filled = 0;
        for d in &t.destinations {
            if d.physical_rows > 0 {
                destinations.push((d.id, filled));
                filled += d.physical_rows;
            }
        }
        Ok(Self {
            transition: t.id,
            sources,
            position,
            destinations,
        })
    }

    /// Position of `fragment` among the sources, if it is one.
    pub fn source_position(&self, fragment: u64) -> Option<usize> {
        self.position.get(&fragment).copied()
    }

    /// Where row `offset` of source `fragment` went.
    pub fn translate(&self, fragment: u64, offset: u64) -> Result<Step> {
        let Some(&s) = self.position.get(&fragment) else {
            return Ok(Step::Unchanged);
        };
        let source = &self.sources[s];
        if offset >= source.physical_rows {
            return Err(LedgerError::OutOfRange {
                addr: row_address(fragment, offset),
                fragment,
                offset,
                transition: self.transition,
            });
        }
        let o = offset as u32;
        if source.removed.contains(o) {
            return Ok(Step::Deleted);
        }
        // rank(o) counts removed rows ≤ o, and o itself is not removed.
        let k = source.before + offset - source.removed.rank(o);
        Ok(Step::Moved(self.landing(k)))
    }

    /// Where the sorted `offsets` of source `fragment` went, appended to `out` (`None`:
    /// removed). One sweep over the offsets and the source's removed rows, with a cursor
    /// over the destinations: O(offsets + removed rows).
    pub fn translate_sorted(
        &self,
        fragment: u64,
        offsets: &[u64],
        out: &mut Vec<Option<u64>>,
    ) -> Result<()> {
        let Some(&s) = self.position.get(&fragment) else {
            return Err(LedgerError::Transition {
                transition: self.transition,
                reason: format!("fragment {fragment} is not one of its sources"),
            });
        };
        let source = &self.sources[s];
        let mut removed = source.removed.iter().peekable();
        let mut removed_before = 0u64;
        let mut d = 0usize;
        let mut previous = None;
        for &o in offsets {
            if o >= source.physical_rows || previous.is_some_and(|p| p > o) {
                return Err(LedgerError::OutOfRange {
                    addr: row_address(fragment, o),
                    fragment,
                    offset: o,
                    transition: self.transition,
                });
            }
            previous = Some(o);
            while removed.peek().is_some_and(|r| (*r as u64) < o) {
                removed.next();
                removed_before += 1;
            }
            if removed.peek().is_some_and(|r| *r as u64 == o) {
                out.push(None);
                continue;
            }
            let k = source.before + o - removed_before;
            while d + 1 < self.destinations.len() && self.destinations[d + 1].1 <= k {
                d += 1;
            }
            let (id, before) = self.destinations[d];
            out.push(Some(row_address(id, k - before)));
        }
        Ok(())
    }

    /// Row address of row `k` of the concatenated destinations.
    fn landing(&self, k: u64) -> u64 {
        let d = self
            .destinations
            .partition_point(|&(_, before)| before <= k)
            - 1;
        let (id, before) = self.destinations[d];
        row_address(id, k - before)
    }

    /// Where the rows `offsets` (any subset of source `fragment`, or all of them) went:
    /// `(destination, offsets there)` pairs. Removed rows are left out. Used to carry
    /// ownership and concurrent deletions over the rewrite.
    pub fn image(
        &self,
        fragment: u64,
        offsets: Option<&RoaringBitmap>,
    ) -> Result<Vec<(u64, RoaringBitmap)>> {
        let Some(&s) = self.position.get(&fragment) else {
            return Ok(vec![]);
        };
        let source = &self.sources[s];
        let mut out: Vec<(u64, RoaringBitmap)> = Vec::new();
        let mut push = |addr: u64| {
            let (f, o) = crate::ledger::ids::split_row_address(addr);
            match out.last_mut() {
                Some((last, bits)) if *last == f => {
                    bits.insert(o as u32);
                }
                _ => out.push((f, RoaringBitmap::from_iter([o as u32]))),
            }
        };
        match offsets {
            None => {
                // All survivors: one contiguous run of k, cut at destination boundaries.
                let live = source.physical_rows - source.removed.len();
                let (mut k, end) = (source.before, source.before + live);
                while k < end {
                    let d = self.destinations.partition_point(|&(_, b)| b <= k) - 1;
                    let (id, before) = self.destinations[d];
                    let cap = self
                        .destinations
                        .get(d + 1)
                        .map_or(end, |&(_, next)| next.min(end));
                    let bits =
                        RoaringBitmap::from_iter(((k - before) as u32)..((cap - before) as u32));
                    out.push((id, bits));
                    k = cap;
                }
            }
            Some(offsets) => {
                for o in offsets {
                    if let Step::Moved(addr) = self.translate(fragment, o as u64)? {
                        push(addr);
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ids::split_row_address;
    use crate::ledger::transition::tests::digest;
    use proptest::prelude::*;

    fn transition(
        sources: &[(u64, u64, &[u32])],
        dests: &[(u64, u64)],
    ) -> (Transition, Vec<RoaringBitmap>) {
        let t = Transition {
            id: 9,
            source_version: 1,
            committed_version: 2,
            sources: sources
                .iter()
                .map(|&(f, r, d)| digest(f, r, d.len() as u64))
                .collect(),
            destinations: dests.iter().map(|&(f, r)| digest(f, r, 0)).collect(),
            mapping: Mapping::OrderedCompaction {
                removed: sources
                    .iter()
                    .map(|(f, _, d)| (!d.is_empty()).then(|| format!("del/{f}")))
                    .collect(),
                removed_crc32c: vec![],
            },
        };
        let removed = sources
            .iter()
            .map(|(_, _, d)| d.iter().copied().collect())
            .collect();
        (t, removed)
    }

    #[test]
    fn the_worked_example() {
        // Sources 4 (5 rows, keeps 0, 2, 4) and 3 (2 rows); destinations 10 (2), 11 (0), 12 (3).
        let (t, removed) = transition(
            &[(4, 5, &[1, 3]), (3, 2, &[])],
            &[(10, 2), (11, 0), (12, 3)],
        );
        let m = OrderedRemap::new(&t, removed).unwrap();
        let moved = |f, o| m.translate(f, o).unwrap();
        assert_eq!(moved(4, 0), Step::Moved(row_address(10, 0)));
        assert_eq!(moved(4, 2), Step::Moved(row_address(10, 1)));
        assert_eq!(moved(4, 4), Step::Moved(row_address(12, 0)));
        assert_eq!(moved(3, 0), Step::Moved(row_address(12, 1)));
        assert_eq!(moved(3, 1), Step::Moved(row_address(12, 2)));
        assert_eq!(moved(4, 1), Step::Deleted);
        assert_eq!(moved(5, 0), Step::Unchanged);
        assert!(m.translate(3, 2).is_err());
        let image = m.image(4, None).unwrap();
        assert_eq!(
            image,
            vec![
                (10, RoaringBitmap::from_iter([0, 1])),
                (12, RoaringBitmap::from_iter([0]))
            ]
        );
    }

    #[test]
    fn digests_must_match_the_removed_rows() {
        let (t, mut removed) = transition(&[(1, 5, &[1])], &[(2, 4)]);
        removed[0].insert(2);
        assert!(OrderedRemap::new(&t, removed).is_err());
        let (t, _) = transition(&[(1, 5, &[1])], &[(2, 4)]);
        assert!(OrderedRemap::new(&t, vec![RoaringBitmap::from_iter([7])]).is_err());
    }

    proptest! {
        /// Against a naive replay: walk every source row in order, hand out destination
        /// slots one by one.
        #[test]
        fn matches_a_replay(
            sources in prop::collection::vec((0u64..40, prop::collection::vec(any::<bool>(), 0..40)), 1..6),
            cuts in prop::collection::vec(0u64..30, 0..5),
        ) {
            let specs: Vec<(u64, u64, Vec<u32>)> = sources
                .iter()
                .enumerate()
                .map(|(i, (_, dels))| {
                    let removed = dels.iter().enumerate().filter(|(_, d)| **d).map(|(o, _)| o as u32).collect();
                    (100 + i as u64, dels.len() as u64, removed)
                })
                .collect();
            let live: u64 = specs.iter().map(|(_, r, d)| r - d.len() as u64).sum();
            // Destination sizes: cut `live` at sorted cut points (empty ones allowed).
            let mut points: Vec<u64> = cuts.iter().map(|c| c.min(&live).to_owned()).collect();
            points.push(0);
            points.push(live);
            points.sort();
            let dests: Vec<(u64, u64)> = points.windows(2).enumerate().map(|(i, w)| (200 + i as u64, w[1] - w[0])).collect();
            let borrowed: Vec<(u64, u64, &[u32])> = specs.iter().map(|(f, r, d)| (*f, *r, d.as_slice())).collect();
            let (t, removed) = transition(&borrowed, &dests);
            let m = OrderedRemap::new(&t, removed).unwrap();
            let mut slots = dests.iter().flat_map(|&(f, n)| (0..n).map(move |o| row_address(f, o)));
            for (f, rows, dels) in &specs {
                let mut image = Vec::new();
                for o in 0..*rows {
                    let step = m.translate(*f, o).unwrap();
                    if dels.contains(&(o as u32)) {
                        prop_assert_eq!(step, Step::Deleted);
                    } else {
                        let expected = slots.next().unwrap();
                        prop_assert_eq!(step, Step::Moved(expected));
                        image.push(expected);
                    }
                }
                let got: Vec<u64> = m
                    .image(*f, None)
                    .unwrap()
                    .into_iter()
                    .flat_map(|(d, bits)| bits.into_iter().map(move |o| row_address(d, o as u64)))
                    .collect();
                prop_assert_eq!(&got, &image);
                let offsets: Vec<u64> = (0..*rows).collect();
                let mut swept = Vec::new();
                m.translate_sorted(*f, &offsets, &mut swept).unwrap();
                let one_by_one: Vec<Option<u64>> = offsets
                    .iter()
                    .map(|o| match m.translate(*f, *o).unwrap() {
                        Step::Moved(a) => Some(a),
                        _ => None,
                    })
                    .collect();
                prop_assert_eq!(swept, one_by_one);
                let all: RoaringBitmap = (0..*rows as u32).collect();
                let via_offsets: Vec<u64> = m
                    .image(*f, Some(&all))
                    .unwrap()
                    .into_iter()
                    .flat_map(|(d, bits)| bits.into_iter().map(move |o| row_address(d, o as u64)))
                    .collect();
                prop_assert_eq!(&via_offsets, &image);
                for a in &image {
                    prop_assert!(split_row_address(*a).1 < u32::MAX as u64);
                }
            }
            prop_assert!(slots.next().is_none());
        }
    }
}

//! A loaded ledger: translating row addresses through chains of transitions.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::ordered::OrderedRemap;
use super::transition::{Transition, validate};
use super::{LedgerError, Result};
use crate::ledger::ids::{row_address, split_row_address};

/// Owners whose [`LedgerView::lineage_key`] a view remembers (it starts over past this).
const MAX_LINEAGES: usize = 4096;

/// A stable-partition row map, read lazily (its blocks live in a file).
#[async_trait]
pub trait PartitionMap: Send + Sync + Debug {
    /// For sorted, distinct positions in the concatenated physical rows of the sources:
    /// `(destination index, offset in it)`, or `None` for a row deleted before the rewrite.
    async fn lookup(&self, positions: &[u64]) -> Result<Vec<Option<(u16, u32)>>>;
}

/// A transition with what its mapping needs in memory.
#[derive(Debug)]
pub enum LoadedMapping {
    /// An ordered compaction's remap, built from the sources' removed-row bitmaps.
    Ordered(OrderedRemap),
    /// A stable partition's row map, whose blocks are read from its file on demand.
    Partition(Arc<dyn PartitionMap>),
}

/// A transition and its mapping, ready to translate rows.
#[derive(Debug)]
pub struct LoadedTransition {
    /// The transition as the manifest records it.
    pub transition: Transition,
    /// The in-memory form of `transition.mapping`.
    pub mapping: LoadedMapping,
}

/// The ledger of one table version, ready to translate.
#[derive(Debug, Default)]
pub struct LedgerView {
    /// In lineage order.
    transitions: Vec<LoadedTransition>,
    /// Fragment id → (transition, source position).
    consumer: HashMap<u64, (usize, usize)>,
    /// Global position of each transition's first row of each source.
    starts: Vec<Vec<u64>>,
    key: u64,
    /// [`Self::lineage_key`]s found so far, by the owner the caller named.
    lineages: Mutex<HashMap<String, u64>>,
}

impl LedgerView {
    /// A view of the `loaded` transitions, given in any order: they are validated (see
    /// [`validate`]) and kept in lineage order.
    pub fn new(loaded: Vec<LoadedTransition>) -> Result<Self> {
        let plain: Vec<Transition> = loaded.iter().map(|l| l.transition.clone()).collect();
        let order = validate(&plain)?;
        let mut slots: Vec<Option<LoadedTransition>> = loaded.into_iter().map(Some).collect();
        let transitions: Vec<LoadedTransition> = order
            .iter()
            .map(|&i| slots[i].take().expect("each position once"))
            .collect();
        let mut consumer = HashMap::new();
        let mut starts = Vec::with_capacity(transitions.len());
        // Content, not ids: a table dropped and created again reuses transition ids.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for (i, t) in transitions.iter().enumerate() {
            t.transition.hash(&mut hasher);
            let mut start = 0;
            let mut row_starts = Vec::with_capacity(t.transition.sources.len());
            for (p, s) in t.transition.sources.iter().enumerate() {
                consumer.insert(s.id, (i, p));
                row_starts.push(start);
                start += s.physical_rows;
            }
            starts.push(row_starts);
        }
        Ok(Self {
            transitions,
            consumer,
            starts,
            key: hasher.finish(),
            lineages: Mutex::default(),
        })
    }

    /// Whether the ledger has no transition, so every row address is current.
    pub fn is_empty(&self) -> bool {
        self.transitions.is_empty()
    }

    /// Identifies the set of transitions (for cache keys of translated data).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Identifies the transitions the rows of `fragments` pass through: those that consumed
    /// one of them, those that consumed what these wrote, and so on. Data translated from
    /// those fragments depends on no other transition, so a cache key made with this stays
    /// valid across rewrites of other fragments (on a live table, every compaction of newly
    /// arrived fragments changed [`Self::key`] and sent every translated index partition
    /// back to be translated again). Computed once per view for each `owner`, a name the
    /// caller gives the fragment set (an index segment's file: its fragments never change).
    pub fn lineage_key<I>(&self, owner: &str, fragments: impl FnOnce() -> I) -> u64
    where
        I: IntoIterator<Item = u64>,
    {
        if let Some(key) = self.lineages.lock().expect("lineages").get(owner) {
            return *key;
        }
        let mut reached = std::collections::BTreeSet::new();
        let mut todo: Vec<u64> = fragments().into_iter().collect();
        while let Some(fragment) = todo.pop() {
            if let Some(&(t, _)) = self.consumer.get(&fragment)
                && reached.insert(t)
            {
                let written = &self.transitions[t].transition.destinations;
                todo.extend(written.iter().map(|d| d.id));
            }
        }
        // Content, not ids, as for `key`; in lineage order (`reached` is sorted).
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for t in reached {
            self.transitions[t].transition.hash(&mut hasher);
        }
        let key = hasher.finish();
        let mut lineages = self.lineages.lock().expect("lineages");
        if lineages.len() >= MAX_LINEAGES {
            lineages.clear();
        }
        lineages.insert(owner.to_string(), key);
        key
    }

    /// Transitions in lineage order.
    pub fn transitions(&self) -> impl Iterator<Item = &LoadedTransition> {
        self.transitions.iter()
    }

    /// Whether some transition rewrote `fragment`.
    pub fn consumes(&self, fragment: u64) -> bool {
        self.consumer.contains_key(&fragment)
    }

    /// Current addresses of `addrs`: `None` for rows deleted before some rewrite moved
    /// them; addresses of fragments never rewritten come back unchanged.
    ///
    /// Step-wise over the whole batch: each round sorts the rows still to move by address
    /// (index partitions are written in address order, so this is nearly free) and moves each
    /// run of one source fragment one transition further down its lineage with a sweep, so a
    /// round costs O(rows + removed rows) plus the sort, whatever the chain.
    pub async fn translate(&self, addrs: &[u64]) -> Result<Vec<Option<u64>>> {
        let mut current: Vec<Option<u64>> = addrs.iter().map(|a| Some(*a)).collect();
        if self.transitions.is_empty() {
            return Ok(current);
        }
        let mut pending: Vec<(u64, u32)> = Vec::new();
        let mut consumed = ConsumedCheck::new(self);
        for (i, a) in addrs.iter().enumerate() {
            if consumed.check(*a) {
                pending.push((*a, i as u32));
            }
        }
        let mut rounds = 0;
        let mut offsets: Vec<u64> = Vec::new();
        let mut moved: Vec<Option<u64>> = Vec::new();
        while !pending.is_empty() {
            rounds += 1;
            if rounds > self.transitions.len() + 1 {
                return Err(LedgerError::Invalid("translation did not terminate".into()));
            }
            if !pending.is_sorted() {
                pending.sort_unstable();
            }
            let mut next: Vec<(u64, u32)> = Vec::with_capacity(pending.len());
            let mut start = 0;
            while start < pending.len() {
                let f = split_row_address(pending[start].0).0;
                let end =
                    start + pending[start..].partition_point(|(a, _)| split_row_address(*a).0 == f);
                let (t, p) = self.consumer[&f];
                offsets.clear();
                offsets.extend(
                    pending[start..end]
                        .iter()
                        .map(|(a, _)| split_row_address(*a).1),
                );
                moved.clear();
                self.step(t, p, f, &offsets, &mut moved).await?;
                let mut consumed = ConsumedCheck::new(self);
                for ((_, i), new) in pending[start..end].iter().zip(&moved) {
                    current[*i as usize] = *new;
                    if let Some(a) = new
                        && consumed.check(*a)
                    {
                        next.push((*a, *i));
                    }
                }
                start = end;
            }
            pending = next;
        }
        Ok(current)
    }

    /// Moves sorted `offsets` of source `p` (fragment `f`) of transition `t` one step.
    async fn step(
        &self,
        t: usize,
        p: usize,
        f: u64,
        offsets: &[u64],
        out: &mut Vec<Option<u64>>,
    ) -> Result<()> {
        let loaded = &self.transitions[t];
        let source = &loaded.transition.sources[p];
        if let Some(&o) = offsets.last().filter(|o| **o >= source.physical_rows) {
            return Err(LedgerError::OutOfRange {
                addr: row_address(f, o),
                fragment: f,
                offset: o,
                transition: loaded.transition.id,
            });
        }
        match &loaded.mapping {
            LoadedMapping::Ordered(remap) => remap.translate_sorted(f, offsets, out),
            LoadedMapping::Partition(map) => {
                let base = self.starts[t][p];
                let mut positions: Vec<u64> = offsets.iter().map(|o| base + o).collect();
                positions.dedup();
                let labels = map.lookup(&positions).await?;
                if labels.len() != positions.len() {
                    return Err(LedgerError::Invalid(
                        "row map answered the wrong count".into(),
                    ));
                }
                let dests = &loaded.transition.destinations;
                let mut u = 0;
                for o in offsets {
                    while positions[u] != base + o {
                        u += 1;
                    }
                    out.push(match labels[u] {
                        None => None,
                        Some((d, off)) => {
                            let dest =
                                dests
                                    .get(d as usize)
                                    .ok_or_else(|| LedgerError::Transition {
                                        transition: loaded.transition.id,
                                        reason: format!("row map names destination {d}"),
                                    })?;
                            if off as u64 >= dest.physical_rows {
                                return Err(LedgerError::Transition {
                                    transition: loaded.transition.id,
                                    reason: format!(
                                        "row map puts a row at {off} of destination {} ({} rows)",
                                        dest.id, dest.physical_rows
                                    ),
                                });
                            }
                            Some(row_address(dest.id, off as u64))
                        }
                    });
                }
                Ok(())
            }
        }
    }

    /// Global row position range of source `p` of transition `t` (for sweeps).
    pub(crate) fn source_rows(&self, t: usize, p: usize) -> std::ops::Range<u64> {
        let start = self.starts[t][p];
        start..start + self.transitions[t].transition.sources[p].physical_rows
    }
}

/// Whether a transition rewrote an address's fragment, remembering the last fragment asked
/// about (addresses come in runs of one fragment).
struct ConsumedCheck<'a> {
    view: &'a LedgerView,
    last: Option<(u64, bool)>,
}

impl<'a> ConsumedCheck<'a> {
    fn new(view: &'a LedgerView) -> Self {
        Self { view, last: None }
    }

    fn check(&mut self, addr: u64) -> bool {
        let f = split_row_address(addr).0;
        match self.last {
            Some((g, c)) if g == f => c,
            _ => {
                let c = self.view.consumer.contains_key(&f);
                self.last = Some((f, c));
                c
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::transition::tests::ordered;
    use roaring::RoaringBitmap;
    use std::collections::BTreeSet;

    fn view(ts: Vec<Transition>) -> LedgerView {
        let loaded = ts
            .into_iter()
            .map(|t| {
                let removed = vec![RoaringBitmap::new(); t.sources.len()];
                LoadedTransition {
                    mapping: LoadedMapping::Ordered(OrderedRemap::new(&t, removed).unwrap()),
                    transition: t,
                }
            })
            .collect();
        LedgerView::new(loaded).unwrap()
    }

    #[tokio::test]
    async fn chains_follow_lineage() {
        // 1,2 -> 3 (compaction), then 3,4 -> 5. Listed newest first.
        let v = view(vec![
            ordered(2, &[(3, 10), (4, 2)], &[(5, 12)]),
            ordered(1, &[(1, 6), (2, 4)], &[(3, 10)]),
        ]);
        let got = v
            .translate(&[row_address(2, 1), row_address(4, 0), row_address(9, 3)])
            .await
            .unwrap();
        assert_eq!(
            got,
            vec![
                Some(row_address(5, 7)),
                Some(row_address(5, 10)),
                Some(row_address(9, 3))
            ]
        );
        let ledger: Vec<Transition> = v.transitions().map(|t| t.transition.clone()).collect();
        assert_eq!(
            crate::ledger::transition::descendants(&ledger, &BTreeSet::from([1])),
            BTreeSet::from([1, 3, 5])
        );
    }

    #[test]
    fn a_lineage_key_changes_only_with_the_transitions_its_fragments_pass_through() {
        // 1,2 -> 3, then 3,4 -> 5; 7,8 -> 9 elsewhere in the table.
        let base = || {
            vec![
                ordered(1, &[(1, 6), (2, 4)], &[(3, 10)]),
                ordered(2, &[(3, 10), (4, 2)], &[(5, 12)]),
            ]
        };
        let elsewhere = ordered(3, &[(7, 5), (8, 5)], &[(9, 10)]);
        let a = view(base());
        let b = view([base(), vec![elsewhere.clone()]].concat());
        let key = |v: &LedgerView, owner: &str, fs: &[u64]| v.lineage_key(owner, || fs.to_vec());
        // A rewrite of other fragments: same key, though the whole ledger's key changed.
        assert_ne!(a.key(), b.key());
        assert_eq!(key(&a, "s1", &[1, 2]), key(&b, "s1", &[1, 2]));
        assert_eq!(key(&a, "s4", &[4]), key(&b, "s4", &[4]));
        // A rewrite further down the lineage (5 compacted again) changes it.
        let c = view([base(), vec![ordered(4, &[(5, 12), (6, 1)], &[(10, 13)])]].concat());
        assert_ne!(key(&a, "s1", &[1, 2]), key(&c, "s1", &[1, 2]));
        assert_ne!(key(&a, "s4", &[4]), key(&c, "s4", &[4]));
        // Fragments no transition consumed pass through none; 7 passes through another.
        assert_eq!(key(&b, "s6", &[6]), key(&a, "s6", &[6]));
        assert_ne!(key(&b, "s7", &[7]), key(&b, "s6", &[6]));
        assert_ne!(key(&b, "s7", &[7]), key(&b, "s1", &[1, 2]));
        // Remembered by owner within a view.
        assert_eq!(key(&b, "s1", &[6]), key(&b, "s1", &[1, 2]));
    }
}

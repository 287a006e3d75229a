//! Searching one segment: score the rows of the probed partitions that the segment may
//! answer for, and keep the best `k`.
//!
//! The row mask (ownership, deletions, the query's WHERE filter) is applied to every row
//! **before** it can enter the local top-k, so a stale, deleted or filtered-out row can never
//! take the place of a valid one (a filter applied after the top-k could). Pure computation.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::distance::{BATCH_ROWS, Metric, dot_rows, l2_squared_rows, metric_key};
use super::ivf::PQ_CODES;
use super::parallel;
use super::quantized::RowBounds;
pub use super::row_mask::{MaskCursor, RowMask, Verdict};
use super::segment::Partition;

/// A scored row; ordered by key, then address (so ties break the same way every time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Smaller is nearer; `f32::INFINITY` for rows without a defined distance.
    pub key: f32,
    /// The row's address, `(fragment_id << 32) | offset`.
    pub addr: u64,
}

impl Eq for Candidate {}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .total_cmp(&other.key)
            .then(self.addr.cmp(&other.addr))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The `k` smallest candidates seen so far.
#[derive(Debug)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Candidate>,
    /// Candidates above this are refused even while fewer than `k` are held.
    ceiling: Option<Candidate>,
}

impl TopK {
    /// An empty top-k.
    pub fn new(k: usize) -> Self {
        Self {
            k,
            // Sized by what is cheap, not by k: k comes from a query's LIMIT.
            heap: BinaryHeap::with_capacity(k.min(1024) + 1),
            ceiling: None,
        }
    }

    /// A top-k that takes only candidates at or below `ceiling`: the k-th best of a full
    /// top-k these candidates will be merged into, which would refuse the others anyway.
    /// Its [`bound`](Self::bound) is then the ceiling's key until it is full, so scoring
    /// into it rules rows out from the start.
    pub fn below(k: usize, ceiling: Option<Candidate>) -> Self {
        Self {
            ceiling,
            ..Self::new(k)
        }
    }

    /// The k-th best candidate once full (the one a better candidate replaces).
    pub fn worst(&self) -> Option<Candidate> {
        self.heap.peek().copied().filter(|_| self.is_full())
    }

    /// The candidate a new one must not come after: the k-th best once full, else the
    /// ceiling (a top-k merged into this one is [`below`](Self::below) it).
    pub fn limit(&self) -> Option<Candidate> {
        self.worst().or(self.ceiling)
    }

    /// Offers `c`: kept when it is among the k nearest so far.
    #[inline]
    pub fn push(&mut self, c: Candidate) {
        if self.ceiling.is_some_and(|ceiling| c > ceiling) {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(c);
        } else if let Some(top) = self.heap.peek()
            && c < *top
        {
            self.heap.pop();
            self.heap.push(c);
        }
    }

    /// The largest key a candidate may have and still enter (ties are then decided by
    /// address): the k-th smallest key once full, else the ceiling's key, else the largest
    /// `f32` in [`f32::total_cmp`] order (a positive NaN), so every candidate enters.
    #[inline]
    pub fn bound(&self) -> f32 {
        match (self.heap.peek(), self.ceiling) {
            (Some(top), _) if self.is_full() => top.key,
            (_, Some(ceiling)) => ceiling.key,
            _ => f32::from_bits(u32::MAX >> 1),
        }
    }

    /// Whether [`bound`](Self::bound) rules anything out (full, or under a ceiling).
    #[inline]
    pub fn is_bounded(&self) -> bool {
        self.is_full() || self.ceiling.is_some()
    }

    /// The most candidates it keeps.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether it holds k candidates.
    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.k
    }

    /// Candidates held (at most `k`).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Its candidates, nearest first.
    pub fn into_sorted(self) -> Vec<Candidate> {
        self.heap.into_sorted_vec()
    }
}

/// Counters a search reports (shown by `EXPLAIN ANALYZE`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SearchStats {
    /// IVF partitions scored.
    pub partitions_probed: usize,
    /// Rows whose distance was computed.
    pub rows_scored: usize,
    /// Rows of fragments the segment no longer owns.
    pub dropped_ownership: usize,
    /// Rows deleted since the segment was written.
    pub dropped_deleted: usize,
    /// Rows the WHERE filter dropped.
    pub dropped_filter: usize,
    /// Rows a bound ruled out: their codes', or their whole partition's (then unseen by
    /// the mask).
    pub skipped_by_bound: usize,
}

impl SearchStats {
    pub(crate) fn count(&mut self, v: Verdict) -> bool {
        match v {
            Verdict::Keep => {
                self.rows_scored += 1;
                return true;
            }
            Verdict::NotOwned => self.dropped_ownership += 1,
            Verdict::Deleted => self.dropped_deleted += 1,
            Verdict::Filtered => self.dropped_filter += 1,
        }
        false
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &SearchStats) {
        self.partitions_probed += o.partitions_probed;
        self.rows_scored += o.rows_scored;
        self.dropped_ownership += o.dropped_ownership;
        self.dropped_deleted += o.dropped_deleted;
        self.dropped_filter += o.dropped_filter;
        self.skipped_by_bound += o.skipped_by_bound;
    }
}

/// Scores a flat partition. `mask: None` is the unfiltered fast path.
pub fn score_flat(
    part: &Partition,
    dim: usize,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    top: &mut TopK,
    stats: &mut SearchStats,
) {
    stats.partitions_probed += 1;
    if let Some(mut bounds) = part
        .quantized
        .get()
        .and_then(Option::as_ref)
        .and_then(|r| r.prepare(q, metric))
    {
        return score_bounded(part, dim, q, metric, mask, &mut bounds, top, stats);
    }
    if mask.is_none() && dim > 0 && dim == q.len() && matches!(metric, Metric::L2 | Metric::Dot) {
        // The unfiltered fast path: keys of a batch of rows per kernel call (the same keys
        // as `metric_key`: dot orders by the negated product).
        let negate = metric == Metric::Dot;
        let kernel = if negate { dot_rows } else { l2_squared_rows };
        let mut keys = [0f32; BATCH_ROWS];
        for (addrs, rows) in part
            .addrs
            .chunks(BATCH_ROWS)
            .zip(part.vectors.chunks(BATCH_ROWS * dim))
        {
            let keys = &mut keys[..addrs.len().min(rows.len() / dim)];
            kernel(q, rows, keys);
            for (addr, key) in addrs.iter().zip(keys.iter()) {
                let key = if negate { -*key } else { *key };
                top.push(Candidate { key, addr: *addr });
            }
            stats.rows_scored += keys.len();
        }
        return;
    }
    let mut cursor = mask.map(MaskCursor::new);
    for (addr, v) in part.addrs.iter().zip(part.vectors.chunks_exact(dim)) {
        if let Some(m) = cursor.as_mut()
            && !stats.count(m.verdict(*addr))
        {
            continue;
        }
        if mask.is_none() {
            stats.rows_scored += 1;
        }
        let key = metric_key(metric, q, v).unwrap_or(f32::INFINITY);
        top.push(Candidate { key, addr: *addr });
    }
}

/// [`score_flat`] with the partition's quantized rows: each row that passes the mask is
/// first bounded from its codes, and scored from its floats only when the bound does not
/// rule it out (see [`crate::index::quantized`]). The same top-k as scoring every row; the
/// rows ruled out are counted in `skipped_by_bound`.
#[allow(clippy::too_many_arguments)]
fn score_bounded(
    part: &Partition,
    dim: usize,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    bounds: &mut RowBounds,
    top: &mut TopK,
    stats: &mut SearchStats,
) {
    // A partition far from the query is ruled out whole, its rows unseen (they count as
    // skipped by the bound, whatever the mask would have said of them).
    if let Some(rows) = part.quantized.get().and_then(Option::as_ref)
        && top.is_bounded()
        && rows.none_can_enter(q, metric, top.bound())
    {
        stats.skipped_by_bound += part.len();
        return;
    }
    let mut ids = [0u32; BATCH_ROWS];
    let mut sums = [0f32; BATCH_ROWS];
    let mut cursor = mask.map(MaskCursor::new);
    // Without a WHERE filter the mask (ownership, deletions) keeps nearly every row, and the
    // bound rules most of them out once the top-k is full: bounding first leaves the mask
    // to the few rows the bound lets through (on a live table, looking each row up in its
    // fragment's deletion bitmap was 5–7% of a server's CPU). A filter drops most rows, so
    // it goes first and spares their bounds. Either way a row the mask drops never enters
    // the top-k.
    let mask_after_bound = mask.is_some_and(|m| m.allowed.is_none());
    for start in (0..part.len()).step_by(BATCH_ROWS) {
        let end = (start + BATCH_ROWS).min(part.len());
        // Until the top-k is full (or under a ceiling) every row enters, so a batch that
        // starts before then is scored from its floats alone.
        let bounded = top.is_bounded();
        let mask_first = !(bounded && mask_after_bound);
        let mut kept = 0;
        for (i, addr) in (start..end).zip(&part.addrs[start..end]) {
            if mask_first {
                let kept = match cursor.as_mut() {
                    Some(m) => stats.count(m.verdict(*addr)),
                    None => {
                        stats.rows_scored += 1;
                        true
                    }
                };
                if !kept {
                    continue;
                }
            }
            ids[kept] = i as u32;
            kept += 1;
        }
        let (ids, sums) = (&ids[..kept], &mut sums[..kept]);
        if bounded {
            bounds.code_sums(ids, sums);
        }
        for (&i, &sum) in ids.iter().zip(sums.iter()) {
            let i = i as usize;
            if bounded && bounds.cannot_enter(i, sum, top.bound()) {
                stats.skipped_by_bound += 1;
                continue;
            }
            if !mask_first
                && let Some(m) = cursor.as_mut()
                && !stats.count(m.verdict(part.addrs[i]))
            {
                continue;
            }
            let v = &part.vectors[i * dim..(i + 1) * dim];
            let key = metric_key(metric, q, v).unwrap_or(f32::INFINITY);
            top.push(Candidate {
                key,
                addr: part.addrs[i],
            });
        }
    }
}

/// Payload values (rows × row width) below which probed partitions are scored on the
/// calling thread alone: starting a thread costs about as much as scoring this many.
pub const PARALLEL_MIN_VALUES: usize = 1 << 18;

/// Scores `parts` with `score` into one top-`keep` under `ceiling` ([`TopK::below`]): on
/// every core (each worker claiming the next partition into its own top-k, merged at the
/// end) when they hold at least [`PARALLEL_MIN_VALUES`] payload values of `row_width`, else
/// on the calling thread. The answer is the same either way: candidates are totally
/// ordered by key, then address.
pub fn score_partitions<F>(
    parts: &[Arc<Partition>],
    keep: usize,
    ceiling: Option<Candidate>,
    row_width: usize,
    score: F,
) -> (TopK, SearchStats)
where
    F: Fn(&Partition, &mut TopK, &mut SearchStats) + Sync,
{
    let rows: usize = parts.iter().map(|p| p.len()).sum();
    let threads = if rows.saturating_mul(row_width.max(1)) >= PARALLEL_MIN_VALUES {
        parallel::cores()
    } else {
        1
    };
    let mut found = parallel::claim_each(
        parts,
        threads,
        || (TopK::below(keep, ceiling), SearchStats::default()),
        |(top, stats), part| score(part, top, stats),
    )
    .into_iter();
    let (mut top, mut stats) = found
        .next()
        .unwrap_or_else(|| (TopK::below(keep, ceiling), SearchStats::default()));
    for (other, s) in found {
        stats.add(&s);
        for c in other.into_sorted() {
            top.push(c);
        }
    }
    (top, stats)
}

/// Scores a PQ partition with a precomputed distance table (approximate keys).
pub fn score_pq(
    part: &Partition,
    sub_vectors: usize,
    table: &[f32],
    mask: Option<&RowMask>,
    top: &mut TopK,
    stats: &mut SearchStats,
) {
    stats.partitions_probed += 1;
    let mut cursor = mask.map(MaskCursor::new);
    for (addr, codes) in part.addrs.iter().zip(part.codes.chunks_exact(sub_vectors)) {
        if let Some(m) = cursor.as_mut()
            && !stats.count(m.verdict(*addr))
        {
            continue;
        }
        if mask.is_none() {
            stats.rows_scored += 1;
        }
        let key: f32 = codes
            .iter()
            .enumerate()
            .map(|(m, c)| table[m * PQ_CODES + *c as usize])
            .sum();
        top.push(Candidate { key, addr: *addr });
    }
}

#[cfg(test)]
mod tests {

    use roaring::{RoaringBitmap, RoaringTreemap};

    use super::*;
    use crate::ledger::ids::row_address;

    #[test]
    fn top_k_keeps_the_smallest_in_order() {
        let mut t = TopK::new(3);
        for (i, key) in [5.0, 1.0, 4.0, 2.0, 3.0, 0.5].into_iter().enumerate() {
            t.push(Candidate {
                key,
                addr: i as u64,
            });
        }
        let keys: Vec<f32> = t.into_sorted().iter().map(|c| c.key).collect();
        assert_eq!(keys, vec![0.5, 1.0, 2.0]);
    }

    /// Enough rows to be scored on every core: the same top-k and counts as one thread.
    #[test]
    fn partitions_scored_on_every_core_give_the_one_thread_answer() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let dim = 16;
        let parts: Vec<Arc<Partition>> = (0..40)
            .map(|p| {
                let rows = rng.random_range(0..1200);
                Arc::new(Partition {
                    quantized: Default::default(),
                    addrs: (0..rows).map(|r| row_address(p, r)).collect(),
                    codes: vec![],
                    // Coarse values: many equal keys, so ties must break the same way.
                    vectors: (0..rows * dim as u64)
                        .map(|_| rng.random_range(0..4) as f32)
                        .collect(),
                })
            })
            .collect();
        let values: usize = parts.iter().map(|p| p.vectors.len()).sum();
        assert!(values >= PARALLEL_MIN_VALUES);
        let q = vec![1.0f32; dim];
        let score = |part: &Partition, top: &mut TopK, stats: &mut SearchStats| {
            score_flat(part, dim, &q, Metric::L2, None, top, stats)
        };
        let (top, stats) = score_partitions(&parts, 25, None, dim, score);
        let mut one = TopK::new(25);
        let mut one_stats = SearchStats::default();
        for part in &parts {
            score(part, &mut one, &mut one_stats);
        }
        assert_eq!(top.into_sorted(), one.into_sorted());
        assert_eq!(stats, one_stats);
    }

    /// Groups scored one after another, each under the ceiling of what came before (some
    /// partitions quantized, so rows and whole partitions are ruled out against it), merge
    /// into the answer of scoring every partition into one top-k.
    #[test]
    fn groups_scored_under_a_ceiling_merge_into_the_whole_answer() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let dim = 16;
        let parts: Vec<Arc<Partition>> = (0..12)
            .map(|p| {
                let rows = rng.random_range(0..300);
                let centre = rng.random_range(-20.0..20.0);
                let vectors: Vec<f32> = (0..rows * dim)
                    .map(|_| centre + rng.random_range(0..8) as f32 / 4.0)
                    .collect();
                let part = Partition {
                    addrs: (0..rows).map(|r| row_address(p, r as u64)).collect(),
                    vectors,
                    ..Default::default()
                };
                if p % 3 != 0 {
                    part.quantize();
                }
                Arc::new(part)
            })
            .collect();
        let q = vec![0.5f32; dim];
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let score = |part: &Partition, top: &mut TopK, stats: &mut SearchStats| {
                score_flat(part, dim, &q, metric, None, top, stats)
            };
            let mut whole = TopK::new(7);
            for part in &parts {
                score(part, &mut whole, &mut SearchStats::default());
            }
            let mut top = TopK::new(7);
            let mut skipped = 0;
            for group in parts.chunks(3) {
                let (found, stats) = score_partitions(group, 7, top.worst(), dim, score);
                skipped += stats.skipped_by_bound;
                for c in found.into_sorted() {
                    top.push(c);
                }
            }
            assert_eq!(top.into_sorted(), whole.into_sorted(), "{metric:?}");
            if metric != Metric::Cosine {
                assert!(skipped > 0, "{metric:?}");
            }
        }
    }

    /// Quantized partitions (rows ruled out by their bounds) under masks of ownership and
    /// deletions alone (checked after the bound) and with a filter (checked before it):
    /// the top-k of the rows the mask keeps, as a naive sort of them gives it.
    #[test]
    fn bounded_scoring_keeps_exactly_the_masked_rows_top_k() {
        use rand::{Rng, SeedableRng};
        let dim = 16; // quantized::MIN_DIM
        for seed in 0..12 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let parts: Vec<Partition> = (0..4)
                .map(|_| {
                    let rows = rng.random_range(1..400);
                    let centre = rng.random_range(-4.0..4.0);
                    // Rows of fragments 0..5, in address order as a segment stores them.
                    let mut addrs: Vec<u64> = (0..rows)
                        .map(|_| row_address(rng.random_range(0..5), rng.random_range(0..500)))
                        .collect();
                    addrs.sort_unstable();
                    addrs.dedup();
                    let vectors = (0..addrs.len() * dim)
                        .map(|_| centre + rng.random_range(0..16) as f32 / 8.0)
                        .collect();
                    let part = Partition {
                        addrs,
                        vectors,
                        ..Default::default()
                    };
                    part.quantize();
                    part
                })
                .collect();
            let deletions: crate::index::row_mask::Deletions = (0..5u64)
                .map(|f| {
                    let rows = (0..500u32).filter(|_| rng.random_bool(0.3));
                    (f, Arc::new(rows.collect::<RoaringBitmap>()))
                })
                .collect();
            let allowed: RoaringTreemap = parts
                .iter()
                .flat_map(|p| p.addrs.iter().copied())
                .filter(|_| rng.random_bool(0.5))
                .collect();
            let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-4.0..4.0)).collect();
            for filter in [None, Some(&allowed)] {
                let mask = RowMask {
                    owned: vec![0, 1, 3, 4],
                    deletions: Some(&deletions),
                    allowed: filter,
                };
                for metric in [Metric::L2, Metric::Dot] {
                    let mut top = TopK::new(6);
                    let mut stats = SearchStats::default();
                    for part in &parts {
                        score_flat(part, dim, &q, metric, Some(&mask), &mut top, &mut stats);
                    }
                    let mut want: Vec<Candidate> = parts
                        .iter()
                        .flat_map(|p| p.addrs.iter().zip(p.vectors.chunks_exact(dim)))
                        .filter(|(a, _)| mask.verdict(**a) == Verdict::Keep)
                        .map(|(a, v)| Candidate {
                            key: metric_key(metric, &q, v).unwrap(),
                            addr: *a,
                        })
                        .collect();
                    want.sort_by(|x, y| x.key.total_cmp(&y.key).then(x.addr.cmp(&y.addr)));
                    want.truncate(6);
                    let got = top.into_sorted();
                    let keys = |c: &[Candidate]| c.iter().map(|c| c.addr).collect::<Vec<_>>();
                    assert_eq!(keys(&got), keys(&want), "seed {seed}, {metric:?}");
                    assert!(
                        stats.skipped_by_bound > 0,
                        "seed {seed}: no row was bounded"
                    );
                }
            }
        }
    }

    /// Seed 002's failure: a stale row nearer than every owned row must not take a slot.
    #[test]
    fn mask_applies_before_the_local_top_k() {
        let stale = row_address(1, 0); // fragment 1 was invalidated
        let owned: Vec<u64> = (0..3).map(|o| row_address(0, o)).collect();
        let part = Partition {
            quantized: Default::default(),
            addrs: vec![stale, owned[0], owned[1], owned[2]],
            codes: vec![],
            vectors: vec![0.0, 5.0, 6.0, 7.0],
        };
        let deletions = crate::index::row_mask::Deletions::from([(
            0u64,
            std::sync::Arc::new(RoaringBitmap::from_iter([1u32])),
        )]);
        let mask = RowMask {
            owned: vec![0],
            deletions: Some(&deletions),
            allowed: None,
        };
        let mut top = TopK::new(2);
        let mut stats = SearchStats::default();
        score_flat(
            &part,
            1,
            &[0.0],
            Metric::L2,
            Some(&mask),
            &mut top,
            &mut stats,
        );
        let got: Vec<u64> = top.into_sorted().iter().map(|c| c.addr).collect();
        assert_eq!(got, vec![owned[0], owned[2]]);
        assert_eq!(
            (
                stats.dropped_ownership,
                stats.dropped_deleted,
                stats.rows_scored
            ),
            (1, 1, 2)
        );
    }
}

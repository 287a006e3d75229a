//! Exact scoring over contiguous rows: which rows of a fragment may be scored (as runs of
//! offsets), how runs are shared among threads, and the kernel that scores one run of a
//! decoded vector block into a top-k.
//!
//! Scoring contiguous runs keeps the inner loop free of per-row checks: deletions, rows a
//! segment already answers for and the query's row mask are applied once, when the runs are
//! built, and the loop over a run only computes distances and compares each with the current
//! k-th best. Keys are exactly those of [`super::exact_key`] (`f32::INFINITY` for NULL
//! vectors, undefined cosine distances and vectors of another dimension), so every exact path
//! ranks a row the same way. Pure computation: [`super::exact`] does the IO.

use std::ops::Range;

use roaring::RoaringBitmap;

use crate::index::distance::{BATCH_ROWS, Metric, dot, dot_rows, l2_squared_rows};
use crate::index::search::{Candidate, TopK};
use crate::ledger::ids::row_address;

/// Decoded vectors of consecutive rows of one fragment.
#[derive(Clone, Copy, Debug)]
pub struct RowBlock<'a> {
    pub fragment: u64,
    /// Offset (in the fragment) of the block's first row.
    pub first: u32,
    pub dim: usize,
    /// `rows × dim` floats; a NULL row's slots are ignored.
    pub values: &'a [f32],
    /// Per row: whether the vector is non-NULL; `None` when no row is NULL.
    pub valid: Option<&'a [bool]>,
}

impl RowBlock<'_> {
    pub fn rows(&self) -> u32 {
        match self.values.len().checked_div(self.dim) {
            Some(rows) => rows as u32,
            None => self.valid.map_or(0, |v| v.len() as u32),
        }
    }

    /// The block's rows, as fragment offsets.
    pub fn offsets(&self) -> Range<u32> {
        self.first..self.first + self.rows()
    }
}

/// A query vector with what every row's key reuses.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    pub vector: &'a [f32],
    pub metric: Metric,
    /// `dot(q, q)`, for cosine.
    norm_squared: f32,
}

impl<'a> Query<'a> {
    pub fn new(vector: &'a [f32], metric: Metric) -> Self {
        Self {
            vector,
            metric,
            norm_squared: dot(vector, vector),
        }
    }
}

/// The rows of a fragment of `rows` physical rows that may be scored, as sorted, disjoint,
/// non-empty runs: those in `allowed` (every row when `None`) and not in `excluded`.
pub fn scorable_runs(
    rows: u32,
    excluded: &RoaringBitmap,
    allowed: Option<&RoaringBitmap>,
) -> Vec<Range<u32>> {
    let mut runs: Vec<Range<u32>> = Vec::new();
    let mut extend = |o: u32| match runs.last_mut() {
        Some(r) if r.end == o => r.end = o + 1,
        _ => runs.push(o..o + 1),
    };
    match allowed {
        Some(allowed) => {
            for o in allowed.iter().take_while(|o| *o < rows) {
                if !excluded.contains(o) {
                    extend(o);
                }
            }
        }
        None => {
            let mut start = 0u32;
            for gap in excluded.iter().take_while(|o| *o < rows) {
                if gap > start {
                    runs.push(start..gap);
                }
                start = gap + 1;
            }
            if start < rows {
                runs.push(start..rows);
            }
        }
    }
    runs
}

/// Shares `runs` (each tagged with the block it belongs to) among at most `parts` workers,
/// in order, with row counts differing by at most one; a run may be cut between two workers.
/// Every part is non-empty.
pub fn split_runs(runs: &[(usize, Range<u32>)], parts: usize) -> Vec<Vec<(usize, Range<u32>)>> {
    let total: u64 = runs.iter().map(|(_, r)| r.len() as u64).sum();
    let parts = (parts.max(1) as u64).min(total.max(1));
    let mut out: Vec<Vec<(usize, Range<u32>)>> = Vec::with_capacity(parts as usize);
    let mut current = Vec::new();
    let mut filled = 0u64;
    let mut part = 0u64;
    // Part p ends after row (p + 1) × total / parts of the concatenation.
    let end_of = |p: u64| (p + 1) * total / parts;
    let mut done = 0u64;
    for (block, run) in runs {
        let mut start = run.start;
        while start < run.end {
            let room = end_of(part) - done - filled;
            let take = (run.end - start).min(room as u32);
            if take > 0 {
                current.push((*block, start..start + take));
                filled += take as u64;
                start += take;
            }
            if done + filled == end_of(part) {
                out.push(std::mem::take(&mut current));
                done += filled;
                filled = 0;
                part += 1;
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Scores the rows `run` (fragment offsets inside `block`) into `top`; returns the number of
/// rows scored.
pub fn score_run(block: &RowBlock, run: Range<u32>, query: &Query, top: &mut TopK) -> usize {
    debug_assert!(run.start >= block.first && run.end <= block.offsets().end);
    let n = run.len();
    if n == 0 {
        return 0;
    }
    let dim = block.dim;
    let local = (run.start - block.first) as usize..(run.end - block.first) as usize;
    let addr = |i: usize| row_address(block.fragment, (block.first as usize + i) as u64);
    let mut bound = top.bound();
    let mut offer = |key: f32, i: usize, top: &mut TopK| {
        if key.total_cmp(&bound).is_le() {
            top.push(Candidate { key, addr: addr(i) });
            bound = top.bound();
        }
    };
    if dim != query.vector.len() || dim == 0 {
        for i in local {
            offer(f32::INFINITY, i, top);
        }
        return n;
    }
    let values = &block.values[local.start * dim..local.end * dim];
    let valid = block.valid.map(|v| &v[local.clone()]);
    let q = query.vector;
    // One loop per metric, so the kernel is inlined into a loop with no dispatch per row.
    macro_rules! each_row {
        (|$v:ident| $key:expr) => {
            for (j, $v) in values.chunks_exact(dim).enumerate() {
                let key = match valid {
                    Some(valid) if !valid[j] => f32::INFINITY,
                    _ => $key,
                };
                offer(key, local.start + j, top);
            }
        };
    }
    // L2 and dot: keys of a batch of rows at a time (one kernel call per batch), then offered.
    macro_rules! batched {
        ($kernel:expr, $key_of:expr) => {{
            let mut keys = [0f32; BATCH_ROWS];
            for (b, batch) in values.chunks(BATCH_ROWS * dim).enumerate() {
                let keys = &mut keys[..batch.len() / dim];
                $kernel(q, batch, keys);
                for (j, key) in keys.iter().enumerate() {
                    let at = b * BATCH_ROWS + j;
                    let key = match valid {
                        Some(valid) if !valid[at] => f32::INFINITY,
                        _ => $key_of(*key),
                    };
                    offer(key, local.start + at, top);
                }
            }
        }};
    }
    match query.metric {
        Metric::L2 => batched!(l2_squared_rows, |k: f32| k),
        Metric::Dot => batched!(dot_rows, |k: f32| -k),
        Metric::Cosine => {
            let qq = query.norm_squared;
            each_row!(|v| cosine_key(q, qq, v))
        }
    }
    n
}

/// [`crate::index::distance::cosine_distance`] with `dot(q, q)` computed once (the same
/// arithmetic, so the same bits), `INFINITY` when undefined.
#[inline]
fn cosine_key(q: &[f32], qq: f32, v: &[f32]) -> f32 {
    let (ab, bb) = (dot(q, v), dot(v, v));
    if qq == 0.0 || bb == 0.0 {
        return f32::INFINITY;
    }
    (1.0 - ab / (qq.sqrt() * bb.sqrt())).clamp(0.0, 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::knn::exact_key;
    use proptest::prelude::*;

    fn naive_runs(
        rows: u32,
        excluded: &RoaringBitmap,
        allowed: Option<&RoaringBitmap>,
    ) -> Vec<u32> {
        (0..rows)
            .filter(|o| !excluded.contains(*o) && allowed.is_none_or(|a| a.contains(*o)))
            .collect()
    }

    fn flatten(runs: &[Range<u32>]) -> Vec<u32> {
        runs.iter().flat_map(|r| r.clone()).collect()
    }

    proptest! {
        /// If this fails, brute force scores a deleted, skipped or filtered row, or misses one.
        #[test]
        fn prop_scorable_runs_are_the_naive_rows_coalesced(
            rows in 0u32..300,
            excluded in prop::collection::vec(0u32..320, 0..80),
            allowed in prop::option::of(prop::collection::vec(0u32..320, 0..200)),
        ) {
            let excluded: RoaringBitmap = excluded.into_iter().collect();
            let allowed: Option<RoaringBitmap> = allowed.map(|a| a.into_iter().collect());
            let runs = scorable_runs(rows, &excluded, allowed.as_ref());
            prop_assert_eq!(flatten(&runs), naive_runs(rows, &excluded, allowed.as_ref()));
            for w in runs.windows(2) {
                prop_assert!(w[0].end < w[1].start, "runs touch or overlap: {:?}", w);
            }
            prop_assert!(runs.iter().all(|r| !r.is_empty()));
        }

        /// If this fails, threads score a row twice, miss one, or get unbalanced shares.
        #[test]
        fn prop_split_runs_covers_every_row_once_in_balanced_parts(
            lens in prop::collection::vec(0u32..50, 0..12),
            parts in 1usize..6,
        ) {
            let mut at = 0;
            let runs: Vec<(usize, Range<u32>)> = lens
                .iter()
                .enumerate()
                .map(|(b, l)| { at += 3; let r = (b, at..at + l); at += l; r })
                .collect();
            let split = split_runs(&runs, parts);
            let total: usize = lens.iter().map(|l| *l as usize).sum();
            let flat = |v: &[(usize, Range<u32>)]| -> Vec<(usize, u32)> {
                v.iter().flat_map(|(b, r)| r.clone().map(move |o| (*b, o))).collect()
            };
            let joined: Vec<(usize, u32)> = split.iter().flat_map(|p| flat(p)).collect();
            prop_assert_eq!(joined, flat(&runs));
            prop_assert!(split.len() <= parts);
            prop_assert!(split.iter().all(|p| p.iter().map(|(_, r)| r.len()).sum::<usize>() > 0));
            let sizes: Vec<usize> = split.iter().map(|p| p.iter().map(|(_, r)| r.len()).sum()).collect();
            if total > 0 {
                prop_assert_eq!(split.len(), parts.min(total));
                prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            }
        }

        /// If this fails, the run kernel ranks rows differently from every other exact path.
        #[test]
        fn prop_score_run_matches_exact_key_per_row(
            dim in 1usize..20,
            rows in prop::collection::vec((prop::collection::vec(-3f32..3.0, 20), any::<bool>()), 1..40),
            q in prop::collection::vec(-3f32..3.0, 20),
            zero_query in any::<bool>(),
            k in 1usize..8,
            first in 0u32..5,
            cut in (0usize..40, 0usize..40),
        ) {
            let q: Vec<f32> = if zero_query { vec![0.0; dim] } else { q[..dim].to_vec() };
            let values: Vec<f32> = rows.iter().flat_map(|(v, _)| v[..dim].to_vec()).collect();
            let valid: Vec<bool> = rows.iter().map(|(_, ok)| *ok).collect();
            let n = rows.len() as u32;
            let block = RowBlock { fragment: 3, first, dim, values: &values, valid: Some(&valid) };
            let (a, b) = ((cut.0 as u32).min(n), (cut.1 as u32).min(n));
            let run = first + a.min(b)..first + a.max(b);
            for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
                let mut top = TopK::new(k);
                let scored = score_run(&block, run.clone(), &Query::new(&q, metric), &mut top);
                prop_assert_eq!(scored, run.len());
                let mut reference = TopK::new(k);
                for o in run.clone() {
                    let i = (o - first) as usize;
                    let v = valid[i].then(|| &values[i * dim..(i + 1) * dim]);
                    reference.push(Candidate { key: exact_key(metric, &q, v), addr: row_address(3, o as u64) });
                }
                let got: Vec<(u32, u64)> = top.into_sorted().iter().map(|c| (c.key.to_bits(), c.addr)).collect();
                let want: Vec<(u32, u64)> = reference.into_sorted().iter().map(|c| (c.key.to_bits(), c.addr)).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn scorable_runs_skip_excluded_rows_and_respect_the_mask() {
        let excluded: RoaringBitmap = [0u32, 3, 4, 9].into_iter().collect();
        assert_eq!(scorable_runs(10, &excluded, None), vec![1..3, 5..9]);
        let allowed: RoaringBitmap = [1u32, 2, 4, 5, 7, 12].into_iter().collect();
        assert_eq!(
            scorable_runs(10, &excluded, Some(&allowed)),
            vec![1..3, 5..6, 7..8]
        );
        assert_eq!(scorable_runs(0, &excluded, None), Vec::<Range<u32>>::new());
    }

    #[test]
    fn a_block_of_another_dimension_ranks_every_row_last() {
        let values = [1.0f32, 2.0, 3.0, 4.0];
        let block = RowBlock {
            fragment: 0,
            first: 0,
            dim: 2,
            values: &values,
            valid: None,
        };
        let mut top = TopK::new(5);
        score_run(
            &block,
            0..2,
            &Query::new(&[1.0, 2.0, 3.0], Metric::L2),
            &mut top,
        );
        assert!(top.into_sorted().iter().all(|c| c.key == f32::INFINITY));
    }
}

//! A partition kept by its *sketch* — addresses, quantized rows ([`super::quantized`]) and a
//! CRC32C per row — instead of its floats, and the exact search over sketches.
//!
//! Why: an index larger than the cache budget (1M × 768 floats are 3 GB) cannot keep its
//! floats, and reading every probed partition's floats per query is most of such a query's
//! time. Its sketches are about a quarter of the bytes and fit; a query then reads from the
//! file only the floats of the few rows its codes cannot rule out.
//!
//! The search over sketches ([`Refine`]) answers exactly what scoring every float answers:
//! 1. every row that passes the mask gets its code sum; rows that cannot beat the bound the
//!    caller already has (its top-k so far) are ruled out;
//! 2. the `keep` rows with the best *estimates* are read and scored: their k-th key `τ` is
//!    an upper bound of the answer's k-th key;
//! 3. every other row whose lower bound does not rule it out against `τ` is read.
//!
//! Every row not read has a key certainly above `τ` (the bound's guarantee), so the rows
//! read hold the top-k, ties included. They are returned as small float partitions and
//! scored by the caller's usual scoring, so keys are the ones the float path computes.
//! Reading rows is the caller's (async IO); this module is pure computation.

use std::sync::Arc;

use super::distance::{BATCH_ROWS, Metric};
use super::parallel;
use super::quantized::{Coder, QuantizedRows, RowBounds};
use super::search::{PARALLEL_MIN_VALUES, RowMask, SearchStats, TopK, Verdict};
use super::segment::Partition;
use super::sq;

/// A partition's addresses, quantized rows and per-row checksums (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Sketch {
    /// The rows' addresses, `(fragment_id << 32) | offset`.
    pub addrs: Vec<u64>,
    /// Their codes and bound terms.
    pub rows: QuantizedRows,
    /// Per row: CRC32C of its floats as the file stores them (little-endian), checked when
    /// the row is read alone.
    pub row_sums: Vec<u32>,
}

impl Sketch {
    /// The sketch of an IVF_FLAT partition of `dim` floats per row (its quantized rows
    /// reused when it has them), or `None` when its rows cannot be quantized.
    pub fn of(part: &Partition, dim: usize) -> Option<Self> {
        let rows = match part.quantized.get() {
            Some(Some(rows)) => rows.clone(),
            Some(None) => return None,
            None => QuantizedRows::quantize(&part.vectors, dim)?,
        };
        Some(Self {
            addrs: part.addrs.clone(),
            rows,
            row_sums: row_sums(&part.vectors, dim),
        })
    }

    /// The sketch of an IVF_SQ partition stored as `addrs` and `payload` under `coder`
    /// ([`sq::decode`]).
    pub fn of_sq(coder: &Coder, addrs: Vec<u64>, payload: &[u8]) -> Result<Self, String> {
        let decoded = sq::decode(coder, addrs.len(), payload)?;
        Ok(Self {
            addrs,
            rows: decoded.rows,
            row_sums: decoded.row_sums,
        })
    }

    /// Rows in the sketch.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Rows `picks` (a row index and the address it has now, in that order): a sketch of
    /// rows rewrites moved, as a search over the current table sees them.
    pub fn select(&self, picks: &[(usize, u64)]) -> Self {
        let rows: Vec<usize> = picks.iter().map(|(i, _)| *i).collect();
        Self {
            addrs: picks.iter().map(|(_, a)| *a).collect(),
            rows: self.rows.select(&rows),
            row_sums: rows.iter().map(|&i| self.row_sums[i]).collect(),
        }
    }

    /// Whether it has no row.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.addrs.len() * 8 + self.rows.bytes() + self.row_sums.len() * 4
    }

    /// About what the sketches of `rows` rows of `dim` floats hold: their quantized rows,
    /// and per row an address and a checksum.
    pub fn estimated_bytes(rows: u64, dim: usize) -> u64 {
        QuantizedRows::estimated_bytes(rows, dim).saturating_add(rows.saturating_mul(8 + 4))
    }
}

/// CRC32C of each row's little-endian bytes.
pub fn row_sums(vectors: &[f32], dim: usize) -> Vec<u32> {
    vectors.chunks_exact(dim.max(1)).map(sq::row_sum).collect()
}

/// A row of a sketch: which sketch (by position) and which row in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RowRef {
    /// The sketch, by position.
    pub sketch: u32,
    /// The row in it.
    pub row: u32,
}

/// A row not ruled out yet: where it is, its code sum and its estimated key.
#[derive(Debug, Clone, Copy)]
struct Shortlisted {
    at: RowRef,
    sum: f32,
    estimate: f32,
}

/// One exact search over sketches, in three steps with reads in between (module docs):
/// [`Refine::new`], [`Refine::first`] (read those rows), [`Refine::second`] (read those),
/// [`Refine::finish`].
pub struct Refine<'a> {
    sketches: &'a [Arc<Sketch>],
    dim: usize,
    q: &'a [f32],
    metric: Metric,
    keep: usize,
    /// The caller's k-th best key when the search began (a NaN while it had fewer).
    bound: f32,
    list: Vec<Shortlisted>,
    /// Per entry of `list`: read already.
    read: Vec<bool>,
    /// Rows read, with their floats, per sketch.
    floats: Vec<Vec<(u32, Vec<f32>)>>,
    stats: SearchStats,
}

impl<'a> Refine<'a> {
    /// Step 1: the rows of `sketches` that pass `mask` (drops counted) and whose bound does
    /// not rule them out against `bound` (the caller's k-th best key so far, or a NaN
    /// when it has fewer than `keep`). On every core when the codes are many.
    pub fn new(
        sketches: &'a [Arc<Sketch>],
        dim: usize,
        q: &'a [f32],
        metric: Metric,
        mask: Option<&RowMask>,
        keep: usize,
        bound: f32,
    ) -> Self {
        let items: Vec<(u32, &Sketch)> = sketches
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, s.as_ref()))
            .collect();
        let codes: usize = sketches.iter().map(|s| s.len() * dim).sum();
        let threads = if codes >= 4 * PARALLEL_MIN_VALUES {
            parallel::cores()
        } else {
            1
        };
        let found = parallel::claim_each(
            &items,
            threads,
            || (Vec::new(), SearchStats::default()),
            |(list, stats), (i, sketch)| {
                shortlist(*i, sketch, q, metric, mask, bound, list, stats);
            },
        );
        let mut list = Vec::new();
        let mut stats = SearchStats::default();
        for (l, s) in found {
            list.extend(l);
            stats.add(&s);
        }
        Self {
            sketches,
            dim,
            q,
            metric,
            keep,
            bound,
            read: vec![false; list.len()],
            list,
            floats: vec![Vec::new(); sketches.len()],
            stats,
        }
    }

    /// Step 2: the rows to read first — the `keep` best estimates (all, when no more).
    pub fn first(&mut self) -> Vec<RowRef> {
        let mut order: Vec<usize> = (0..self.list.len()).collect();
        if order.len() > self.keep {
            let list = &self.list;
            order.select_nth_unstable_by(self.keep, |a, b| {
                list[*a].estimate.total_cmp(&list[*b].estimate)
            });
            order.truncate(self.keep);
        }
        self.mark(order)
    }

    /// Step 3, given the floats of [`Self::first`]'s rows (in that order): scores them with
    /// `score` (the caller's scoring, so keys are the ones it computes) and returns every
    /// other row that the k-th best of them, or the caller's bound when lower, does not
    /// rule out.
    pub fn second<F>(&mut self, first: &[RowRef], floats: &[f32], score: F) -> Vec<RowRef>
    where
        F: Fn(&Partition, &mut TopK, &mut SearchStats),
    {
        self.store(first, floats);
        let mut top = TopK::new(self.keep);
        let mut scratch = SearchStats::default();
        for part in self.partitions() {
            score(&part, &mut top, &mut scratch);
        }
        let tau = if top.bound().total_cmp(&self.bound).is_lt() {
            top.bound()
        } else {
            self.bound
        };
        let mut bounds: Vec<Option<Option<RowBounds>>> =
            (0..self.sketches.len()).map(|_| None).collect();
        let mut wanted = Vec::new();
        for (i, entry) in self.list.iter().enumerate() {
            if self.read[i] {
                continue;
            }
            let s = entry.at.sketch as usize;
            let b =
                bounds[s].get_or_insert_with(|| self.sketches[s].rows.prepare(self.q, self.metric));
            let ruled_out = match b {
                Some(b) => b.cannot_enter(entry.at.row as usize, entry.sum, tau),
                None => false,
            };
            if !ruled_out {
                wanted.push(i);
            }
        }
        self.mark(wanted)
    }

    /// Step 4, given the floats of [`Self::second`]'s rows: every row read, as one float
    /// partition per sketch (rows in their order; empty ones included, so each sketch counts
    /// as probed), and the drops and skips counted. Scoring them gives the answer of scoring
    /// every row of the sketches' partitions.
    pub fn finish(
        mut self,
        second: &[RowRef],
        floats: &[f32],
    ) -> (Vec<Arc<Partition>>, SearchStats) {
        self.store(second, floats);
        let read = self.read.iter().filter(|r| **r).count();
        self.stats.skipped_by_bound += self.list.len() - read;
        let parts = self.partitions().into_iter().map(Arc::new).collect();
        (parts, self.stats)
    }

    fn mark(&mut self, entries: Vec<usize>) -> Vec<RowRef> {
        let mut rows: Vec<RowRef> = entries
            .into_iter()
            .map(|i| {
                self.read[i] = true;
                self.list[i].at
            })
            .collect();
        rows.sort_unstable();
        rows
    }

    fn store(&mut self, rows: &[RowRef], floats: &[f32]) {
        assert_eq!(
            floats.len(),
            rows.len() * self.dim,
            "one row of floats per row asked"
        );
        for (at, v) in rows.iter().zip(floats.chunks_exact(self.dim.max(1))) {
            self.floats[at.sketch as usize].push((at.row, v.to_vec()));
        }
    }

    /// The rows read so far, one float partition per sketch, rows in their order.
    fn partitions(&mut self) -> Vec<Partition> {
        self.floats
            .iter_mut()
            .zip(self.sketches)
            .map(|(rows, sketch)| {
                rows.sort_unstable_by_key(|(r, _)| *r);
                let mut part = Partition::default();
                for (r, v) in rows.iter() {
                    part.addrs.push(sketch.addrs[*r as usize]);
                    part.vectors.extend_from_slice(v);
                }
                part
            })
            .collect()
    }
}

/// Step 1 for one sketch: appends its rows that pass `mask` and are not ruled out against
/// `bound` to `list`, counting drops and rows ruled out in `stats`.
#[allow(clippy::too_many_arguments)]
fn shortlist(
    at: u32,
    sketch: &Sketch,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    bound: f32,
    list: &mut Vec<Shortlisted>,
    stats: &mut SearchStats,
) {
    // A partition far from the query is ruled out whole, its rows unseen (they count as
    // skipped by the bound, whatever the mask would have said of them).
    if sketch.rows.none_can_enter(q, metric, bound) {
        stats.skipped_by_bound += sketch.len();
        return;
    }
    let mut bounds = sketch.rows.prepare(q, metric);
    let mut ids = [0u32; BATCH_ROWS];
    let mut sums = [0f32; BATCH_ROWS];
    for start in (0..sketch.len()).step_by(BATCH_ROWS) {
        let end = (start + BATCH_ROWS).min(sketch.len());
        let mut kept = 0;
        for (i, addr) in (start..end).zip(&sketch.addrs[start..end]) {
            // Rows that pass are counted as scored when their floats are (by the caller).
            if let Some(verdict) = mask.map(|m| m.verdict(*addr))
                && verdict != Verdict::Keep
            {
                stats.count(verdict);
                continue;
            }
            ids[kept] = i as u32;
            kept += 1;
        }
        let (ids, sums) = (&ids[..kept], &mut sums[..kept]);
        let Some(b) = bounds.as_mut() else {
            // A query that cannot be bounded: every row is read.
            list.extend(ids.iter().map(|&row| Shortlisted {
                at: RowRef { sketch: at, row },
                sum: f32::NAN,
                estimate: f32::INFINITY,
            }));
            continue;
        };
        b.code_sums(ids, sums);
        for (&row, &sum) in ids.iter().zip(sums.iter()) {
            if b.cannot_enter(row as usize, sum, bound) {
                stats.skipped_by_bound += 1;
                continue;
            }
            list.push(Shortlisted {
                at: RowRef { sketch: at, row },
                sum,
                estimate: b.estimate(row as usize, sum),
            });
        }
    }
}

#[cfg(test)]
mod tests;

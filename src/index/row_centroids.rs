//! Lower bounds on the distance from a query to rows no index segment holds yet, from the
//! index's own centroids: what lets brute force over a live table's unindexed fragments skip
//! most of their rows and still answer exactly.
//!
//! Why: on a table that keeps receiving rows, the rows written since the last
//! `OPTIMIZE INDEX ... APPEND` (tens of thousands between two appends) are scored by brute
//! force on every query, and that scan costs as much as the index search itself. But a
//! query already knows its distance to every centroid (it orders the partitions by it), and
//! a row's distance to its nearest centroid never changes. By the triangle inequality,
//! `d(q, r) ≥ |d(q, c) − d(r, c)|` for any point `c`; with `c` the row's nearest centroid and
//! the query's k-th best key so far, a row whose bound is above that key cannot enter the
//! answer and is not scored. The answer is the one scoring every row gives: only rows that
//! cannot enter are skipped.
//!
//! Exact under rounding: the bound is widened by a relative margin ([`QueryBound::margin`])
//! larger than the error of the f32 arithmetic that computes the distances (at most
//! `(dim + 2) × 2⁻²⁴` relative for sums of squares), so a skipped row's computed key is
//! above the bound, strictly. L2 and cosine only: the inner product has no triangle
//! inequality (a dot-product query scores every row).
//!
//! Pure computation: [`RowCentroids::compute`] assigns rows (once per fragment, off the
//! query path, see [`background`]); [`prune_runs`] keeps the rows a query must score.

pub mod background;

use std::ops::Range;
use std::sync::Arc;

use super::distance::{Metric, l2_squared};
use super::ivf::IvfModel;
use super::nearest::CentroidTable;

/// Rows assigned per call of the centroid table (bounds the scratch buffers).
const ASSIGN_CHUNK_ROWS: usize = 1024;

/// Per row of one fragment's vector column: its nearest centroid under one IVF model and its
/// distance to it.
#[derive(Debug)]
pub struct RowCentroids {
    /// The model the rows were assigned with: bounds are only valid against its centroids.
    model: Arc<IvfModel>,
    /// Per row, the partition (centroid index).
    partition: Vec<u32>,
    /// Per row, the Euclidean distance (not squared) to that centroid, of the row as the
    /// model sees it (unit length under cosine); NaN when the row has no bound (a NULL
    /// vector, a zero vector under cosine, a non-finite value).
    radius: Vec<f32>,
}

impl RowCentroids {
    /// Assigns every row of a column (`values`: `valid.len() × column_dim` floats, `valid`:
    /// per row whether it is non-NULL) to its nearest centroid of `model`; `None` when the
    /// model's metric has no bound (dot product) or its dimension differs from the column's.
    pub fn compute(
        column_dim: usize,
        values: &[f32],
        valid: &[bool],
        model: &Arc<IvfModel>,
    ) -> Option<Self> {
        if model.metric == Metric::Dot || model.partitions() == 0 {
            return None;
        }
        let dim = model.dim;
        let rows = valid.len();
        if dim == 0 || column_dim != dim || values.len() != rows * dim {
            return None;
        }
        let table = CentroidTable::new(&model.centroids, dim);
        let mut partition = Vec::with_capacity(rows);
        let mut radius = Vec::with_capacity(rows);
        let mut prepared = Vec::with_capacity(ASSIGN_CHUNK_ROWS * dim);
        let mut has_bound = Vec::with_capacity(ASSIGN_CHUNK_ROWS);
        let mut out = vec![(0u32, 0f32); ASSIGN_CHUNK_ROWS];
        for start in (0..rows).step_by(ASSIGN_CHUNK_ROWS) {
            let end = (start + ASSIGN_CHUNK_ROWS).min(rows);
            prepared.clear();
            has_bound.clear();
            for i in start..end {
                let v = &values[i * dim..(i + 1) * dim];
                let row = valid[i].then(|| model.prepare(v)).flatten();
                match row {
                    Some(row) if row.iter().all(|x| x.is_finite()) => {
                        prepared.extend_from_slice(&row);
                        has_bound.push(true);
                    }
                    // A placeholder the table assigns somewhere; its radius says "no bound".
                    _ => {
                        prepared.extend(std::iter::repeat_n(0.0, dim));
                        has_bound.push(false);
                    }
                }
            }
            let out = &mut out[..end - start];
            table.assign(&prepared, out);
            for ((row, &(p, _)), &bounded) in
                prepared.chunks_exact(dim).zip(out.iter()).zip(&has_bound)
            {
                let c = &model.centroids[p as usize * dim..(p as usize + 1) * dim];
                partition.push(p);
                // The radius is computed directly, not from the table's expanded score, so
                // its rounding is that of a sum of squares.
                radius.push(if bounded {
                    l2_squared(row, c).sqrt()
                } else {
                    f32::NAN
                });
            }
        }
        Some(Self {
            model: model.clone(),
            partition,
            radius,
        })
    }

    /// Whether these are the assignments of `model` (the same loaded model, by identity).
    pub fn is_for(&self, model: &Arc<IvfModel>) -> bool {
        Arc::ptr_eq(&self.model, model)
    }

    /// Rows assigned.
    pub fn len(&self) -> usize {
        self.partition.len()
    }

    /// Whether no row is assigned.
    pub fn is_empty(&self) -> bool {
        self.partition.is_empty()
    }

    /// Bytes held per row (what a cache reserves for a column's assignments).
    pub const BYTES_PER_ROW: usize = 8;
}

/// A query's distances to every centroid of a model, for bounding rows' keys.
#[derive(Debug, Clone)]
pub struct QueryBound {
    metric: Metric,
    /// Per partition, the Euclidean distance of the (prepared) query to its centroid.
    distance: Vec<f32>,
    /// Relative widening of every bound (see [`Self::margin`]).
    margin: f32,
}

impl QueryBound {
    /// From the squared distances of the prepared query to each centroid (as
    /// [`crate::index::ivf::ProbeOrder::centroid_keys`] holds them); `None` for the dot
    /// product, which has no bound.
    pub fn new(metric: Metric, centroid_keys: &[f32], dim: usize) -> Option<Self> {
        (metric != Metric::Dot).then(|| Self {
            metric,
            distance: centroid_keys.iter().map(|k| k.max(0.0).sqrt()).collect(),
            margin: Self::margin(dim),
        })
    }

    /// The relative error allowed for every distance in `dim` dimensions: 1e-3 plus 1e-6
    /// per dimension, well above the `(dim + 2) × 2⁻²⁴` (6e-8 per dimension) that rounding
    /// a sum of `dim` squares can reach.
    pub fn margin(dim: usize) -> f32 {
        1e-3 + dim as f32 * 1e-6
    }

    /// A key that the row of partition `p` at `radius` from its centroid cannot score
    /// below (the metric's key: squared distance for L2, `1 − cos` for cosine), or
    /// `-∞` when nothing is known.
    #[inline]
    pub fn lower_key(&self, p: u32, radius: f32) -> f32 {
        let Some(&dq) = self.distance.get(p as usize) else {
            return f32::NEG_INFINITY;
        };
        if !(radius >= 0.0 && radius.is_finite() && dq.is_finite()) {
            return f32::NEG_INFINITY;
        }
        let gap = (dq - radius).abs() - self.margin * (dq + radius);
        if gap <= 0.0 {
            return f32::NEG_INFINITY;
        }
        match self.metric {
            Metric::L2 => gap * gap * (1.0 - self.margin),
            // Unit vectors: |q − r|² = 2 (1 − cos); the key's own rounding is absolute.
            Metric::Cosine => gap * gap * 0.5 - self.margin,
            Metric::Dot => f32::NEG_INFINITY,
        }
    }
}

/// The rows of `runs` (fragment offsets, sorted) whose lower bound does not rule them out
/// against `bound` (a key in [`f32::total_cmp`] order; a row with a bound above it cannot
/// enter a top-k whose k-th key is `bound`), as runs, and how many rows were ruled out.
pub fn prune_runs(
    runs: &[Range<u32>],
    rows: &RowCentroids,
    query: &QueryBound,
    bound: f32,
) -> (Vec<Range<u32>>, usize) {
    let mut kept: Vec<Range<u32>> = Vec::with_capacity(runs.len());
    let mut skipped = 0usize;
    for run in runs {
        for o in run.clone() {
            let i = o as usize;
            let ruled_out = i < rows.len()
                && query
                    .lower_key(rows.partition[i], rows.radius[i])
                    .total_cmp(&bound)
                    .is_gt();
            if ruled_out {
                skipped += 1;
                continue;
            }
            match kept.last_mut() {
                Some(r) if r.end == o => r.end = o + 1,
                _ => kept.push(o..o + 1),
            }
        }
    }
    (kept, skipped)
}

#[cfg(test)]
mod tests;

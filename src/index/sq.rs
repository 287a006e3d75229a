//! IVF_SQ: an index whose segments keep no floats. Each row is stored as one byte per value
//! on a per-partition grid held by the model, plus the terms that bound its true distance
//! ([`super::quantized`]) and a checksum of its floats; a search rules rows out from their
//! codes (the partition decoded as a [`super::sketch::Sketch`]) and scores the survivors from the floats of the table's own data fragments, read
//! by row address ([`crate::index::sketch::Refine`] decides which rows, the search reads them).
//!
//! Why a grid in the model rather than per segment: a row's payload then depends only on its
//! partition and its floats, so segments can be appended, merged and translated by copying
//! rows, exactly as IVF_PQ's codes are — no segment ever needs the floats again. A row
//! outside its partition's grid is coded to the nearest grid point and its error measured
//! exactly, so a grid trained on a sample is never wrong, only looser for rows it did not see.
//!
//! Row payload (little-endian): `dim` code bytes, then `f32` err, reach, norm and far (see
//! [`RowTerms`]), then the `u32` CRC32C of the row's floats as the data file holds them —
//! checked against the floats read back, so a row address that no longer holds the indexed
//! vector is an error, never a wrong answer. `dim + 20` bytes per row: at 768 dimensions,
//! with its 8-byte address, 0.26× the floats.
//!
//! Pure computation; the model file, the segment file and the reads are the callers'.

use std::sync::OnceLock;

use super::quantized::{Coder, QuantizedRows, RowTerms};
use crate::format::integrity::crc32c;

/// Bytes after the codes in a row's payload: four bound terms and a checksum.
const TAIL: usize = 20;

/// A partition whose sample has fewer rows than this takes the whole sample's range.
const MIN_SAMPLE_ROWS: usize = 8;

/// Each side of a partition's sampled range is widened by this share of the range: rows the
/// sample did not see mostly still fall inside.
const WIDEN: f32 = 0.05;

/// Payload bytes per row of an IVF_SQ segment of `dim` dimensions.
pub fn row_width(dim: usize) -> usize {
    dim + TAIL
}

/// Per partition, per dimension, the range its codes span (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct ScalarGrid {
    /// Vector dimensions.
    pub dim: usize,
    /// `partitions × dim`, row-major.
    pub lo: Vec<f32>,
    /// `partitions × dim`, row-major.
    pub hi: Vec<f32>,
}

impl ScalarGrid {
    /// The grid of `partitions` partitions from a sample (`n × dim` raw vectors) and each
    /// sample row's partition: each partition's range, widened by `WIDEN`; the whole
    /// sample's range for partitions the sample barely saw. Rows that cannot be bounded
    /// (a value not finite or too large) are left out of every range.
    pub fn train(sample: &[f32], dim: usize, assigned: &[u32], partitions: usize) -> Self {
        let mut trainer = GridTrainer::new(dim, partitions);
        for (row, p) in sample.chunks_exact(dim.max(1)).zip(assigned) {
            trainer.offer(row, *p as usize);
        }
        trainer.finish()
    }

    /// How many partitions.
    pub fn partitions(&self) -> usize {
        self.lo.len() / self.dim.max(1)
    }

    /// The coder of partition `p`.
    pub fn coder(&self, p: usize) -> Coder {
        let at = p * self.dim..(p + 1) * self.dim;
        Coder::new(self.lo[at.clone()].to_vec(), &self.hi[at])
    }

    /// Whether every partition's grid is within the range the bounds' arithmetic allows
    /// (checked when a model file is opened).
    pub fn check(&self) -> Result<(), String> {
        if self.lo.len() != self.hi.len() || self.dim == 0 {
            return Err("scalar grid: lo and hi differ in length".into());
        }
        for p in 0..self.partitions() {
            if !self.coder(p).is_bounded() {
                return Err(format!(
                    "scalar grid: partition {p} has values out of range"
                ));
            }
        }
        Ok(())
    }
}

/// A [`ScalarGrid`] gathered row by row: the ranges [`ScalarGrid::train`] takes from a
/// sample held whole, from rows offered a batch at a time (ranges do not depend on order, so
/// the same rows give the same grid). Holds `2 × (partitions + 1) × dim` floats, whatever
/// the rows: a build within a small budget trains its centroids on a cut sample but its grid
/// on the full one this way (the grid needs many rows per partition: from 32 a partition's
/// range is narrow, most rows fall outside it and their bounds rule little out).
pub struct GridTrainer {
    dim: usize,
    lo: Vec<f32>,
    hi: Vec<f32>,
    rows: Vec<usize>,
    whole_lo: Vec<f32>,
    whole_hi: Vec<f32>,
    whole_rows: usize,
}

impl GridTrainer {
    /// A trainer of `partitions` partitions' grids over `dim` dimensions.
    pub fn new(dim: usize, partitions: usize) -> Self {
        Self {
            dim,
            lo: vec![f32::INFINITY; partitions * dim],
            hi: vec![f32::NEG_INFINITY; partitions * dim],
            rows: vec![0; partitions],
            whole_lo: vec![f32::INFINITY; dim],
            whole_hi: vec![f32::NEG_INFINITY; dim],
            whole_rows: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.lo.len() + self.hi.len() + 2 * self.dim) * 4 + self.rows.len() * 8
    }

    /// Takes sample row `row` of partition `p` (a row that cannot be bounded, or of a
    /// partition past the grid's, counts only where [`ScalarGrid::train`] counts it).
    pub fn offer(&mut self, row: &[f32], p: usize) {
        if row.len() != self.dim || !QuantizedRows::can_bound(row) {
            return;
        }
        let extend = |lo: &mut [f32], hi: &mut [f32]| {
            for ((l, h), v) in lo.iter_mut().zip(hi.iter_mut()).zip(row) {
                *l = l.min(*v);
                *h = h.max(*v);
            }
        };
        extend(&mut self.whole_lo, &mut self.whole_hi);
        self.whole_rows += 1;
        if p < self.rows.len() {
            let at = p * self.dim..(p + 1) * self.dim;
            extend(&mut self.lo[at.clone()], &mut self.hi[at]);
            self.rows[p] += 1;
        }
    }

    /// The trained grid.
    pub fn finish(self) -> ScalarGrid {
        let dim = self.dim;
        let zero = (vec![0f32; dim], vec![0f32; dim]);
        let whole = if self.whole_rows == 0 {
            widened(zero)
        } else {
            widened((self.whole_lo, self.whole_hi))
        };
        let (mut lo, mut hi) = (Vec::with_capacity(self.lo.len()), Vec::new());
        for (p, &n) in self.rows.iter().enumerate() {
            let (l, h) = if n >= MIN_SAMPLE_ROWS {
                let at = p * dim..(p + 1) * dim;
                widened((self.lo[at.clone()].to_vec(), self.hi[at].to_vec()))
            } else {
                whole.clone()
            };
            lo.extend(l);
            hi.extend(h);
        }
        ScalarGrid { dim, lo, hi }
    }
}

/// The coders of a grid's partitions, each made on first use: a build codes many rows of
/// each partition, from several threads.
pub struct Coders<'a> {
    grid: &'a ScalarGrid,
    made: Vec<OnceLock<Coder>>,
}

impl<'a> Coders<'a> {
    /// The coders of `grid`'s partitions (made as asked).
    pub fn new(grid: &'a ScalarGrid) -> Self {
        Self {
            grid,
            made: (0..grid.partitions()).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The coder of partition `p`.
    pub fn get(&self, p: usize) -> &Coder {
        self.made[p].get_or_init(|| self.grid.coder(p))
    }
}

/// `(lo, hi)` widened by [`WIDEN`] of the range on each side (within the bounded range).
fn widened((mut lo, mut hi): (Vec<f32>, Vec<f32>)) -> (Vec<f32>, Vec<f32>) {
    const MAX: f32 = 1e14;
    for (l, h) in lo.iter_mut().zip(hi.iter_mut()) {
        let margin = (*h - *l) * WIDEN;
        *l = (*l - margin).clamp(-MAX, MAX);
        *h = (*h + margin).clamp(-MAX, MAX);
    }
    (lo, hi)
}

/// Appends the payload of row `x` (the floats the data file holds) coded by `coder`.
pub fn encode_row(coder: &Coder, x: &[f32], out: &mut Vec<u8>) {
    let terms = coder.code_row(x, out);
    for v in [terms.err, terms.reach, terms.norm, terms.far] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&row_sum(x).to_le_bytes());
}

/// CRC32C of a row's floats, little-endian, as [`encode_row`] records it.
pub fn row_sum(x: &[f32]) -> u32 {
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    crc32c(&bytes)
}

/// A partition's payload decoded: codes, bound terms and per-row checksums.
pub struct Decoded {
    /// The rows' codes and bound terms.
    pub rows: QuantizedRows,
    /// Per row, the CRC32C of its floats ([`row_sum`]).
    pub row_sums: Vec<u32>,
}

/// Decodes a partition of `rows` rows stored as `payload` (rows of [`row_width`] bytes)
/// under `coder`: what a search rules rows out with.
pub fn decode(coder: &Coder, rows: usize, payload: &[u8]) -> Result<Decoded, String> {
    let dim = coder.dim();
    let width = row_width(dim);
    if payload.len() != rows * width {
        return Err(format!(
            "IVF_SQ partition of {rows} rows has {} payload bytes, not {rows} × {width}",
            payload.len(),
        ));
    }
    let mut codes = Vec::with_capacity(rows * dim);
    let mut terms = Vec::with_capacity(rows);
    let mut row_sums = Vec::with_capacity(rows);
    for row in payload.chunks_exact(width) {
        codes.extend_from_slice(&row[..dim]);
        let word = |i: usize| {
            let at = dim + 4 * i;
            [row[at], row[at + 1], row[at + 2], row[at + 3]]
        };
        let term = |i| f32::from_le_bytes(word(i));
        terms.push(RowTerms {
            err: term(0),
            reach: term(1),
            norm: term(2),
            far: term(3),
        });
        row_sums.push(u32::from_le_bytes(word(4)));
    }
    Ok(Decoded {
        rows: QuantizedRows::from_coded(coder, codes, &terms),
        row_sums,
    })
}

#[cfg(test)]
mod tests;

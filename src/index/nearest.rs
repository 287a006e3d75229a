//! Nearest centroid of many rows at once: the step k-means training, index builds and
//! `ivf_partition` spend their time in.
//!
//! One row against one centroid at a time ([`super::kmeans::nearest`]) loads two floats per
//! multiply. Here a tile of [`ROWS`] rows meets [`CENTROIDS`] centroids at once: each loaded
//! chunk of eight floats feeds several fused multiply-adds, in twelve independent accumulator
//! registers. Distances use the expansion `|x − c|² = |x|² − 2 x·c + |c|²` with the centroid
//! norms computed once, so the inner loop is a pure dot product.
//!
//! The expansion rounds differently from the direct difference, so a row almost equidistant
//! from two centroids may pick the other one than [`super::kmeans::nearest`] would; both
//! choices are within rounding of the true minimum (tested), which is all k-means and IVF
//! partitioning need. Within this module every path gives the same bits: the AVX2 + FMA code
//! (x86-64, checked once per call) and the portable code use the same accumulator layout and
//! the same order of (fused) operations.

use super::distance::norm_squared;

/// Rows per tile.
const ROWS: usize = 4;
/// Centroids per tile.
const CENTROIDS: usize = 3;
/// Floats per accumulator (one AVX2 register).
const LANES: usize = 8;

/// Centroids (`k × dim`, row-major) with their squared norms, ready for [`Self::assign`].
pub struct CentroidTable<'a> {
    centroids: &'a [f32],
    dim: usize,
    norms: Vec<f32>,
}

impl<'a> CentroidTable<'a> {
    pub fn new(centroids: &'a [f32], dim: usize) -> Self {
        let norms = if dim == 0 {
            Vec::new()
        } else {
            centroids.chunks_exact(dim).map(norm_squared).collect()
        };
        Self {
            centroids,
            dim,
            norms,
        }
    }

    /// Number of centroids.
    pub fn len(&self) -> usize {
        self.norms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.norms.is_empty()
    }

    /// For each row of `rows` (`n × dim`), the nearest centroid (lowest index among exact ties)
    /// and the squared distance to it (never negative), into `out` (`n` slots).
    pub fn assign(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        let dim = self.dim;
        if dim == 0 || self.is_empty() {
            out.fill((0, 0.0));
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { self.assign_avx2(rows, out) };
        }
        self.assign_with(
            rows,
            out,
            dots_portable::<ROWS, CENTROIDS>,
            dots_portable::<ROWS, 1>,
        );
        self.finish_rows(rows, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn assign_avx2(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        self.assign_with(
            rows,
            out,
            |r, c| avx2::dots::<ROWS, CENTROIDS>(r, c),
            |r, c| avx2::dots::<ROWS, 1>(r, c),
        );
        self.finish_rows(rows, out);
    }

    /// Full tiles of [`ROWS`] rows; each slot of `out` gets its best `|c|² − 2 x·c`.
    #[inline(always)]
    fn assign_with(
        &self,
        rows: &[f32],
        out: &mut [(u32, f32)],
        tile: impl Fn([&[f32]; ROWS], [&[f32]; CENTROIDS]) -> [[f32; CENTROIDS]; ROWS],
        tile_edge: impl Fn([&[f32]; ROWS], [&[f32]; 1]) -> [[f32; 1]; ROWS],
    ) {
        let dim = self.dim;
        let k = self.len();
        let full = k - k % CENTROIDS;
        for (block, slots) in rows
            .chunks_exact(ROWS * dim)
            .zip(out.chunks_exact_mut(ROWS))
        {
            let xs: [&[f32]; ROWS] = std::array::from_fn(|r| &block[r * dim..(r + 1) * dim]);
            let mut best = [(0u32, f32::INFINITY); ROWS];
            let mut c = 0;
            while c < full {
                let cs: [&[f32]; CENTROIDS] = std::array::from_fn(|j| self.centroid(c + j));
                let dots = tile(xs, cs);
                for (r, best) in best.iter_mut().enumerate() {
                    for (j, d) in dots[r].iter().enumerate() {
                        self.offer(best, c + j, *d);
                    }
                }
                c += CENTROIDS;
            }
            while c < k {
                let dots = tile_edge(xs, [self.centroid(c)]);
                for (r, best) in best.iter_mut().enumerate() {
                    self.offer(best, c, dots[r][0]);
                }
                c += 1;
            }
            slots.copy_from_slice(&best);
        }
    }

    /// The rows after the last full tile (fewer than [`ROWS`]), then every slot's score turned
    /// into a distance.
    #[inline(always)]
    fn finish_rows(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        let dim = self.dim;
        let n = rows.len() / dim;
        for i in n - n % ROWS..n {
            let x = &rows[i * dim..(i + 1) * dim];
            let mut best = (0u32, f32::INFINITY);
            for c in 0..self.len() {
                let d = dot_portable(x, self.centroid(c));
                self.offer(&mut best, c, d);
            }
            out[i] = best;
        }
        for (x, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
            slot.1 = (norm_squared(x) + slot.1).max(0.0);
        }
    }

    #[inline(always)]
    fn centroid(&self, c: usize) -> &[f32] {
        &self.centroids[c * self.dim..(c + 1) * self.dim]
    }

    /// Keeps centroid `c` if its score `|c|² − 2 x·c` beats the best so far.
    #[inline(always)]
    fn offer(&self, best: &mut (u32, f32), c: usize, dot: f32) {
        let score = self.norms[c] - 2.0 * dot;
        if score < best.1 {
            *best = (c as u32, score);
        }
    }
}

/// Dot product in the tile layout with one row and one centroid: eight lanes of fused
/// multiply-adds, summed in order, then the tail.
#[inline(always)]
fn dot_portable(x: &[f32], c: &[f32]) -> f32 {
    dots_portable::<1, 1>([x], [c])[0][0]
}

/// The tile's dot products, portably: lane `l` accumulates elements `8i + l` with fused
/// multiply-adds, the lanes are summed in order, then the tail elements are fused in.
#[inline(always)]
fn dots_portable<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    cs: [&[f32]; C],
) -> [[f32; C]; R] {
    std::array::from_fn(|r| {
        std::array::from_fn(|j| {
            let (x, c) = (xs[r], cs[j]);
            let body = x.len() - x.len() % LANES;
            let mut lanes = [0f32; LANES];
            for (xc, cc) in x[..body]
                .chunks_exact(LANES)
                .zip(c[..body].chunks_exact(LANES))
            {
                for l in 0..LANES {
                    lanes[l] = xc[l].mul_add(cc[l], lanes[l]);
                }
            }
            let mut sum: f32 = lanes.iter().sum();
            for (a, b) in x[body..].iter().zip(&c[body..]) {
                sum = a.mul_add(*b, sum);
            }
            sum
        })
    })
}

#[cfg(target_arch = "x86_64")]
/// [`dots_portable`] as AVX2 + FMA code.
mod avx2 {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };

    use super::LANES;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn dots<const R: usize, const C: usize>(xs: [&[f32]; R], cs: [&[f32]; C]) -> [[f32; C]; R] {
        let dim = xs[0].len();
        debug_assert!(xs.iter().all(|x| x.len() == dim) && cs.iter().all(|c| c.len() == dim));
        let body = dim - dim % LANES;
        // SAFETY (every load): `i + 8 <= body <= dim`, and every slice has `dim` floats
        // (the callers slice rows and centroids to exactly `dim`).
        let load = |s: &[f32], i: usize| unsafe { _mm256_loadu_ps(s.as_ptr().add(i)) };
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut i = 0;
        while i < body {
            let c: [__m256; C] = std::array::from_fn(|j| load(cs[j], i));
            for r in 0..R {
                let x = load(xs[r], i);
                for j in 0..C {
                    acc[r][j] = _mm256_fmadd_ps(x, c[j], acc[r][j]);
                }
            }
            i += LANES;
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for j in 0..C {
                let mut lanes = [0f32; LANES];
                // SAFETY: `lanes` holds exactly eight floats.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][j]) };
                let mut sum: f32 = lanes.iter().sum();
                for (a, b) in xs[r][body..].iter().zip(&cs[j][body..]) {
                    sum = a.mul_add(*b, sum);
                }
                out[r][j] = sum;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::kmeans::nearest;
    use proptest::prelude::*;

    fn matrix(max_rows: usize, dim: usize) -> impl Strategy<Value = Vec<f32>> {
        (0..=max_rows).prop_flat_map(move |n| prop::collection::vec(-4.0f32..4.0, n * dim))
    }

    proptest! {
        #[test]
        fn picks_a_centroid_within_rounding_of_the_nearest(
            (dim, rows, centroids) in (1usize..40).prop_flat_map(|d| (Just(d), matrix(11, d), matrix(9, d)))
        ) {
            prop_assume!(!centroids.is_empty());
            let table = CentroidTable::new(&centroids, dim);
            let mut out = vec![(0u32, 0f32); rows.len() / dim];
            table.assign(&rows, &mut out);
            for (x, (c, d)) in rows.chunks_exact(dim).zip(out) {
                let (_, exact) = nearest(&centroids, dim, x);
                let chosen: f64 = x.iter().zip(&centroids[c as usize * dim..(c as usize + 1) * dim])
                    .map(|(a, b)| ((*a as f64) - (*b as f64)).powi(2)).sum();
                let scale = 1.0 + x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>()
                    + centroids.iter().map(|v| (*v as f64).abs()).fold(0.0, f64::max).powi(2) * dim as f64;
                prop_assert!(chosen <= exact as f64 + 1e-5 * scale, "chose {chosen}, nearest {exact}");
                prop_assert!((d as f64 - chosen).abs() <= 1e-5 * scale, "reported {d}, actual {chosen}");
            }
        }

        #[test]
        fn every_path_gives_the_same_bits(
            (dim, rows, centroids) in (1usize..40).prop_flat_map(|d| (
                Just(d),
                prop::collection::vec(-4.0f32..4.0, 4 * d),
                prop::collection::vec(-4.0f32..4.0, 3 * d),
            ))
        ) {
            let xs: [&[f32]; 4] = std::array::from_fn(|r| &rows[r * dim..(r + 1) * dim]);
            let cs: [&[f32]; 3] = std::array::from_fn(|j| &centroids[j * dim..(j + 1) * dim]);
            let portable = dots_portable::<4, 3>(xs, cs);
            for r in 0..4 {
                for j in 0..3 {
                    prop_assert_eq!(portable[r][j].to_bits(), dot_portable(xs[r], cs[j]).to_bits());
                }
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                let fast = unsafe { avx2::dots::<4, 3>(xs, cs) };
                for r in 0..4 {
                    for j in 0..3 {
                        prop_assert_eq!(fast[r][j].to_bits(), portable[r][j].to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn exact_ties_go_to_the_lowest_index_and_no_centroids_give_zero() {
        let centroids = [1.0f32, 0.0, 1.0, 0.0, -1.0, 0.0];
        let table = CentroidTable::new(&centroids, 2);
        let mut out = [(9u32, 9f32); 5];
        table.assign(
            &[0.5, 0.0, 0.5, 0.0, 0.5, 0.0, 0.5, 0.0, -3.0, 0.0],
            &mut out,
        );
        assert_eq!(out[..4], [(0, 0.25); 4]);
        assert_eq!(out[4], (2, 4.0));
        let empty = CentroidTable::new(&[], 2);
        let mut out = [(9u32, 9f32); 1];
        empty.assign(&[1.0, 2.0], &mut out);
        assert_eq!(out, [(0, 0.0)]);
    }
}

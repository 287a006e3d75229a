//! Nearest centroid of many rows at once: the step k-means training, index builds and
//! `ivf_partition` spend their time in.
//!
//! One row against one centroid at a time ([`super::kmeans::nearest`]) loads two floats per
//! multiply. Here a tile of rows meets a tile of centroids at once ([`ROWS`] × [`CENTROIDS`]
//! with AVX2, [`WIDE_ROWS`] × [`WIDE_CENTROIDS`] with AVX-512): each loaded chunk of eight
//! floats feeds several fused multiply-adds, in independent accumulator registers.
//! Distances use the expansion `|x − c|² = |x|² − 2 x·c + |c|²` with the centroid norms
//! computed once, so the inner loop is a pure dot product.
//!
//! Rows and centroids are taken in blocks that stay in the core's cache (about
//! [`ROW_BLOCK_BYTES`] of rows against [`CENTROID_BLOCK_BYTES`] of centroids): a tile of rows
//! against every centroid would read the whole centroid matrix (3 MB at 1,000 × 768) from
//! memory once per tile; a block reads it once per block of rows.
//!
//! The expansion rounds differently from the direct difference, so a row almost equidistant
//! from two centroids may pick the other one than [`super::kmeans::nearest`] would; both
//! choices are within rounding of the true minimum (tested), which is all k-means and IVF
//! partitioning need. Within this module every path gives the same bits, whatever the
//! blocking, the tile or the instruction set: each (row, centroid) dot product is eight lanes
//! of fused multiply-adds over the same elements in the same order (the AVX-512 tile holds
//! two centroids' eight lanes in one register), summed in the same order, and every row is
//! offered its centroids in increasing order, so exact ties go to the lowest index. A row's
//! centroid therefore does not depend on the machine, nor on the other rows it came with.

#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

use super::distance::norm_squared;

/// Rows per AVX2 / portable tile.
const ROWS: usize = 4;
/// Centroids per AVX2 / portable tile.
const CENTROIDS: usize = 3;
/// Rows per AVX-512 tile.
const WIDE_ROWS: usize = 6;
/// Centroids per AVX-512 tile (in pairs, one pair per register).
const WIDE_CENTROIDS: usize = 8;
/// Floats per accumulator lane set (one AVX2 register).
const LANES: usize = 8;
/// Bytes of rows taken at once.
const ROW_BLOCK_BYTES: usize = 64 * 1024;
/// Bytes of centroids a block of rows meets at once (well inside a core's L2).
const CENTROID_BLOCK_BYTES: usize = 256 * 1024;
/// Fewest rows for which the AVX-512 path copies the centroids into pairs first.
#[cfg(target_arch = "x86_64")]
const WIDE_MIN_ROWS: usize = 64;

/// Centroids (`k × dim`, row-major) with their squared norms, ready for [`Self::assign`].
pub struct CentroidTable<'a> {
    centroids: &'a [f32],
    dim: usize,
    norms: Vec<f32>,
    /// The centroids interleaved in pairs for the AVX-512 tile, made on first use.
    #[cfg(target_arch = "x86_64")]
    pairs: OnceLock<Vec<f32>>,
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
            #[cfg(target_arch = "x86_64")]
            pairs: OnceLock::new(),
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
        // Whole rows with a slot each (a caller's mismatch leaves the rest alone rather than
        // read past a row).
        let n = (rows.len() / dim).min(out.len());
        let (rows, out) = (&rows[..n * dim], &mut out[..n]);
        #[cfg(target_arch = "x86_64")]
        {
            if rows.len() / dim >= WIDE_MIN_ROWS && avx512::available() {
                let pairs = self
                    .pairs
                    .get_or_init(|| avx512::interleave(self.centroids, dim));
                // SAFETY: the CPU has AVX-512 F and DQ, AVX2 and FMA (checked just above).
                return unsafe { self.assign_avx512(rows, out, pairs) };
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has AVX2 and FMA (checked just above).
                return unsafe { self.assign_avx2(rows, out) };
            }
        }
        self.assign_blocked::<ROWS, CENTROIDS>(
            rows,
            out,
            |xs, c| dots_portable::<ROWS, CENTROIDS>(xs, self.tile(c)),
            dot_portable,
        );
        self.finish_distances(rows, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn assign_avx2(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        self.assign_blocked::<ROWS, CENTROIDS>(
            rows,
            out,
            |xs, c| avx2::dots::<ROWS, CENTROIDS>(xs, self.tile(c)),
            |x, c| avx2::dots::<1, 1>([x], [c])[0][0],
        );
        self.finish_distances(rows, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    fn assign_avx512(&self, rows: &[f32], out: &mut [(u32, f32)], pairs: &[f32]) {
        let body = self.dim - self.dim % LANES;
        self.assign_blocked::<WIDE_ROWS, WIDE_CENTROIDS>(
            rows,
            out,
            |xs, c| {
                // `c` is a multiple of the tile (so even): its pairs start at pair c / 2.
                debug_assert_eq!(c % WIDE_CENTROIDS, 0);
                let pairs = &pairs[c * body..(c + WIDE_CENTROIDS) * body];
                avx512::dots::<WIDE_ROWS, { WIDE_CENTROIDS / 2 }, WIDE_CENTROIDS>(
                    xs,
                    pairs,
                    self.tile(c),
                )
            },
            |x, c| avx2::dots::<1, 1>([x], [c])[0][0],
        );
        self.finish_distances(rows, out);
    }

    /// The `C` centroids from `c` on.
    #[inline(always)]
    fn tile<const C: usize>(&self, c: usize) -> [&[f32]; C] {
        std::array::from_fn(|j| self.centroid(c + j))
    }

    /// Every slot of `out` gets its row's best `(centroid, |c|² − 2 x·c)`: rows in blocks of
    /// about [`ROW_BLOCK_BYTES`], each meeting the centroids a block of about
    /// [`CENTROID_BLOCK_BYTES`] at a time, in tiles of `R` rows × `C` centroids (`tile(xs, c)`
    /// scores centroids `c..c + C`) and single dot products (`one`) at the edges.
    #[inline(always)]
    fn assign_blocked<const R: usize, const C: usize>(
        &self,
        rows: &[f32],
        out: &mut [(u32, f32)],
        tile: impl Fn([&[f32]; R], usize) -> [[f32; C]; R],
        one: impl Fn(&[f32], &[f32]) -> f32,
    ) {
        let dim = self.dim;
        let k = self.len();
        let row_block = (ROW_BLOCK_BYTES / (dim * 4) / R * R).max(R);
        // A multiple of the tile, so every tile but the last of all is whole.
        let centroid_block = (CENTROID_BLOCK_BYTES / (dim * 4) / C * C).max(C);
        for (block, slots) in rows.chunks(row_block * dim).zip(out.chunks_mut(row_block)) {
            slots.fill((0, f32::INFINITY));
            let mut c0 = 0;
            while c0 < k {
                let c1 = (c0 + centroid_block).min(k);
                self.block::<R, C>(block, slots, c0..c1, &tile, &one);
                c0 = c1;
            }
        }
    }

    /// Offers centroids `cs` to each row of `rows` (best so far in `best`), in increasing
    /// order per row.
    #[inline(always)]
    fn block<const R: usize, const C: usize>(
        &self,
        rows: &[f32],
        best: &mut [(u32, f32)],
        cs: std::ops::Range<usize>,
        tile: &impl Fn([&[f32]; R], usize) -> [[f32; C]; R],
        one: &impl Fn(&[f32], &[f32]) -> f32,
    ) {
        let dim = self.dim;
        let n = best.len();
        let whole_rows = n - n % R;
        let whole_centroids = cs.start + (cs.len() - cs.len() % C);
        let row = |i: usize| &rows[i * dim..(i + 1) * dim];
        for r0 in (0..whole_rows).step_by(R) {
            let xs: [&[f32]; R] = std::array::from_fn(|r| row(r0 + r));
            let mut c = cs.start;
            while c < whole_centroids {
                let dots = tile(xs, c);
                for (r, dots) in dots.iter().enumerate() {
                    for (j, d) in dots.iter().enumerate() {
                        self.offer(&mut best[r0 + r], c + j, *d);
                    }
                }
                c += C;
            }
            for c in whole_centroids..cs.end {
                for (r, x) in xs.iter().enumerate() {
                    self.offer(&mut best[r0 + r], c, one(x, self.centroid(c)));
                }
            }
        }
        for (i, best) in best.iter_mut().enumerate().skip(whole_rows) {
            for c in cs.clone() {
                self.offer(best, c, one(row(i), self.centroid(c)));
            }
        }
    }

    /// Every slot's score turned into a distance.
    #[inline(always)]
    fn finish_distances(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        for (x, slot) in rows.chunks_exact(self.dim).zip(out.iter_mut()) {
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

#[cfg(target_arch = "x86_64")]
/// The AVX-512 tile: [`dots_portable`]'s arithmetic with two centroids per register.
mod avx512 {
    use std::arch::x86_64::{
        __m512, _mm256_loadu_ps, _mm512_broadcast_f32x8, _mm512_fmadd_ps, _mm512_loadu_ps,
        _mm512_setzero_ps, _mm512_storeu_ps,
    };

    use super::LANES;

    /// Whether this CPU runs [`dots`] (checked once).
    pub fn available() -> bool {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }

    /// `centroids` (`k × dim`) as pairs for [`dots`]: pair `p` (centroids `2p`, `2p + 1`;
    /// the last padded with zeros when `k` is odd) takes `2 × body` floats, `body` being
    /// `dim` rounded down to eight, and holds, for each chunk of eight floats in turn, the
    /// chunk of centroid `2p` then that of centroid `2p + 1`. The tails past `body` are not
    /// copied (they are read from the centroids).
    pub fn interleave(centroids: &[f32], dim: usize) -> Vec<f32> {
        let body = dim - dim % LANES;
        let k = centroids.len() / dim;
        let mut pairs = vec![0f32; k.div_ceil(2) * 2 * body];
        for (c, centroid) in centroids.chunks_exact(dim).enumerate() {
            let pair = &mut pairs[(c / 2) * 2 * body..(c / 2 + 1) * 2 * body];
            for (i, chunk) in centroid[..body].chunks_exact(LANES).enumerate() {
                let at = 2 * LANES * i + LANES * (c % 2);
                pair[at..at + LANES].copy_from_slice(chunk);
            }
        }
        pairs
    }

    /// The dot products of `R` rows with the `C = 2P` centroids `cs`, whose bodies `pairs`
    /// holds as [`interleave`] lays them out: each register accumulates two centroids' eight
    /// lanes against a row's chunk broadcast to both halves, so every lane does exactly the
    /// fused multiply-adds of [`super::dots_portable`], then the lanes and tails are summed
    /// as there.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    pub fn dots<const R: usize, const P: usize, const C: usize>(
        xs: [&[f32]; R],
        pairs: &[f32],
        cs: [&[f32]; C],
    ) -> [[f32; C]; R] {
        let dim = xs[0].len();
        let body = dim - dim % LANES;
        assert!(
            C == 2 * P
                && pairs.len() == P * 2 * body
                && xs.iter().all(|x| x.len() == dim)
                && cs.iter().all(|c| c.len() == dim),
            "tile shapes"
        );
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        let mut i = 0;
        while i < body {
            // SAFETY: pair `p`'s chunk at `i` is 16 floats at `p·2·body + 2i`, and
            // `2i + 16 <= 2·body` (asserted lengths); each row's chunk is 8 floats at `i`,
            // `i + 8 <= body <= dim`.
            let c: [__m512; P] = std::array::from_fn(|p| unsafe {
                _mm512_loadu_ps(pairs.as_ptr().add(p * 2 * body + 2 * i))
            });
            for r in 0..R {
                let x = unsafe { _mm512_broadcast_f32x8(_mm256_loadu_ps(xs[r].as_ptr().add(i))) };
                for p in 0..P {
                    acc[r][p] = _mm512_fmadd_ps(x, c[p], acc[r][p]);
                }
            }
            i += LANES;
        }
        let mut out = [[0f32; C]; R];
        for ((x, acc), out) in xs.iter().zip(&acc).zip(out.iter_mut()) {
            for (p, acc) in acc.iter().enumerate() {
                let mut lanes = [0f32; 2 * LANES];
                // SAFETY: `lanes` holds exactly sixteen floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *acc) };
                for (half, j) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                    let mut sum: f32 = lanes[half * LANES..(half + 1) * LANES].iter().sum();
                    for (a, b) in x[body..].iter().zip(&cs[j][body..]) {
                        sum = a.mul_add(*b, sum);
                    }
                    out[j] = sum;
                }
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The AVX-512 tile gives the bits of the portable one for every (row, centroid).
        #[test]
        fn the_wide_tile_gives_the_portable_bits(
            (dim, rows, centroids) in (1usize..70).prop_flat_map(|d| (
                Just(d),
                prop::collection::vec(-4.0f32..4.0, WIDE_ROWS * d),
                prop::collection::vec(-4.0f32..4.0, WIDE_CENTROIDS * d),
            ))
        ) {
            #[cfg(target_arch = "x86_64")]
            if avx512::available() {
                let xs: [&[f32]; WIDE_ROWS] = std::array::from_fn(|r| &rows[r * dim..(r + 1) * dim]);
                let cs: [&[f32]; WIDE_CENTROIDS] =
                    std::array::from_fn(|j| &centroids[j * dim..(j + 1) * dim]);
                let pairs = avx512::interleave(&centroids, dim);
                let wide = unsafe {
                    avx512::dots::<WIDE_ROWS, { WIDE_CENTROIDS / 2 }, WIDE_CENTROIDS>(xs, &pairs, cs)
                };
                for r in 0..WIDE_ROWS {
                    for j in 0..WIDE_CENTROIDS {
                        prop_assert_eq!(wide[r][j].to_bits(), dot_portable(xs[r], cs[j]).to_bits());
                    }
                }
            }
            let _ = (dim, rows, centroids);
        }

        /// Whatever the rows it comes with (so whatever the blocks, tiles and path), a row
        /// gets the centroid and distance it gets alone through the portable code: the
        /// naive reference is one row, one centroid at a time, lowest index on ties.
        #[test]
        fn a_rows_centroid_does_not_depend_on_the_other_rows(
            (dim, rows, centroids) in (1usize..200).prop_flat_map(|d| (
                Just(d),
                prop::collection::vec(-2.0f32..2.0, 0..(400 / d + 2) * d * 4),
                prop::collection::vec(-2.0f32..2.0, d..(600 / d + 2) * d * 3),
            ))
        ) {
            let dim_rows = rows.len() / dim * dim;
            let dim_centroids = centroids.len() / dim * dim;
            let (rows, centroids) = (&rows[..dim_rows], &centroids[..dim_centroids]);
            prop_assume!(!centroids.is_empty());
            let table = CentroidTable::new(centroids, dim);
            let mut out = vec![(0u32, 0f32); rows.len() / dim];
            table.assign(rows, &mut out);
            for (x, got) in rows.chunks_exact(dim).zip(&out) {
                let mut best = (0u32, f32::INFINITY);
                for c in 0..table.len() {
                    table.offer(&mut best, c, dot_portable(x, table.centroid(c)));
                }
                let want = (best.0, (norm_squared(x) + best.1).max(0.0));
                prop_assert_eq!((got.0, got.1.to_bits()), (want.0, want.1.to_bits()));
            }
        }
    }

    /// Several blocks of rows and of centroids (768-d: 18 to 20 rows and 81 to 84 centroids
    /// a block), odd counts at every edge, and duplicated centroids (exact ties): each row gets
    /// what one row at a time against one centroid at a time gives.
    #[test]
    fn blocks_of_rows_and_centroids_match_one_row_at_a_time() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (dim, n, k) in [(768, 131, 301), (128, 700, 1001), (13, 257, 97)] {
            let rows: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut centroids: Vec<f32> =
                (0..k * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            // Centroid 2c + 1 repeats centroid 2c for the first ten pairs; rows 0..10 sit
            // on them.
            for c in 0..10 {
                let (a, b) = centroids.split_at_mut((2 * c + 1) * dim);
                b[..dim].copy_from_slice(&a[2 * c * dim..]);
            }
            let mut rows = rows;
            rows[..10 * dim].copy_from_slice(&centroids[..10 * dim]);
            let table = CentroidTable::new(&centroids, dim);
            let mut out = vec![(0u32, 0f32); n];
            table.assign(&rows, &mut out);
            for (i, (x, got)) in rows.chunks_exact(dim).zip(&out).enumerate() {
                let mut best = (0u32, f32::INFINITY);
                for c in 0..k {
                    table.offer(&mut best, c, dot_portable(x, table.centroid(c)));
                }
                let want = (best.0, (norm_squared(x) + best.1).max(0.0));
                assert_eq!(
                    (got.0, got.1.to_bits()),
                    (want.0, want.1.to_bits()),
                    "{dim} {i}"
                );
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

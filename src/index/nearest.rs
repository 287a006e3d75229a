//! Nearest centroid of many rows at once: the step k-means training, index builds and
//! `ivf_partition` spend their time in.
//!
//! The centroids are copied once into *panels* of `PANEL` centroids: panel `p` holds, for
//! each dimension `d` in turn, element `d` of centroids `16p .. 16p + 16` (one 512-bit
//! register). A tile of `R` rows meets `V` panels: each step of `d` loads `V` panel vectors,
//! broadcasts element `d` of each row, and `R × V` fused multiply-adds each advance sixteen dot
//! products, in independent registers. A register holds whole dot products, so nothing is
//! summed across lanes; the previous layout (eight lanes of one row and one centroid per
//! register) summed eight lanes per pair at the end, which at 128 dimensions cost as much as
//! the multiply-adds (measured: 3.5× the throughput at 128 dimensions, the same at 768).
//! Distances use the expansion `|x − c|² = |x|² − 2 x·c + |c|²`: the norms are computed once
//! and a row compares scores `|c|² − 2 x·c`.
//!
//! Rows and panels are taken in blocks that stay in the core's cache (about
//! `ROW_BLOCK_BYTES` of rows against `PANEL_BLOCK_BYTES` of panels), so the centroids are
//! read from memory once per block of rows rather than once per tile.
//!
//! The expansion rounds differently from the direct difference, so a row almost equidistant
//! from two centroids may pick the other one than [`super::kmeans::nearest`] would; both
//! choices are within rounding of the true minimum (tested), which is all k-means and IVF
//! partitioning need. Within this module every path gives the same bits, whatever the
//! blocking, the tile or the instruction set: each (row, centroid) dot product is one chain of
//! fused multiply-adds over the dimensions in order, from zero; the score is `|c|² − 2·dot`;
//! a row keeps the lowest score, the lowest index among exact ties, and a NaN score never
//! wins. A row's centroid therefore depends neither on the machine nor on the other rows it
//! came with.

use super::distance::norm_squared;

/// Centroids per panel: sixteen floats, one AVX-512 register (two AVX2 registers).
const PANEL: usize = 16;
/// Rows per portable tile.
const PORTABLE_ROWS: usize = 4;
/// Rows per AVX2 tile (one panel: twelve accumulator registers).
const AVX2_ROWS: usize = 6;
/// Rows per AVX-512 tile.
const WIDE_ROWS: usize = 6;
/// Panels per AVX-512 tile (with [`WIDE_ROWS`], 24 accumulator registers of 32).
const WIDE_PANELS: usize = 4;
/// Bytes of rows taken at once.
const ROW_BLOCK_BYTES: usize = 64 * 1024;
/// Bytes of panels a block of rows meets at once (well inside a core's L2).
const PANEL_BLOCK_BYTES: usize = 256 * 1024;

/// A row's best centroid so far and its score `|c|² − 2 x·c`.
type Best = (u32, f32);

/// Centroids (`k × dim`, row-major, given to [`Self::new`]) as panels with their squared
/// norms, ready for [`Self::assign`].
pub struct CentroidTable {
    dim: usize,
    len: usize,
    /// `|c|²` per panel slot; `+∞` in the padding slots of the last panel, whose score is
    /// then never below a real one.
    norms: Vec<f32>,
    /// `panels × dim × PANEL` floats; zeros in the padding slots.
    panels: Vec<f32>,
}

impl CentroidTable {
    /// The table of `centroids` (`dim` floats each).
    pub fn new(centroids: &[f32], dim: usize) -> Self {
        let len = centroids.len().checked_div(dim).unwrap_or(0);
        let slots = len.div_ceil(PANEL) * PANEL;
        let mut norms = vec![f32::INFINITY; slots];
        let mut panels = vec![0f32; slots * dim];
        for (c, centroid) in centroids.chunks_exact(dim.max(1)).take(len).enumerate() {
            norms[c] = norm_squared(centroid);
            let panel = &mut panels[(c / PANEL) * dim * PANEL..][..dim * PANEL];
            for (d, x) in centroid.iter().enumerate() {
                panel[d * PANEL + c % PANEL] = *x;
            }
        }
        Self {
            dim,
            len,
            norms,
            panels,
        }
    }

    /// Number of centroids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no centroid.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of a table of `centroids` centroids of `dim` floats (its copy of them and their
    /// norms), for callers that budget memory (one table per thread that makes one).
    pub fn bytes_for(centroids: usize, dim: usize) -> usize {
        centroids.div_ceil(PANEL) * PANEL * (dim + 1) * 4
    }

    /// For each row of `rows` (`n × dim`), the nearest centroid (lowest index among exact ties)
    /// and the squared distance to it (never negative), into `out` (`n` slots).
    pub fn assign(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        self.assign_on(Path::fastest(), rows, out)
    }

    fn assign_on(&self, path: Path, rows: &[f32], out: &mut [(u32, f32)]) {
        let dim = self.dim;
        if dim == 0 || self.is_empty() {
            out.fill((0, 0.0));
            return;
        }
        // Whole rows with a slot each (a caller's mismatch leaves the rest alone rather than
        // read past a row).
        let n = (rows.len() / dim).min(out.len());
        let (rows, out) = (&rows[..n * dim], &mut out[..n]);
        match path {
            // SAFETY: `Path::fastest` (or a test) chose the path only where the CPU has it.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe { self.assign_avx512(rows, out) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { self.assign_avx2(rows, out) },
            Path::Portable => self.blocked::<PORTABLE_ROWS, 1>(
                rows,
                out,
                portable::tile::<PORTABLE_ROWS, 1>,
                portable::tile::<PORTABLE_ROWS, 1>,
            ),
        }
        for (x, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
            slot.1 = (norm_squared(x) + slot.1).max(0.0);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn assign_avx2(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        self.blocked::<AVX2_ROWS, 1>(
            rows,
            out,
            |x, p, n, b, best| avx2::tile::<AVX2_ROWS>(x, p, n, b, best),
            |x, p, n, b, best| avx2::tile::<AVX2_ROWS>(x, p, n, b, best),
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn assign_avx512(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        self.blocked::<WIDE_ROWS, WIDE_PANELS>(
            rows,
            out,
            |x, p, n, b, best| avx512::tile::<WIDE_ROWS, WIDE_PANELS>(x, p, n, b, best),
            |x, p, n, b, best| avx512::tile::<WIDE_ROWS, 1>(x, p, n, b, best),
        );
    }

    /// Every slot of `out` gets its row's best `(centroid, score)`: rows in blocks of about
    /// [`ROW_BLOCK_BYTES`], each meeting the panels a block of about [`PANEL_BLOCK_BYTES`] at
    /// a time, in tiles of `R` rows × `V` panels (`tile`) or × one panel (`one`, at the end
    /// of a block). The last rows, fewer than `R`, go through the tile padded with zero rows
    /// whose results are dropped (a row's bits do not depend on its tile-mates).
    #[inline(always)]
    fn blocked<const R: usize, const V: usize>(
        &self,
        rows: &[f32],
        out: &mut [(u32, f32)],
        tile: impl Fn(&[f32], &[f32], &[f32], usize, &mut [Best; R]),
        one: impl Fn(&[f32], &[f32], &[f32], usize, &mut [Best; R]),
    ) {
        let dim = self.dim;
        let panel_floats = dim * PANEL;
        let panel_count = self.norms.len() / PANEL;
        let row_block = (ROW_BLOCK_BYTES / (dim * 4) / R * R).max(R);
        // A multiple of the tile, so only the last block of all has a single-panel tail.
        let panel_block = (PANEL_BLOCK_BYTES / (panel_floats * 4) / V * V).max(V);
        let mut padded = vec![0f32; R * dim];
        for (block, slots) in rows.chunks(row_block * dim).zip(out.chunks_mut(row_block)) {
            slots.fill((0, f32::INFINITY));
            let mut p0 = 0;
            while p0 < panel_count {
                let p1 = (p0 + panel_block).min(panel_count);
                for (xs, slots) in block.chunks(R * dim).zip(slots.chunks_mut(R)) {
                    let xs = if slots.len() == R {
                        xs
                    } else {
                        padded.fill(0.0);
                        padded[..xs.len()].copy_from_slice(xs);
                        &padded[..]
                    };
                    let mut best = [(0u32, f32::INFINITY); R];
                    best[..slots.len()].copy_from_slice(slots);
                    let mut p = p0;
                    while p + V <= p1 {
                        let panels = &self.panels[p * panel_floats..(p + V) * panel_floats];
                        let norms = &self.norms[p * PANEL..(p + V) * PANEL];
                        tile(xs, panels, norms, p * PANEL, &mut best);
                        p += V;
                    }
                    for p in p..p1 {
                        let panels = &self.panels[p * panel_floats..(p + 1) * panel_floats];
                        let norms = &self.norms[p * PANEL..(p + 1) * PANEL];
                        one(xs, panels, norms, p * PANEL, &mut best);
                    }
                    let kept = slots.len();
                    slots.copy_from_slice(&best[..kept]);
                }
                p0 = p1;
            }
        }
    }
}

/// The instruction sets [`CentroidTable::assign`] can run on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    /// The fastest path this CPU has (checked once).
    fn fastest() -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            static FASTEST: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
            *FASTEST.get_or_init(|| {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    Path::Avx512
                } else if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    Path::Avx2
                } else {
                    Path::Portable
                }
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Path::Portable
    }

    /// Every path this CPU has.
    #[cfg(test)]
    fn available() -> Vec<Path> {
        let mut paths = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                paths.push(Path::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                paths.push(Path::Avx512);
            }
        }
        paths
    }
}

/// Keeps centroid `c` if its `score` beats the best so far (a NaN never does).
#[inline(always)]
fn offer(best: &mut Best, c: usize, score: f32) {
    if score < best.1 {
        *best = (c as u32, score);
    }
}

/// The tile in plain Rust: the definition the vector paths reproduce bit for bit.
mod portable {
    use super::{Best, PANEL, offer};

    /// Offers the `V` panels at `panels` (first centroid `base`, norms `norms`) to each of the
    /// `R` rows `xs` (`R × dim`), each panel's slots in increasing order.
    pub fn tile<const R: usize, const V: usize>(
        xs: &[f32],
        panels: &[f32],
        norms: &[f32],
        base: usize,
        best: &mut [Best; R],
    ) {
        let dim = xs.len() / R;
        for (v, panel) in panels.chunks_exact(dim * PANEL).enumerate().take(V) {
            let mut dots = [[0f32; PANEL]; R];
            for (d, slots) in panel.chunks_exact(PANEL).enumerate() {
                for (r, dots) in dots.iter_mut().enumerate() {
                    let x = xs[r * dim + d];
                    for (dot, c) in dots.iter_mut().zip(slots) {
                        *dot = x.mul_add(*c, *dot);
                    }
                }
            }
            for (best, dots) in best.iter_mut().zip(&dots) {
                for (l, dot) in dots.iter().enumerate() {
                    offer(best, base + v * PANEL + l, norms[v * PANEL + l] - 2.0 * dot);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// [`portable::tile`] with AVX2 + FMA: a panel is two registers.
mod avx2 {
    use std::arch::x86_64::{
        __m256, _CMP_EQ_OQ, _mm_cvtss_f32, _mm_min_ps, _mm_movehl_ps, _mm_shuffle_ps,
        _mm256_add_ps, _mm256_castps256_ps128, _mm256_cmp_ps, _mm256_extractf128_ps,
        _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_min_ps, _mm256_movemask_ps, _mm256_set1_ps,
        _mm256_setzero_ps, _mm256_storeu_ps, _mm256_sub_ps,
    };

    use super::{Best, PANEL};

    /// [`super::portable::tile`] for one panel.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn tile<const R: usize>(
        xs: &[f32],
        panel: &[f32],
        norms: &[f32],
        base: usize,
        best: &mut [Best; R],
    ) {
        let dim = xs.len() / R;
        assert!(
            xs.len() == R * dim && panel.len() == dim * PANEL && norms.len() == PANEL,
            "tile shapes"
        );
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let (pp, xp) = (panel.as_ptr(), xs.as_ptr());
        for d in 0..dim {
            // SAFETY: `d < dim`: the panel's slots for `d` are the 16 floats at `16d`, and row
            // `r`'s element is at `r·dim + d`, inside the asserted lengths.
            let c = unsafe {
                [
                    _mm256_loadu_ps(pp.add(d * PANEL)),
                    _mm256_loadu_ps(pp.add(d * PANEL + 8)),
                ]
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(unsafe { *xp.add(r * dim + d) });
                acc[0] = _mm256_fmadd_ps(x, c[0], acc[0]);
                acc[1] = _mm256_fmadd_ps(x, c[1], acc[1]);
            }
        }
        // SAFETY: `norms` holds the panel's 16 floats (asserted).
        let cn = unsafe {
            [
                _mm256_loadu_ps(norms.as_ptr()),
                _mm256_loadu_ps(norms.as_ptr().add(8)),
            ]
        };
        for (acc, best) in acc.iter().zip(best.iter_mut()) {
            let s: [__m256; 2] =
                std::array::from_fn(|h| _mm256_sub_ps(cn[h], _mm256_add_ps(acc[h], acc[h])));
            // `min(s, m)` keeps `m` where `s` is NaN, so a NaN score never wins.
            let m = _mm256_min_ps(s[1], _mm256_min_ps(s[0], _mm256_set1_ps(f32::INFINITY)));
            let m = _mm_min_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
            let lowest = _mm_cvtss_f32(_mm_min_ps(m, _mm_shuffle_ps::<1>(m, m)));
            if lowest < best.1 {
                let target = _mm256_set1_ps(lowest);
                let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(s[0], target)) as u32
                    | (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(s[1], target)) as u32) << 8;
                let lane = hits.trailing_zeros() as usize;
                let mut scores = [0f32; PANEL];
                // SAFETY: `scores` holds sixteen floats.
                unsafe {
                    _mm256_storeu_ps(scores.as_mut_ptr(), s[0]);
                    _mm256_storeu_ps(scores.as_mut_ptr().add(8), s[1]);
                }
                // The lane's own score (`lowest` may be the other zero of a ±0 tie).
                *best = ((base + lane) as u32, scores[lane]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// [`portable::tile`] with AVX-512: a panel is one register.
mod avx512 {
    use std::arch::x86_64::{
        __m512, _CMP_EQ_OQ, _mm512_add_ps, _mm512_cmp_ps_mask, _mm512_fmadd_ps, _mm512_loadu_ps,
        _mm512_min_ps, _mm512_reduce_min_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
        _mm512_sub_ps,
    };

    use super::{Best, PANEL};

    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn tile<const R: usize, const V: usize>(
        xs: &[f32],
        panels: &[f32],
        norms: &[f32],
        base: usize,
        best: &mut [Best; R],
    ) {
        let dim = xs.len() / R;
        assert!(
            xs.len() == R * dim && panels.len() == V * dim * PANEL && norms.len() == V * PANEL,
            "tile shapes"
        );
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let (pp, xp) = (panels.as_ptr(), xs.as_ptr());
        for d in 0..dim {
            // SAFETY: `d < dim`: panel `v`'s slots for `d` are the 16 floats at
            // `v·dim·16 + 16d`, and row `r`'s element is at `r·dim + d`, inside the asserted
            // lengths.
            let c: [__m512; V] =
                std::array::from_fn(|v| unsafe { _mm512_loadu_ps(pp.add((v * dim + d) * PANEL)) });
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(unsafe { *xp.add(r * dim + d) });
                for (acc, c) in acc.iter_mut().zip(&c) {
                    *acc = _mm512_fmadd_ps(x, *c, *acc);
                }
            }
        }
        // SAFETY: `norms` holds `V` panels' 16 floats (asserted).
        let cn: [__m512; V] =
            std::array::from_fn(|v| unsafe { _mm512_loadu_ps(norms.as_ptr().add(v * PANEL)) });
        for (acc, best) in acc.iter().zip(best.iter_mut()) {
            let s: [__m512; V] =
                std::array::from_fn(|v| _mm512_sub_ps(cn[v], _mm512_add_ps(acc[v], acc[v])));
            // `min(s, m)` keeps `m` where `s` is NaN, so a NaN score never wins.
            let mut m = _mm512_set1_ps(f32::INFINITY);
            for s in &s {
                m = _mm512_min_ps(*s, m);
            }
            let lowest = _mm512_reduce_min_ps(m);
            if lowest < best.1 {
                let target = _mm512_set1_ps(lowest);
                for (v, s) in s.iter().enumerate() {
                    let hits = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(*s, target);
                    if hits != 0 {
                        let lane = hits.trailing_zeros() as usize;
                        let mut scores = [0f32; PANEL];
                        // SAFETY: `scores` holds sixteen floats.
                        unsafe { _mm512_storeu_ps(scores.as_mut_ptr(), *s) };
                        // The lane's own score (`lowest` may be the other zero of a ±0 tie).
                        *best = ((base + v * PANEL + lane) as u32, scores[lane]);
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

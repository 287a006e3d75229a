//! A partition's vectors at one byte per value, kept beside its floats so that a search
//! reads a quarter of the bytes for most rows and still ranks every row exactly.
//!
//! Each dimension is quantized over the partition's range: `x̂[d] = lo[d] + step[d] × c[d]`
//! with `c[d]` in `0..=255`, and each row keeps `err ≥ ‖x − x̂‖`, its reconstruction error
//! computed exactly (in `f64`, rounded up). The triangle inequality then bounds each row's
//! true key from below by what its codes give:
//! - L2: `‖x − q‖ ≥ ‖x̂ − q‖ − err`;
//! - dot and cosine: `q·x ≤ q·x̂ + ‖q‖ × err` (Cauchy–Schwarz).
//!
//! A row whose lower bound is above the current k-th best key cannot enter the top-k and is
//! skipped; every other row is scored exactly from its floats by the usual kernels. The
//! answer is therefore the answer of scoring every row exactly, bit for bit: this is not an
//! approximation with a recall, and the bound only decides how many rows are read twice.
//!
//! Both computations round. A sum of `n` terms in `f32` is off by at most `(n + 3)·2⁻²⁴`
//! times the sum of the terms' magnitudes, whatever the order of additions; every bound here
//! is widened by twice that (`gamma = (dim + 8)·2⁻²³`) against the largest magnitudes the
//! terms can have, so a skipped row's *computed* key is strictly above the bound. The
//! property test at the end checks the whole claim against scoring every row.
//!
//! Pure computation; the cache decides which partitions are worth quantizing.

use super::distance::{Metric, dot};

/// Below this many dimensions the floats are few enough that reading them is as cheap as
/// reading codes and checking a bound.
pub const MIN_DIM: usize = 16;

/// Values beyond this magnitude are not quantized: the squares of a row's differences must
/// stay far from `f32::MAX` for the rounding bounds above to hold.
const LIMIT: f32 = 1e15;

/// Codes and error bounds of a partition's rows (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedRows {
    dim: usize,
    lo: Vec<f32>,
    step: Vec<f32>,
    /// `rows × dim` codes.
    codes: Vec<u8>,
    /// Per row: `≥ ‖x − x̂‖`.
    err: Vec<f32>,
    /// Per row: `≥ err + gamma × (span + ‖x‖)`, the dot product's error per unit of `‖q‖`.
    reach: Vec<f32>,
    /// Per row: `sqrt(dot(x, x))` exactly as the cosine kernel computes it.
    norm: Vec<f32>,
    /// `≥ ‖lo‖ + 255 × ‖step‖`: bounds `‖x̂‖` and the magnitudes of the code sums.
    span: f32,
    gamma: f32,
    /// The middle of the codes' range, and `radius ≥ ‖x − centre‖` for every row: a ball
    /// holding the whole partition, which bounds all its keys at once
    /// ([`Self::none_can_enter`]).
    centre: Vec<f32>,
    radius: f32,
}

/// `x` rounded up to an `f32`.
fn up(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x { f.next_up() } else { f }
}

/// Per dimension, the smallest and largest value of `vectors` (`dim` per row; none empty).
pub fn value_range(vectors: &[f32], dim: usize) -> Option<(Vec<f32>, Vec<f32>)> {
    let first = vectors.get(..dim)?;
    let (mut lo, mut hi) = (first.to_vec(), first.to_vec());
    for row in vectors.chunks_exact(dim) {
        for d in 0..dim {
            lo[d] = lo[d].min(row[d]);
            hi[d] = hi[d].max(row[d]);
        }
    }
    Some((lo, hi))
}

/// A row's bound terms (see [`QuantizedRows`]): `err ≥ ‖x − x̂‖`, `reach` the dot
/// product's error per unit of `‖q‖`, `norm` as the cosine kernel computes it, and
/// `far ≥ ‖x − centre‖`. A row that cannot be bounded (a value not finite or beyond
/// `LIMIT`) has infinite terms: no bound ever rules it out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowTerms {
    /// An upper bound on the row's coding error `‖x − x̂‖`.
    pub err: f32,
    /// The dot product's error per unit of `‖q‖`.
    pub reach: f32,
    /// The row's norm as the cosine kernel computes it.
    pub norm: f32,
    /// An upper bound on the row's distance from its partition's centre.
    pub far: f32,
}

/// The grid rows are coded on — `x̂[d] = lo[d] + step[d] × c[d]` — and what every row's
/// bound terms need from it. A row outside the grid is coded to its nearest point (codes
/// clamp) and its error measured as for any other, so the bounds hold for any grid.
#[derive(Debug, Clone)]
pub struct Coder {
    lo: Vec<f32>,
    step: Vec<f32>,
    inverse: Vec<f32>,
    centre: Vec<f32>,
    /// `‖lo‖ + 255 × ‖step‖`, unrounded.
    span: f64,
    gamma: f64,
}

impl Coder {
    /// The grid of 256 steps from `lo` to `hi` per dimension (finite values within
    /// `LIMIT`; a dimension with `hi ≤ lo` gets a zero step).
    pub fn new(lo: Vec<f32>, hi: &[f32]) -> Self {
        let dim = lo.len();
        let step: Vec<f32> = lo
            .iter()
            .zip(hi)
            .map(|(l, h)| (((*h as f64 - *l as f64) / 255.0) as f32).max(0.0))
            .collect();
        let gamma = (dim + 8) as f64 * f64::powi(2.0, -23);
        let norm2 = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        let span = norm2(&mut lo.iter().map(|l| *l as f64))
            + 255.0 * norm2(&mut step.iter().map(|s| *s as f64));
        let centre: Vec<f32> = lo.iter().zip(&step).map(|(l, s)| l + 127.5 * s).collect();
        // Codes come from f32 arithmetic (it vectorizes; `round` would be a libm call per
        // value without SSE4.1): not always the nearest code, but each row's error is then
        // measured exactly, in f64, for the codes chosen, so the bound holds either way.
        let inverse = step
            .iter()
            .map(|s| if *s > 0.0 { 1.0 / s } else { 0.0 })
            .collect();
        Self {
            lo,
            step,
            inverse,
            centre,
            span,
            gamma,
        }
    }

    /// Dimensions of the rows.
    pub fn dim(&self) -> usize {
        self.lo.len()
    }

    /// Whether the grid's own values are within `LIMIT` (the bounds' arithmetic needs it).
    pub fn is_bounded(&self) -> bool {
        self.lo.iter().zip(&self.step).all(|(l, s)| {
            let top = *l as f64 + 255.0 * *s as f64;
            l.abs() <= LIMIT && top.abs() <= LIMIT as f64
        })
    }

    /// Appends `row`'s `dim` codes to `codes` and returns its bound terms.
    pub fn code_row(&self, row: &[f32], codes: &mut Vec<u8>) -> RowTerms {
        let at = codes.len();
        codes.extend(
            row.iter()
                .zip(&self.lo)
                .zip(&self.inverse)
                .map(|((x, l), i)| (((x - l) * i + 0.5) as i32).clamp(0, 255) as u8),
        );
        if !row.iter().all(|v| v.abs() <= LIMIT) {
            // Also NaN: no bound may rule such a row out.
            let inf = f32::INFINITY;
            return RowTerms {
                err: inf,
                reach: inf,
                norm: dot(row, row).sqrt(),
                far: inf,
            };
        }
        let (mut e2, mut x2, mut far2) = ([0f64; 4], [0f64; 4], [0f64; 4]);
        let terms = row
            .iter()
            .zip(&self.lo)
            .zip(&self.step)
            .zip(&codes[at..])
            .zip(&self.centre);
        for (d, ((((x, l), s), c), m)) in terms.enumerate() {
            let x = *x as f64;
            let miss = x - (*l as f64 + *s as f64 * *c as f64);
            e2[d % 4] += miss * miss;
            x2[d % 4] += x * x;
            far2[d % 4] += (x - *m as f64) * (x - *m as f64);
        }
        let (e2, x2, far2): (f64, f64, f64) = (e2.iter().sum(), x2.iter().sum(), far2.iter().sum());
        // The f64 sums' own rounding is ~1e-16 relative: a millionth covers it.
        let e = e2.sqrt() * (1.0 + 1e-6);
        let gamma = self.gamma;
        RowTerms {
            err: up(e),
            reach: up((e + gamma * (self.span + x2.sqrt())) * (1.0 + gamma)),
            norm: dot(row, row).sqrt(),
            far: up(far2.sqrt() * (1.0 + 1e-6)),
        }
    }
}

impl QuantizedRows {
    /// Quantizes `vectors` (`dim` floats per row), or `None` when the partition is empty, the
    /// rows are too narrow to gain, or a value is not finite or too large to bound.
    pub fn quantize(vectors: &[f32], dim: usize) -> Option<Self> {
        if dim < MIN_DIM || vectors.is_empty() || !vectors.len().is_multiple_of(dim) {
            return None;
        }
        if !vectors.iter().all(|v| v.abs() <= LIMIT) {
            return None; // also refuses NaN
        }
        let (lo, hi) = value_range(vectors, dim)?;
        let coder = Coder::new(lo, &hi);
        let rows = vectors.len() / dim;
        let mut codes = Vec::with_capacity(vectors.len());
        let mut terms = Vec::with_capacity(rows);
        for row in vectors.chunks_exact(dim) {
            terms.push(coder.code_row(row, &mut codes));
        }
        Some(Self::from_coded(&coder, codes, &terms))
    }

    /// Rows coded by `coder` (`codes`: `dim` bytes per row, `terms`: one per row), as
    /// [`Coder::code_row`] made them.
    pub fn from_coded(coder: &Coder, codes: Vec<u8>, terms: &[RowTerms]) -> Self {
        let radius = terms.iter().map(|t| t.far).fold(0f32, f32::max);
        Self {
            dim: coder.dim(),
            lo: coder.lo.clone(),
            step: coder.step.clone(),
            codes,
            err: terms.iter().map(|t| t.err).collect(),
            reach: terms.iter().map(|t| t.reach).collect(),
            norm: terms.iter().map(|t| t.norm).collect(),
            span: up(coder.span * (1.0 + 1e-6)),
            gamma: up(coder.gamma),
            radius,
            centre: coder.centre.clone(),
        }
    }

    /// Whether a row's values can be bounded (all finite and within `LIMIT`).
    pub fn can_bound(row: &[f32]) -> bool {
        row.iter().all(|v| v.abs() <= LIMIT)
    }

    /// The rows `rows` (indices, in that order) on the same grid. The partition's ball
    /// still holds them, so its centre and radius are kept.
    pub fn select(&self, rows: &[usize]) -> Self {
        let dim = self.dim;
        let mut codes = Vec::with_capacity(rows.len() * dim);
        for &i in rows {
            codes.extend_from_slice(&self.codes[i * dim..(i + 1) * dim]);
        }
        let pick = |v: &[f32]| rows.iter().map(|&i| v[i]).collect();
        Self {
            codes,
            err: pick(&self.err),
            reach: pick(&self.reach),
            norm: pick(&self.norm),
            ..self.clone_grid()
        }
    }

    /// This grid with no rows.
    fn clone_grid(&self) -> Self {
        Self {
            dim: self.dim,
            lo: self.lo.clone(),
            step: self.step.clone(),
            codes: Vec::new(),
            err: Vec::new(),
            reach: Vec::new(),
            norm: Vec::new(),
            span: self.span,
            gamma: self.gamma,
            centre: self.centre.clone(),
            radius: self.radius,
        }
    }

    /// About what quantizing `rows` rows of `dim` values holds (one byte per value and
    /// three bound terms per row; the per-dimension ranges and centre are left out), for
    /// deciding before the rows exist.
    pub fn estimated_bytes(rows: u64, dim: usize) -> u64 {
        rows.saturating_mul(dim as u64 + 12)
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.len()
            + (self.lo.len() + self.step.len() + self.centre.len()) * 4
            + self.err.len() * 12
    }

    /// Whether every row's key, as any kernel computes it in `f32`, is certainly above
    /// `bound` (the k-th best key of a full top-k), so the partition can be skipped whole.
    /// Every row lies in the ball of `radius` around the centre `m`, so:
    /// - L2: `‖x − q‖ ≥ ‖q − m‖ − radius`;
    /// - dot: `q·x ≤ q·m + ‖q‖ × radius`.
    ///
    /// Widened for rounding by `gamma` against the largest magnitudes (`‖x‖ ≤ ‖m‖ +
    /// radius`), as the row bounds are. Cosine: never (a row's norm may be near zero).
    pub fn none_can_enter(&self, q: &[f32], metric: Metric, bound: f32) -> bool {
        if metric == Metric::Cosine
            || !bound.is_finite()
            || q.len() != self.dim
            || !q.iter().all(|v| v.abs() <= LIMIT)
        {
            return false;
        }
        let (mut far2, mut qm, mut q2, mut m2) = (0f64, 0f64, 0f64, 0f64);
        for (q, m) in q.iter().zip(&self.centre) {
            let (q, m) = (*q as f64, *m as f64);
            far2 += (q - m) * (q - m);
            qm += q * m;
            q2 += q * q;
            m2 += m * m;
        }
        // The f64 sums round by ~1e-16 relative: a millionth covers them.
        let (q_norm, x_max) = (q2.sqrt() * (1.0 + 1e-6), m2.sqrt() * (1.0 + 1e-6));
        let r = self.radius as f64;
        let x_max = x_max + r;
        let gamma = self.gamma as f64;
        let lowest = match metric {
            Metric::L2 => {
                let near = (far2.sqrt() * (1.0 - 1e-6) - r).max(0.0);
                near * near * (1.0 - gamma) - gamma * (q_norm + x_max).powi(2)
            }
            Metric::Dot => {
                let slack = 1e-6 * (qm.abs() + q_norm * r);
                -(qm + q_norm * r) - gamma * q_norm * x_max - slack
            }
            Metric::Cosine => return false,
        };
        lowest > bound as f64
    }

    /// What one query needs to bound this partition's rows, or `None` when the query cannot
    /// be bounded (another dimension, or a value that is not finite or too large).
    pub fn prepare(&self, q: &[f32], metric: Metric) -> Option<RowBounds<'_>> {
        if q.len() != self.dim || !q.iter().all(|v| v.abs() <= LIMIT) {
            return None;
        }
        let q_norm = up(q.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt() * (1.0 + 1e-6));
        let (weights, base) = match metric {
            // Per dimension: `q − lo`, so that `step × c − (q − lo) = x̂ − q`.
            Metric::L2 => (q.iter().zip(&self.lo).map(|(q, l)| q - l).collect(), 0.0),
            // Per dimension: `q × step`, so that `q·x̂ = q·lo + Σ (q × step) × c`.
            Metric::Dot | Metric::Cosine => (
                q.iter().zip(&self.step).map(|(q, s)| q * s).collect(),
                q.iter()
                    .zip(&self.lo)
                    .map(|(q, l)| *q as f64 * *l as f64)
                    .sum::<f64>() as f32,
            ),
        };
        let gamma = self.gamma;
        let reach_all = q_norm as f64 + self.span as f64;
        Some(RowBounds {
            rows: self,
            metric,
            weights,
            base,
            q_norm,
            q_norm_cosine: dot(q, q).sqrt(),
            slack_l2: up(gamma as f64 * reach_all * reach_all),
            bound_at: f32::NAN,
            reach_of_bound: f32::INFINITY,
        })
    }
}

/// One query's view of a [`QuantizedRows`]: lower bounds of its rows' keys.
#[derive(Debug)]
pub struct RowBounds<'a> {
    rows: &'a QuantizedRows,
    metric: Metric,
    weights: Vec<f32>,
    base: f32,
    q_norm: f32,
    /// `sqrt(dot(q, q))` exactly as the cosine kernel computes it.
    q_norm_cosine: f32,
    /// `≥ gamma × (‖q‖ + span)²`: the rounding of an L2 code sum.
    slack_l2: f32,
    /// The k-th best key `reach_of_bound` was computed for.
    bound_at: f32,
    /// L2: `sqrt(bound) × (1 + gamma)`.
    reach_of_bound: f32,
}

impl RowBounds<'_> {
    /// Whether row `i`'s exact key is certainly above `bound` (the k-th best key of a full
    /// top-k), so it cannot enter. `code_sum` is [`Self::code_sums`]'s value for the row.
    #[inline]
    pub fn cannot_enter(&mut self, i: usize, code_sum: f32, bound: f32) -> bool {
        if !code_sum.is_finite() || !bound.is_finite() {
            return false;
        }
        let gamma = self.rows.gamma;
        match self.metric {
            Metric::L2 => {
                if self.bound_at.to_bits() != bound.to_bits() {
                    self.bound_at = bound;
                    self.reach_of_bound = bound.max(0.0).sqrt() * (1.0 + gamma);
                }
                let r = self.rows.err[i] + self.reach_of_bound;
                code_sum > r * r * (1.0 + gamma) + self.slack_l2
            }
            Metric::Dot => {
                let approx = self.base + code_sum;
                let reach = self.q_norm * self.rows.reach[i];
                let lower = -approx - reach;
                lower - gamma * (approx.abs() + reach) > bound
            }
            Metric::Cosine => {
                let denominator = self.q_norm_cosine * self.rows.norm[i];
                if denominator == 0.0 || !denominator.is_finite() {
                    return false;
                }
                let approx = self.base + code_sum;
                let reach = self.q_norm * self.rows.reach[i];
                let ratio = (approx + reach) / denominator;
                let rounding = 2.0 * gamma * (1.0 + (approx.abs() + reach) / denominator);
                let lower = (1.0 - ratio - rounding).min(2.0);
                lower > bound
            }
        }
    }

    /// Row `i`'s key as its codes estimate it (not a bound): which rows to read first
    /// when only the codes are at hand ([`crate::index::sketch`]).
    #[inline]
    pub fn estimate(&self, i: usize, code_sum: f32) -> f32 {
        match self.metric {
            Metric::L2 => code_sum,
            Metric::Dot => -(self.base + code_sum),
            Metric::Cosine => {
                let denominator = self.q_norm_cosine * self.rows.norm[i];
                if denominator > 0.0 {
                    1.0 - (self.base + code_sum) / denominator
                } else {
                    f32::INFINITY
                }
            }
        }
    }

    /// The code sums of rows `ids` into `out` (one slot per id): for L2 `Σ (step × c −
    /// (q − lo))²`, else `Σ q × step × c`.
    pub fn code_sums(&self, ids: &[u32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { avx2::code_sums(self, ids, out) };
        }
        let dim = self.rows.dim;
        for (i, slot) in ids.iter().zip(out.iter_mut()) {
            let c = &self.rows.codes[*i as usize * dim..(*i as usize + 1) * dim];
            *slot = match self.metric {
                Metric::L2 => l2_sum(&self.rows.step, &self.weights, c),
                _ => dot_sum(&self.weights, c),
            };
        }
    }
}

fn l2_sum(step: &[f32], r: &[f32], codes: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let n = codes.len() - codes.len() % 8;
    for d in (0..n).step_by(8) {
        for j in 0..8 {
            let t = step[d + j] * codes[d + j] as f32 - r[d + j];
            acc[j] += t * t;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for d in n..codes.len() {
        let t = step[d] * codes[d] as f32 - r[d];
        sum += t * t;
    }
    sum
}

fn dot_sum(w: &[f32], codes: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let n = codes.len() - codes.len() % 8;
    for d in (0..n).step_by(8) {
        for j in 0..8 {
            acc[j] += w[d + j] * codes[d + j] as f32;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for d in n..codes.len() {
        sum += w[d] * codes[d] as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m128i, __m256, _mm_loadl_epi64, _mm256_add_ps, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32,
        _mm256_fmadd_ps, _mm256_fmsub_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };

    use super::{Metric, RowBounds};

    #[target_feature(enable = "avx2,fma")]
    pub fn code_sums(bounds: &RowBounds, ids: &[u32], out: &mut [f32]) {
        let dim = bounds.rows.dim;
        let l2 = bounds.metric == Metric::L2;
        for (i, slot) in ids.iter().zip(out.iter_mut()) {
            let c = &bounds.rows.codes[*i as usize * dim..(*i as usize + 1) * dim];
            *slot = if l2 {
                sum(&bounds.rows.step, &bounds.weights, c, true)
            } else {
                sum(&bounds.weights, &bounds.weights, c, false)
            };
        }
    }

    /// L2: `Σ (a × c − b)²`; else `Σ a × c`. Four 8-lane accumulators, then a scalar tail.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sum(a: &[f32], b: &[f32], codes: &[u8], l2: bool) -> f32 {
        let n = codes.len().min(a.len()).min(b.len());
        let wide = n - n % 32;
        let narrow = n - n % 8;
        // SAFETY (every load): `d + 8 <= narrow <= n` for each 8-wide load, inside all three
        // slices; an 8-byte code load reads `codes[d..d + 8]`.
        let floats = |s: &[f32], d: usize| unsafe { _mm256_loadu_ps(s.as_ptr().add(d)) };
        let code = |d: usize| unsafe {
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                codes.as_ptr().add(d) as *const __m128i
            )))
        };
        let term = |acc: __m256, d: usize| {
            if l2 {
                let t = _mm256_fmsub_ps(floats(a, d), code(d), floats(b, d));
                _mm256_fmadd_ps(t, t, acc)
            } else {
                _mm256_fmadd_ps(floats(a, d), code(d), acc)
            }
        };
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut d = 0;
        while d < wide {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = term(*acc, d + 8 * j);
            }
            d += 32;
        }
        let mut lanes = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        while d < narrow {
            lanes = term(lanes, d);
            d += 8;
        }
        let mut out = [0f32; 8];
        // SAFETY: `out` holds exactly eight floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), lanes) };
        let mut total: f32 = out.iter().sum();
        for d in narrow..n {
            let c = codes[d] as f32;
            total += if l2 {
                let t = a[d] * c - b[d];
                t * t
            } else {
                a[d] * c
            };
        }
        total
    }
}

#[cfg(test)]
pub(crate) mod tests;

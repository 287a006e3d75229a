//! Distance kernels over `f32` slices.
//!
//! Each kernel keeps 32 independent accumulators (four AVX2 registers), folded into eight
//! before the last partial chunk of eight, then a scalar tail: enough independent additions
//! that the loop is bound by loads and arithmetic rather than by the latency of one
//! accumulator's add chain. The loops vectorize without target features (SSE2 on x86-64, NEON
//! on aarch64), but the compiler splits them badly; on x86-64 CPUs with AVX2 (checked once,
//! cached by std) the same layout runs as explicit AVX2 code: four 8-lane registers, the same
//! fold, the same order of additions and no fused multiply-add, so both give the same bits.
//! No allocation anywhere. Accuracy is checked against an `f64` reference.

pub use crate::format::index_meta::Metric;

/// Accumulators of the main loop.
const WIDE: usize = 32;
/// Accumulators after the fold, for the last partial wide chunk.
const LANES: usize = 8;

/// Sums `f(x[i], y[i])` over equal-length slices with the accumulator layout above.
#[inline(always)]
fn accumulate(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let wide = n - n % WIDE;
    let mut acc = [0f32; WIDE];
    for (x, y) in a[..wide]
        .chunks_exact(WIDE)
        .zip(b[..wide].chunks_exact(WIDE))
    {
        for i in 0..WIDE {
            acc[i] += f(x[i], y[i]);
        }
    }
    let mut lanes = [0f32; LANES];
    for (i, lane) in lanes.iter_mut().enumerate() {
        *lane = (acc[i] + acc[i + LANES]) + (acc[i + 2 * LANES] + acc[i + 3 * LANES]);
    }
    let narrow = n - (n - wide) % LANES;
    for (x, y) in a[wide..narrow]
        .chunks_exact(LANES)
        .zip(b[wide..narrow].chunks_exact(LANES))
    {
        for i in 0..LANES {
            lanes[i] += f(x[i], y[i]);
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for (x, y) in a[narrow..].iter().zip(&b[narrow..]) {
        sum += f(*x, *y);
    }
    sum
}

/// Squared Euclidean distance.
#[inline]
pub fn l2_squared(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::l2_squared(a, b) };
    }
    accumulate(a, b, |x, y| {
        let d = x - y;
        d * d
    })
}

/// Inner (dot) product.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::dot(a, b) };
    }
    accumulate(a, b, |x, y| x * y)
}

/// Rows scored per call of a batch kernel by callers that keep their keys on the stack.
pub const BATCH_ROWS: usize = 64;

/// [`l2_squared`] of `q` and each `q.len()`-float row of `rows`, into `out` (one slot per row):
/// the same bits as one call per row, with the CPU check and the call made once per batch.
pub fn l2_squared_rows(q: &[f32], rows: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::l2_squared_rows(q, rows, out) };
    }
    each_row(q, rows, out, l2_squared);
}

/// [`dot`] of `q` and each row of `rows`, into `out`, as [`l2_squared_rows`].
pub fn dot_rows(q: &[f32], rows: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::dot_rows(q, rows, out) };
    }
    each_row(q, rows, out, dot);
}

#[inline(always)]
fn each_row(q: &[f32], rows: &[f32], out: &mut [f32], kernel: impl Fn(&[f32], &[f32]) -> f32) {
    if q.is_empty() {
        out.fill(0.0);
        return;
    }
    for (v, slot) in rows.chunks_exact(q.len()).zip(out.iter_mut()) {
        *slot = kernel(q, v);
    }
}

/// [`accumulate`]'s layout as explicit AVX2 code: accumulator register `j` holds lanes
/// `8j..8j + 8`, folded as `(r0 + r1) + (r2 + r3)`, then the same partial chunk of eight, the
/// same sequential sum of the eight lanes and the same scalar tail.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
        _mm256_sub_ps,
    };

    use super::{LANES, WIDE};

    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn l2_squared(a: &[f32], b: &[f32]) -> f32 {
        accumulate(
            a,
            b,
            #[inline(always)]
            |x, y| {
                let d = _mm256_sub_ps(x, y);
                _mm256_mul_ps(d, d)
            },
            |x, y| {
                let d = x - y;
                d * d
            },
        )
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        accumulate(
            a,
            b,
            #[inline(always)]
            |x, y| _mm256_mul_ps(x, y),
            |x, y| x * y,
        )
    }

    #[target_feature(enable = "avx2")]
    pub fn l2_squared_rows(q: &[f32], rows: &[f32], out: &mut [f32]) {
        super::each_row(q, rows, out, |a, b| l2_squared(a, b));
    }

    #[target_feature(enable = "avx2")]
    pub fn dot_rows(q: &[f32], rows: &[f32], out: &mut [f32]) {
        super::each_row(q, rows, out, |a, b| dot(a, b));
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn accumulate(
        a: &[f32],
        b: &[f32],
        f: impl Fn(__m256, __m256) -> __m256,
        scalar: impl Fn(f32, f32) -> f32,
    ) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let wide = n - n % WIDE;
        let narrow = n - (n - wide) % LANES;
        // SAFETY (every load): `i + 8 * j + 8 <= wide <= n` in the first loop and
        // `i + 8 <= narrow <= n` in the second, so each 8-float load is inside both slices.
        let load = |s: &[f32], i: usize| unsafe { _mm256_loadu_ps(s.as_ptr().add(i)) };
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < wide {
            for (j, acc) in acc.iter_mut().enumerate() {
                let at = i + LANES * j;
                *acc = _mm256_add_ps(*acc, f(load(a, at), load(b, at)));
            }
            i += WIDE;
        }
        let mut lanes = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        while i < narrow {
            lanes = _mm256_add_ps(lanes, f(load(a, i), load(b, i)));
            i += LANES;
        }
        let mut out = [0f32; LANES];
        // SAFETY: `out` holds exactly eight floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), lanes) };
        let mut sum: f32 = out.iter().sum();
        for (x, y) in a[narrow..].iter().zip(&b[narrow..]) {
            sum += scalar(*x, *y);
        }
        sum
    }
}

/// Squared norm.
#[inline]
pub fn norm_squared(a: &[f32]) -> f32 {
    dot(a, a)
}

/// `1 − cos(a, b)`, or `None` when either vector has zero norm (the angle is undefined).
///
/// Three passes of the vectorized dot kernel: one fused loop with three accumulator sets does
/// not vectorize (measured at a fifth of the throughput).
#[inline]
pub fn cosine_distance(a: &[f32], b: &[f32]) -> Option<f32> {
    let (ab, aa, bb) = (dot(a, b), dot(a, a), dot(b, b));
    if aa == 0.0 || bb == 0.0 {
        return None;
    }
    // Rounding can push |cos| a hair past 1; the distance is clamped to its range [0, 2].
    Some((1.0 - ab / (aa.sqrt() * bb.sqrt())).clamp(0.0, 2.0))
}

/// The ordering key of `v` for query `q` under `metric`: smaller is nearer (`Dot` orders by
/// the negative inner product, `L2` by the squared distance). `None` for an undefined cosine
/// distance (zero vector), which ranks after every defined one.
#[inline]
pub fn metric_key(metric: Metric, q: &[f32], v: &[f32]) -> Option<f32> {
    match metric {
        Metric::L2 => Some(l2_squared(q, v)),
        Metric::Cosine => cosine_distance(q, v),
        Metric::Dot => Some(-dot(q, v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference_l2(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
            .sum()
    }

    fn reference_dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    fn close(a: f32, b: f64, scale: f64) -> bool {
        ((a as f64) - b).abs() <= 1e-4 * scale.max(1.0)
    }

    proptest! {
        #[test]
        fn kernels_match_f64_references(
            pairs in (0usize..300).prop_flat_map(|n| (
                prop::collection::vec(-10f32..10.0, n),
                prop::collection::vec(-10f32..10.0, n),
            ))
        ) {
            let (a, b) = pairs;
            let scale = a.len() as f64 * 100.0;
            prop_assert!(close(l2_squared(&a, &b), reference_l2(&a, &b), scale));
            prop_assert!(close(dot(&a, &b), reference_dot(&a, &b), scale));
            let (na, nb) = (reference_dot(&a, &a), reference_dot(&b, &b));
            match cosine_distance(&a, &b) {
                None => prop_assert!(na == 0.0 || nb == 0.0),
                Some(c) => {
                    let r = 1.0 - reference_dot(&a, &b) / (na.sqrt() * nb.sqrt());
                    prop_assert!(((c as f64) - r).abs() < 1e-3, "{} vs {}", c, r);
                }
            }
        }
    }

    proptest! {
        /// The AVX2 code (when this CPU has AVX2) and the portable one add in the same order
        /// without fused multiply-adds: the same bits on every machine.
        #[test]
        fn the_avx2_copy_gives_the_same_bits(
            pairs in (0usize..300).prop_flat_map(|n| (
                prop::collection::vec(-10f32..10.0, n),
                prop::collection::vec(-10f32..10.0, n),
            ))
        ) {
            let (a, b) = pairs;
            let l2 = accumulate(&a, &b, |x, y| (x - y) * (x - y));
            prop_assert_eq!(l2_squared(&a, &b).to_bits(), l2.to_bits());
            let d = accumulate(&a, &b, |x, y| x * y);
            prop_assert_eq!(dot(&a, &b).to_bits(), d.to_bits());
        }

        /// The batch kernels give each row the bits of the one-row kernels.
        #[test]
        fn batch_kernels_give_the_one_row_bits(
            (q, rows) in (1usize..70).prop_flat_map(|d| (
                prop::collection::vec(-10f32..10.0, d),
                (0usize..6).prop_flat_map(move |n| prop::collection::vec(-10f32..10.0, n * d)),
            ))
        ) {
            let n = rows.len() / q.len();
            let (mut l2, mut d) = (vec![0f32; n], vec![0f32; n]);
            l2_squared_rows(&q, &rows, &mut l2);
            dot_rows(&q, &rows, &mut d);
            for (i, v) in rows.chunks_exact(q.len()).enumerate() {
                prop_assert_eq!(l2[i].to_bits(), l2_squared(&q, v).to_bits());
                prop_assert_eq!(d[i].to_bits(), dot(&q, v).to_bits());
            }
        }
    }

    #[test]
    fn zero_vectors_have_no_cosine_distance() {
        assert_eq!(cosine_distance(&[0.0, 0.0], &[1.0, 0.0]), None);
        assert_eq!(cosine_distance(&[1.0, 0.0], &[1.0, 0.0]), Some(0.0));
        assert_eq!(cosine_distance(&[1.0, 0.0], &[-1.0, 0.0]), Some(2.0));
    }
}

use super::*;

fn reference(rows: &QuantizedRows, i: usize, q: &[f32], metric: Metric) -> f64 {
    let dim = rows.dim;
    (0..dim)
        .map(|d| {
            let x = rows.lo[d] as f64 + rows.step[d] as f64 * rows.codes[i * dim + d] as f64;
            match metric {
                Metric::L2 => (x - q[d] as f64).powi(2),
                _ => x * q[d] as f64,
            }
        })
        .sum()
}

#[test]
fn code_sums_match_the_reconstruction() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for dim in [16, 17, 40, 128, 131] {
        let vectors: Vec<f32> = (0..50 * dim).map(|_| rng.random_range(-3.0..3.0)).collect();
        let rows = QuantizedRows::quantize(&vectors, dim).unwrap();
        let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-3.0..3.0)).collect();
        for metric in [Metric::L2, Metric::Dot] {
            let bounds = rows.prepare(&q, metric).unwrap();
            let ids: Vec<u32> = (0..50).collect();
            let mut out = vec![0f32; 50];
            bounds.code_sums(&ids, &mut out);
            for (i, got) in out.iter().enumerate() {
                let want = reference(&rows, i, &q, metric)
                    - if metric == Metric::L2 {
                        0.0
                    } else {
                        bounds.base as f64
                    };
                assert!(
                    (*got as f64 - want).abs() < 1e-3,
                    "{dim} {metric:?} {got} {want}"
                );
            }
        }
        // Each row's stored error bounds its distance to its reconstruction.
        for (i, row) in vectors.chunks_exact(dim).enumerate() {
            let miss: f64 = (0..dim)
                .map(|d| {
                    let x =
                        rows.lo[d] as f64 + rows.step[d] as f64 * rows.codes[i * dim + d] as f64;
                    (row[d] as f64 - x).powi(2)
                })
                .sum::<f64>()
                .sqrt();
            assert!(miss <= rows.err[i] as f64);
            // Nearest codes up to f32 rounding: half a step per value, a hair more.
            assert!(
                rows.err[i] as f64
                    <= 0.5001
                        * (0..dim)
                            .map(|d| (rows.step[d] as f64).powi(2))
                            .sum::<f64>()
                            .sqrt()
                        + 1e-6
            );
        }
    }
}

use crate::index::distance::metric_key;
use crate::index::search::{RowMask, SearchStats, TopK, score_flat};
use crate::index::segment::Partition;
use crate::ledger::ids::row_address;
use proptest::prelude::*;
use roaring::{RoaringBitmap, RoaringTreemap};

/// The top-k (keys as bits, addresses) and counts of scoring `part` with and without its
/// quantized rows.
fn both_ways(
    part: &Partition,
    dim: usize,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    k: usize,
) -> [(Vec<(u32, u64)>, SearchStats); 2] {
    let run = |part: &Partition| {
        let mut top = TopK::new(k);
        let mut stats = SearchStats::default();
        score_flat(part, dim, q, metric, mask, &mut top, &mut stats);
        let got = top
            .into_sorted()
            .iter()
            .map(|c| (c.key.to_bits(), c.addr))
            .collect();
        (got, stats)
    };
    let plain = Partition {
        addrs: part.addrs.clone(),
        vectors: part.vectors.clone(),
        ..Default::default()
    };
    [run(part), run(&plain)]
}

/// Rows of a few shapes: spread values at several scales, a few distinct values (many
/// equal keys), duplicated rows and zero rows (undefined cosine).
pub(crate) fn rows_strategy() -> impl Strategy<Value = (usize, Vec<f32>)> {
    rows_of(16usize..40, 200)
}

/// [`rows_strategy`]'s rows with `dims` dimensions and fewer than `max_rows` rows.
pub(crate) fn rows_of(
    dims: impl Strategy<Value = usize>,
    max_rows: usize,
) -> impl Strategy<Value = (usize, Vec<f32>)> {
    (dims, 1usize..max_rows, 0u8..4, -3i32..4, any::<u64>()).prop_map(
        |(dim, rows, shape, scale, seed)| {
            use rand::{Rng, SeedableRng};
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let scale = 10f32.powi(scale);
            let mut v: Vec<f32> = (0..rows * dim)
                .map(|_| match shape {
                    0 => rng.random_range(-1.0..1.0) * scale,
                    1 => rng.random_range(0..3) as f32 * scale,
                    _ => (rng.random_range(-1.0f32..1.0) + (rng.random_range(0..4) as f32)) * scale,
                })
                .collect();
            for r in 0..rows {
                match rng.random_range(0..10) {
                    0 => v[r * dim..(r + 1) * dim].fill(0.0),
                    1 if r > 0 => v.copy_within((r - 1) * dim..r * dim, r * dim),
                    _ => {}
                }
            }
            (dim, v)
        },
    )
}

/// A query of kind `kind` for rows `vectors`: row `at`, row `at` moved a little, zero,
/// or unrelated (from `noise`, at least `dim` values in −1..1).
pub(crate) fn query_of(
    vectors: &[f32],
    dim: usize,
    kind: u8,
    at: usize,
    noise: &[f32],
) -> Vec<f32> {
    let row = &vectors[at * dim..(at + 1) * dim];
    match kind {
        0 => row.to_vec(),
        1 => row.iter().zip(noise).map(|(x, n)| x + n * 0.01).collect(),
        2 => vec![0.0; dim],
        _ => noise[..dim].iter().map(|n| n * 3.0).collect(),
    }
}

/// Deletions in fragment 1 and a filter over `addrs`, picked by `seed` (`rows` rows).
pub(crate) fn masks(
    addrs: &[u64],
    rows: usize,
    seed: u64,
) -> (crate::index::row_mask::Deletions, RoaringTreemap) {
    let deleted: RoaringBitmap = (0..rows as u32)
        .filter(|r| (*r as u64 ^ seed).is_multiple_of(5))
        .collect();
    let allowed = addrs
        .iter()
        .copied()
        .filter(|a| !(a ^ seed).is_multiple_of(3))
        .collect();
    (
        crate::index::row_mask::Deletions::from([(1, std::sync::Arc::new(deleted))]),
        allowed,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// If this fails, a row the bound skipped belonged in the top-k: the quantized path
    /// answered differently from scoring every row.
    #[test]
    fn prop_bounded_scoring_is_scoring_every_row(
        (dim, vectors) in rows_strategy(),
        query_kind in 0u8..4,
        query_row in any::<prop::sample::Index>(),
        noise in prop::collection::vec(-1f32..1.0, 40),
        k in 1usize..25,
        masked in any::<bool>(),
        mask_seed in any::<u64>(),
    ) {
        let rows = vectors.len() / dim;
        let part = Partition {
            addrs: (0..rows as u64).map(|r| row_address(r % 3, r)).collect(),
            vectors: vectors.clone(),
            ..Default::default()
        };
        let Some(quantized) = QuantizedRows::quantize(&vectors, dim) else {
            return Ok(());
        };
        part.quantized.set(Some(quantized)).unwrap();
        let q = query_of(&vectors, dim, query_kind, query_row.index(rows), &noise);
        let (deletions, allowed) = masks(&part.addrs, rows, mask_seed);
        let mask = RowMask { owned: vec![0, 1], deletions: Some(&deletions), allowed: Some(&allowed) };
        let mask = masked.then_some(&mask);
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let [(got, mut stats), (want, want_stats)] =
                both_ways(&part, dim, &q, metric, mask, k);
            prop_assert_eq!(&got, &want, "{:?}", metric);
            stats.skipped_by_bound = 0;
            prop_assert_eq!(stats, want_stats);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// If this fails, a partition ruled out whole held a row that could enter.
    #[test]
    fn prop_a_partition_ruled_out_whole_has_no_row_at_or_below_the_bound(
        (dim, vectors) in rows_strategy(),
        query_kind in 0u8..4,
        query_row in any::<prop::sample::Index>(),
        noise in prop::collection::vec(-1f32..1.0, 40),
        shift in prop_oneof![Just(0f32), -50f32..50.0],
        fraction in 0f32..1.0,
    ) {
        let Some(rows) = QuantizedRows::quantize(&vectors, dim) else {
            return Ok(());
        };
        let at = query_row.index(vectors.len() / dim);
        let mut q = query_of(&vectors, dim, query_kind, at, &noise);
        q[0] += shift;
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let keys: Vec<f32> = vectors
                .chunks_exact(dim)
                .map(|v| metric_key(metric, &q, v).unwrap_or(f32::INFINITY))
                .collect();
            let nearest = keys.iter().copied().fold(f32::INFINITY, f32::min);
            // Below, at and above the nearest key.
            for bound in [nearest - fraction * nearest.abs(), nearest, nearest.next_up()] {
                if rows.none_can_enter(&q, metric, bound) {
                    prop_assert!(keys.iter().all(|k| *k > bound), "{:?} {} {:?}", metric, bound, keys);
                }
            }
        }
    }
}

/// Two clusters far apart, the query in the first: scoring the second after the first
/// rules it out whole, and the answer is the one scoring every row gives.
#[test]
fn a_partition_far_from_the_query_is_ruled_out_whole() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let dim = 32;
    let cluster = |rng: &mut rand::rngs::StdRng, at: f32, base: u64| {
        let vectors: Vec<f32> = (0..500 * dim)
            .map(|_| at + rng.random_range(-1.0..1.0))
            .collect();
        let part = Partition {
            addrs: (base..base + 500).collect(),
            vectors: vectors.clone(),
            ..Default::default()
        };
        part.quantized
            .set(QuantizedRows::quantize(&vectors, dim))
            .unwrap();
        part
    };
    let (near, far) = (cluster(&mut rng, 1.0, 0), cluster(&mut rng, -40.0, 1000));
    let q = vec![1.0f32; dim];
    for metric in [Metric::L2, Metric::Dot] {
        let mut got = (TopK::new(10), SearchStats::default());
        let mut want = (TopK::new(10), SearchStats::default());
        for part in [&near, &far] {
            score_flat(part, dim, &q, metric, None, &mut got.0, &mut got.1);
            let plain = Partition {
                addrs: part.addrs.clone(),
                vectors: part.vectors.clone(),
                ..Default::default()
            };
            score_flat(&plain, dim, &q, metric, None, &mut want.0, &mut want.1);
        }
        assert_eq!(got.0.into_sorted(), want.0.into_sorted(), "{metric:?}");
        assert!(got.1.skipped_by_bound >= 500, "{metric:?}: {:?}", got.1);
        assert!(got.1.rows_scored <= 500, "{metric:?}: {:?}", got.1);
    }
}

/// Clustered rows and a query near one of them: most rows are ruled out from their codes
/// (so the test above compares two different computations, not one twice).
#[test]
fn most_rows_of_a_clustered_partition_are_skipped() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let dim = 128;
    let vectors: Vec<f32> = (0..2000 * dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let part = Partition {
        addrs: (0..2000).collect(),
        vectors: vectors.clone(),
        ..Default::default()
    };
    part.quantized
        .set(QuantizedRows::quantize(&vectors, dim))
        .unwrap();
    let q: Vec<f32> = vectors[..dim].iter().map(|x| x + 0.01).collect();
    for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
        let [(got, stats), (want, _)] = both_ways(&part, dim, &q, metric, None, 10);
        assert_eq!(got, want);
        assert!(stats.skipped_by_bound > 1500, "{metric:?}: {stats:?}");
    }
}

#[test]
fn what_cannot_be_bounded_is_not_quantized() {
    assert!(QuantizedRows::quantize(&[1.0; 8 * 4], 8).is_none());
    assert!(QuantizedRows::quantize(&[], 16).is_none());
    let mut v = vec![1.0f32; 32];
    v[3] = f32::NAN;
    assert!(QuantizedRows::quantize(&v, 16).is_none());
    v[3] = 1e30;
    assert!(QuantizedRows::quantize(&v, 16).is_none());
    let rows = QuantizedRows::quantize(&[0.5; 32], 16).unwrap();
    assert!(rows.prepare(&[f32::INFINITY; 16], Metric::L2).is_none());
    assert!(rows.prepare(&[0.0; 15], Metric::L2).is_none());
    assert_eq!(rows.err.len(), 2);
}

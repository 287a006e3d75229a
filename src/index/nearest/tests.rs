use super::*;
use crate::index::kmeans::nearest;
use proptest::prelude::*;

fn matrix(max_rows: usize, dim: usize) -> impl Strategy<Value = Vec<f32>> {
    (0..=max_rows).prop_flat_map(move |n| prop::collection::vec(-4.0f32..4.0, n * dim))
}

/// The naive reference: one row against one row-major centroid at a time, each dot product
/// one chain of fused multiply-adds in dimension order, lowest score and lowest index on ties.
fn reference(x: &[f32], centroids: &[f32], dim: usize) -> (u32, f32) {
    let mut best = (0u32, f32::INFINITY);
    for (c, centroid) in centroids.chunks_exact(dim).enumerate() {
        let dot = x
            .iter()
            .zip(centroid)
            .fold(0f32, |s, (a, b)| a.mul_add(*b, s));
        offer(&mut best, c, norm_squared(centroid) - 2.0 * dot);
    }
    (best.0, (norm_squared(x) + best.1).max(0.0))
}

/// Every path this CPU has gives every row the reference's centroid and distance, bit for bit.
fn assert_every_path_matches_the_reference(rows: &[f32], centroids: &[f32], dim: usize) {
    let table = CentroidTable::new(centroids, dim);
    let want: Vec<(u32, u32)> = rows
        .chunks_exact(dim)
        .map(|x| {
            let (c, d) = reference(x, centroids, dim);
            (c, d.to_bits())
        })
        .collect();
    for path in Path::available() {
        let mut out = vec![(7u32, 7f32); rows.len() / dim];
        table.assign_on(path, rows, &mut out);
        let got: Vec<(u32, u32)> = out.iter().map(|(c, d)| (*c, d.to_bits())).collect();
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "{path:?}, dim {dim}, row {i}");
        }
    }
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
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the rows it comes with (so whatever the blocks, tiles, padding and path), a
    /// row gets the centroid and distance the reference gives it alone. Up to 90 centroids:
    /// whole wide tiles, single-panel tails and a padded last panel.
    #[test]
    fn every_path_gives_each_row_the_reference_bits(
        (dim, rows, centroids) in (1usize..70).prop_flat_map(|d| (
            Just(d),
            prop::collection::vec(-2.0f32..2.0, 0..=20 * d).prop_map(move |v| v[..v.len() / d * d].to_vec()),
            prop::collection::vec(-2.0f32..2.0, d..=90 * d).prop_map(move |v| v[..v.len() / d * d].to_vec()),
        ))
    ) {
        assert_every_path_matches_the_reference(&rows, &centroids, dim);
    }
}

/// Several blocks of rows and of panels (768-d: 12 to 18 rows a block and 4 panels a block),
/// odd counts at every edge, and duplicated centroids (exact ties), on every path.
#[test]
fn blocks_of_rows_and_centroids_match_one_row_at_a_time() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for (dim, n, k) in [(768, 131, 301), (128, 700, 1001), (13, 257, 97)] {
        let mut rows: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut centroids: Vec<f32> = (0..k * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        // Centroid 2c + 1 repeats centroid 2c for the first ten pairs; rows 0..10 sit on them.
        for c in 0..10 {
            let (a, b) = centroids.split_at_mut((2 * c + 1) * dim);
            b[..dim].copy_from_slice(&a[2 * c * dim..]);
        }
        rows[..10 * dim].copy_from_slice(&centroids[..10 * dim]);
        assert_every_path_matches_the_reference(&rows, &centroids, dim);
    }
}

/// A row with a NaN or an infinity scores NaN against every centroid: it keeps centroid 0 on
/// every path, never a padding slot of the last panel; an infinite centroid never wins.
#[test]
fn rows_without_a_finite_score_keep_centroid_zero() {
    let dim = 3;
    let mut centroids: Vec<f32> = (0..17 * dim).map(|i| i as f32).collect();
    centroids[..dim].fill(f32::INFINITY);
    let rows = [
        f32::NAN,
        1.0,
        2.0, //
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0, //
        0.0,
        0.0,
        0.0, //
    ];
    assert_every_path_matches_the_reference(&rows, &centroids, dim);
    let mut out = [(9u32, 9f32); 3];
    CentroidTable::new(&centroids, dim).assign(&rows, &mut out);
    assert_eq!((out[0].0, out[1].0, out[2].0), (0, 0, 1));
}

#[test]
fn exact_ties_go_to_the_lowest_index_and_no_centroids_give_zero() {
    let centroids = [1.0f32, 0.0, 1.0, 0.0, -1.0, 0.0];
    let table = CentroidTable::new(&centroids, 2);
    for path in Path::available() {
        let mut out = [(9u32, 9f32); 5];
        table.assign_on(
            path,
            &[0.5, 0.0, 0.5, 0.0, 0.5, 0.0, 0.5, 0.0, -3.0, 0.0],
            &mut out,
        );
        assert_eq!(out[..4], [(0, 0.25); 4], "{path:?}");
        assert_eq!(out[4], (2, 4.0), "{path:?}");
    }
    let empty = CentroidTable::new(&[], 2);
    let mut out = [(9u32, 9f32); 1];
    empty.assign(&[1.0, 2.0], &mut out);
    assert_eq!(out, [(0, 0.0)]);
}

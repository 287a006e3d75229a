//! k-means (Lloyd's algorithm) with a fixed seed, for IVF partitioning and PQ codebooks.
//!
//! Pure computation over a flat `f32` matrix (`n × dim`, row-major). Initialisation picks `k`
//! distinct sample rows at random; an empty cluster is re-seeded with the point farthest from
//! its centroid. The assignment step runs on all available cores with scoped threads; the
//! iterations stop early once at most one row in a thousand changes cluster.

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

use super::distance::l2_squared;
use super::nearest::CentroidTable;

/// Lloyd's iterations stop once at most `n / CONVERGED_PER_MILLE` rows change cluster.
const CONVERGED_PER_MILLE: usize = 1000;

/// Index of the centroid nearest (squared L2) to `v`, and that distance.
#[inline]
pub fn nearest(centroids: &[f32], dim: usize, v: &[f32]) -> (usize, f32) {
    let mut best = (0, f32::INFINITY);
    for (i, c) in centroids.chunks_exact(dim).enumerate() {
        let d = l2_squared(v, c);
        if d < best.1 {
            best = (i, d);
        }
    }
    best
}

/// Nearest centroid of every row of `data` and the squared distance to it, computed in
/// parallel with [`CentroidTable`] (ties within rounding may resolve differently from
/// [`nearest`]).
pub fn assign(data: &[f32], dim: usize, centroids: &[f32]) -> Vec<(u32, f32)> {
    if dim == 0 {
        return Vec::new();
    }
    let table = CentroidTable::new(centroids, dim);
    let n = data.len() / dim;
    let threads = super::parallel::build_threads().min(n.max(1));
    let chunk_rows = n.div_ceil(threads.max(1)).max(1);
    let mut out = vec![(0u32, 0f32); n];
    std::thread::scope(|scope| {
        for (rows, out) in data
            .chunks(chunk_rows * dim)
            .zip(out.chunks_mut(chunk_rows))
        {
            let table = &table;
            scope.spawn(move || table.assign(rows, out));
        }
    });
    out
}

/// Trains `k` centroids on `data` (`n × dim`). With fewer than `k` rows, returns the rows
/// themselves (and as many centroids as rows). Deterministic for a given seed.
pub fn train(data: &[f32], dim: usize, k: usize, max_iters: usize, seed: u64) -> Vec<f32> {
    train_observed(data, dim, k, max_iters, seed, &|| {})
}

/// [`train`], calling `on_iteration` after each of its (at most `max_iters`) iterations, so a
/// caller can report progress; convergence may end the run before `max_iters`.
pub fn train_observed(
    data: &[f32],
    dim: usize,
    k: usize,
    max_iters: usize,
    seed: u64,
    on_iteration: &dyn Fn(),
) -> Vec<f32> {
    assert!(
        dim > 0 && data.len().is_multiple_of(dim),
        "data must be n × dim"
    );
    let n = data.len() / dim;
    if n <= k {
        return data.to_vec();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut centroids: Vec<f32> = Vec::with_capacity(k * dim);
    for i in sample(&mut rng, n, k).into_iter() {
        centroids.extend_from_slice(&data[i * dim..(i + 1) * dim]);
    }
    let mut previous: Vec<u32> = Vec::new();
    for _ in 0..max_iters {
        let assignment = assign(data, dim, &centroids);
        let labels: Vec<u32> = assignment.iter().map(|(i, _)| *i).collect();
        on_iteration();
        // Converged when at most one row in a thousand changed its cluster: later iterations
        // would move centroids by a rounding error at a full assignment pass each (the
        // sample's assignment is what a build spends its time on).
        if previous.len() == labels.len() {
            let changed = labels.iter().zip(&previous).filter(|(a, b)| a != b).count();
            if changed.saturating_mul(CONVERGED_PER_MILLE) <= n {
                break;
            }
        }
        let mut sums = vec![0f64; k * dim];
        let mut counts = vec![0usize; k];
        for (row, &label) in data.chunks_exact(dim).zip(&labels) {
            let l = label as usize;
            counts[l] += 1;
            for (s, x) in sums[l * dim..(l + 1) * dim].iter_mut().zip(row) {
                *s += *x as f64;
            }
        }
        for c in 0..k {
            if counts[c] > 0 {
                for (dst, s) in centroids[c * dim..(c + 1) * dim]
                    .iter_mut()
                    .zip(&sums[c * dim..(c + 1) * dim])
                {
                    *dst = (*s / counts[c] as f64) as f32;
                }
            } else {
                // Re-seed an empty cluster with a poorly served point (random among the worst).
                let worst = (0..8)
                    .map(|_| rng.random_range(0..n))
                    .max_by(|a, b| assignment[*a].1.total_cmp(&assignment[*b].1))
                    .unwrap_or(0);
                centroids[c * dim..(c + 1) * dim]
                    .copy_from_slice(&data[worst * dim..(worst + 1) * dim]);
            }
        }
        previous = labels;
    }
    centroids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_well_separated_blobs_deterministically() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let centers = [[0.0f32, 0.0], [100.0, 0.0], [0.0, 100.0]];
        let mut data = Vec::new();
        for i in 0..300 {
            let c = centers[i % 3];
            data.push(c[0] + rng.random_range(-1.0..1.0));
            data.push(c[1] + rng.random_range(-1.0..1.0));
        }
        let a = train(&data, 2, 3, 20, 42);
        assert_eq!(a, train(&data, 2, 3, 20, 42), "same seed, same centroids");
        for c in centers {
            let (_, d) = nearest(&a, 2, &c);
            assert!(d < 1.0, "a centroid near {c:?}: {a:?}");
        }
    }

    #[test]
    fn reports_each_iteration_up_to_the_limit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let data: Vec<f32> = (0..500 * 2).map(|_| rng.random::<f32>()).collect();
        let iterations = std::cell::Cell::new(0);
        let observed = train_observed(&data, 2, 8, 3, 9, &|| iterations.set(iterations.get() + 1));
        assert_eq!(
            iterations.get(),
            3,
            "uniform data does not converge in 3 iterations"
        );
        assert_eq!(observed, train(&data, 2, 8, 3, 9));
    }

    #[test]
    fn fewer_rows_than_clusters_returns_the_rows() {
        let data = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(train(&data, 2, 8, 10, 1), data.to_vec());
    }

    #[test]
    fn parallel_assignment_matches_sequential() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let data: Vec<f32> = (0..1000 * 4).map(|_| rng.random::<f32>()).collect();
        let centroids: Vec<f32> = (0..10 * 4).map(|_| rng.random::<f32>()).collect();
        let got = assign(&data, 4, &centroids);
        let mut one_thread = vec![(0, 0.0); 1000];
        CentroidTable::new(&centroids, 4).assign(&data, &mut one_thread);
        assert_eq!(got, one_thread);
    }
}

//! Distance kernel throughput (GB/s of vector data per core), 128-d and 768-d.
//!
//! `cargo bench --bench distance`

use std::hint::black_box;
use std::time::Instant;

use fragvec::index::distance::{cosine_distance, dot, l2_squared};
use rand::{Rng, SeedableRng};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for dim in [128usize, 768] {
        // ~64 MB of vectors: larger than the caches, as in a real scan.
        let n = (64 << 20) / (dim * 4);
        let data: Vec<f32> = (0..n * dim).map(|_| rng.random::<f32>()).collect();
        let q: Vec<f32> = (0..dim).map(|_| rng.random::<f32>()).collect();
        let bytes = (n * dim * 4) as f64;
        type Kernel = fn(&[f32], &[f32]) -> f32;
        let kernels: [(&str, Kernel); 3] = [
            ("l2_squared", l2_squared),
            ("dot", dot),
            ("cosine", |a, b| cosine_distance(a, b).unwrap_or(0.0)),
        ];
        for (name, kernel) in kernels {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                let mut acc = 0f32;
                for v in data.chunks_exact(dim) {
                    acc += kernel(black_box(&q), black_box(v));
                }
                black_box(acc);
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!(
                "{name:<10} dim {dim:>3}: {:>6.2} GB/s ({:>6.1} M vectors/s)",
                bytes / best / 1e9,
                n as f64 / best / 1e6
            );
        }
    }
}

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::index::distance::Metric;
use crate::index::quantized::tests::{masks, rows_of};
use crate::index::search::{RowMask, SearchStats, TopK, score_flat};
use crate::index::segment::Partition;
use crate::index::sketch::{Refine, RowRef, Sketch};
use crate::ledger::ids::row_address;

/// Rows of 1 to 1024 dimensions at several scales, with zero rows and duplicates.
fn rows() -> impl Strategy<Value = (usize, Vec<f32>)> {
    rows_of(prop_oneof![3 => 1usize..40, 1 => 40usize..1025], 80)
}

/// `vectors` cut into `pieces` float partitions, rows addressed across three fragments.
fn partitions(vectors: &[f32], dim: usize, pieces: usize) -> Vec<Partition> {
    let rows = vectors.len() / dim;
    let per = rows.div_ceil(pieces).max(1);
    (0..pieces)
        .map(|p| {
            let range = (p * per).min(rows)..((p + 1) * per).min(rows);
            Partition {
                addrs: range
                    .clone()
                    .map(|r| row_address(r as u64 % 3, r as u64))
                    .collect(),
                vectors: vectors[range.start * dim..range.end * dim].to_vec(),
                ..Default::default()
            }
        })
        .collect()
}

/// The grid trained on every `stride`-th row only (so other rows may fall outside it),
/// each row's partition as `partitions` cut them.
fn grid(parts: &[Partition], dim: usize, stride: usize) -> ScalarGrid {
    let (mut sample, mut assigned) = (Vec::new(), Vec::new());
    for (p, part) in parts.iter().enumerate() {
        for row in part.vectors.chunks_exact(dim).step_by(stride) {
            sample.extend_from_slice(row);
            assigned.push(p as u32);
        }
    }
    ScalarGrid::train(&sample, dim, &assigned, parts.len())
}

/// Each partition stored as IVF_SQ payload and read back as its sketch.
fn stored(parts: &[Partition], grid: &ScalarGrid, dim: usize) -> Vec<Arc<Sketch>> {
    parts
        .iter()
        .enumerate()
        .map(|(p, part)| {
            let coder = grid.coder(p);
            let mut payload = Vec::new();
            for row in part.vectors.chunks_exact(dim) {
                encode_row(&coder, row, &mut payload);
            }
            assert_eq!(payload.len(), part.len() * row_width(dim));
            Arc::new(Sketch::of_sq(&coder, part.addrs.clone(), &payload).expect("well formed"))
        })
        .collect()
}

fn keys(top: TopK) -> Vec<(u32, u64)> {
    top.into_sorted()
        .iter()
        .map(|c| (c.key.to_bits(), c.addr))
        .collect()
}

/// Scoring every float of `parts`.
fn plain(
    parts: &[Partition],
    dim: usize,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    k: usize,
) -> TopK {
    let mut top = TopK::new(k);
    let mut stats = SearchStats::default();
    for part in parts {
        score_flat(part, dim, q, metric, mask, &mut top, &mut stats);
    }
    top
}

/// What a search does with IVF_SQ sketches, reads served from the floats (checked against
/// the stored checksums, as the search checks what it reads from the data files).
fn refined(
    parts: &[Partition],
    sketches: &[Arc<Sketch>],
    dim: usize,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    k: usize,
) -> (TopK, usize) {
    let read = |rows: &[RowRef]| -> Vec<f32> {
        rows.iter()
            .flat_map(|r| {
                let v = &parts[r.sketch as usize].vectors
                    [r.row as usize * dim..(r.row as usize + 1) * dim];
                assert_eq!(
                    row_sum(v),
                    sketches[r.sketch as usize].row_sums[r.row as usize]
                );
                v.to_vec()
            })
            .collect()
    };
    let score = |part: &Partition, top: &mut TopK, stats: &mut SearchStats| {
        score_flat(part, dim, q, metric, mask, top, stats)
    };
    let mut refine = Refine::new(sketches, dim, q, metric, mask, k, f32::NAN);
    let first = refine.first();
    let second = refine.second(&first, &read(&first), score);
    let (scored, mut stats) = refine.finish(&second, &read(&second));
    let mut top = TopK::new(k);
    for part in &scored {
        score(part, &mut top, &mut stats);
    }
    (top, first.len() + second.len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// IVF_SQ is exact by construction: the rows its codes rule out never belonged in the
    /// top-k, whatever the grid (trained on a sample, rows outside it), the metric, the
    /// dimension or the mask.
    #[test]
    fn prop_sq_sketches_answer_what_scoring_every_row_answers(
        (dim, vectors) in rows(),
        pieces in 1usize..4,
        stride in 1usize..6,
        query_kind in 0u8..4,
        query_row in any::<prop::sample::Index>(),
        noise_seed in any::<u64>(),
        k in 1usize..20,
        masked in any::<bool>(),
        mask_seed in any::<u64>(),
    ) {
        use rand::{Rng, SeedableRng};
        let rows = vectors.len() / dim;
        let parts = partitions(&vectors, dim, pieces);
        let sketches = stored(&parts, &grid(&parts, dim, stride), dim);
        let mut rng = rand::rngs::StdRng::seed_from_u64(noise_seed);
        let at = query_row.index(rows);
        let row = &vectors[at * dim..(at + 1) * dim];
        let q: Vec<f32> = match query_kind {
            0 => row.to_vec(),
            1 => row.iter().map(|x| x + rng.random_range(-0.01f32..0.01)).collect(),
            2 => vec![0.0; dim],
            _ => (0..dim).map(|_| rng.random_range(-3.0f32..3.0)).collect(),
        };
        let addrs: Vec<u64> = parts.iter().flat_map(|p| p.addrs.iter().copied()).collect();
        let (deletions, allowed) = masks(&addrs, rows, mask_seed);
        let mask = RowMask { owned: vec![0, 1], deletions: Some(&deletions), allowed: Some(&allowed) };
        let mask = masked.then_some(&mask);
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let (got, _) = refined(&parts, &sketches, dim, &q, metric, mask, k);
            prop_assert_eq!(keys(got), keys(plain(&parts, dim, &q, metric, mask, k)), "{:?}", metric);
        }
    }
}

/// Clustered rows and a query near one: the codes rule out most rows, also for rows the
/// grid's sample did not see.
#[test]
fn few_rows_are_read_from_the_table() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let dim = 96;
    let vectors: Vec<f32> = (0..4000 * dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let parts = partitions(&vectors, dim, 4);
    let sketches = stored(&parts, &grid(&parts, dim, 16), dim);
    let q: Vec<f32> = vectors[..dim].iter().map(|x| x + 0.01).collect();
    for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
        let (got, read) = refined(&parts, &sketches, dim, &q, metric, None, 10);
        assert_eq!(
            keys(got),
            keys(plain(&parts, dim, &q, metric, None, 10)),
            "{metric:?}"
        );
        assert!(read < 600, "{metric:?}: {read} of 4000 rows read");
    }
}

/// A row that cannot be bounded (NaN, infinite or huge values) is never ruled out.
#[test]
fn unbounded_rows_are_always_read() {
    let grid = ScalarGrid::train(&[0.0, 1.0, 1.0, 0.0], 2, &[0, 0], 1);
    let coder = grid.coder(0);
    for row in [[f32::NAN, 0.0], [f32::INFINITY, 1.0], [1e30, 0.0]] {
        let mut payload = Vec::new();
        encode_row(&coder, &row, &mut payload);
        let s = Sketch::of_sq(&coder, vec![row_address(0, 0)], &payload).unwrap();
        let mut b = s.rows.prepare(&[0.5, 0.5], Metric::L2).unwrap();
        let mut sums = [0f32];
        b.code_sums(&[0], &mut sums);
        assert!(!b.cannot_enter(0, sums[0], 0.0), "{row:?}");
    }
}

#[test]
fn a_payload_of_the_wrong_size_is_refused() {
    let grid = ScalarGrid::train(&[0.0, 1.0, 1.0, 0.0], 2, &[0, 0], 1);
    let coder = grid.coder(0);
    let mut payload = Vec::new();
    encode_row(&coder, &[0.5, 0.5], &mut payload);
    payload.pop();
    let err = Sketch::of_sq(&coder, vec![0], &payload).unwrap_err();
    assert!(err.contains("payload bytes"), "{err}");
}

#[test]
fn a_sparse_partition_takes_the_whole_samples_range() {
    // Partition 1 has one sample row: its grid is the whole sample's, widened.
    let sample = [0.0, 0.0, 10.0, 10.0, 5.0, 5.0];
    let grid = ScalarGrid::train(&sample, 2, &[0, 0, 1], 2);
    assert!(grid.lo[2] < 0.0 && grid.hi[2] > 10.0, "{grid:?}");
    grid.check().unwrap();
}

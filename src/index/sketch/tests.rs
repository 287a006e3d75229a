use proptest::prelude::*;

use super::*;
use crate::format::integrity::crc32c;
use crate::index::quantized::tests::{masks, query_of, rows_strategy};
use crate::index::search::score_flat;
use crate::ledger::ids::row_address;

/// What the caller of [`Refine`] does, with reads served from the partitions' floats: the
/// top-k (keys as bits, addresses), the counters, and how many rows were read.
fn refined(
    parts: &[Partition],
    dim: usize,
    q: &[f32],
    metric: Metric,
    mask: Option<&RowMask>,
    k: usize,
    bound: f32,
) -> (Vec<(u32, u64)>, SearchStats, usize) {
    let sketches: Vec<Arc<Sketch>> = parts
        .iter()
        .map(|p| Arc::new(Sketch::of(p, dim).expect("quantizable")))
        .collect();
    let read = |rows: &[RowRef]| -> Vec<f32> {
        rows.iter()
            .flat_map(|r| {
                let v = &parts[r.sketch as usize].vectors;
                v[r.row as usize * dim..(r.row as usize + 1) * dim].to_vec()
            })
            .collect()
    };
    let score = |part: &Partition, top: &mut TopK, stats: &mut SearchStats| {
        score_flat(part, dim, q, metric, mask, top, stats)
    };
    let mut refine = Refine::new(&sketches, dim, q, metric, mask, k, bound);
    let first = refine.first();
    let second = refine.second(&first, &read(&first), score);
    let (scored, mut stats) = refine.finish(&second, &read(&second));
    let mut top = TopK::new(k);
    for part in &scored {
        score(part, &mut top, &mut stats);
    }
    (keys(top), stats, first.len() + second.len())
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
    top: &mut TopK,
) -> SearchStats {
    let mut stats = SearchStats::default();
    for part in parts {
        score_flat(part, dim, q, metric, mask, top, &mut stats);
    }
    stats
}

/// `vectors` cut into `pieces` partitions (some possibly empty), rows addressed across three
/// fragments.
fn partitions(vectors: &[f32], dim: usize, pieces: usize) -> Vec<Partition> {
    let rows = vectors.len() / dim;
    let per = rows.div_ceil(pieces.max(1)).max(1);
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
        .filter(|p| !p.is_empty())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// If this fails, a row the sketches never had read belonged in the top-k.
    #[test]
    fn prop_refining_sketches_is_scoring_every_row(
        (dim, vectors) in rows_strategy(),
        pieces in 1usize..5,
        query_kind in 0u8..4,
        query_row in any::<prop::sample::Index>(),
        noise in prop::collection::vec(-1f32..1.0, 40),
        k in 1usize..25,
        masked in any::<bool>(),
        mask_seed in any::<u64>(),
        earlier in any::<bool>(),
    ) {
        let rows = vectors.len() / dim;
        let parts = partitions(&vectors, dim, pieces);
        if parts.iter().any(|p| QuantizedRows::quantize(&p.vectors, dim).is_none()) {
            return Ok(());
        }
        let q = query_of(&vectors, dim, query_kind, query_row.index(rows), &noise);
        let addrs: Vec<u64> = parts.iter().flat_map(|p| p.addrs.iter().copied()).collect();
        let (deletions, allowed) = masks(&addrs, rows, mask_seed);
        let mask = RowMask { owned: vec![0, 1], deletions: Some(&deletions), allowed: Some(&allowed) };
        let mask = masked.then_some(&mask);
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            // With `earlier`, the first partition was scored before (an earlier probe
            // group): its k-th key is the bound the sketches start from.
            let (before, rest) = if earlier && parts.len() > 1 {
                parts.split_at(1)
            } else {
                parts.split_at(0)
            };
            let mut top = TopK::new(k);
            plain(before, dim, &q, metric, mask, &mut top);
            let bound = top.bound();
            let (got, stats, _) = refined(rest, dim, &q, metric, mask, k, bound);
            let mut merged = top;
            for (key, addr) in &got {
                merged.push(crate::index::search::Candidate { key: f32::from_bits(*key), addr: *addr });
            }
            let mut want = TopK::new(k);
            plain(&parts, dim, &q, metric, mask, &mut want);
            prop_assert_eq!(keys(merged), keys(want), "{:?}", metric);
            let mut alone = TopK::new(k);
            let want_stats = plain(rest, dim, &q, metric, mask, &mut alone);
            // Every row is scored, dropped by the mask or ruled out (a partition ruled out
            // whole is not seen by the mask).
            let drops = |s: &SearchStats| s.dropped_ownership + s.dropped_deleted + s.dropped_filter;
            prop_assert_eq!(
                stats.rows_scored + stats.skipped_by_bound + drops(&stats),
                want_stats.rows_scored + drops(&want_stats)
            );
            prop_assert!(stats.rows_scored <= want_stats.rows_scored);
            prop_assert_eq!(stats.partitions_probed, want_stats.partitions_probed);
        }
    }
}

/// Clustered rows, a query near one: few rows are read (so the property above compares two
/// different computations), and reading them answers what scoring every row answers.
#[test]
fn few_rows_of_clustered_sketches_are_read() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let dim = 64;
    let vectors: Vec<f32> = (0..4000 * dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let parts = partitions(&vectors, dim, 4);
    let q: Vec<f32> = vectors[..dim].iter().map(|x| x + 0.01).collect();
    for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
        let (got, stats, read) = refined(&parts, dim, &q, metric, None, 10, f32::NAN);
        let mut want = TopK::new(10);
        plain(&parts, dim, &q, metric, None, &mut want);
        assert_eq!(got, keys(want), "{metric:?}");
        assert!(read < 400, "{metric:?}: {read} rows read, {stats:?}");
        assert_eq!(stats.rows_scored, read);
        assert_eq!(stats.skipped_by_bound, 4000 - read);
    }
}

#[test]
fn row_sums_are_the_checksums_of_the_stored_bytes() {
    let v = [1.0f32, -2.5, 3.25, 0.0, 7.0, 8.0];
    let sums = row_sums(&v, 3);
    let bytes: Vec<u8> = v[3..].iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(sums.len(), 2);
    assert_eq!(sums[1], crc32c(&bytes));
}

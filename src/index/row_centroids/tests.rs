#![allow(clippy::single_range_in_vec_init)] // runs are ranges: a one-run list is a real input
use std::ops::Range;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::index::cache::ColumnVectors;
use crate::index::knn::exact_key;
use crate::index::search::{Candidate, TopK};
use crate::ledger::ids::row_address;

fn model(metric: Metric, dim: usize, centroids: Vec<f32>) -> Arc<IvfModel> {
    Arc::new(IvfModel {
        metric,
        dim,
        centroids,
        pq: None,
        sq: None,
    })
}

fn column(dim: usize, rows: &[Option<Vec<f32>>]) -> ColumnVectors {
    let mut out = ColumnVectors {
        dim,
        ..Default::default()
    };
    for row in rows {
        match row {
            Some(v) => out.values.extend_from_slice(v),
            None => {
                out.values.extend(std::iter::repeat_n(0.0, dim));
                out.nulls += 1;
            }
        }
        out.valid.push(row.is_some());
    }
    out
}

/// What a query's probe order holds: squared distances of the prepared query to each centroid.
fn query_bound(model: &IvfModel, q: &[f32]) -> Option<QueryBound> {
    let prepared = model.prepare(q)?;
    let keys: Vec<f32> = model
        .centroids
        .chunks_exact(model.dim)
        .map(|c| l2_squared(&prepared, c))
        .collect();
    QueryBound::new(model.metric, &keys, model.dim)
}

fn row_of(col: &ColumnVectors, i: usize) -> Option<&[f32]> {
    col.row(i)
}

/// Vectors around a few far-apart centres (so bounds rule most rows out), some NULL, some zero.
fn clustered(dim: usize, rows: usize, centres: usize, seed: u64) -> Vec<Option<Vec<f32>>> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let centre: Vec<Vec<f32>> = (0..centres)
        .map(|_| (0..dim).map(|_| next() * 40.0).collect())
        .collect();
    (0..rows)
        .map(|i| {
            if i % 97 == 13 {
                return None;
            }
            if i % 89 == 5 {
                return Some(vec![0.0; dim]);
            }
            let c = &centre[i % centres];
            Some(c.iter().map(|x| x + next()).collect())
        })
        .collect()
}

proptest! {
    /// If this fails, a row the bound rules out could have entered the answer: its key is
    /// not above the bound it was skipped against.
    #[test]
    fn prop_a_ruled_out_row_scores_above_the_bound(
        dim in 1usize..24,
        rows in prop::collection::vec(prop::option::of(prop::collection::vec(-4f32..4.0, 24)), 1..60),
        centroids in prop::collection::vec(prop::collection::vec(-4f32..4.0, 24), 1..8),
        q in prop::collection::vec(-4f32..4.0, 24),
        zero_rows in prop::collection::vec(any::<bool>(), 60),
        cosine in any::<bool>(),
        bounds in prop::collection::vec(0f32..1.0, 1..6),
    ) {
        let metric = if cosine { Metric::Cosine } else { Metric::L2 };
        let rows: Vec<Option<Vec<f32>>> = rows
            .into_iter()
            .zip(&zero_rows)
            .map(|(r, zero)| r.map(|v| if *zero { vec![0.0; dim] } else { v[..dim].to_vec() }))
            .collect();
        let m = model(metric, dim, centroids.iter().flat_map(|c| c[..dim].to_vec()).collect());
        let col = column(dim, &rows);
        let assigned = RowCentroids::compute(col.dim, &col.values, &col.valid, &m).expect("L2 and cosine have bounds");
        prop_assert_eq!(assigned.len(), rows.len());
        let q = &q[..dim];
        let Some(query) = query_bound(&m, q) else { return Ok(()) };
        let keys: Vec<f32> = (0..rows.len()).map(|i| exact_key(metric, q, row_of(&col, i))).collect();
        // Bounds at, just below and between the rows' own keys: the tightest there are.
        let mut tried: Vec<f32> = keys.iter().copied().filter(|k| k.is_finite()).collect();
        let spread = tried.iter().copied().fold(0f32, f32::max);
        tried.extend(bounds.iter().map(|b| b * spread));
        tried.extend(keys.iter().filter(|k| k.is_finite()).map(|k| k * (1.0 - 1e-7)));
        for bound in tried {
            let all = [0..rows.len() as u32];
            let (kept, skipped) = prune_runs(&all, &assigned, &query, bound);
            let kept: Vec<u32> = kept.iter().flat_map(|r| r.clone()).collect();
            prop_assert_eq!(kept.len() + skipped, rows.len());
            for i in 0..rows.len() as u32 {
                if !kept.contains(&i) {
                    prop_assert!(
                        keys[i as usize] > bound,
                        "row {} (key {}) ruled out against bound {}", i, keys[i as usize], bound
                    );
                }
            }
        }
    }

    /// If this fails, brute force with bounds answers differently from brute force without:
    /// the top-k of all rows equals the index's candidates merged with the pruned rest.
    #[test]
    fn prop_pruned_scoring_gives_the_full_answer(
        dim in 1usize..40,
        seed in any::<u64>(),
        centres in 1usize..6,
        partitions in 1usize..12,
        k in 1usize..12,
        split in 0usize..100,
        cosine in any::<bool>(),
    ) {
        let metric = if cosine { Metric::Cosine } else { Metric::L2 };
        let rows = clustered(dim, 150, centres, seed);
        let col = column(dim, &rows);
        // Centroids: some of the rows themselves, as k-means would put them near the data.
        let centroids: Vec<f32> = (0..partitions)
            .flat_map(|p| rows[(p * 37 + 1) % rows.len()].clone().unwrap_or(vec![1.0; dim]))
            .collect();
        let m = model(metric, dim, centroids);
        let assigned = RowCentroids::compute(col.dim, &col.values, &col.valid, &m).expect("bounded metric");
        let q: Vec<f32> = rows[(seed as usize) % rows.len()]
            .clone()
            .unwrap_or(vec![0.5; dim])
            .iter()
            .map(|x| x + 0.25)
            .collect();
        let Some(query) = query_bound(&m, &q) else { return Ok(()) };
        let cand = |i: usize| Candidate { key: exact_key(metric, &q, row_of(&col, i)), addr: row_address(7, i as u64) };
        let mut reference = TopK::new(k);
        (0..rows.len()).for_each(|i| reference.push(cand(i)));
        // The first rows play the index's candidates, the others the unindexed rows.
        let cut = split * rows.len() / 100;
        let mut indexed = TopK::new(k);
        (0..cut).for_each(|i| indexed.push(cand(i)));
        let indexed = indexed.into_sorted();
        let ceiling = (indexed.len() >= k).then(|| indexed[k - 1]);
        let mut rest = TopK::below(k, ceiling);
        let runs: Vec<Range<u32>> = vec![cut as u32..rows.len() as u32];
        let (kept, _) = prune_runs(&runs, &assigned, &query, rest.bound());
        for i in kept.iter().flat_map(|r| r.clone()) {
            rest.push(cand(i as usize));
        }
        let mut merged = TopK::new(k);
        indexed.into_iter().chain(rest.into_sorted()).for_each(|c| merged.push(c));
        let bits = |v: Vec<Candidate>| v.iter().map(|c| (c.key.to_bits(), c.addr)).collect::<Vec<_>>();
        prop_assert_eq!(bits(merged.into_sorted()), bits(reference.into_sorted()));
    }
}

#[test]
fn bounds_rule_out_most_rows_of_clustered_data() {
    // 8 far-apart clusters, one centroid each: a query in one cluster needs only its rows.
    let dim = 16;
    let rows = clustered(dim, 4000, 8, 42);
    let col = column(dim, &rows);
    let centroids: Vec<f32> = (0..8).flat_map(|c| rows[c + 16].clone().unwrap()).collect();
    for metric in [Metric::L2, Metric::Cosine] {
        let m = model(metric, dim, centroids.clone());
        let assigned = RowCentroids::compute(col.dim, &col.values, &col.valid, &m).unwrap();
        let q: Vec<f32> = rows[3].clone().unwrap();
        let query = query_bound(&m, &q).unwrap();
        let mut top = TopK::new(10);
        for i in 0..rows.len() {
            top.push(Candidate {
                key: exact_key(metric, &q, col.row(i)),
                addr: i as u64,
            });
        }
        let bound = top.bound();
        let (kept, skipped) = prune_runs(&[0..4000], &assigned, &query, bound);
        let kept_rows: usize = kept.iter().map(|r| r.len()).sum();
        assert!(
            skipped > 3000,
            "{metric:?}: only {skipped} of 4000 rows ruled out ({kept_rows} kept)"
        );
    }
}

#[test]
fn rows_without_a_bound_are_always_scored() {
    let dim = 3;
    let rows = vec![
        None,
        Some(vec![0.0, 0.0, 0.0]),
        Some(vec![f32::INFINITY, 0.0, 0.0]),
        Some(vec![100.0, 100.0, 100.0]),
    ];
    let col = column(dim, &rows);
    let m = model(Metric::Cosine, dim, vec![1.0, 0.0, 0.0, -1.0, 0.0, 0.0]);
    let assigned = RowCentroids::compute(col.dim, &col.values, &col.valid, &m).unwrap();
    let query = query_bound(&m, &[-1.0, 0.0, 0.0]).unwrap();
    // Bound 0: every row with a bound is ruled out, the others stay.
    let (kept, skipped) = prune_runs(&[0..4], &assigned, &query, 0.0);
    assert_eq!(kept, vec![0..3]);
    assert_eq!(skipped, 1);
    // A bound that is not a number (a top-k not yet full) rules nothing out.
    let (kept, _) = prune_runs(&[0..4], &assigned, &query, f32::from_bits(u32::MAX >> 1));
    assert_eq!(kept, vec![0..4]);
}

#[test]
fn dot_product_and_mismatched_columns_have_no_bounds() {
    let col = column(2, &[Some(vec![1.0, 2.0])]);
    assert!(
        RowCentroids::compute(
            col.dim,
            &col.values,
            &col.valid,
            &model(Metric::Dot, 2, vec![0.0, 0.0])
        )
        .is_none()
    );
    assert!(
        RowCentroids::compute(
            col.dim,
            &col.values,
            &col.valid,
            &model(Metric::L2, 3, vec![0.0; 3])
        )
        .is_none()
    );
    assert!(QueryBound::new(Metric::Dot, &[1.0], 2).is_none());
}

#[test]
fn assignments_are_for_one_model() {
    let col = column(2, &[Some(vec![1.0, 2.0]), Some(vec![-1.0, 0.5])]);
    let a = model(Metric::L2, 2, vec![0.0, 0.0, 1.0, 2.0]);
    let b = model(Metric::L2, 2, vec![0.0, 0.0, 1.0, 2.0]);
    let assigned = RowCentroids::compute(col.dim, &col.values, &col.valid, &a).unwrap();
    assert!(assigned.is_for(&a));
    assert!(
        !assigned.is_for(&b),
        "an equal model loaded again is another model"
    );
    assert_eq!(assigned.partition, vec![1, 0]);
    assert_eq!(assigned.radius[0], 0.0);
}

//! The index layer's KNN entry point (`fragvec::index::knn::search`) against a brute-force
//! reference, on tables built through the format and index APIs (no SQL).
//!
//! The reference reads every live row's vector, applies the same mask, computes the exact
//! key of each row (`f64`-free: the same `metric_key` the engine uses, so keys compare
//! exactly) and keeps the k smallest by (key, address). Every search that probes all
//! partitions must equal it; searches that probe fewer must still return k rows that exist,
//! are live and pass the mask.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Schema, SchemaRef};
use fragvec::format::index_meta::IndexKind;
use fragvec::format::progress::Progress;
use fragvec::format::{
    Database, NewFragment, NewRowIds, Operation, Snapshot, TableProperties, Transaction, commit,
    read_fragment, write_fragments,
};
use fragvec::index::assigned::assigned_partitions;
use fragvec::index::cache::IndexCache;
use fragvec::index::distance::{Metric, metric_key};
use fragvec::index::knn::{KnnAnswer, KnnRequest, search};
use fragvec::index::optimize::{self, BuildOptions};
use fragvec::ledger::ids::row_address;
use fragvec::rewrite::compact::compact;
use fragvec::rewrite::plan::CompactionOptions;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use roaring::RoaringTreemap;

const DIM: usize = 8;
const BLOBS: usize = 8;
/// Rows of the indexed test table: 6 fragments of 1500.
const ROWS: usize = 9000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "emb",
            DataType::FixedSizeList(
                Arc::new(Field::new_list_field(DataType::Float32, true)),
                DIM as i32,
            ),
            true,
        ),
    ]))
}

/// Blob centres, far apart, so partitions and blobs roughly coincide.
fn centre(blob: usize) -> Vec<f32> {
    (0..DIM)
        .map(|d| if d == blob % DIM { 10.0 } else { 0.0 } * (1.0 + (blob / DIM) as f32))
        .collect()
}

/// `n` rows with ids from `first`; row i lies near blob `i % BLOBS`; rows whose id is in
/// `nulls` have a NULL vector.
fn rows(first: i64, n: usize, rng: &mut StdRng, nulls: &HashSet<i64>) -> RecordBatch {
    let ids: Vec<i64> = (first..first + n as i64).collect();
    let mut values = Vec::with_capacity(n * DIM);
    for id in &ids {
        let c = centre(*id as usize % BLOBS);
        values.extend(c.iter().map(|x| x + rng.random_range(-1.0f32..1.0)));
    }
    let validity: Vec<bool> = ids.iter().map(|id| !nulls.contains(id)).collect();
    let list = FixedSizeListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        DIM as i32,
        Arc::new(Float32Array::from(values)),
        Some(validity.into()),
    )
    .unwrap();
    RecordBatch::try_new(
        schema(),
        vec![Arc::new(Int64Array::from(ids)), Arc::new(list)],
    )
    .unwrap()
}

async fn new_table() -> Snapshot {
    // Each test gets its own in-process store.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let db = Database::open(&format!("memory://index-search-{n}"))
        .await
        .unwrap();
    let props = TableProperties {
        max_rows_per_fragment: 1500,
        ..Default::default()
    };
    db.create_table("t", &schema(), props).await.unwrap()
}

async fn append(snap: &Snapshot, batch: RecordBatch) -> Snapshot {
    let written = write_fragments(
        &snap.dir,
        &snap.schema,
        futures::stream::iter(vec![Ok(batch)]),
        snap.manifest.properties.max_rows_per_fragment,
    )
    .await
    .unwrap();
    let mut txn = Transaction::new(Operation::Append, snap.version());
    txn.appends = written
        .into_iter()
        .map(|w| NewFragment {
            written: w,
            row_ids: NewRowIds::Fresh,
        })
        .collect();
    commit(&snap.dir, &snap.manifest, &txn).await.unwrap()
}

async fn delete(snap: &Snapshot, addrs: &[u64]) -> Snapshot {
    let mut txn = Transaction::new(Operation::Delete, snap.version());
    for a in addrs {
        txn.deletions
            .entry(a >> 32)
            .or_default()
            .insert((a & 0xFFFF_FFFF) as u32);
    }
    commit(&snap.dir, &snap.manifest, &txn).await.unwrap()
}

async fn with_index(snap: &Snapshot, kind: IndexKind, metric: Metric) -> Snapshot {
    let opts = BuildOptions {
        metric,
        num_partitions: Some(BLOBS),
        ..BuildOptions::default()
    };
    optimize::create(snap, "i", "emb", kind, &opts, &Progress::none())
        .await
        .unwrap();
    snap.dir.latest().await.unwrap()
}

/// Every live row: address, id, vector (None for NULL).
async fn live_rows(snap: &Snapshot) -> Vec<(u64, i64, Option<Vec<f32>>)> {
    let mut out = Vec::new();
    for f in &snap.manifest.fragments {
        let deleted = snap.dir.read_deletions(f).await.unwrap();
        let mut stream = read_fragment(snap.dir.clone(), f, snap.schema.clone(), 4096);
        let mut offset = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch.unwrap();
            let ids = batch
                .column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            let list = batch.column(1).as_fixed_size_list();
            let values = list.values().as_primitive::<Float32Type>().values();
            for i in 0..batch.num_rows() {
                let o = offset + i as u64;
                if !deleted.contains(o as u32) {
                    let v = list
                        .is_valid(i)
                        .then(|| values[i * DIM..(i + 1) * DIM].to_vec());
                    out.push((row_address(f.id, o), ids.value(i), v));
                }
            }
            offset += batch.num_rows() as u64;
        }
    }
    out
}

/// The exact answer: (key, address) of the k nearest live rows passing the mask.
async fn reference(
    snap: &Snapshot,
    q: &[f32],
    metric: Metric,
    k: usize,
    mask: Option<&RoaringTreemap>,
) -> Vec<(f32, u64)> {
    let mut all: Vec<(f32, u64)> = live_rows(snap)
        .await
        .into_iter()
        .filter(|(a, _, _)| mask.is_none_or(|m| m.contains(*a)))
        .map(|(a, _, v)| {
            let key = v
                .and_then(|v| metric_key(metric, q, &v))
                .unwrap_or(f32::INFINITY);
            (key, a)
        })
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    all.truncate(k);
    all
}

struct Query<'a> {
    q: &'a [f32],
    metric: Metric,
    k: usize,
    nprobes: usize,
    refine_factor: usize,
    exact: bool,
    mask: Option<&'a RoaringTreemap>,
    undefined_first: bool,
}

impl<'a> Query<'a> {
    fn new(q: &'a [f32]) -> Self {
        Self {
            q,
            metric: Metric::L2,
            k: 10,
            nprobes: BLOBS,
            refine_factor: 1,
            exact: false,
            mask: None,
            undefined_first: false,
        }
    }
}

async fn run(snap: &Snapshot, query: &Query<'_>) -> KnnAnswer {
    run_in(snap, query, &IndexCache::new(64 << 20)).await
}

async fn run_in(snap: &Snapshot, query: &Query<'_>, cache: &IndexCache) -> KnnAnswer {
    let index = snap.manifest.index("i").cloned();
    let request = KnnRequest {
        snapshot: snap,
        column: "emb",
        vector: query.q,
        metric: query.metric,
        k: query.k,
        index: if query.exact { None } else { index.as_ref() },
        nprobes: query.nprobes,
        refine_factor: query.refine_factor,
        mask: query.mask,
        undefined_first: query.undefined_first,
    };
    search(request, cache).await.unwrap()
}

fn got(answer: &KnnAnswer) -> Vec<(f32, u64)> {
    answer.candidates.iter().map(|c| (c.key, c.addr)).collect()
}

/// A table of 6 × 1500 rows in 8 blobs, indexed with 8 partitions.
async fn indexed_table(kind: IndexKind, metric: Metric) -> (Snapshot, StdRng) {
    let mut rng = StdRng::seed_from_u64(7);
    let snap = new_table().await;
    let snap = append(&snap, rows(0, ROWS, &mut rng, &HashSet::new())).await;
    (with_index(&snap, kind, metric).await, rng)
}

fn query_near(blob: usize) -> Vec<f32> {
    centre(blob).iter().map(|x| x + 0.25).collect()
}

#[tokio::test]
async fn unfiltered_search_takes_the_fast_path_and_matches_the_reference() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    for metric_q in [query_near(0), query_near(3)] {
        let answer = run(&snap, &Query::new(&metric_q)).await;
        assert_eq!(
            got(&answer),
            reference(&snap, &metric_q, Metric::L2, 10, None).await
        );
        let s = answer.stats;
        assert_eq!(s.segments_searched, 1);
        // The fast path checks no row against a mask.
        assert_eq!(
            (s.dropped_ownership, s.dropped_deleted, s.dropped_filter),
            (0, 0, 0)
        );
        // IVF_FLAT answers carry the rows' vectors.
        assert!(
            answer
                .candidates
                .iter()
                .all(|c| answer.vectors.contains_key(&c.addr))
        );
    }
}

#[tokio::test]
async fn deleted_rows_are_dropped_before_the_local_top_k() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(1);
    let before = reference(&snap, &q, Metric::L2, 10, None).await;
    // Delete the five nearest rows: they must not come back, and the next ones fill in.
    let gone: Vec<u64> = before.iter().take(5).map(|(_, a)| *a).collect();
    let snap = delete(&snap, &gone).await;
    let answer = run(&snap, &Query::new(&q)).await;
    assert_eq!(
        got(&answer),
        reference(&snap, &q, Metric::L2, 10, None).await
    );
    assert!(answer.candidates.iter().all(|c| !gone.contains(&c.addr)));
    assert!(answer.stats.dropped_deleted >= 5);
}

#[tokio::test]
async fn row_mask_applies_before_the_local_top_k() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(2);
    // Even ids only: more rows than the exact-scoring threshold, so the index path runs.
    let mask: RoaringTreemap = live_rows(&snap)
        .await
        .into_iter()
        .filter(|(_, id, _)| id % 2 == 0)
        .map(|(a, _, _)| a)
        .collect();
    assert!(mask.len() > fragvec::index::knn::EXACT_MASK_ROWS);
    let query = Query {
        mask: Some(&mask),
        ..Query::new(&q)
    };
    let answer = run(&snap, &query).await;
    assert!(!answer.stats.exact_mask);
    assert_eq!(
        got(&answer),
        reference(&snap, &q, Metric::L2, 10, Some(&mask)).await
    );
    assert!(answer.stats.dropped_filter > 0);
}

#[tokio::test]
async fn a_selective_mask_is_scored_exactly() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(4);
    let mask: RoaringTreemap = live_rows(&snap)
        .await
        .into_iter()
        .filter(|(_, id, _)| id % 97 == 0)
        .map(|(a, _, _)| a)
        .collect();
    let query = Query {
        mask: Some(&mask),
        nprobes: 1,
        ..Query::new(&q)
    };
    let answer = run(&snap, &query).await;
    assert!(answer.stats.exact_mask);
    assert_eq!(answer.stats.partitions_probed, 0);
    assert_eq!(
        got(&answer),
        reference(&snap, &q, Metric::L2, 10, Some(&mask)).await
    );
}

#[tokio::test]
async fn probes_grow_until_k_qualifying_rows_are_found() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(5);
    // Leave out every row of the query's nearest partition (as the index assigned them).
    let cache = IndexCache::new(1 << 20);
    let def = snap.manifest.index("i").unwrap();
    let model = cache.model(&snap.dir, def).await.unwrap();
    let nearest = model.probe_order_from(&q, 1).first()[0] as u32;
    let assigned = assigned_partitions(&snap, def, &model, &cache)
        .await
        .unwrap();
    let mask: RoaringTreemap = live_rows(&snap)
        .await
        .into_iter()
        .filter(|(a, _, _)| assigned[&(a >> 32)][(a & 0xFFFF_FFFF) as usize] != nearest)
        .map(|(a, _, _)| a)
        .collect();
    assert!(mask.len() > fragvec::index::knn::EXACT_MASK_ROWS);
    let query = Query {
        mask: Some(&mask),
        nprobes: 1,
        ..Query::new(&q)
    };
    let answer = run(&snap, &query).await;
    assert_eq!(answer.candidates.len(), 10);
    assert!(answer.candidates.iter().all(|c| mask.contains(c.addr)));
    assert!(answer.stats.partitions_probed > 1, "{:?}", answer.stats);
    // Probing everything is exact.
    let all = Query {
        mask: Some(&mask),
        ..Query::new(&q)
    };
    assert_eq!(
        got(&run(&snap, &all).await),
        reference(&snap, &q, Metric::L2, 10, Some(&mask)).await
    );
}

#[tokio::test]
async fn unindexed_fragments_and_compacted_rows_merge_into_one_answer() {
    let (snap, mut rng) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    // Deletions everywhere, then a compaction (rows move; the segment is translated
    // through the ledger), then new rows no segment owns (brute force).
    let victims: Vec<u64> = live_rows(&snap)
        .await
        .into_iter()
        .filter(|(_, id, _)| id % 3 == 0)
        .map(|(a, _, _)| a)
        .collect();
    let snap = delete(&snap, &victims).await;
    let options = CompactionOptions {
        target_rows_per_fragment: 1500,
        max_rows_per_fragment: 1500,
        deletion_threshold: 0.1,
        ..Default::default()
    };
    let (snap, metrics) = compact(&snap, &options, &Progress::none()).await.unwrap();
    assert!(metrics.fragments_removed > 0, "{metrics:?}");
    assert!(!snap.manifest.reuse_ledger.is_empty());
    let snap = append(&snap, rows(10_000, 700, &mut rng, &HashSet::new())).await;
    for blob in 0..BLOBS {
        let q = query_near(blob);
        let answer = run(&snap, &Query::new(&q)).await;
        assert_eq!(
            got(&answer),
            reference(&snap, &q, Metric::L2, 10, None).await,
            "blob {blob}"
        );
        assert_eq!(answer.stats.unindexed_rows, 700);
    }
}

#[tokio::test]
async fn pq_candidates_are_reranked_with_exact_distances() {
    let (snap, _) = indexed_table(IndexKind::IvfPq { num_sub_vectors: 4 }, Metric::L2).await;
    let q = query_near(6);
    let query = Query {
        refine_factor: 40,
        ..Query::new(&q)
    };
    let answer = run(&snap, &query).await;
    // Keys are exact distances (re-ranked), so the answer equals the reference.
    assert_eq!(
        got(&answer),
        reference(&snap, &q, Metric::L2, 10, None).await
    );
    // PQ answers carry no vectors: fetching reads them from the table.
    assert!(answer.vectors.is_empty());
}

#[tokio::test]
async fn cosine_and_dot_indexes_match_their_references() {
    for metric in [Metric::Cosine, Metric::Dot] {
        let (snap, _) = indexed_table(IndexKind::IvfFlat, metric).await;
        let q = query_near(7);
        let query = Query {
            metric,
            ..Query::new(&q)
        };
        assert_eq!(
            got(&run(&snap, &query).await),
            reference(&snap, &q, metric, 10, None).await,
            "{metric:?}"
        );
    }
}

#[tokio::test]
async fn exact_search_without_an_index_matches_the_reference() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(0);
    let query = Query {
        exact: true,
        k: 25,
        ..Query::new(&q)
    };
    let answer = run(&snap, &query).await;
    assert_eq!(
        got(&answer),
        reference(&snap, &q, Metric::L2, 25, None).await
    );
    assert_eq!(answer.stats.segments_searched, 0);
    assert_eq!(answer.stats.rows_scored, ROWS);
}

/// Exact scoring streams fragments larger than the cache budget (in batches that cut runs of
/// scorable rows) and scores cached fragments together on every core; both must equal the
/// reference under deletions, NULL vectors and a mask, for every metric.
#[tokio::test]
async fn exact_search_matches_the_reference_streamed_or_cached_in_parallel() {
    let mut rng = StdRng::seed_from_u64(5);
    let snap = new_table().await;
    let n = 40_000; // enough rows to score on every core
    let nulls: HashSet<i64> = (0..n as i64).filter(|i| i % 97 == 0).collect();
    let snap = append(&snap, rows(0, n, &mut rng, &nulls)).await;
    let live: Vec<u64> = live_rows(&snap).await.iter().map(|(a, _, _)| *a).collect();
    let doomed: Vec<u64> = live.iter().copied().filter(|a| a % 7 == 0).collect();
    let snap = delete(&snap, &doomed).await;
    // Long runs and isolated rows: every third block of 500 rows, plus every 11th row.
    let mask: RoaringTreemap = live
        .iter()
        .copied()
        .filter(|a| (a & 0xFFFF_FFFF) / 500 % 3 == 0 || a % 11 == 0)
        .collect();
    let q = query_near(2);
    for budget in [0, 64 << 20] {
        let cache = IndexCache::new(budget);
        for metric in [Metric::L2, Metric::Cosine, Metric::Dot] {
            for mask in [None, Some(&mask)] {
                let request = KnnRequest {
                    snapshot: &snap,
                    column: "emb",
                    vector: &q,
                    metric,
                    k: 30,
                    index: None,
                    nprobes: 1,
                    refine_factor: 1,
                    mask,
                    undefined_first: false,
                };
                // Masks above the exact-mask threshold take the brute-force path.
                assert!(mask.is_none_or(|m| m.len() > 4096));
                let answer = search(request, &cache).await.unwrap();
                let what = format!("budget {budget}, {metric:?}, mask {}", mask.is_some());
                assert_eq!(
                    got(&answer),
                    reference(&snap, &q, metric, 30, mask).await,
                    "{what}"
                );
                let qualifying = live_rows(&snap)
                    .await
                    .iter()
                    .filter(|(a, _, _)| mask.is_none_or(|m| m.contains(*a)))
                    .count();
                assert_eq!(
                    answer.stats.rows_scored, qualifying,
                    "{what}: every row once"
                );
            }
        }
        if budget == 0 {
            assert_eq!(cache.bytes_held(), 0, "streamed columns are not kept");
        } else {
            assert!(cache.bytes_held() >= n * DIM * 4, "cached columns are kept");
        }
    }
}

#[tokio::test]
async fn rows_the_index_cannot_return_make_the_search_exact() {
    let mut rng = StdRng::seed_from_u64(11);
    let snap = new_table().await;
    let nulls: HashSet<i64> = (0..40).filter(|i| i % 4 == 0).collect();
    let snap = append(&snap, rows(0, 40, &mut rng, &nulls)).await;
    let snap = with_index(&snap, IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(0);
    // 30 rows have vectors; asking for 35 needs 5 NULL-vector rows, which only an exact
    // scan can return (last, with an undefined distance).
    let query = Query {
        k: 35,
        ..Query::new(&q)
    };
    let answer = run(&snap, &query).await;
    assert_eq!(answer.stats.exact_fallbacks, 1);
    assert_eq!(
        got(&answer),
        reference(&snap, &q, Metric::L2, 35, None).await
    );
    let undefined = answer
        .candidates
        .iter()
        .filter(|c| c.key == f32::INFINITY)
        .count();
    assert_eq!(undefined, 5);
}

/// `NULLS FIRST`: up to k rows without a distance (NULL vectors, in indexed and unindexed
/// fragments, deleted ones excluded, the mask applied) come first, in logical order, then
/// the nearest others. Fragments whose Parquet statistics count no NULL are not read.
#[tokio::test]
async fn rows_without_a_distance_come_first_when_asked() {
    let mut rng = StdRng::seed_from_u64(5);
    let snap = new_table().await;
    let nulls: HashSet<i64> = [1600, 1601, 1777, 6100, 6200].into();
    let snap = append(&snap, rows(0, ROWS, &mut rng, &nulls)).await;
    let snap = with_index(&snap, IndexKind::IvfFlat, Metric::Dot).await;
    let late: HashSet<i64> = [9010, 9050].into();
    let snap = append(&snap, rows(ROWS as i64, 100, &mut rng, &late)).await;
    let live = live_rows(&snap).await;
    let addr_of = |id: i64| live.iter().find(|r| r.1 == id).unwrap().0;
    let snap = delete(&snap, &[addr_of(1601)]).await;
    let live = live_rows(&snap).await;
    let even: RoaringTreemap = live.iter().filter(|r| r.1 % 2 == 0).map(|r| r.0).collect();
    let q = query_near(2);
    for mask in [None, Some(&even)] {
        // Live NULL-vector rows passing the mask, in logical order.
        let undefined: Vec<u64> = live
            .iter()
            .filter(|r| r.2.is_none() && mask.is_none_or(|m| m.contains(r.0)))
            .map(|r| r.0)
            .collect();
        assert_eq!(undefined.len(), if mask.is_some() { 5 } else { 6 });
        for k in [2, undefined.len(), 10] {
            let query = Query {
                k,
                metric: Metric::Dot,
                mask,
                undefined_first: true,
                ..Query::new(&q)
            };
            let answer = run(&snap, &query).await;
            let nearest: Vec<(f32, u64)> = reference(&snap, &q, Metric::Dot, ROWS, mask)
                .await
                .into_iter()
                .filter(|(key, _)| key.is_finite())
                .take(k.saturating_sub(undefined.len()))
                .collect();
            let mut expected: Vec<(f32, u64)> = undefined
                .iter()
                .take(k)
                .map(|a| (f32::NEG_INFINITY, *a))
                .collect();
            expected.extend(nearest);
            assert_eq!(got(&answer), expected, "k = {k}, mask: {}", mask.is_some());
            if k == undefined.len() {
                // Only the three fragments holding a NULL vector were read (of seven).
                assert_eq!(answer.stats.fragments_read, 3, "k = {k}");
                assert_eq!(answer.stats.segments_searched, 0);
            }
        }
    }
}

#[tokio::test]
async fn a_huge_k_is_bounded_by_the_rows_that_exist() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let q = query_near(0);
    for exact in [false, true] {
        let query = Query {
            k: 1 << 40,
            exact,
            ..Query::new(&q)
        };
        assert_eq!(run(&snap, &query).await.candidates.len(), ROWS);
    }
}

#[tokio::test]
async fn a_query_of_the_wrong_dimension_is_an_error_naming_the_column() {
    let (snap, _) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let cache = IndexCache::new(1 << 20);
    let index = snap.manifest.index("i").cloned();
    let request = KnnRequest {
        snapshot: &snap,
        column: "emb",
        vector: &[1.0, 2.0],
        metric: Metric::L2,
        k: 3,
        index: index.as_ref(),
        nprobes: 2,
        refine_factor: 1,
        mask: None,
        undefined_first: false,
    };
    let err = search(request, &cache).await.unwrap_err().to_string();
    assert!(
        err.contains("2 dimensions") && err.contains("'emb'"),
        "{err}"
    );
}

/// Probing every partition (what an exact search over IVF_FLAT does) with a cache budget far
/// below the segment's size: the partitions are scored in many small groups, never kept, and
/// the answer, with the winners' vectors, equals the reference — after deletions, under a
/// mask, and with rows moved by a compaction and rows no segment owns.
#[tokio::test]
async fn probing_every_partition_in_small_groups_is_exact_and_keeps_nothing() {
    let (snap, mut rng) = indexed_table(IndexKind::IvfFlat, Metric::L2).await;
    let victims: Vec<u64> = live_rows(&snap)
        .await
        .into_iter()
        .filter(|(_, id, _)| id % 7 == 0)
        .map(|(a, _, _)| a)
        .collect();
    let deleted = delete(&snap, &victims).await;
    let segment_bytes: u64 = deleted
        .manifest
        .segments_of("i")
        .map(|s| s.size_bytes)
        .sum();
    // 256 KiB: groups of 64 KiB, while the segment holds 9000 rows × 40 bytes.
    let budget = 256 << 10;
    assert!(segment_bytes > budget as u64 * 5 / 4, "{segment_bytes}");
    let options = CompactionOptions {
        target_rows_per_fragment: 1500,
        max_rows_per_fragment: 1500,
        deletion_threshold: 0.1,
        ..Default::default()
    };
    let (compacted, _) = compact(&deleted, &options, &Progress::none())
        .await
        .unwrap();
    let moved = append(&compacted, rows(20_000, 300, &mut rng, &HashSet::new())).await;
    for (name, snap) in [("deleted", &deleted), ("compacted + appended", &moved)] {
        let live = live_rows(snap).await;
        let mask: RoaringTreemap = live
            .iter()
            .filter(|(_, id, _)| id % 5 != 0)
            .map(|(a, _, _)| *a)
            .collect();
        for (blob, mask) in [(1, None), (6, Some(&mask))] {
            let q = query_near(blob);
            let query = Query {
                mask,
                nprobes: usize::MAX,
                ..Query::new(&q)
            };
            let cache = IndexCache::new(budget);
            let answer = run_in(snap, &query, &cache).await;
            let want = reference(snap, &q, Metric::L2, 10, mask).await;
            assert_eq!(got(&answer), want, "{name}, blob {blob}");
            assert_eq!(answer.stats.partitions_probed, BLOBS, "{name}");
            for c in &answer.candidates {
                let row = live.iter().find(|r| r.0 == c.addr).unwrap();
                if let Some(v) = answer.vectors.get(&c.addr) {
                    assert_eq!(Some(v), row.2.as_ref(), "{name}: vector of {}", c.addr);
                }
            }
            if name == "deleted" {
                // Every winner came from the segment, and its vector with it.
                assert_eq!(answer.vectors.len(), 10, "{name}");
                assert_eq!(
                    cache.bytes_held(),
                    0,
                    "a scan larger than the budget kept partitions"
                );
            }
            // A search probing a few partitions keeps them (within the budget).
            let few = Query {
                nprobes: 2,
                ..query
            };
            run_in(snap, &few, &cache).await;
            assert!(cache.bytes_held() > 0, "{name}");
        }
    }
}

/// Unindexed rows are ruled out by their distance to their nearest centroid once their
/// fragment's rows are assigned (in the background): the answers before and after are the
/// same, and exact at full probes, for both metrics with bounds and under a mask.
#[tokio::test]
async fn unindexed_rows_ruled_out_by_centroid_bounds_leave_answers_unchanged() {
    for metric in [Metric::L2, Metric::Cosine] {
        let (snap, mut rng) = indexed_table(IndexKind::IvfFlat, metric).await;
        let mut snap = snap;
        for f in 0..3 {
            snap = append(
                &snap,
                rows(20_000 + f * 1000, 1000, &mut rng, &HashSet::new()),
            )
            .await;
        }
        let unindexed: Vec<u64> = live_rows(&snap)
            .await
            .into_iter()
            .filter(|(_, id, _)| *id >= 20_000 && id % 7 == 0)
            .map(|(a, _, _)| a)
            .collect();
        let snap = delete(&snap, &unindexed).await;
        let mask: RoaringTreemap = live_rows(&snap)
            .await
            .into_iter()
            .filter(|(_, id, _)| id % 5 != 0)
            .map(|(a, _, _)| a)
            .collect();
        let cache = IndexCache::new(64 << 20);
        let queries: Vec<Vec<f32>> = (0..BLOBS).map(query_near).collect();
        fn ask<'a>(
            q: &'a [f32],
            metric: Metric,
            nprobes: usize,
            mask: Option<&'a RoaringTreemap>,
        ) -> Query<'a> {
            let mut query = Query::new(q);
            query.metric = metric;
            query.nprobes = nprobes;
            query.mask = mask;
            query
        }
        let mut before = Vec::new();
        for q in &queries {
            for (nprobes, masked) in [(BLOBS, false), (1, false), (BLOBS, true)] {
                let answer = run_in(
                    &snap,
                    &ask(q, metric, nprobes, masked.then_some(&mask)),
                    &cache,
                )
                .await;
                before.push(got(&answer));
            }
        }
        // The first queries asked for the assignments; wait until a query uses most of them
        // (a query near one blob can rule out the 7/8 of the 2,571 live unindexed rows that
        // lie in the other blobs).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let answer = run_in(&snap, &ask(&queries[0], metric, BLOBS, None), &cache).await;
            if answer.stats.skipped_by_bound > 2000 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{metric:?}: no unindexed row was ever ruled out by its bound"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut skipped = 0;
        let mut after = Vec::new();
        for q in &queries {
            for (nprobes, masked) in [(BLOBS, false), (1, false), (BLOBS, true)] {
                let answer = run_in(
                    &snap,
                    &ask(q, metric, nprobes, masked.then_some(&mask)),
                    &cache,
                )
                .await;
                skipped += answer.stats.skipped_by_bound;
                after.push(got(&answer));
                if nprobes == BLOBS {
                    let m = masked.then_some(&mask);
                    assert_eq!(
                        got(&answer),
                        reference(&snap, q, metric, 10, m).await,
                        "{metric:?}, masked {masked}"
                    );
                }
            }
        }
        assert_eq!(after, before, "{metric:?}");
        // Most of the 2,571 live unindexed rows lie in other blobs than a query's.
        assert!(
            skipped > queries.len() * 1500,
            "{metric:?}: {skipped} skipped"
        );
    }
}

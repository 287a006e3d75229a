//! Index builds within a memory budget (`fragvec::index::build_stream`) against the build
//! that holds every vector: on the same snapshot both must write the same model and the
//! same segment file, byte for byte, and so answer every KNN query alike; the streaming
//! build must hold no more than its budget while it reads the column in several passes.
//!
//! Tables are made through the format API (no SQL) with deleted rows, NULL vectors and, for
//! cosine, zero vectors (which have no direction and live in partition 0).

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use fragvec::format::index_meta::IndexKind;
use fragvec::format::progress::Progress;
use fragvec::format::{
    Database, NewFragment, NewRowIds, Operation, Snapshot, TableProperties, Transaction, commit,
    write_fragments,
};
use fragvec::index::cache::IndexCache;
use fragvec::index::distance::Metric;
use fragvec::index::knn::{KnnRequest, search};
use fragvec::index::optimize::{self, BuildOptions, BuiltIndex};
use fragvec::ledger::ids::row_address;
use object_store::ObjectStoreExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIM: usize = 8;
const BLOBS: usize = 8;
/// 6 fragments of 1500 rows.
const ROWS: usize = 9000;
/// Small enough that the streaming build cuts its segment into several groups.
const BUDGET: usize = 128 * 1024;

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

/// Rows with ids `0..n` near `BLOBS` blob centres; every 97th vector is NULL and every 89th
/// is zero.
fn rows(n: usize, rng: &mut StdRng) -> RecordBatch {
    let mut values = Vec::with_capacity(n * DIM);
    for id in 0..n {
        let blob = id % BLOBS;
        values.extend((0..DIM).map(|d| {
            if id % 89 == 0 {
                0.0
            } else {
                (if d == blob { 10.0 } else { 0.0 }) + rng.random_range(-1.0f32..1.0)
            }
        }));
    }
    let validity: Vec<bool> = (0..n).map(|id| id % 97 != 0).collect();
    let list = FixedSizeListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        DIM as i32,
        Arc::new(Float32Array::from(values)),
        Some(validity.into()),
    )
    .unwrap();
    let ids = Int64Array::from_iter_values(0..n as i64);
    RecordBatch::try_new(schema(), vec![Arc::new(ids), Arc::new(list)]).unwrap()
}

/// A table of [`ROWS`] rows with every 7th row of each fragment deleted and all of fragment
/// 3 deleted but one row.
async fn table() -> Snapshot {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let db = Database::open(&format!("memory://index-build-{n}"))
        .await
        .unwrap();
    let props = TableProperties {
        max_rows_per_fragment: 1500,
        ..Default::default()
    };
    let snap = db.create_table("t", &schema(), props).await.unwrap();
    let batch = rows(ROWS, &mut StdRng::seed_from_u64(11));
    let written = write_fragments(
        &snap.dir,
        &snap.schema,
        futures::stream::iter(vec![Ok(batch)]),
        1500,
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
    let snap = commit(&snap.dir, &snap.manifest, &txn).await.unwrap();
    let mut txn = Transaction::new(Operation::Delete, snap.version());
    for (i, f) in snap.manifest.fragments.iter().enumerate() {
        let gone = txn.deletions.entry(f.id).or_default();
        for o in 0..f.physical_rows as u32 {
            if o % 7 == 3 || (i == 3 && o != 5) {
                gone.insert(o);
            }
        }
    }
    commit(&snap.dir, &snap.manifest, &txn).await.unwrap()
}

fn options(metric: Metric, budget: Option<usize>, sample_size: Option<usize>) -> BuildOptions {
    options_with(metric, budget, sample_size, BLOBS)
}

fn options_with(
    metric: Metric,
    budget: Option<usize>,
    sample_size: Option<usize>,
    partitions: usize,
) -> BuildOptions {
    BuildOptions {
        metric,
        num_partitions: Some(partitions),
        sample_size,
        memory_budget_bytes: budget,
    }
}

/// Builds index `name` of `kind` on column `emb` of `snap` (uncommitted).
async fn build_index(
    snap: &Snapshot,
    name: &str,
    kind: IndexKind,
    opts: &BuildOptions,
) -> BuiltIndex {
    optimize::build(snap, name, "emb", kind, opts, &Progress::none())
        .await
        .unwrap()
}

async fn file(snap: &Snapshot, relative: &str) -> Vec<u8> {
    let path = snap.dir.path(relative);
    let got = snap.dir.store().get(&path).await.unwrap();
    got.bytes().await.unwrap().to_vec()
}

/// Builds `kind` twice on `snap` (every vector at once, then within `budget`, in several
/// groups) and checks both wrote the same files; returns both builds.
async fn build_both(
    snap: &Snapshot,
    kind: IndexKind,
    metric: Metric,
    sample_size: Option<usize>,
    budget: usize,
) -> (BuiltIndex, BuiltIndex) {
    let whole = build_index(
        snap,
        "whole",
        kind.clone(),
        &options(metric, None, sample_size),
    )
    .await;
    let streamed = build_index(
        snap,
        "streamed",
        kind,
        &options(metric, Some(budget), sample_size),
    )
    .await;
    assert!(!whole.stats.streamed, "{:?}", whole.stats);
    assert!(streamed.stats.streamed, "{:?}", streamed.stats);
    assert!(streamed.stats.groups >= 2, "{:?}", streamed.stats);
    // Two reads of the column (sample, assign); the groups come from the spilled rows.
    assert_eq!(streamed.stats.passes, 2);
    assert!(
        streamed.stats.spilled_bytes >= streamed.segment.size_bytes / 2,
        "{:?}",
        streamed.stats
    );
    assert_eq!(
        file(snap, &whole.def.model_file).await,
        file(snap, &streamed.def.model_file).await,
        "the models differ"
    );
    let segment = file(snap, &whole.segment.file).await;
    assert!(
        segment == file(snap, &streamed.segment.file).await,
        "the segment files differ"
    );
    assert_eq!(whole.segment.size_bytes, segment.len() as u64);
    assert_eq!(streamed.segment.size_bytes, segment.len() as u64);
    assert_eq!(whole.segment.rows, streamed.segment.rows);
    assert_eq!(
        whole.segment.fragment_bitmap,
        streamed.segment.fragment_bitmap
    );
    assert_eq!(whole.def.num_partitions, streamed.def.num_partitions);
    (whole, streamed)
}

/// The 10 nearest rows to `q` (L2) by index `index` at `nprobes`.
async fn knn(
    snap: &Snapshot,
    index: &str,
    q: &[f32],
    nprobes: usize,
    cache: &IndexCache,
) -> fragvec::index::knn::KnnAnswer {
    let request = KnnRequest {
        snapshot: snap,
        column: "emb",
        vector: q,
        metric: Metric::L2,
        k: 10,
        index: snap.manifest.index(index),
        nprobes,
        refine_factor: 1,
        mask: None,
        undefined_first: false,
    };
    search(request, cache).await.unwrap()
}

/// The live non-NULL rows of [`table`].
fn live_vectors(snap: &Snapshot) -> u64 {
    let mut n = 0;
    let mut start = 0u64;
    for (i, f) in snap.manifest.fragments.iter().enumerate() {
        for o in 0..f.physical_rows {
            let id = start + o;
            let deleted = o % 7 == 3 || (i == 3 && o != 5);
            if !deleted && !id.is_multiple_of(97) {
                n += 1;
            }
        }
        start += f.physical_rows;
    }
    n
}

#[tokio::test]
async fn a_streamed_build_writes_the_files_of_an_in_memory_build() {
    let snap = table().await;
    // PQ rows are 10 bytes, not 40: a smaller budget still makes several groups.
    for (kind, metric, budget) in [
        (IndexKind::IvfFlat, Metric::L2, BUDGET),
        (
            IndexKind::IvfPq { num_sub_vectors: 2 },
            Metric::Cosine,
            BUDGET / 4,
        ),
        (IndexKind::IvfFlat, Metric::Dot, BUDGET),
    ] {
        let (whole, streamed) = build_both(&snap, kind.clone(), metric, Some(1000), budget).await;
        assert_eq!(streamed.segment.rows, live_vectors(&snap), "{kind:?}");
        assert!(whole.segment.rows < ROWS as u64);
    }
}

/// Spill files of several partitions each, and a group that begins inside one: 40
/// partitions and a budget whose groups are about half the segment (its buckets, about an
/// eighth of a group each, then hold four partitions).
#[tokio::test]
async fn a_streamed_build_with_several_partitions_per_spill_file_writes_the_same_file() {
    let snap = table().await;
    // A sample both builds take whole (a budget cuts the default one: see below).
    let opts = |budget| options_with(Metric::L2, budget, Some(2000), 40);
    let whole = build_index(&snap, "whole", IndexKind::IvfFlat, &opts(None)).await;
    let streamed = build_index(
        &snap,
        "streamed",
        IndexKind::IvfFlat,
        &opts(Some(400 * 1024)),
    )
    .await;
    assert!(
        streamed.stats.streamed && streamed.stats.groups >= 2,
        "{:?}",
        streamed.stats
    );
    assert_eq!(whole.def.num_partitions, 40);
    assert!(
        file(&snap, &whole.segment.file).await == file(&snap, &streamed.segment.file).await,
        "the segment files differ"
    );
}

#[tokio::test]
async fn a_streamed_build_holds_no_more_than_its_budget() {
    let snap = table().await;
    // A sample that fits the budget (k-means needs all of it at once; the default 256 rows
    // per partition would not).
    let (whole, streamed) =
        build_both(&snap, IndexKind::IvfFlat, Metric::L2, Some(1000), BUDGET).await;
    // Every vector held at once would not fit: that is why it streamed.
    assert!(whole.stats.peak_bytes > BUDGET, "{:?}", whole.stats);
    assert!(streamed.stats.peak_bytes <= BUDGET, "{:?}", streamed.stats);
    // The segment (40 bytes per row) did not fit half the budget: several groups.
    assert!(streamed.segment.size_bytes > BUDGET as u64 / 2);
    assert!(streamed.stats.groups >= 4, "{:?}", streamed.stats);
}

/// The default training sample (256 rows per partition: 2,048 rows of 8 floats, 128 KiB
/// with k-means' copy, the whole budget) is cut to half the budget, so the build holds no
/// more than its budget; never below 64 rows per partition; a sample asked for is kept.
#[tokio::test]
async fn a_default_training_sample_is_cut_to_the_budget() {
    use fragvec::index::build::sample_size_within;
    assert_eq!(sample_size_within(BLOBS, None, DIM, usize::MAX), 2048);
    assert_eq!(sample_size_within(BLOBS, None, DIM, BUDGET), 1024);
    assert_eq!(sample_size_within(BLOBS, None, DIM, 0), 512);
    assert_eq!(sample_size_within(BLOBS, Some(5000), DIM, 0), 5000);
    let snap = table().await;
    let streamed = build_index(
        &snap,
        "streamed",
        IndexKind::IvfFlat,
        &options(Metric::L2, Some(BUDGET), None),
    )
    .await;
    assert!(streamed.stats.streamed, "{:?}", streamed.stats);
    assert!(streamed.stats.peak_bytes <= BUDGET, "{:?}", streamed.stats);
    assert_eq!(streamed.segment.rows, live_vectors(&snap));
}

#[tokio::test]
async fn streamed_and_in_memory_indexes_answer_knn_alike() {
    let snap = table().await;
    for (name, budget) in [("whole", None), ("streamed", Some(BUDGET))] {
        let opts = options(Metric::L2, budget, Some(1000));
        let snap = snap.dir.latest().await.unwrap();
        optimize::create(
            &snap,
            name,
            "emb",
            IndexKind::IvfFlat,
            &opts,
            &Progress::none(),
        )
        .await
        .unwrap();
    }
    let snap = snap.dir.latest().await.unwrap();
    let cache = IndexCache::new(64 << 20);
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..20 {
        let q: Vec<f32> = (0..DIM).map(|_| rng.random_range(-2.0f32..12.0)).collect();
        let mut answers = Vec::new();
        for name in ["whole", "streamed"] {
            let answer = knn(&snap, name, &q, 2, &cache).await;
            assert_eq!(answer.stats.segments_searched, 1);
            answers.push(
                answer
                    .candidates
                    .iter()
                    .map(|c| (c.key, c.addr))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(answers[0], answers[1], "query {q:?}");
        assert_eq!(answers[0].len(), 10);
        let deleted: HashSet<u64> = [row_address(snap.manifest.fragments[3].id, 0)].into();
        assert!(answers[0].iter().all(|(_, a)| !deleted.contains(a)));
    }
}

/// An IVF_SQ build whose budget cuts the training sample trains its centroids on the cut
/// sample and its scalar grid on the full one, in one more pass over the column (the grid
/// needs many rows per partition); its answers at every partition are the exact ones.
#[tokio::test]
async fn an_ivf_sq_build_on_a_cut_sample_trains_its_grid_on_the_full_sample() {
    let snap = table().await;
    let cut = options(Metric::L2, Some(BUDGET), None);
    let built = build_index(&snap, "built", IndexKind::IvfSq, &cut).await;
    assert!(built.stats.streamed, "{:?}", built.stats);
    assert_eq!(built.stats.passes, 3, "{:?}", built.stats);
    assert!(built.stats.peak_bytes <= BUDGET, "{:?}", built.stats);
    for (name, kind, opts) in [
        ("sq", IndexKind::IvfSq, cut),
        ("flat", IndexKind::IvfFlat, options(Metric::L2, None, None)),
    ] {
        let snap = snap.dir.latest().await.unwrap();
        optimize::create(&snap, name, "emb", kind, &opts, &Progress::none())
            .await
            .unwrap();
    }
    let snap = snap.dir.latest().await.unwrap();
    let cache = IndexCache::new(64 << 20);
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..10 {
        let q: Vec<f32> = (0..DIM).map(|_| rng.random_range(-2.0f32..12.0)).collect();
        let mut answers = Vec::new();
        for name in ["sq", "flat"] {
            let answer = knn(&snap, name, &q, BLOBS, &cache).await;
            answers.push(answer.candidates.iter().map(|c| c.addr).collect::<Vec<_>>());
        }
        assert_eq!(answers[0], answers[1], "query {q:?}");
    }
}

#[tokio::test]
async fn a_zero_budget_streams_in_a_bounded_number_of_groups() {
    // `fragvec.index_cache_bytes = 0` means "cache nothing"; a build must not then read the
    // column once per row.
    let snap = table().await;
    let (_, streamed) = build_both(&snap, IndexKind::IvfFlat, Metric::L2, Some(500), 0).await;
    assert!(
        (2..=64).contains(&streamed.stats.groups),
        "{:?}",
        streamed.stats
    );
}

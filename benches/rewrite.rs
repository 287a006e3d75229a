//! Rewrites that keep indexes: COMPACT and RECLUSTER throughput, the reuse ledger's open time
//! and memory, batch translation through a chain of transitions, and KNN latency on
//! translated segments next to rebuilt ones.
//!
//! `cargo bench --bench rewrite` (release). Sizes: `FRAGVEC_BENCH_COMPACT_ROWS` (10M rows in
//! 1000 fragments), `FRAGVEC_BENCH_ROWS` (200K × 128 vectors for the KNN parts).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use fragvec::format::Manifest;
use fragvec::format::manifest::TableProperties;
use fragvec::format::row_map_file::RowMapFile;
use fragvec::index::distance::l2_squared;
use fragvec::ledger::ids::row_address;
use fragvec::ledger::row_map::{
    BlockLabels, DEFAULT_BLOCK_ROWS, RowMapFooter, RowMapWriter, SourceRows, translate_sorted,
};
use fragvec::ledger::{
    FragmentDigest, LedgerView, LoadedMapping, LoadedTransition, Mapping, OrderedRemap,
    PartitionMap, Transition,
};
use object_store::ObjectStoreExt;
use rand::{Rng, SeedableRng};
use roaring::RoaringBitmap;

const DIM: usize = 128;
const BLOBS: usize = 256;
const K: usize = 10;
const QUERIES: usize = 100;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn digest(id: u64, rows: u64, deleted: u64) -> FragmentDigest {
    FragmentDigest {
        id,
        physical_rows: rows,
        deleted_rows: deleted,
    }
}

/// 1,000 compactions of two 1M-row fragments each, as a manifest would hold them.
fn ledger_manifest() -> Manifest {
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
    let mut m = Manifest::new_table(&schema, TableProperties::default(), "b".into()).unwrap();
    for i in 0..1000u64 {
        m.reuse_ledger.push(Transition {
            id: i,
            source_version: 1,
            committed_version: 2,
            sources: vec![digest(2 * i, 1 << 20, 0), digest(2 * i + 1, 1 << 20, 0)],
            destinations: vec![digest(2000 + i, 2 << 20, 0)],
            mapping: Mapping::OrderedCompaction {
                removed: vec![None, None],
                removed_crc32c: vec![None; 2],
            },
        });
    }
    m.next_transition_id = 1000;
    m.next_fragment_id = 3000;
    m.reader_features.insert("reuse_ledger".into());
    m.writer_features.insert("reuse_ledger".into());
    m
}

/// A row map held in memory, for the translation benchmark (the file layer adds IO only).
#[derive(Debug)]
struct MemoryRowMap {
    footer: RowMapFooter,
    blocks: Vec<BlockLabels>,
}

#[async_trait]
impl PartitionMap for MemoryRowMap {
    async fn lookup(&self, positions: &[u64]) -> fragvec::ledger::Result<Vec<Option<(u16, u32)>>> {
        Ok(translate_sorted(self.footer.counts(), positions, |b| {
            self.blocks.get(b)
        })?)
    }
}

/// Ordered compaction → stable partition → ordered compaction over `rows` rows.
fn chain(rows: u64, rng: &mut impl Rng) -> LedgerView {
    // 1: fragment 0 (10% deleted) + fragment 1 → fragment 2.
    let removed: RoaringBitmap = (0..rows as u32).filter(|o| o % 10 == 3).collect();
    let live0 = rows - removed.len();
    let t1 = Transition {
        id: 1,
        source_version: 1,
        committed_version: 2,
        sources: vec![digest(0, rows, removed.len()), digest(1, 1000, 0)],
        destinations: vec![digest(2, live0 + 1000, 0)],
        mapping: Mapping::OrderedCompaction {
            removed: vec![Some("d0".into()), None],
            removed_crc32c: vec![None; 2],
        },
    };
    // 2: fragment 2 → 64 destinations (10..74), labels uniform at random.
    let n2 = live0 + 1000;
    let labels: Vec<u16> = (0..n2).map(|_| rng.random_range(0..64u16)).collect();
    let mut per = vec![0u64; 64];
    for l in &labels {
        per[*l as usize] += 1;
    }
    let sources = [SourceRows {
        physical_rows: n2,
        deleted: vec![],
    }];
    let mut w = RowMapWriter::new(&sources, 64, DEFAULT_BLOCK_ROWS).unwrap();
    w.push_all(&labels).unwrap();
    let bytes = w.finish(&per).unwrap();
    let footer = RowMapFooter::decode(&bytes, bytes.len() as u64).unwrap();
    let blocks = (0..footer.num_blocks())
        .map(|b| {
            let r = footer.block_range(b);
            footer
                .decode_block(b, &bytes[r.start as usize..r.end as usize])
                .unwrap()
        })
        .collect();
    let t2 = Transition {
        id: 2,
        source_version: 2,
        committed_version: 3,
        sources: vec![digest(2, n2, 0)],
        destinations: (0..64)
            .map(|d| digest(10 + d, per[d as usize], 0))
            .collect(),
        mapping: Mapping::StablePartition {
            row_map: "m".into(),
            size_bytes: bytes.len() as u64,
        },
    };
    // 3: all 64 destinations → one fragment 100.
    let t3 = Transition {
        id: 3,
        source_version: 3,
        committed_version: 4,
        sources: (0..64)
            .map(|d| digest(10 + d, per[d as usize], 0))
            .collect(),
        destinations: vec![digest(100, n2, 0)],
        mapping: Mapping::OrderedCompaction {
            removed: vec![None; 64],
            removed_crc32c: vec![None; 64],
        },
    };
    let ordered = |t: &Transition, removed: Vec<RoaringBitmap>| LoadedTransition {
        mapping: LoadedMapping::Ordered(OrderedRemap::new(t, removed).unwrap()),
        transition: t.clone(),
    };
    LedgerView::new(vec![
        ordered(&t1, vec![removed, RoaringBitmap::new()]),
        LoadedTransition {
            mapping: LoadedMapping::Partition(Arc::new(MemoryRowMap { footer, blocks })),
            transition: t2,
        },
        ordered(&t3, vec![RoaringBitmap::new(); 64]),
    ])
    .unwrap()
}

/// A 2M-row map over 20 sources (1/8 deleted) into 1,000 destinations, uniform labels.
fn file_map(rng: &mut impl Rng) -> (Vec<u8>, Transition) {
    let sources: Vec<SourceRows> = (0..20)
        .map(|_| SourceRows {
            physical_rows: 100_000,
            deleted: (0..100_000u32).filter(|o| o % 8 == 5).collect(),
        })
        .collect();
    let live: u64 = sources
        .iter()
        .map(|s| s.physical_rows - s.deleted.len() as u64)
        .sum();
    let labels: Vec<u16> = (0..live).map(|_| rng.random_range(0..1000u16)).collect();
    let mut per = vec![0u64; 1000];
    for l in &labels {
        per[*l as usize] += 1;
    }
    let mut w = RowMapWriter::new(&sources, 1000, DEFAULT_BLOCK_ROWS).unwrap();
    w.push_all(&labels).unwrap();
    let bytes = w.finish(&per).unwrap();
    let t = Transition {
        id: 0,
        source_version: 1,
        committed_version: 2,
        sources: sources
            .iter()
            .enumerate()
            .map(|(i, s)| digest(i as u64, s.physical_rows, s.deleted.len() as u64))
            .collect(),
        destinations: per
            .iter()
            .enumerate()
            .map(|(d, n)| digest(100 + d as u64, *n, 0))
            .collect(),
        mapping: Mapping::StablePartition {
            row_map: "_rowmaps/m.rmap".into(),
            size_bytes: bytes.len() as u64,
        },
    };
    (bytes, t)
}

fn p50(mut lat: Vec<Duration>) -> f64 {
    lat.sort();
    lat[lat.len() / 2].as_secs_f64() * 1e3
}

struct Knn {
    p50_ms: f64,
    recall: f64,
    fragments_read: f64,
}

async fn knn(
    session: &fragvec::FragvecSession,
    queries: &[Vec<f32>],
    truth: &[Vec<i64>],
) -> Result<Knn> {
    // One pass to warm the caches (partitions, their translations), then the measured pass.
    for q in queries {
        let sql = format!(
            "SELECT id FROM t ORDER BY l2_distance(emb, {}) LIMIT {K}",
            common::literal(q)
        );
        session.sql_one(&sql).await?;
    }
    let mut lat = Vec::new();
    let mut hits = 0usize;
    for (q, t) in queries.iter().zip(truth) {
        let sql = format!(
            "SELECT id FROM t ORDER BY l2_distance(emb, {}) LIMIT {K}",
            common::literal(q)
        );
        let start = Instant::now();
        let r = session.sql_one(&sql).await?;
        lat.push(start.elapsed());
        for b in &r.batches {
            hits += b
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .filter(|id| t.contains(id))
                .count();
        }
    }
    // Fragments whose rows a query reads, from EXPLAIN ANALYZE's metrics.
    let mut read = 0usize;
    for q in queries.iter().take(20) {
        let sql = format!(
            "EXPLAIN ANALYZE SELECT id FROM t ORDER BY l2_distance(emb, {}) LIMIT {K}",
            common::literal(q)
        );
        let r = session.sql_one(&sql).await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)?.to_string();
        if let Some(at) = text.find("fragments_read=") {
            let digits: String = text[at + 15..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            read += digits.parse::<usize>().unwrap_or(0);
        }
    }
    Ok(Knn {
        p50_ms: p50(lat),
        recall: hits as f64 / (queries.len() * K) as f64,
        fragments_read: read as f64 / 20.0,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);

    // --- The ledger: open time and memory with 1,000 transitions ---------------------------
    let manifest = ledger_manifest();
    let bytes = manifest.encode();
    let rss0 = rss_bytes();
    let start = Instant::now();
    let decoded = Manifest::decode(&bytes, "bench", "bench").unwrap();
    let view = LedgerView::new(
        decoded
            .reuse_ledger
            .iter()
            .map(|t| LoadedTransition {
                mapping: LoadedMapping::Ordered(
                    OrderedRemap::new(t, vec![RoaringBitmap::new(); t.sources.len()]).unwrap(),
                ),
                transition: t.clone(),
            })
            .collect(),
    )
    .unwrap();
    let open = start.elapsed();
    let rss1 = rss_bytes();
    println!(
        "ledger, 1,000 transitions over 2,000 x 1Mi-row sources: manifest {} KiB, decode + \
         validate + load {:.2} ms, resident memory +{:.1} MiB",
        bytes.len() / 1024,
        open.as_secs_f64() * 1e3,
        rss1.saturating_sub(rss0) as f64 / (1 << 20) as f64
    );
    drop(view);

    // --- Batch translation through ordered -> stable partition -> ordered --------------------
    let rows = 2_000_000u64;
    let chain = chain(rows, &mut rng);
    let addrs: Vec<u64> = (0..rows).map(|o| row_address(0, o)).collect();
    let start = Instant::now();
    let out = chain.translate(&addrs).await.unwrap();
    let t = start.elapsed();
    let moved = out.iter().flatten().count();
    println!(
        "batch translation, chain of 3 (ordered, stable partition, ordered): {} rows in {:.1} ms \
         = {:.1} M rows/s ({moved} moved, {} deleted)",
        rows,
        t.as_secs_f64() * 1e3,
        rows as f64 / t.as_secs_f64() / 1e6,
        rows as usize - moved
    );

    // --- Point translation from a row-map file on local disk (one block read + decode + rank)
    let tmp_map = tempfile::tempdir()?;
    let db = fragvec::format::Database::open(tmp_map.path().to_str().unwrap()).await?;
    let dir = db.table("m")?;
    let (bytes, t) = file_map(&mut rng);
    dir.store()
        .put(&dir.path("_rowmaps/m.rmap"), bytes.clone().into())
        .await
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    let file = RowMapFile::open(&dir, "_rowmaps/m.rmap", bytes.len() as u64, &t).await?;
    let total: u64 = t.sources.iter().map(|s| s.physical_rows).sum();
    let mut lat = Vec::new();
    for _ in 0..200 {
        let row = rng.random_range(0..total);
        file.clear_blocks();
        let start = Instant::now();
        std::hint::black_box(file.lookup(&[row]).await.unwrap());
        lat.push(start.elapsed());
    }
    println!(
        "row map on local disk ({} MiB, 2M rows, 1000 destinations): point translation p50 {:.1} µs \
         (cold block: one range read + decode + rank)",
        bytes.len() >> 20,
        p50(lat) * 1e3
    );

    // --- COMPACT throughput ----------------------------------------------------------------
    let total = env("FRAGVEC_BENCH_COMPACT_ROWS", 10_000_000);
    let per = total / 1000;
    let tmp = tempfile::tempdir()?;
    let session = fragvec::FragvecSession::open(tmp.path().join("c").to_str().unwrap()).await?;
    session
        .sql("CREATE TABLE c (id BIGINT NOT NULL, x DOUBLE)")
        .await?;
    for f in 0..1000 {
        session
            .sql(&format!(
                "INSERT INTO c SELECT value, value * 0.5 FROM generate_series({}, {})",
                f * per,
                (f + 1) * per - 1
            ))
            .await?;
    }
    let start = Instant::now();
    session.sql("COMPACT c").await?;
    let t = start.elapsed();
    println!(
        "COMPACT {} rows in 1000 fragments (BIGINT, DOUBLE): {:.2} s = {:.2} M rows/s",
        total,
        t.as_secs_f64(),
        total as f64 / t.as_secs_f64() / 1e6
    );
    drop(session);

    // --- KNN on translated segments vs a rebuilt index; RECLUSTER vs RECLUSTER + rebuild ------
    let n = env("FRAGVEC_BENCH_ROWS", 200_000);
    let (data, queries) = common::clustered(&mut rng, n, DIM, BLOBS, QUERIES);
    let truth: Vec<Vec<i64>> = queries
        .iter()
        .map(|q| {
            let mut s: Vec<(f32, i64)> = data
                .chunks_exact(DIM)
                .enumerate()
                .map(|(i, v)| (l2_squared(q, v), i as i64))
                .collect();
            s.select_nth_unstable_by(K - 1, |a, b| a.0.total_cmp(&b.0));
            s.truncate(K);
            s.into_iter().map(|x| x.1).collect()
        })
        .collect();
    let ctx = SessionContext::new();
    let (src, fragments) = common::vector_table(&data, DIM, 1000)?;
    ctx.register_table("src", Arc::new(src))?;
    let session = fragvec::register(&ctx, tmp.path().join("k").to_str().unwrap()).await?;
    session
        .sql(&format!(
            "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR({DIM}))"
        ))
        .await?;
    for f in 0..fragments {
        session
            .sql(&format!(
                "INSERT INTO t SELECT * FROM src WHERE id >= {} AND id < {}",
                f * 1000,
                (f + 1) * 1000
            ))
            .await?;
    }
    session
        .sql("CREATE VECTOR INDEX t_idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 256)")
        .await?;
    println!(
        "KNN data: {n} x {DIM} in {fragments} fragments, {QUERIES} queries, k = {K}, default nprobes"
    );
    let report = |label: &str, k: &Knn| {
        println!(
            "  {label:<40} recall@10 {:.3}  p50 {:.2} ms  fragments read/query {:.1}",
            k.recall, k.p50_ms, k.fragments_read
        )
    };
    let before = knn(&session, &queries, &truth).await?;
    report("before rewrites", &before);
    let start = Instant::now();
    session.sql("COMPACT t").await?;
    let compact_time = start.elapsed();
    let after_compact = knn(&session, &queries, &truth).await?;
    report("after COMPACT (translated segment)", &after_compact);
    let start = Instant::now();
    session.sql("OPTIMIZE INDEX t_idx ON t RETRAIN").await?;
    let rebuild = start.elapsed();
    let rebuilt = knn(&session, &queries, &truth).await?;
    report("after a full rebuild (RETRAIN)", &rebuilt);
    println!(
        "  COMPACT {:.2} s; rebuild {:.2} s; KNN p50 translated / rebuilt = {:.2}",
        compact_time.as_secs_f64(),
        rebuild.as_secs_f64(),
        after_compact.p50_ms / rebuilt.p50_ms
    );
    // Scatter the rows again (RECLUSTER by a hash of id), then cluster them by IVF partition.
    let start = Instant::now();
    session
        .sql("RECLUSTER t BY (id * 7919 % 1000) WITH (target_rows_per_fragment = 1000)")
        .await?;
    let scalar = start.elapsed();
    let start = Instant::now();
    session.sql("OPTIMIZE INDEX t_idx ON t RETRAIN").await?;
    let rebuild = start.elapsed();
    println!(
        "  RECLUSTER by a scalar key {:.2} s (index kept) vs RECLUSTER + rebuild {:.2} s = {:.1}x",
        scalar.as_secs_f64(),
        (scalar + rebuild).as_secs_f64(),
        (scalar + rebuild).as_secs_f64() / scalar.as_secs_f64()
    );
    let scattered = knn(&session, &queries, &truth).await?;
    report("scattered, freshly indexed", &scattered);
    let start = Instant::now();
    session
        .sql("RECLUSTER t BY (ivf_partition(emb)) WITH (target_rows_per_fragment = 1000)")
        .await?;
    let recluster = start.elapsed();
    let clustered = knn(&session, &queries, &truth).await?;
    report("after RECLUSTER BY ivf_partition", &clustered);
    let start = Instant::now();
    session.sql("OPTIMIZE INDEX t_idx ON t RETRAIN").await?;
    let rebuild = start.elapsed();
    println!(
        "  RECLUSTER {:.2} s (index kept) vs RECLUSTER + rebuild {:.2} s = {:.1}x; KNN p50 after / \
         before RECLUSTER = {:.2}; fragments read per query {:.1} -> {:.1}",
        recluster.as_secs_f64(),
        (recluster + rebuild).as_secs_f64(),
        (recluster + rebuild).as_secs_f64() / recluster.as_secs_f64(),
        clustered.p50_ms / scattered.p50_ms,
        scattered.fragments_read,
        clustered.fragments_read
    );
    Ok(())
}

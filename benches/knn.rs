//! KNN through SQL on clustered data: index build time, recall@10 and latency per nprobes,
//! exact search next to a plain in-memory brute-force loop, and filtered KNN.
//!
//! `cargo bench --bench knn` (release). 200K × 128 by default (`FRAGVEC_BENCH_ROWS`), 256
//! Gaussian blobs, fixed seed; 200 queries near the data.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use fragvec::index::distance::l2_squared;
use rand::{Rng, SeedableRng};

const DIM: usize = 128;
const BLOBS: usize = 256;
const K: usize = 10;
const QUERIES: usize = 200;

fn gaussian(rng: &mut impl Rng) -> f32 {
    // Box-Muller.
    let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-9), rng.random());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f32::consts::PI * v).cos()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Exact top-k ids by brute force over the in-memory vectors.
fn brute_force(data: &[f32], q: &[f32], keep: impl Fn(usize) -> bool) -> Vec<i64> {
    let mut scored: Vec<(f32, usize)> = data
        .chunks_exact(DIM)
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .map(|(i, v)| (l2_squared(q, v), i))
        .collect();
    let k = K.min(scored.len());
    if k == 0 {
        return vec![];
    }
    scored.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
    scored.truncate(k);
    scored.into_iter().map(|(_, i)| i as i64).collect()
}

fn literal(q: &[f32]) -> String {
    let parts: Vec<String> = q.iter().map(|x| format!("{x:.6}")).collect();
    format!("[{}]", parts.join(", "))
}

async fn ids(session: &fragvec::FragvecSession, sql: &str) -> Result<(Vec<i64>, Duration)> {
    let t = Instant::now();
    let result = session.sql_one(sql).await?;
    let elapsed = t.elapsed();
    let ids = result
        .batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    Ok((ids, elapsed))
}

fn recall(found: &[i64], truth: &[i64]) -> f64 {
    if truth.is_empty() {
        return 1.0;
    }
    found.iter().filter(|i| truth.contains(i)).count() as f64 / truth.len() as f64
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let rows: usize = std::env::var("FRAGVEC_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let centers: Vec<f32> = (0..BLOBS * DIM)
        .map(|_| rng.random::<f32>() * 10.0)
        .collect();
    let mut data = Vec::with_capacity(rows * DIM);
    for _ in 0..rows {
        let b = rng.random_range(0..BLOBS);
        for d in 0..DIM {
            data.push(centers[b * DIM + d] + gaussian(&mut rng));
        }
    }
    let queries: Vec<Vec<f32>> = (0..QUERIES)
        .map(|_| {
            let i = rng.random_range(0..rows);
            data[i * DIM..(i + 1) * DIM]
                .iter()
                .map(|x| x + 0.5 * gaussian(&mut rng))
                .collect()
        })
        .collect();

    let tmp = tempfile::tempdir()?;
    let ctx = SessionContext::new();
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "emb",
            DataType::FixedSizeList(item.clone(), DIM as i32),
            true,
        ),
    ]));
    let mut batches = Vec::new();
    for start in (0..rows).step_by(8192) {
        let n = 8192.min(rows - start);
        let ids = Int64Array::from_iter_values(start as i64..(start + n) as i64);
        let values = Float32Array::from(data[start * DIM..(start + n) * DIM].to_vec());
        let emb = FixedSizeListArray::new(item.clone(), DIM as i32, Arc::new(values), None);
        batches.push(RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(ids), Arc::new(emb)],
        )?);
    }
    ctx.register_table("src", Arc::new(MemTable::try_new(schema, vec![batches])?))?;
    let session = fragvec::register(&ctx, tmp.path().join("db").to_str().unwrap()).await?;
    session.sql(&format!("CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR({DIM})); INSERT INTO t SELECT * FROM src")).await?;
    let t = Instant::now();
    session
        .sql("CREATE VECTOR INDEX t_idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 256)")
        .await?;
    let build = t.elapsed();
    println!("data: {rows} x {DIM}, {BLOBS} blobs; {QUERIES} queries, k = {K}");
    println!(
        "IVF_FLAT build (256 partitions): {:.2} s",
        build.as_secs_f64()
    );

    let truth: Vec<Vec<i64>> = queries
        .iter()
        .map(|q| brute_force(&data, q, |_| true))
        .collect();
    println!(
        "{:<28} {:>9} {:>10} {:>10}",
        "mode", "recall@10", "p50 ms", "p95 ms"
    );
    let run = |label: String, setting: String, filter: &'static str, keep: fn(usize) -> bool| {
        let session = session.clone();
        let queries = queries.clone();
        let data = &data;
        let truth = &truth;
        async move {
            session.sql(&setting).await?;
            let mut lat = Vec::new();
            let mut rec = 0.0;
            let mut short = 0;
            for (i, q) in queries.iter().enumerate() {
                let sql = format!(
                    "SELECT id FROM t {filter} ORDER BY l2_distance(emb, {}) LIMIT {K}",
                    literal(q)
                );
                let (found, d) = ids(&session, &sql).await?;
                let expected = if filter.is_empty() {
                    truth[i].clone()
                } else {
                    brute_force(data, q, keep)
                };
                if found.len() < expected.len() {
                    short += 1;
                }
                rec += recall(&found, &expected);
                lat.push(d);
            }
            lat.sort();
            println!(
                "{label:<28} {:>9.3} {:>10.3} {:>10.3}{}",
                rec / queries.len() as f64,
                percentile(&lat, 0.5).as_secs_f64() * 1e3,
                percentile(&lat, 0.95).as_secs_f64() * 1e3,
                if short > 0 {
                    format!("  ({short} short answers)")
                } else {
                    String::new()
                }
            );
            Ok::<_, datafusion::error::DataFusionError>(())
        }
    };
    for nprobes in [1, 4, 8, 16, 32] {
        run(
            format!("IVF_FLAT nprobes={nprobes}"),
            format!("SET fragvec.nprobes = {nprobes}"),
            "",
            |_| true,
        )
        .await?;
    }
    run(
        "default nprobes, 10% filter".into(),
        "SET fragvec.nprobes = 16".into(),
        "WHERE id % 10 = 0",
        |i| i % 10 == 0,
    )
    .await?;
    run(
        "default nprobes, 0.1% filter".into(),
        "SET fragvec.nprobes = 16".into(),
        "WHERE id % 1000 = 0",
        |i| i % 1000 == 0,
    )
    .await?;
    run(
        "exact (fragvec.exact)".into(),
        "SET fragvec.exact = true".into(),
        "",
        |_| true,
    )
    .await?;
    session.sql("SET fragvec.exact = false").await?;

    // Where the time of one query goes: parsing and planning alone (EXPLAIN runs nothing).
    let mut lat = Vec::new();
    for q in &queries {
        let sql = format!(
            "EXPLAIN SELECT id FROM t ORDER BY l2_distance(emb, {}) LIMIT {K}",
            literal(q)
        );
        let t = Instant::now();
        session.sql_one(&sql).await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "{:<28} {:>9} {:>10.3} {:>10.3}",
        "parse + plan only (EXPLAIN)",
        "-",
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.95).as_secs_f64() * 1e3
    );

    // The plain loop the exact search is compared with: same vectors, in memory.
    let mut lat = Vec::new();
    for q in &queries {
        let t = Instant::now();
        std::hint::black_box(brute_force(&data, q, |_| true));
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "{:<28} {:>9} {:>10.3} {:>10.3}",
        "in-memory brute-force loop",
        "1.000",
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.95).as_secs_f64() * 1e3
    );
    Ok(())
}

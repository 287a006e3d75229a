//! KNN through SQL on clustered data: index build time, recall@10 and latency per nprobes,
//! exact search next to a plain in-memory brute-force loop, and filtered KNN.
//!
//! `cargo bench --bench knn` (release). 200K × 128 by default (`FRAGVEC_BENCH_ROWS`), 256
//! Gaussian blobs, fixed seed; 200 queries near the data.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use fragvec::index::distance::l2_squared;
use rand::SeedableRng;

const DIM: usize = 128;
const BLOBS: usize = 256;
const K: usize = 10;
const QUERIES: usize = 200;

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
    let (data, queries) = common::clustered(&mut rng, rows, DIM, BLOBS, QUERIES);

    let tmp = tempfile::tempdir()?;
    let ctx = SessionContext::new();
    let (src, _) = common::vector_table(&data, DIM, 8192)?;
    ctx.register_table("src", Arc::new(src))?;
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
                    common::literal(q)
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
            common::literal(q)
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

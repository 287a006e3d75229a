//! Queries over 0 (single node), 1, 2 and 4 `fragvec worker` processes on this machine:
//! KNN (k = 10, IVF_FLAT, four segments) and a full-table aggregate over 1M rows. Prints
//! throughput and p50 per worker count, and where the time goes: planning (EXPLAIN), the
//! fixed cost of a distributed query that reads nothing (plan shipping, gRPC round trips),
//! and the rest (search or scan on the workers, merging on the coordinator).
//!
//! `cargo bench --bench distributed` (release). 1M × 32 by default (`FRAGVEC_BENCH_ROWS`),
//! 256 Gaussian blobs, fixed seed; 100 KNN queries and 7 aggregates per configuration.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;
use rand::SeedableRng;

const DIM: usize = 32;
const BLOBS: usize = 256;
const K: usize = 10;
const QUERIES: usize = 100;
const AGGREGATES: usize = 7;

struct Worker(Child, String);

impl Worker {
    fn start(exe: &std::path::Path) -> Self {
        let mut child = Command::new(exe)
            .args(["worker", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fragvec worker");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("fragvec worker listening on ")
            .expect("worker prints its URL")
            .to_string();
        Self(child, url)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn p50(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn timed(s: &FragvecSession, sql: &str) -> Result<(String, Duration)> {
    let t = Instant::now();
    let r = s.sql_one(sql).await?;
    let d = t.elapsed();
    Ok((pretty_format_batches(&r.batches)?.to_string(), d))
}

struct Figures {
    knn_p50: Duration,
    knn_qps: f64,
    knn_plan: Duration,
    agg_p50: Duration,
    agg_plan: Duration,
    empty_p50: Duration,
}

async fn measure(
    s: &FragvecSession,
    knn: &[String],
    aggregate: &str,
    expected: Option<&(Vec<String>, String)>,
) -> Result<(Figures, (Vec<String>, String))> {
    // Warm up: index partitions, vector columns, connections.
    for q in knn.iter().take(10) {
        timed(s, q).await?;
    }
    timed(s, aggregate).await?;
    let mut answers = Vec::new();
    let mut lat = Vec::new();
    let start = Instant::now();
    for q in knn {
        let (out, d) = timed(s, q).await?;
        answers.push(out);
        lat.push(d);
    }
    let knn_qps = knn.len() as f64 / start.elapsed().as_secs_f64();
    let mut agg = Vec::new();
    let mut agg_answer = String::new();
    for _ in 0..AGGREGATES {
        let (out, d) = timed(s, aggregate).await?;
        agg_answer = out;
        agg.push(d);
    }
    if let Some((knn_expected, agg_expected)) = expected {
        let same = answers
            .iter()
            .zip(knn_expected)
            .filter(|(a, b)| a == b)
            .count();
        assert_eq!(same, knn.len(), "KNN answers differ from single node");
        assert_eq!(
            &agg_answer, agg_expected,
            "aggregate differs from single node"
        );
    }
    let mut plan = Vec::new();
    for q in knn.iter().take(20) {
        plan.push(timed(s, &format!("EXPLAIN {q}")).await?.1);
    }
    let knn_plan = p50(plan);
    let mut plan = Vec::new();
    for _ in 0..10 {
        plan.push(timed(s, &format!("EXPLAIN {aggregate}")).await?.1);
    }
    let agg_plan = p50(plan);
    let mut empty = Vec::new();
    for _ in 0..20 {
        empty.push(
            timed(s, "SELECT g, count(*) FROM t WHERE id < 0 GROUP BY g")
                .await?
                .1,
        );
    }
    Ok((
        Figures {
            knn_p50: p50(lat),
            knn_qps,
            knn_plan,
            agg_p50: p50(agg),
            agg_plan,
            empty_p50: p50(empty),
        },
        (answers, agg_answer),
    ))
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let rows: usize = std::env::var("FRAGVEC_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir()?;
    // The binary is copied first: other builds may replace the one in the target folder.
    let exe = tmp.path().join("fragvec");
    std::fs::copy(env!("CARGO_BIN_EXE_fragvec"), &exe)?;
    let location = tmp.path().join("db").to_str().unwrap().to_string();

    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (data, queries) = common::clustered(&mut rng, rows, DIM, BLOBS, QUERIES);
    let ctx = SessionContext::new();
    let (src, _) = common::vector_table(&data, DIM, 8192)?;
    ctx.register_table("src", Arc::new(src))?;
    let loader = fragvec::register(&ctx, &location).await?;
    let quarter = rows / 4;
    let t = Instant::now();
    loader
        .sql(&format!(
            "CREATE TABLE t (id BIGINT NOT NULL, g BIGINT, emb VECTOR({DIM})) \
             WITH (max_rows_per_fragment = {}); \
             INSERT INTO t SELECT id, id % 16, emb FROM src WHERE id < {quarter}; \
             CREATE VECTOR INDEX t_idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 256)",
            rows / 16
        ))
        .await?;
    for part in 1..4 {
        loader
            .sql(&format!(
                "INSERT INTO t SELECT id, id % 16, emb FROM src \
                 WHERE id >= {} AND id < {}; OPTIMIZE INDEX t_idx ON t APPEND",
                part * quarter,
                if part == 3 {
                    rows
                } else {
                    (part + 1) * quarter
                }
            ))
            .await?;
    }
    drop(loader);
    println!(
        "data: {rows} x {DIM} in 16 fragments, IVF_FLAT (256 partitions) in 4 segments; \
         loaded in {:.1} s; {QUERIES} KNN queries (k = {K}, nprobes 16), {AGGREGATES} aggregates",
        t.elapsed().as_secs_f64()
    );
    let knn: Vec<String> = queries
        .iter()
        .map(|q| {
            format!(
                "SELECT id FROM t ORDER BY l2_distance(emb, {}) LIMIT {K}",
                common::literal(q)
            )
        })
        .collect();
    let aggregate = format!(
        "SELECT g, count(*), sum(id), sum(CASE WHEN l2_distance(emb, {}) < 10 THEN 1 ELSE 0 END) \
         FROM t GROUP BY g ORDER BY g",
        common::literal(&queries[0])
    );

    println!(
        "{:<14} {:>9} {:>9} {:>10} {:>10} {:>11} {:>11} {:>13}",
        "workers",
        "KNN q/s",
        "KNN p50",
        "KNN plan",
        "agg p50",
        "agg Mrows/s",
        "agg plan",
        "empty query"
    );
    let single = FragvecSession::open(&location).await?;
    let (base, expected) = measure(&single, &knn, &aggregate, None).await?;
    let print = |label: &str, f: &Figures| {
        println!(
            "{label:<14} {:>9.1} {:>7.2}ms {:>8.2}ms {:>8.1}ms {:>11.2} {:>9.2}ms {:>11.2}ms",
            f.knn_qps,
            ms(f.knn_p50),
            ms(f.knn_plan),
            ms(f.agg_p50),
            rows as f64 / f.agg_p50.as_secs_f64() / 1e6,
            ms(f.agg_plan),
            ms(f.empty_p50),
        )
    };
    print("none (local)", &base);
    for n in [1, 2, 4] {
        let workers: Vec<Worker> = (0..n).map(|_| Worker::start(&exe)).collect();
        let urls: Vec<String> = workers.iter().map(|w| w.1.clone()).collect();
        let s = FragvecSession::with_workers(&location, &urls).await?;
        let (f, _) = measure(&s, &knn, &aggregate, Some(&expected)).await?;
        print(&format!("{n}"), &f);
    }
    Ok(())
}

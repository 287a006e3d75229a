//! Scale-out that pays or not: the same queries on one node pinned to one core, one node on
//! two cores, and a coordinator with two `fragvec worker`s pinned to one core each (the
//! coordinator sharing core 0), so that worker count and CPU grow together (`taskset`).
//!
//! `cargo bench --bench scale_out` (release). Tables: 2M × 32 and 1M × 128 (Gaussian blobs,
//! fixed seed; `FRAGVEC_SCALE_ROWS=rows32,rows128` to change), each with an IVF_FLAT index of
//! four segments and a copy merged into one segment. Queries: a distance-heavy scan
//! aggregate, a filtered count, exact KNN, KNN at nprobes 16 and 64 on either index, and KNN
//! throughput at 1, 4 and 16 concurrent queries. Every figure is the median of three runs
//! (each run the median of its queries); answers are checked against the single node's.
//! After the KNN mix each worker's index cache is reported (workers print it on SIGUSR1).
//! `FRAGVEC_SCALE_ONLY=text` measures only the queries whose names contain it;
//! `FRAGVEC_SCALE_DIR=dir` keeps the tables in `dir` and reuses them in the next run.
//!
//! Each configuration runs in a child process (this binary again, with `--measure`) under
//! `taskset`, so that DataFusion's partitions and tokio's threads see only the pinned cores.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;
use rand::SeedableRng;

const BLOBS: usize = 256;
const K: usize = 10;
const QUERIES: usize = 24;
const RUNS: usize = 3;

/// A `fragvec worker` pinned to `cores`, killed when dropped.
struct Worker {
    child: Child,
    out: BufReader<ChildStdout>,
    url: String,
}

impl Worker {
    fn start(exe: &std::path::Path, cores: &str) -> Self {
        let mut child = Command::new("taskset")
            .args(["-c", cores])
            .arg(exe)
            .args(["worker", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fragvec worker under taskset");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("fragvec worker listening on ")
            .expect("worker prints its URL")
            .to_string();
        Self { child, out, url }
    }

    /// Bytes the worker's index caches hold (it prints them on SIGUSR1).
    fn cache_bytes(&mut self) -> usize {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-USR1", &pid])
            .status()
            .expect("signal worker");
        let mut total = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if self.out.read_line(&mut line).unwrap_or(0) == 0 {
                return total;
            }
            let Some(rest) = line.trim().strip_prefix("fragvec worker cache: ") else {
                continue;
            };
            if rest == "end" {
                return total;
            }
            total += rest
                .rsplit(' ')
                .next()
                .and_then(|b| b.parse::<usize>().ok())
                .unwrap_or(0);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut d: Vec<f64>) -> f64 {
    d.sort_by(f64::total_cmp);
    d[d.len() / 2]
}

/// The queries of one table, by name (the KNN ones take a query vector).
struct Workload {
    scans: Vec<(&'static str, String)>,
    knn: Vec<(&'static str, Vec<String>)>,
}

fn workload(table: &str, queries: &[Vec<f32>]) -> Workload {
    let q0 = common::literal(&queries[0]);
    // The settings first, then one query per vector.
    let knn = |idx_table: &str, settings: &str| -> Vec<String> {
        std::iter::once(settings.to_string())
            .chain(queries.iter().map(|q| {
                format!(
                    "SELECT id FROM {idx_table} ORDER BY l2_distance(emb, {}) LIMIT {K}",
                    common::literal(q)
                )
            }))
            .collect()
    };
    Workload {
        scans: vec![
            (
                "scan aggregate",
                format!(
                    "SELECT cat, round(avg(l2_distance(emb, {q0})), 3) FROM {table}_4 GROUP BY cat ORDER BY cat"
                ),
            ),
            (
                "filtered count",
                format!("SELECT count(*) FROM {table}_4 WHERE l2_distance(emb, {q0}) < 2.5"),
            ),
        ],
        knn: vec![
            (
                "exact KNN, 1 segment",
                knn(&format!("{table}_1"), "SET fragvec.exact = true;"),
            ),
            (
                "KNN nprobes 16, 4 segments",
                knn(
                    &format!("{table}_4"),
                    "SET fragvec.exact = false; SET fragvec.nprobes = 16;",
                ),
            ),
            (
                "KNN nprobes 64, 4 segments",
                knn(
                    &format!("{table}_4"),
                    "SET fragvec.exact = false; SET fragvec.nprobes = 64;",
                ),
            ),
            (
                "KNN nprobes 16, 1 segment",
                knn(
                    &format!("{table}_1"),
                    "SET fragvec.exact = false; SET fragvec.nprobes = 16;",
                ),
            ),
            (
                "KNN nprobes 64, 1 segment",
                knn(
                    &format!("{table}_1"),
                    "SET fragvec.exact = false; SET fragvec.nprobes = 64;",
                ),
            ),
        ],
    }
}

/// Runs `sql` (statements separated by `;`, the last one's rows returned as text).
async fn run(s: &FragvecSession, sql: &str) -> Result<String> {
    let mut last = String::new();
    for stmt in sql.split(';').map(str::trim).filter(|x| !x.is_empty()) {
        let r = s.sql_one(stmt).await?;
        last = pretty_format_batches(&r.batches)?.to_string();
    }
    Ok(last)
}

/// The child: opens the session (`workers` empty: one node), runs the workload of each
/// table `RUNS` times, prints `name<TAB>ms<TAB>answer-hash` lines.
async fn measure(location: &str, workers: &[String], tables: &[String]) -> Result<()> {
    let s = if workers.is_empty() {
        FragvecSession::open(location).await?
    } else {
        FragvecSession::with_workers(location, workers).await?
    };
    for table in tables {
        let queries = read_queries(location, table)?;
        let w = workload(table, &queries);
        for (name, sql) in w.scans.iter().filter(|(name, _)| wanted(name)) {
            run(&s, sql).await?; // warm
            let mut times = Vec::new();
            let mut answer = String::new();
            for _ in 0..RUNS {
                let t = Instant::now();
                answer = run(&s, sql).await?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            println!("{table}: {name}\t{:.2}\t{}", median(times), hash(&answer));
        }
        for (name, sqls) in w.knn.iter().filter(|(name, _)| wanted(name)) {
            run(&s, &sqls[0]).await?;
            let sqls = &sqls[1..];
            for sql in sqls.iter().take(4) {
                run(&s, sql).await?; // warm: caches, connections
            }
            let mut runs = Vec::new();
            let mut answers = String::new();
            for _ in 0..RUNS {
                let mut times = Vec::new();
                answers.clear();
                for sql in sqls {
                    let t = Instant::now();
                    answers.push_str(&run(&s, sql).await?);
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
                runs.push(median(times));
            }
            println!("{table}: {name}\t{:.2}\t{}", median(runs), hash(&answers));
        }
        // Throughput: nprobes 16 on the merged index, 1 / 4 / 16 queries at once, each
        // stream on its own session over the same workers.
        let plain: Vec<String> = w.knn[3].1[1..].to_vec();
        for streams in [1usize, 4, 16] {
            if !wanted(&format!("KNN q/s at {streams} concurrent")) {
                continue;
            }
            let mut sessions = Vec::new();
            for _ in 0..streams {
                let s = if workers.is_empty() {
                    FragvecSession::open(location).await?
                } else {
                    FragvecSession::with_workers(location, workers).await?
                };
                s.sql_one("SET fragvec.nprobes = 16").await?;
                run(&s, &plain[0]).await?;
                sessions.push(Arc::new(s));
            }
            let mut rates = Vec::new();
            for _ in 0..RUNS {
                let t = Instant::now();
                let mut tasks = Vec::new();
                for (i, s) in sessions.iter().enumerate() {
                    let s = s.clone();
                    let qs: Vec<String> = plain
                        .iter()
                        .skip(i % plain.len())
                        .chain(plain.iter())
                        .take(plain.len())
                        .cloned()
                        .collect();
                    tasks.push(tokio::spawn(async move {
                        for q in qs {
                            s.sql_one(&q).await?;
                        }
                        Ok::<_, datafusion::error::DataFusionError>(())
                    }));
                }
                for t in tasks {
                    t.await.expect("stream")?;
                }
                rates.push((streams * plain.len()) as f64 / t.elapsed().as_secs_f64());
            }
            println!(
                "{table}: KNN q/s at {streams} concurrent\t{:.1}\t-",
                median(rates)
            );
        }
    }
    // This process's index cache (a one-node run's whole cache; a coordinator's holds no
    // partitions).
    println!("{CACHE_LINE}\t{}\t-", s.index_cache().bytes_held());
    Ok(())
}

/// Whether the query named `name` is measured: all of them, or those whose names contain
/// `FRAGVEC_SCALE_ONLY` (to profile one query, or time it before and after a change).
fn wanted(name: &str) -> bool {
    std::env::var("FRAGVEC_SCALE_ONLY").map_or(true, |only| name.contains(only.as_str()))
}

/// The name of the line a measuring child reports its index cache bytes on.
const CACHE_LINE: &str = "index cache bytes";

fn hash(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Query vectors are stored next to the database, so child processes use the same ones.
fn read_queries(location: &str, table: &str) -> Result<Vec<Vec<f32>>> {
    let text = std::fs::read_to_string(format!("{location}.{table}.queries"))?;
    Ok(text
        .lines()
        .map(|l| l.split(',').map(|x| x.parse::<f32>().unwrap()).collect())
        .collect())
}

async fn load(location: &str, table: &str, rows: usize, dim: usize, seed: u64) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (data, queries) = common::clustered(&mut rng, rows, dim, BLOBS, QUERIES);
    let text: Vec<String> = queries
        .iter()
        .map(|q| {
            q.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let ctx = SessionContext::new();
    let (src, _) = common::vector_table(&data, dim, 8192)?;
    ctx.register_table("src", Arc::new(src))?;
    let loader = fragvec::register(&ctx, location).await?;
    let quarter = rows / 4;
    // 16 fragments; an index of four segments (one per quarter) on t_4, one merged on t_1.
    for suffix in ["4", "1"] {
        loader
            .sql(&format!(
                "CREATE TABLE {table}_{suffix} (id BIGINT NOT NULL, cat BIGINT, emb VECTOR({dim})) \
                 WITH (max_rows_per_fragment = {}); \
                 INSERT INTO {table}_{suffix} SELECT id, id % 16, emb FROM src WHERE id < {quarter}; \
                 CREATE VECTOR INDEX {table}_{suffix}_idx ON {table}_{suffix} (emb) USING IVF_FLAT \
                 WITH (num_partitions = 256)",
                rows / 16
            ))
            .await?;
        for part in 1..4 {
            let end = if part == 3 {
                rows
            } else {
                (part + 1) * quarter
            };
            loader
                .sql(&format!(
                    "INSERT INTO {table}_{suffix} SELECT id, id % 16, emb FROM src \
                     WHERE id >= {} AND id < {end}; OPTIMIZE INDEX {table}_{suffix}_idx ON {table}_{suffix} APPEND",
                    part * quarter
                ))
                .await?;
        }
        if suffix == "1" {
            loader
                .sql(&format!(
                    "OPTIMIZE INDEX {table}_1_idx ON {table}_1 MERGE 4"
                ))
                .await?;
        }
    }
    // Last: a kept directory with this file holds the whole table.
    std::fs::write(format!("{location}.{table}.queries"), text.join("\n"))?;
    Ok(())
}

/// Runs this binary with `--measure` under `taskset -c cores`; its output lines.
fn child(
    cores: &str,
    location: &str,
    workers: &[String],
    tables: &[String],
) -> Vec<(String, f64, String)> {
    let out = Command::new("taskset")
        .args(["-c", cores])
        .arg(std::env::current_exe().expect("this binary"))
        .args(["--measure", location, &workers.join(","), &tables.join(",")])
        .stderr(Stdio::inherit())
        .output()
        .expect("run the measuring child");
    assert!(out.status.success(), "measuring child failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split('\t');
            Some((
                parts.next()?.to_string(),
                parts.next()?.parse().ok()?,
                parts.next()?.to_string(),
            ))
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    if let Some(i) = args.iter().position(|a| a == "--measure") {
        let split = |s: &str| -> Vec<String> {
            s.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        };
        return measure(&args[i + 1], &split(&args[i + 2]), &split(&args[i + 3])).await;
    }
    let rows: Vec<usize> = std::env::var("FRAGVEC_SCALE_ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![2_000_000, 1_000_000]);
    let tmp = tempfile::tempdir()?;
    let exe = tmp.path().join("fragvec");
    std::fs::copy(env!("CARGO_BIN_EXE_fragvec"), &exe)?;
    // FRAGVEC_SCALE_DIR keeps the tables in that directory, loaded by the first run and
    // reused by the next (before and after a change, or under a profiler).
    let kept = std::env::var_os("FRAGVEC_SCALE_DIR").map(std::path::PathBuf::from);
    let base = kept.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&base)?;
    let rows_name: Vec<String> = rows.iter().map(usize::to_string).collect();
    let location = base
        .join(format!("db-{}", rows_name.join("-")))
        .to_str()
        .unwrap()
        .to_string();
    let mut tables = Vec::new();
    for (i, (n, dim)) in rows.iter().zip([32usize, 128]).enumerate() {
        let table = format!("v{dim}");
        if kept.is_some() && std::path::Path::new(&format!("{location}.{table}.queries")).exists() {
            println!("reusing {table} in {location}");
            tables.push(table);
            continue;
        }
        let t = Instant::now();
        load(&location, &table, *n, dim, 20 + i as u64).await?;
        println!(
            "loaded {table}: {n} x {dim}, 16 fragments, IVF_FLAT 256 partitions ({table}_4: 4 segments, {table}_1: merged) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        tables.push(table);
    }
    let one_core = child("0", &location, &[], &tables);
    let two_cores = child("0,1", &location, &[], &tables);
    let mut workers = [Worker::start(&exe, "0"), Worker::start(&exe, "1")];
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let distributed = child("0", &location, &urls, &tables);
    let caches: Vec<usize> = workers.iter_mut().map(Worker::cache_bytes).collect();
    println!(
        "\n{:<44} {:>12} {:>12} {:>14} {:>9} {:>9}",
        "query (ms; q/s for throughput)",
        "1 node 1 core",
        "1 node 2 cores",
        "2 workers 1+1",
        "vs 1 core",
        "vs 2 cores"
    );
    let one_node_cache = one_core
        .iter()
        .find(|(name, _, _)| name == CACHE_LINE)
        .map_or(0.0, |(_, bytes, _)| *bytes);
    for ((name, a, ha), ((_, b, hb), (_, c, hc))) in
        one_core.iter().zip(two_cores.iter().zip(&distributed))
    {
        if name == CACHE_LINE {
            continue;
        }
        let same = ha == hb && hb == hc;
        let throughput = name.contains("q/s");
        let (gain1, gain2) = if throughput {
            (c / a, c / b)
        } else {
            (a / c, b / c)
        };
        println!(
            "{name:<44} {a:>12.2} {b:>12.2} {c:>14.2} {gain1:>8.2}x {gain2:>8.2}x{}",
            if same { "" } else { "  (answers differ!)" }
        );
    }
    println!(
        "\nindex caches after the mix: one node {:.1} MB; the two workers {} MB",
        one_node_cache / 1e6,
        caches
            .iter()
            .map(|b| format!("{:.1}", *b as f64 / 1e6))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    Ok(())
}

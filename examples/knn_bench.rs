//! The KNN benchmark on a data directory that other systems read too (see `bench/README.md`).
//!
//! ```sh
//! python bench/gen_data.py --rows 1000000 --dim 128 --out DATA     # once, fixed seed
//! cargo run --release --example knn_bench -- --data DATA
//! ```
//!
//! Loads `DATA/items.parquet` through SQL (`CREATE EXTERNAL TABLE ... STORED AS PARQUET`, then
//! `INSERT INTO items SELECT ...` into a fragvec table), builds an IVF_FLAT index with √N
//! partitions, runs the 200 queries one at a time through `FragvecSession::sql` and prints
//! load and build time, recall@10 and p50/p95 latency per `nprobes`, filtered KNN
//! (`WHERE category = c`, ~10% of rows), exact KNN (`fragvec.exact = true`), the same KNN
//! through plain `SessionContext::sql`, and peak resident memory (`VmHWM`). Recall is against
//! the float64 ground truth in `gt.npy` / `gt_filtered.npy`. Every query set runs once
//! untimed first (warm caches), then timed. `--json` prints one JSON object per measurement
//! (what `bench/compare.py` reads) instead of the table.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;

const K: usize = 10;

/// The allocator of the `fragvec` binary, so in-process figures compare with `fragvec serve`'s.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(about = "KNN benchmark over a data directory written by bench/gen_data.py")]
struct Args {
    /// Directory with items.parquet, queries.npy, query_category.npy, gt.npy, gt_filtered.npy.
    #[arg(long)]
    data: PathBuf,
    /// Where the fragvec database is created (default: DATA/fragvec-db; replaced each run).
    #[arg(long)]
    db: Option<PathBuf>,
    /// nprobes values of the IVF sweep.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 4, 8, 16, 32])]
    nprobes: Vec<usize>,
    /// nprobes values of the filtered runs.
    #[arg(long, value_delimiter = ',', default_values_t = vec![4, 16])]
    filtered_nprobes: Vec<usize>,
    /// Queries of the exact run (0 skips it).
    #[arg(long, default_value_t = usize::MAX)]
    exact_queries: usize,
    /// IVF partitions (default √rows).
    #[arg(long)]
    partitions: Option<usize>,
    /// Index type: IVF_FLAT (a copy of the floats per partition) or IVF_SQ (codes only;
    /// rows re-ranked from the table's data files).
    #[arg(long, default_value = "IVF_FLAT")]
    index_type: String,
    /// After the build, `RECLUSTER items BY (ivf_partition(emb))`: each partition's rows
    /// together in the data files (the rows IVF_SQ re-ranks are then read from few pages).
    #[arg(long)]
    recluster: bool,
    /// Before the queries (also with `--reuse`), `OPTIMIZE INDEX items_idx ON items MERGE 1`:
    /// one segment holding every row at its current address (after `--recluster`, the
    /// addresses RECLUSTER moved rows to, as maintenance would leave it).
    #[arg(long)]
    merge: bool,
    /// `fragvec.index_cache_bytes` (default: fragvec's default).
    #[arg(long)]
    cache_bytes: Option<usize>,
    /// One JSON object per measurement on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Keep the database after the run.
    #[arg(long)]
    keep: bool,
    /// Query the database a `--keep` run left (no load, no index build) when it exists.
    #[arg(long)]
    reuse: bool,
    /// Concurrent query streams of the throughput run (each a session of its own sharing
    /// the database and index cache, as `fragvec serve`'s connections do); empty skips it.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 4, 16])]
    concurrency: Vec<usize>,
    /// nprobes of the throughput run.
    #[arg(long, default_value_t = 4)]
    concurrency_nprobes: usize,
    /// Seconds each throughput point measures (after a one-second warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Also time each phase of the `SessionContext::sql` path (parse, logical plan, analyze
    /// and optimize, physical plan, execute), p50 over the queries, to stderr.
    #[arg(long)]
    plan_phases: bool,
    /// Also measure what a commit costs the queries after it: this many rounds of a commit
    /// by another session sharing the database (a one-row DELETE, then in a second run a
    /// 100-row INSERT), followed by two queries; p50 / p99 of the first query after the
    /// commit (a new version) and of the second (the same version), at
    /// `--concurrency-nprobes`. Run last: the commits change the table.
    #[arg(long, default_value_t = 0)]
    after_commits: usize,
}

/// A little-endian `.npy` array (version 1–3, C order): its shape and raw element bytes.
struct Npy {
    shape: Vec<usize>,
    descr: String,
    data: Vec<u8>,
}

impl Npy {
    fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|e| DataFusionError::Execution(format!("{}: {e}", path.display())))?;
        let bad = |what: &str| DataFusionError::Execution(format!("{}: {what}", path.display()));
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err(bad("not a .npy file"));
        }
        let (header_len, start) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            2 | 3 => (
                u32::from_le_bytes(bytes[8..12].try_into().expect("4")) as usize,
                12,
            ),
            v => return Err(bad(&format!("unsupported .npy version {v}"))),
        };
        let header = std::str::from_utf8(&bytes[start..start + header_len])
            .map_err(|_| bad("header is not text"))?;
        let field = |name: &str| {
            let at = header
                .find(&format!("'{name}':"))
                .ok_or_else(|| bad(&format!("header lacks {name}")))?;
            Ok::<_, DataFusionError>(header[at + name.len() + 3..].trim_start())
        };
        if field("fortran_order")?.starts_with("True") {
            return Err(bad("Fortran order is not supported"));
        }
        let descr = field("descr")?;
        let descr = descr[1..descr[1..].find('\'').ok_or_else(|| bad("descr"))? + 1].to_string();
        let shape = field("shape")?;
        let shape: Vec<usize> = shape[1..shape.find(')').ok_or_else(|| bad("shape"))?]
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| bad("shape")))
            .collect::<Result<_>>()?;
        let data = bytes[start + header_len..].to_vec();
        let npy = Self { shape, descr, data };
        if npy.data.len() != npy.shape.iter().product::<usize>() * npy.width() {
            return Err(bad("data length does not match the shape"));
        }
        Ok(npy)
    }

    fn width(&self) -> usize {
        self.descr[2..].parse().unwrap_or(0)
    }

    fn rows<T: Copy>(&self, descr: &str, decode: fn(&[u8]) -> T) -> Result<Vec<Vec<T>>> {
        if self.descr != descr {
            return Err(DataFusionError::Execution(format!(
                "expected {descr}, found {}",
                self.descr
            )));
        }
        let cols = self.shape.get(1).copied().unwrap_or(1).max(1);
        let w = self.width();
        Ok(self
            .data
            .chunks_exact(w * cols)
            .map(|row| row.chunks_exact(w).map(decode).collect())
            .collect())
    }
}

/// The query side of a data directory.
struct Workload {
    queries: Vec<Vec<f32>>,
    categories: Vec<i32>,
    truth: Vec<Vec<i64>>,
    truth_filtered: Vec<Vec<i64>>,
    rows: usize,
    dim: usize,
}

impl Workload {
    fn read(dir: &Path) -> Result<Self> {
        let f32s = |b: &[u8]| f32::from_le_bytes(b.try_into().expect("4"));
        let i32s = |b: &[u8]| i32::from_le_bytes(b.try_into().expect("4"));
        let i64s = |b: &[u8]| i64::from_le_bytes(b.try_into().expect("8"));
        let top = |mut ids: Vec<i64>| {
            ids.retain(|i| *i >= 0);
            ids.truncate(K);
            ids
        };
        let queries = Npy::read(&dir.join("queries.npy"))?.rows("<f4", f32s)?;
        let categories = Npy::read(&dir.join("query_category.npy"))?
            .rows("<i4", i32s)?
            .into_iter()
            .map(|r| r[0])
            .collect();
        let truth = Npy::read(&dir.join("gt.npy"))?.rows("<i8", i64s)?;
        let truth_filtered = Npy::read(&dir.join("gt_filtered.npy"))?.rows("<i8", i64s)?;
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("meta.json"))
                .map_err(|e| DataFusionError::Execution(format!("meta.json: {e}")))?,
        )
        .map_err(|e| DataFusionError::Execution(format!("meta.json: {e}")))?;
        let rows = meta["rows"].as_u64().unwrap_or(0) as usize;
        Ok(Self {
            dim: queries.first().map_or(0, Vec::len),
            queries,
            categories,
            truth: truth.into_iter().map(top).collect(),
            truth_filtered: truth_filtered.into_iter().map(top).collect(),
            rows,
        })
    }
}

/// One timed query set.
struct Measured {
    recall: f64,
    p50: Duration,
    p95: Duration,
    short: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A vector as a SQL array literal; `{}` prints the shortest text that reads back as the
/// same `f32`, so the query vector is exactly the stored one.
fn literal(q: &[f32]) -> String {
    let parts: Vec<String> = q.iter().map(|x| format!("{x}")).collect();
    format!("[{}]", parts.join(","))
}

/// The benchmark's KNN query for `q` (`filter`: empty or `WHERE ... `), the vector as an
/// array literal or, with `text`, in pgvector's text form `'[...]'`.
fn knn_sql(q: &[f32], filter: &str, text: bool) -> String {
    let vector = if text {
        format!("'{}'", literal(q))
    } else {
        literal(q)
    };
    format!("SELECT id FROM items {filter}ORDER BY l2_distance(emb, {vector}) LIMIT {K}")
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// Which front end runs the queries.
#[derive(Clone, Copy)]
enum FrontEnd {
    /// `FragvecSession::sql`.
    Session,
    /// Plain `SessionContext::sql` on the context fragvec registered into.
    Context,
    /// The same, with the query vector in pgvector's text form `'[...]'`.
    ContextText,
}

async fn run_queries(
    session: &FragvecSession,
    work: &Workload,
    filtered: bool,
    limit: usize,
    front: FrontEnd,
) -> Result<Measured> {
    let n = work.queries.len().min(limit);
    let sql: Vec<String> = (0..n)
        .map(|i| {
            let filter = if filtered {
                format!("WHERE category = {} ", work.categories[i])
            } else {
                String::new()
            };
            knn_sql(
                &work.queries[i],
                &filter,
                matches!(front, FrontEnd::ContextText),
            )
        })
        .collect();
    let run_one = async |sql: &str| -> Result<Vec<i64>> {
        Ok(match front {
            FrontEnd::Session => ids(&session.sql_one(sql).await?.batches),
            FrontEnd::Context | FrontEnd::ContextText => {
                ids(&session.context().sql(sql).await?.collect().await?)
            }
        })
    };
    for s in &sql {
        run_one(s).await?; // warm-up
    }
    let (mut lat, mut recall, mut short) = (Vec::with_capacity(n), 0.0, 0);
    for (i, s) in sql.iter().enumerate() {
        let t = Instant::now();
        let found = run_one(s).await?;
        lat.push(t.elapsed());
        let truth = if filtered {
            &work.truth_filtered[i]
        } else {
            &work.truth[i]
        };
        if found.len() < truth.len() {
            short += 1;
        }
        let hits = found.iter().filter(|id| truth.contains(id)).count();
        recall += if truth.is_empty() {
            1.0
        } else {
            hits as f64 / truth.len() as f64
        };
    }
    lat.sort();
    Ok(Measured {
        recall: recall / n as f64,
        p50: percentile(&lat, 0.5),
        p95: percentile(&lat, 0.95),
        short,
    })
}

/// Queries per second of `streams` concurrent query loops, each on a session of its own
/// (made with `new_sharing`, as each `fragvec serve` connection is) on a tokio task, cycling
/// through the queries from a different start.
async fn throughput(
    session: &FragvecSession,
    work: &Workload,
    streams: usize,
    nprobes: usize,
    seconds: f64,
) -> Result<f64> {
    let sql: std::sync::Arc<Vec<String>> =
        std::sync::Arc::new(work.queries.iter().map(|q| knn_sql(q, "", false)).collect());
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now() + Duration::from_secs(1);
    let end = start + Duration::from_secs_f64(seconds);
    for stream in 0..streams {
        let own = session.new_sharing().await?;
        own.sql(&format!("SET fragvec.nprobes = {nprobes}")).await?;
        let sql = sql.clone();
        tasks.spawn(async move {
            let mut done = 0u64;
            let mut i = stream * 13;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                own.sql_one(&sql[i % sql.len()]).await?;
                if now >= start {
                    done += 1;
                }
                i += 1;
            }
            Ok::<u64, datafusion::error::DataFusionError>(done)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.expect("query stream panicked")?;
    }
    Ok(total as f64 / seconds)
}

/// Peak and current resident memory of this process (`VmHWM`, `VmRSS`), in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Bytes this process has read from storage so far (`read_bytes` of `/proc/self/io`: reads
/// the page cache served are not counted), or 0 where there is no such file.
fn disk_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Prints measurements as a table or as JSON lines.
struct Report {
    json: bool,
}

impl Report {
    fn value(&self, metric: &str, value: f64, unit: &str) {
        if self.json {
            println!(
                "{}",
                serde_json::json!({"system": "fragvec", "metric": metric, "value": value, "unit": unit})
            );
        } else {
            println!("{metric:<34} {value:>12.3} {unit}");
        }
    }

    fn queries(&self, mode: &str, nprobes: Option<usize>, m: &Measured) {
        if self.json {
            println!(
                "{}",
                serde_json::json!({
                    "system": "fragvec", "mode": mode, "nprobes": nprobes,
                    "recall": m.recall, "p50_ms": m.p50.as_secs_f64() * 1e3,
                    "p95_ms": m.p95.as_secs_f64() * 1e3, "short": m.short,
                })
            );
        } else {
            let label = match nprobes {
                Some(n) => format!("{mode} nprobes={n}"),
                None => mode.to_string(),
            };
            println!(
                "{label:<34} recall@10 {:.4}  p50 {:>8.3} ms  p95 {:>8.3} ms  p95/p50 {:.2}{}",
                m.recall,
                m.p50.as_secs_f64() * 1e3,
                m.p95.as_secs_f64() * 1e3,
                m.p95.as_secs_f64() / m.p50.as_secs_f64(),
                if m.short > 0 {
                    format!("  ({} short answers)", m.short)
                } else {
                    String::new()
                }
            );
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let work = Workload::read(&args.data)?;
    let data = std::fs::canonicalize(&args.data)?;
    let db = args.db.clone().unwrap_or_else(|| data.join("fragvec-db"));
    let reuse = args.reuse && db.join("items").exists();
    if db.exists() && !reuse {
        std::fs::remove_dir_all(&db)?;
    }
    std::fs::create_dir_all(&db)?;
    let report = Report { json: args.json };
    let (rows, dim) = (work.rows, work.dim);
    let partitions = args
        .partitions
        .unwrap_or_else(|| ((rows as f64).sqrt().round() as usize).max(1));
    eprintln!(
        "{rows} x {dim}, {} queries, k = {K}, {partitions} partitions",
        work.queries.len()
    );

    let ctx = SessionContext::new();
    let session = fragvec::register(&ctx, db.to_str().expect("utf-8 path")).await?;
    if let Some(b) = args.cache_bytes {
        session
            .sql(&format!("SET fragvec.index_cache_bytes = {b}"))
            .await?;
    }
    if !reuse {
        load_and_index(
            &session,
            &data,
            rows,
            dim,
            partitions,
            &args.index_type,
            &report,
        )
        .await?;
        if args.recluster {
            let t = Instant::now();
            session
                .sql("RECLUSTER items BY (ivf_partition(emb))")
                .await?;
            report.value("RECLUSTER BY ivf_partition", t.elapsed().as_secs_f64(), "s");
        }
    }
    if args.merge {
        let t = Instant::now();
        session
            .sql("OPTIMIZE INDEX items_idx ON items MERGE 1")
            .await?;
        report.value("OPTIMIZE INDEX MERGE 1", t.elapsed().as_secs_f64(), "s");
    }

    for &n in &args.nprobes {
        session.sql(&format!("SET fragvec.nprobes = {n}")).await?;
        let read = disk_read_bytes();
        let m = run_queries(&session, &work, false, usize::MAX, FrontEnd::Session).await?;
        report.queries("ivf", Some(n), &m);
        // Each query runs twice (a warm-up pass, then the timed one).
        report.value(
            &format!("disk read per query nprobes={n}"),
            (disk_read_bytes() - read) as f64 / (2 * work.queries.len()) as f64 / 1e6,
            "MB",
        );
    }
    for &n in &args.filtered_nprobes {
        session.sql(&format!("SET fragvec.nprobes = {n}")).await?;
        let m = run_queries(&session, &work, true, usize::MAX, FrontEnd::Session).await?;
        report.queries("filtered", Some(n), &m);
    }
    session.sql("SET fragvec.nprobes = 16").await?;
    let m = run_queries(&session, &work, false, usize::MAX, FrontEnd::Context).await?;
    report.queries("ivf via SessionContext::sql", Some(16), &m);
    let m = run_queries(&session, &work, false, usize::MAX, FrontEnd::ContextText).await?;
    report.queries("ivf via SessionContext::sql, text", Some(16), &m);
    for &streams in &args.concurrency {
        let qps = throughput(
            &session,
            &work,
            streams,
            args.concurrency_nprobes,
            args.seconds,
        )
        .await?;
        report.value(
            &format!("qps streams={streams} nprobes={}", args.concurrency_nprobes),
            qps,
            "queries/s",
        );
    }
    if args.plan_phases {
        for text in [false, true] {
            plan_phases(&session, &work, text).await?;
        }
    }
    for insert in [false, true].into_iter().filter(|_| args.after_commits > 0) {
        after_commits(
            &session,
            &work,
            args.after_commits,
            args.concurrency_nprobes,
            insert,
            &report,
        )
        .await?;
    }
    if args.exact_queries > 0 {
        session.sql("SET fragvec.exact = true").await?;
        let m = run_queries(
            &session,
            &work,
            false,
            args.exact_queries,
            FrontEnd::Session,
        )
        .await?;
        report.queries("exact", None, &m);
        session.sql("SET fragvec.exact = false").await?;
    }
    let (peak, now) = memory();
    report.value("peak RSS", peak as f64 / 1e6, "MB");
    report.value("RSS at the end", now as f64 / 1e6, "MB");
    if !args.keep {
        std::fs::remove_dir_all(&db)?;
    }
    Ok(())
}

/// Prints how long each phase of a statement took (to stderr: stdout is the report), so a
/// slow build says where its time went.
struct PhaseTimes {
    started: std::sync::Mutex<std::collections::HashMap<u64, (String, Instant)>>,
}

impl fragvec::format::progress::ProgressSink for PhaseTimes {
    fn start(&self, id: u64, name: &str, _total: Option<u64>) {
        if let Ok(mut started) = self.started.lock() {
            started.insert(id, (name.to_string(), Instant::now()));
        }
    }

    fn advance(&self, _id: u64, _n: u64) {}

    fn finish(&self, id: u64) {
        let ended = self.started.lock().ok().and_then(|mut s| s.remove(&id));
        if let Some((name, t)) = ended {
            eprintln!("  phase {name:<24} {:>8.2} s", t.elapsed().as_secs_f64());
        }
    }
}

/// Loads the items through SQL and builds the index, reporting both times.
async fn load_and_index(
    session: &fragvec::FragvecSession,
    data: &std::path::Path,
    rows: usize,
    dim: usize,
    partitions: usize,
    index_type: &str,
    report: &Report,
) -> Result<()> {
    let t = Instant::now();
    session
        .sql(&format!(
            "CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}';
             CREATE TABLE items (id BIGINT NOT NULL, category INT NOT NULL, emb VECTOR({dim}));
             INSERT INTO items SELECT id, category, emb FROM src;",
            data.join("items.parquet").display()
        ))
        .await?;
    report.value("load (INSERT from Parquet)", t.elapsed().as_secs_f64(), "s");
    session.set_progress(std::sync::Arc::new(PhaseTimes {
        started: Default::default(),
    }));
    let t = Instant::now();
    session
        .sql(&format!(
            "CREATE VECTOR INDEX items_idx ON items (emb) USING {index_type} \
             WITH (num_partitions = {partitions})"
        ))
        .await?;
    report.value(
        &format!("index build ({index_type})"),
        t.elapsed().as_secs_f64(),
        "s",
    );
    let sizes = session
        .sql_one("SELECT CAST(sum(size_bytes) AS BIGINT) FROM fragvec_segments('items')")
        .await?;
    let index_bytes = sizes.batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0);
    report.value("index size on disk", index_bytes as f64 / 1e6, "MB");
    report.value(
        "index size / float vectors",
        index_bytes as f64 / (rows * dim * 4) as f64,
        "x",
    );
    session.clear_progress();
    report.value("peak RSS after build", memory().0 as f64 / 1e6, "MB");
    Ok(())
}

/// Times each phase of `SessionContext::sql` + `collect` separately, as DataFusion runs them,
/// and prints each phase's p50 over the queries (to stderr): where the embedding path's time
/// goes next to the session's. `text`: the vector in pgvector's text form.
async fn plan_phases(session: &FragvecSession, work: &Workload, text: bool) -> Result<()> {
    let names = [
        "parse",
        "logical plan",
        "analyze + optimize",
        "physical plan",
        "execute",
    ];
    let mut times: Vec<Vec<Duration>> = vec![vec![]; names.len()];
    for q in &work.queries {
        let sql = knn_sql(q, "", text);
        let state = session.context().state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut t = Instant::now();
        let mut lap = |phase: usize, t: &mut Instant| {
            times[phase].push(t.elapsed());
            *t = Instant::now();
        };
        let statement = state.sql_to_statement(&sql, &dialect)?;
        lap(0, &mut t);
        let logical = state.statement_to_plan(statement).await?;
        lap(1, &mut t);
        let optimized = state.optimize(&logical)?;
        lap(2, &mut t);
        let physical = state
            .query_planner()
            .create_physical_plan(&optimized, &state)
            .await?;
        lap(3, &mut t);
        datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
        lap(4, &mut t);
    }
    for (name, mut lat) in names.iter().zip(times) {
        lat.sort();
        eprintln!(
            "  SessionContext::sql{} phase {name:<20} p50 {:>8.3} ms",
            if text { ", text" } else { "" },
            percentile(&lat, 0.5).as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// See `Args::after_commits`: the latency of the first query on each new version against
/// the second query on it, the commits made by another session (as `fragvec serve`'s writer
/// connection makes them, over the same database and index cache).
async fn after_commits(
    session: &FragvecSession,
    work: &Workload,
    rounds: usize,
    nprobes: usize,
    insert: bool,
    report: &Report,
) -> Result<()> {
    // Ids far above the table's, so the rows an INSERT copies are never copied again.
    const COPIED_IDS: i64 = 1 << 40;
    let writer = session.new_sharing().await?;
    session
        .sql(&format!("SET fragvec.nprobes = {nprobes}"))
        .await?;
    let sql: Vec<String> = work.queries.iter().map(|q| knn_sql(q, "", false)).collect();
    for s in &sql {
        session.sql_one(s).await?; // warm-up
    }
    let rows = work.rows.max(1) as i64;
    let (mut first, mut second) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for round in 0..rounds {
        let change = if insert {
            let from = (round as i64 * 100) % rows;
            format!(
                "INSERT INTO items SELECT id + {COPIED_IDS}, category, emb FROM items \
                 WHERE id >= {from} AND id < {}",
                from + 100
            )
        } else {
            // 7,919 is prime: the ids deleted are distinct for any table size it does not divide.
            format!(
                "DELETE FROM items WHERE id = {}",
                round as i64 * 7_919 % rows
            )
        };
        writer.sql(&change).await?;
        for (times, at) in [(&mut first, 2 * round), (&mut second, 2 * round + 1)] {
            let t = Instant::now();
            session.sql_one(&sql[at % sql.len()]).await?;
            times.push(t.elapsed());
        }
    }
    let kind = if insert {
        "100-row INSERT"
    } else {
        "1-row DELETE"
    };
    for (which, mut lat) in [("first", first), ("second", second)] {
        lat.sort();
        let ms = |p| percentile(&lat, p).as_secs_f64() * 1e3;
        report.value(&format!("after {kind}: {which} query p50"), ms(0.5), "ms");
        report.value(&format!("after {kind}: {which} query p99"), ms(0.99), "ms");
    }
    Ok(())
}

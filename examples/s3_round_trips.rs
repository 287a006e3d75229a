//! Object-store round trips per statement: on real object storage each request costs 10–50 ms
//! however small it is, so the number of requests a statement makes, and how many of them it
//! makes one after another, decides its latency there.
//!
//! The database sits on a [`MeteredStore`] over an in-memory store. A setup session (not
//! measured) creates `items (id BIGINT, emb VECTOR(32))` with 20,000 rows in four fragments,
//! an IVF_FLAT index of 32 partitions, and two small unindexed fragments. A second session,
//! opened on the same store with empty caches (the process-wide footer cache is cleared too,
//! so it starts as a new process would), then runs the measured statements one by one:
//!
//! * open: opening the session (it lists the tables);
//! * KNN cold: the first `ORDER BY l2_distance(emb, q) LIMIT 10` query;
//! * KNN, new vectors: the next five queries with other vectors (mean per query: some of
//!   the partitions they probe are not cached yet);
//! * KNN warm: the same five vectors again (every partition they probe is cached);
//! * INSERT: ten rows with `VALUES`;
//! * KNN after own write: the first query after that INSERT;
//! * COMMIT (small write): `DELETE FROM items WHERE id = ...`, one row;
//! * COMPACT: merges the small fragments.
//!
//! Everything runs twice on fresh stores, with 0 ms and with 20 ms added to every request;
//! request counts do not depend on the latency (the two runs are checked to agree) and at
//! 20 ms the wall time is dominated by the requests made one after another, so the dev
//! profile is good enough. With `FRAGVEC_ROUND_TRIPS_S3=s3://bucket/prefix` (and the `AWS_*`
//! variables, e.g. from `.ci/s3-server start`) it runs a third time on that store, with no
//! added latency.
//!
//! Run with `cargo run --example s3_round_trips` (`-- --trace` also lists each statement's
//! requests in the first run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::prelude::{SessionConfig, SessionContext};
use fragvec::FragvecSession;
use fragvec::format::Database;
use fragvec::format::fragment_io::forget_cached_footers;
use fragvec::format::metered_store::{MeteredStore, RoundTrips};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROWS: usize = 20_000;
const DIM: usize = 32;
const ROWS_PER_FRAGMENT: usize = 5_000;
const PARTITIONS: usize = 32;
const WARM_QUERIES: u64 = 5;

/// One measured statement: what it asked of the store, and how long it took.
struct Measured {
    operation: &'static str,
    trips: RoundTrips,
    /// How many times it ran (the counts and the time are divided by it).
    runs: u64,
    wall: Duration,
    /// The requests it made, when tracing.
    trace: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let trace = std::env::args().any(|a| a == "--trace");
    let mut runs: Vec<(String, Vec<Measured>)> = Vec::new();
    for latency_ms in [0, 20] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let measured = scenario(
            store,
            Path::default(),
            "memory://round-trips".into(),
            Duration::from_millis(latency_ms),
            trace && latency_ms == 0,
        )
        .await?;
        runs.push((format!("wall @ +{latency_ms} ms"), measured));
    }
    if let Ok(url) = std::env::var("FRAGVEC_ROUND_TRIPS_S3") {
        let db = Database::open(&url).await?;
        let prefix = db
            .root()
            .clone()
            .join(format!("round-trips-{}", rand::random::<u32>()));
        let measured = scenario(
            db.store().clone(),
            prefix,
            url.clone(),
            Duration::ZERO,
            false,
        )
        .await?;
        runs.push((format!("wall @ {url}"), measured));
    }
    print_table(&runs);
    for m in runs[0].1.iter().filter(|m| !m.trace.is_empty()) {
        println!("\n{}:", m.operation);
        for line in &m.trace {
            println!("    {line}");
        }
    }
    Ok(())
}

/// Builds the table (unmeasured), then measures each statement in a fresh session.
async fn scenario(
    store: Arc<dyn ObjectStore>,
    root: Path,
    location: String,
    latency: Duration,
    trace: bool,
) -> Result<Vec<Measured>> {
    let metered = MeteredStore::new(store);
    let open = || {
        let db = Database::from_store(Arc::new(metered.clone()), root.clone(), location.clone());
        let ctx = SessionContext::new_with_config(SessionConfig::new());
        FragvecSession::with_context(ctx, db)
    };
    let mut rng = StdRng::seed_from_u64(11);
    let setup = open().await?;
    setup
        .sql(&format!(
            "CREATE TABLE items (id BIGINT NOT NULL, emb VECTOR({DIM})) \
             WITH (max_rows_per_fragment = {ROWS_PER_FRAGMENT})"
        ))
        .await?;
    setup
        .context()
        .register_table("source", Arc::new(vectors(&mut rng, 0, ROWS)?))?;
    setup
        .sql(&format!(
            "INSERT INTO items SELECT * FROM source;
             CREATE VECTOR INDEX items_emb ON items (emb) USING IVF_FLAT \
             WITH (num_partitions = {PARTITIONS});
             INSERT INTO items VALUES {}; INSERT INTO items VALUES {};",
            values(&mut rng, ROWS, 100),
            values(&mut rng, ROWS + 100, 100),
        ))
        .await?;
    drop(setup);

    forget_cached_footers();
    metered.set_latency(latency);
    metered.trace(trace);
    let mut measured = Vec::new();
    let start = (metered.round_trips(), Instant::now());
    let session = open().await?;
    measured.push(done("open session", &metered, start, 1));

    let knn = |rng: &mut StdRng| {
        format!(
            "SELECT id FROM items ORDER BY l2_distance(emb, {}) LIMIT 10",
            literal(&random_vector(rng))
        )
    };
    let start = (metered.round_trips(), Instant::now());
    let found = session.sql_one(&knn(&mut rng)).await?;
    assert_eq!(found.num_rows(), 10);
    measured.push(done("KNN query, cold cache", &metered, start, 1));

    let queries: Vec<String> = (0..WARM_QUERIES).map(|_| knn(&mut rng)).collect();
    let start = (metered.round_trips(), Instant::now());
    for query in &queries {
        let found = session.sql_one(query).await?;
        assert_eq!(found.num_rows(), 10);
    }
    measured.push(done(
        "KNN query, new vectors (mean of 5)",
        &metered,
        start,
        WARM_QUERIES,
    ));
    let start = (metered.round_trips(), Instant::now());
    for query in &queries {
        let found = session.sql_one(query).await?;
        assert_eq!(found.num_rows(), 10);
    }
    measured.push(done(
        "KNN query, warm cache (same 5 again)",
        &metered,
        start,
        WARM_QUERIES,
    ));

    let start = (metered.round_trips(), Instant::now());
    let inserted = session
        .sql_one(&format!(
            "INSERT INTO items VALUES {}",
            values(&mut rng, ROWS + 200, 10)
        ))
        .await?;
    assert_eq!(inserted.rows_affected, Some(10));
    measured.push(done("INSERT 10 rows", &metered, start, 1));

    let start = (metered.round_trips(), Instant::now());
    let found = session.sql_one(&knn(&mut rng)).await?;
    assert_eq!(found.num_rows(), 10);
    measured.push(done("KNN query after own INSERT", &metered, start, 1));

    let start = (metered.round_trips(), Instant::now());
    let deleted = session.sql_one("DELETE FROM items WHERE id = 4242").await?;
    assert_eq!(deleted.rows_affected, Some(1));
    measured.push(done(
        "COMMIT small write (DELETE 1 row)",
        &metered,
        start,
        1,
    ));

    let start = (metered.round_trips(), Instant::now());
    session.sql_one("COMPACT items").await?;
    measured.push(done("COMPACT (3 small fragments)", &metered, start, 1));
    Ok(measured)
}

fn done(
    operation: &'static str,
    metered: &MeteredStore,
    (before, started): (RoundTrips, Instant),
    runs: u64,
) -> Measured {
    Measured {
        operation,
        wall: started.elapsed(),
        trips: metered.round_trips().since(&before),
        runs,
        trace: metered.take_trace(),
    }
}

/// One Markdown table: the counts of the first run, a wall-time column per run.
fn print_table(runs: &[(String, Vec<Measured>)]) {
    let (_, first) = &runs[0];
    let mut header = vec![
        "operation",
        "GET",
        "range GET",
        "HEAD",
        "PUT",
        "LIST",
        "DELETE",
        "requests",
        "KiB read",
        "KiB written",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    header.extend(runs.iter().map(|(name, _)| name.clone()));
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    for (i, m) in first.iter().enumerate() {
        let per = |n: u64| {
            let x = n as f64 / m.runs as f64;
            if x.fract() == 0.0 {
                format!("{x}")
            } else {
                format!("{x:.1}")
            }
        };
        let kib = |n: u64| format!("{:.1}", n as f64 / m.runs as f64 / 1024.0);
        let t = &m.trips;
        let mut cells = vec![
            m.operation.to_string(),
            per(t.gets),
            per(t.range_gets),
            per(t.heads),
            per(t.puts),
            per(t.lists),
            per(t.deletes),
            per(t.requests()),
            kib(t.bytes_read),
            kib(t.bytes_written),
        ];
        for (_, run) in runs {
            let r = &run[i];
            cells.push(format!(
                "{:.1} ms",
                r.wall.as_secs_f64() * 1000.0 / r.runs as f64
            ));
        }
        println!("| {} |", cells.join(" | "));
    }
    // Request counts do not depend on the latency, except version checks: a slower run may
    // pass the 1 s version check interval where a faster one did not. Say so when they differ.
    for (name, run) in &runs[1..] {
        for (a, b) in first.iter().zip(run) {
            if a.trips.requests() != b.trips.requests() {
                println!(
                    "note: {} made {} requests in the run '{name}' ({}), {} in the first \
                     (a version check interval that passed?)",
                    a.operation,
                    b.trips.requests(),
                    b.trips,
                    a.trips.requests()
                );
            }
        }
    }
}

fn random_vector(rng: &mut StdRng) -> Vec<f32> {
    (0..DIM).map(|_| rng.random::<f32>()).collect()
}

/// `(id BIGINT NOT NULL, emb VECTOR(DIM))` rows with ids `first..first + rows`.
fn vectors(rng: &mut StdRng, first: usize, rows: usize) -> Result<MemTable> {
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "emb",
            DataType::FixedSizeList(item.clone(), DIM as i32),
            true,
        ),
    ]));
    let ids = Int64Array::from_iter_values(first as i64..(first + rows) as i64);
    let values: Vec<f32> = (0..rows * DIM).map(|_| rng.random::<f32>()).collect();
    let emb = FixedSizeListArray::new(item, DIM as i32, Arc::new(Float32Array::from(values)), None);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(emb)])?;
    MemTable::try_new(schema, vec![vec![batch]])
}

/// `rows` rows as a SQL `VALUES` list, ids from `first`.
fn values(rng: &mut StdRng, first: usize, rows: usize) -> String {
    (first..first + rows)
        .map(|id| format!("({id}, {})", literal(&random_vector(rng))))
        .collect::<Vec<_>>()
        .join(", ")
}

fn literal(v: &[f32]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:.5}")).collect();
    format!("[{}]", parts.join(", "))
}

//! Queries over two `fragvec worker` processes and a coordinator over a `file://` database
//! and over a database on the test S3 server (see tests/support):
//! the plan shows a stage of several tasks; scans, aggregates, joins and KNN (plain,
//! filtered, after COMPACT, RECLUSTER and MERGE, with deletions, split by segments and by
//! slices) equal the single-node answers; a worker killed in the middle of a query is
//! replaced (the query runs again on the worker left), and with none left a query fails with
//! a clear error, in bounded time.
#![cfg(feature = "distributed")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use fragvec::FragvecSession;

#[macro_use]
mod support;
use support::Location;

/// A `fragvec worker` process on a free port, killed when dropped.
struct WorkerProcess {
    child: Child,
    url: String,
}

impl WorkerProcess {
    fn start(db: Option<&str>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fragvec"));
        cmd.args(["worker", "--listen", "127.0.0.1:0"]);
        if let Some(db) = db {
            cmd.args(["--db", db]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fragvec worker");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("fragvec worker listening on ")
            .unwrap_or_else(|| panic!("unexpected worker output: {line}"))
            .to_string();
        Self { child, url }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn text(s: &FragvecSession, sql: &str) -> String {
    let r = s
        .sql_one(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&r.batches).unwrap().to_string()
}

/// `t (id, g, emb VECTOR(8))` in 100-row fragments: 1200 rows in the first index segment,
/// 400 in a second, 400 unindexed, every 13th deleted; every 97th vector is NULL. A second
/// index (`idx_dot`, metric dot) has one segment over the first 1200 rows.
async fn populate(s: &FragvecSession) {
    let rows = |from: i64, to: i64| {
        format!(
            "INSERT INTO t SELECT value, value % 7, CASE WHEN value % 97 = 5 THEN NULL ELSE \
             make_array(sin(value), cos(value), \
             sin(value * 0.3), cos(value * 0.7), sin(value * 1.7), cos(value * 2.3), \
             sin(value * 0.11), cos(value * 0.13)) END FROM generate_series({from}, {to})"
        )
    };
    s.sql(&format!(
        "CREATE TABLE t (id BIGINT NOT NULL, g BIGINT, emb VECTOR(8)) \
         WITH (max_rows_per_fragment = 100); {}; \
         CREATE VECTOR INDEX idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 8); \
         CREATE VECTOR INDEX idx_dot ON t (emb) USING IVF_FLAT \
         WITH (num_partitions = 4, metric = 'dot'); {}; \
         OPTIMIZE INDEX idx ON t APPEND; {}; \
         DELETE FROM t WHERE id % 13 = 0",
        rows(0, 1199),
        rows(1200, 1599),
        rows(1600, 1999),
    ))
    .await
    .unwrap();
}

const Q: &str = "[0.5, 0.1, -0.2, 0.9, 0.3, -0.4, 0.8, 0.05]";

fn queries() -> Vec<String> {
    vec![
        "SELECT * FROM t".into(),
        "SELECT id, g, _rowaddr FROM t ORDER BY id".into(),
        "SELECT g, count(*), sum(id), min(id), max(id) FROM t GROUP BY g ORDER BY g".into(),
        "SELECT count(*), sum(g) FROM t WHERE id % 3 = 0".into(),
        "SELECT a.g, count(*), sum(b.id) FROM t a JOIN t b ON a.id = b.id + 1 \
         GROUP BY a.g ORDER BY a.g"
            .into(),
        format!("SELECT id, l2_distance(emb, {Q}) AS d FROM t ORDER BY d LIMIT 10"),
        format!("SELECT id FROM t WHERE g IN (1, 4) ORDER BY cosine_distance(emb, {Q}) LIMIT 7"),
        format!("SELECT id, g FROM t WHERE id > 500 ORDER BY l2_distance(emb, {Q}) LIMIT 25"),
        // A KNN inside a subquery: the outer sort must see the merged top-k, not each
        // task's.
        format!(
            "SELECT id FROM (SELECT id FROM t ORDER BY l2_distance(emb, {Q}) LIMIT 10) \
             ORDER BY id DESC"
        ),
        // DESC (through the dot index) puts the NULL vectors first; each share returns only
        // its own, so none repeats. Their order among themselves is not defined, hence the
        // outer ORDER BY and limits above the number of NULL vectors (about 20), so that
        // which rows tie at the limit does not matter.
        format!(
            "SELECT id FROM (SELECT id FROM t ORDER BY inner_product(emb, {Q}) DESC LIMIT 30) \
             ORDER BY id"
        ),
        format!(
            "SELECT id FROM (SELECT id FROM t WHERE g <> 2 \
             ORDER BY inner_product(emb, {Q}) DESC LIMIT 25) ORDER BY id"
        ),
    ]
}

async fn assert_same_answers(dist: &FragvecSession, single: &FragvecSession, when: &str) {
    for sql in queries() {
        assert_eq!(
            text(dist, &sql).await,
            text(single, &sql).await,
            "{when}: {sql}"
        );
    }
}

on_local_and_s3!(queries_over_two_worker_processes_equal_single_node_answers);

async fn queries_over_two_worker_processes_equal_single_node_answers(db: Location) {
    let location = match db.url() {
        url if url.contains("://") => url.to_string(),
        path => format!("file://{path}"),
    };
    let single = FragvecSession::open(&location).await.unwrap();
    populate(&single).await;
    let workers = [WorkerProcess::start(None), WorkerProcess::start(None)];
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let dist = FragvecSession::with_workers(&location, &urls)
        .await
        .unwrap();
    // Two sessions over one database: each must see the other's commits at once (on S3 a
    // query may otherwise reuse the version it confirmed up to a second ago).
    for s in [&dist, &single] {
        s.sql_one("SET fragvec.version_check_ms = 0").await.unwrap();
    }

    let explain = text(&dist, "EXPLAIN SELECT g, sum(id) FROM t GROUP BY g").await;
    assert!(explain.contains("tasks=2"), "{explain}");
    let explain = text(
        &dist,
        &format!("EXPLAIN SELECT id FROM t ORDER BY l2_distance(emb, {Q}) LIMIT 10"),
    )
    .await;
    // Segments of 1200 and 400 rows do not deal evenly over two tasks: sliced.
    assert!(
        explain.contains("tasks=2") && explain.contains("share=partitions p % 2 = 1"),
        "{explain}"
    );
    assert_same_answers(&dist, &single, "two segments and unindexed rows").await;

    dist.sql_one("COMPACT t WITH (target_rows_per_fragment = 300)")
        .await
        .unwrap();
    assert_same_answers(&dist, &single, "after COMPACT").await;
    dist.sql_one("RECLUSTER t BY (g)").await.unwrap();
    assert_same_answers(&dist, &single, "after RECLUSTER").await;
    dist.sql_one("DELETE FROM t WHERE g = 3 AND id % 2 = 0")
        .await
        .unwrap();
    dist.sql_one("UPDATE t SET g = 9 WHERE id % 17 = 0")
        .await
        .unwrap();
    assert_same_answers(&dist, &single, "after DELETE and UPDATE").await;
    // The index is used on the workers after the rewrites, and search options travel.
    for s in [&dist, &single] {
        s.sql_one("SET fragvec.nprobes = 1").await.unwrap();
    }
    assert_same_answers(&dist, &single, "nprobes = 1").await;
    // One segment per index: each query is sliced over both workers, and its answer is
    // still the single node's, also where a slice finds too few rows alone (nprobes 1,
    // a filter admitting rows of few partitions) and the exact paths.
    dist.sql_one("OPTIMIZE INDEX idx ON t MERGE 2")
        .await
        .unwrap();
    dist.sql_one("OPTIMIZE INDEX idx_dot ON t APPEND")
        .await
        .unwrap();
    dist.sql_one(
        "INSERT INTO t SELECT value, value % 7, make_array(cos(value), sin(value), \
         cos(value * 0.3), sin(value * 0.7), cos(value * 1.7), sin(value * 2.3), \
         cos(value * 0.11), sin(value * 0.13)) FROM generate_series(5000, 5149)",
    )
    .await
    .unwrap();
    assert_same_answers(&dist, &single, "one segment, nprobes = 1").await;
    // At nprobes 1 one slice has no probed partition of its own: it takes its bound from
    // the other's (which holds 10 rows), and need not count that slice's rows.
    let analyzed = text(
        &dist,
        &format!("EXPLAIN ANALYZE SELECT id FROM t ORDER BY l2_distance(emb, {Q}) LIMIT 10"),
    )
    .await;
    assert!(
        analyzed.contains("rows_seen_for_slice_bound=")
            && !analyzed.contains("rows_seen_for_slice_bound=0,")
            && analyzed.contains("rows_counted_for_other_slices=0,"),
        "{analyzed}"
    );
    // When that partition holds fewer than k rows (about 270 of 1,000) there is no bound to
    // take: the slice counts its rows, to decide as one machine would whether to probe on.
    let deep = format!("SELECT id FROM t ORDER BY l2_distance(emb, {Q}) LIMIT 1000");
    let analyzed = text(&dist, &format!("EXPLAIN ANALYZE {deep}")).await;
    assert!(
        analyzed.contains("rows_counted_for_other_slices=")
            && !analyzed.contains("rows_counted_for_other_slices=0,"),
        "{analyzed}"
    );
    assert_eq!(
        text(&dist, &deep).await,
        text(&single, &deep).await,
        "{deep}"
    );
    let selective = [
        format!(
            "SELECT id FROM t WHERE id BETWEEN 300 AND 340 ORDER BY l2_distance(emb, {Q}) LIMIT 10"
        ),
        format!("SELECT id FROM t WHERE id % 50 = 1 ORDER BY l2_distance(emb, {Q}) LIMIT 12"),
        // NULL vectors qualify: all qualifying rows (ties at an infinite distance among
        // them), so the outer ORDER BY makes the text comparable.
        format!(
            "SELECT id FROM (SELECT id FROM t WHERE id % 97 = 5 OR id < 3 \
             ORDER BY l2_distance(emb, {Q}) LIMIT 40) ORDER BY id"
        ),
    ];
    for nprobes in [1, 3, 8] {
        for s in [&dist, &single] {
            s.sql_one(&format!("SET fragvec.nprobes = {nprobes}"))
                .await
                .unwrap();
        }
        for sql in &selective {
            assert_eq!(
                text(&dist, sql).await,
                text(&single, sql).await,
                "nprobes {nprobes}: {sql}"
            );
        }
    }
    for s in [&dist, &single] {
        s.sql_one("SET fragvec.exact = true").await.unwrap();
    }
    assert_same_answers(&dist, &single, "one segment, exact").await;
}

/// Runs the `fragvec` binary; (success, stdout, stderr).
fn fragvec(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_coordinator_shows_and_runs_a_split_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let location = format!("file://{}", tmp.path().display());
    populate(&FragvecSession::open(&location).await.unwrap()).await;
    let workers = [
        WorkerProcess::start(Some(tmp.path().to_str().unwrap())),
        WorkerProcess::start(None),
    ];
    let urls = format!("{},{}", workers[0].url, workers[1].url);
    let sql = "SELECT g, count(*) AS n, sum(id) AS s FROM t GROUP BY g ORDER BY g";
    let explain = format!("EXPLAIN {sql}");
    let (ok, out, err) = fragvec(&["--db", &location, "--workers", &urls, "-c", &explain]);
    assert!(ok, "{err}");
    assert!(out.contains("tasks=2"), "{out}");
    let (ok, distributed, err) = fragvec(&["--db", &location, "--workers", &urls, "-c", sql]);
    assert!(ok, "{err}");
    let (ok, local, err) = fragvec(&["--db", &location, "-c", sql]);
    assert!(ok, "{err}");
    assert_eq!(distributed, local);
    assert!(local.contains("(7 rows)"), "{local}");
    // A worker started with --db serves that database only.
    let other = tempfile::tempdir().unwrap();
    let other_location = other.path().to_str().unwrap().to_string();
    populate(&FragvecSession::open(&other_location).await.unwrap()).await;
    let (ok, _, err) = fragvec(&["--db", &other_location, "--workers", &urls, "-c", sql]);
    assert!(!ok);
    assert!(err.contains("serves database"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_query_is_replaced_once_then_the_query_fails_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let location = format!("file://{}", tmp.path().display());
    let single = FragvecSession::open(&location).await.unwrap();
    single
        .sql(
            "CREATE TABLE big (id BIGINT, g BIGINT) WITH (max_rows_per_fragment = 5000); \
             INSERT INTO big SELECT value, value % 5 FROM generate_series(1, 40000)",
        )
        .await
        .unwrap();
    let mut workers = [WorkerProcess::start(None), WorkerProcess::start(None)];
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let dist = std::sync::Arc::new(
        FragvecSession::with_workers(&location, &urls)
            .await
            .unwrap(),
    );
    // 40000 rows joined on 5 keys: 320 million pairs, seconds of work on the workers.
    let sql =
        "SELECT a.g, count(*) AS n FROM big a JOIN big b ON a.g = b.g GROUP BY a.g ORDER BY a.g";
    let running = dist.clone();
    let query = tokio::spawn(async move { running.sql_one(sql).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!query.is_finished(), "the query should still run");
    workers[1].kill();
    // The query is run again on the worker left, and answers.
    let outcome = tokio::time::timeout(Duration::from_secs(300), query)
        .await
        .expect("the query ends in bounded time after a worker died")
        .unwrap()
        .expect("run again on the worker left");
    let answer = pretty_format_batches(&outcome.batches).unwrap().to_string();
    for g in 0..5 {
        assert!(answer.contains(&format!("| {g} | 64000000 |")), "{answer}");
    }
    // The dead worker is left out of the next queries.
    let explain = text(&dist, &format!("EXPLAIN {sql}")).await;
    assert!(!explain.contains("tasks=2"), "{explain}");
    text(&dist, "SELECT g, count(*) FROM big GROUP BY g").await;
    // Every worker gone: a query fails at once, naming the workers it could not reach.
    let workers = [WorkerProcess::start(None), WorkerProcess::start(None)];
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let dist = FragvecSession::with_workers(&location, &urls)
        .await
        .unwrap();
    for mut w in workers {
        w.kill();
    }
    let started = Instant::now();
    let err = dist.sql_one(sql).await.expect_err("no worker left");
    let message = err.to_string();
    assert!(
        message.contains("a query on workers")
            && urls.iter().all(|u| message.contains(u.as_str()))
            && message.contains("could not be reached"),
        "unclear error: {message}"
    );
    eprintln!("failed after {:?}: {message}", started.elapsed());
}

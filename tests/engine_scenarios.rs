//! Engine scenarios that need more than one statement at a time or a model: concurrent sessions,
//! randomized DML against an in-memory model, randomized rewrites against exact KNN, and
//! damaged index files.

use datafusion::arrow::array::{AsArray, Int64Array};
use datafusion::arrow::datatypes::Int64Type;

use fragvec::engine::FragvecSession;
use fragvec::format::progress::Progress;

#[macro_use]
mod support;
use support::Location;

async fn ids_and_values(s: &FragvecSession) -> Vec<(i64, i64)> {
    let r = s.sql_one("SELECT id, v FROM t ORDER BY id").await.unwrap();
    let mut out = Vec::new();
    for b in &r.batches {
        let id = b.column(0).as_primitive::<Int64Type>();
        let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        out.extend(id.values().iter().zip(v.values()).map(|(a, b)| (*a, *b)));
    }
    out
}

on_local_and_s3!(concurrent_inserts_from_two_sessions_all_land);
async fn concurrent_inserts_from_two_sessions_all_land(db: Location) {
    let loc = db.url().to_string();
    let a = FragvecSession::open(&loc).await.unwrap();
    a.sql("CREATE TABLE t (id BIGINT, v BIGINT)").await.unwrap();
    let b = FragvecSession::open(&loc).await.unwrap();
    let run = |s: FragvecSession, base: i64| {
        tokio::spawn(async move {
            for i in 0..15 {
                s.sql(&format!("INSERT INTO t VALUES ({}, 0)", base + i))
                    .await
                    .unwrap();
            }
        })
    };
    let (ra, rb) = tokio::join!(run(a.clone(), 0), run(b, 100));
    ra.unwrap();
    rb.unwrap();
    // `a` must see `b`'s last commits (on S3 a query may read up to `version_check_ms`
    // behind another session).
    a.sql("SET fragvec.version_check_ms = 0").await.unwrap();
    let rows = ids_and_values(&a).await;
    let mut expected: Vec<(i64, i64)> = (0..15).chain(100..115).map(|i| (i, 0)).collect();
    expected.sort();
    assert_eq!(rows, expected);
}

on_local_and_s3!(racing_delete_and_update_never_resurrect_or_lose_rows);
async fn racing_delete_and_update_never_resurrect_or_lose_rows(db: Location) {
    for mode in ["rewrite_rows", "rewrite_columns"] {
        let loc = db.child(mode);
        let a = FragvecSession::open(&loc).await.unwrap();
        a.sql("CREATE TABLE t (id BIGINT, v BIGINT) WITH (max_rows_per_fragment = 16)")
            .await
            .unwrap();
        a.sql("INSERT INTO t SELECT value, 0 FROM generate_series(0, 63)")
            .await
            .unwrap();
        let b = FragvecSession::open(&loc).await.unwrap();
        b.sql(&format!("SET fragvec.update_mode = '{mode}'"))
            .await
            .unwrap();
        let del = {
            let a = a.clone();
            tokio::spawn(async move { a.sql("DELETE FROM t WHERE id % 2 = 0").await })
        };
        let upd = tokio::spawn(async move { b.sql("UPDATE t SET v = v + 1").await });
        del.await.unwrap().unwrap();
        upd.await.unwrap().unwrap();
        // `a` must see `b`'s commit at once (on S3 a query may otherwise read up to
        // `version_check_ms` behind another session).
        a.sql("SET fragvec.version_check_ms = 0").await.unwrap();
        // Either order of the two statements gives the same table: odd ids, updated once.
        let rows = ids_and_values(&a).await;
        let expected: Vec<(i64, i64)> = (0..64).filter(|i| i % 2 == 1).map(|i| (i, 1)).collect();
        assert_eq!(rows, expected, "mode {mode}");
    }
}

on_local_and_s3!(corrupt_index_files_are_clear_errors_not_panics);
async fn corrupt_index_files_are_clear_errors_not_panics(db: Location) {
    use object_store::{ObjectStoreExt, PutPayload};
    let loc = db.url().to_string();
    let s = FragvecSession::open(&loc).await.unwrap();
    s.sql(
        "CREATE TABLE t (id BIGINT, v VECTOR(2)); \
         INSERT INTO t SELECT value, [value, 0] FROM generate_series(1, 50); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 4)",
    )
    .await
    .unwrap();
    let query = "SELECT id FROM t ORDER BY l2_distance(v, [0, 0]) LIMIT 3";
    assert_eq!(s.sql_one(query).await.unwrap().num_rows(), 3);
    let dir = std::sync::Arc::new(s.database().table("t").unwrap());
    let manifest = dir.latest().await.unwrap().manifest;
    let segment = manifest.index_segments[0].clone();
    let model = manifest.indexes[0].model_file.clone();
    let put = |path: String, bytes: Vec<u8>| {
        let dir = dir.clone();
        async move {
            dir.store()
                .put(&dir.path(&path), PutPayload::from(bytes))
                .await
                .unwrap()
        }
    };

    // A segment file of the right size but foreign contents.
    put(segment.file.clone(), vec![7u8; segment.size_bytes as usize]).await;
    let fresh = FragvecSession::open(&loc).await.unwrap();
    let err = fresh.sql_one(query).await.unwrap_err().to_string();
    assert!(err.contains("not a fragvec segment file"), "{err}");

    // A truncated model file.
    put(model, vec![1, 2, 3]).await;
    let fresh = FragvecSession::open(&loc).await.unwrap();
    let err = fresh.sql_one(query).await.unwrap_err().to_string();
    assert!(err.contains("not a fragvec IVF model file"), "{err}");

    // Exact mode still answers: the index it would read is damaged, so the data files answer
    // (an exact fallback, shown by EXPLAIN ANALYZE).
    fresh.sql("SET fragvec.exact = true").await.unwrap();
    assert_eq!(fresh.sql_one(query).await.unwrap().num_rows(), 3);
    let r = fresh
        .sql_one(&format!("EXPLAIN ANALYZE {query}"))
        .await
        .unwrap();
    let plan = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    assert!(plan.contains("exact_fallbacks=1"), "{plan}");
}

/// A session on a new database in a temporary directory (kept while the guard lives).
async fn scratch_session() -> (tempfile::TempDir, FragvecSession) {
    let tmp = tempfile::tempdir().unwrap();
    let s = FragvecSession::open(tmp.path().to_str().unwrap())
        .await
        .unwrap();
    (tmp, s)
}

/// Ids (and values) of `t` in scan order.
async fn scan(s: &FragvecSession, sql: &str) -> Vec<(i64, i64)> {
    let r = s.sql_one(sql).await.unwrap();
    let mut out = Vec::new();
    for b in &r.batches {
        let a = b.column(0).as_primitive::<Int64Type>();
        let c = b.column(1).as_primitive::<Int64Type>();
        out.extend(a.values().iter().zip(c.values()).map(|(x, y)| (*x, *y)));
    }
    out
}

/// Random INSERT / DELETE / UPDATE (both modes) against an in-memory model of the table in
/// logical order: after every statement the scan, in order, equals the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_dml_matches_a_model_in_logical_order() {
    use rand::{Rng, SeedableRng};
    let (_tmp, s) = scratch_session().await;
    s.sql("CREATE TABLE t (id BIGINT, v BIGINT) WITH (stable_row_ids = true, max_rows_per_fragment = 7)")
        .await
        .unwrap();
    let seed = std::env::var("FV_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model: Vec<(i64, i64)> = Vec::new();
    let mut next_id = 0i64;
    for step in 0..60 {
        let (m, r) = (rng.random_range(2..6i64), rng.random_range(0..6i64));
        let matches = |id: i64| id % m == r % m;
        match rng.random_range(0..6) {
            5 => {
                // A stable partition by a key: the same rows, each new fragment a
                // subsequence of the previous order. The scan becomes the model's order.
                let key = ["id % 3", "v", "id % 5 + v"][rng.random_range(0..3)];
                let m = rng.random_range(1..5);
                s.sql(&format!("RECLUSTER t BY ({key}) WITH (destinations = {m})"))
                    .await
                    .unwrap();
                let rows = scan(&s, "SELECT id, CAST(_rowaddr >> 32 AS BIGINT) FROM t").await;
                let mut now: Vec<i64> = rows.iter().map(|r| r.0).collect();
                let mut before: Vec<i64> = model.iter().map(|r| r.0).collect();
                let position: std::collections::HashMap<i64, usize> =
                    before.iter().enumerate().map(|(i, id)| (*id, i)).collect();
                for w in rows.windows(2) {
                    if w[0].1 == w[1].1 {
                        assert!(
                            position[&w[0].0] < position[&w[1].0],
                            "step {step}: {rows:?}"
                        );
                    }
                }
                let value: std::collections::HashMap<i64, i64> = model.iter().copied().collect();
                let reordered: Vec<(i64, i64)> = now.iter().map(|id| (*id, value[id])).collect();
                now.sort();
                before.sort();
                assert_eq!(now, before, "step {step}");
                model = reordered;
            }
            4 => {
                // Compaction never changes what a scan returns, nor its order.
                let target = rng.random_range(2..20);
                let budget = rng.random_range(1..5);
                s.sql(&format!(
                    "COMPACT t WITH (target_rows_per_fragment = {target}, \
                     max_source_fragments = {budget})"
                ))
                .await
                .unwrap();
            }
            0 => {
                let n = rng.random_range(1..12);
                let values: Vec<String> = (next_id..next_id + n)
                    .map(|i| format!("({i}, 0)"))
                    .collect();
                s.sql(&format!("INSERT INTO t VALUES {}", values.join(", ")))
                    .await
                    .unwrap();
                model.extend((next_id..next_id + n).map(|i| (i, 0)));
                next_id += n;
            }
            1 => {
                s.sql(&format!("DELETE FROM t WHERE id % {m} = {}", r % m))
                    .await
                    .unwrap();
                model.retain(|(id, _)| !matches(*id));
            }
            kind => {
                let mode = if kind == 2 {
                    "rewrite_rows"
                } else {
                    "rewrite_columns"
                };
                s.sql(&format!("SET fragvec.update_mode = '{mode}'"))
                    .await
                    .unwrap();
                s.sql(&format!(
                    "UPDATE t SET v = v + 1 WHERE id % {m} = {}",
                    r % m
                ))
                .await
                .unwrap();
                let (hit, miss): (Vec<_>, Vec<_>) = model.iter().partition(|(id, _)| matches(*id));
                if mode == "rewrite_rows" {
                    // Updated rows move to the end, in their previous order.
                    model = miss
                        .into_iter()
                        .chain(hit.into_iter().map(|(id, v)| (id, v + 1)))
                        .collect();
                } else {
                    for row in model.iter_mut().filter(|(id, _)| matches(*id)) {
                        row.1 += 1;
                    }
                }
            }
        }
        assert_eq!(
            scan(&s, "SELECT id, v FROM t").await,
            model,
            "after step {step}"
        );
    }
    // Stable row ids never repeat among live rows.
    let ids = scan(&s, "SELECT id, CAST(_rowid AS BIGINT) FROM t").await;
    let mut row_ids: Vec<i64> = ids.iter().map(|(_, r)| *r).collect();
    row_ids.sort();
    row_ids.dedup();
    assert_eq!(row_ids.len(), ids.len());
}

/// Random rewrites and index maintenance: KNN through the index always equals the exact
/// answer (enough probes to make IVF exact, so any difference is a stale, deleted, missing
/// or duplicated row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_rewrites_keep_knn_equal_to_exact() {
    random_rewrites_keep_knn_of("IVF_FLAT").await;
}

/// The same with an IVF_SQ index: its rows are re-ranked from the data files, at the
/// addresses rewrites moved them to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_rewrites_keep_ivf_sq_knn_equal_to_exact() {
    random_rewrites_keep_knn_of("IVF_SQ").await;
}

async fn random_rewrites_keep_knn_of(kind: &str) {
    use rand::{Rng, SeedableRng};
    let (_tmp, s) = scratch_session().await;
    s.sql("CREATE TABLE t (id BIGINT, v VECTOR(2)) WITH (max_rows_per_fragment = 16)")
        .await
        .unwrap();
    s.sql("INSERT INTO t SELECT value, [value * 1.37 % 50, value * 2.91 % 50] FROM generate_series(0, 99)")
        .await
        .unwrap();
    s.sql(&format!(
        "CREATE VECTOR INDEX i ON t (v) USING {kind} WITH (num_partitions = 4)"
    ))
    .await
    .unwrap();
    s.sql("SET fragvec.nprobes = 4").await.unwrap();
    let seed = std::env::var("FV_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut next_id = 100;
    for step in 0..80 {
        let id = rng.random_range(0..next_id);
        let (x, y) = (
            rng.random_range(0.0..50.0f32),
            rng.random_range(0.0..50.0f32),
        );
        let sql = match rng.random_range(0..11) {
            9 => format!(
                "RECLUSTER t BY (id % {}) WITH (destinations = {})",
                rng.random_range(2..9),
                rng.random_range(1..6)
            ),
            10 => "RECLUSTER t BY (ivf_partition(v), id)".to_string(),
            7 => format!(
                "COMPACT t WITH (target_rows_per_fragment = {}, max_source_fragments = {})",
                rng.random_range(2..40),
                rng.random_range(1..6)
            ),
            8 => "COMPACT t WITH (deletion_threshold = 0.01)".to_string(),
            0 => format!("DELETE FROM t WHERE id = {id}"),
            1 => format!(
                "SET fragvec.update_mode = 'rewrite_columns'; UPDATE t SET v = [{x}, {y}] WHERE id = {id}"
            ),
            2 => format!(
                "SET fragvec.update_mode = 'rewrite_rows'; UPDATE t SET v = [{x}, {y}] WHERE id = {id}"
            ),
            3 => {
                next_id += 1;
                format!("INSERT INTO t VALUES ({}, [{x}, {y}])", next_id - 1)
            }
            4 => "OPTIMIZE INDEX i ON t APPEND".to_string(),
            5 => format!("OPTIMIZE INDEX i ON t MERGE {}", rng.random_range(1..3)),
            _ => format!("UPDATE t SET id = id WHERE id = {id}"),
        };
        s.sql(&sql).await.unwrap();
        let (qx, qy) = (
            rng.random_range(0.0..50.0f32),
            rng.random_range(0.0..50.0f32),
        );
        let q = format!(
            "SELECT id, CAST(l2_distance(v, [{qx}, {qy}]) * 1000 AS BIGINT) FROM t \
             ORDER BY l2_distance(v, [{qx}, {qy}]), id LIMIT 7"
        );
        let knn = format!(
            "SELECT id, CAST(l2_distance(v, [{qx}, {qy}]) * 1000 AS BIGINT) AS d FROM t \
             ORDER BY l2_distance(v, [{qx}, {qy}]) LIMIT 7"
        );
        s.sql("SET fragvec.exact = true").await.unwrap();
        let exact = scan(&s, &q).await;
        s.sql("SET fragvec.exact = false").await.unwrap();
        let mut got = scan(&s, &knn).await;
        got.sort_by_key(|(id, d)| (*d, *id));
        let mut want = exact.clone();
        want.sort_by_key(|(id, d)| (*d, *id));
        if std::env::var("FV_DEBUG").is_ok() {
            eprintln!("step {step}: {sql}");
        }
        if got != want && std::env::var("FV_DEBUG").is_ok() {
            for q in [
                "SELECT * FROM fragvec_segments('t')",
                "SELECT * FROM fragvec_ledger('t')",
                "SELECT position, id, physical_rows, deleted_rows FROM fragvec_fragments('t')",
                "SELECT id, _rowaddr >> 32, _rowaddr & 4294967295 FROM t WHERE id IN (89, 90, 48)",
            ] {
                let r = s.sql_one(q).await.unwrap();
                eprintln!(
                    "{}",
                    datafusion::arrow::util::pretty::pretty_format_batches(&r.batches).unwrap()
                );
            }
        }
        assert_eq!(got, want, "{kind}, after step {step}: {sql}");
    }
}

on_local_and_s3!(compaction_races_dml_and_other_compactions);
/// COMPACT racing DML: rows deleted after the compaction read its sources stay deleted in the
/// outputs; an in-place rewrite of a source makes the compaction retry; two compactions of
/// disjoint fragments both commit and both land in the ledger.
async fn compaction_races_dml_and_other_compactions(db: Location) {
    use fragvec::rewrite::compact::{execute, plan};
    use fragvec::rewrite::plan::CompactionOptions;
    let s = FragvecSession::open(db.url()).await.unwrap();
    s.sql("CREATE TABLE t (id BIGINT, v VECTOR(2))")
        .await
        .unwrap();
    for (lo, hi) in [(0, 9), (10, 19), (20, 1019), (1020, 1029), (1030, 1039)] {
        s.sql(&format!(
            "INSERT INTO t SELECT value, [value, 0] FROM generate_series({lo}, {hi})"
        ))
        .await
        .unwrap();
    }
    s.sql("CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 2)")
        .await
        .unwrap();
    let dir = std::sync::Arc::new(s.database().table("t").unwrap());
    let before = dir.latest().await.unwrap();
    let options = CompactionOptions {
        target_rows_per_fragment: 100,
        ..Default::default()
    };
    let bins = plan(&before, &options).await.unwrap().bins;
    assert_eq!(bins.len(), 2, "{bins:?}");
    // A DELETE commits between the compaction's read and its commit.
    s.sql("DELETE FROM t WHERE id IN (3, 15, 1025)")
        .await
        .unwrap();
    let (after_a, _) = execute(&before, &bins[..1], &Progress::none())
        .await
        .unwrap();
    // The second compaction read the same old version; its sources are disjoint.
    let (after_b, _) = execute(&before, &bins[1..], &Progress::none())
        .await
        .unwrap();
    assert!(after_b.version() > after_a.version());
    assert_eq!(after_b.manifest.reuse_ledger.len(), 2);
    let ids = scan(&s, "SELECT id, id AS same FROM t").await;
    let expected: Vec<(i64, i64)> = (0..1040)
        .filter(|i| ![3, 15, 1025].contains(i))
        .map(|i| (i, i))
        .collect();
    assert_eq!(ids, expected);
    let knn = scan(
        &s,
        "SELECT id, CAST(l2_distance(v, [15.4, 0]) AS BIGINT) FROM t ORDER BY l2_distance(v, [15.4, 0]) LIMIT 3",
    )
    .await;
    let mut got: Vec<i64> = knn.iter().map(|r| r.0).collect();
    got.sort();
    assert_eq!(got, vec![14, 16, 17]);

    // An in-place rewrite of a source after the compaction read it: retryable conflict.
    s.sql("INSERT INTO t VALUES (2000, [0, 0]); INSERT INTO t VALUES (2001, [0, 0])")
        .await
        .unwrap();
    let before = dir.latest().await.unwrap();
    let bins = plan(&before, &options).await.unwrap().bins;
    assert!(!bins.is_empty());
    s.sql("SET fragvec.update_mode = 'rewrite_columns'; UPDATE t SET v = [1, 1] WHERE id = 2000")
        .await
        .unwrap();
    let err = execute(&before, &bins, &Progress::none())
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    // Through SQL the statement retries and succeeds.
    let r = s
        .sql_one("COMPACT t WITH (target_rows_per_fragment = 100)")
        .await
        .unwrap();
    assert_eq!(r.num_rows(), 1);
    assert_eq!(
        scan(&s, "SELECT count(*), sum(id) FROM t").await,
        vec![(1039, (0..1040).sum::<i64>() - 3 - 15 - 1025 + 2000 + 2001)]
    );
}

on_local_and_s3!(vacuum_keeps_what_retained_versions_need);
/// VACUUM removes files no retained version needs and keeps everything the latest needs.
async fn vacuum_keeps_what_retained_versions_need(db: Location) {
    let s = FragvecSession::open(db.url()).await.unwrap();
    s.sql(
        "CREATE TABLE t (id BIGINT, v VECTOR(2)); \
         INSERT INTO t SELECT value, [value, 0] FROM generate_series(0, 9); \
         INSERT INTO t SELECT value, [value, 0] FROM generate_series(10, 19); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 2); \
         DELETE FROM t WHERE id = 5; \
         COMPACT t",
    )
    .await
    .unwrap();
    let q = "SELECT id, CAST(l2_distance(v, [5, 0]) AS BIGINT) FROM t ORDER BY l2_distance(v, [5, 0]) LIMIT 3";
    let before = scan(&s, q).await;
    // With the default grace period nothing this young goes.
    let r = s.sql_one("VACUUM t RETAIN 1 VERSIONS").await.unwrap();
    let removed = |r: &fragvec::engine::session::StatementResult, c: usize| {
        r.batches[0]
            .column(c)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
            .value(0)
    };
    assert_eq!((removed(&r, 0), removed(&r, 1)), (0, 0));
    s.sql("SET fragvec.vacuum_grace_seconds = 0").await.unwrap();
    let r = s.sql_one("VACUUM t RETAIN 1 VERSIONS").await.unwrap();
    assert!(removed(&r, 0) >= 5, "versions removed: {}", removed(&r, 0));
    assert!(removed(&r, 1) > 0, "files removed: {}", removed(&r, 1));
    let fresh = FragvecSession::open(db.url()).await.unwrap();
    assert_eq!(scan(&fresh, q).await, before);
    // The translated segment still works: its ledger's removed-row file was kept.
    let explain = fresh.sql_one(&format!("EXPLAIN {q}")).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&explain.batches)
        .unwrap()
        .to_string();
    assert!(text.contains("KnnExec"), "{text}");
    let err = fresh
        .sql_one("SELECT count(*) FROM t VERSION AS OF 2")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("version 2"), "{err}");
    assert!(fresh.sql_one("VACUUM t RETAIN 0 VERSIONS").await.is_err());
}

on_local_and_s3!(recluster_races_dml_and_compaction);
/// RECLUSTER racing DML and COMPACT: rows deleted after the recluster read its sources stay
/// deleted (carried through the row map); a compaction of other fragments commits beside
/// it; a corrupt row map is a clear error, never a wrong answer.
async fn recluster_races_dml_and_compaction(db: Location) {
    use fragvec::rewrite::recluster::{ReclusterSpec, recluster};
    let loc = db.url().to_string();
    let s = FragvecSession::open(&loc).await.unwrap();
    s.sql(
        "CREATE TABLE t (id BIGINT, k BIGINT, v VECTOR(2)) WITH (max_rows_per_fragment = 10); \
         INSERT INTO t SELECT value, value % 4, [value, 0] FROM generate_series(0, 39); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 2); \
         INSERT INTO t SELECT value, value % 4, [value, 0] FROM generate_series(40, 42); \
         INSERT INTO t SELECT value, value % 4, [value, 0] FROM generate_series(43, 45)",
    )
    .await
    .unwrap();
    let dir = std::sync::Arc::new(s.database().table("t").unwrap());
    let before = dir.latest().await.unwrap();
    let state = s.context().state();
    let cache = fragvec::index::cache::IndexCache::new(1 << 20);
    let keys = fragvec::engine::recluster::compile(&state, &before, &["k".to_string()], &cache)
        .await
        .unwrap();
    let filter =
        fragvec::engine::recluster::compile(&state, &before, &["id < 40".to_string()], &cache)
            .await
            .unwrap();
    let spec = ReclusterSpec {
        keys: std::sync::Arc::new(keys),
        filter: Some(std::sync::Arc::new(filter)),
        destinations: Some(4),
        target_rows_per_fragment: 10,
    };
    // A DELETE lands between the recluster's read and its commit; so does a compaction of
    // the two small fragments the recluster does not touch.
    s.sql("DELETE FROM t WHERE id IN (5, 22)").await.unwrap();
    s.sql("COMPACT t WITH (target_rows_per_fragment = 10)")
        .await
        .unwrap();
    let (after, m) = recluster(&before, &spec, &Progress::none()).await.unwrap();
    assert_eq!((m.fragments_removed, m.destinations), (4, 4));
    assert_eq!(
        after.manifest.reuse_ledger.len(),
        1,
        "the compaction needed no transition"
    );
    let mut ids: Vec<i64> = scan(&s, "SELECT id, k FROM t")
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    ids.sort();
    let expected: Vec<i64> = (0..46).filter(|i| ![5, 22].contains(i)).collect();
    assert_eq!(ids, expected);
    let q = "SELECT id, CAST(l2_distance(v, [21.2, 0]) AS BIGINT) FROM t \
             ORDER BY l2_distance(v, [21.2, 0]) LIMIT 3";
    let mut got: Vec<i64> = scan(&s, q).await.iter().map(|r| r.0).collect();
    got.sort();
    assert_eq!(got, vec![20, 21, 23]);

    // Corrupt the row map: the next session's KNN query fails clearly.
    let manifest = dir.latest().await.unwrap().manifest;
    let fragvec::ledger::Mapping::StablePartition {
        row_map,
        size_bytes,
    } = &manifest.reuse_ledger[0].mapping
    else {
        panic!("expected a stable partition");
    };
    use object_store::{ObjectStoreExt, PutPayload};
    let mut bytes = dir.read(row_map).await.unwrap().to_vec();
    assert_eq!(bytes.len() as u64, *size_bytes);
    let at = bytes.len() - 20;
    bytes[at] ^= 0x5a;
    dir.store()
        .put(&dir.path(row_map), PutPayload::from(bytes))
        .await
        .unwrap();
    let fresh = FragvecSession::open(&loc).await.unwrap();
    let err = fresh.sql_one(q).await.unwrap_err().to_string();
    assert!(
        err.contains("corrupt file") && err.contains(".rmap"),
        "{err}"
    );
    fresh.sql("SET fragvec.exact = true").await.unwrap();
    assert_eq!(fresh.sql_one(q).await.unwrap().num_rows(), 3);
}

/// An index change built on a version a rewrite has since replaced cannot commit as is:
/// its segment would own the rewritten rows a second time (or hold their old vectors). It
/// fails with a retryable conflict; through SQL the statement re-reads and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_changes_built_before_a_rewrite_conflict() {
    use fragvec::engine::index_ops;
    use fragvec::sql::OptimizeAction;
    let (_tmp, s) = scratch_session().await;
    s.sql(
        "CREATE TABLE t (id BIGINT, v VECTOR(2)); \
         INSERT INTO t SELECT value, [value, 0] FROM generate_series(0, 9); \
         INSERT INTO t SELECT value, [value, 0] FROM generate_series(10, 19); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 2); \
         INSERT INTO t SELECT value, [value, 0] FROM generate_series(20, 29)",
    )
    .await
    .unwrap();
    let dir = std::sync::Arc::new(s.database().table("t").unwrap());
    let before = dir.latest().await.unwrap();
    s.sql("COMPACT t").await.unwrap();
    let cache = fragvec::index::cache::IndexCache::new(1 << 20);
    let err = index_ops::optimize(
        before.clone(),
        "i",
        OptimizeAction::Merge(1),
        &cache,
        cache.budget(),
        &Progress::none(),
    )
    .await
    .unwrap_err();
    assert!(fragvec::engine::session::is_retryable(&err), "{err}");
    // Appending the fragment the compaction did not touch is still fine.
    let rows = index_ops::optimize(
        before.clone(),
        "i",
        OptimizeAction::Append,
        &cache,
        cache.budget(),
        &Progress::none(),
    )
    .await
    .unwrap();
    assert_eq!(rows, 10);
    s.sql("OPTIMIZE INDEX i ON t MERGE 2").await.unwrap();
    let q = "SELECT id, CAST(l2_distance(v, [14.2, 0]) AS BIGINT) FROM t \
             ORDER BY l2_distance(v, [14.2, 0]) LIMIT 4";
    let mut got: Vec<i64> = scan(&s, q).await.iter().map(|r| r.0).collect();
    got.sort();
    assert_eq!(got, vec![13, 14, 15, 16]);
}

/// A table dropped and created again under the same name (same fragment, segment and
/// transition ids) is not confused with the old one by the session's caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_tables_do_not_reuse_cached_translations() {
    let (_tmp, s) = scratch_session().await;
    let q = "SELECT id, CAST(l2_distance(v, [3.2, 0]) AS BIGINT) FROM t \
             ORDER BY l2_distance(v, [3.2, 0]) LIMIT 3";
    for (round, shift) in [(0, 0), (1, 100)] {
        s.sql(&format!(
            "CREATE TABLE t (id BIGINT, v VECTOR(2)); \
             INSERT INTO t SELECT value + {shift}, [value, 0] FROM generate_series(0, {}); \
             INSERT INTO t SELECT value + {shift}, [value, 0] FROM generate_series(10, 19); \
             CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 2); \
             DELETE FROM t WHERE id = {}; \
             COMPACT t",
            if round == 0 { 9 } else { 6 },
            shift + 4
        ))
        .await
        .unwrap();
        let mut got: Vec<i64> = scan(&s, q).await.iter().map(|r| r.0).collect();
        got.sort();
        assert_eq!(got, vec![shift + 2, shift + 3, shift + 5], "round {round}");
        s.sql("DROP TABLE t").await.unwrap();
    }
}

/// Statements making table `t (id, v VECTOR(8))` of ids 0..=`last` (many equal vectors, so
/// ties are common) with an IVF_FLAT index `i` of 8 partitions.
fn indexed_8d_table(last: u32) -> String {
    format!(
        "CREATE TABLE t (id BIGINT, v VECTOR(8)); \
         INSERT INTO t SELECT value, [value % 11, value % 7, value % 5, value % 3, value % 13, \
             value % 2, value % 17, value % 4] FROM generate_series(0, {last}); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 8)"
    )
}

/// Repeated KNN queries of one shape reuse their plan with each new vector (and a new
/// table version or option makes a new plan): every answer equals the exact one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_plans_answer_each_vector_exactly() {
    use rand::{Rng, SeedableRng};
    let (_tmp, s) = scratch_session().await;
    s.sql(&format!(
        "{}; SET fragvec.nprobes = 8",
        indexed_8d_table(499)
    ))
    .await
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let vectors: Vec<String> = (0..30)
        .map(|_| {
            let v: Vec<String> = (0..8)
                .map(|_| format!("{:.3}", rng.random_range(0.0..12.0f32)))
                .collect();
            format!("[{}]", v.join(", "))
        })
        .collect();
    let query = |v: &str| {
        format!(
            "SELECT id, CAST(l2_distance(v, {v}) * 1000 AS BIGINT) AS d FROM t \
             WHERE id % 3 <> 1 ORDER BY l2_distance(v, {v}) LIMIT 5"
        )
    };
    for round in 0..2 {
        let mut indexed = Vec::new();
        let reused_before = s.plans_reused();
        for v in &vectors {
            let mut got = scan(&s, &query(v)).await;
            // A reused plan orders its rows by a small sort of its own (KnnOrderExec).
            assert!(
                got.windows(2).all(|w| w[0].1 <= w[1].1),
                "round {round}, {v}: not nearest first: {got:?}"
            );
            got.sort_by_key(|(id, d)| (*d, *id));
            indexed.push(got);
        }
        // The first vector plans; every other one re-binds the kept plan.
        let reused = s.plans_reused() - reused_before;
        assert_eq!(reused, vectors.len() as u64 - 1, "round {round}");
        // Past an OFFSET: a reused plan keeps the sort's fetch, in order.
        for v in &vectors[..6] {
            let past = |tie: &str| {
                format!(
                    "SELECT id, CAST(l2_distance(v, {v}) * 1000 AS BIGINT) AS d FROM t \
                     ORDER BY l2_distance(v, {v}){tie} LIMIT 4 OFFSET 2"
                )
            };
            let got = scan(&s, &past("")).await;
            let want = scan(&s, &past(", id")).await;
            let d = |r: &Vec<(i64, i64)>| r.iter().map(|x| x.1).collect::<Vec<_>>();
            assert_eq!(d(&got), d(&want), "round {round}, {v}");
        }
        for (v, got) in vectors.iter().zip(&indexed) {
            // A sort on two keys is not a KNN query: a full scan and sort, independent of the
            // index (an exact search over an IVF_FLAT index reads its segments).
            let reference = format!(
                "SELECT id, CAST(l2_distance(v, {v}) * 1000 AS BIGINT) AS d FROM t \
                 WHERE id % 3 <> 1 ORDER BY l2_distance(v, {v}), id LIMIT 5"
            );
            let mut want = scan(&s, &reference).await;
            want.sort_by_key(|(id, d)| (*d, *id));
            // Ties at the k-th distance may pick different ids; distances must agree.
            let d = |r: &Vec<(i64, i64)>| r.iter().map(|x| x.1).collect::<Vec<_>>();
            assert_eq!(d(got), d(&want), "round {round}, {v}");
        }
        // A new version: the next round plans (and caches) again.
        s.sql("DELETE FROM t WHERE id % 10 = 0").await.unwrap();
    }
}

/// A plan holding `now()` or `random()` is never reused: those are folded into constants at
/// planning time, so a kept plan would answer every later query with the first one's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_with_time_or_randomness_are_not_reused() {
    let (_tmp, s) = scratch_session().await;
    s.sql(
        "CREATE TABLE t (id BIGINT, v VECTOR(8)); \
         INSERT INTO t SELECT value, [value % 11, value % 7, value % 5, value % 3, value % 13, \
             value % 2, value % 17, value % 4] FROM generate_series(0, 99); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 4)",
    )
    .await
    .unwrap();
    let before = s.plans_reused();
    let mut randoms = std::collections::HashSet::new();
    for i in 0..6 {
        let v = format!("[{i}, 1, 2, 3, 4, 5, 6, 7]");
        let r = s
            .sql_one(&format!(
                "SELECT id, now() AS t, CAST(random() * 1e9 AS BIGINT) AS r FROM t \
                 ORDER BY l2_distance(v, {v}) LIMIT 1"
            ))
            .await
            .unwrap();
        let b = r.batches.iter().find(|b| b.num_rows() > 0).unwrap();
        randoms.insert(b.column(2).as_primitive::<Int64Type>().value(0));
    }
    assert_eq!(
        s.plans_reused(),
        before,
        "a plan with now() / random() was reused"
    );
    assert!(randoms.len() > 1, "random() gave one value for every query");
    // The same shape without them is reused.
    for i in 0..3 {
        let v = format!("[{i}, 1, 2, 3, 4, 5, 6, 7]");
        s.sql_one(&format!(
            "SELECT id FROM t ORDER BY l2_distance(v, {v}) LIMIT 1"
        ))
        .await
        .unwrap();
    }
    assert!(s.plans_reused() > before);
}

on_local_and_s3!(knn_through_a_view_follows_every_commit);
/// A KNN query through a view, repeated after another session's DELETE and INSERT, answers
/// from the latest version every time (a kept plan would still hold the version it was
/// planned on: the other session's commits do not clear this session's plans).
async fn knn_through_a_view_follows_every_commit(db: Location) {
    let s = FragvecSession::open(db.url()).await.unwrap();
    // Every query must see the other session's commits at once (on S3 a query may otherwise
    // read up to `version_check_ms` behind another session).
    s.sql("SET fragvec.version_check_ms = 0").await.unwrap();
    s.sql(
        "CREATE TABLE t (id BIGINT, v VECTOR(8)); \
         INSERT INTO t SELECT value, [value, 0, 0, 0, 0, 0, 0, 0] FROM generate_series(1, 50); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 4); \
         CREATE VIEW w AS SELECT * FROM t",
    )
    .await
    .unwrap();
    let nearest = |q: i64| {
        let s = &s;
        async move {
            let r = s
                .sql_one(&format!(
                    "SELECT id FROM w ORDER BY l2_distance(v, [{q}, 0, 0, 0, 0, 0, 0, 0]) LIMIT 1"
                ))
                .await
                .unwrap();
            let b = r.batches.iter().find(|b| b.num_rows() > 0).unwrap();
            b.column(0).as_primitive::<Int64Type>().value(0)
        }
    };
    assert_eq!(nearest(10).await, 10);
    assert_eq!(nearest(20).await, 20);
    let other = FragvecSession::open(db.url()).await.unwrap();
    other.sql("DELETE FROM t WHERE id = 10").await.unwrap();
    let after_delete = nearest(10).await;
    assert!(after_delete == 9 || after_delete == 11, "{after_delete}");
    other
        .sql("INSERT INTO t VALUES (100, [10, 0, 0, 0, 0, 0, 0, 0])")
        .await
        .unwrap();
    assert_eq!(nearest(10).await, 100);
}

/// `ivf_partition` reads the partitions the index assigned (for rows it holds) instead of
/// searching centroids; both must agree, also after rows moved and an in-place update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_ivf_partitions_equal_computed_ones() {
    use datafusion::logical_expr::{ScalarFunctionArgs, ScalarUDFImpl};
    use fragvec::engine::cluster_udf::IvfPartition;
    use futures::StreamExt;
    let (_tmp, s) = scratch_session().await;
    s.sql(
        "CREATE TABLE t (id BIGINT, v VECTOR(2)) WITH (max_rows_per_fragment = 50); \
         INSERT INTO t SELECT value, [value * 1.7 % 31, value * 2.3 % 29] FROM generate_series(0, 199); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 6); \
         DELETE FROM t WHERE id % 9 = 0; \
         COMPACT t WITH (target_rows_per_fragment = 120, deletion_threshold = 0.05); \
         SET fragvec.update_mode = 'rewrite_columns'; \
         UPDATE t SET v = [30, 0] WHERE id = 7; \
         INSERT INTO t VALUES (500, [1, 1])",
    )
    .await
    .unwrap();
    let dir = std::sync::Arc::new(s.database().table("t").unwrap());
    let snapshot = dir.latest().await.unwrap();
    let cache = fragvec::index::cache::IndexCache::new(1 << 20);
    let keys = fragvec::engine::recluster::compile(
        &s.context().state(),
        &snapshot,
        &["ivf_partition(v)".to_string()],
        &cache,
    )
    .await
    .unwrap();
    assert!(keys.schema.index_of("_rowaddr").is_ok());
    let model = cache
        .model(&snapshot.dir, &snapshot.manifest.indexes[0])
        .await
        .unwrap();
    // Rows of fragments the segment still owns come from the index: all but the updated
    // fragments' (invalidated) and the new row.
    let known = fragvec::index::assigned::assigned_partitions(
        &snapshot,
        &snapshot.manifest.indexes[0],
        &model,
        &cache,
    )
    .await
    .unwrap();
    let from_index = known.values().flatten().filter(|p| **p != u32::MAX).count();
    assert!(from_index > 0, "no partition came from the index");
    let computed = IvfPartition::bound(model, None);
    let mut compared = 0;
    for f in &snapshot.manifest.fragments {
        let deleted = std::sync::Arc::new(snapshot.dir.read_deletions(f).await.unwrap());
        let mut rows = fragvec::rewrite::live_rows(&snapshot, f, deleted, keys.schema.clone());
        while let Some(batch) = rows.next().await {
            let batch = batch.unwrap();
            let known = keys.exprs[0]
                .evaluate(&batch)
                .unwrap()
                .into_array(batch.num_rows())
                .unwrap();
            let v = batch.column(keys.schema.index_of("v").unwrap()).clone();
            let field = std::sync::Arc::new(datafusion::arrow::datatypes::Field::new(
                "v",
                v.data_type().clone(),
                true,
            ));
            let args = ScalarFunctionArgs {
                args: vec![datafusion::logical_expr::ColumnarValue::Array(v)],
                arg_fields: vec![field],
                number_rows: batch.num_rows(),
                return_field: std::sync::Arc::new(datafusion::arrow::datatypes::Field::new(
                    "p",
                    datafusion::arrow::datatypes::DataType::UInt32,
                    true,
                )),
                config_options: std::sync::Arc::new(Default::default()),
            };
            let fresh = computed
                .invoke_with_args(args)
                .unwrap()
                .to_array(batch.num_rows())
                .unwrap();
            assert_eq!(known.as_ref(), fresh.as_ref());
            compared += batch.num_rows();
        }
    }
    assert_eq!(compared, 200 - 23 + 1);
}

/// `SET fragvec.exact = true` over an IVF_FLAT index scores every row exactly by reading
/// every partition of its segments (raw vectors, no Parquet decoding); rows no segment owns
/// come from the data files. Over an IVF_PQ index (codes, not vectors) it scores the data
/// files. Either way the answer equals a full scan and sort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_search_reads_flat_segments_and_equals_a_full_sort() {
    let (_tmp, s) = scratch_session().await;
    s.sql(&format!(
        "{}; DELETE FROM t WHERE id % 9 = 0; \
         INSERT INTO t SELECT value, [value % 3, value % 5, 1, 2, 3, 4, 5, 6] \
             FROM generate_series(20000, 20099); \
         SET fragvec.nprobes = 1; SET fragvec.exact = true",
        indexed_8d_table(9999)
    ))
    .await
    .unwrap();
    let v = "[3.5, 2, 1, 0.5, 6, 1, 8, 2]";
    let knn = format!(
        "SELECT id, CAST(l2_distance(v, {v}) * 1000 AS BIGINT) AS d FROM t \
         WHERE id % 4 <> 1 ORDER BY l2_distance(v, {v}) LIMIT 9"
    );
    let sorted = format!(
        "SELECT id, CAST(l2_distance(v, {v}) * 1000 AS BIGINT) AS d FROM t \
         WHERE id % 4 <> 1 ORDER BY l2_distance(v, {v}), id LIMIT 9"
    );
    let distances = |r: Vec<(i64, i64)>| {
        let mut d: Vec<i64> = r.into_iter().map(|x| x.1).collect();
        d.sort_unstable();
        d
    };
    let analyze = |s: &FragvecSession, q: String| {
        let s = s.clone();
        async move {
            let r = s.sql_one(&format!("EXPLAIN ANALYZE {q}")).await.unwrap();
            datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
                .unwrap()
                .to_string()
        }
    };
    let want = distances(scan(&s, &sorted).await);
    assert_eq!(distances(scan(&s, &knn).await), want);
    let plan = analyze(&s, knn.clone()).await;
    assert!(plan.contains("partitions_probed=8"), "{plan}");
    assert!(plan.contains("rows_from_unindexed_fragments=100"), "{plan}");

    s.sql(
        "DROP INDEX i ON t; CREATE VECTOR INDEX i ON t (v) USING IVF_PQ \
           WITH (num_partitions = 8, num_sub_vectors = 2)",
    )
    .await
    .unwrap();
    assert_eq!(distances(scan(&s, &knn).await), want);
    let plan = analyze(&s, knn).await;
    assert!(plan.contains("partitions_probed=0"), "{plan}");
}

/// A 24-dimensional IVF_FLAT index queried twice per vector: the second query finds its
/// partitions cached and quantized, rules most rows out from their codes (shown by
/// `EXPLAIN ANALYZE`), and answers exactly what a full sort answers, for every metric, with
/// deletions and a filter. Twice: with a budget that keeps the floats, and with one that
/// keeps only sketches (the rows not ruled out are then read from the segment file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantized_partitions_skip_rows_and_answer_what_a_full_sort_answers() {
    let (_tmp, s) = scratch_session().await;
    let parts: Vec<String> = (0..24)
        .map(|d| format!("CAST((value * {}) % {} AS FLOAT) / 3", d + 1, 7 + d))
        .collect();
    // 20,000 rows: 2.1 MB of floats and addresses, 2.8 MB with quantized rows, 1 MB of
    // sketches; a 2 MB budget keeps sketches only.
    for (budget, (metric, function)) in ["1000000000", "2000000"].into_iter().flat_map(|b| {
        [
            ("l2", "l2_distance"),
            ("cosine", "cosine_distance"),
            ("dot", "negative_inner_product"),
        ]
        .map(|m| (b, m))
    }) {
        s.sql(&format!(
            "SET fragvec.index_cache_bytes = 1000000000; \
             DROP TABLE IF EXISTS t; CREATE TABLE t (id BIGINT, v VECTOR(24)); \
             INSERT INTO t SELECT value, [{}] FROM generate_series(0, 19999); \
             CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT \
                 WITH (num_partitions = 10, metric = '{metric}'); \
             DELETE FROM t WHERE id % 11 = 0; SET fragvec.nprobes = 10; \
             SET fragvec.index_cache_bytes = {budget}",
            parts.join(", ")
        ))
        .await
        .unwrap();
        for probe in [5u64, 1234, 17999] {
            let v: Vec<String> = (0..24)
                .map(|d| format!("{}", ((probe * (d + 1)) % (7 + d)) as f32 / 3.0 + 0.05))
                .collect();
            let v = format!("[{}]", v.join(", "));
            let query = |tie_break: &str| {
                format!(
                    "SELECT id, CAST({function}(v, {v}) * 100000 AS BIGINT) AS d FROM t \
                     WHERE id % 4 <> 1 ORDER BY {function}(v, {v}){tie_break} LIMIT 7"
                )
            };
            let distances = |r: Vec<(i64, i64)>| {
                let mut d: Vec<i64> = r.into_iter().map(|x| x.1).collect();
                d.sort_unstable();
                d
            };
            let want = distances(scan(&s, &query(", id")).await);
            // First: partitions read and cached. Second: found again, quantized.
            for round in 0..2 {
                assert_eq!(
                    distances(scan(&s, &query("")).await),
                    want,
                    "{metric} {round} {budget}"
                );
            }
            let r = s
                .sql_one(&format!("EXPLAIN ANALYZE {}", query("")))
                .await
                .unwrap();
            let plan = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
                .unwrap()
                .to_string();
            // Counts print as `950` or `5.58 K`.
            let skipped: f64 = plan
                .split("rows_skipped_by_bound=")
                .nth(1)
                .and_then(|rest| {
                    let value = rest.split([',', ']']).next()?;
                    match value.strip_suffix(" K") {
                        Some(k) => k.parse::<f64>().ok().map(|k| k * 1000.0),
                        None => value.parse().ok(),
                    }
                })
                .unwrap_or_else(|| panic!("no rows_skipped_by_bound in {plan}"));
            assert!(skipped > 1000.0, "{metric} {budget}: {plan}");
        }
    }
}

/// A segment file damaged after the cache kept its partitions' sketches: the rows a query
/// then reads alone fail their own checksums, and the query is an error naming the file
/// and the row, never an answer from the damaged floats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_read_by_range_from_a_damaged_segment_are_refused() {
    let (tmp, s) = scratch_session().await;
    let parts: Vec<String> = (0..24)
        .map(|d| format!("CAST((value * {}) % {} AS FLOAT) / 3", d + 1, 7 + d))
        .collect();
    s.sql(&format!(
        "CREATE TABLE t (id BIGINT, v VECTOR(24)); \
         INSERT INTO t SELECT value, [{}] FROM generate_series(0, 19999); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 10); \
         SET fragvec.nprobes = 10; SET fragvec.index_cache_bytes = 2000000",
        parts.join(", ")
    ))
    .await
    .unwrap();
    let v = format!("[{}]", vec!["1.0"; 24].join(", "));
    let query = format!("SELECT id, id AS same FROM t ORDER BY l2_distance(v, {v}) LIMIT 5");
    let want = scan(&s, &query).await;
    assert_eq!(want.len(), 5);
    // Every float of the segment changed, its footer (and so its partitions' places) kept.
    let segments: Vec<_> = std::fs::read_dir(tmp.path().join("t/_indexes/i"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    let data = bytes.len() - 16 - 10 * 24 - 20;
    for b in &mut bytes[..data] {
        *b ^= 0x5a;
    }
    std::fs::write(&segments[0], &bytes).unwrap();
    let e = s.sql_one(&query).await.unwrap_err().to_string();
    assert!(
        e.contains(".seg") && e.contains("row") && e.contains("CRC32C"),
        "{e}"
    );
}

//! `fragvec.version_check_ms`: how many requests a query makes to find a table's newest
//! version, and which commits it sees. Counted with a `MeteredStore`; two sessions on one
//! in-memory store stand for two processes (each has its own database handle, so neither
//! knows what the other committed).

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;
use fragvec::engine::StatementResult;
use fragvec::format::Database;
use fragvec::format::metered_store::MeteredStore;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

async fn session_on(store: Arc<dyn ObjectStore>) -> FragvecSession {
    let db = Database::from_store(store, Path::default(), "memory://version-check".into());
    FragvecSession::with_context(SessionContext::new(), db)
        .await
        .unwrap()
}

/// A writer session and a metered reader session on one store holding `t`: 64 indexed rows
/// (ids 0..64, `[id, id]`) and 3 unindexed ones (ids 64..67).
async fn setup(version_check_ms: u64) -> (FragvecSession, FragvecSession, MeteredStore) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = session_on(store.clone()).await;
    let values = |ids: std::ops::Range<i64>| {
        ids.map(|i| format!("({i}, [{i}, {i}])"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writer
        .sql(&format!(
            "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(2));
             INSERT INTO t VALUES {};
             CREATE VECTOR INDEX t_emb ON t (emb) USING IVF_FLAT WITH (num_partitions = 4);
             INSERT INTO t VALUES {};",
            values(0..64),
            values(64..67)
        ))
        .await
        .unwrap();
    let metered = MeteredStore::new(store);
    let reader = session_on(Arc::new(metered.clone())).await;
    reader
        .sql_one(&format!(
            "SET fragvec.version_check_ms = {version_check_ms}"
        ))
        .await
        .unwrap();
    // Warm up: every partition (nprobes 16 > 4 partitions), the unindexed fragment's
    // vectors, the ids of both fragments.
    assert_eq!(nearest(&reader, 5.1).await, vec![5, 6, 4]);
    assert_eq!(nearest(&reader, 65.9).await, vec![66, 65, 64]);
    (writer, reader, metered)
}

/// The ids of the 3 rows nearest to `[x, x]`.
async fn nearest(session: &FragvecSession, x: f64) -> Vec<i64> {
    ids(&session
        .sql_one(&format!(
            "SELECT id FROM t ORDER BY l2_distance(emb, [{x}, {x}]) LIMIT 3"
        ))
        .await
        .unwrap())
}

fn ids(result: &StatementResult) -> Vec<i64> {
    result
        .batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

#[tokio::test]
async fn a_warm_knn_query_makes_no_request_within_the_interval() {
    let (_writer, reader, metered) = setup(60_000).await;
    let before = metered.round_trips();
    assert_eq!(nearest(&reader, 20.2).await, vec![20, 21, 19]);
    assert_eq!(nearest(&reader, 64.2).await, vec![64, 65, 63]); // unindexed rows too
    let made = metered.round_trips().since(&before);
    assert_eq!(made.requests(), 0, "{made}");
}

#[tokio::test]
async fn another_writers_commit_is_seen_once_the_interval_passes() {
    let (writer, reader, metered) = setup(60_000).await;
    writer
        .sql_one("INSERT INTO t VALUES (1000, [5.1, 5.1])")
        .await
        .unwrap();
    // Within the interval the reader still reads the version it knows, asking nothing.
    let before = metered.round_trips();
    assert_eq!(nearest(&reader, 5.1).await, vec![5, 6, 4]);
    assert_eq!(metered.round_trips().since(&before).requests(), 0);
    reader
        .sql_one("SET fragvec.version_check_ms = 50")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = metered.round_trips();
    assert_eq!(nearest(&reader, 5.1).await, vec![1000, 5, 6]);
    let made = metered.round_trips().since(&before);
    assert!(made.heads >= 1, "the newest version was checked: {made}");
}

#[tokio::test]
async fn with_a_zero_interval_every_query_checks_and_sees_every_commit() {
    let (writer, reader, metered) = setup(0).await;
    let before = metered.round_trips();
    assert_eq!(nearest(&reader, 5.1).await, vec![5, 6, 4]);
    let made = metered.round_trips().since(&before);
    assert!(made.heads >= 1 && made.lists == 0, "{made}");
    writer
        .sql_one("INSERT INTO t VALUES (1000, [5.1, 5.1])")
        .await
        .unwrap();
    assert_eq!(nearest(&reader, 5.1).await, vec![1000, 5, 6]);
    writer
        .sql_one("DELETE FROM t WHERE id = 1000")
        .await
        .unwrap();
    assert_eq!(nearest(&reader, 5.1).await, vec![5, 6, 4]);
}

#[tokio::test]
async fn a_sessions_own_commits_are_seen_at_once() {
    let (_writer, reader, metered) = setup(60_000).await;
    reader
        .sql_one("INSERT INTO t VALUES (1000, [5.1, 5.1])")
        .await
        .unwrap();
    let before = metered.round_trips();
    assert_eq!(nearest(&reader, 5.1).await, vec![1000, 5, 6]);
    let made = metered.round_trips().since(&before);
    // Finding the version costs nothing; only the new fragment's vectors are read.
    assert_eq!((made.heads, made.lists, made.gets), (0, 0, 0), "{made}");
    reader
        .sql_one("DELETE FROM t WHERE id = 1000")
        .await
        .unwrap();
    assert_eq!(nearest(&reader, 5.1).await, vec![5, 6, 4]);
}

#[tokio::test]
async fn statements_that_write_read_the_newest_version_whatever_the_interval() {
    let (writer, reader, _metered) = setup(60_000).await;
    writer
        .sql_one("INSERT INTO t VALUES (1000, [5.1, 5.1])")
        .await
        .unwrap();
    // The reader's queries would not see row 1000 yet; its DELETE must.
    let deleted = reader
        .sql_one("DELETE FROM t WHERE id = 1000")
        .await
        .unwrap();
    assert_eq!(deleted.rows_affected, Some(1));
    reader
        .sql_one("INSERT INTO t VALUES (1001, [5, 5])")
        .await
        .unwrap();
    let count = reader.sql_one("SELECT count(*) FROM t").await.unwrap();
    assert_eq!(ids(&count), vec![68]); // 67 + 1001 (1000 deleted)
}

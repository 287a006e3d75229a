//! Engine tests that need two sessions at once: concurrent statements on one table.

use datafusion::arrow::array::{AsArray, Int64Array};
use datafusion::arrow::datatypes::Int64Type;

use super::FragvecSession;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_inserts_from_two_sessions_all_land() {
    let tmp = tempfile::tempdir().unwrap();
    let loc = tmp.path().to_str().unwrap().to_string();
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
    let rows = ids_and_values(&a).await;
    let mut expected: Vec<(i64, i64)> = (0..15).chain(100..115).map(|i| (i, 0)).collect();
    expected.sort();
    assert_eq!(rows, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_delete_and_update_never_resurrect_or_lose_rows() {
    for mode in ["rewrite_rows", "rewrite_columns"] {
        let tmp = tempfile::tempdir().unwrap();
        let loc = tmp.path().to_str().unwrap().to_string();
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
        // Either order of the two statements gives the same table: odd ids, updated once.
        let rows = ids_and_values(&a).await;
        let expected: Vec<(i64, i64)> = (0..64).filter(|i| i % 2 == 1).map(|i| (i, 1)).collect();
        assert_eq!(rows, expected, "mode {mode}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_index_files_are_clear_errors_not_panics() {
    use object_store::{ObjectStoreExt, PutPayload};
    let tmp = tempfile::tempdir().unwrap();
    let loc = tmp.path().to_str().unwrap().to_string();
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

    // Exact mode does not touch the index and still answers.
    fresh.sql("SET fragvec.exact = true").await.unwrap();
    assert_eq!(fresh.sql_one(query).await.unwrap().num_rows(), 3);
}

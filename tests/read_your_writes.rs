//! The first query after another session's commit (same database handle, as `fragvec
//! serve`'s connections share one) takes the new fragment's rows and the new deletion
//! vector from what the writer held, without reading the files back, and answers exactly
//! what a handle that must read them answers. Counted with a `MeteredStore` trace.

use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Float32Type, Int64Type};
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;
use fragvec::engine::StatementResult;
use fragvec::format::Database;
use fragvec::format::metered_store::MeteredStore;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

mod support;

async fn session_on(store: Arc<dyn ObjectStore>) -> FragvecSession {
    let db = Database::from_store(store, Path::default(), "memory://read-your-writes".into());
    FragvecSession::with_context(SessionContext::new(), db)
        .await
        .unwrap()
}

fn values(ids: impl Iterator<Item = i64>) -> String {
    ids.map(|i| format!("({i}, [{i}, {}])", i * 2))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Ids and vectors of a `SELECT id, emb` answer.
fn rows(result: &StatementResult) -> Vec<(i64, Vec<f32>)> {
    let mut out = Vec::new();
    for b in &result.batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let embs = b.column(1).as_fixed_size_list();
        for i in 0..b.num_rows() {
            let v = embs.value(i);
            out.push((
                ids.value(i),
                v.as_primitive::<Float32Type>().values().to_vec(),
            ));
        }
    }
    out
}

const NEAREST: &str = "SELECT id, emb FROM t ORDER BY l2_distance(emb, [100.2, 200.4]) LIMIT 4";

#[tokio::test]
async fn the_first_query_after_a_commit_reads_neither_the_new_rows_nor_the_new_deletions() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let metered = MeteredStore::new(store.clone());
    let reader = session_on(Arc::new(metered.clone())).await;
    let writer = reader.new_sharing().await.unwrap();
    writer
        .sql(&format!(
            "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(2));
             INSERT INTO t VALUES {};
             CREATE VECTOR INDEX t_emb ON t (emb) USING IVF_FLAT WITH (num_partitions = 4);
             INSERT INTO t VALUES {};",
            values(0..64),
            values(64..70)
        ))
        .await
        .unwrap();
    reader.sql_one("SET fragvec.nprobes = 4").await.unwrap();
    reader.sql_one(NEAREST).await.unwrap(); // warm: partitions, ids, the unindexed rows

    metered.trace(true);
    // A new fragment next to the query vector, and a deleted row of the indexed fragment
    // it would otherwise return.
    writer
        .sql(&format!(
            "INSERT INTO t VALUES {}; DELETE FROM t WHERE id = 63",
            values([100, 101, 99].into_iter())
        ))
        .await
        .unwrap();
    metered.take_trace();
    let answer = rows(&reader.sql_one(NEAREST).await.unwrap());
    let reads: Vec<String> = metered
        .take_trace()
        .into_iter()
        .filter(|r| r.starts_with("GET") && (r.contains("/data/") || r.contains("/_deletions/")))
        .collect();
    assert!(
        reads.is_empty(),
        "read back what was just written: {reads:?}"
    );
    let ids: Vec<i64> = answer.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [100, 101, 99, 69]);
    assert_eq!(answer[0].1, [100.0, 200.0]);

    // A handle of its own reads the files, and answers the same.
    let cold = session_on(store).await;
    cold.sql_one("SET fragvec.nprobes = 4").await.unwrap();
    assert_eq!(rows(&cold.sql_one(NEAREST).await.unwrap()), answer);
    let near_63 = "SELECT id FROM t ORDER BY l2_distance(emb, [62.9, 125.8]) LIMIT 2";
    for session in [&reader, &cold] {
        let got = support::column::<Int64Type>(session, near_63).await;
        assert_eq!(got, [62, 64], "the deleted row 63 never comes back");
    }
}

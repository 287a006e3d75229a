//! A KNN query's WHERE filter is evaluated into the rows it passes once per table version and
//! filter (kept in the index cache, `filter_masks_reused` in `EXPLAIN ANALYZE`): the same
//! filter on the same version reuses them; any commit (insert, delete, update) makes a new
//! version whose rows are evaluated again; filters that differ in a literal's value or type,
//! and filters with a function (which may be volatile), are never taken for one another. The
//! answers are checked against a model of the table after every step.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use fragvec::engine::FragvecSession;

#[path = "support/knn_metrics.rs"]
mod knn_metrics;
use knn_metrics::knn_metric;

/// The model: id → (c, name); every row's vector is `[id, 0]`.
type Model = BTreeMap<i64, (i64, String)>;

async fn table() -> FragvecSession {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "memory://filter-masks-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let s = FragvecSession::open(&name).await.unwrap();
    s.sql("CREATE TABLE t (id BIGINT, c BIGINT, name TEXT, emb VECTOR(2))")
        .await
        .unwrap();
    s
}

async fn insert(s: &FragvecSession, model: &mut Model, ids: impl Iterator<Item = i64>) {
    let mut values = Vec::new();
    for id in ids {
        let (c, name) = (id % 5, format!("n{}", id % 3));
        values.push(format!("({id}, {c}, '{name}', [{id}, 0])"));
        model.insert(id, (c, name));
    }
    s.sql(&format!("INSERT INTO t VALUES {}", values.join(", ")))
        .await
        .unwrap();
}

/// The filters the test asks, each with what it keeps in the model.
type Keep = fn(i64, &(i64, String)) -> bool;
const FILTERS: [(&str, Keep); 7] = [
    ("c = 3", |_, r| r.0 == 3),
    ("c = 4", |_, r| r.0 == 4),
    // the same value as a float literal: another filter, with the same rows
    ("c = 3.0", |_, r| r.0 == 3),
    ("c IN (1, 2) AND name <> 'n0'", |_, r| {
        (r.0 == 1 || r.0 == 2) && r.1 != "n0"
    }),
    ("name = 'n1'", |_, r| r.1 == "n1"),
    ("NOT (c = 0) AND id > 40", |id, r| r.0 != 0 && id > 40),
    // a function: evaluated every time
    ("abs(c) = 2", |_, r| r.0 == 2),
];

/// The 4 ids nearest `q` (vectors `[id, 0]`) among the model's rows `keep` passes.
fn nearest(model: &Model, q: f64, keep: Keep) -> Vec<i64> {
    let mut ids: Vec<i64> = model
        .iter()
        .filter(|(id, r)| keep(**id, r))
        .map(|(id, _)| *id)
        .collect();
    ids.sort_by(|a, b| {
        (*a as f64 - q)
            .abs()
            .total_cmp(&(*b as f64 - q).abs())
            .then(a.cmp(b))
    });
    ids.truncate(4);
    ids
}

/// The answer of the KNN query with `filter`, and its `filter_masks_reused`.
async fn knn(s: &FragvecSession, filter: &str, q: f64) -> (Vec<i64>, usize) {
    let sql = format!("SELECT id FROM t WHERE {filter} ORDER BY emb <-> [{q}, 0] LIMIT 4");
    let reused = knn_metric(s, &sql, "filter_masks_reused").await;
    let ids = s.sql_one(&sql).await.unwrap().batches[0]
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    (ids, reused)
}

/// Asks every filter twice on the current version: the first evaluation of a plain filter
/// is kept and reused by the second (and by the query after `EXPLAIN ANALYZE`); a filter
/// with a function never is. Called after each commit: the version is new, so its first
/// query must evaluate the filter.
async fn ask_all(s: &FragvecSession, model: &Model, q: f64) {
    for (filter, keep) in FILTERS {
        let want = nearest(model, q, keep);
        let (first, first_reused) = knn(s, filter, q).await;
        assert_eq!(first, want, "{filter} at q = {q}");
        let (again, again_reused) = knn(s, filter, q + 0.5).await;
        assert_eq!(
            again,
            nearest(model, q + 0.5, keep),
            "{filter} at q = {q} + 0.5"
        );
        if filter.starts_with("abs(") {
            assert_eq!((first_reused, again_reused), (0, 0), "{filter}");
        } else {
            assert_eq!(first_reused, 0, "{filter}: reused on a new version");
            assert_eq!(again_reused, 1, "{filter}: not reused on the same version");
        }
    }
}

#[tokio::test]
async fn kept_filter_rows_follow_every_commit() {
    let s = table().await;
    let mut model = Model::new();
    for start in (0..200).step_by(50) {
        insert(&s, &mut model, start..start + 50).await;
    }
    s.sql("CREATE VECTOR INDEX ix ON t (emb) USING IVF_FLAT WITH (num_partitions = 4)")
        .await
        .unwrap();
    // exact over the index: the answers are the model's, whatever nprobes would miss
    s.sql("SET fragvec.exact = true").await.unwrap();
    ask_all(&s, &model, 100.25).await;

    // Delete the rows nearest the query that each filter keeps: a reused mask from the
    // version before would bring them back.
    let gone: Vec<i64> = FILTERS
        .iter()
        .flat_map(|(_, keep)| nearest(&model, 120.25, *keep))
        .collect();
    let list: Vec<String> = gone.iter().map(i64::to_string).collect();
    s.sql(&format!("DELETE FROM t WHERE id IN ({})", list.join(", ")))
        .await
        .unwrap();
    for id in &gone {
        model.remove(id);
    }
    ask_all(&s, &model, 120.25).await;

    // New rows (unindexed, scored by brute force through the same mask) ...
    insert(&s, &mut model, 500..520).await;
    ask_all(&s, &model, 510.25).await;

    // ... and an update that moves rows into and out of the filters.
    s.sql("UPDATE t SET c = 3, name = 'n1' WHERE id BETWEEN 505 AND 508")
        .await
        .unwrap();
    for id in 505..=508 {
        model.insert(id, (3, "n1".to_string()));
    }
    ask_all(&s, &model, 510.25).await;

    // COMPACT rewrites the fragments (same rows, new addresses): a new version again.
    s.sql("COMPACT t").await.unwrap();
    ask_all(&s, &model, 510.25).await;
}

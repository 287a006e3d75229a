//! KNN through plain `SessionContext::sql` on a context fragvec registered into: the query
//! vector written as pgvector's text form `'[...]'` is served by the index like an array
//! literal, gives the same rows and distances (bit for bit), and text that is not a vector is
//! a clear error.

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float32Type, Int64Type};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;

/// A registered context with a 4-d table of 300 rows, some NULL vectors, an IVF_FLAT index per
/// metric and rows added after them (an unindexed fragment, searched by brute force).
async fn indexed_context() -> (tempfile::TempDir, SessionContext, FragvecSession) {
    let tmp = tempfile::tempdir().unwrap();
    let ctx = SessionContext::new();
    let session = fragvec::register(&ctx, tmp.path().to_str().unwrap())
        .await
        .unwrap();
    session
        .sql(
            "CREATE TABLE t (id BIGINT, v VECTOR(4)); \
             INSERT INTO t SELECT value, CASE WHEN value % 29 = 0 THEN NULL ELSE \
                 [value % 11, value % 7 - 3.5, value % 5, value % 13 * 0.25] END \
                 FROM generate_series(0, 299); \
             CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 6); \
             CREATE VECTOR INDEX ic ON t (v) USING IVF_FLAT WITH (num_partitions = 6, metric = 'cosine'); \
             CREATE VECTOR INDEX id ON t (v) USING IVF_FLAT WITH (num_partitions = 6, metric = 'dot'); \
             INSERT INTO t VALUES (1000, [1.5, -0.5, 2, 0.75]), (1001, NULL); \
             SET fragvec.nprobes = 6",
        )
        .await
        .unwrap();
    (tmp, ctx, session)
}

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// (id, distance bits) of each row, in order.
fn rows(batches: &[RecordBatch]) -> Vec<(i64, Option<u32>)> {
    let mut out = vec![];
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let d = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i), d.is_valid(i).then(|| d.value(i).to_bits())));
        }
    }
    out
}

async fn explain(ctx: &SessionContext, sql: &str) -> String {
    pretty_format_batches(&collect(ctx, &format!("EXPLAIN {sql}")).await)
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_vector_is_served_by_the_index_like_an_array() {
    let (_tmp, ctx, session) = indexed_context().await;
    for (function, order) in [
        ("l2_distance", "ASC"),
        ("cosine_distance", "ASC"),
        ("negative_inner_product", "ASC"),
        ("inner_product", "DESC NULLS LAST"),
    ] {
        for (vector, filter) in [
            ("[1.25, -0.5, 3, 0.1]", ""),
            ("[0.3,2,-1,1e-1]", "WHERE id % 3 <> 0 "),
        ] {
            let query = |v: &str| {
                format!(
                    "SELECT id, {function}(v, {v}) AS d FROM t {filter}\
                     ORDER BY d {order}, id LIMIT 7"
                )
            };
            let knn = |v: &str| {
                format!(
                    "SELECT id, {function}(v, {v}) AS d FROM t {filter}ORDER BY d {order} LIMIT 7"
                )
            };
            let text = format!("'{vector}'");
            let plan = explain(&ctx, &knn(&text)).await;
            assert!(plan.contains("KnnExec"), "{function} {text}: {plan}");
            // The same rows and distance bits as the array literal, through the index, and as a
            // full sort (two sort keys are not a KNN query).
            let by_array = rows(&collect(&ctx, &knn(vector)).await);
            let by_text = rows(&collect(&ctx, &knn(&text)).await);
            assert_eq!(by_text, by_array, "{function} {text}");
            let sorted = rows(&collect(&ctx, &query(&text)).await);
            let distances = |r: &[(i64, Option<u32>)]| r.iter().map(|x| x.1).collect::<Vec<_>>();
            assert_eq!(distances(&by_text), distances(&sorted), "{function} {text}");
            assert_eq!(by_text.len(), 7);
            // The session's front end reads the text form the same way.
            let from_session = rows(&session.sql_one(&knn(&text)).await.unwrap().batches);
            assert_eq!(from_session, by_text, "{function} {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_vectors_in_projections_columns_and_nulls() {
    let (_tmp, ctx, _session) = indexed_context().await;
    // Text as either argument, and a NULL text, in a projection.
    let batches = collect(
        &ctx,
        "SELECT id, l2_distance('[0, 0, 0, 0]', v), l2_distance(v, CAST(NULL AS VARCHAR)) \
         FROM t WHERE id IN (1, 29) ORDER BY id",
    )
    .await;
    let b = &batches[0];
    let d = b.column(1).as_primitive::<Float32Type>();
    // Row 1 is [1, -2.5, 1, 0.25]; row 29's vector is NULL.
    let want = (1f32 + 6.25 + 1.0 + 0.0625).sqrt();
    assert_eq!(d.value(0).to_bits(), want.to_bits());
    assert!(d.is_null(1));
    assert_eq!(b.column(2).null_count(), 2);
    // A column of text: each row parsed.
    let batches = collect(
        &ctx,
        "SELECT l2_distance(v, s) FROM t \
         JOIN (VALUES (2, '[2, -1.5, 2, 0.5]'), (3, NULL)) AS q(id, s) ON t.id = q.id ORDER BY t.id",
    )
    .await;
    let d = batches[0].column(0).as_primitive::<Float32Type>();
    assert_eq!(d.value(0), 0.0);
    assert!(d.is_null(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_a_vector_is_a_clear_error() {
    let (_tmp, ctx, _session) = indexed_context().await;
    for (text, why) in [
        ("'[1, 2, x, 4]'", "is not a vector"),
        ("'1, 2, 3, 4'", "is not a vector"),
        ("'[1, 2, NaN, 4]'", "is not a vector"),
        ("'[]'", "is not a vector"),
        ("'[1, 2, 3]'", "dimensions differ"),
    ] {
        let sql = format!("SELECT id FROM t ORDER BY l2_distance(v, {text}) LIMIT 3");
        let err = match ctx.sql(&sql).await {
            Ok(df) => df.collect().await.expect_err(&sql).to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(why), "{sql}: {err}");
    }
    // A long text is quoted by its start only.
    let long = format!("'[{}, oops]'", vec!["1"; 200].join(", "));
    let err = ctx
        .sql(&format!("SELECT l2_distance(v, {long}) FROM t"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("...' is not a vector") && err.len() < 400,
        "{err}"
    );
}

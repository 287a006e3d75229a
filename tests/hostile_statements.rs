//! Hostile input through SQL: every statement below must come back as a clear error or a
//! correct result, within a time bound — never a panic, an abort or a hang. A server
//! embedding fragvec must survive any one query.

use std::time::Duration;

use fragvec::FragvecSession;

/// What a statement must do.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// An error whose message contains this text.
    Error(&'static str),
    /// Success with this many rows.
    Rows(usize),
    /// Success, whatever the rows.
    Ok,
}

use Expect::{Error, Ok as Fine, Rows};

const SETUP: &str = "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(3)); \
    INSERT INTO t SELECT value, [value % 7, value % 5, value % 3] FROM generate_series(1, 200); \
    INSERT INTO t VALUES (1000, NULL); \
    CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 4)";

const CASES: &[(&str, Expect)] = &[
    // LIMIT and OFFSET far beyond the rows, or negative.
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 1000000000000",
        Rows(201),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 5 OFFSET 9223372036854775807",
        Rows(0),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 18446744073709551615",
        Error("18446744073709551615"),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT -1",
        Error(""),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 3 OFFSET -5",
        Error(""),
    ),
    (
        "SELECT * FROM knn('t', 'emb', [1, 1, 1], 1000000000000)",
        Rows(201),
    ),
    ("SELECT * FROM knn('t', 'emb', [1, 1, 1], -3)", Error("")),
    (
        "SELECT * FROM knn('t', 'emb', [1, 1, 1], 0)",
        Error("k must be a positive integer"),
    ),
    // NaN, infinities and NULL elements in query vectors.
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [CAST('NaN' AS DOUBLE), 1, 1]) LIMIT 3",
        Fine,
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [CAST('inf' AS DOUBLE), 1, 1]) LIMIT 3",
        Fine,
    ),
    (
        "SELECT id FROM t ORDER BY cosine_distance(emb, [0, 0, 0]) LIMIT 3",
        Fine,
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, NULL, 1]) LIMIT 3",
        Fine,
    ),
    (
        "SELECT l2_distance(emb, [1, NULL, 1]) FROM t WHERE id = 1",
        Rows(1),
    ),
    // NaN / NULL elements and wrong shapes on insert.
    (
        "INSERT INTO t VALUES (2000, [1, NULL, 1])",
        Error("NULL element"),
    ),
    ("INSERT INTO t VALUES (2001, [1, 2])", Error("")),
    ("INSERT INTO t VALUES (2002, [])", Error("")),
    (
        "INSERT INTO t VALUES (NULL, [1, 2, 3])",
        Error("non-nullable"),
    ),
    // Wrong dimensions and empty vectors in queries.
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1]) LIMIT 3",
        Error("dimension"),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, []) LIMIT 3",
        Error(""),
    ),
    ("SELECT * FROM knn('t', 'emb', [1, 1, 1, 1], 3)", Error("")),
    ("SELECT * FROM knn('t', 'nope', [1, 1, 1], 3)", Error("")),
    ("SELECT * FROM knn('nope', 'emb', [1, 1, 1], 3)", Error("")),
    // Path-like and odd table names.
    ("CREATE TABLE \"../evil\" (id BIGINT)", Error("")),
    ("CREATE TABLE \"a/b\" (id BIGINT)", Error("")),
    ("SELECT * FROM fragvec_fragments('../t')", Error("")),
    ("SELECT * FROM fragvec_versions('')", Error("")),
    ("DROP TABLE \"..\"", Error("")),
    // Unknown options and impossible index settings.
    (
        "CREATE TABLE o (id BIGINT) WITH (frobnicate = 1)",
        Error("unknown table option"),
    ),
    (
        "CREATE TABLE o (id BIGINT) WITH (max_rows_per_fragment = 0)",
        Error("max_rows_per_fragment"),
    ),
    ("SET fragvec.nonsense = 1", Error("")),
    ("SET fragvec.nprobes = -1", Error("")),
    (
        "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (num_partitions = 0)",
        Error("num_partitions"),
    ),
    (
        "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (num_partitions = 1000000)",
        Error("num_partitions must be between 1 and 65536"),
    ),
    (
        "CREATE VECTOR INDEX k ON t (emb) USING IVF_PQ WITH (num_sub_vectors = 2)",
        Error(""),
    ),
    (
        "CREATE VECTOR INDEX k ON t (id) USING IVF_FLAT",
        Error("not a vector column"),
    ),
    (
        "OPTIMIZE INDEX i ON t MERGE 0",
        Error("MERGE n needs n >= 1"),
    ),
    ("COMPACT t WITH (target_rows_per_fragment = -1)", Error("")),
    ("COMPACT t WITH (max_source_fragments = 0)", Error("")),
    ("RECLUSTER t BY (id) WITH (destinations = 0)", Error("")),
    ("RECLUSTER t BY (no_such_column)", Error("")),
    ("VACUUM t RETAIN 0 VERSIONS", Error("")),
    // Versions that do not exist.
    ("SELECT * FROM t VERSION AS OF 999", Error("version 999")),
    ("SELECT * FROM t VERSION AS OF 0", Error("")),
    ("SELECT * FROM t VERSION AS OF -1", Error("")),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_statements_give_clear_errors_or_correct_results() {
    let tmp = tempfile::tempdir().unwrap();
    let s = FragvecSession::open(tmp.path().to_str().unwrap())
        .await
        .unwrap();
    s.sql(SETUP).await.unwrap();
    let mut wrong = Vec::new();
    for (sql, expect) in CASES {
        let run = tokio::time::timeout(Duration::from_secs(60), s.sql_one(sql)).await;
        let Ok(result) = run else {
            wrong.push(format!("{sql}: no answer within 60 s"));
            continue;
        };
        match (expect, result) {
            (Error(text), Err(e)) => {
                let msg = e.to_string();
                if !msg.contains(text) {
                    wrong.push(format!("{sql}: error {msg:?} does not say {text:?}"));
                }
                if msg.trim().is_empty() {
                    wrong.push(format!("{sql}: an empty error message"));
                }
            }
            (Error(_), Ok(r)) => wrong.push(format!(
                "{sql}: expected an error, got {} rows",
                r.num_rows()
            )),
            (Rows(n), Ok(r)) if r.num_rows() != *n => {
                wrong.push(format!("{sql}: {} rows, expected {n}", r.num_rows()))
            }
            (Rows(_) | Fine, Ok(_)) => {}
            (Rows(_) | Fine, Err(e)) => wrong.push(format!("{sql}: unexpected error {e}")),
        }
    }
    // The table is intact afterwards.
    let r = s.sql_one("SELECT count(*) FROM t").await.unwrap();
    let n = r.batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Int64Array>()
        .unwrap()
        .value(0);
    assert_eq!(n, 201);
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}

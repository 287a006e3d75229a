//! Hostile statements and what each must do: a clear error or a correct result. Run in
//! process with a time bound by `tests/hostile_statements.rs` and through `fragvec`
//! processes (where an abort would show) by the reliability suite.

// Each test crate includes this module and uses some of it.
#![allow(dead_code)]

/// What a statement must do.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// An error whose message contains this text.
    Error(&'static str),
    /// Success with this many rows.
    Rows(usize),
    /// Success, whatever the rows.
    Ok,
    /// Either a clear (non-empty) error or success: input whose meaning is open, where only
    /// surviving it in time is required.
    Survives,
}

use Expect::{Error, Ok as Fine, Rows, Survives};

pub const SETUP: &str = "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(3)); \
    INSERT INTO t SELECT value, [value % 7, value % 5, value % 3] FROM generate_series(1, 200); \
    INSERT INTO t VALUES (1000, NULL); \
    CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 4)";

pub const CASES: &[(&str, Expect)] = &[
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
    // More LIMIT / OFFSET arithmetic at the edges.
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) OFFSET 9223372036854775807",
        Rows(0),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) \
         LIMIT 9223372036854775807 OFFSET 9223372036854775807",
        Rows(0),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 0",
        Rows(0),
    ),
    (
        "SELECT id FROM t LIMIT 1000000000000 OFFSET 1000000000000",
        Rows(0),
    ),
    (
        "SELECT * FROM knn('t', 'emb', [1, 1, 1], 1000000000000, id > 190)",
        Fine,
    ),
    // Non-finite and out-of-range elements in query vectors.
    (
        "SELECT * FROM knn('t', 'emb', [CAST('NaN' AS DOUBLE), 1, 1], 3)",
        Fine,
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1e39, 1, 1]) LIMIT 3",
        Fine,
    ),
    (
        "SELECT id FROM t ORDER BY inner_product(emb, [CAST('-inf' AS DOUBLE), 1, 1]) DESC LIMIT 3",
        Fine,
    ),
    (
        "SELECT id FROM t ORDER BY cosine_distance(emb, [CAST('NaN' AS DOUBLE), 0, 0]) LIMIT 3",
        Fine,
    ),
    ("SELECT * FROM knn('t', 'emb', [], 3)", Error("")),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, '[1, 1]') LIMIT 3",
        Error("dimension"),
    ),
    // Non-finite vectors refused, then the table indexed and searched.
    ("CREATE TABLE h (id BIGINT NOT NULL, emb VECTOR(3))", Fine),
    (
        "INSERT INTO h SELECT value, [value % 7, value % 5, value % 3] FROM generate_series(1, 50)",
        Fine,
    ),
    (
        "INSERT INTO h VALUES (100, [CAST('NaN' AS DOUBLE), 1, 1])",
        Error("NaN or an infinite value"),
    ),
    (
        "INSERT INTO h VALUES (101, [CAST('inf' AS DOUBLE), 1, 1])",
        Error("NaN or an infinite value"),
    ),
    ("INSERT INTO h VALUES (102, [1e39, 1, 1])", Error("")),
    ("INSERT INTO h VALUES (103, [1, 2, 3, 4])", Error("")),
    (
        "CREATE VECTOR INDEX hi ON h (emb) USING IVF_FLAT WITH (num_partitions = 2)",
        Survives,
    ),
    (
        "SELECT id FROM h ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 5",
        Rows(5),
    ),
    (
        "SELECT id FROM h ORDER BY cosine_distance(emb, [1, 1, 1]) LIMIT 5",
        Rows(5),
    ),
    // Vector types of impossible sizes.
    ("CREATE TABLE z0 (v VECTOR(0))", Survives),
    ("CREATE TABLE z1 (v VECTOR(-1))", Error("")),
    ("CREATE TABLE z2 (v VECTOR(4294967296))", Error("")),
    // Path-like, empty, reserved and over-long names.
    ("SELECT * FROM \"../t\"", Error("")),
    // "." is a valid quoted name since table folders are named `=hex` when not plain.
    ("CREATE TABLE \".\" (id BIGINT)", Survives),
    ("CREATE TABLE \"\" (id BIGINT)", Error("")),
    ("CREATE TABLE \"_versions\" (id BIGINT)", Survives),
    ("CREATE TABLE \"a\\b\" (id BIGINT)", Survives),
    (
        concat!(
            "CREATE TABLE \"",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "\" (id BIGINT)"
        ),
        Survives,
    ),
    ("CREATE VIEW \"../v\" AS SELECT 1 AS one", Error("")),
    ("DROP VIEW \"../../etc\"", Error("")),
    // Unknown options and values.
    (
        "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (frobnicate = 1)",
        Error(""),
    ),
    (
        "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (metric = 'manhattan')",
        Error(""),
    ),
    ("CREATE VECTOR INDEX j ON t (emb) USING HNSW", Error("")),
    ("COMPACT t WITH (frobnicate = 1)", Error("")),
    ("RECLUSTER t BY (id) WITH (frobnicate = 1)", Error("")),
    ("SET fragvec.update_mode = 'sideways'", Error("")),
    ("SET fragvec.commit_retries = -1", Error("")),
    // Zero partitions, sub-vectors, probes, samples and fragment sizes.
    (
        "CREATE VECTOR INDEX j ON t (emb) USING IVF_PQ WITH (num_partitions = 2, num_sub_vectors = 0)",
        Error(""),
    ),
    (
        "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (num_partitions = 2, sample_size = 0)",
        Survives,
    ),
    ("DROP INDEX IF EXISTS j ON t", Fine),
    (
        "RECLUSTER t BY (id) WITH (target_rows_per_fragment = 0)",
        Error(""),
    ),
    ("SET fragvec.nprobes = 0", Survives),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 5",
        Rows(5),
    ),
    ("SET fragvec.nprobes = 16", Fine),
    // More versions that do not exist.
    (
        "SELECT * FROM t VERSION AS OF 18446744073709551615",
        Error(""),
    ),
    (
        "SELECT * FROM t VERSION AS OF 99999999999999999999",
        Error(""),
    ),
    ("SELECT * FROM fragvec_versions('nope')", Error("")),
    // Exact search with the same edges.
    ("SET fragvec.exact = true", Fine),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 1000000000000",
        Rows(201),
    ),
    (
        "SELECT id FROM t ORDER BY l2_distance(emb, [1, 1, 1]) LIMIT 5 OFFSET 9223372036854775807",
        Rows(0),
    ),
    (
        "SELECT * FROM knn('t', 'emb', [1, 1, 1], 1000000000000)",
        Rows(201),
    ),
    ("SET fragvec.exact = false", Fine),
];

/// What is wrong with how `sql` ended (`Ok(rows)` or `Err(message)`), if anything.
pub fn judge(sql: &str, expect: Expect, result: Result<usize, String>) -> Option<String> {
    match (expect, result) {
        (Error(_) | Survives, Err(msg)) if msg.trim().is_empty() => {
            Some(format!("{sql}: an empty error message"))
        }
        (Error(text), Err(msg)) if !msg.contains(text) => {
            Some(format!("{sql}: error {msg:?} does not say {text:?}"))
        }
        (Error(_) | Survives, Err(_)) => None,
        (Error(_), Ok(n)) => Some(format!("{sql}: expected an error, got {n} rows")),
        (Rows(n), Ok(got)) if got != n => Some(format!("{sql}: {got} rows, expected {n}")),
        (Rows(_) | Fine | Survives, Ok(_)) => None,
        (Rows(_) | Fine, Err(e)) => Some(format!("{sql}: unexpected error {e}")),
    }
}

//! A repeated KNN text answered on its kept plan without parsing (`engine::statements::shapes`):
//! the answers are the full path's, and every condition the kept plan depends on (the
//! table's schema and indexes, options, the text outside the vectors, the same vector written
//! twice) sends the text back to the full path when it changed. Rows another session
//! commits are read by the kept plan moved on to the new version.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use fragvec::engine::FragvecSession;
use rand::{Rng, SeedableRng};

async fn table(path: &str) -> FragvecSession {
    let s = FragvecSession::open(path).await.unwrap();
    s.sql(&table_sql(0)).await.unwrap();
    s
}

/// The statements that make table `t` (three commits), its ids from `first_id` on.
fn table_sql(first_id: i64) -> String {
    format!(
        "CREATE TABLE t (id BIGINT, c BIGINT, v VECTOR(8)); \
         INSERT INTO t SELECT value + {first_id}, value % 3, [value % 11, value % 7, value % 5, \
             value % 3, value % 13, value % 2, value % 17, value % 4] \
             FROM generate_series(0, 599); \
         CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 8)"
    )
}

fn vectors(n: usize, seed: u64) -> Vec<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: Vec<String> = (0..8)
                .map(|_| format!("{:.3}", rng.random_range(-2.0..14.0f32)))
                .collect();
            format!("[{}]", v.join(", "))
        })
        .collect()
}

/// (id, distance × 1000) rows of a query's answer.
async fn rows(s: &FragvecSession, sql: &str) -> Vec<(i64, i64)> {
    let r = s.sql_one(sql).await.unwrap();
    let mut out = Vec::new();
    for b in &r.batches {
        let a = b.column(0).as_primitive::<Int64Type>();
        let d = b.column(1).as_primitive::<Int64Type>();
        out.extend(a.values().iter().zip(d.values()).map(|(x, y)| (*x, *y)));
    }
    out
}

fn knn(v: &str) -> String {
    format!(
        "SELECT id, CAST(l2_distance(v, {v}) * 1000 AS BIGINT) AS d FROM t \
         WHERE c <> 1 ORDER BY l2_distance(v, {v}) LIMIT 7"
    )
}

/// The answers of texts run from their shape are those of a fresh session planning each one
/// in full, and texts of one shape after the first are answered from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shape_answers_equal_full_planning() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_str().unwrap();
    let s = table(path).await;
    let vs = vectors(25, 7);
    let mut got = Vec::new();
    for v in &vs {
        got.push(rows(&s, &knn(v)).await);
    }
    assert!(
        s.shapes_reused() >= vs.len() as u64 - 2,
        "only {} of {} texts were answered from their shape",
        s.shapes_reused(),
        vs.len()
    );
    for (v, got) in vs.iter().zip(&got) {
        // A new session has no kept plan or shape: it plans the text in full.
        let fresh = FragvecSession::open(path).await.unwrap();
        assert_eq!(&rows(&fresh, &knn(v)).await, got, "{v}");
        assert_eq!(fresh.shapes_reused(), 0);
    }
}

/// A commit by another session, a SET, and a different text outside the vectors each send
/// the next text to the full path, whose answer reflects the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_conditions_take_the_full_path() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_str().unwrap();
    let s = table(path).await;
    let vs = vectors(4, 11);
    for v in &vs {
        rows(&s, &knn(v)).await;
    }
    // Another session deletes the nearest row: this session's next text must not miss it.
    let nearest = rows(&s, &knn(&vs[0])).await[0].0;
    let before = s.shapes_reused();
    assert!(before >= 3);
    let other = FragvecSession::open(path).await.unwrap();
    other
        .sql(&format!("DELETE FROM t WHERE id = {nearest}"))
        .await
        .unwrap();
    let after_delete = rows(&s, &knn(&vs[0])).await;
    assert!(after_delete.iter().all(|(id, _)| *id != nearest));
    // The kept plan moved on to the new version (same schema, same index): still answered
    // from the shape, with the fresh session's answer.
    assert_eq!(s.shapes_reused(), before + 1);
    let fresh = FragvecSession::open(path).await.unwrap();
    assert_eq!(rows(&fresh, &knn(&vs[0])).await, after_delete);
    rows(&s, &knn(&vs[1])).await;
    rows(&s, &knn(&vs[2])).await;
    let learnt = s.shapes_reused();
    assert_eq!(learnt, before + 3);
    // An option set on the DataFusion context directly (the session sees no SET statement
    // and keeps its plans): the shape was learnt under other options, so the full path runs.
    s.context()
        .sql("SET fragvec.exact = true")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let exact = rows(&s, &knn(&vs[3])).await;
    assert_eq!(s.shapes_reused(), learnt);
    let fresh = FragvecSession::open(path).await.unwrap();
    fresh.sql("SET fragvec.exact = true").await.unwrap();
    assert_eq!(rows(&fresh, &knn(&vs[3])).await, exact);
    s.sql("SET fragvec.exact = false").await.unwrap();
    // Another filter outside the vectors is another shape.
    rows(&s, &knn(&vs[3])).await;
    let learnt = s.shapes_reused();
    let text = knn(&vs[3]).replace("c <> 1", "c <> 2");
    let r = rows(&s, &text).await;
    assert_eq!(s.shapes_reused(), learnt);
    assert!(r.iter().all(|(id, _)| id % 3 != 2));
}

/// The same vector written twice is one parameter: a later text writing two different
/// vectors in those places is planned in full, not bound as if they were one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vector_written_twice_binds_once() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_str().unwrap();
    let s = table(path).await;
    let vs = vectors(6, 3);
    for v in &vs[..3] {
        rows(&s, &knn(v)).await;
    }
    let reused = s.shapes_reused();
    assert!(reused >= 1);
    let mixed = format!(
        "SELECT id, CAST(l2_distance(v, {}) * 1000 AS BIGINT) AS d FROM t \
         WHERE c <> 1 ORDER BY l2_distance(v, {}) LIMIT 7",
        vs[4], vs[5]
    );
    let got = rows(&s, &mixed).await;
    assert_eq!(s.shapes_reused(), reused, "two vectors were bound as one");
    let fresh = FragvecSession::open(path).await.unwrap();
    assert_eq!(rows(&fresh, &mixed).await, got);
}

/// A table dropped and made again by another session reaches the same version numbers: the
/// kept shape's version check passes, and only the manifest's identity tells the tables
/// apart. The next text must read the new table, not the kept plan's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_made_again_at_the_same_version_is_read_afresh() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_str().unwrap();
    let s = table(path).await;
    let vs = vectors(4, 5);
    for v in &vs[..3] {
        rows(&s, &knn(v)).await;
    }
    let reused = s.shapes_reused();
    assert!(reused >= 1);
    // The same statements as `table`, with ids shifted: as many commits, other rows.
    let other = FragvecSession::open(path).await.unwrap();
    other
        .sql(&format!("DROP TABLE t; {}", table_sql(1000)))
        .await
        .unwrap();
    let got = rows(&s, &knn(&vs[3])).await;
    assert!(
        !got.is_empty() && got.iter().all(|(id, _)| *id >= 1000),
        "{got:?}"
    );
    let fresh = FragvecSession::open(path).await.unwrap();
    assert_eq!(rows(&fresh, &knn(&vs[3])).await, got);
}

/// Commits that change only rows (INSERT, DELETE, UPDATE, COMPACT, an index segment
/// appended) move the kept plan on to the new version; commits that change what the plan
/// depends on (a column added, the index dropped or made again) send the text to the full
/// path. Every answer is a fresh session's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_commits_move_the_plan_on_and_schema_or_index_changes_replan() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_str().unwrap();
    let s = table(path).await;
    let other = FragvecSession::open(path).await.unwrap();
    let vs = vectors(40, 13);
    let mut next = vs.iter();
    let mut ask = async |s: &FragvecSession| {
        let v = next.next().unwrap();
        // Rows at equal distances (single rows inserted with one vector) may come in
        // either order: ORDER BY leaves ties unordered, and a kept plan's sort and a fresh
        // plan's need not agree.
        let by_distance = |mut r: Vec<(i64, i64)>| {
            r.sort_unstable_by_key(|(id, d)| (*d, *id));
            r
        };
        let got = by_distance(rows(s, &knn(v)).await);
        let fresh = FragvecSession::open(path).await.unwrap();
        assert_eq!(by_distance(rows(&fresh, &knn(v)).await), got, "{v}");
        got
    };
    ask(&s).await;
    ask(&s).await;
    // What the next text does after each commit: moves the kept plan on (1), is planned in
    // full and its plan kept again (0), or is planned in full with no index to keep a plan
    // for (none).
    let commits: [(&str, Option<u64>); 9] = [
        (
            "INSERT INTO t SELECT value, value % 3, [value % 9, 1, 2, 3, 4, 5, 6, 7] \
             FROM generate_series(600, 699)",
            Some(1),
        ),
        ("DELETE FROM t WHERE id % 5 = 0", Some(1)),
        (
            "UPDATE t SET v = [0, 0, 0, 0, 0, 0, 0, 0] WHERE id % 7 = 1",
            Some(1),
        ),
        ("OPTIMIZE INDEX i ON t APPEND", Some(1)),
        ("COMPACT t", Some(1)),
        // A table made again with another column, past the version the plan read.
        (WIDER, Some(0)),
        (
            "INSERT INTO t (id, c, v) VALUES (5000, 0, [1, 1, 1, 1, 1, 1, 1, 1])",
            Some(1),
        ),
        ("DROP INDEX i ON t", None),
        (
            "CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 4)",
            Some(0),
        ),
    ];
    for (sql, reused) in commits {
        if sql == WIDER {
            let newest = newest_version(&other).await;
            other
                .sql(
                    "DROP TABLE t; CREATE TABLE t (id BIGINT, c BIGINT, v VECTOR(8), w BIGINT); \
                     INSERT INTO t SELECT value, value % 3, [value % 11, value % 7, 5, 3, \
                         value % 13, 2, 1, 4], value * 2 FROM generate_series(0, 599); \
                     CREATE VECTOR INDEX i ON t (v) USING IVF_FLAT WITH (num_partitions = 8)",
                )
                .await
                .unwrap();
            for id in 100_000.. {
                if newest_version(&other).await > newest {
                    break;
                }
                let one = format!(
                    "INSERT INTO t VALUES ({id}, 0, [1, 2, 3, 4, 5, 6, 7, {}], 0)",
                    id - 99_990
                );
                other.sql(&one).await.unwrap();
            }
        } else {
            other.sql(sql).await.unwrap();
        }
        let before = s.shapes_reused();
        ask(&s).await;
        assert_eq!(
            s.shapes_reused(),
            before + reused.unwrap_or(0),
            "after {sql}"
        );
        // The next text is answered from the shape, when a plan is kept.
        let before = s.shapes_reused();
        ask(&s).await;
        let expected = before + u64::from(reused.is_some());
        assert_eq!(s.shapes_reused(), expected, "after {sql}");
    }
}

const WIDER: &str = "(a wider table)";

async fn newest_version(s: &FragvecSession) -> i64 {
    let r = s
        .sql_one("SELECT CAST(max(version) AS BIGINT) FROM fragvec_versions('t')")
        .await
        .unwrap();
    r.batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

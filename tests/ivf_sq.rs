//! IVF_SQ: an index of scalar codes that keeps no floats and re-ranks from the table's own
//! data files. Its answers are IVF_FLAT's at every `nprobes` (the same model routes both:
//! same sample, same seed), through every kind of change a table goes through.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use fragvec::FragvecSession;

const DIM: usize = 24;

/// A vector literal of expressions of `column`, spread so that no two rows' distances tie
/// (`salt` makes another set).
fn spread(column: &str, salt: usize) -> String {
    let parts: Vec<String> = (0..DIM)
        .map(|d| {
            format!(
                "CAST(({column} * {} + {}) % 10007 AS FLOAT) / 100.0",
                7919 + 31 * d + salt,
                104_729 * (d + 1 + salt)
            )
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// `CREATE TABLE name` with 3,000 rows of 24 dimensions.
fn table(name: &str) -> String {
    format!(
        "CREATE TABLE {name} (id BIGINT, v VECTOR({DIM})) WITH (max_rows_per_fragment = 700); \
         INSERT INTO {name} SELECT value, {} FROM generate_series(0, 2999)",
        spread("value", 0)
    )
}

fn query_vector(seed: usize) -> String {
    let v: Vec<String> = (0..DIM)
        .map(|d| format!("{}", ((seed * 37 + d * 11) % 100) as f32))
        .collect();
    format!("[{}]", v.join(", "))
}

/// `(id, distance × 1000)` of the 10 nearest rows of `t`, sorted by distance then id.
async fn knn(s: &FragvecSession, t: &str, function: &str, q: &str) -> Vec<(i64, i64)> {
    let r = s
        .sql_one(&format!(
            "SELECT id, CAST({function}(v, {q}) * 1000000 AS BIGINT) AS d FROM {t} \
             WHERE id % 7 <> 3 ORDER BY {function}(v, {q}) LIMIT 10"
        ))
        .await
        .unwrap();
    let mut out = Vec::new();
    for b in &r.batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let ds = b.column(1).as_primitive::<Int64Type>();
        out.extend(ids.values().iter().zip(ds.values()).map(|(i, d)| (*i, *d)));
    }
    out.sort_by_key(|(i, d)| (*d, *i));
    out
}

async fn explain(s: &FragvecSession, sql: &str) -> String {
    let r = s.sql_one(&format!("EXPLAIN ANALYZE {sql}")).await.unwrap();
    datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string()
}

/// The same changes on two tables, one indexed IVF_FLAT and one IVF_SQ: after each, every
/// metric at every `nprobes` answers the same rows at the same distances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivf_sq_answers_what_ivf_flat_answers_at_every_nprobes() {
    let tmp = tempfile::tempdir().unwrap();
    let s = FragvecSession::open(tmp.path().to_str().unwrap())
        .await
        .unwrap();
    for (metric, function) in [
        ("l2", "l2_distance"),
        ("cosine", "cosine_distance"),
        ("dot", "negative_inner_product"),
    ] {
        for (t, kind) in [("flat", "IVF_FLAT"), ("sq", "IVF_SQ")] {
            s.sql(&format!(
                "DROP TABLE IF EXISTS {t}; {}; CREATE VECTOR INDEX i ON {t} (v) USING {kind} \
                 WITH (num_partitions = 8, metric = '{metric}')",
                table(t)
            ))
            .await
            .unwrap();
        }
        let changes = [
            "SELECT 1".to_string(),
            "DELETE FROM {t} WHERE id % 13 = 0".to_string(),
            format!(
                "SET fragvec.update_mode = 'rewrite_rows'; \
                 UPDATE {{t}} SET v = {} WHERE id % 17 = 1",
                spread("id", 1)
            ),
            format!(
                "SET fragvec.update_mode = 'rewrite_columns'; \
                 UPDATE {{t}} SET v = {} WHERE id % 19 = 2",
                spread("id", 2)
            ),
            format!(
                "INSERT INTO {{t}} SELECT value, {} FROM generate_series(3000, 3499)",
                spread("value", 3)
            ),
            "OPTIMIZE INDEX i ON {t} APPEND".to_string(),
            "COMPACT {t} WITH (target_rows_per_fragment = 2000)".to_string(),
            "RECLUSTER {t} BY (ivf_partition(v), id)".to_string(),
            "DELETE FROM {t} WHERE id % 11 = 4".to_string(),
            "OPTIMIZE INDEX i ON {t} MERGE 2".to_string(),
        ];
        for change in &changes {
            for t in ["flat", "sq"] {
                s.sql(&change.replace("{t}", t)).await.unwrap();
            }
            for nprobes in [1, 2, 5, 8] {
                s.sql(&format!("SET fragvec.nprobes = {nprobes}"))
                    .await
                    .unwrap();
                for seed in 0..3 {
                    let q = query_vector(seed);
                    let want = knn(&s, "flat", function, &q).await;
                    assert_eq!(want.len(), 10);
                    let got = knn(&s, "sq", function, &q).await;
                    assert_eq!(got, want, "{metric}, nprobes {nprobes}, after {change}");
                }
            }
        }
        // The codes rule most rows out: the rows scored are a small share of those probed.
        let q = query_vector(1);
        let plan = explain(
            &s,
            &format!("SELECT id FROM sq ORDER BY {function}(v, {q}) LIMIT 10"),
        )
        .await;
        assert!(plan.contains("KnnExec"), "{plan}");
        let skipped = counter(&plan, "rows_skipped_by_bound");
        let scored = counter(&plan, "rows_scored");
        assert!(
            skipped > 4.0 * scored,
            "{metric}: {skipped} skipped, {scored} scored: {plan}"
        );
    }
}

/// The value of `name=` in an `EXPLAIN ANALYZE` rendering (`2.96 K` is 2,960).
fn counter(plan: &str, name: &str) -> f64 {
    let at = plan
        .find(&format!("{name}="))
        .unwrap_or_else(|| panic!("no {name} in {plan}"));
    let rest = &plan[at + name.len() + 1..];
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let scale = match rest[number.len()..].trim_start().chars().next() {
        Some('K') => 1e3,
        Some('M') => 1e6,
        _ => 1.0,
    };
    number.parse::<f64>().unwrap() * scale
}

/// The index files hold no floats: an IVF_SQ segment is about a quarter of an IVF_FLAT one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivf_sq_segments_are_a_fraction_of_the_floats() {
    let tmp = tempfile::tempdir().unwrap();
    let s = FragvecSession::open(tmp.path().to_str().unwrap())
        .await
        .unwrap();
    let mut bytes = Vec::new();
    for (t, kind) in [("flat", "IVF_FLAT"), ("sq", "IVF_SQ")] {
        s.sql(&format!(
            "{}; CREATE VECTOR INDEX i ON {t} (v) USING {kind} WITH (num_partitions = 4)",
            table(t)
        ))
        .await
        .unwrap();
        let r = s
            .sql_one(&format!(
                "SELECT CAST(sum(size_bytes) AS BIGINT) FROM fragvec_segments('{t}')"
            ))
            .await
            .unwrap();
        bytes.push(r.batches[0].column(0).as_primitive::<Int64Type>().value(0));
    }
    // 24 dimensions: (8 + 24 + 20) / (8 + 96) = 0.5; at 768 it is 0.26.
    let ratio = bytes[1] as f64 / bytes[0] as f64;
    assert!((0.45..0.55).contains(&ratio), "{bytes:?}");
}

/// Bad requests are clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivf_sq_refuses_pq_options() {
    let tmp = tempfile::tempdir().unwrap();
    let s = FragvecSession::open(tmp.path().to_str().unwrap())
        .await
        .unwrap();
    s.sql(&table("t")).await.unwrap();
    let e = s
        .sql("CREATE VECTOR INDEX i ON t (v) USING IVF_SQ WITH (num_sub_vectors = 4)")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown option 'num_sub_vectors' for IVF_SQ"),
        "{e}"
    );
    let e = s
        .sql("CREATE VECTOR INDEX i ON t (v) USING IVF_SQQ")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("IVF_FLAT, IVF_SQ or IVF_PQ"), "{e}");
}

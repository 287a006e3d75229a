//! Scans skip fragments by their files' column ranges (`engine::prune`): a filter's answer is
//! the same as over an in-memory copy of the rows (which nothing prunes), for any filter and
//! any fragments, and `EXPLAIN ANALYZE` counts the fragments skipped. DELETE and UPDATE find
//! their rows through the same scan.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::Int64Type;
use fragvec::engine::FragvecSession;
use proptest::prelude::*;

#[path = "support/knn_metrics.rs"]
mod knn_metrics;
use knn_metrics::knn_metric;

/// A table `t` of `fragments` (one INSERT each) and the same rows in memory as `r`.
async fn tables(fragments: &[Vec<Row>]) -> FragvecSession {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!("memory://pruning-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let s = FragvecSession::open(&name).await.unwrap();
    s.sql("CREATE TABLE t (id BIGINT, c BIGINT, name TEXT, emb VECTOR(2))")
        .await
        .unwrap();
    for rows in fragments.iter().filter(|r| !r.is_empty()) {
        let values: Vec<String> = rows
            .iter()
            .map(|(id, c, name)| {
                let c = c.map_or("NULL".to_string(), |c| c.to_string());
                let name = name.map_or("NULL".to_string(), |n| format!("'{n}'"));
                format!("({id}, {c}, {name}, [{id}, 0])")
            })
            .collect();
        s.sql(&format!("INSERT INTO t VALUES {}", values.join(", ")))
            .await
            .unwrap();
    }
    let all: Vec<&Row> = fragments.iter().flatten().collect();
    let reference = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from_iter_values(all.iter().map(|r| r.0))) as ArrayRef,
        ),
        (
            "c",
            Arc::new(all.iter().map(|r| r.1).collect::<Int64Array>()),
        ),
        (
            "name",
            Arc::new(all.iter().map(|r| r.2).collect::<StringArray>()),
        ),
    ])
    .unwrap();
    s.context().register_batch("r", reference).unwrap();
    s
}

/// `count(*)`, `sum(id)` of the rows `filter` keeps, in table `from`.
async fn answer(s: &FragvecSession, from: &str, filter: &str) -> (i64, Option<i64>) {
    let sql = format!("SELECT count(*), sum(id) FROM {from} WHERE {filter}");
    let r = s
        .sql_one(&sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let b = &r.batches[0];
    let count = b.column(0).as_primitive::<Int64Type>().value(0);
    let sum = b.column(1).as_primitive::<Int64Type>();
    (count, (!sum.is_null(0)).then(|| sum.value(0)))
}

/// The `fragments_pruned` and `fragments_scanned` of the scan of `sql`.
async fn scan_counts(s: &FragvecSession, sql: &str) -> (usize, usize) {
    let r = s.sql_one(&format!("EXPLAIN ANALYZE {sql}")).await.unwrap();
    let plan = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    let metric = |name: &str| -> usize {
        let at = plan
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("no {name} in\n{plan}"));
        plan[at + name.len() + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    (metric("fragments_pruned"), metric("fragments_scanned"))
}

/// Ten fragments of 100 rows, ids 0..1000 in order; c = id % 7 (NULL in the last fragment);
/// names 'n0000'... (NULL for odd ids in fragment 3).
fn ten_fragments() -> Vec<Vec<Row>> {
    let names: &'static Vec<String> =
        Box::leak(Box::new((0..1000).map(|i| format!("n{i:04}")).collect()));
    (0..10)
        .map(|f| {
            (f * 100..(f + 1) * 100)
                .map(|id| {
                    let c = (f != 9).then_some(id % 7);
                    let name = (!(f == 3 && id % 2 == 1)).then(|| names[id as usize].as_str());
                    (id, c, name)
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn point_and_range_filters_read_only_the_fragments_that_can_match() {
    let s = tables(&ten_fragments()).await;
    for (filter, pruned) in [
        ("id = 555", 9),
        ("id BETWEEN 150 AND 249", 8),
        ("id IN (5, 905)", 8),
        ("id < 0", 10),
        ("id >= 900 OR id < 100", 8),
        ("name = 'n0420'", 9),
        ("c IS NULL", 9),
        ("name IS NULL", 9),
        ("c = 3", 1), // the last fragment's c is all NULL
    ] {
        check_pruned(&s, filter, pruned).await;
    }
    // IN lists of a batch of ids (a DELETE of many rows, say): up to 1,024 values tested
    // one by one, longer ones by their range.
    let list = |ids: &mut dyn Iterator<Item = i64>| {
        let ids: Vec<String> = ids.map(|i| i.to_string()).collect();
        format!("id IN ({})", ids.join(", "))
    };
    let scattered = list(&mut (0..30).map(|i| if i % 2 == 0 { 310 + i } else { 720 + i }));
    check_pruned(&s, &scattered, 8).await;
    let long = list(&mut (600..700).chain(1000..3000));
    check_pruned(&s, &long, 6).await;
    let long_scattered = list(&mut (0..1500).map(|i| if i == 0 { 5 } else { 900 + i % 50 }));
    check_pruned(&s, &long_scattered, 0).await;
}

/// `filter` over `t` prunes `pruned` of its ten fragments and answers as over `r`.
async fn check_pruned(s: &FragvecSession, filter: &str, pruned: usize) {
    let sql = format!("SELECT count(*) FROM t WHERE {filter}");
    let (p, scanned) = scan_counts(s, &sql).await;
    let shown = &filter[..filter.len().min(60)];
    assert_eq!((p, scanned), (pruned, 10 - pruned), "{shown}");
    assert_eq!(
        answer(s, "t", filter).await,
        answer(s, "r", filter).await,
        "{shown}"
    );
}

#[tokio::test]
async fn delete_and_update_find_their_rows_through_pruned_scans() {
    let s = tables(&ten_fragments()).await;
    s.sql("DELETE FROM t WHERE id = 555").await.unwrap();
    s.sql("UPDATE t SET c = 100 WHERE id = 123").await.unwrap();
    assert_eq!(answer(&s, "t", "id = 555").await, (0, None));
    assert_eq!(answer(&s, "t", "c = 100").await, (1, Some(123)));
    // The updated row moved to a new fragment with its own ranges; the old fragment's
    // range still covers 123 (a deletion never narrows a range), and is still right.
    let (pruned, scanned) = scan_counts(&s, "SELECT count(*) FROM t WHERE id = 123").await;
    assert_eq!(pruned + scanned, 11);
    assert_eq!(scanned, 2);
    assert_eq!(answer(&s, "t", "id <> 555").await.0, 999);
}

/// A filter over columns `id`, `c`, `name` from a small grammar.
fn filter() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        (
            prop_oneof![Just("id"), Just("c")],
            prop_oneof![
                Just("="),
                Just("<"),
                Just("<="),
                Just(">"),
                Just(">="),
                Just("<>")
            ],
            -5i64..60
        )
            .prop_map(|(col, op, v)| format!("{col} {op} {v}")),
        (prop_oneof![Just("id"), Just("c")], -5i64..60, 0i64..20)
            .prop_map(|(col, lo, w)| format!("{col} BETWEEN {lo} AND {}", lo + w)),
        proptest::collection::vec(-5i64..60, 1..4).prop_map(|vs| format!(
            "id IN ({})",
            vs.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        prop_oneof![
            Just("c IS NULL"),
            Just("c IS NOT NULL"),
            Just("name IS NULL")
        ]
        .prop_map(String::from),
        prop_oneof![Just("a"), Just("m"), Just("q"), Just("z")]
            .prop_map(|v| format!("name < '{v}'")),
    ];
    leaf.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) AND ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) OR ({b})")),
            inner.prop_map(|a| format!("NOT ({a})")),
        ]
    })
}

type Row = (i64, Option<i64>, Option<&'static str>);

fn fragments() -> impl Strategy<Value = Vec<Vec<Row>>> {
    let row = (
        -5i64..60,
        proptest::option::weighted(0.8, -5i64..60),
        proptest::option::weighted(0.8, prop_oneof![Just("b"), Just("k"), Just("p"), Just("y")]),
    );
    proptest::collection::vec(proptest::collection::vec(row, 0..6), 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Any rows in any fragments, any filter: the answer is the unpruned one.
    #[test]
    fn pruning_never_changes_an_answer(fragments in fragments(), filters in proptest::collection::vec(filter(), 4)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let s = tables(&fragments).await;
            for f in &filters {
                prop_assert_eq!(answer(&s, "t", f).await, answer(&s, "r", f).await, "{}", f);
            }
            Ok(())
        })?;
    }
}

/// The `rows_pruned` of the scan of `sql`, as EXPLAIN ANALYZE shows it (`134.46 K`): to
/// three significant digits.
async fn rows_pruned(s: &FragvecSession, sql: &str) -> f64 {
    let r = s.sql_one(&format!("EXPLAIN ANALYZE {sql}")).await.unwrap();
    let plan = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    let at = plan
        .find("rows_pruned=")
        .unwrap_or_else(|| panic!("{plan}"));
    let shown: String = plan[at + "rows_pruned=".len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ' ' | 'K' | 'M'))
        .collect();
    let shown = shown.trim();
    let (number, scale) = if let Some(n) = shown.strip_suffix('K') {
        (n.trim(), 1e3)
    } else if let Some(n) = shown.strip_suffix('M') {
        (n.trim(), 1e6)
    } else {
        (shown, 1.0)
    };
    number
        .parse::<f64>()
        .unwrap_or_else(|_| panic!("{shown:?}"))
        * scale
}

fn about(shown: f64, want: u64) -> bool {
    (shown - want as f64).abs() <= want as f64 * 1e-3
}

/// Inside a fragment, row groups (65,536 rows) are skipped by their Parquet statistics.
#[tokio::test]
async fn row_groups_a_filter_cannot_match_are_not_read() {
    let s = FragvecSession::open("memory://pruning-row-groups")
        .await
        .unwrap();
    s.sql(
        "CREATE TABLE t (id BIGINT, c BIGINT, emb VECTOR(2)); \
         INSERT INTO t SELECT value, value % 5, [value, 0] FROM generate_series(0, 199999)",
    )
    .await
    .unwrap();
    // groups: 0..65536, 65536..131072, 131072..196608, 196608..200000
    for (filter, pruned, count, sum) in [
        ("id = 150000", 200_000 - 65_536, 1, 150_000),
        ("id BETWEEN 70000 AND 70010", 200_000 - 65_536, 11, 770_055),
        (
            "id < 10 OR id > 199990",
            200_000 - 65_536 - 3_392,
            19,
            45 + 1_799_955,
        ),
        ("c = 1", 0, 40_000, 3_999_940_000),
    ] {
        let sql = format!("SELECT count(*) FROM t WHERE {filter}");
        let shown = rows_pruned(&s, &sql).await;
        assert!(
            about(shown, pruned),
            "{filter}: {shown} rows pruned, want {pruned}"
        );
        assert_eq!(
            answer(&s, "t", filter).await,
            (count, Some(sum)),
            "{filter}"
        );
    }
    // Deleted rows and rows in kept groups keep their addresses: DELETE and UPDATE through
    // a pruned scan change exactly their rows.
    s.sql("DELETE FROM t WHERE id = 150001").await.unwrap();
    s.sql("UPDATE t SET c = 100 WHERE id = 140000")
        .await
        .unwrap();
    assert_eq!(
        answer(&s, "t", "id BETWEEN 139999 AND 150002").await,
        (10_003, Some(1_450_435_001))
    );
    assert_eq!(answer(&s, "t", "c = 100").await, (1, Some(140_000)));
    let r = s
        .sql_one("SELECT _rowaddr FROM t WHERE id = 150000")
        .await
        .unwrap();
    let addr = r.batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
        .value(0);
    assert_eq!(
        addr & 0xffff_ffff,
        150_000,
        "the row's offset in its fragment"
    );
}

/// The `fragments_pruned` of the KNN operator in `EXPLAIN ANALYZE sql`.

#[tokio::test]
async fn knn_filters_skip_the_fragments_they_cannot_match() {
    let s = tables(&ten_fragments()).await;
    // emb = [id, 0]: the nearest ids to q among those the filter keeps.
    let nearest = |q: f64, keep: &dyn Fn(i64) -> bool| -> Vec<i64> {
        let mut ids: Vec<i64> = (0..1000).filter(|&i| keep(i)).collect();
        ids.sort_by(|a, b| (*a as f64 - q).abs().total_cmp(&(*b as f64 - q).abs()));
        ids.truncate(3);
        ids
    };
    type Keep = dyn Fn(i64) -> bool;
    let cases: [(&str, usize, &Keep); 3] = [
        // id: a fixed-width column the mask is evaluated on in memory
        ("id BETWEEN 150 AND 249", 8, &|i| (150..=249).contains(&i)),
        // name: text, evaluated by a scan of the kept fragments
        ("name >= 'n0900'", 9, &|i| i >= 900),
        ("c = 3", 1, &|i| i < 900 && i % 7 == 3),
    ];
    for indexed in [false, true] {
        if indexed {
            s.sql(
                "CREATE VECTOR INDEX ix ON t (emb) USING IVF_FLAT WITH (num_partitions = 4); \
                 SET fragvec.exact = true",
            )
            .await
            .unwrap();
        }
        for (filter, pruned, keep) in &cases {
            let sql =
                format!("SELECT id FROM t WHERE {filter} ORDER BY emb <-> [500.25, 0] LIMIT 3");
            // Without an index the query is a scan and a top-k sort; with one, KnnExec. (Its
            // first run on a version: later ones reuse the filter's rows and prune nothing.)
            let shown = match indexed {
                false => scan_counts(&s, &sql).await.0,
                true => knn_metric(&s, &sql, "fragments_pruned").await,
            };
            assert_eq!(shown, *pruned, "{sql} (indexed: {indexed})");
            let got: Vec<i64> = s.sql_one(&sql).await.unwrap().batches[0]
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
            assert_eq!(got, nearest(500.25, keep), "{sql} (indexed: {indexed})");
        }
    }
}

/// A float column's range is read back from the manifest bit for bit: read one ULP low, the
/// file's maximum would fall below its own row and `x >= max` would skip the fragment that
/// holds it. Read by another session, from the manifest file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_float_range_read_back_keeps_the_row_on_its_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_str().unwrap();
    // 17 significant digits that a JSON parser without exact float parsing reads 1 ULP low.
    let x = "3.7655533989270515e-296";
    let writer = FragvecSession::open(path).await.unwrap();
    writer
        .sql(&format!(
            "CREATE TABLE f (id BIGINT, x DOUBLE); INSERT INTO f VALUES (1, {x})"
        ))
        .await
        .unwrap();
    let reader = FragvecSession::open(path).await.unwrap();
    for filter in [format!("x >= {x}"), format!("x = {x}"), format!("x <= {x}")] {
        assert_eq!(
            answer(&reader, "f", &filter).await,
            (1, Some(1)),
            "{filter}"
        );
    }
}

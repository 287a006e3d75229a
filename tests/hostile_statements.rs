//! Hostile input through SQL: every statement below must come back as a clear error or a
//! correct result, within a time bound — never a panic, an abort or a hang. A server
//! embedding fragvec must survive any one query.

use std::time::Duration;

use fragvec::FragvecSession;

#[path = "support/hostile_cases.rs"]
mod hostile_cases;
use hostile_cases::{CASES, SETUP, judge};

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
        let result = result.map(|r| r.num_rows()).map_err(|e| e.to_string());
        wrong.extend(judge(sql, *expect, result));
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

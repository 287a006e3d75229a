//! A `rewrite_columns` UPDATE must not land on a row a concurrent writer deleted or moved.
//!
//! The statement reads a version, computes new values for row `id = 5`, and commits a column
//! file for that row's fragment. Meanwhile another writer's `rewrite_rows` UPDATE (or a
//! DELETE) of the same row commits first. Rebasing the column file over it would put the new
//! values on the dead old version of the row, and the change would be lost (issue #10's first
//! defect). The commit must fail with a retryable conflict instead; a writer that touched
//! other rows of the fragment still rebases.
//!
//! Each scenario runs on a scratch directory and on the test S3 server (`tests/support`).

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use fragvec::FragvecSession;
use fragvec::format::changes::{RowChanges, UpdateMode};
use fragvec::format::{FormatError, Operation, Snapshot};
use fragvec::ledger::ids::row_address;

#[macro_use]
mod support;
use support::Location;

async fn session(location: &str) -> FragvecSession {
    let s = FragvecSession::open(location).await.unwrap();
    s.sql("CREATE TABLE u (id BIGINT NOT NULL, a BIGINT, b BIGINT)")
        .await
        .unwrap();
    s.sql("INSERT INTO u SELECT value AS id, 0 AS a, 0 AS b FROM generate_series(1, 10)")
        .await
        .unwrap();
    s
}

async fn latest(s: &FragvecSession) -> Snapshot {
    Arc::new(s.database().table("u").unwrap())
        .latest()
        .await
        .unwrap()
}

/// What `UPDATE u SET b = b + 1 WHERE id = 5` computes, read at `snapshot`: row 5 (offset 4
/// of the only fragment) with b = 1.
fn set_b_of_row_5(snapshot: &Snapshot) -> RowChanges {
    let fragment = snapshot.manifest.fragments[0].id;
    let row = RecordBatch::try_new(
        snapshot.schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![5])),
            Arc::new(Int64Array::from(vec![0])),
            Arc::new(Int64Array::from(vec![1])),
        ],
    )
    .unwrap();
    RowChanges {
        updated_addrs: vec![row_address(fragment, 4)],
        updated_ids: vec![row_address(fragment, 4)],
        updated_rows: vec![row],
        ..Default::default()
    }
}

async fn row_5(s: &FragvecSession) -> (i64, i64) {
    let r = s.sql_one("SELECT a, b FROM u WHERE id = 5").await.unwrap();
    assert_eq!(r.num_rows(), 1);
    let b = &r.batches.iter().find(|b| b.num_rows() > 0).unwrap();
    (
        b.column(0).as_primitive::<Int64Type>().value(0),
        b.column(1).as_primitive::<Int64Type>().value(0),
    )
}

fn is_retryable_conflict(e: &FormatError) -> bool {
    e.is_retryable() && e.to_string().contains("commit conflict")
}

on_local_and_s3!(a_column_update_over_a_concurrent_change_of_the_same_row_conflicts);
/// The winner changed row 5 itself: a `rewrite_rows` UPDATE (the old version is deleted, the
/// new one appended) or a DELETE. Committing the column file must conflict, and nothing the
/// winner wrote may be lost.
async fn a_column_update_over_a_concurrent_change_of_the_same_row_conflicts(db: Location) {
    for (i, (winner, row_after)) in [
        ("UPDATE u SET a = a + 10 WHERE id = 5", Some((10, 0))),
        ("DELETE FROM u WHERE id = 5", None),
    ]
    .into_iter()
    .enumerate()
    {
        let s = session(&db.child(&i.to_string())).await;
        let read = latest(&s).await;
        let ours = set_b_of_row_5(&read);
        s.sql(winner).await.unwrap();
        let err = ours
            .commit(
                &read,
                Operation::Update,
                UpdateMode::RewriteColumns,
                &["b".into()],
            )
            .await
            .unwrap_err();
        assert!(is_retryable_conflict(&err), "{winner}: {err}");
        match row_after {
            Some(values) => assert_eq!(row_5(&s).await, values, "{winner}"),
            None => {
                let r = s.sql_one("SELECT id FROM u WHERE id = 5").await.unwrap();
                assert_eq!(r.num_rows(), 0, "{winner}: the deleted row came back");
            }
        }
    }
}

on_local_and_s3!(a_column_update_rebases_over_a_concurrent_update_of_other_rows);
async fn a_column_update_rebases_over_a_concurrent_update_of_other_rows(db: Location) {
    let s = session(db.url()).await;
    let read = latest(&s).await;
    let ours = set_b_of_row_5(&read);
    s.sql("UPDATE u SET a = a + 10 WHERE id = 7").await.unwrap();
    ours.commit(
        &read,
        Operation::Update,
        UpdateMode::RewriteColumns,
        &["b".into()],
    )
    .await
    .unwrap();
    // Both changes are there: the serial result.
    assert_eq!(row_5(&s).await, (0, 1));
    let r = s.sql_one("SELECT a, b FROM u WHERE id = 7").await.unwrap();
    let b = r.batches.iter().find(|b| b.num_rows() > 0).unwrap();
    assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), 10);
}

on_local_and_s3!(retried_column_update_sees_the_winners_value);
/// Through SQL: the retry after the conflict re-reads the row and applies both updates.
async fn retried_column_update_sees_the_winners_value(db: Location) {
    let s = session(db.url()).await;
    s.sql("UPDATE u SET a = a + 10 WHERE id = 5").await.unwrap();
    s.sql("SET fragvec.update_mode = 'rewrite_columns'")
        .await
        .unwrap();
    s.sql("UPDATE u SET b = b + 1 WHERE id = 5").await.unwrap();
    assert_eq!(row_5(&s).await, (10, 1));
}

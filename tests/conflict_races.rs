//! Two real writers race for every pair of operations of the conflict matrix (see the
//! docs/concurrency.md and `src/format/commit/conflict/matrix.rs`), on a real table in a local directory.
//!
//! The interleaving is forced, not hoped for: ours runs on a session whose store holds back
//! its manifest put ([`gate`]); while it waits, the winner's statement runs and commits;
//! then ours goes on, finds the version taken, and rebases or conflicts. Each race checks
//! the table by content against a model ([`scenario`]): either both landed with the serial
//! result (winner, then ours), or ours failed with a retryable conflict and the table is the
//! winner's alone — never a lost, duplicated or resurrected row, and KNN returns exactly the
//! nearest live rows. Pairs the matrix says must conflict are raced in every relation with
//! retries off (the conflict must happen) and again with retries on (ours re-runs and both
//! land, or ours fails by itself exactly as it would run alone after the winner).

#[path = "conflict_races/gate.rs"]
mod gate;
#[path = "conflict_races/scenario.rs"]
mod scenario;

use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use fragvec::format::commit::retry::Retryable;
use gate::Gate;
use scenario::{Ended, OPS, Op, RELATIONS, Relation, must_conflict, race, rows};

/// The set-up table, built once per test and copied for every race.
async fn template() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario::session(tmp.path()).await;
    s.sql(scenario::SETUP).await.unwrap();
    tmp
}

/// Every race with `winner` committing first: each operation second, in every relation the
/// table can express for a pair that must conflict somewhere, and in "same rows" otherwise.
async fn races_after(winner: Op) {
    let template = template().await;
    let mut wrong = vec![];
    let mut raced = 0;
    for ours in OPS {
        let conflicts_somewhere = RELATIONS
            .iter()
            .any(|r| rows(winner, ours, *r).is_some() && must_conflict(winner, ours, *r));
        for relation in RELATIONS {
            if rows(winner, ours, relation).is_none()
                || (!conflicts_somewhere && relation != Relation::SameRows)
            {
                continue;
            }
            let must = must_conflict(winner, ours, relation);
            let ended = race(template.path(), winner, ours, relation, 0).await;
            raced += 1;
            let expected = if must { Ended::Conflict } else { Ended::Landed };
            if ended != expected {
                wrong.push(format!(
                    "{winner:?} then {ours:?}, {relation:?}: {ended:?}, the matrix says {expected:?}"
                ));
            }
            if must {
                let ended = race(template.path(), winner, ours, relation, 2).await;
                raced += 1;
                if ended == Ended::Conflict {
                    wrong.push(format!(
                        "{winner:?} then {ours:?}, {relation:?}: still a conflict after retries"
                    ));
                }
            }
        }
    }
    eprintln!("{winner:?} first: {raced} races");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

macro_rules! races {
    ($($name:ident: $op:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            races_after(Op::$op).await;
        }
    )*};
}

races! {
    races_after_an_append: Append,
    races_after_a_delete: Delete,
    races_after_an_update_by_rows: UpdateRows,
    races_after_an_update_by_columns: UpdateColumns,
    races_after_a_merge_by_rows: MergeRows,
    races_after_a_merge_by_columns: MergeColumns,
    races_after_a_compaction: Compact,
    races_after_a_recluster: Recluster,
    races_after_an_index_create: IndexCreate,
    races_after_an_index_append: IndexAppend,
    races_after_an_index_merge: IndexMerge,
    races_after_an_index_retrain: IndexRetrain,
    races_after_an_index_drop: IndexDrop,
    races_after_a_cluster_key_change: AlterClusterKey,
}

/// Three writers, so the append shares no fragment with the retrain: a retrain reads
/// version v (every fragment indexed), an INSERT commits v + 1, an index append reads v + 1
/// and indexes only the new fragment with the old centroids, the retrain commits v + 2. The
/// append must not join the retrained index (it would hold partitions of the old model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_append_prepared_during_a_retrain_conflicts() {
    for retries in [0, 2] {
        let template = template().await;
        let db = template.path();
        let plain = scenario::session(db).await;
        plain.sql("OPTIMIZE INDEX i ON t APPEND").await.unwrap();
        let retrain_gate = Arc::new(Gate::default());
        let retrain_session = scenario::gated_session(db, retrain_gate.clone()).await;
        let append_gate = Arc::new(Gate::default());
        let append_session = scenario::gated_session(db, append_gate.clone()).await;
        append_session
            .sql(&format!("SET fragvec.commit_retries = {retries}"))
            .await
            .unwrap();

        let retrain_armed = retrain_gate.arm();
        let retrain = tokio::spawn(async move {
            retrain_session
                .sql_one("OPTIMIZE INDEX i ON t RETRAIN")
                .await
        });
        retrain_armed.arrived.await.unwrap();
        plain
            .sql("INSERT INTO t SELECT value, 0, [value, value % 5] FROM generate_series(40, 43)")
            .await
            .unwrap();
        let append_armed = append_gate.arm();
        let append =
            tokio::spawn(
                async move { append_session.sql_one("OPTIMIZE INDEX i ON t APPEND").await },
            );
        append_armed.arrived.await.unwrap();
        let _ = retrain_armed.release.send(());
        retrain.await.unwrap().unwrap();
        let _ = append_armed.release.send(());
        let result = append.await.unwrap();
        match retries {
            0 => {
                let e = result.expect_err("the append over the old centroids landed");
                assert!(e.is_retryable(), "{e}");
                assert!(e.to_string().contains("retrained"), "{e}");
            }
            _ => {
                result.unwrap();
            }
        }
        let mut model = scenario::Model::setup();
        model.rows.extend((40..44).map(|id| (id, 0)));
        assert_eq!(scenario::content(&plain).await, model.rows);
        scenario::check_knn(&plain, &model, "after the retrain").await;
    }
}

/// VACUUM commits no version, so it is in no conflict rule; it must never remove what a
/// commit in progress needs. Ours reads version v (whose deletion vector it will merge
/// with), is held at its commit while another writer commits v + 1 and VACUUM RETAIN 1 runs,
/// then commits. Version v is older than the grace period, but it was the latest until
/// within it, so it and its files stay; ours' own new files are younger than the grace
/// period and stay too. Every retained version still reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_keeps_what_a_commit_in_progress_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path();
    let plain = scenario::session(db).await;
    plain
        .sql(
            "CREATE TABLE t (id BIGINT NOT NULL, val BIGINT); \
             INSERT INTO t SELECT value, 0 FROM generate_series(0, 9); \
             DELETE FROM t WHERE id = 0",
        )
        .await
        .unwrap();
    // The version ours reads must be older than the grace period (1 s).
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    for ours_sql in [
        "DELETE FROM t WHERE id = 1",
        "INSERT INTO t VALUES (100, 0)",
    ] {
        let gate = Arc::new(Gate::default());
        let ours = scenario::gated_session(db, gate.clone()).await;
        let armed = gate.arm();
        let task = tokio::spawn(async move { ours.sql_one(ours_sql).await });
        armed.arrived.await.unwrap();
        plain
            .sql("DELETE FROM t WHERE id = 2 OR id = 3")
            .await
            .unwrap();
        plain
            .sql("SET fragvec.vacuum_grace_seconds = 1; VACUUM t RETAIN 1 VERSIONS")
            .await
            .unwrap();
        let _ = armed.release.send(());
        task.await
            .unwrap()
            .unwrap_or_else(|e| panic!("{ours_sql} after VACUUM: {e}"));
        // Bring the table back to the next case's starting point.
        plain
            .sql("INSERT INTO t VALUES (2, 0), (3, 0)")
            .await
            .unwrap();
    }
    let r = plain.sql_one("SELECT id FROM t ORDER BY id").await.unwrap();
    let ids: Vec<i64> = r
        .batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(ids, vec![2, 3, 4, 5, 6, 7, 8, 9, 100]);
    let versions = plain
        .sql_one("SELECT version FROM fragvec_versions('t')")
        .await
        .unwrap();
    for b in &versions.batches {
        for v in b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
            .values()
        {
            plain
                .sql_one(&format!("SELECT count(*) FROM t VERSION AS OF {v}"))
                .await
                .unwrap_or_else(|e| panic!("retained version {v} does not read: {e}"));
        }
    }
}

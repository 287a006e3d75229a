//! The operations of the conflict matrix as SQL on a small real table, a model of what each
//! does to the table, and one race: ours reads and prepares, the winner commits, ours
//! commits second.
//!
//! The table `t (id, val, emb VECTOR(2))`, at most 8 rows per fragment: F0 = ids 0..=7 and
//! F1 = ids 8..=15 (indexed by `i`, one segment), F2 = ids 16..=19 and F3 = ids 20..=23
//! (4 rows each, unindexed). Row operations act on one id; COMPACT, RECLUSTER, index append
//! and index merge act on F2 and F3 (the only small, unindexed fragments); index create and
//! retrain read every fragment. So "same rows" is id 17 for both, "same fragment, other
//! rows" ids 17 and 18 (both in F2), and "disjoint" puts the row operation on id 3 (F0).

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::prelude::{SessionConfig, SessionContext};
use fragvec::FragvecSession;
use fragvec::format::Database;
use fragvec::format::commit::retry::Retryable;
use object_store::local::LocalFileSystem;

use super::gate::{Gate, GatedStore};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Append,
    Delete,
    UpdateRows,
    UpdateColumns,
    MergeRows,
    MergeColumns,
    Compact,
    Recluster,
    IndexCreate,
    IndexAppend,
    IndexMerge,
    IndexRetrain,
    IndexDrop,
    AlterClusterKey,
}

pub const OPS: [Op; 14] = [
    Op::Append,
    Op::Delete,
    Op::UpdateRows,
    Op::UpdateColumns,
    Op::MergeRows,
    Op::MergeColumns,
    Op::Compact,
    Op::Recluster,
    Op::IndexCreate,
    Op::IndexAppend,
    Op::IndexMerge,
    Op::IndexRetrain,
    Op::IndexDrop,
    Op::AlterClusterKey,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    SameRows,
    SameFragmentOtherRows,
    Disjoint,
}

pub const RELATIONS: [Relation; 3] = [
    Relation::SameRows,
    Relation::SameFragmentOtherRows,
    Relation::Disjoint,
];

pub const SETUP: &str = "\
    CREATE TABLE t (id BIGINT NOT NULL, val BIGINT, emb VECTOR(2)) \
        WITH (max_rows_per_fragment = 8); \
    INSERT INTO t SELECT value, 0, [value, value % 5] FROM generate_series(0, 15); \
    CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 2); \
    INSERT INTO t SELECT value, 0, [value, value % 5] FROM generate_series(16, 19); \
    INSERT INTO t SELECT value, 0, [value, value % 5] FROM generate_series(20, 23)";

/// The key a MERGE inserts when no row matches it: the same for both writers, so two MERGEs
/// that both insert it would duplicate it.
const MERGE_KEY: i64 = 300;

impl Op {
    /// Whether the operation acts on one row (the others have fixed targets).
    fn on_a_row(self) -> bool {
        matches!(
            self,
            Op::Delete | Op::UpdateRows | Op::UpdateColumns | Op::MergeRows | Op::MergeColumns
        )
    }

    /// The statements a writer runs: settings, then the statement itself (last).
    /// `stamp` tells the two writers' values and new rows apart.
    fn sql(self, row: i64, stamp: i64) -> Vec<String> {
        let mode = match self {
            Op::UpdateColumns | Op::MergeColumns => "rewrite_columns",
            _ => "rewrite_rows",
        };
        let set_mode = format!("SET fragvec.update_mode = '{mode}'");
        let merge = format!(
            "MERGE INTO t USING (VALUES ({row}, {stamp}), ({MERGE_KEY}, {stamp})) AS s (id, val) \
             ON t.id = s.id WHEN MATCHED THEN UPDATE SET val = s.val \
             WHEN NOT MATCHED THEN INSERT (id, val, emb) VALUES (s.id, s.val, [s.id, s.id % 5])"
        );
        let first = stamp / 10;
        let statement = match self {
            Op::Append => format!(
                "INSERT INTO t SELECT value, {stamp}, [value, value % 5] \
                 FROM generate_series({first}, {})",
                first + 3
            ),
            Op::Delete => format!("DELETE FROM t WHERE id = {row}"),
            Op::UpdateRows | Op::UpdateColumns => {
                format!("UPDATE t SET val = {stamp} WHERE id = {row}")
            }
            Op::MergeRows | Op::MergeColumns => merge,
            Op::Compact => "COMPACT t WITH (target_rows_per_fragment = 8)".into(),
            Op::Recluster => {
                "RECLUSTER t BY (id % 3) WITH (destinations = 2) WHERE id >= 16".into()
            }
            Op::IndexCreate => {
                "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (num_partitions = 2)".into()
            }
            Op::IndexAppend => "OPTIMIZE INDEX i ON t APPEND".into(),
            Op::IndexMerge => "OPTIMIZE INDEX i ON t MERGE 1".into(),
            Op::IndexRetrain => "OPTIMIZE INDEX i ON t RETRAIN".into(),
            Op::IndexDrop => "DROP INDEX i ON t".into(),
            Op::AlterClusterKey => format!("ALTER TABLE t CLUSTER BY (val + {stamp})"),
        };
        vec![set_mode, statement]
    }

    /// What the statement does to the table when run alone on `model`; `Err` when it fails
    /// by itself (an index that does not exist, or exists already).
    fn apply(self, model: &mut Model, row: i64, stamp: i64) -> Result<(), String> {
        let has = |name: &str| model.indexes.contains(name);
        match self {
            Op::Append => {
                let first = stamp / 10;
                model.rows.extend((first..first + 4).map(|id| (id, stamp)));
            }
            Op::Delete => model.rows.retain(|(id, _)| *id != row),
            Op::UpdateRows | Op::UpdateColumns => model.set(row, stamp),
            Op::MergeRows | Op::MergeColumns => {
                for key in [row, MERGE_KEY] {
                    if model.rows.iter().any(|(id, _)| *id == key) {
                        model.set(key, stamp);
                    } else {
                        model.rows.push((key, stamp));
                    }
                }
            }
            Op::Compact | Op::Recluster | Op::AlterClusterKey => {}
            Op::IndexCreate if has("j") => return Err("index j exists".into()),
            Op::IndexCreate => {
                model.indexes.insert("j".into());
            }
            Op::IndexAppend | Op::IndexMerge | Op::IndexRetrain if !has("i") => {
                return Err("no index i".into());
            }
            Op::IndexAppend | Op::IndexMerge | Op::IndexRetrain => {}
            Op::IndexDrop if !has("i") => return Err("no index i".into()),
            Op::IndexDrop => {
                model.indexes.remove("i");
            }
        }
        model.rows.sort();
        Ok(())
    }
}

/// The rows (id, val) and index names a table should have.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub rows: Vec<(i64, i64)>,
    pub indexes: BTreeSet<String>,
}

impl Model {
    pub fn setup() -> Self {
        Model {
            rows: (0..24).map(|id| (id, 0)).collect(),
            indexes: BTreeSet::from(["i".to_string()]),
        }
    }

    fn set(&mut self, row: i64, val: i64) {
        for r in self.rows.iter_mut().filter(|(id, _)| *id == row) {
            r.1 = val;
        }
    }

    /// The `k` ids nearest to `q` (vectors are `[id, id % 5]`).
    fn nearest(&self, q: [f32; 2], k: usize) -> Vec<i64> {
        let mut by_distance: Vec<(f32, i64)> = self
            .rows
            .iter()
            .map(|(id, _)| {
                let (a, b) = (*id as f32 - q[0], (id % 5) as f32 - q[1]);
                (a * a + b * b, *id)
            })
            .collect();
        by_distance.sort_by(|x, y| x.partial_cmp(y).unwrap());
        by_distance.into_iter().take(k).map(|(_, id)| id).collect()
    }
}

/// Whether committing `ours` after `winner` must fail with a retryable conflict (the
/// conflict matrix in docs/concurrency.md, for this table).
pub fn must_conflict(winner: Op, ours: Op, relation: Relation) -> bool {
    use Op::*;
    let same_rows = relation == Relation::SameRows;
    let same_fragment = relation != Relation::Disjoint;
    let row_ops = |o: Op| o.on_a_row();
    match (winner, ours) {
        (MergeRows | MergeColumns, MergeRows | MergeColumns) => true,
        (Delete | UpdateRows | MergeRows, o) if row_ops(o) => same_rows,
        (UpdateColumns | MergeColumns, o) if row_ops(o) || matches!(o, Compact | Recluster) => {
            same_fragment
        }
        (Compact | Recluster, IndexRetrain) => true,
        (Compact | Recluster, o)
            if row_ops(o)
                || matches!(
                    o,
                    Compact | Recluster | IndexCreate | IndexAppend | IndexMerge
                ) =>
        {
            same_fragment
        }
        (IndexCreate, IndexCreate) => true,
        (IndexAppend | IndexMerge, IndexAppend | IndexMerge) => same_fragment,
        (IndexMerge, IndexRetrain) => true,
        (IndexRetrain, IndexAppend | IndexMerge | IndexRetrain) => true,
        (IndexDrop, IndexAppend | IndexMerge | IndexRetrain | IndexDrop) => true,
        _ => false,
    }
}

/// The rows of each writer in `relation`, or `None` when this table cannot express it (two
/// operations with fixed targets always share their fragments).
pub fn rows(winner: Op, ours: Op, relation: Relation) -> Option<(i64, i64)> {
    match relation {
        Relation::SameRows => Some((17, 17)),
        Relation::SameFragmentOtherRows if winner.on_a_row() && ours.on_a_row() => Some((17, 18)),
        Relation::SameFragmentOtherRows => Some((17, 17)),
        Relation::Disjoint if winner.on_a_row() && ours.on_a_row() => Some((3, 17)),
        Relation::Disjoint if winner.on_a_row() => Some((3, 17)),
        Relation::Disjoint if ours.on_a_row() => Some((17, 3)),
        Relation::Disjoint => None,
    }
}

pub async fn session(path: &std::path::Path) -> FragvecSession {
    FragvecSession::open(path.to_str().unwrap()).await.unwrap()
}

/// A session whose manifest puts pass `gate`.
pub async fn gated_session(path: &std::path::Path, gate: Arc<Gate>) -> FragvecSession {
    let fs = LocalFileSystem::new_with_prefix(path)
        .unwrap()
        .with_automatic_cleanup(true);
    let store = Arc::new(GatedStore {
        inner: Arc::new(fs),
        gate,
    });
    let db = Database::from_store(
        store,
        Default::default(),
        path.to_str().unwrap().to_string(),
    );
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_information_schema(true));
    FragvecSession::with_context(ctx, db).await.unwrap()
}

pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn int_pairs(batches: &[RecordBatch]) -> Vec<(i64, i64)> {
    batches
        .iter()
        .flat_map(|b| {
            let a = b.column(0).as_primitive::<Int64Type>();
            let v = b.column(1).as_primitive::<Int64Type>();
            (0..b.num_rows())
                .map(|i| (a.value(i), v.value(i)))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The table's rows, (id, val) sorted.
pub async fn content(s: &FragvecSession) -> Vec<(i64, i64)> {
    let r = s
        .sql_one("SELECT id, val FROM t ORDER BY id, val")
        .await
        .unwrap();
    int_pairs(&r.batches)
}

/// KNN through whatever index serves it must return exactly the model's nearest live rows.
pub async fn check_knn(s: &FragvecSession, model: &Model, what: &str) {
    let q = [17.2f32, 1.1];
    let r = s
        .sql_one(&format!(
            "SELECT id, val FROM t ORDER BY l2_distance(emb, [{}, {}]) LIMIT 6",
            q[0], q[1]
        ))
        .await
        .unwrap();
    let got: Vec<i64> = int_pairs(&r.batches)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(got, model.nearest(q, 6), "{what}: KNN");
}

/// How a race ended for the writer that committed second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Both landed (rebased, or retried to success).
    Landed,
    /// A retryable conflict: nothing of ours was committed.
    Conflict,
    /// Ours failed by itself on the winner's result (e.g. the index it changes was dropped).
    OwnError,
}

/// One race on a copy of `template`: ours reads and prepares, the winner commits, ours
/// commits. Checks the table against the models (never a lost, duplicated or resurrected
/// row, KNN only over live rows) and returns how ours ended.
pub async fn race(
    template: &std::path::Path,
    winner: Op,
    ours: Op,
    relation: Relation,
    retries: usize,
) -> Ended {
    let (w_row, o_row) = rows(winner, ours, relation).expect("an expressible relation");
    let what = format!("{winner:?} then {ours:?}, {relation:?}, retries {retries}");
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    copy_dir(template, &db);
    let gate = Arc::new(Gate::default());
    let o = gated_session(&db, gate.clone()).await;
    let w = session(&db).await;
    o.sql(&format!("SET fragvec.commit_retries = {retries}"))
        .await
        .unwrap();
    let mut o_sql = ours.sql(o_row, 2000);
    let o_statement = o_sql.pop().unwrap();
    for s in o_sql {
        o.sql(&s).await.unwrap();
    }
    let mut w_sql = winner.sql(w_row, 1000);
    let w_statement = w_sql.pop().unwrap();
    for s in w_sql {
        w.sql(&s).await.unwrap();
    }
    // Prepared before the winner's statement starts, so both read the same version.
    let armed = gate.arm();
    let mut ours_task = tokio::spawn({
        let o = o.clone();
        async move { o.sql_one(&o_statement).await }
    });
    tokio::select! {
        _ = armed.arrived => {}
        done = &mut ours_task => panic!("{what}: ours never reached its commit: {:?}", done.unwrap().map(|r| r.num_rows())),
    }
    // The winner's statement runs in full while ours waits at its manifest put.
    w.sql_one(&w_statement)
        .await
        .unwrap_or_else(|e| panic!("{what}: the winner failed: {e}"));
    let _ = armed.release.send(());
    let result = ours_task.await.unwrap();

    let mut after_winner = Model::setup();
    winner.apply(&mut after_winner, w_row, 1000).unwrap();
    let mut serial = after_winner.clone();
    let serial_result = ours.apply(&mut serial, o_row, 2000);
    let got = content(&w).await;
    match result {
        Ok(_) => {
            assert!(
                serial_result.is_ok(),
                "{what}: landed, but run alone after the winner it fails"
            );
            assert_eq!(
                got, serial.rows,
                "{what}: both landed, not with the serial result"
            );
            check_knn(&w, &serial, &what).await;
            Ended::Landed
        }
        Err(e) => {
            assert_eq!(
                got, after_winner.rows,
                "{what}: ours failed ({e}) but changed the table"
            );
            check_knn(&w, &after_winner, &what).await;
            if e.is_retryable() {
                Ended::Conflict
            } else {
                assert!(
                    serial_result.is_err(),
                    "{what}: ours failed with a non-retryable error: {e}"
                );
                Ended::OwnError
            }
        }
    }
}

//! The conflict matrix: every pair of operations (the winner committed first, ours read the
//! same version and commits second) in three relations, run through the pure decisions of a
//! commit — [`check`], [`check_concurrent_merges`], [`check_deletions`] and [`apply`] (which
//! runs [`check_applied`](super::check_applied) for a rebased index change) — and compared
//! with the table in `matrix/expected.rs`, where each cell says what must happen: the second
//! commit is rebased (both land) or fails with a retryable conflict of the named kind.
//!
//! A rule change shows up here as a changed cell, to be made on purpose. The IO of a commit is
//! not modelled: deletion files are made up (the winners' deleted rows are known from their
//! transaction) and `carry_deletions` is not run (it never changes the outcome, only the
//! outputs' deletion vectors). That both landing gives the serial result, and that a
//! conflict loses nothing, is shown by the two-writer races in `tests/conflict_races.rs`.
//!
//! The table: fragments 0, 1, 2, 3 of 4 rows; index `i` with segment 0 over fragment 0 and
//! segment 1 over fragment 2 (fragments 1 and 3 unindexed). An operation acts on a *group*
//! `g` (0 or 1), the adjacent fragments `2g` (indexed) and `2g + 1` (not), and on a row `r`
//! of each: it deletes or updates row `r` of both fragments (a MERGE also inserts a row),
//! compacts or reclusters both into new fragments, builds a new index's segment over both
//! (create), indexes fragment `2g + 1` (append) or merges segment `g` with it (merge).
//! Appends, retrains (all fragments), drops and ALTER TABLE ... CLUSTER BY ignore both.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use super::super::fixtures::{append, segment_over, table, with_index};
use super::super::rebase::{ApplyError, apply};
use super::super::transaction::{IndexChange, Rewrite, RowMapRef, Transaction};
use super::{Conflict, check, check_concurrent_merges, check_deletions};
use crate::format::index_meta::{IndexDef, IndexKind, Metric};
use crate::format::manifest::{DataFile, DeletionFile, Manifest, Operation};

mod expected;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Append,
    Delete,
    UpdateRows,
    UpdateColumns,
    /// MERGE in `rewrite_rows` mode: a matched row updated (deleted, new version appended)
    /// and a source row inserted.
    MergeRows,
    /// MERGE in `rewrite_columns` mode: a matched row updated in place, a row inserted.
    MergeColumns,
    Compact,
    Recluster,
    IndexCreate,
    IndexAppend,
    IndexMerge,
    IndexRetrain,
    IndexDrop,
    AlterClusterKey,
    /// `ALTER TABLE ... SET (auto_index_rows = n)`: a maintenance property.
    AlterProperties,
}

const OPS: [Op; 15] = [
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
    Op::AlterProperties,
];

/// How the two operations' targets relate: (winner's group, row), (ours's group, row).
const RELATIONS: [((u64, u32), (u64, u32)); 3] = [
    ((0, 1), (0, 1)), // same rows
    ((0, 1), (0, 2)), // same fragments, other rows
    ((0, 1), (1, 1)), // disjoint fragments
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Rebase,
    Conflict(&'static str),
    Invalid,
}

fn label(c: &Conflict) -> &'static str {
    match c {
        Conflict::FragmentRemoved { .. } => "FragmentRemoved",
        Conflict::FragmentNotRead { .. } => "FragmentNotRead",
        Conflict::FragmentRewritten { .. } => "FragmentRewritten",
        Conflict::RowsDeletedByWinner { .. } => "RowsDeletedByWinner",
        Conflict::SegmentReplaced { .. } => "SegmentReplaced",
        Conflict::FragmentLeftDuringBuild { .. } => "FragmentLeftDuringBuild",
        Conflict::RewriteSourceRemoved { .. } => "RewriteSourceRemoved",
        Conflict::RewriteSourceRewritten { .. } => "RewriteSourceRewritten",
        Conflict::IndexDropped { .. } => "IndexDropped",
        Conflict::IndexRedefined { .. } => "IndexRedefined",
        Conflict::ConcurrentMerge { .. } => "ConcurrentMerge",
        Conflict::IndexCreatedTwice { .. } => "IndexCreatedTwice",
        Conflict::FragmentOwnedTwice { .. } => "FragmentOwnedTwice",
        Conflict::InvalidAfterRebase { .. } => "InvalidAfterRebase",
        Conflict::TooManyConcurrentCommits { .. } => "TooManyConcurrentCommits",
    }
}

fn base() -> Manifest {
    let mut t = Transaction::new(Operation::Append, 1);
    t.appends = (0..4).map(|n| append(4, &format!("f{n}"))).collect();
    let m = with_index(&apply(&table(false), &t, &BTreeMap::new(), "a".into()).unwrap());
    let mut build = Transaction::new(Operation::OptimizeIndex, m.version);
    build.read_fragment_files = files_of(&m, &[0, 2]);
    build.index_change = Some(IndexChange::ReplaceSegments {
        index: "i".into(),
        remove: vec![],
        add: vec![segment_over(&[0]), segment_over(&[2])],
        def: None,
    });
    let m = apply(&m, &build, &BTreeMap::new(), "b".into()).unwrap();
    assert_eq!(m.fragments.len(), 4);
    assert_eq!(
        m.index_segments.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![0, 1]
    );
    m
}

fn files_of(m: &Manifest, fragments: &[u64]) -> BTreeMap<u64, Vec<DataFile>> {
    fragments
        .iter()
        .map(|f| (*f, m.fragment(*f).unwrap().files.clone()))
        .collect()
}

fn index_def(name: &str, model: &str, version: u64) -> IndexDef {
    IndexDef {
        name: name.into(),
        column: "id".into(),
        kind: IndexKind::IvfFlat,
        metric: Metric::L2,
        num_partitions: 1,
        model_file: format!("_indexes/{name}/{model}.model"),
        model_size_bytes: 1,
        created_at_version: version,
    }
}

/// `op` on group `g`, row `r`, read at `m`; `name` keeps the two sides' files apart.
fn txn(op: Op, m: &Manifest, (g, r): (u64, u32), name: &str) -> Transaction {
    let operation = match op {
        Op::Append => Operation::Append,
        Op::Delete => Operation::Delete,
        Op::UpdateRows | Op::UpdateColumns => Operation::Update,
        Op::MergeRows | Op::MergeColumns => Operation::Merge,
        Op::Compact => Operation::Compact,
        Op::Recluster => Operation::Recluster,
        Op::IndexCreate => Operation::CreateIndex,
        Op::IndexAppend | Op::IndexMerge | Op::IndexRetrain => Operation::OptimizeIndex,
        Op::IndexDrop => Operation::DropIndex,
        Op::AlterClusterKey | Op::AlterProperties => Operation::AlterTable,
    };
    let group = [2 * g, 2 * g + 1];
    let mut t = Transaction::new(operation, m.version);
    let rows: RoaringBitmap = [r].into_iter().collect();
    let delete_rows = |t: &mut Transaction| {
        for f in group {
            t.deletions.insert(f, rows.clone());
        }
    };
    let rewrite_columns = |t: &mut Transaction| {
        for f in group {
            let file = DataFile {
                path: format!("data/{name}-{f}.parquet"),
                columns: vec!["id".into()],
                size_bytes: 1,
                footer: None,
                stats: Vec::new(),
            };
            t.column_rewrites.insert(f, file);
            t.updated_in_place.insert(f, rows.clone());
        }
    };
    let sources = || group.map(|f| m.fragment(f).unwrap().clone());
    match op {
        Op::Append => t.appends = vec![append(4, name)],
        Op::Delete => delete_rows(&mut t),
        Op::UpdateRows => {
            delete_rows(&mut t);
            t.appends = vec![append(2, name)];
        }
        Op::UpdateColumns => rewrite_columns(&mut t),
        Op::MergeRows => {
            delete_rows(&mut t);
            t.appends = vec![append(2, name), append(1, &format!("{name}-insert"))];
        }
        Op::MergeColumns => {
            rewrite_columns(&mut t);
            t.appends = vec![append(1, &format!("{name}-insert"))];
        }
        Op::Compact => {
            t.rewrites = vec![Rewrite::of(&sources(), vec![append(8, name)], None)];
        }
        Op::Recluster => {
            let outputs = vec![
                append(4, &format!("{name}-a")),
                append(4, &format!("{name}-b")),
            ];
            let row_map = RowMapRef {
                path: format!("_rowmaps/{name}.rmap"),
                size_bytes: 1,
            };
            t.rewrites = vec![Rewrite::of(&sources(), outputs, Some(row_map))];
        }
        Op::IndexCreate => {
            t.read_fragment_files = files_of(m, &group);
            t.index_change = Some(IndexChange::Create {
                def: index_def("j", name, m.version),
                segments: vec![segment_over(&group)],
            });
        }
        Op::IndexAppend => {
            t.read_fragment_files = files_of(m, &[2 * g + 1]);
            t.index_change = Some(IndexChange::ReplaceSegments {
                index: "i".into(),
                remove: vec![],
                add: vec![segment_over(&[2 * g + 1])],
                def: None,
            });
        }
        Op::IndexMerge => {
            t.read_fragment_files = files_of(m, &group);
            t.index_change = Some(IndexChange::ReplaceSegments {
                index: "i".into(),
                remove: vec![g],
                add: vec![segment_over(&group)],
                def: None,
            });
        }
        Op::IndexRetrain => {
            let all: Vec<u64> = m.fragments.iter().map(|f| f.id).collect();
            t.read_fragment_files = files_of(m, &all);
            t.index_change = Some(IndexChange::ReplaceSegments {
                index: "i".into(),
                remove: m.segments_of("i").map(|s| s.id).collect(),
                add: vec![segment_over(&all)],
                def: Some(index_def(
                    "i",
                    name,
                    m.index("i").unwrap().created_at_version,
                )),
            });
        }
        Op::IndexDrop => t.index_change = Some(IndexChange::Drop { name: "i".into() }),
        Op::AlterClusterKey => t.cluster_by = Some(vec![format!("{name}_key")]),
        Op::AlterProperties => {
            t.policy_changes = vec![crate::format::policy::PolicyChange {
                name: "auto_index_rows".into(),
                value: Some(format!("{}", 1000 + g)),
            }]
        }
    }
    t
}

/// The deletion files a commit of `t` onto `latest` would write (made up, with the right
/// counts): each fragment's vector becomes the union of the latest one and `t`'s rows.
fn deletion_files(
    latest: &Manifest,
    t: &Transaction,
    deleted_before: &BTreeMap<u64, RoaringBitmap>,
    name: &str,
) -> BTreeMap<u64, DeletionFile> {
    t.deletions
        .iter()
        .filter(|(f, _)| latest.fragment(**f).is_some())
        .map(|(f, rows)| {
            let before = deleted_before.get(f).cloned().unwrap_or_default();
            let file = DeletionFile {
                path: format!("_deletions/{name}-{f}.bin"),
                deleted_rows: (&before | rows).len(),
                read_version: t.read_version,
                crc32c: None,
            };
            (*f, file)
        })
        .collect()
}

/// What committing `ours` after `winner` (both read at `m`) decides, IO left out. The steps
/// are the commit loop's, in its order.
fn outcome(m: &Manifest, winner: &Transaction, ours: &Transaction) -> Outcome {
    let none = BTreeMap::new();
    let latest = apply(
        m,
        winner,
        &deletion_files(m, winner, &none, "w"),
        "w".into(),
    )
    .expect("the winner commits onto the version it read");
    if let Err(c) = check(m, &latest, ours) {
        return Outcome::Conflict(label(&c));
    }
    if let Err(c) = check_concurrent_merges(m, &[&latest], ours) {
        return Outcome::Conflict(label(&c));
    }
    for (f, rows) in ours.deletions.iter().chain(&ours.updated_in_place) {
        let by_winners = winner.deletions.get(f).cloned().unwrap_or_default();
        if let Err(c) = check_deletions(*f, &by_winners, rows) {
            return Outcome::Conflict(label(&c));
        }
    }
    let files = deletion_files(&latest, ours, &winner.deletions, "o");
    match apply(&latest, ours, &files, "o".into()) {
        Ok(_) => Outcome::Rebase,
        Err(ApplyError::Conflict(c)) => Outcome::Conflict(label(&c)),
        Err(ApplyError::Invalid(_)) => Outcome::Invalid,
    }
}

/// Every cell as the rules decide it, in `OPS` order.
fn decided() -> Vec<(Op, Op, [Outcome; 3])> {
    let m = base();
    let mut cells = vec![];
    for w in OPS {
        for o in OPS {
            let row =
                RELATIONS.map(|(wt, ot)| outcome(&m, &txn(w, &m, wt, "w"), &txn(o, &m, ot, "o")));
            cells.push((w, o, row));
        }
    }
    cells
}

/// If this fails, a conflict rule changed: the failing cells are listed; change the table
/// (and the matrix in docs/concurrency.md) only if the change was meant.
#[test]
fn conflict_matrix() {
    let expected = expected::EXPECTED;
    assert_eq!(expected.len(), OPS.len() * OPS.len());
    let mut wrong = vec![];
    for ((w, o, got), (ew, eo, want)) in decided().into_iter().zip(expected) {
        assert_eq!((ew, eo), (w, o), "the table is in OPS order");
        for (relation, (got, want)) in got.iter().zip(want).enumerate() {
            if *got != want {
                wrong.push(format!(
                    "{w:?} then {o:?}, relation {relation}: {got:?}, table says {want:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Prints the table as the rules decide it, in the form of `matrix/expected.rs`
/// (`cargo test --lib conflict_matrix_print -- --ignored --nocapture`).
#[test]
#[ignore]
fn conflict_matrix_print() {
    let show = |o: &Outcome| match o {
        Outcome::Rebase => "R".to_string(),
        Outcome::Conflict(c) => format!("C(\"{c}\")"),
        Outcome::Invalid => "Outcome::Invalid".to_string(),
    };
    for (w, o, row) in decided() {
        let row: Vec<String> = row.iter().map(show).collect();
        println!("    (Op::{w:?}, Op::{o:?}, [{}]),", row.join(", "));
    }
}

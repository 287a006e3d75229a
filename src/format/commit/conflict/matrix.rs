//! The conflict matrix as the rules stand: every pair of operations (the winner committed
//! first, ours read the same version and commits second) in three relations, run through the
//! pure decisions of a commit — [`check`], [`check_deletions`] and [`apply`] (which runs
//! [`check_applied`] for a rebased index change) — and compared with a table.
//!
//! This pins the current behaviour down; it does not judge it. A rule change shows up here as
//! a changed row, to be made on purpose. The IO of a commit is not modelled: deletion files
//! are made up (the winners' deleted rows are known from their transaction) and
//! `carry_deletions` is not run (it never changes the outcome, only the outputs' vectors).
//!
//! The table: fragments 0, 1, 2, 3 of 4 rows; index `i` with segment 0 over fragment 0 and
//! segment 1 over fragment 1 (fragments 2 and 3 unindexed). An operation acts on a *group*
//! `g` (0 or 1) and a row `r`: it deletes or updates row `r` of fragment `g`, rewrites
//! fragment `g`, builds a segment over fragment `g` (create), over fragment `g + 2` (append),
//! or merges segment `g` into a new one (merge); appends and drops ignore both.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use super::super::fixtures::{append, segment_over, table, with_index};
use super::super::rebase::{ApplyError, apply};
use super::super::transaction::{IndexChange, Rewrite, Transaction};
use super::{Conflict, check, check_deletions};
use crate::format::index_meta::{IndexDef, IndexKind, Metric};
use crate::format::manifest::{DataFile, DeletionFile, Manifest, Operation};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Append,
    Delete,
    UpdateRows,
    UpdateColumns,
    Compact,
    IndexCreate,
    IndexAppend,
    IndexMerge,
    IndexDrop,
}

const OPS: [Op; 9] = [
    Op::Append,
    Op::Delete,
    Op::UpdateRows,
    Op::UpdateColumns,
    Op::Compact,
    Op::IndexCreate,
    Op::IndexAppend,
    Op::IndexMerge,
    Op::IndexDrop,
];

/// How the two operations' targets relate: (winner's group, row), (ours's group, row).
const RELATIONS: [((u64, u32), (u64, u32)); 3] = [
    ((0, 1), (0, 1)), // same rows
    ((0, 1), (0, 2)), // same fragment, other rows
    ((0, 1), (1, 1)), // disjoint fragments
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Rebase,
    Conflict(&'static str),
    Invalid,
}
use Outcome::{Conflict as C, Rebase as R};

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
    build.read_fragment_files = files_of(&m, &[0, 1]);
    build.index_change = Some(IndexChange::ReplaceSegments {
        index: "i".into(),
        remove: vec![],
        add: vec![segment_over(&[0]), segment_over(&[1])],
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

/// `op` on group `g`, row `r`, read at `m`; `name` keeps the two sides' files apart.
fn txn(op: Op, m: &Manifest, (g, r): (u64, u32), name: &str) -> Transaction {
    let operation = match op {
        Op::Append => Operation::Append,
        Op::Delete => Operation::Delete,
        Op::UpdateRows | Op::UpdateColumns => Operation::Update,
        Op::Compact => Operation::Compact,
        Op::IndexCreate => Operation::CreateIndex,
        Op::IndexAppend | Op::IndexMerge => Operation::OptimizeIndex,
        Op::IndexDrop => Operation::DropIndex,
    };
    let mut t = Transaction::new(operation, m.version);
    let rows: RoaringBitmap = [r].into_iter().collect();
    match op {
        Op::Append => t.appends = vec![append(4, name)],
        Op::Delete => {
            t.deletions.insert(g, rows);
        }
        Op::UpdateRows => {
            t.deletions.insert(g, rows);
            t.appends = vec![append(1, name)];
        }
        Op::UpdateColumns => {
            let file = DataFile {
                path: format!("data/{name}.parquet"),
                columns: vec!["id".into()],
                size_bytes: 1,
                footer: None,
            };
            t.column_rewrites.insert(g, file);
            t.updated_in_place.insert(g, rows);
        }
        Op::Compact => {
            let source = m.fragment(g).unwrap().clone();
            t.rewrites = vec![Rewrite::of(&[source], vec![append(4, name)], None)];
        }
        Op::IndexCreate => {
            t.read_fragment_files = files_of(m, &[g]);
            t.index_change = Some(IndexChange::Create {
                def: IndexDef {
                    name: "j".into(),
                    column: "id".into(),
                    kind: IndexKind::IvfFlat,
                    metric: Metric::L2,
                    num_partitions: 1,
                    model_file: format!("_indexes/j/{name}.model"),
                    model_size_bytes: 1,
                    created_at_version: m.version,
                },
                segments: vec![segment_over(&[g])],
            });
        }
        Op::IndexAppend => {
            t.read_fragment_files = files_of(m, &[g + 2]);
            t.index_change = Some(IndexChange::ReplaceSegments {
                index: "i".into(),
                remove: vec![],
                add: vec![segment_over(&[g + 2])],
                def: None,
            });
        }
        Op::IndexMerge => {
            t.read_fragment_files = files_of(m, &[g]);
            t.index_change = Some(IndexChange::ReplaceSegments {
                index: "i".into(),
                remove: vec![g],
                add: vec![segment_over(&[g])],
                def: None,
            });
        }
        Op::IndexDrop => t.index_change = Some(IndexChange::Drop { name: "i".into() }),
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

/// What committing `ours` after `winner` (both read at `m`) decides, IO left out.
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
        return C(label(&c));
    }
    for (f, rows) in ours.deletions.iter().chain(&ours.updated_in_place) {
        let by_winners = winner.deletions.get(f).cloned().unwrap_or_default();
        if let Err(c) = check_deletions(*f, &by_winners, rows) {
            return C(label(&c));
        }
    }
    let files = deletion_files(&latest, ours, &winner.deletions, "o");
    match apply(&latest, ours, &files, "o".into()) {
        Ok(_) => R,
        Err(ApplyError::Conflict(c)) => C(label(&c)),
        Err(ApplyError::Invalid(_)) => Outcome::Invalid,
    }
}

/// (winner, ours, outcome per relation: same rows, same fragment other rows, disjoint).
#[rustfmt::skip]
const EXPECTED: [(Op, Op, [Outcome; 3]); 81] = [
    (Op::Append, Op::Append, [R, R, R]),
    (Op::Append, Op::Delete, [R, R, R]),
    (Op::Append, Op::UpdateRows, [R, R, R]),
    (Op::Append, Op::UpdateColumns, [R, R, R]),
    (Op::Append, Op::Compact, [R, R, R]),
    (Op::Append, Op::IndexCreate, [R, R, R]),
    (Op::Append, Op::IndexAppend, [R, R, R]),
    (Op::Append, Op::IndexMerge, [R, R, R]),
    (Op::Append, Op::IndexDrop, [R, R, R]),
    (Op::Delete, Op::Append, [R, R, R]),
    (Op::Delete, Op::Delete, [C("RowsDeletedByWinner"), R, R]),
    (Op::Delete, Op::UpdateRows, [C("RowsDeletedByWinner"), R, R]),
    (Op::Delete, Op::UpdateColumns, [C("RowsDeletedByWinner"), R, R]),
    (Op::Delete, Op::Compact, [R, R, R]),
    (Op::Delete, Op::IndexCreate, [R, R, R]),
    (Op::Delete, Op::IndexAppend, [R, R, R]),
    (Op::Delete, Op::IndexMerge, [R, R, R]),
    (Op::Delete, Op::IndexDrop, [R, R, R]),
    (Op::UpdateRows, Op::Append, [R, R, R]),
    (Op::UpdateRows, Op::Delete, [C("RowsDeletedByWinner"), R, R]),
    (Op::UpdateRows, Op::UpdateRows, [C("RowsDeletedByWinner"), R, R]),
    (Op::UpdateRows, Op::UpdateColumns, [C("RowsDeletedByWinner"), R, R]),
    (Op::UpdateRows, Op::Compact, [R, R, R]),
    (Op::UpdateRows, Op::IndexCreate, [R, R, R]),
    (Op::UpdateRows, Op::IndexAppend, [R, R, R]),
    (Op::UpdateRows, Op::IndexMerge, [R, R, R]),
    (Op::UpdateRows, Op::IndexDrop, [R, R, R]),
    (Op::UpdateColumns, Op::Append, [R, R, R]),
    (Op::UpdateColumns, Op::Delete, [C("FragmentRewritten"), C("FragmentRewritten"), R]),
    (Op::UpdateColumns, Op::UpdateRows, [C("FragmentRewritten"), C("FragmentRewritten"), R]),
    (Op::UpdateColumns, Op::UpdateColumns, [C("FragmentRewritten"), C("FragmentRewritten"), R]),
    (Op::UpdateColumns, Op::Compact, [C("RewriteSourceRewritten"), C("RewriteSourceRewritten"), R]),
    (Op::UpdateColumns, Op::IndexCreate, [R, R, R]),
    (Op::UpdateColumns, Op::IndexAppend, [R, R, R]),
    (Op::UpdateColumns, Op::IndexMerge, [R, R, R]),
    (Op::UpdateColumns, Op::IndexDrop, [R, R, R]),
    (Op::Compact, Op::Append, [R, R, R]),
    (Op::Compact, Op::Delete, [C("FragmentRemoved"), C("FragmentRemoved"), R]),
    (Op::Compact, Op::UpdateRows, [C("FragmentRemoved"), C("FragmentRemoved"), R]),
    (Op::Compact, Op::UpdateColumns, [C("FragmentRemoved"), C("FragmentRemoved"), R]),
    (Op::Compact, Op::Compact, [C("RewriteSourceRemoved"), C("RewriteSourceRemoved"), R]),
    (Op::Compact, Op::IndexCreate, [C("FragmentLeftDuringBuild"), C("FragmentLeftDuringBuild"), R]),
    (Op::Compact, Op::IndexAppend, [R, R, R]),
    (Op::Compact, Op::IndexMerge, [C("FragmentLeftDuringBuild"), C("FragmentLeftDuringBuild"), R]),
    (Op::Compact, Op::IndexDrop, [R, R, R]),
    (Op::IndexCreate, Op::Append, [R, R, R]),
    (Op::IndexCreate, Op::Delete, [R, R, R]),
    (Op::IndexCreate, Op::UpdateRows, [R, R, R]),
    (Op::IndexCreate, Op::UpdateColumns, [R, R, R]),
    (Op::IndexCreate, Op::Compact, [R, R, R]),
    (Op::IndexCreate, Op::IndexCreate, [C("IndexCreatedTwice"), C("IndexCreatedTwice"), C("IndexCreatedTwice")]),
    (Op::IndexCreate, Op::IndexAppend, [R, R, R]),
    (Op::IndexCreate, Op::IndexMerge, [R, R, R]),
    (Op::IndexCreate, Op::IndexDrop, [R, R, R]),
    (Op::IndexAppend, Op::Append, [R, R, R]),
    (Op::IndexAppend, Op::Delete, [R, R, R]),
    (Op::IndexAppend, Op::UpdateRows, [R, R, R]),
    (Op::IndexAppend, Op::UpdateColumns, [R, R, R]),
    (Op::IndexAppend, Op::Compact, [R, R, R]),
    (Op::IndexAppend, Op::IndexCreate, [R, R, R]),
    (Op::IndexAppend, Op::IndexAppend, [C("FragmentOwnedTwice"), C("FragmentOwnedTwice"), R]),
    (Op::IndexAppend, Op::IndexMerge, [R, R, R]),
    (Op::IndexAppend, Op::IndexDrop, [R, R, R]),
    (Op::IndexMerge, Op::Append, [R, R, R]),
    (Op::IndexMerge, Op::Delete, [R, R, R]),
    (Op::IndexMerge, Op::UpdateRows, [R, R, R]),
    (Op::IndexMerge, Op::UpdateColumns, [R, R, R]),
    (Op::IndexMerge, Op::Compact, [R, R, R]),
    (Op::IndexMerge, Op::IndexCreate, [R, R, R]),
    (Op::IndexMerge, Op::IndexAppend, [R, R, R]),
    (Op::IndexMerge, Op::IndexMerge, [C("SegmentReplaced"), C("SegmentReplaced"), R]),
    (Op::IndexMerge, Op::IndexDrop, [R, R, R]),
    (Op::IndexDrop, Op::Append, [R, R, R]),
    (Op::IndexDrop, Op::Delete, [R, R, R]),
    (Op::IndexDrop, Op::UpdateRows, [R, R, R]),
    (Op::IndexDrop, Op::UpdateColumns, [R, R, R]),
    (Op::IndexDrop, Op::Compact, [R, R, R]),
    (Op::IndexDrop, Op::IndexCreate, [R, R, R]),
    (Op::IndexDrop, Op::IndexAppend, [C("IndexDropped"), C("IndexDropped"), C("IndexDropped")]),
    (Op::IndexDrop, Op::IndexMerge, [C("SegmentReplaced"), C("SegmentReplaced"), C("SegmentReplaced")]),
    (Op::IndexDrop, Op::IndexDrop, [C("IndexDropped"), C("IndexDropped"), C("IndexDropped")]),
];

/// If this fails, a conflict rule changed: the failing pairs are listed; update the table
/// only if the change was meant.
#[test]
fn conflict_matrix_current_rules() {
    let m = base();
    let mut wrong = vec![];
    for (i, w) in OPS.into_iter().enumerate() {
        for (j, o) in OPS.into_iter().enumerate() {
            let (ew, eo, expected) = EXPECTED[i * OPS.len() + j];
            assert_eq!((ew, eo), (w, o), "the table is in OPS order");
            for (relation, ((wt, ot), want)) in RELATIONS.iter().zip(expected).enumerate() {
                let got = outcome(&m, &txn(w, &m, *wt, "w"), &txn(o, &m, *ot, "o"));
                if got != want {
                    wrong.push(format!(
                        "{w:?} then {o:?}, relation {relation}: {got:?}, table says {want:?}"
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

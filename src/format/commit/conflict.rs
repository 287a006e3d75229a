//! The conflict rules of a commit. Pure: no IO, no clock, no randomness.
//!
//! A statement read version `r` and built a [`Transaction`]; meanwhile other writers (the
//! *winners*) may have committed up to `latest`. This module decides whether the transaction
//! can still be applied onto `latest` — as is when nothing was committed since, otherwise by
//! a *rebase* ([`super::rebase::apply`]) — or must fail with a typed [`Conflict`]. A conflict
//! is retryable: the statement re-reads the table and runs again (see
//! [`crate::format::FormatError::Conflict`] and [`super::retry`]).
//!
//! The rules, in the order they are checked (the first one that fails is reported):
//!
//! 1. [`check`]: a fragment the transaction deletes rows of or rewrites columns of must still
//!    be in `latest` ([`Conflict::FragmentRemoved`]), must be in the version it read
//!    ([`Conflict::FragmentNotRead`]) and must hold the same data files as then
//!    ([`Conflict::FragmentRewritten`]).
//! 2. [`check`], only when rebasing: an index change must still find every segment it
//!    replaces ([`Conflict::SegmentReplaced`]) and every fragment its new segments hold
//!    ([`Conflict::FragmentLeftDuringBuild`]); dropping an index needs the index
//!    ([`Conflict::IndexDropped`]); appending to, merging or retraining an index needs it
//!    defined as it read it ([`Conflict::IndexDropped`], [`Conflict::IndexRedefined`]: a
//!    segment built with old centroids must not join an index a winner retrained).
//! 3. [`check`]: every source of a rewrite must still be in `latest`
//!    ([`Conflict::RewriteSourceRemoved`]) with the data files the rewrite read
//!    ([`Conflict::RewriteSourceRewritten`]).
//! 4. [`check_deletions`], per fragment, once the caller has read the deletion vectors (IO):
//!    rows a winner deleted must not be rows this transaction deletes or rewrites in place
//!    (`Transaction::updated_in_place`) ([`Conflict::RowsDeletedByWinner`]): those rows were
//!    updated or deleted concurrently, so the rows the statement read are gone (a column
//!    rewrite rebased over them would put the new values on a dead row: a lost update).
//! 5. [`check_applied`], only for a rebased index change, on the manifest the rebase would
//!    produce: no index defined twice ([`Conflict::IndexCreatedTwice`]), no segment of a
//!    dropped index ([`Conflict::IndexDropped`]), no fragment owned by two segments of one
//!    index ([`Conflict::FragmentOwnedTwice`]), and otherwise a valid manifest
//!    ([`Conflict::InvalidAfterRebase`]).
//!
//! 6. [`check_concurrent_merges`], only for a rebased MERGE, on the winners' manifests (IO):
//!    a winner that was a MERGE and appended rows ([`Conflict::ConcurrentMerge`]). A MERGE
//!    reads every target row to decide which source rows match; a row another MERGE
//!    inserted meanwhile is one it may have had to match (two upserts of one new key would
//!    both insert it). Blind appends (INSERT) do not count: the MERGE then serializes
//!    before them. DELETE and UPDATE are not checked against appended rows either: they
//!    serialize before the winner unless the winner read rows they changed, and such a
//!    winner changed those rows too (rule 4 or rule 1).
//!
//! Everything else rebases: appends always (fresh ids, after the winners' fragments),
//! deletions onto the union of the deletion vectors, rewrites at their sources' position.
//! The commit loop adds one reason of its own, [`Conflict::TooManyConcurrentCommits`].
//!
//! What these rules decide for every pair of operations (append, delete, update and MERGE
//! by rows or by columns, COMPACT, RECLUSTER, index create / append / merge / retrain /
//! drop, ALTER TABLE ... CLUSTER BY) on the same rows, other rows of the same fragments or
//! disjoint fragments is pinned by the table in `conflict/matrix.rs` (test only). VACUUM
//! commits no version and so is in no rule: it keeps every version that was the latest
//! within its grace period and every file younger than it (see [`crate::format::vacuum`]).
//!
//! Ids: a fragment id in a [`Conflict`] names a fragment as the statement read it (rules
//! 1–4) or as the rebased manifest holds it (rule 5); segment ids are the manifest's.
//! Cost: lookups by fragment id over the touched fragments, segments and rewrite sources;
//! [`check_applied`] walks every segment's ownership once and validates the manifest.

use std::collections::{BTreeMap, BTreeSet};

use roaring::RoaringBitmap;

use super::transaction::{IndexChange, NewSegment, Transaction};
use crate::format::manifest::{Manifest, Operation};
use crate::ledger::ids::FragmentId;

pub use super::reason::Conflict;

/// Whether applying `txn` onto `latest` is a rebase (winners committed since it read).
pub fn is_rebase(latest: &Manifest, txn: &Transaction) -> bool {
    latest.version != txn.read_version
}

/// Rules 1–3: whether `txn`, read at `read`, can be applied onto `latest` (as is, or rebased).
pub fn check(read: &Manifest, latest: &Manifest, txn: &Transaction) -> Result<(), Conflict> {
    let touched = txn.deletions.keys().chain(txn.column_rewrites.keys());
    for &id in touched {
        let fragment = FragmentId(id);
        let now = latest
            .fragment(id)
            .ok_or(Conflict::FragmentRemoved { fragment })?;
        let before = read
            .fragment(id)
            .ok_or(Conflict::FragmentNotRead { fragment })?;
        if now.files != before.files {
            return Err(Conflict::FragmentRewritten { fragment });
        }
    }
    if is_rebase(latest, txn) {
        check_index_change(read, latest, txn)?;
    }
    for rewrite in &txn.rewrites {
        for (source, files) in rewrite.sources.iter().zip(&rewrite.source_files) {
            let fragment = FragmentId(source.id);
            match latest.fragment(source.id) {
                None => return Err(Conflict::RewriteSourceRemoved { fragment }),
                Some(now) if &now.files != files => {
                    return Err(Conflict::RewriteSourceRewritten { fragment });
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Rule 2: an index change read at an older version replayed onto `latest`. (Fragments
/// leave through rewrites whose rows live on in other fragments: keeping a segment over
/// them would let it own rows another segment owns, or rows changed since it read them.)
fn check_index_change(
    read: &Manifest,
    latest: &Manifest,
    txn: &Transaction,
) -> Result<(), Conflict> {
    let (index, remove, added): (&str, &[u64], &[NewSegment]) = match &txn.index_change {
        None => return Ok(()),
        Some(IndexChange::Drop { name }) => {
            return match latest.index(name) {
                Some(_) => Ok(()),
                None => Err(Conflict::IndexDropped {
                    index: name.clone(),
                }),
            };
        }
        Some(IndexChange::Create { def, segments }) => (&def.name, &[], segments),
        Some(IndexChange::ReplaceSegments {
            index, remove, add, ..
        }) => {
            match latest.index(index) {
                None => {
                    return Err(Conflict::IndexDropped {
                        index: index.clone(),
                    });
                }
                Some(now) if read.index(index) != Some(now) => {
                    return Err(Conflict::IndexRedefined {
                        index: index.clone(),
                    });
                }
                Some(_) => {}
            }
            (index, remove, add)
        }
    };
    if let Some(&segment) = remove
        .iter()
        .find(|id| !latest.index_segments.iter().any(|s| s.id == **id))
    {
        return Err(Conflict::SegmentReplaced {
            index: index.to_string(),
            segment,
        });
    }
    for segment in added {
        if let Some(&f) = segment
            .fragment_bitmap
            .iter()
            .find(|f| latest.fragment(**f).is_none())
        {
            return Err(Conflict::FragmentLeftDuringBuild {
                index: index.to_string(),
                fragment: FragmentId(f),
            });
        }
    }
    Ok(())
}

/// Rule 4: our deletions `ours` of `fragment` against the rows winners deleted from it
/// since the statement read it (`by_winners`: latest deletion vector minus the one read).
pub fn check_deletions(
    fragment: u64,
    by_winners: &RoaringBitmap,
    ours: &RoaringBitmap,
) -> Result<(), Conflict> {
    match by_winners.intersection_len(ours) {
        0 => Ok(()),
        rows => Err(Conflict::RowsDeletedByWinner {
            fragment: FragmentId(fragment),
            rows,
        }),
    }
}

/// Rule 6: a MERGE `txn` read at `read` against the winners committed since, oldest first
/// (`winners`: the manifests of versions `read.version + 1 ..= latest`). A winner appended
/// rows when it allocated fragment ids (a MERGE rewrites no fragments, so every new id is an
/// appended fragment).
pub fn check_concurrent_merges(
    read: &Manifest,
    winners: &[&Manifest],
    txn: &Transaction,
) -> Result<(), Conflict> {
    if txn.operation != Operation::Merge {
        return Ok(());
    }
    let mut before = read;
    for &winner in winners {
        if winner.transaction.operation == Operation::Merge
            && winner.next_fragment_id > before.next_fragment_id
        {
            return Err(Conflict::ConcurrentMerge {
                version: winner.version,
            });
        }
        before = winner;
    }
    Ok(())
}

/// Rule 5: the manifest `next` a *rebased index change* would produce. Call it only for
/// those (see [`is_rebase`]); it validates `next` (so the caller need not), and an invalid
/// result is a conflict, since the winners' changes made it so.
pub fn check_applied(next: &Manifest) -> Result<(), Conflict> {
    let mut names = BTreeSet::new();
    for index in &next.indexes {
        if !names.insert(index.name.as_str()) {
            return Err(Conflict::IndexCreatedTwice {
                index: index.name.clone(),
            });
        }
    }
    if let Some(s) = next
        .index_segments
        .iter()
        .find(|s| next.index(&s.index).is_none())
    {
        return Err(Conflict::IndexDropped {
            index: s.index.clone(),
        });
    }
    for index in &next.indexes {
        let mut owner: BTreeMap<u64, u64> = BTreeMap::new();
        for segment in next.segments_of(&index.name) {
            for f in segment.ownership() {
                if let Some(first) = owner.insert(f, segment.id) {
                    return Err(Conflict::FragmentOwnedTwice {
                        index: index.name.clone(),
                        fragment: FragmentId(f),
                        segments: [first, segment.id],
                    });
                }
            }
        }
    }
    next.validate()
        .map_err(|reason| Conflict::InvalidAfterRebase { reason })
}

#[cfg(test)]
mod matrix;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::fixtures::{append, segment_over, table, with_index};
    use super::super::rebase::{ApplyError, apply};
    use super::*;
    use crate::format::manifest::{DataFile, Operation};

    fn applied(latest: &Manifest, txn: &Transaction) -> Manifest {
        apply(latest, txn, &BTreeMap::new(), "t".into()).unwrap()
    }

    fn file(name: &str) -> DataFile {
        DataFile {
            path: format!("data/{name}.parquet"),
            columns: vec!["id".into()],
            size_bytes: 1,
            footer: None,
            stats: Vec::new(),
        }
    }

    #[test]
    fn touching_a_rewritten_or_removed_fragment_conflicts() {
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m2 = applied(&table(false), &t);
        let mut rewrite = Transaction::new(Operation::Update, 2);
        rewrite.column_rewrites.insert(0, file("n"));
        let m3 = applied(&m2, &rewrite);
        let mut delete = Transaction::new(Operation::Delete, 2);
        delete.deletions.insert(0, [1u32].into_iter().collect());
        let fragment = FragmentId(0);
        assert_eq!(
            check(&m2, &m3, &delete),
            Err(Conflict::FragmentRewritten { fragment })
        );
        let mut gone = m3.clone();
        gone.fragments.clear();
        assert_eq!(
            check(&m2, &gone, &delete),
            Err(Conflict::FragmentRemoved { fragment })
        );
        assert_eq!(check(&m2, &m2, &delete), Ok(()));
        assert!(
            Conflict::FragmentRemoved { fragment }
                .to_string()
                .contains("removed")
        );
    }

    #[test]
    fn deletions_conflict_only_on_rows_a_winner_deleted() {
        let ours: RoaringBitmap = [2u32, 7].into_iter().collect();
        let disjoint: RoaringBitmap = [1u32, 5].into_iter().collect();
        assert_eq!(check_deletions(3, &disjoint, &ours), Ok(()));
        let overlapping: RoaringBitmap = [1u32, 2, 7].into_iter().collect();
        assert_eq!(
            check_deletions(3, &overlapping, &ours),
            Err(Conflict::RowsDeletedByWinner {
                fragment: FragmentId(3),
                rows: 2
            })
        );
    }

    #[test]
    fn two_segments_cannot_own_one_fragment() {
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m = with_index(&applied(&table(false), &t));
        let mut build = Transaction::new(Operation::OptimizeIndex, m.version);
        build.read_fragment_files = m
            .fragments
            .iter()
            .map(|f| (f.id, f.files.clone()))
            .collect();
        build.index_change = Some(IndexChange::ReplaceSegments {
            index: "i".into(),
            remove: vec![],
            add: vec![segment_over(&[0])],
            def: None,
        });
        let m2 = applied(&m, &build);
        // The same build rebased onto its own result: both segments would own fragment 0.
        assert_eq!(check(&m, &m2, &build), Ok(()));
        let err = apply(&m2, &build, &BTreeMap::new(), "z".into()).unwrap_err();
        let ApplyError::Conflict(conflict) = err else {
            panic!("not a conflict: {err}")
        };
        assert_eq!(
            conflict,
            Conflict::FragmentOwnedTwice {
                index: "i".into(),
                fragment: FragmentId(0),
                segments: [0, 1],
            }
        );
        assert!(conflict.to_string().contains("owned by two segments"));
    }

    /// A build over index `i` (one segment over fragment 0) retrained with a new model.
    fn retrain(m: &Manifest) -> Transaction {
        let mut t = Transaction::new(Operation::OptimizeIndex, m.version);
        let def = crate::format::index_meta::IndexDef {
            model_file: "_indexes/i/retrained.model".into(),
            ..m.index("i").unwrap().clone()
        };
        t.index_change = Some(IndexChange::ReplaceSegments {
            index: "i".into(),
            remove: m.segments_of("i").map(|s| s.id).collect(),
            add: vec![segment_over(&[0])],
            def: Some(def),
        });
        t
    }

    /// Three writers: a retrain reads version 2, an INSERT commits version 3, an index append
    /// reads version 3 (indexing only the new fragment, with the old centroids), the retrain
    /// commits version 4. The append shares no fragment with the retrain, yet rebasing it
    /// would put a segment of old centroids into the retrained index.
    #[test]
    fn an_index_append_over_a_concurrent_retrain_conflicts() {
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m = with_index(&applied(&table(false), &t));
        let retrain = retrain(&m);
        let mut insert = Transaction::new(Operation::Append, m.version);
        insert.appends = vec![append(4, "b")];
        let m2 = applied(&m, &insert);
        let mut index_append = Transaction::new(Operation::OptimizeIndex, m2.version);
        index_append.index_change = Some(IndexChange::ReplaceSegments {
            index: "i".into(),
            remove: vec![],
            add: vec![segment_over(&[1])],
            def: None,
        });
        let m3 = applied(&m2, &retrain);
        let index = "i".to_string();
        assert_eq!(
            check(&m2, &m3, &index_append),
            Err(Conflict::IndexRedefined { index })
        );
        // Without the retrain in between, the same append rebases over the INSERT.
        let mut append_at_m = index_append.clone();
        append_at_m.read_version = m.version;
        assert_eq!(check(&m, &m2, &append_at_m), Ok(()));
    }

    /// Two MERGEs: the winner appended rows (inserted, or new versions), which the second
    /// one's matching never saw. A blind INSERT, or a MERGE that appended nothing, does not
    /// conflict.
    #[test]
    fn a_merge_conflicts_with_a_concurrent_merge_that_appended_rows() {
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m = applied(&table(false), &t);
        let mut ours = Transaction::new(Operation::Merge, m.version);
        ours.appends = vec![append(1, "o")];
        let mut merge = Transaction::new(Operation::Merge, m.version);
        merge.appends = vec![append(1, "w")];
        let after_merge = applied(&m, &merge);
        assert_eq!(
            check_concurrent_merges(&m, &[&after_merge], &ours),
            Err(Conflict::ConcurrentMerge {
                version: after_merge.version
            })
        );
        // Found behind another winner too.
        let mut insert = Transaction::new(Operation::Append, m.version);
        insert.appends = vec![append(2, "i")];
        let after_insert = applied(&m, &insert);
        let merge_later = applied(&after_insert, &merge);
        assert!(check_concurrent_merges(&m, &[&after_insert, &merge_later], &ours).is_err());
        assert_eq!(check_concurrent_merges(&m, &[&after_insert], &ours), Ok(()));
        let mut deleting_merge = Transaction::new(Operation::Merge, m.version);
        deleting_merge
            .deletions
            .insert(0, [1u32].into_iter().collect());
        let deleted = apply(
            &m,
            &deleting_merge,
            &BTreeMap::from([(
                0,
                crate::format::manifest::DeletionFile {
                    path: "_deletions/0-x.del".into(),
                    deleted_rows: 1,
                    read_version: m.version,
                    crc32c: None,
                },
            )]),
            "d".into(),
        )
        .unwrap();
        assert_eq!(check_concurrent_merges(&m, &[&deleted], &ours), Ok(()));
        // Only a MERGE is checked: an UPDATE after the same winner rebases.
        let mut update = ours.clone();
        update.operation = Operation::Update;
        assert_eq!(
            check_concurrent_merges(&m, &[&after_merge], &update),
            Ok(())
        );
    }

    #[test]
    fn dropping_an_index_a_winner_dropped_conflicts() {
        let m = with_index(&table(false));
        let mut drop = Transaction::new(Operation::DropIndex, m.version);
        drop.index_change = Some(IndexChange::Drop { name: "i".into() });
        let m2 = applied(&m, &drop);
        let index = "i".to_string();
        assert_eq!(check(&m, &m2, &drop), Err(Conflict::IndexDropped { index }));
        // Not rebased: the statement named an index that does not exist (its own fault).
        let mut again = drop.clone();
        again.read_version = m2.version;
        assert_eq!(check(&m2, &m2, &again), Ok(()));
        assert!(matches!(
            apply(&m2, &again, &BTreeMap::new(), "y".into()),
            Err(ApplyError::Invalid(_))
        ));
    }
}

//! The rebase: builds the next manifest from the latest one and a transaction. Pure: no IO.
//!
//! [`apply`] is the whole of it: deletion vectors (already written and merged by the
//! caller), in-place column rewrites (marking segments that held the old values of an
//! indexed column stale for that fragment), rewrites spliced in at their sources' position
//! (`splice`, recording a ledger transition when a segment still names a source),
//! appends at the end with fresh fragment ids ([`allocate_ids`]) and row ids, the index
//! change, the `CLUSTER BY` key, and the ledger trimmed to the transitions segments need.
//!
//! Contract: the caller has run [`super::conflict::check`] (rules 1–3) and, for deletions,
//! [`super::conflict::check_deletions`]; `apply` then either returns a manifest that passes
//! [`Manifest::validate`] or an [`ApplyError`]: a [`Conflict`] when a *rebased* index change
//! collides with a winner's (rule 5, [`super::conflict::check_applied`]), or
//! [`FormatError::InvalidInput`] when the transaction itself is malformed (a bug in the
//! statement that built it: run out of fragment ids, a wrong number of row ids, rewrite
//! sources not adjacent, an index that does not exist).
//!
//! Ordering: scan order is the manifest's fragment list; a rewrite's outputs take the place
//! of its first source, appends go last, in the transaction's order. Fragment ids are only
//! names: new ones are allocated from `latest.next_fragment_id`, rewrite outputs first.
//! Cost: one clone of `latest` plus work linear in its fragments, segments and ledger.

use std::collections::{BTreeMap, BTreeSet};

use super::conflict::{self, Conflict};
use super::transaction::{IndexChange, NewRowIds, NewSegment, Rewrite, Transaction};
use crate::format::error::FormatError;
use crate::format::index_meta::IndexSegment;
use crate::format::manifest::{
    DeletionFile, Fragment, MAX_FRAGMENT_ID, Manifest, TransactionRecord, now_ms,
};
use crate::format::rowids::RowIdSequence;
use crate::ledger::transition::{descendants, needed};

/// Why [`apply`] built no manifest.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A rebased index change collides with what a winner committed.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The transaction is malformed ([`FormatError::InvalidInput`]).
    #[error(transparent)]
    Invalid(#[from] FormatError),
}

type Result<T, E = ApplyError> = std::result::Result<T, E>;

/// Fragment ids a commit onto `latest` gives to new fragments: each rewrite's outputs in
/// order, then the appends.
pub fn allocate_ids(latest: &Manifest, txn: &Transaction) -> (Vec<Vec<u64>>, Vec<u64>) {
    let mut next = latest.next_fragment_id;
    let mut take = |n: usize| {
        let ids: Vec<u64> = (next..next + n as u64).collect();
        next += n as u64;
        ids
    };
    let rewrites = txn.rewrites.iter().map(|r| take(r.outputs.len())).collect();
    let appends = take(txn.appends.len());
    (rewrites, appends)
}

/// Builds the next manifest from `latest` (pure). `deletion_files` are the already-written,
/// already-merged deletion vectors of the fragments in `txn.deletions` (and of rewrite
/// outputs that carry deletions made since the rewrite read its sources).
pub fn apply(
    latest: &Manifest,
    txn: &Transaction,
    deletion_files: &BTreeMap<u64, DeletionFile>,
    tag: String,
) -> Result<Manifest> {
    let mut next = latest.clone();
    next.version = latest.version + 1;
    next.transaction = TransactionRecord {
        operation: txn.operation,
        read_version: txn.read_version,
        timestamp_ms: now_ms(),
        tag,
    };
    // Fragments whose rows each segment holds: the ones its file names and those the ledger
    // says their rows went to. Computed once, and only when an in-place rewrite needs it.
    let held: Vec<BTreeSet<u64>> = if txn.column_rewrites.is_empty() {
        vec![]
    } else {
        next.index_segments
            .iter()
            .map(|seg| descendants(&latest.reuse_ledger, &seg.fragment_bitmap))
            .collect()
    };
    for frag in next.fragments.iter_mut() {
        if let Some(file) = deletion_files.get(&frag.id) {
            frag.deletion = Some(file.clone());
        }
        if let Some(file) = txn.column_rewrites.get(&frag.id) {
            // Segments holding this fragment's old values of an indexed column become stale
            // for it: record that, so their ownership excludes it from now on.
            let indexed: BTreeSet<&str> = next
                .indexes
                .iter()
                .filter(|i| file.columns.contains(&i.column))
                .map(|i| i.name.as_str())
                .collect();
            for (seg, held) in next.index_segments.iter_mut().zip(&held) {
                if indexed.contains(seg.index.as_str()) && held.contains(&frag.id) {
                    seg.invalidated_fragments.insert(frag.id);
                }
            }
            for old in frag.files.iter_mut() {
                old.columns.retain(|c| !file.columns.contains(c));
            }
            frag.files.retain(|f| !f.columns.is_empty());
            frag.files.push(file.clone());
        }
    }
    let stable = latest.properties.stable_row_ids;
    let (rewrite_ids, append_ids) = allocate_ids(latest, txn);
    let total = rewrite_ids.iter().map(Vec::len).sum::<usize>() + append_ids.len();
    if latest.next_fragment_id + total as u64 > MAX_FRAGMENT_ID + 1 {
        return Err(FormatError::invalid("the table has run out of fragment ids").into());
    }
    next.next_fragment_id += total as u64;
    // Segment files name these fragments; transitions that moved their rows are needed.
    let roots: BTreeSet<u64> = next
        .index_segments
        .iter()
        .flat_map(|s| s.fragment_bitmap.iter().copied())
        .collect();
    let reach = descendants(&next.reuse_ledger, &roots);
    for (rewrite, ids) in txn.rewrites.iter().zip(&rewrite_ids) {
        splice(&mut next, rewrite, ids, stable, deletion_files)?;
        if rewrite.sources.iter().any(|s| reach.contains(&s.id)) {
            let id = next.next_transition_id;
            next.next_transition_id += 1;
            let t = rewrite.transition(id, txn.read_version, next.version, ids);
            next.reuse_ledger.push(t);
        }
    }
    for (new, id) in txn.appends.iter().zip(append_ids) {
        let rows = new.written.physical_rows;
        let row_ids = match (&new.row_ids, stable) {
            (_, false) => None,
            (NewRowIds::Fresh, true) => {
                let seq = RowIdSequence::from_range(next.next_row_id, rows);
                next.next_row_id += rows;
                Some(seq)
            }
            (NewRowIds::Given(seq), true) => {
                if seq.len() != rows {
                    return Err(FormatError::invalid(format!(
                        "{} row ids given for {rows} rows",
                        seq.len()
                    ))
                    .into());
                }
                Some(seq.clone())
            }
        };
        next.fragments.push(Fragment {
            id,
            files: new.written.files.clone(),
            physical_rows: rows,
            deletion: None,
            row_ids,
        });
    }
    if let Some(change) = &txn.index_change {
        apply_index_change(&mut next, latest, txn, change)?;
    }
    if let Some(keys) = &txn.cluster_by {
        next.properties.cluster_by = keys.clone();
    }
    next.properties
        .maintenance
        .apply(&txn.policy_changes)
        .map_err(|e| FormatError::invalid(e.to_string()))?;
    // Transitions no segment needs any more (their segments were merged or dropped).
    let roots: BTreeSet<u64> = next
        .index_segments
        .iter()
        .flat_map(|s| s.fragment_bitmap.iter().copied())
        .collect();
    next.reuse_ledger = needed(&next.reuse_ledger, &roots);
    next.sync_index_feature();
    if conflict::is_rebase(latest, txn) && txn.index_change.is_some() {
        // A rebased index change can collide with a concurrent one (two appends indexing
        // the same fragments): rule 5 decides, and validates.
        conflict::check_applied(&next)?;
    } else {
        next.validate().map_err(|reason| {
            FormatError::invalid(format!(
                "commit would produce an invalid manifest: {reason}"
            ))
        })?;
    }
    Ok(next)
}

/// Replaces a rewrite's sources by its outputs at the sources' position.
fn splice(
    next: &mut Manifest,
    rewrite: &Rewrite,
    ids: &[u64],
    stable: bool,
    deletion_files: &BTreeMap<u64, DeletionFile>,
) -> Result<()> {
    let position = |id: u64| next.fragments.iter().position(|f| f.id == id);
    let first = rewrite
        .sources
        .first()
        .and_then(|s| position(s.id))
        .ok_or_else(|| FormatError::invalid("a rewrite source is not in the table"))?;
    let n = rewrite.sources.len();
    if rewrite.row_map.is_none() {
        // An order-preserving rewrite replaces a contiguous run, so order is kept exactly.
        let adjacent = next.fragments.len() >= first + n
            && rewrite
                .sources
                .iter()
                .zip(&next.fragments[first..first + n])
                .all(|(s, f)| s.id == f.id);
        if !adjacent {
            return Err(FormatError::invalid(
                "the fragments of a rewrite are not adjacent in the table",
            )
            .into());
        }
    } else if rewrite.sources.iter().any(|s| position(s.id).is_none()) {
        return Err(FormatError::invalid("a rewrite source is not in the table").into());
    }
    let mut outputs = Vec::with_capacity(ids.len());
    for (new, &id) in rewrite.outputs.iter().zip(ids) {
        let rows = new.written.physical_rows;
        let row_ids = match (&new.row_ids, stable) {
            (_, false) => None,
            (NewRowIds::Given(seq), true) if seq.len() == rows => Some(seq.clone()),
            _ => {
                return Err(
                    FormatError::invalid("rewrite outputs must carry their rows' ids").into(),
                );
            }
        };
        outputs.push(Fragment {
            id,
            files: new.written.files.clone(),
            physical_rows: rows,
            deletion: deletion_files.get(&id).cloned(),
            row_ids,
        });
    }
    // The outputs take the place of the first source; the other sources leave (a stable
    // partition may take fragments from anywhere in the table).
    let sources: BTreeSet<u64> = rewrite.sources.iter().map(|s| s.id).collect();
    let tail = next.fragments.split_off(first);
    next.fragments.extend(outputs);
    next.fragments
        .extend(tail.into_iter().filter(|f| !sources.contains(&f.id)));
    Ok(())
}

/// Applies the index change: new segments get ids (and, per [`txn_read_files`], the
/// fragments they hold stale rows of), dropped or replaced segments leave.
fn apply_index_change(
    next: &mut Manifest,
    latest: &Manifest,
    txn: &Transaction,
    change: &IndexChange,
) -> Result<()> {
    let add = |next: &mut Manifest, index: &str, new: &NewSegment| {
        let id = next.next_segment_id;
        next.next_segment_id += 1;
        // Fragments of the new segment rewritten in place (or removed) since the version the
        // segment was built from hold different rows now: the segment's rows of them are stale.
        let read_files = |f: u64| txn_read_files(txn, latest, f);
        let invalidated: BTreeSet<u64> = new
            .fragment_bitmap
            .iter()
            .copied()
            .filter(|f| read_files(*f))
            .collect();
        next.index_segments.push(IndexSegment {
            id,
            index: index.to_string(),
            file: new.file.clone(),
            size_bytes: new.size_bytes,
            rows: new.rows,
            built_at_version: txn.read_version,
            fragment_bitmap: new.fragment_bitmap.clone(),
            invalidated_fragments: invalidated,
        });
    };
    match change {
        IndexChange::Create { def, segments } => {
            next.indexes.push(def.clone());
            for s in segments {
                add(next, &def.name, s);
            }
        }
        IndexChange::Drop { name } => {
            if next.index(name).is_none() {
                // Rebased, a winner dropped it (rule 2 of the conflict check); otherwise the
                // statement named an index that does not exist.
                if conflict::is_rebase(latest, txn) {
                    return Err(Conflict::IndexDropped {
                        index: name.clone(),
                    }
                    .into());
                }
                return Err(FormatError::invalid(format!("index '{name}' does not exist")).into());
            }
            next.indexes.retain(|i| &i.name != name);
            next.index_segments.retain(|s| &s.index != name);
        }
        IndexChange::ReplaceSegments {
            index,
            remove,
            add: new,
            def,
        } => {
            next.index_segments
                .retain(|s| !(&s.index == index && remove.contains(&s.id)));
            if let Some(def) = def {
                next.index_segments.retain(|s| &s.index != index);
                for i in next.indexes.iter_mut().filter(|i| &i.name == index) {
                    *i = def.clone();
                }
            }
            for s in new {
                add(next, index, s);
            }
        }
    }
    next.sync_index_feature();
    Ok(())
}

/// Whether a new segment must treat fragment `f` of its bitmap as invalidated: its rows
/// were not read by the builder, or the fragment was rewritten in place between the version
/// the builder read and `latest`. (A fragment that left the table since is a conflict, see
/// [`super::conflict`], rule 2.)
fn txn_read_files(txn: &Transaction, latest: &Manifest, f: u64) -> bool {
    match (txn.read_fragment_files.get(&f), latest.fragment(f)) {
        (Some(read), Some(now)) => read != &now.files,
        (_, None) => false,      // removed: masked by the fragment list anyway
        (None, Some(_)) => true, // kept only as provenance
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{append, segment_over, table, with_index};
    use super::*;
    use crate::format::manifest::{DataFile, Operation};

    #[test]
    fn appends_get_fresh_ids_at_the_end() {
        let m = table(true);
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(10, "a"), append(5, "b")];
        let m2 = apply(&m, &t, &BTreeMap::new(), "x".into()).unwrap();
        let mut t2 = Transaction::new(Operation::Append, 1);
        t2.appends = vec![append(3, "c")];
        // Rebased onto m2 although it read version 1.
        let m3 = apply(&m2, &t2, &BTreeMap::new(), "y".into()).unwrap();
        assert_eq!(
            m3.fragments.iter().map(|f| f.id).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            m3.fragments[2].row_ids,
            Some(RowIdSequence::from_range(15, 3))
        );
        assert_eq!(m3.next_row_id, 18);
        assert_eq!(m3.version, 3);
    }

    #[test]
    fn column_rewrite_replaces_columns_in_place() {
        let m = table(false);
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m2 = apply(&m, &t, &BTreeMap::new(), "x".into()).unwrap();
        let mut t2 = Transaction::new(Operation::Update, 2);
        let file = DataFile {
            path: "data/new.parquet".into(),
            columns: vec!["id".into()],
            size_bytes: 1,
            footer: None,
            stats: Vec::new(),
        };
        t2.column_rewrites.insert(0, file.clone());
        let m3 = apply(&m2, &t2, &BTreeMap::new(), "y".into()).unwrap();
        assert_eq!(m3.fragments[0].files, vec![file]);
        assert_eq!(m3.fragments[0].id, 0);
    }

    #[test]
    fn rewriting_an_indexed_column_in_place_invalidates_the_fragment() {
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a"), append(4, "b")];
        let m = with_index(&apply(&table(false), &t, &BTreeMap::new(), "x".into()).unwrap());
        let mut build = Transaction::new(Operation::OptimizeIndex, m.version);
        build.index_change = Some(IndexChange::ReplaceSegments {
            index: "i".into(),
            remove: vec![],
            add: vec![segment_over(&[0, 1])],
            def: None,
        });
        build.read_fragment_files = m
            .fragments
            .iter()
            .map(|f| (f.id, f.files.clone()))
            .collect();
        // A concurrent in-place rewrite of fragment 1 commits before the build does.
        let mut rewrite = Transaction::new(Operation::Update, m.version);
        rewrite.column_rewrites.insert(
            1,
            DataFile {
                path: "data/n.parquet".into(),
                columns: vec!["id".into()],
                size_bytes: 1,
                footer: None,
                stats: Vec::new(),
            },
        );
        let m2 = apply(&m, &rewrite, &BTreeMap::new(), "y".into()).unwrap();
        let m3 = apply(&m2, &build, &BTreeMap::new(), "z".into()).unwrap();
        let seg = &m3.index_segments[0];
        assert_eq!(seg.invalidated_fragments, BTreeSet::from([1]));
        assert_eq!(seg.ownership(), BTreeSet::from([0]));
        // And a later rewrite of fragment 0 invalidates it in the committed segment.
        let mut again = Transaction::new(Operation::Update, m3.version);
        again.column_rewrites.insert(
            0,
            DataFile {
                path: "data/o.parquet".into(),
                columns: vec!["id".into()],
                size_bytes: 1,
                footer: None,
                stats: Vec::new(),
            },
        );
        let m4 = apply(&m3, &again, &BTreeMap::new(), "w".into()).unwrap();
        assert_eq!(
            m4.index_segments[0].invalidated_fragments,
            BTreeSet::from([0, 1])
        );
    }
}

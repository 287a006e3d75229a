//! Optimistic commits.
//!
//! A writer reads version `r`, writes its data files, and then tries to publish manifest `v + 1`
//! (where `v` is the latest version) with a create-if-absent put. If other writers committed
//! since `r`, the transaction is **rebased** onto the latest manifest when that is safe:
//!
//! * appends always rebase: their fragments get fresh ids and go after the winners' fragments;
//! * deletions rebase onto the latest deletion vector of each fragment (the union), unless a
//!   winner deleted one of the same rows (e.g. a concurrent UPDATE moved it): then the rows this
//!   transaction read are gone and the statement must re-read, so it fails with a retryable
//!   [`FormatError::Conflict`];
//! * touching a fragment that a winner removed or rewrote in place is a conflict too.
//!
//! A crash before the manifest put leaves only orphan files; the table still reads at its last
//! version. [`apply`] is the pure part (no IO) and is unit-tested on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use roaring::RoaringBitmap;

use super::error::{FormatError, Result};
use super::fragment_io::WrittenFragment;
use super::index_meta::{IndexDef, IndexSegment};
use super::manifest::{
    DataFile, DeletionFile, Fragment, MAX_FRAGMENT_ID, Manifest, Operation, TransactionRecord,
    now_ms,
};
use super::rowids::RowIdSequence;
use super::store::{Snapshot, TableDir, random_tag};
use crate::ledger::transition::{descendants, needed};
use crate::ledger::{FragmentDigest, Mapping, Transition};

pub mod retry;

/// How many times one commit re-reads the latest version after losing a put race.
const MAX_PUT_ATTEMPTS: usize = 20;

/// Row ids of appended rows (ignored by tables without stable row ids).
#[derive(Clone, Debug, PartialEq)]
pub enum NewRowIds {
    /// New rows: ids are allocated from the table's counter at commit time.
    Fresh,
    /// Rows that keep existing ids (the new versions of updated rows).
    Given(RowIdSequence),
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewFragment {
    pub written: WrittenFragment,
    pub row_ids: NewRowIds,
}

/// A segment written but not yet committed: it gets its id when the commit assigns one.
#[derive(Clone, Debug, PartialEq)]
pub struct NewSegment {
    pub file: String,
    pub size_bytes: u64,
    pub rows: u64,
    pub fragment_bitmap: BTreeSet<u64>,
}

/// Changes to a table's vector indexes.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexChange {
    /// A new index with its first segments.
    Create {
        def: IndexDef,
        segments: Vec<NewSegment>,
    },
    Drop {
        name: String,
    },
    /// Replaces some segments of an index by new ones (append: none removed; merge: the
    /// inputs removed). With `def`, the index itself is replaced too (retrain).
    ReplaceSegments {
        index: String,
        remove: Vec<u64>,
        add: Vec<NewSegment>,
        def: Option<IndexDef>,
    },
}

/// A rewrite of adjacent fragments (compaction, recluster): the outputs replace the sources
/// **at the sources' position** in the fragment list, so scan order is kept.
#[derive(Clone, Debug)]
pub struct Rewrite {
    /// The sources as the rewrite read them, in logical order (adjacent).
    pub sources: Vec<FragmentDigest>,
    /// Their data files as read: a source rewritten in place since is a conflict.
    pub source_files: Vec<Vec<DataFile>>,
    /// The deletion file of each source as read (`None`: none). Its rows did not move; rows
    /// deleted since are carried over to the outputs at commit time.
    pub removed: Vec<Option<DeletionFile>>,
    /// The new fragments, in order; their row ids are the sources' surviving ids.
    pub outputs: Vec<NewFragment>,
    /// How rows map onto the outputs (an ordered compaction unless a row map is given).
    pub row_map: Option<RowMapRef>,
}

/// A row-map file written by a stable-partition rewrite.
#[derive(Clone, Debug, PartialEq)]
pub struct RowMapRef {
    pub path: String,
    pub size_bytes: u64,
}

impl Rewrite {
    /// The rewrite of `sources` (as read) into `outputs`.
    pub fn of(sources: &[Fragment], outputs: Vec<NewFragment>, row_map: Option<RowMapRef>) -> Self {
        Rewrite {
            sources: sources
                .iter()
                .map(|f| FragmentDigest {
                    id: f.id,
                    physical_rows: f.physical_rows,
                    deleted_rows: f.deleted_rows(),
                })
                .collect(),
            source_files: sources.iter().map(|f| f.files.clone()).collect(),
            removed: sources.iter().map(|f| f.deletion.clone()).collect(),
            outputs,
            row_map,
        }
    }

    fn mapping(&self) -> Mapping {
        match &self.row_map {
            None => Mapping::OrderedCompaction {
                removed: self
                    .removed
                    .iter()
                    .map(|d| d.as_ref().map(|d| d.path.clone()))
                    .collect(),
            },
            Some(r) => Mapping::StablePartition {
                row_map: r.path.clone(),
                size_bytes: r.size_bytes,
            },
        }
    }

    /// The transition this rewrite records once its outputs have ids.
    pub fn transition(&self, id: u64, read: u64, committed: u64, outputs: &[u64]) -> Transition {
        Transition {
            id,
            source_version: read,
            committed_version: committed,
            sources: self.sources.clone(),
            destinations: self
                .outputs
                .iter()
                .zip(outputs)
                .map(|(o, id)| FragmentDigest {
                    id: *id,
                    physical_rows: o.written.physical_rows,
                    deleted_rows: 0,
                })
                .collect(),
            mapping: self.mapping(),
        }
    }
}

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

/// The changes one statement makes, relative to the version it read.
#[derive(Clone, Debug)]
pub struct Transaction {
    pub operation: Operation,
    pub read_version: u64,
    /// Appended at the end of the fragment list, in this order.
    pub appends: Vec<NewFragment>,
    /// Offsets newly deleted by this transaction, by fragment id.
    pub deletions: BTreeMap<u64, RoaringBitmap>,
    /// In-place column rewrites: the new file replaces its columns in the fragment.
    pub column_rewrites: BTreeMap<u64, DataFile>,
    pub index_change: Option<IndexChange>,
    /// For index builds: the data files of every fragment the new segments cover, as read.
    /// A fragment whose files differ at commit time is marked invalidated in the new segment.
    pub read_fragment_files: BTreeMap<u64, Vec<DataFile>>,
    /// Rewrites of adjacent fragments, spliced in place.
    pub rewrites: Vec<Rewrite>,
    /// A new `CLUSTER BY` key (empty: none).
    pub cluster_by: Option<Vec<String>>,
}

impl Transaction {
    pub fn new(operation: Operation, read_version: u64) -> Self {
        Self {
            operation,
            read_version,
            appends: vec![],
            deletions: BTreeMap::new(),
            column_rewrites: BTreeMap::new(),
            index_change: None,
            read_fragment_files: BTreeMap::new(),
            rewrites: vec![],
            cluster_by: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.appends.is_empty()
            && self.deletions.is_empty()
            && self.column_rewrites.is_empty()
            && self.index_change.is_none()
            && self.rewrites.is_empty()
            && self.cluster_by.is_none()
    }
}

/// Why a transaction cannot be rebased onto `latest`, if it cannot.
pub fn rebase_conflict(read: &Manifest, latest: &Manifest, txn: &Transaction) -> Option<String> {
    let touched = txn.deletions.keys().chain(txn.column_rewrites.keys());
    for id in touched {
        let Some(now) = latest.fragment(*id) else {
            return Some(format!("fragment {id} was removed by a concurrent commit"));
        };
        let Some(before) = read.fragment(*id) else {
            return Some(format!(
                "fragment {id} is not in the version the statement read"
            ));
        };
        if now.files != before.files {
            return Some(format!(
                "fragment {id} was rewritten by a concurrent commit"
            ));
        }
    }
    if latest.version != txn.read_version
        && let Some(reason) = index_change_conflict(latest, txn)
    {
        return Some(reason);
    }
    for rewrite in &txn.rewrites {
        for (source, files) in rewrite.sources.iter().zip(&rewrite.source_files) {
            match latest.fragment(source.id) {
                None => {
                    return Some(format!(
                        "fragment {} was rewritten or removed by a concurrent commit",
                        source.id
                    ));
                }
                Some(now) if &now.files != files => {
                    return Some(format!(
                        "fragment {} was rewritten in place by a concurrent commit",
                        source.id
                    ));
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// Why an index change read at an older version cannot be replayed onto `latest`: a segment
/// it replaces is gone, or a fragment its new segments hold left the table since. (Fragments
/// leave through rewrites whose rows live on in other fragments: keeping such a segment
/// would let it own rows another segment owns, or rows changed since it read them.)
fn index_change_conflict(latest: &Manifest, txn: &Transaction) -> Option<String> {
    let (remove, added): (&[u64], Vec<&NewSegment>) = match txn.index_change.as_ref()? {
        IndexChange::Create { segments, .. } => (&[], segments.iter().collect()),
        IndexChange::ReplaceSegments { remove, add, .. } => (remove, add.iter().collect()),
        IndexChange::Drop { .. } => return None,
    };
    if let Some(id) = remove
        .iter()
        .find(|id| !latest.index_segments.iter().any(|s| s.id == **id))
    {
        return Some(format!("segment {id} was replaced by a concurrent commit"));
    }
    for segment in added {
        if let Some(f) = segment
            .fragment_bitmap
            .iter()
            .find(|f| latest.fragment(**f).is_none())
        {
            return Some(format!(
                "fragment {f} was rewritten or removed while the index was being built"
            ));
        }
    }
    None
}

/// Builds the next manifest from `latest` (pure). `deletion_files` are the already-written,
/// already-merged deletion vectors of the fragments in `txn.deletions`.
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
        return Err(FormatError::invalid(
            "the table has run out of fragment ids",
        ));
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
                    )));
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
    // Transitions no segment needs any more (their segments were merged or dropped).
    let roots: BTreeSet<u64> = next
        .index_segments
        .iter()
        .flat_map(|s| s.fragment_bitmap.iter().copied())
        .collect();
    next.reuse_ledger = needed(&next.reuse_ledger, &roots);
    next.sync_index_feature();
    next.validate().map_err(|reason| {
        FormatError::invalid(format!(
            "commit would produce an invalid manifest: {reason}"
        ))
    })?;
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
            ));
        }
    } else if rewrite.sources.iter().any(|s| position(s.id).is_none()) {
        return Err(FormatError::invalid("a rewrite source is not in the table"));
    }
    let mut outputs = Vec::with_capacity(ids.len());
    for (new, &id) in rewrite.outputs.iter().zip(ids) {
        let rows = new.written.physical_rows;
        let row_ids = match (&new.row_ids, stable) {
            (_, false) => None,
            (NewRowIds::Given(seq), true) if seq.len() == rows => Some(seq.clone()),
            _ => {
                return Err(FormatError::invalid(
                    "rewrite outputs must carry their rows' ids",
                ));
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
                return Err(FormatError::invalid(format!(
                    "index '{name}' does not exist"
                )));
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
/// [`index_change_conflict`].)
fn txn_read_files(txn: &Transaction, latest: &Manifest, f: u64) -> bool {
    match (txn.read_fragment_files.get(&f), latest.fragment(f)) {
        (Some(read), Some(now)) => read != &now.files,
        (_, None) => false,      // removed: masked by the fragment list anyway
        (None, Some(_)) => true, // kept only as provenance
    }
}

/// Rows of a rewrite's sources deleted after the rewrite read them (a concurrent DELETE or
/// UPDATE) are deleted in the outputs too, so no deleted row comes back: the new deletions
/// are translated through the rewrite's own mapping and written as the outputs' deletion
/// vectors.
async fn carry_deletions(
    dir: &TableDir,
    latest: &Manifest,
    txn: &Transaction,
    deletion_files: &mut BTreeMap<u64, DeletionFile>,
) -> Result<()> {
    let (rewrite_ids, _) = allocate_ids(latest, txn);
    for (rewrite, ids) in txn.rewrites.iter().zip(&rewrite_ids) {
        let mut changed = Vec::new();
        for (i, source) in rewrite.sources.iter().enumerate() {
            let now = latest.fragment(source.id).ok_or_else(|| {
                FormatError::invalid(format!("rewrite source {} left the table", source.id))
            })?;
            if now.deletion != rewrite.removed[i] {
                let before = Fragment {
                    deletion: rewrite.removed[i].clone(),
                    ..now.clone()
                };
                let read = dir.read_deletions(&before).await?;
                let added = &dir.read_deletions(now).await? - &read;
                if !added.is_empty() {
                    changed.push((i, read, added));
                }
            }
        }
        if changed.is_empty() {
            continue;
        }
        let t = rewrite.transition(0, txn.read_version, latest.version + 1, ids);
        let mut per_output: BTreeMap<u64, RoaringBitmap> = BTreeMap::new();
        match &t.mapping {
            Mapping::OrderedCompaction { .. } => {
                let mut removed = vec![RoaringBitmap::new(); rewrite.sources.len()];
                for (i, read, _) in &changed {
                    removed[*i] = read.clone();
                }
                for (i, d) in rewrite.removed.iter().enumerate() {
                    if d.is_some() && removed[i].is_empty() {
                        let source = latest.fragment(rewrite.sources[i].id).expect("checked");
                        let before = Fragment {
                            deletion: d.clone(),
                            ..source.clone()
                        };
                        removed[i] = dir.read_deletions(&before).await?;
                    }
                }
                let remap = crate::ledger::OrderedRemap::new(&t, removed)
                    .map_err(|e| FormatError::ledger(dir.name(), e))?;
                for (i, _, added) in &changed {
                    for (dest, bits) in remap
                        .image(rewrite.sources[*i].id, Some(added))
                        .map_err(|e| FormatError::ledger(dir.name(), e))?
                    {
                        *per_output.entry(dest).or_default() |= bits;
                    }
                }
            }
            Mapping::StablePartition {
                row_map,
                size_bytes,
            } => {
                use crate::ledger::PartitionMap;
                let map =
                    super::row_map_file::RowMapFile::open(dir, row_map, *size_bytes, &t).await?;
                let mut starts = Vec::with_capacity(rewrite.sources.len());
                let mut start = 0;
                for s in &rewrite.sources {
                    starts.push(start);
                    start += s.physical_rows;
                }
                let starts = &starts;
                let positions: Vec<u64> = changed
                    .iter()
                    .flat_map(|(i, _, added)| added.iter().map(move |o| starts[*i] + o as u64))
                    .collect();
                let placed = map
                    .lookup(&positions)
                    .await
                    .map_err(|e| FormatError::ledger(dir.name(), e))?;
                for (d, off) in placed.into_iter().flatten() {
                    let dest = ids.get(d as usize).ok_or_else(|| {
                        FormatError::corrupt(row_map, format!("names destination {d}"))
                    })?;
                    per_output.entry(*dest).or_default().insert(off);
                }
            }
        }
        for (dest, bits) in per_output {
            let position = ids.iter().position(|i| *i == dest).expect("own output");
            let fragment = Fragment {
                id: dest,
                files: vec![],
                physical_rows: rewrite.outputs[position].written.physical_rows,
                deletion: None,
                row_ids: None,
            };
            let file = dir
                .write_deletions(&fragment, &bits, txn.read_version)
                .await?;
            deletion_files.insert(dest, file);
        }
    }
    Ok(())
}

/// Commits `txn` (read at `read`), rebasing over concurrent commits. Returns the new snapshot.
pub async fn commit(dir: &Arc<TableDir>, read: &Manifest, txn: &Transaction) -> Result<Snapshot> {
    let conflict = |version: u64, reason: String| FormatError::Conflict {
        table: dir.name().to_string(),
        version,
        reason,
    };
    for _ in 0..MAX_PUT_ATTEMPTS {
        let latest_version = dir
            .latest_version()
            .await?
            .ok_or_else(|| FormatError::NotFound(dir.name().to_string()))?;
        let latest = if latest_version == read.version {
            read.clone()
        } else {
            dir.load_manifest(latest_version).await?
        };
        latest.check_writable(dir.name())?;
        if let Some(reason) = rebase_conflict(read, &latest, txn) {
            return Err(conflict(latest.version, reason));
        }
        let mut deletion_files = BTreeMap::new();
        for (id, new) in &txn.deletions {
            let now = latest.fragment(*id).expect("checked by rebase_conflict");
            let before = read.fragment(*id).expect("checked by rebase_conflict");
            let current = dir.read_deletions(now).await?;
            if now.deletion != before.deletion {
                let by_winners = &current - &dir.read_deletions(before).await?;
                if !(&by_winners & new).is_empty() {
                    return Err(conflict(
                        latest.version,
                        format!("rows of fragment {id} were deleted or updated concurrently"),
                    ));
                }
            }
            let merged = &current | new;
            if merged.len() == current.len() {
                continue;
            }
            let file = dir.write_deletions(now, &merged, txn.read_version).await?;
            deletion_files.insert(*id, file);
        }
        carry_deletions(dir, &latest, txn, &mut deletion_files).await?;
        let next = match apply(&latest, txn, &deletion_files, random_tag()) {
            Ok(next) => next,
            // Rebased index changes can collide with a concurrent one (two appends indexing
            // the same fragments): the statement must look at the table again.
            Err(FormatError::InvalidInput(reason))
                if txn.index_change.is_some() && latest.version != txn.read_version =>
            {
                return Err(conflict(latest.version, reason));
            }
            Err(e) => return Err(e),
        };
        if dir.put_manifest(&next).await? {
            return Snapshot::new(dir.clone(), Arc::new(next));
        }
    }
    Err(conflict(read.version, "too many concurrent commits".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::manifest::TableProperties;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn table(stable: bool) -> Manifest {
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let props = TableProperties {
            stable_row_ids: stable,
            ..Default::default()
        };
        Manifest::new_table(&schema, props, "t".into()).unwrap()
    }

    fn append(rows: u64, name: &str) -> NewFragment {
        NewFragment {
            written: WrittenFragment {
                files: vec![DataFile {
                    path: format!("data/{name}.parquet"),
                    columns: vec!["id".into()],
                    size_bytes: 10,
                }],
                physical_rows: rows,
            },
            row_ids: NewRowIds::Fresh,
        }
    }

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
        };
        t2.column_rewrites.insert(0, file.clone());
        let m3 = apply(&m2, &t2, &BTreeMap::new(), "y".into()).unwrap();
        assert_eq!(m3.fragments[0].files, vec![file]);
        assert_eq!(m3.fragments[0].id, 0);
    }

    fn with_index(m: &Manifest) -> Manifest {
        use crate::format::index_meta::{IndexDef, IndexKind, Metric};
        let mut t = Transaction::new(Operation::CreateIndex, m.version);
        t.index_change = Some(IndexChange::Create {
            def: IndexDef {
                name: "i".into(),
                column: "id".into(),
                kind: IndexKind::IvfFlat,
                metric: Metric::L2,
                num_partitions: 1,
                model_file: "_indexes/i/m.model".into(),
                model_size_bytes: 1,
                created_at_version: m.version,
            },
            segments: vec![],
        });
        apply(m, &t, &BTreeMap::new(), "i".into()).unwrap()
    }

    fn segment_over(fragments: &[u64]) -> NewSegment {
        NewSegment {
            file: "_indexes/i/s.seg".into(),
            size_bytes: 1,
            rows: 1,
            fragment_bitmap: fragments.iter().copied().collect(),
        }
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
            },
        );
        let m4 = apply(&m3, &again, &BTreeMap::new(), "w".into()).unwrap();
        assert_eq!(
            m4.index_segments[0].invalidated_fragments,
            BTreeSet::from([0, 1])
        );
    }

    #[test]
    fn two_segments_cannot_own_one_fragment() {
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m = with_index(&apply(&table(false), &t, &BTreeMap::new(), "x".into()).unwrap());
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
        let m2 = apply(&m, &build, &BTreeMap::new(), "y".into()).unwrap();
        let err = apply(&m2, &build, &BTreeMap::new(), "z".into())
            .unwrap_err()
            .to_string();
        assert!(err.contains("owned by two segments"), "{err}");
    }

    #[test]
    fn touching_a_rewritten_or_removed_fragment_conflicts() {
        let m = table(false);
        let mut t = Transaction::new(Operation::Append, 1);
        t.appends = vec![append(4, "a")];
        let m2 = apply(&m, &t, &BTreeMap::new(), "x".into()).unwrap();
        let mut rewrite = Transaction::new(Operation::Update, 2);
        rewrite.column_rewrites.insert(
            0,
            DataFile {
                path: "data/n.parquet".into(),
                columns: vec!["id".into()],
                size_bytes: 1,
            },
        );
        let m3 = apply(&m2, &rewrite, &BTreeMap::new(), "y".into()).unwrap();
        let mut delete = Transaction::new(Operation::Delete, 2);
        delete.deletions.insert(0, [1u32].into_iter().collect());
        assert!(
            rebase_conflict(&m2, &m3, &delete)
                .unwrap()
                .contains("rewritten")
        );
        let mut gone = m3.clone();
        gone.fragments.clear();
        assert!(
            rebase_conflict(&m2, &gone, &delete)
                .unwrap()
                .contains("removed")
        );
        assert!(rebase_conflict(&m2, &m2, &delete).is_none());
    }
}

//! Optimistic commits: a put-if-absent primitive, a pure conflict check, a pure rebase and
//! a bounded retry.
//!
//! ```text
//! statement: read manifest r ─▶ write data, deletion, segment, row-map files
//!                                (fresh names: invisible until a manifest names them)
//!   │
//!   ▼ commit(dir, read = manifest r, txn)                          at most 20 attempts
//!   ├─ latest = newest manifest v (r itself when nobody committed since)
//!   ├─ conflict::check(read, latest, txn) ─────────────── Conflict ─▶ Err (retryable)
//!   ├─ a MERGE: conflict::check_concurrent_merges(the winners' manifests) ─▶ Err (retryable)
//!   ├─ per deleted-from fragment: union with latest's deletion vector;
//!   │    conflict::check_deletions(rows the winners deleted) ─ Conflict ─▶ Err (retryable)
//!   ├─ carry_deletions: rows deleted from a rewrite's sources since it read them
//!   │    are deleted in its outputs too
//!   ├─ rebase::apply(latest, txn) = manifest v+1 (pure; for a rebased index change
//!   │    conflict::check_applied) ─────────────────────── Conflict ─▶ Err (retryable)
//!   └─ put manifest v+1 if absent (PutMode::Create)
//!        ├─ won  ─▶ Ok(snapshot v+1)
//!        └─ lost (another writer took v+1) ─▶ re-read the latest, next attempt
//! 20 lost races in a row ─▶ Err(Conflict::TooManyConcurrentCommits) (retryable)
//! ```
//!
//! The modules: [`transaction`] (what a commit carries, plain data), [`conflict`] (the
//! rules deciding rebase or conflict; pure), [`rebase`] (the next manifest; pure),
//! [`retry`] (the statement loop that re-runs a statement after a retryable conflict).
//! This file is the IO: reading the latest manifest and the deletion vectors, writing merged
//! deletion vectors, and the put.
//!
//! Contract: the caller wrote every file `txn` names before calling [`commit`], and `read`
//! is the manifest of `txn.read_version`. A conflict is reported as
//! [`FormatError::Conflict`] (retryable) carrying the typed [`Conflict`]; nothing is
//! published then. A crash (or an error) before the manifest put leaves only orphan files
//! (VACUUM removes them after its grace period); the table still reads at its last version.
//! Cost per attempt: one manifest read when the table moved (a MERGE: one per winner); per fragment the transaction
//! deletes from, one deletion-vector read (two when a winner changed that vector) and one
//! write when rows were added; the vectors of rewrite sources that winners changed; one
//! conditional put.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use roaring::RoaringBitmap;

use super::error::{FormatError, Result};
use super::manifest::{DeletionFile, Fragment, Manifest, Operation};
use super::store::{Snapshot, TableDir, random_tag};
use crate::ledger::Mapping;

pub mod conflict;
pub mod reason;
pub mod rebase;
pub mod retry;
pub mod transaction;

#[cfg(test)]
mod fixtures;

pub use conflict::Conflict;
pub use rebase::{allocate_ids, apply};
pub use transaction::{
    IndexChange, NewFragment, NewRowIds, NewSegment, Rewrite, RowMapRef, Transaction,
};

/// How many times one commit re-reads the latest version after losing a put race.
const MAX_PUT_ATTEMPTS: usize = 20;

/// Commits `txn` (read at `read`), rebasing over concurrent commits. Returns the new snapshot.
pub async fn commit(dir: &Arc<TableDir>, read: &Manifest, txn: &Transaction) -> Result<Snapshot> {
    let conflict = |version: u64, reason: Conflict| FormatError::Conflict {
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
        conflict::check(read, &latest, txn).map_err(|c| conflict(latest.version, c))?;
        if txn.operation == Operation::Merge && latest.version > read.version {
            let mut winners = Vec::new();
            for v in read.version + 1..latest.version {
                winners.push(dir.load_manifest(v).await?);
            }
            let winners: Vec<&Manifest> = winners.iter().chain([&latest]).collect();
            conflict::check_concurrent_merges(read, &winners, txn)
                .map_err(|c| conflict(latest.version, c))?;
        }
        // Rows a winner deleted must be neither rows we delete nor rows whose values we
        // rewrite in place; our deletions merge into the latest vectors.
        let mut deletion_files = BTreeMap::new();
        let touched: BTreeSet<u64> = txn
            .deletions
            .keys()
            .chain(txn.updated_in_place.keys())
            .copied()
            .collect();
        for id in touched {
            let now = latest.fragment(id).expect("checked by conflict::check");
            let before = read.fragment(id).expect("checked by conflict::check");
            let new = txn.deletions.get(&id);
            let winners_deleted = now.deletion != before.deletion;
            if !winners_deleted && new.is_none() {
                continue;
            }
            let current = dir.read_deletions(now).await?;
            if winners_deleted {
                let by_winners = &current - &dir.read_deletions(before).await?;
                let mut ours = new.cloned().unwrap_or_default();
                if let Some(updated) = txn.updated_in_place.get(&id) {
                    ours |= updated;
                }
                conflict::check_deletions(id, &by_winners, &ours)
                    .map_err(|c| conflict(latest.version, c))?;
            }
            let Some(new) = new else {
                continue;
            };
            let merged = &current | new;
            if merged.len() == current.len() {
                continue;
            }
            let file = dir.write_deletions(now, &merged, txn.read_version).await?;
            deletion_files.insert(id, file);
        }
        carry_deletions(dir, &latest, txn, &mut deletion_files).await?;
        let next =
            rebase::apply(&latest, txn, &deletion_files, random_tag()).map_err(|e| match e {
                rebase::ApplyError::Conflict(c) => conflict(latest.version, c),
                rebase::ApplyError::Invalid(e) => e,
            })?;
        if dir.put_manifest(&next).await? {
            return Snapshot::new(dir.clone(), Arc::new(next));
        }
    }
    Err(conflict(
        read.version,
        Conflict::TooManyConcurrentCommits {
            attempts: MAX_PUT_ATTEMPTS,
        },
    ))
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
                    crate::format::row_map_file::RowMapFile::open(dir, row_map, *size_bytes, &t)
                        .await?;
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

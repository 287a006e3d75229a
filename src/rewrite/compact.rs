//! COMPACT: executing a compaction plan.
//!
//! Each bin reads its sources in logical order with deletions applied and writes the planned
//! output sizes; bins run concurrently. All bins commit in one transaction whose rewrites are
//! spliced at their sources' positions, so the scan order after compaction equals the order
//! before whichever bins finish first. A run reads and writes only its sources.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use futures::{StreamExt, TryStreamExt, stream};

use super::plan::{
    CompactionBin, CompactionOptions, CompactionPlan, FragmentStats, plan_compaction,
};
use super::{Result, live_rows, read_ahead};
use crate::format::commit::Rewrite;
use crate::format::fragment_io::write_sized_fragments;
use crate::format::ledger_io::load_ledger;
use crate::format::progress::{Phase, Progress};
use crate::format::rowids::RowIdSequence;
use crate::format::{
    FormatError, Fragment, NewFragment, NewRowIds, Operation, Snapshot, Transaction, commit,
};
use crate::index::ownership::segment_ownerships;
use crate::ledger::Coverage;

/// Bins rewritten at the same time.
const PARALLEL_BINS: usize = 2;

/// What a compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionMetrics {
    /// Fragments rewritten away.
    pub fragments_removed: u64,
    /// Fragments written in their place.
    pub fragments_added: u64,
    /// Live rows copied.
    pub rows_rewritten: u64,
    /// The version the compaction committed.
    pub version: u64,
}

/// Per fragment, a key equal for fragments that the same index segments own in the same
/// way: a compaction bin never mixes rows two segments answer for differently, so every
/// output stays wholly owned by one segment (or by none).
pub async fn coverage_keys(snapshot: &Snapshot) -> Result<HashMap<u64, u64>> {
    let manifest = &snapshot.manifest;
    let mut parts: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    if !manifest.index_segments.is_empty() {
        let view = load_ledger(&snapshot.dir, manifest).await?;
        for index in &manifest.indexes {
            let owners = segment_ownerships(&snapshot.dir, manifest, &view, &index.name).await?;
            for (segment, ownership) in owners {
                for (fragment, coverage) in ownership.fragments {
                    // A partly owned fragment gets a key of its own: it is compacted alone.
                    let detail = match coverage {
                        Coverage::Whole => 0,
                        Coverage::Rows(_) => fragment + 1,
                    };
                    parts.entry(fragment).or_default().push((segment, detail));
                }
            }
        }
    }
    Ok(manifest
        .fragments
        .iter()
        .map(|f| {
            let key = parts.get(&f.id).map_or(0, |p| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                p.hash(&mut h);
                h.finish() | 1
            });
            (f.id, key)
        })
        .collect())
}

/// Plans a compaction of `snapshot` (no IO but the ledger needed for coverage).
pub async fn plan(snapshot: &Snapshot, options: &CompactionOptions) -> Result<CompactionPlan> {
    let keys = coverage_keys(snapshot).await?;
    let stats: Vec<FragmentStats> = snapshot
        .manifest
        .fragments
        .iter()
        .map(|f| FragmentStats {
            id: f.id,
            physical_rows: f.physical_rows,
            deleted_rows: f.deleted_rows(),
            coverage: keys[&f.id],
        })
        .collect();
    Ok(plan_compaction(&stats, options)?)
}

/// Plans, rewrites and commits one compaction run. A conflicting concurrent commit (a source
/// rewritten in place or removed) fails with a retryable error; concurrent deletions of
/// source rows are carried over by the commit.
pub async fn compact(
    snapshot: &Snapshot,
    options: &CompactionOptions,
    progress: &Progress,
) -> Result<(Snapshot, CompactionMetrics)> {
    let plan = plan(snapshot, options).await?;
    execute(snapshot, &plan.bins, progress).await
}

/// Rewrites `bins` (planned on `snapshot`) and commits them as one transaction. Reports the
/// phase "rewriting fragments" (live rows written, of all bins).
pub async fn execute(
    snapshot: &Snapshot,
    bins: &[CompactionBin],
    progress: &Progress,
) -> Result<(Snapshot, CompactionMetrics)> {
    if bins.is_empty() {
        return Ok((
            snapshot.clone(),
            CompactionMetrics {
                version: snapshot.version(),
                ..Default::default()
            },
        ));
    }
    let rewriting = progress.phase(
        "rewriting fragments",
        Some(bins.iter().map(|b| b.live_rows).sum()),
    );
    let bins: Vec<_> = bins
        .iter()
        .map(|bin| rewrite_bin(snapshot, bin, &rewriting))
        .collect();
    let rewrites: Vec<Rewrite> = stream::iter(bins)
        .buffered(PARALLEL_BINS)
        .try_collect()
        .await?;
    rewriting.finish();
    let mut metrics = CompactionMetrics::default();
    for r in &rewrites {
        metrics.fragments_removed += r.sources.len() as u64;
        metrics.fragments_added += r.outputs.len() as u64;
        metrics.rows_rewritten += r
            .outputs
            .iter()
            .map(|o| o.written.physical_rows)
            .sum::<u64>();
    }
    let mut txn = Transaction::new(Operation::Compact, snapshot.version());
    txn.rewrites = rewrites;
    let next = commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
    metrics.version = next.version();
    Ok((next, metrics))
}

/// Reads one bin's sources in order (deleted rows dropped) and writes its outputs, advancing
/// `phase` by the rows read.
async fn rewrite_bin(snapshot: &Snapshot, bin: &CompactionBin, phase: &Phase) -> Result<Rewrite> {
    let manifest = &snapshot.manifest;
    let dir = &snapshot.dir;
    let sources: Vec<&Fragment> = bin
        .fragments
        .iter()
        .map(|id| {
            manifest
                .fragment(*id)
                .ok_or_else(|| FormatError::invalid(format!("fragment {id} is not in the table")))
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut deletions = Vec::with_capacity(sources.len());
    for f in &sources {
        deletions.push(dir.shared_deletions(f).await?);
    }
    // Surviving row ids, in order, split per output below.
    let mut ids: Vec<u64> = Vec::new();
    if manifest.properties.stable_row_ids {
        for (f, deleted) in sources.iter().zip(&deletions) {
            let seq = f.row_ids.as_ref().ok_or_else(|| {
                FormatError::corrupt(format!("fragment {}", f.id), "lacks row ids")
            })?;
            ids.extend(
                seq.iter()
                    .enumerate()
                    .filter(|(o, _)| !deleted.contains(*o as u32))
                    .map(|(_, id)| id),
            );
        }
    }
    let schema = snapshot.schema.clone();
    let reads = sources
        .iter()
        .zip(&deletions)
        .map(|(f, deleted)| live_rows(snapshot, f, deleted.clone(), snapshot.schema.clone()))
        .collect::<Vec<_>>();
    let phase = phase.clone();
    let rows = read_ahead(reads, 2).inspect(move |batch| {
        if let Ok(b) = batch {
            phase.advance(b.num_rows() as u64);
        }
    });
    let written =
        write_sized_fragments(dir, &schema, rows, bin.output_rows.iter().copied()).await?;
    let sizes: Vec<u64> = written.iter().map(|w| w.physical_rows).collect();
    if sizes != bin.output_rows {
        return Err(FormatError::corrupt(
            format!("fragments {:?}", bin.fragments),
            format!(
                "expected {} live rows, read {}",
                bin.live_rows,
                sizes.iter().sum::<u64>()
            ),
        )
        .into());
    }
    let mut next_id = 0usize;
    let outputs = written
        .into_iter()
        .map(|w| {
            let n = w.physical_rows as usize;
            let row_ids = if manifest.properties.stable_row_ids {
                let seq = RowIdSequence::from_ids(ids[next_id..next_id + n].iter().copied());
                next_id += n;
                NewRowIds::Given(seq)
            } else {
                NewRowIds::Fresh
            };
            NewFragment {
                written: w,
                row_ids,
            }
        })
        .collect();
    let sources: Vec<Fragment> = sources.into_iter().cloned().collect();
    Ok(Rewrite::of(&sources, outputs, None))
}

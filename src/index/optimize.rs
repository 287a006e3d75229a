//! Index maintenance: CREATE VECTOR INDEX, DROP INDEX and OPTIMIZE INDEX (append, merge,
//! retrain) — building segments from a snapshot and committing them.
//!
//! Every build reads one snapshot and commits against it; fragments rewritten in place by a
//! concurrent writer before the commit are recorded as invalidated in the new segment (the
//! format's commit does that), and a concurrent change to the same index fails with a
//! retryable error (the statement runs again, see `format::commit::retry`).
//!
//! A merge is where duplicates would become permanent, so every input row is checked
//! against its segment's ownership and the deletion vectors **before** it is written.
//!
//! Memory: a full build (CREATE VECTOR INDEX, RETRAIN) holds its vectors at once only when
//! they fit its budget ([`BuildOptions::memory_budget_bytes`]) and otherwise streams
//! ([`super::build_stream`]). APPEND and MERGE hold the rows they write at once: the
//! unindexed fragments, and for MERGE the rows of the segments it rewrites.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::build::{self, Vectors};
use super::build_stream::{self, BuildStats, StreamBuild};
use super::cache::{IndexCache, default_budget_bytes};
use super::distance::Metric;
use super::error::{IndexError, Result};
use super::ownership::unowned_fragments;
use crate::format::commit::{IndexChange, NewSegment};
use crate::format::index_meta::{IndexDef, IndexKind, IndexSegment};
use crate::format::progress::Progress;
use crate::format::types::vector_dim;
use crate::format::{self, Operation, Snapshot, Transaction};
use crate::ledger::ids::split_row_address;
use crate::ledger::{Coverage, LedgerView, SegmentOwnership};

/// How to build an index (parsed from `WITH (...)` by the engine).
#[derive(Clone, Debug, PartialEq)]
pub struct BuildOptions {
    /// The distance the index serves.
    pub metric: Metric,
    /// Default: √rows, clamped to [1, 1024].
    pub num_partitions: Option<usize>,
    /// Training sample; default 256 per partition.
    pub sample_size: Option<usize>,
    /// Bytes a full build may hold (the session's `fragvec.index_cache_bytes`); default
    /// [`default_budget_bytes`]. A table whose vectors fit loads them all at once; a larger
    /// one is built in passes ([`super::build_stream`]).
    pub memory_budget_bytes: Option<usize>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            metric: Metric::L2,
            num_partitions: None,
            sample_size: None,
            memory_budget_bytes: None,
        }
    }
}

/// An index built on a snapshot, not yet committed.
#[derive(Debug)]
pub struct BuiltIndex {
    /// The index definition to commit.
    pub def: IndexDef,
    /// The segment written.
    pub segment: NewSegment,
    /// The fragments whose rows the segment read.
    pub covered: BTreeSet<u64>,
    /// What the build did.
    pub stats: BuildStats,
}

/// Bytes an in-memory build of `rows` physical rows of `dim` floats holds at its peak: the
/// vectors with their addresses, and once more as partitions (then as the encoded file,
/// after the vectors are dropped).
fn in_memory_build_bytes(rows: u64, dim: usize) -> u64 {
    rows.saturating_mul(4 * dim as u64 + 8).saturating_mul(2)
}

/// What `OPTIMIZE INDEX` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimize {
    /// Index the fragments no segment owns as a new segment (same centroids).
    Append,
    /// Rewrite the newest n segments plus the unindexed fragments into one.
    Merge(usize),
    /// Train new centroids on the current rows and rebuild.
    Retrain,
}

/// Commits an index transaction (rebased over concurrent commits).
async fn commit(snapshot: &Snapshot, txn: Transaction) -> Result<Snapshot> {
    Ok(format::commit(&snapshot.dir, &snapshot.manifest, &txn).await?)
}

fn index_txn(
    snapshot: &Snapshot,
    op: Operation,
    change: IndexChange,
    covered: &BTreeSet<u64>,
) -> Transaction {
    let mut txn = Transaction::new(op, snapshot.version());
    txn.index_change = Some(change);
    txn.read_fragment_files = snapshot
        .manifest
        .fragments
        .iter()
        .filter(|f| covered.contains(&f.id))
        .map(|f| (f.id, f.files.clone()))
        .collect::<BTreeMap<_, _>>();
    txn
}

/// Commits the replacement of some segments of `index` by `add` (and of its definition, when
/// `def` is given). `covered`: the fragments whose rows the new segment read.
async fn replace_segments(
    snapshot: &Snapshot,
    index: &str,
    remove: Vec<u64>,
    add: NewSegment,
    def: Option<IndexDef>,
    covered: &BTreeSet<u64>,
) -> Result<u64> {
    let rows = add.rows;
    let change = IndexChange::ReplaceSegments {
        index: index.to_string(),
        remove,
        add: vec![add],
        def,
    };
    commit(
        snapshot,
        index_txn(snapshot, Operation::OptimizeIndex, change, covered),
    )
    .await?;
    Ok(rows)
}

/// Builds a whole index (one segment over every fragment) on `snapshot`, uncommitted.
/// Phases: "reading vectors" (rows), "k-means" (iterations), "PQ codebooks", "assigning
/// rows", "writing index files".
///
/// When the vectors fit the build budget ([`BuildOptions::memory_budget_bytes`], estimated
/// from the fragments' physical rows by `in_memory_build_bytes`), they are loaded at once;
/// otherwise the build streams ([`super::build_stream`]). Both make the same model and the
/// same segment bytes (tested).
pub async fn build(
    snapshot: &Snapshot,
    name: &str,
    column: &str,
    kind: IndexKind,
    opts: &BuildOptions,
    progress: &Progress,
) -> Result<BuiltIndex> {
    let field = snapshot
        .schema
        .field_with_name(column)
        .map_err(|_| IndexError::NoSuchColumn {
            column: column.to_string(),
            table: snapshot.name().to_string(),
        })?;
    let Some(dim) = vector_dim(field.data_type()).map(|d| d as usize) else {
        return Err(IndexError::NotAVectorColumn {
            column: column.to_string(),
        });
    };
    let fragments: BTreeSet<u64> = snapshot.manifest.fragments.iter().map(|f| f.id).collect();
    let budget = opts
        .memory_budget_bytes
        .unwrap_or_else(default_budget_bytes);
    let physical = build::physical_rows(snapshot, &fragments);
    if in_memory_build_bytes(physical, dim) > budget as u64 {
        let request = StreamBuild {
            snapshot,
            index: name,
            column,
            dim,
            kind: &kind,
            metric: opts.metric,
            num_partitions: opts.num_partitions,
            sample_size: opts.sample_size,
            budget_bytes: budget,
        };
        let built = build_stream::build(request, &fragments, progress).await?;
        let def = IndexDef {
            name: name.to_string(),
            column: column.to_string(),
            kind,
            metric: opts.metric,
            num_partitions: built.partitions as u32,
            model_file: built.model_file,
            model_size_bytes: built.model_size_bytes,
            created_at_version: snapshot.version(),
        };
        return Ok(BuiltIndex {
            def,
            segment: built.segment,
            covered: fragments,
            stats: built.stats,
        });
    }
    let reading = progress.phase("reading vectors", Some(physical));
    let vectors = build::read_vectors(snapshot, column, &fragments, &reading).await?;
    reading.finish();
    let rows = vectors.addrs.len();
    let partitions = build::partitions_for(rows, opts.num_partitions);
    let sample = build::sample_size_for(partitions, opts.sample_size);
    let model = build::train(
        &vectors,
        dim,
        opts.metric,
        &kind,
        partitions,
        sample,
        progress,
    )
    .map_err(|e| IndexError::Build {
        index: name.to_string(),
        reason: e.to_string(),
    })?;
    let assigning = progress.phase("assigning rows", Some(vectors.addrs.len() as u64));
    let parts = build::partition(&model, &vectors, &assigning);
    assigning.finish();
    let stats = BuildStats {
        streamed: false,
        passes: 1,
        groups: 1,
        spilled_bytes: 0,
        peak_bytes: vectors.addrs.len() * 8
            + vectors.values.len() * 4
            + parts.iter().map(|p| p.bytes()).sum::<usize>(),
    };
    std::mem::drop(vectors);
    let writing = progress.phase("writing index files", Some(2));
    let (model_file, model_size) = build::write_model(&snapshot.dir, name, &model).await?;
    writing.advance(1);
    let segment =
        build::write_partitions(&snapshot.dir, name, &model, parts, fragments.clone()).await?;
    writing.advance(1);
    writing.finish();
    let def = IndexDef {
        name: name.to_string(),
        column: column.to_string(),
        kind,
        metric: opts.metric,
        num_partitions: partitions as u32,
        model_file,
        model_size_bytes: model_size,
        created_at_version: snapshot.version(),
    };
    Ok(BuiltIndex {
        def,
        segment,
        covered: fragments,
        stats,
    })
}

/// Creates index `name` on `column` (one segment over every fragment). Returns the rows
/// indexed.
pub async fn create(
    snapshot: &Snapshot,
    name: &str,
    column: &str,
    kind: IndexKind,
    opts: &BuildOptions,
    progress: &Progress,
) -> Result<u64> {
    if snapshot.manifest.index(name).is_some() {
        return Err(IndexError::AlreadyExists {
            index: name.to_string(),
            table: snapshot.name().to_string(),
        });
    }
    let BuiltIndex {
        def,
        segment,
        covered,
        ..
    } = build(snapshot, name, column, kind, opts, progress).await?;
    let rows = segment.rows;
    let txn = index_txn(
        snapshot,
        Operation::CreateIndex,
        IndexChange::Create {
            def,
            segments: vec![segment],
        },
        &covered,
    );
    commit(snapshot, txn).await?;
    Ok(rows)
}

/// Drops index `name`; with `if_exists`, a missing index is not an error.
pub async fn drop(snapshot: &Snapshot, name: &str, if_exists: bool) -> Result<()> {
    if snapshot.manifest.index(name).is_none() {
        if if_exists {
            return Ok(());
        }
        return Err(not_found(snapshot, name));
    }
    let mut txn = Transaction::new(Operation::DropIndex, snapshot.version());
    txn.index_change = Some(IndexChange::Drop {
        name: name.to_string(),
    });
    commit(snapshot, txn).await?;
    Ok(())
}

fn not_found(snapshot: &Snapshot, name: &str) -> IndexError {
    IndexError::NotFound {
        index: name.to_string(),
        table: snapshot.name().to_string(),
        existing: snapshot
            .manifest
            .indexes
            .iter()
            .map(|i| i.name.clone())
            .collect(),
    }
}

/// The ledger and each segment of `index` with its ownership in current fragment ids.
pub async fn ownerships(
    snapshot: &Snapshot,
    index: &str,
    cache: &IndexCache,
) -> Result<(Arc<LedgerView>, Arc<BTreeMap<u64, SegmentOwnership>>)> {
    let view = cache.ledger(&snapshot.dir, &snapshot.manifest).await?;
    let owners = cache
        .ownerships(&snapshot.dir, &snapshot.manifest, &view, index)
        .await?;
    Ok((view, owners))
}

/// Runs `OPTIMIZE INDEX name ... action`; returns the rows written into new segments.
/// `memory_budget_bytes` bounds a RETRAIN as [`BuildOptions::memory_budget_bytes`] does.
pub async fn optimize(
    snapshot: Snapshot,
    name: &str,
    action: Optimize,
    cache: &IndexCache,
    memory_budget_bytes: Option<usize>,
    progress: &Progress,
) -> Result<u64> {
    let Some(def) = snapshot.manifest.index(name).cloned() else {
        return Err(not_found(&snapshot, name));
    };
    match action {
        Optimize::Retrain => {
            let opts = BuildOptions {
                metric: def.metric,
                num_partitions: Some(def.num_partitions as usize),
                sample_size: None,
                memory_budget_bytes,
            };
            let BuiltIndex {
                def: new_def,
                segment,
                covered,
                ..
            } = build(
                &snapshot,
                name,
                &def.column,
                def.kind.clone(),
                &opts,
                progress,
            )
            .await?;
            let remove = snapshot.manifest.segments_of(name).map(|s| s.id).collect();
            let new_def = IndexDef {
                created_at_version: def.created_at_version,
                ..new_def
            };
            replace_segments(&snapshot, name, remove, segment, Some(new_def), &covered).await
        }
        Optimize::Append => {
            let (_, owners) = ownerships(&snapshot, name, cache).await?;
            let fresh = unowned_fragments(&snapshot.manifest, &owners);
            if fresh.is_empty() {
                return Ok(0);
            }
            let model = cache.model(&snapshot.dir, &def).await?;
            let reading = progress.phase(
                "reading vectors",
                Some(build::physical_rows(&snapshot, &fresh)),
            );
            let vectors = build::read_vectors(&snapshot, &def.column, &fresh, &reading).await?;
            reading.finish();
            let assigning = progress.phase("assigning rows", Some(vectors.addrs.len() as u64));
            let parts = build::partition(&model, &vectors, &assigning);
            assigning.finish();
            let writing = progress.phase("writing index files", Some(1));
            let segment =
                build::write_partitions(&snapshot.dir, name, &model, parts, fresh.clone()).await?;
            writing.advance(1);
            writing.finish();
            replace_segments(&snapshot, name, vec![], segment, None, &fresh).await
        }
        Optimize::Merge(n) => merge(snapshot, &def, n, cache, progress).await,
    }
}

/// Rewrites the newest `n` segments and the unindexed fragments into one segment, dropping
/// every row an input may no longer answer for **before** writing it: rows of fragments the
/// input does not own (invalidated) or that left the table, and deleted rows.
pub async fn merge(
    snapshot: Snapshot,
    def: &IndexDef,
    n: usize,
    cache: &IndexCache,
    progress: &Progress,
) -> Result<u64> {
    let manifest = &snapshot.manifest;
    let dir = &snapshot.dir;
    let all: Vec<_> = manifest.segments_of(&def.name).collect();
    let model = cache.model(dir, def).await?;
    let mut deletions = HashMap::new();
    for f in manifest.fragments.iter().filter(|f| f.deletion.is_some()) {
        deletions.insert(f.id, dir.read_deletions(f).await?);
    }
    let pq = model.coded();
    let (view, owners) = ownerships(&snapshot, &def.name, cache).await?;
    // A fragment some input owns only in part (a stable partition mixed its rows with other
    // segments' or unindexed rows) becomes wholly owned by the merged segment, which takes
    // the fragment's other rows from the table. That needs every segment owning part of it
    // in the merge; an input for which that fails is left out and keeps query-time
    // translation.
    let mut inputs: Vec<_> = all[all.len().saturating_sub(n)..].to_vec();
    loop {
        let chosen: HashSet<u64> = inputs.iter().map(|s| s.id).collect();
        let blocked = |segment: &&IndexSegment| {
            owners[&segment.id].fragments.iter().any(|(f, c)| {
                matches!(c, Coverage::Rows(_))
                    && owners
                        .iter()
                        .any(|(other, o)| !chosen.contains(other) && o.owns_fragment(*f))
            })
        };
        let before = inputs.len();
        inputs.retain(|s| !blocked(s));
        if inputs.len() == before {
            break;
        }
    }
    if inputs.is_empty() {
        return Ok(0);
    }
    let mut kept = build::Vectors::default();
    let mut kept_codes: Vec<(u64, usize, Vec<u8>)> = Vec::new();
    let mut live_frags = BTreeSet::new();
    // Rows of partly owned fragments the inputs hold; the rest are read from the table.
    let mut partial: HashMap<u64, roaring::RoaringBitmap> = HashMap::new();
    let mut footers = Vec::with_capacity(inputs.len());
    for segment in &inputs {
        footers.push(cache.segment_footer(dir, segment, &model).await?);
    }
    let reading_segments = progress.phase(
        "reading segments",
        Some(footers.iter().map(|f| f.partitions.len() as u64).sum()),
    );
    for (segment, footer) in inputs.iter().zip(&footers) {
        let ownership = &owners[&segment.id];
        for (f, c) in &ownership.fragments {
            live_frags.insert(*f);
            if let Coverage::Rows(rows) = c {
                *partial.entry(*f).or_default() |= rows;
            }
        }
        for p in 0..footer.partitions.len() {
            reading_segments.advance(1);
            let part = cache.partition(dir, &segment.file, footer, p, pq).await?;
            // Rows moved by rewrites get their current address: the merged file needs no
            // translation (this is where the ledger's translations are materialized).
            let moved = view
                .translate(&part.addrs)
                .await
                .map_err(|e| IndexError::ledger(dir.name(), e))?;
            for (i, new) in moved.into_iter().enumerate() {
                let Some(addr) = new.filter(|a| ownership.covers(*a)) else {
                    continue;
                };
                let (frag, offset) = split_row_address(addr);
                if deletions
                    .get(&frag)
                    .is_some_and(|d: &roaring::RoaringBitmap| d.contains(offset as u32))
                {
                    continue;
                }
                if pq {
                    let w = part.codes.len() / part.addrs.len().max(1);
                    kept_codes.push((addr, p, part.codes[i * w..(i + 1) * w].to_vec()));
                } else {
                    kept.addrs.push(addr);
                    kept.values
                        .extend_from_slice(&part.vectors[i * model.dim..(i + 1) * model.dim]);
                }
            }
        }
    }
    reading_segments.finish();
    let fresh = unowned_fragments(&snapshot.manifest, &owners);
    let partial_ids: BTreeSet<u64> = partial.keys().copied().collect();
    let reading = progress.phase(
        "reading vectors",
        Some(
            build::physical_rows(&snapshot, &fresh) + build::physical_rows(&snapshot, &partial_ids),
        ),
    );
    let mut new_vectors = build::read_vectors(&snapshot, &def.column, &fresh, &reading).await?;
    let rest = build::read_vectors(&snapshot, &def.column, &partial_ids, &reading).await?;
    reading.finish();
    for (i, addr) in rest.addrs.iter().enumerate() {
        let (f, o) = split_row_address(*addr);
        if partial[&f].contains(o as u32) {
            continue;
        }
        new_vectors.addrs.push(*addr);
        new_vectors
            .values
            .extend_from_slice(&rest.values[i * model.dim..(i + 1) * model.dim]);
    }
    let mut bitmap: BTreeSet<u64> = live_frags.clone();
    let covered: BTreeSet<u64> = live_frags.union(&fresh).copied().collect();
    bitmap.extend(fresh.iter().copied());
    let all_inputs = inputs.len() == all.len();
    let assigning = progress.phase(
        "assigning rows",
        Some((kept.addrs.len() + new_vectors.addrs.len()) as u64),
    );
    let mut partitions = build::partition(
        &model,
        &Vectors {
            addrs: kept.addrs,
            values: kept.values,
        },
        &assigning,
    );
    for (p, fresh_part) in build::partition(&model, &new_vectors, &assigning)
        .into_iter()
        .enumerate()
    {
        partitions[p].addrs.extend(fresh_part.addrs);
        partitions[p].vectors.extend(fresh_part.vectors);
        partitions[p].codes.extend(fresh_part.codes);
    }
    for (addr, p, codes) in kept_codes {
        partitions[p].addrs.push(addr);
        partitions[p].codes.extend(codes);
    }
    // When the merge rewrites every segment, partitions that outgrew their share can be split:
    // no other segment still uses the old centroids.
    assigning.finish();
    let mut model = (*model).clone();
    let mut new_def = None;
    let mut writing = None;
    if all_inputs && !model.coded() {
        let split = super::ivf::split_oversized(&mut model, &mut partitions, build::SEED);
        if !split.is_empty() {
            let phase = writing.insert(progress.phase("writing index files", Some(2)));
            let (model_file, model_size_bytes) = build::write_model(dir, &def.name, &model).await?;
            phase.advance(1);
            new_def = Some(IndexDef {
                num_partitions: model.partitions() as u32,
                model_file,
                model_size_bytes,
                ..def.clone()
            });
        }
    }
    let writing = writing.unwrap_or_else(|| progress.phase("writing index files", Some(1)));
    let segment =
        build::write_partitions(dir, &def.name, &model, partitions, bitmap.clone()).await?;
    writing.advance(1);
    writing.finish();
    // Fragments of the provenance still in the table whose rows the merged file does not hold
    // (their rows were stale, or another segment owns them) are not in `covered`, so the
    // commit records them as invalidated in the new segment.
    let remove = inputs.iter().map(|s| s.id).collect();
    replace_segments(&snapshot, &def.name, remove, segment, new_def, &covered).await
}

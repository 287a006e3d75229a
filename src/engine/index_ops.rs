//! CREATE VECTOR INDEX, DROP INDEX and OPTIMIZE INDEX: build segments and commit them.
//!
//! Every build reads one snapshot and commits against it; fragments rewritten in place by a
//! concurrent writer before the commit are recorded as invalidated in the new segment (the
//! format's commit does that), and a concurrent change to the same index makes the statement
//! retry.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};

use crate::format::commit::{IndexChange, NewSegment};
use crate::format::index_meta::{IndexDef, IndexKind};
use crate::format::{self, FormatError, Operation, Snapshot, Transaction};
use crate::index::build::{self, Vectors};
use crate::index::distance::Metric;
use crate::index::segment::PartitionCache;
use crate::ledger::ids::split_row_address;
use crate::ledger::{Coverage, LedgerView, SegmentOwnership};
use crate::sql::OptimizeAction;

use super::types::vector_dim;

fn plan_err<T>(msg: impl Into<String>) -> Result<T> {
    Err(DataFusionError::Plan(msg.into()))
}

/// Options of `CREATE VECTOR INDEX ... WITH (...)`.
struct BuildOptions {
    metric: Metric,
    num_partitions: Option<usize>,
    sample_size: Option<usize>,
    num_sub_vectors: Option<u32>,
}

fn build_options(kind: &str, options: &[(String, String)]) -> Result<BuildOptions> {
    let mut o = BuildOptions {
        metric: Metric::L2,
        num_partitions: None,
        sample_size: None,
        num_sub_vectors: None,
    };
    let number = |k: &str, v: &str| -> Result<usize> {
        v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
            DataFusionError::Plan(format!("{k} must be a positive integer, not '{v}'"))
        })
    };
    for (key, value) in options {
        match key.as_str() {
            "metric" => {
                o.metric = Metric::parse(value).ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "metric must be 'l2', 'cosine' or 'dot', not '{value}'"
                    ))
                })?
            }
            "num_partitions" => o.num_partitions = Some(number(key, value)?),
            "sample_size" => o.sample_size = Some(number(key, value)?),
            "num_sub_vectors" if kind == "IVF_PQ" => {
                o.num_sub_vectors = Some(number(key, value)? as u32)
            }
            other => {
                return plan_err(format!(
                    "unknown option '{other}' for {kind} (known: metric, num_partitions, sample_size{})",
                    if kind == "IVF_PQ" {
                        ", num_sub_vectors"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    Ok(o)
}

/// Commits an index transaction (rebased over concurrent commits; a conflicting one fails
/// with a retryable error, and the session runs the statement again).
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

/// Builds a whole index (one segment over every fragment) on `snapshot`. Returns the new
/// definition and segment, uncommitted.
async fn build_full(
    snapshot: &Snapshot,
    name: &str,
    column: &str,
    kind: IndexKind,
    opts: &BuildOptions,
) -> Result<(IndexDef, NewSegment, BTreeSet<u64>)> {
    let field = snapshot.schema.field_with_name(column).map_err(|_| {
        DataFusionError::Plan(format!(
            "column '{column}' does not exist in table '{}'",
            snapshot.name()
        ))
    })?;
    let Some(dim) = vector_dim(field.data_type()) else {
        return plan_err(format!(
            "column '{column}' is not a vector column (VECTOR(n))"
        ));
    };
    let fragments: BTreeSet<u64> = snapshot.manifest.fragments.iter().map(|f| f.id).collect();
    let vectors = build::read_vectors(snapshot, column, &fragments).await?;
    let rows = vectors.addrs.len();
    let partitions = opts
        .num_partitions
        .unwrap_or_else(|| ((rows as f64).sqrt() as usize).clamp(1, 1024));
    let sample = opts.sample_size.unwrap_or(256 * partitions).max(partitions);
    let model = build::train(
        &vectors,
        dim as usize,
        opts.metric,
        &kind,
        partitions,
        sample,
    )
    .map_err(|e| DataFusionError::Plan(format!("cannot build index '{name}': {e}")))?;
    let (model_file, model_size) = build::write_model(&snapshot.dir, name, &model).await?;
    let segment =
        build::write_segment(&snapshot.dir, name, &model, &vectors, fragments.clone()).await?;
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
    Ok((def, segment, fragments))
}

pub async fn create(
    snapshot: Snapshot,
    name: &str,
    column: &str,
    kind: &str,
    options: &[(String, String)],
) -> Result<u64> {
    if snapshot.manifest.index(name).is_some() {
        return plan_err(format!(
            "index '{name}' already exists on table '{}'",
            snapshot.name()
        ));
    }
    let opts = build_options(kind, options)?;
    let kind = match kind {
        "IVF_FLAT" => IndexKind::IvfFlat,
        "IVF_PQ" => IndexKind::IvfPq {
            num_sub_vectors: opts.num_sub_vectors.ok_or_else(|| {
                DataFusionError::Plan("IVF_PQ needs WITH (num_sub_vectors = m)".into())
            })?,
        },
        other => {
            return plan_err(format!(
                "unknown index type {other} (use IVF_FLAT or IVF_PQ)"
            ));
        }
    };
    let (def, segment, covered) = build_full(&snapshot, name, column, kind, &opts).await?;
    let rows = segment.rows;
    let txn = index_txn(
        &snapshot,
        Operation::CreateIndex,
        IndexChange::Create {
            def,
            segments: vec![segment],
        },
        &covered,
    );
    commit(&snapshot, txn).await?;
    Ok(rows)
}

pub async fn drop(snapshot: Snapshot, name: &str, if_exists: bool) -> Result<u64> {
    if snapshot.manifest.index(name).is_none() {
        if if_exists {
            return Ok(0);
        }
        return plan_err(format!(
            "index '{name}' does not exist on table '{}'",
            snapshot.name()
        ));
    }
    let mut txn = Transaction::new(Operation::DropIndex, snapshot.version());
    txn.index_change = Some(IndexChange::Drop {
        name: name.to_string(),
    });
    commit(&snapshot, txn).await?;
    Ok(0)
}

/// Each segment of `index` with its ownership in current fragment ids (after rewrites).
pub async fn ownerships(
    snapshot: &Snapshot,
    index: &str,
    cache: &PartitionCache,
) -> Result<(Arc<LedgerView>, Arc<BTreeMap<u64, SegmentOwnership>>)> {
    let view = cache.ledger(&snapshot.dir, &snapshot.manifest).await?;
    let owners = cache
        .ownerships(&snapshot.dir, &snapshot.manifest, &view, index)
        .await?;
    Ok((view, owners))
}

/// Fragments of the table that no segment of `index` owns any row of.
pub fn unowned_fragments(
    snapshot: &Snapshot,
    owners: &BTreeMap<u64, SegmentOwnership>,
) -> BTreeSet<u64> {
    snapshot
        .manifest
        .fragments
        .iter()
        .map(|f| f.id)
        .filter(|f| !owners.values().any(|o| o.owns_fragment(*f)))
        .collect()
}

/// Returns the number of rows written into new segments.
pub async fn optimize(
    snapshot: Snapshot,
    name: &str,
    action: OptimizeAction,
    cache: &PartitionCache,
) -> Result<u64> {
    let Some(def) = snapshot.manifest.index(name).cloned() else {
        return plan_err(format!(
            "index '{name}' does not exist on table '{}'",
            snapshot.name()
        ));
    };
    match action {
        OptimizeAction::Retrain => {
            let opts = BuildOptions {
                metric: def.metric,
                num_partitions: Some(def.num_partitions as usize),
                sample_size: None,
                num_sub_vectors: None,
            };
            let (new_def, segment, covered) =
                build_full(&snapshot, name, &def.column, def.kind.clone(), &opts).await?;
            let remove = snapshot.manifest.segments_of(name).map(|s| s.id).collect();
            let new_def = IndexDef {
                created_at_version: def.created_at_version,
                ..new_def
            };
            replace_segments(&snapshot, name, remove, segment, Some(new_def), &covered).await
        }
        OptimizeAction::Append => {
            let (_, owners) = ownerships(&snapshot, name, cache).await?;
            let fresh = unowned_fragments(&snapshot, &owners);
            if fresh.is_empty() {
                return Ok(0);
            }
            let model = cache.model(&snapshot.dir, &def).await?;
            let vectors = build::read_vectors(&snapshot, &def.column, &fresh).await?;
            let segment =
                build::write_segment(&snapshot.dir, name, &model, &vectors, fresh.clone()).await?;
            replace_segments(&snapshot, name, vec![], segment, None, &fresh).await
        }
        OptimizeAction::Merge(n) => merge(snapshot, &def, n, cache).await,
    }
}

/// Rewrites the newest `n` segments and the unindexed fragments into one segment, dropping
/// every row an input may no longer answer for **before** writing it: rows of fragments the
/// input does not own (invalidated) or that left the table, and deleted rows.
async fn merge(
    snapshot: Snapshot,
    def: &IndexDef,
    n: usize,
    cache: &PartitionCache,
) -> Result<u64> {
    let manifest = &snapshot.manifest;
    let dir = &snapshot.dir;
    let all: Vec<_> = manifest.segments_of(&def.name).collect();
    let model = cache.model(dir, def).await?;
    let mut deletions = HashMap::new();
    for f in manifest.fragments.iter().filter(|f| f.deletion.is_some()) {
        deletions.insert(f.id, dir.read_deletions(f).await?);
    }
    let pq = model.pq.is_some();
    let (view, owners) = ownerships(&snapshot, &def.name, cache).await?;
    // A fragment some input owns only in part (a stable partition mixed its rows with other
    // segments' or unindexed rows) becomes wholly owned by the merged segment, which takes
    // the fragment's other rows from the table. That needs every segment owning part of it
    // in the merge; an input for which that fails is left out and keeps query-time
    // translation.
    let mut inputs: Vec<_> = all[all.len().saturating_sub(n)..].to_vec();
    loop {
        let chosen: HashSet<u64> = inputs.iter().map(|s| s.id).collect();
        let blocked = |segment: &&crate::format::index_meta::IndexSegment| {
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
    for segment in &inputs {
        let ownership = &owners[&segment.id];
        for (f, c) in &ownership.fragments {
            live_frags.insert(*f);
            if let Coverage::Rows(rows) = c {
                *partial.entry(*f).or_default() |= rows;
            }
        }
        let footer = cache.segment_footer(dir, segment, &model).await?;
        for p in 0..footer.partitions.len() {
            let part = cache.partition(dir, &segment.file, &footer, p, pq).await?;
            // Rows moved by rewrites get their current address: the merged file needs no
            // translation (this is where the ledger's translations are materialized).
            let moved = view
                .translate(&part.addrs)
                .await
                .map_err(|e| FormatError::ledger(dir.name(), e))?;
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
    let fresh = unowned_fragments(&snapshot, &owners);
    let mut new_vectors = build::read_vectors(&snapshot, &def.column, &fresh).await?;
    let partial_ids: BTreeSet<u64> = partial.keys().copied().collect();
    let rest = build::read_vectors(&snapshot, &def.column, &partial_ids).await?;
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
    let mut partitions = build::partition(
        &model,
        &Vectors {
            addrs: kept.addrs,
            values: kept.values,
        },
    );
    for (p, fresh_part) in build::partition(&model, &new_vectors)
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
    let mut model = (*model).clone();
    let mut new_def = None;
    if all_inputs && model.pq.is_none() {
        let split = crate::index::ivf::split_oversized(&mut model, &mut partitions, build::SEED);
        if !split.is_empty() {
            let (model_file, model_size_bytes) = build::write_model(dir, &def.name, &model).await?;
            new_def = Some(IndexDef {
                num_partitions: model.partitions() as u32,
                model_file,
                model_size_bytes,
                ..def.clone()
            });
        }
    }
    let segment =
        build::write_partitions(dir, &def.name, &model, partitions, bitmap.clone()).await?;
    // Fragments of the provenance still in the table whose rows the merged file does not hold
    // (their rows were stale, or another segment owns them) are not in `covered`, so the
    // commit records them as invalidated in the new segment.
    let remove = inputs.iter().map(|s| s.id).collect();
    replace_segments(&snapshot, &def.name, remove, segment, new_def, &covered).await
}

/// The latest snapshot of a table, or "table does not exist".
pub async fn latest(db: &format::Database, table: &str) -> Result<Snapshot> {
    let dir = Arc::new(db.table(table)?);
    match dir.latest().await {
        Ok(s) => Ok(s),
        Err(FormatError::NotFound(t)) => plan_err(format!("table '{t}' does not exist")),
        Err(e) => Err(e.into()),
    }
}

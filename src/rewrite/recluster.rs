//! RECLUSTER: a stable partition of the sources' rows into destinations ordered by a key.
//!
//! Pass one evaluates the key expressions over the sources' live rows (reading only the
//! columns they use), picks destination boundaries at key quantiles and labels every row
//! with its destination. Pass two reads the rows again in the same scan order and appends
//! each to its destination, so inside a destination rows keep their source order. The labels
//! also go into a row-map file, which the reuse ledger's `StablePartition` transition
//! references: index segments keep working through it without a rebuild.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::{RowConverter, SortField};
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use roaring::RoaringBitmap;

use super::partition::{boundaries, destination};
use super::{Result, RewriteError, live_rows, read_ahead};

/// Fragments decoded ahead of the one being consumed.
const READ_AHEAD: usize = 2;
use crate::format::commit::{Rewrite, RowMapRef};
use crate::format::fragment_io::write_partitioned;
use crate::format::progress::Progress;
use crate::format::rowids::RowIdSequence;
use crate::format::store::random_tag;
use crate::format::{
    FormatError, Fragment, NewFragment, NewRowIds, Operation, Snapshot, Transaction, commit,
};
use crate::ledger::row_map::{DEFAULT_BLOCK_ROWS, MAX_DESTINATIONS, RowMapWriter, SourceRows};

/// Evaluated columns of the rows a recluster reads: the key, or the `WHERE` filter (one
/// boolean column). The engine implements it with DataFusion expressions; this layer only
/// sees the evaluated arrays.
pub trait RowColumns: std::fmt::Debug + Send + Sync {
    /// The columns the evaluation reads (table columns, and `_rowaddr` if named): the rows
    /// are read with this schema.
    fn input_schema(&self) -> SchemaRef;
    /// The evaluated columns of one batch of rows (one array per key part, same length).
    fn evaluate(
        &self,
        batch: &RecordBatch,
    ) -> std::result::Result<Vec<ArrayRef>, Box<dyn std::error::Error + Send + Sync>>;
}

/// A compiled RECLUSTER statement.
#[derive(Debug, Clone)]
pub struct ReclusterSpec {
    /// The key, evaluated per batch of live rows.
    pub keys: Arc<dyn RowColumns>,
    /// `WHERE p`: only fragments holding a live row that satisfies it are rewritten.
    pub filter: Option<Arc<dyn RowColumns>>,
    /// Number of destinations, or `None` for live rows / `target_rows_per_fragment`.
    pub destinations: Option<usize>,
    /// Rows per destination fragment when `destinations` is `None`.
    pub target_rows_per_fragment: u64,
}

/// What a recluster did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclusterMetrics {
    /// Fragments rewritten away.
    pub fragments_removed: u64,
    /// Fragments the rows went to.
    pub destinations: u64,
    /// Live rows moved.
    pub rows_rewritten: u64,
    /// Bytes of the row map recording where each row went.
    pub row_map_bytes: u64,
    /// The version the recluster committed.
    pub version: u64,
}

fn eval(columns: &dyn RowColumns, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    columns
        .evaluate(batch)
        .map_err(|source| RewriteError::KeyEvaluation { source })
}

/// The fragments RECLUSTER rewrites: all, or those with a live row passing the filter
/// (phase "selecting fragments", fragments examined).
async fn sources(
    snapshot: &Snapshot,
    spec: &ReclusterSpec,
    progress: &Progress,
) -> Result<Vec<Fragment>> {
    let Some(filter) = &spec.filter else {
        return Ok(snapshot.manifest.fragments.clone());
    };
    let selecting = progress.phase(
        "selecting fragments",
        Some(snapshot.manifest.fragments.len() as u64),
    );
    let mut out = Vec::new();
    for f in &snapshot.manifest.fragments {
        selecting.advance(1);
        let deleted = snapshot.dir.shared_deletions(f).await?;
        let mut rows = live_rows(snapshot, f, deleted, filter.input_schema());
        let mut hit = false;
        while let Some(batch) = rows.next().await {
            let mask = eval(filter.as_ref(), &batch?)?;
            let mask = mask
                .first()
                .and_then(|m| datafusion::arrow::array::AsArray::as_boolean_opt(m.as_ref()))
                .ok_or(RewriteError::FilterNotBoolean)?;
            if mask.true_count() > 0 {
                hit = true;
                break;
            }
        }
        if hit {
            out.push(f.clone());
        }
    }
    Ok(out)
}

/// Plans, rewrites and commits one recluster. Concurrent deletions of source rows are
/// carried over to the destinations through the row map; an in-place rewrite or removal of
/// a source is a retryable conflict. Phases: "selecting fragments" (with a filter),
/// "evaluating keys" and "writing destinations" (live rows).
pub async fn recluster(
    snapshot: &Snapshot,
    spec: &ReclusterSpec,
    progress: &Progress,
) -> Result<(Snapshot, ReclusterMetrics)> {
    let sources = sources(snapshot, spec, progress).await?;
    let unchanged = ReclusterMetrics {
        version: snapshot.version(),
        ..Default::default()
    };
    if sources.is_empty() {
        return Ok((snapshot.clone(), unchanged));
    }
    let mut deletions = Vec::with_capacity(sources.len());
    for f in &sources {
        deletions.push(snapshot.dir.shared_deletions(f).await?);
    }
    let live: u64 = sources.iter().map(Fragment::live_rows).sum();
    // Pass one: keys of the live rows, in scan order.
    let evaluating = progress.phase("evaluating keys", Some(live));
    let mut key_columns: Vec<Vec<ArrayRef>> = Vec::new();
    let reads: Vec<_> = sources
        .iter()
        .zip(&deletions)
        .map(|(f, d)| live_rows(snapshot, f, d.clone(), spec.keys.input_schema()))
        .collect();
    let mut rows = read_ahead(reads, READ_AHEAD);
    while let Some(batch) = rows.next().await {
        let batch = batch?;
        key_columns.push(eval(spec.keys.as_ref(), &batch)?);
        evaluating.advance(batch.num_rows() as u64);
    }
    evaluating.finish();
    let fields: Vec<SortField> = match key_columns.first() {
        Some(cols) => cols
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect(),
        None => vec![],
    };
    let labels: Vec<u16>;
    let m: usize;
    if live == 0 {
        labels = vec![];
        m = 0;
    } else {
        let converter = RowConverter::new(fields)?;
        let mut rows = converter.empty_rows(live as usize, 64);
        for cols in &key_columns {
            converter.append(&mut rows, cols)?;
        }
        let keys: Vec<_> = rows.iter().collect();
        let wanted = spec
            .destinations
            .unwrap_or_else(|| live.div_ceil(spec.target_rows_per_fragment.max(1)) as usize)
            .clamp(1, MAX_DESTINATIONS);
        let cuts = boundaries(&keys, wanted);
        m = cuts.len() + 1;
        labels = keys.iter().map(|k| destination(&cuts, k) as u16).collect();
    }
    drop(key_columns);

    // Pass two: every column, routed by label.
    let reads: Vec<_> = sources
        .iter()
        .zip(&deletions)
        .map(|(f, d)| live_rows(snapshot, f, d.clone(), snapshot.schema.clone()))
        .collect();
    let writing = progress.phase("writing destinations", Some(live));
    let written = if m == 0 {
        vec![]
    } else {
        let advancing = writing.clone();
        let rows = read_ahead(reads, READ_AHEAD).inspect(move |batch| {
            if let Ok(b) = batch {
                advancing.advance(b.num_rows() as u64);
            }
        });
        write_partitioned(&snapshot.dir, &snapshot.schema, rows, &labels, m).await?
    };
    writing.finish();
    let mut ids_of: Vec<Vec<u64>> = vec![Vec::new(); m];
    if snapshot.manifest.properties.stable_row_ids {
        let mut i = 0;
        for (f, deleted) in sources.iter().zip(&deletions) {
            let seq = f.row_ids.as_ref().ok_or_else(|| {
                FormatError::corrupt(format!("fragment {}", f.id), "lacks row ids")
            })?;
            for (o, id) in seq.iter().enumerate() {
                if !deleted.contains(o as u32) {
                    ids_of[labels[i] as usize].push(id);
                    i += 1;
                }
            }
        }
    }

    // The row map: one label per physical source row.
    let source_rows: Vec<SourceRows> = sources
        .iter()
        .zip(&deletions)
        .map(|(f, d): (&Fragment, &Arc<RoaringBitmap>)| SourceRows {
            physical_rows: f.physical_rows,
            deleted: d.iter().collect(),
        })
        .collect();
    let expected: Vec<u64> = written.iter().map(|w| w.physical_rows).collect();
    let mut writer = RowMapWriter::new(&source_rows, m, DEFAULT_BLOCK_ROWS)
        .map_err(|e| FormatError::invalid(format!("row map: {e}")))?;
    writer
        .push_all(&labels)
        .map_err(|e| FormatError::invalid(format!("row map: {e}")))?;
    let bytes = writer
        .finish(&expected)
        .map_err(|e| FormatError::invalid(format!("row map: {e}")))?;
    let row_map_bytes = bytes.len() as u64;
    let relative = format!("_rowmaps/{}.rmap", random_tag());
    let path = snapshot.dir.path(&relative);
    snapshot
        .dir
        .store()
        .put(&path, PutPayload::from(bytes))
        .await
        .map_err(|e| FormatError::store(&path, e))?;

    let outputs: Vec<NewFragment> = written
        .into_iter()
        .zip(ids_of)
        .map(|(w, ids)| NewFragment {
            row_ids: if snapshot.manifest.properties.stable_row_ids {
                NewRowIds::Given(RowIdSequence::from_ids(ids))
            } else {
                NewRowIds::Fresh
            },
            written: w,
        })
        .collect();
    let rewrite = Rewrite::of(
        &sources,
        outputs,
        Some(RowMapRef {
            path: relative,
            size_bytes: row_map_bytes,
        }),
    );
    let metrics = ReclusterMetrics {
        fragments_removed: sources.len() as u64,
        destinations: m as u64,
        rows_rewritten: live,
        row_map_bytes,
        version: 0,
    };
    let mut txn = Transaction::new(Operation::Recluster, snapshot.version());
    txn.rewrites = vec![rewrite];
    let next = commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
    Ok((
        next.clone(),
        ReclusterMetrics {
            version: next.version(),
            ..metrics
        },
    ))
}

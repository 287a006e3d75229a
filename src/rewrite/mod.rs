//! Rewrites that keep indexes: compaction (order-preserving) and recluster (a stable
//! partition). Planning is pure ([`plan`]); execution reads the sources in logical order,
//! writes the outputs, and commits one transaction whose rewrites are spliced in place of
//! their sources and recorded in the reuse ledger, so index segments are translated rather
//! than rebuilt.

pub mod clustering;
pub mod compact;
pub mod partition;
pub mod plan;
pub mod recluster;
pub mod zorder;

use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use futures::StreamExt;
use futures::stream::BoxStream;
use roaring::RoaringBitmap;

use crate::format::{FormatError, Fragment, Snapshot, read_fragment};

const READ_BATCH_ROWS: usize = 8192;

/// Errors of a rewrite.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The compaction planner refused its input.
    #[error("cannot plan compaction: {0}")]
    Plan(#[from] plan::PlanError),
    /// Reading or committing the table failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Translating or writing an index segment failed.
    #[error(transparent)]
    Index(#[from] crate::index::IndexError),
    /// The RECLUSTER key (or filter) could not be evaluated over the rows.
    #[error("cannot evaluate the RECLUSTER key: {source}")]
    KeyEvaluation {
        /// The error the key's or filter's evaluation
        /// ([`recluster::RowColumns::evaluate`]) returned.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The RECLUSTER filter is not a boolean expression.
    #[error("RECLUSTER ... WHERE needs a boolean")]
    FilterNotBoolean,
}

impl From<datafusion::arrow::error::ArrowError> for RewriteError {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        RewriteError::Format(FormatError::Arrow(e))
    }
}

impl RewriteError {
    /// Whether running the rewrite again may succeed (it lost a race to a concurrent commit).
    pub fn is_retryable(&self) -> bool {
        match self {
            RewriteError::Format(e) => e.is_retryable(),
            RewriteError::Index(e) => e.is_retryable(),
            RewriteError::Plan(_)
            | RewriteError::KeyEvaluation { .. }
            | RewriteError::FilterNotBoolean => false,
        }
    }
}

/// A rewrite's result.
pub type Result<T> = std::result::Result<T, RewriteError>;

/// The live rows of one fragment (columns of `schema`), in offset order. A `_rowaddr` field
/// in `schema` is filled with the rows' addresses.
pub fn live_rows(
    snapshot: &Snapshot,
    fragment: &Fragment,
    deleted: Arc<RoaringBitmap>,
    schema: SchemaRef,
) -> BoxStream<'static, crate::format::Result<RecordBatch>> {
    use crate::format::manifest::ROW_ADDR;
    let addr_at = schema.index_of(ROW_ADDR).ok();
    let stored = match addr_at {
        None => schema.clone(),
        Some(_) => Arc::new(datafusion::arrow::datatypes::Schema::new(
            schema
                .fields()
                .iter()
                .filter(|f| f.name() != ROW_ADDR)
                .cloned()
                .collect::<Vec<_>>(),
        )),
    };
    let id = fragment.id;
    let mut offset = 0u32;
    read_fragment(snapshot.dir.clone(), fragment, stored, READ_BATCH_ROWS)
        .map(move |batch| {
            let batch = batch?;
            let n = batch.num_rows() as u32;
            let start = offset;
            offset += n;
            let batch = match addr_at {
                None => batch,
                Some(at) => {
                    let addrs = datafusion::arrow::array::UInt64Array::from_iter_values(
                        (start..start + n).map(|o| crate::ledger::ids::row_address(id, o as u64)),
                    );
                    let mut columns = batch.columns().to_vec();
                    columns.insert(at, Arc::new(addrs));
                    RecordBatch::try_new(schema.clone(), columns)?
                }
            };
            if deleted.range_cardinality(start..start + n) == 0 {
                return Ok(batch);
            }
            let keep: BooleanArray = (start..start + n)
                .map(|o| Some(!deleted.contains(o)))
                .collect();
            Ok(filter_record_batch(&batch, &keep)?)
        })
        .boxed()
}

/// Concatenates per-fragment streams in order while decoding up to `ahead` fragments ahead
/// on other tasks, so reading overlaps with what consumes the rows (writing, key evaluation).
/// Each fragment's reader runs ahead by at most a few batches (a bounded channel), so memory
/// stays bounded whatever the fragment size.
pub(crate) fn read_ahead(
    streams: Vec<BoxStream<'static, crate::format::Result<RecordBatch>>>,
    ahead: usize,
) -> BoxStream<'static, crate::format::Result<RecordBatch>> {
    const BATCHES_AHEAD: usize = 4;
    futures::stream::iter(streams.into_iter().map(|mut s| {
        let (tx, rx) = tokio::sync::mpsc::channel(BATCHES_AHEAD);
        tokio::spawn(async move {
            while let Some(batch) = s.next().await {
                let failed = batch.is_err();
                if tx.send(batch).await.is_err() || failed {
                    break;
                }
            }
        });
        async move { tokio_stream_of(rx) }
    }))
    .buffered(ahead.max(1))
    .flatten()
    .boxed()
}

fn tokio_stream_of<T: Send + 'static>(rx: tokio::sync::mpsc::Receiver<T>) -> BoxStream<'static, T> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) }).boxed()
}

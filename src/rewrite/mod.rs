//! Rewrites that keep indexes: compaction (order-preserving) and recluster (a stable
//! partition). Planning is pure ([`plan`]); execution reads the sources in logical order,
//! writes the outputs, and commits one transaction whose rewrites are spliced in place of
//! their sources and recorded in the reuse ledger, so index segments are translated rather
//! than rebuilt.

pub mod compact;
pub mod partition;
pub mod plan;
pub mod recluster;

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
    #[error("cannot plan compaction: {0}")]
    Plan(#[from] plan::PlanError),
    #[error(transparent)]
    Format(#[from] FormatError),
}

impl From<datafusion::arrow::error::ArrowError> for RewriteError {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        RewriteError::Format(FormatError::Arrow(e))
    }
}

impl RewriteError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, RewriteError::Format(e) if e.is_retryable())
    }
}

impl From<RewriteError> for datafusion::error::DataFusionError {
    fn from(e: RewriteError) -> Self {
        match e {
            RewriteError::Format(f) => f.into(),
            other => datafusion::error::DataFusionError::Plan(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, RewriteError>;

/// The live rows of one fragment (columns of `schema`), in offset order.
pub(crate) fn live_rows(
    snapshot: &Snapshot,
    fragment: &Fragment,
    deleted: Arc<RoaringBitmap>,
    schema: SchemaRef,
) -> BoxStream<'static, crate::format::Result<RecordBatch>> {
    let mut offset = 0u32;
    read_fragment(snapshot.dir.clone(), fragment, schema, READ_BATCH_ROWS)
        .map(move |batch| {
            let batch = batch?;
            let n = batch.num_rows() as u32;
            let start = offset;
            offset += n;
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

//! `InsertExec`: appends the rows of its input as new fragments and commits them.
//!
//! All work happens when the plan is executed, never while it is planned, so `EXPLAIN INSERT`
//! writes nothing. Each input partition is written by its own task; the fragments land in
//! partition order, after every fragment committed before them.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::format::conform::conform_batch;
use crate::format::progress::{Phase, Progress};
use crate::format::{self, NewFragment, NewRowIds, Operation, Snapshot, Transaction};

/// Schema of every DML result: one row, one `count` column.
pub fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

/// The one-row `count` result of a statement that wrote `count` rows.
pub fn count_batch(count: u64) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        count_schema(),
        vec![Arc::new(UInt64Array::from(vec![count]))],
    )?)
}

/// Writes `streams` (one per input partition, in order) as fragments of `snapshot`'s table,
/// advancing `phase` by the rows written (the total is not known in advance).
pub async fn write_streams(
    snapshot: &Snapshot,
    streams: Vec<SendableRecordBatchStream>,
    phase: &Phase,
) -> Result<Vec<format::WrittenFragment>> {
    let schema = snapshot.schema.clone();
    let max_rows = snapshot.manifest.properties.max_rows_per_fragment;
    let tasks: Vec<SpawnedTask<Result<Vec<format::WrittenFragment>>>> = streams
        .into_iter()
        .map(|stream| {
            let dir = snapshot.dir.clone();
            let schema = schema.clone();
            let phase = phase.clone();
            SpawnedTask::spawn(async move {
                // A failing source query ends the write with its error, as input the write
                // cannot take; rows that do not fit the table are refused by the format.
                let conformed = stream.map(|b| match b {
                    Ok(b) => {
                        phase.advance(b.num_rows() as u64);
                        conform_batch(&b, &schema)
                    }
                    Err(e) => Err(format::FormatError::InvalidInput(e.to_string())),
                });
                let written =
                    format::write_fragments(&dir, &schema, Box::pin(conformed), max_rows).await?;
                Ok(written)
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let written = task
            .join()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))??;
        all.extend(written);
    }
    Ok(all)
}

/// Writes `streams` as new fragments and commits them as one append (rebased over concurrent
/// commits). Returns the number of rows appended. Reports the phase "writing rows".
pub async fn append_streams(
    snapshot: &Snapshot,
    streams: Vec<SendableRecordBatchStream>,
    progress: &Progress,
) -> Result<u64> {
    let writing = progress.phase("writing rows", None);
    let written = write_streams(snapshot, streams, &writing).await?;
    writing.finish();
    let rows = written.iter().map(|w| w.physical_rows).sum();
    if !written.is_empty() {
        let mut txn = Transaction::new(Operation::Append, snapshot.version());
        txn.appends = written
            .into_iter()
            .map(|w| NewFragment {
                written: w,
                row_ids: NewRowIds::Fresh,
            })
            .collect();
        format::commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
    }
    Ok(rows)
}

/// Appends its input's rows to a table as one commit; answers with their count.
#[derive(Debug)]
pub struct InsertExec {
    snapshot: Snapshot,
    input: Arc<dyn ExecutionPlan>,
    cache: Arc<PlanProperties>,
}

impl InsertExec {
    /// An insert of `input`'s rows into the table of `snapshot` (rebased over commits since).
    pub fn new(snapshot: Snapshot, input: Arc<dyn ExecutionPlan>) -> Self {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            snapshot,
            input,
            cache,
        }
    }
}

impl DisplayAs for InsertExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "InsertExec: table={}, read_version={}",
            self.snapshot.name(),
            self.snapshot.version()
        )
    }
}

impl ExecutionPlan for InsertExec {
    fn name(&self) -> &str {
        "InsertExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| internal_datafusion_err!("InsertExec needs one child"))?;
        Ok(Arc::new(InsertExec::new(self.snapshot.clone(), input)))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("InsertExec: no partition {partition}");
        }
        let streams = (0..self.input.output_partitioning().partition_count())
            .map(|p| self.input.execute(p, context.clone()))
            .collect::<Result<Vec<_>>>()?;
        let snapshot = self.snapshot.clone();
        let progress = super::options::progress_of(context.session_config());
        let work = async move { count_batch(append_streams(&snapshot, streams, &progress).await?) };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            futures::stream::once(work),
        )))
    }
}

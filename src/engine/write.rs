//! `InsertExec`: appends the rows of its input as new fragments and commits them.
//!
//! All work happens when the plan is executed, never while it is planned, so `EXPLAIN INSERT`
//! writes nothing. Each input partition is written by its own task; the fragments land in
//! partition order, after every fragment committed before them.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{
    DataFusionError, Result, exec_datafusion_err, exec_err, internal_datafusion_err, internal_err,
    plan_err,
};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::format::{self, NewFragment, NewRowIds, Operation, Snapshot, Transaction};

/// Schema of every DML result: one row, one `count` column.
pub fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

pub fn count_batch(count: u64) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        count_schema(),
        vec![Arc::new(UInt64Array::from(vec![count]))],
    )?)
}

/// Conforms a batch to the table schema: same column types, nullability enforced.
pub fn conform_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.num_columns() != schema.fields().len() {
        return plan_err!(
            "expected {} columns, got {}",
            schema.fields().len(),
            batch.num_columns()
        );
    }
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return exec_err!(
                "column '{}' is NOT NULL but the statement gives it a NULL value",
                field.name()
            );
        }
        let column = if column.data_type() == field.data_type() {
            column.clone()
        } else {
            // `safe: false`: a value that does not fit is an error, never a silent NULL.
            let options = datafusion::arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            datafusion::arrow::compute::cast_with_options(column, field.data_type(), &options)
                .map_err(|e| {
                    exec_datafusion_err!(
                        "cannot store a {} value in column '{}' of type {}: {e}",
                        column.data_type(),
                        field.name(),
                        crate::engine::types::display_type(field.data_type())
                    )
                })?
        };
        if crate::engine::types::vector_dim(field.data_type()).is_some()
            && let Some(row) = row_with_null_element(&column)
        {
            return exec_err!(
                "column '{}': the vector in row {} of the statement holds a NULL element; a \
                 vector must have a value in every element (a NULL vector is allowed)",
                field.name(),
                row + 1
            );
        }
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The first non-NULL vector of a `FixedSizeList` column with a NULL element, if any.
fn row_with_null_element(column: &ArrayRef) -> Option<usize> {
    let list = column.as_fixed_size_list_opt()?;
    let nulls = list.values().nulls().filter(|n| n.null_count() > 0)?;
    let n = list.value_length() as usize;
    (0..list.len()).find(|&i| list.is_valid(i) && nulls.slice(i * n, n).null_count() > 0)
}

/// Writes `streams` (one per input partition, in order) as fragments of `snapshot`'s table.
pub async fn write_streams(
    snapshot: &Snapshot,
    streams: Vec<SendableRecordBatchStream>,
) -> Result<Vec<format::WrittenFragment>> {
    let schema = snapshot.schema.clone();
    let max_rows = snapshot.manifest.properties.max_rows_per_fragment;
    let tasks: Vec<SpawnedTask<Result<Vec<format::WrittenFragment>>>> = streams
        .into_iter()
        .map(|stream| {
            let dir = snapshot.dir.clone();
            let schema = schema.clone();
            SpawnedTask::spawn(async move {
                let conformed = stream
                    .map(|b| conform_batch(&b?, &schema))
                    .map_err(|e| format::FormatError::InvalidInput(e.to_string()));
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
/// commits). Returns the number of rows appended.
pub async fn append_streams(
    snapshot: &Snapshot,
    streams: Vec<SendableRecordBatchStream>,
) -> Result<u64> {
    let written = write_streams(snapshot, streams).await?;
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

#[derive(Debug)]
pub struct InsertExec {
    snapshot: Snapshot,
    input: Arc<dyn ExecutionPlan>,
    cache: Arc<PlanProperties>,
}

impl InsertExec {
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
        let work = async move { count_batch(append_streams(&snapshot, streams).await?) };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            futures::stream::once(work),
        )))
    }
}

//! `OnWorkersExec`: the root of a query that runs on workers; names them in its errors.
//!
//! A worker that dies mid-query surfaces as a transport error ("h2 protocol error: ...
//! broken pipe"); wrapped, the message says it was a query on workers and which ones. One
//! input, passed through unchanged (same partitions, order and batches).

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use futures::StreamExt;

#[derive(Debug)]
pub struct OnWorkersExec {
    input: Arc<dyn ExecutionPlan>,
    /// The workers, for error messages.
    workers: String,
}

impl OnWorkersExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, workers: String) -> Self {
        Self { input, workers }
    }
}

impl DisplayAs for OnWorkersExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OnWorkersExec: workers=[{}]", self.workers)
    }
}

impl ExecutionPlan for OnWorkersExec {
    fn name(&self) -> &str {
        "OnWorkersExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
            .ok_or_else(|| internal_datafusion_err!("OnWorkersExec needs one child"))?;
        Ok(Arc::new(Self::new(input, self.workers.clone())))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let context_of = |e| {
            DataFusionError::Context(
                format!("a query on workers {} failed", self.workers),
                Box::new(e),
            )
        };
        let stream = self.input.execute(partition, context).map_err(context_of)?;
        let workers = self.workers.clone();
        let mapped = stream.map(move |batch| {
            batch.map_err(|e| {
                DataFusionError::Context(
                    format!("a query on workers {workers} failed"),
                    Box::new(e),
                )
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            mapped,
        )))
    }
}

//! The sort of a re-bound KNN plan: orders the at most `k` rows a [`KnnExec`] found by the
//! query's distance expression, in place of the kept plan's top-k `SortExec`.
//!
//! Re-binding a kept plan to a new vector used to build a new `SortExec` over the new
//! `KnnExec`: `SortExec::new` derives its equivalence properties from the sort expression
//! (twice, walking the distance expression's tree), and at run time its `TopK` sets up a row
//! converter, a heap and a dynamic filter to keep 10 rows of the 10 it is given. Together
//! that was 12% of `fragvec serve`'s CPU at 4 connections (perf, docs/benchmarks.md). The
//! `KnnExec` under it returns only its `k` nearest rows, so ordering them is one small
//! sort: this node evaluates the same sort expressions on them and sorts with
//! DataFusion's own [`sort_batch`], keeping the `SortExec`'s fetch. Its properties are the
//! kept `SortExec`'s: the same schema, one partition, the same ordering (its expressions
//! differ only in the vector parameter's value, see [`super::VectorParam`]).
//!
//! It is only built by [`super::rebind`], for a sort whose input is a `KnnExec` (through a
//! `CooperativeExec`) asked for no more rows than the sort keeps, so its input is bounded
//! by `k` rows; the kept plan, itself a re-bound copy, holds one too and is re-bound the
//! same way. EXPLAIN never shows it: an explained statement is planned afresh.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::compute::concat_batches;
use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::sorts::sort::sort_batch;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream, apply_expression_roots,
};
use futures::TryStreamExt;

/// Orders a KNN search's few rows by the sort expressions, keeping the first `fetch`.
#[derive(Debug)]
pub struct KnnOrderExec {
    expr: LexOrdering,
    fetch: Option<usize>,
    input: Arc<dyn ExecutionPlan>,
    /// The kept `SortExec`'s properties (see the module comment).
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl KnnOrderExec {
    /// Orders `input`'s rows by `expr`, keeping `fetch`; `props` are those of the sort this
    /// node stands for.
    pub fn new(
        expr: LexOrdering,
        fetch: Option<usize>,
        input: Arc<dyn ExecutionPlan>,
        props: Arc<PlanProperties>,
    ) -> Self {
        Self {
            expr,
            fetch,
            input,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The sort expressions.
    pub fn expr(&self) -> &LexOrdering {
        &self.expr
    }

    /// The number of rows kept, if limited.
    pub fn fetch(&self) -> Option<usize> {
        self.fetch
    }
}

impl DisplayAs for KnnOrderExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let fetch = self.fetch.map_or("all".to_string(), |n| n.to_string());
        write!(f, "KnnOrderExec: fetch={fetch}, expr=[{}]", self.expr)
    }
}

impl ExecutionPlan for KnnOrderExec {
    fn name(&self) -> &str {
        "KnnOrderExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.expr.iter().map(|e| &e.expr), f)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [_] = children.as_slice() else {
            return datafusion::common::internal_err!("KnnOrderExec has one child");
        };
        Ok(Arc::new(Self::new(
            self.expr.clone(),
            self.fetch,
            children.swap_remove(0),
            self.props.clone(),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(datafusion::physical_plan::ChildrenPropertiesMode::Keep),
        )
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return datafusion::common::internal_err!(
                "KnnOrderExec has one partition, asked for {partition}"
            );
        }
        let input = self.input.execute(0, context)?;
        let schema = self.input.schema();
        let expr = self.expr.clone();
        let fetch = self.fetch;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let sorted = async move {
            let batches: Vec<_> = input.try_collect().await?;
            let _timer = baseline.elapsed_compute().timer();
            let all = concat_batches(&schema, &batches)?;
            let out = sort_batch(&all, &expr, fetch)?;
            baseline.record_output(out.num_rows());
            Ok(out)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            futures::stream::once(sorted),
        )))
    }
}

//! Table functions whose result is one batch computed when the query runs (not when it is
//! planned: that keeps EXPLAIN cheap and the data current). Shared by the introspection
//! functions and `recluster_information`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::common::Result;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

/// A table function's result: one batch, computed when the query runs (not when it is
/// planned: that keeps EXPLAIN cheap and the data current).
#[async_trait]
pub(crate) trait ComputedBatch: std::fmt::Debug + Send + Sync + 'static {
    fn schema(&self) -> SchemaRef;
    async fn compute(&self) -> Result<RecordBatch>;
}

/// The table provider of a [`ComputedBatch`].
#[derive(Debug)]
pub(crate) struct ComputedTable<T>(pub T);

#[async_trait]
impl<T: ComputedBatch> TableProvider for ComputedTable<T> {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let batch = self.0.compute().await?;
        MemTable::try_new(self.0.schema(), vec![vec![batch]])?
            .scan(state, projection, filters, limit)
            .await
    }
}

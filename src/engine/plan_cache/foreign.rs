//! Nodes of a kept plan that a planner above the engine made (the distributed layer's query
//! root, stage boundaries and per-task leaves): the plan cache reaches the KNN operator and
//! the expressions through them, and has them rebuilt fresh for each run, without naming them.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{Result, internal_err};
use datafusion::physical_plan::ExecutionPlan;

/// What a foreign node holds below it.
pub enum ForeignInputs {
    /// One input whose rows it passes on (a stage boundary, the root of a query on workers).
    Through(Arc<dyn ExecutionPlan>),
    /// One input that is sent elsewhere to run (a stage the workers run): its vectors are
    /// re-bound as plain list literals, which travel (a kept plan's parameters do not).
    Shipped(Arc<dyn ExecutionPlan>),
    /// The same operator in several variants (one per task), the operator as planned first.
    Variants(Vec<Arc<dyn ExecutionPlan>>),
}

/// The foreign nodes a session's plans may hold.
pub trait ForeignNodes: fmt::Debug + Send + Sync {
    /// The inputs of `node` when it is one of these nodes.
    fn inputs(&self, node: &Arc<dyn ExecutionPlan>) -> Option<ForeignInputs>;

    /// `node` again over `inputs` (rebuilt from what [`Self::inputs`] gave, in its order),
    /// holding nothing of an earlier run.
    fn rebuild(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>>;
}

/// A session whose plans are all the engine's own.
#[derive(Debug)]
pub struct NoForeignNodes;

impl ForeignNodes for NoForeignNodes {
    fn inputs(&self, _node: &Arc<dyn ExecutionPlan>) -> Option<ForeignInputs> {
        None
    }

    fn rebuild(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        _inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        internal_err!("{} is not a foreign node", node.name())
    }
}

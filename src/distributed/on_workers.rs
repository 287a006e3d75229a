//! `OnWorkersExec`: the root of a query that runs on workers: retries it once when a worker
//! cannot be reached, and names the workers in its errors.
//!
//! A worker that dies mid-query surfaces as a transport error ("h2 protocol error: ...
//! broken pipe"). When that happens before the query has returned any row, the coordinator
//! connects to each worker, marks those that do not answer down (left out of new queries
//! until a connection to them opens again, tried every
//! [`RETRY_DOWN_EVERY`](super::health::RETRY_DOWN_EVERY)), and runs the query once more: datafusion-
//! distributed places its tasks again, over the workers left (each task's share moves, the
//! split is unchanged). If no worker was found down, or the second run fails too, or rows
//! had already been returned, the query fails with a message that says it was a query on
//! workers, which ones were found unreachable, and the transport error. One input, passed
//! through unchanged (same partitions, order and batches).

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result, internal_datafusion_err};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SessionState, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use datafusion_distributed::{NetworkBoundaryExt, Stage};
use futures::StreamExt;
use uuid::Uuid;

use super::health::WorkerHealth;

/// Runs a distributed plan on the workers, once more on the reachable ones when a worker
/// cannot be reached (see the module docs).
#[derive(Debug)]
pub struct OnWorkersExec {
    input: Arc<dyn ExecutionPlan>,
    health: Arc<WorkerHealth>,
    /// How to plan the query again for a second run (`None`: the same plan is run again,
    /// under a new query id).
    replan: Option<Arc<Replan>>,
}

/// What planning a query again takes: the distributed planner, the logical plan and the
/// session state it was planned in.
pub struct Replan {
    /// The distributed query planner.
    pub planner: Arc<dyn QueryPlanner + Send + Sync>,
    /// The query's logical plan.
    pub logical: LogicalPlan,
    /// The session state it was planned in.
    pub state: SessionState,
}

impl fmt::Debug for Replan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replan").finish_non_exhaustive()
    }
}

impl OnWorkersExec {
    /// Runs `input` (a distributed plan), retrying once as `replan` says, marking workers
    /// that cannot be reached in `health`.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        health: Arc<WorkerHealth>,
        replan: Option<Arc<Replan>>,
    ) -> Self {
        Self {
            input,
            health,
            replan,
        }
    }

    /// The same root over `input`, a copy of its plan for another run (which, were a worker
    /// lost, runs again under a new query id: it cannot be planned again, see
    /// [`super::kept_plans`]).
    pub fn over(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(input, self.health.clone(), None)
    }

    fn workers(&self) -> String {
        names(&self.health.up())
    }
}

fn names(urls: &[url::Url]) -> String {
    urls.iter()
        .map(|u| u.as_str().trim_end_matches('/'))
        .collect::<Vec<_>>()
        .join(", ")
}

impl DisplayAs for OnWorkersExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OnWorkersExec: workers=[{}]", self.workers())
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
        Ok(Arc::new(Self::new(
            input,
            self.health.clone(),
            self.replan.clone(),
        )))
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
        let mut input = self.input.clone();
        let health = self.health.clone();
        let replan = self.replan.clone();
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.input.schema(), 1);
        let tx = builder.tx();
        builder.spawn(async move {
            // Workers found unreachable before the query was run again.
            let mut retried: Option<Vec<url::Url>> = None;
            loop {
                let up = health.up();
                let workers = names(&up);
                let failed = |e: DataFusionError, dead: &[url::Url], again: bool| {
                    let found = match (dead.is_empty(), again) {
                        (true, _) => String::new(),
                        (false, true) => {
                            format!(" (run again after {} could not be reached)", names(dead))
                        }
                        (false, false) => format!(" ({} could not be reached)", names(dead)),
                    };
                    DataFusionError::Context(
                        format!("a query on workers {workers} failed{found}"),
                        Box::new(e),
                    )
                };
                let mut stream = match input.execute(partition, context.clone()) {
                    Ok(stream) => stream,
                    Err(e) => {
                        let dead = retried.clone().unwrap_or_default();
                        let _ = tx.send(Err(failed(e, &dead, retried.is_some()))).await;
                        return Ok(());
                    }
                };
                let mut returned_rows = false;
                let mut error = None;
                while let Some(batch) = stream.next().await {
                    match batch {
                        Ok(batch) => {
                            returned_rows |= batch.num_rows() > 0;
                            if tx.send(Ok(batch)).await.is_err() {
                                return Ok(()); // the consumer is gone
                            }
                        }
                        Err(e) => {
                            error = Some(e);
                            break;
                        }
                    }
                }
                let Some(e) = error else {
                    return Ok(());
                };
                drop(stream);
                if retried.is_none() && !returned_rows {
                    let dead = health.mark_unreachable().await;
                    if !dead.is_empty() && dead.len() < up.len() {
                        if let Some(replan) = &replan {
                            match replan
                                .planner
                                .create_physical_plan(&replan.logical, &replan.state)
                                .await
                            {
                                Ok(plan) => input = plan,
                                Err(e) => {
                                    let _ = tx.send(Err(failed(e, &dead, true))).await;
                                    return Ok(());
                                }
                            }
                        } else {
                            // The same plan again, its tasks on the workers left.
                            match new_query(input.clone()) {
                                Ok(plan) => input = plan,
                                Err(e) => {
                                    let _ = tx.send(Err(failed(e, &dead, true))).await;
                                    return Ok(());
                                }
                            }
                        }
                        retried = Some(dead);
                        continue;
                    }
                    let _ = tx.send(Err(failed(e, &dead, false))).await;
                    return Ok(());
                }
                let dead = retried.clone().unwrap_or_default();
                let _ = tx.send(Err(failed(e, &dead, retried.is_some()))).await;
                return Ok(());
            }
        });
        Ok(builder.build())
    }
}

/// `plan` with every stage under one new query id and fresh connections to its tasks (the
/// stage numbers, task counts and plans unchanged).
pub fn new_query(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let id = Uuid::from_u128(rand::random::<u128>());
    plan.transform_down(|node| {
        let Some(boundary) = node.as_network_boundary() else {
            return Ok(Transformed::no(node));
        };
        let mut stage = boundary.input_stage().clone();
        match &mut stage {
            Stage::Local(local) => {
                local.query_id = id;
                local.metrics_set = Default::default();
            }
            Stage::Remote(_) => {
                return datafusion::common::internal_err!("a stage already sent to its workers");
            }
        }
        let fresh: Arc<dyn ExecutionPlan> = boundary.with_input_stage(stage)?;
        Ok(Transformed::yes(fresh))
    })
    .map(|t| t.data)
}

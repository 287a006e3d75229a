//! Sorts over one fragvec leaf become per-task sorts merged on the coordinator.
//!
//! DataFusion sorts a single-partition input with one `SortExec` (for `ORDER BY ... LIMIT k`,
//! its top-k): a query like `SELECT ... FROM t ORDER BY l2_distance(emb, q) LIMIT k`, whose
//! `KnnExec` has one partition, would run whole on the coordinator. Rewritten as
//! `SortPreservingMergeExec(fetch = k)` over `SortExec(fetch = k, per partition)`, the sort
//! and its leaf form a stage of several tasks: each task returns the local top-k of its
//! share (its segments and unowned fragments, or its run of fragments), and the
//! coordinator's merge keeps the first k. The rewritten plan is still a correct
//! single-machine plan (a merge of one sorted partition).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::engine::knn::KnnExec;
use crate::engine::scan::FragmentScanExec;

/// `plan` with every sort of a single partition read from one fragvec leaf split into
/// per-partition sorts and a merge.
pub fn merge_sorts_over_fragvec(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        let Some(sort) = node.downcast_ref::<SortExec>() else {
            return Ok(Transformed::no(node));
        };
        if sort.preserve_partitioning()
            || sort.input().output_partitioning().partition_count() != 1
            || !reads_one_fragvec_leaf(sort.input())
        {
            return Ok(Transformed::no(node));
        }
        let local = SortExec::new(sort.expr().clone(), sort.input().clone())
            .with_fetch(sort.fetch())
            .with_preserve_partitioning(true);
        let merged = SortPreservingMergeExec::new(sort.expr().clone(), Arc::new(local))
            .with_fetch(sort.fetch());
        Ok(Transformed::new(
            Arc::new(merged) as Arc<dyn ExecutionPlan>,
            true,
            TreeNodeRecursion::Jump,
        ))
    })
    .map(|t| t.data)
}

/// Whether `plan` is a chain of row-wise nodes (projections, filters, cooperative yields)
/// ending in a fragvec scan or KNN search: only then is sorting each task's rows and merging
/// the same as sorting them all. A node that looks at several rows at once — a nested sort or
/// top-k (`SELECT .. FROM (SELECT .. ORDER BY d LIMIT k) ORDER BY id`), a limit, an aggregate,
/// a window — must see every task's rows, so the sort above it is left whole (the nested
/// sort itself is split when the rewrite reaches it).
fn reads_one_fragvec_leaf(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut node = plan;
    loop {
        if node.is::<FragmentScanExec>() || node.is::<KnnExec>() {
            return true;
        }
        let row_wise = node.fetch().is_none()
            && (node.is::<ProjectionExec>()
                || node.is::<FilterExec>()
                || node.is::<CooperativeExec>());
        match node.children().as_slice() {
            [child] if row_wise => node = child,
            _ => return false,
        }
    }
}

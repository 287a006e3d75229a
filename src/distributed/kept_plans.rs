//! Kept plans of repeated KNN queries on workers: the plan cache
//! ([`crate::engine::plan_cache`]) reaches the KNN operator through the nodes
//! datafusion-distributed puts around it, and a re-bound plan runs under a query id of its
//! own.
//!
//! A distributed KNN plan is `OnWorkersExec → DistributedExec → ... → NetworkCoalesceExec →`
//! (the stage the workers run) `... → DistributedLeafExec` (the search as planned and one
//! variant per task, each with its share). Re-binding it for the next query vector rebuilds
//! every node, each variant's search with the new vector (the stages' vectors as plain
//! literals, which datafusion-proto encodes), then gives the stages a new query
//! id: a worker names a query's tasks by that id, and two runs under one id at once mix up
//! their tasks (tried: the workers' repartitions panic). The split and the
//! routing are unchanged: the same shares go to the same workers from one run to the next
//! (see [`super::routing`]), which is what lets each worker cache its own share.
//!
//! Only coalescing boundaries are walked: a plan with a shuffle or a broadcast (a join, an
//! aggregate) is not a KNN plan the cache keeps.

use std::sync::Arc;

use datafusion::common::{Result, internal_err};
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use datafusion_distributed::{DistributedExec, DistributedLeafExec, NetworkCoalesceExec};

use super::on_workers::{OnWorkersExec, new_query};
use crate::engine::plan_cache::{ForeignInputs, ForeignNodes};

/// The nodes of datafusion-distributed (and fragvec's root of a query on workers) a kept
/// KNN plan holds.
#[derive(Debug)]
pub struct DistributedNodes;

impl ForeignNodes for DistributedNodes {
    fn inputs(&self, node: &Arc<dyn ExecutionPlan>) -> Option<ForeignInputs> {
        let shipped = node.is::<NetworkCoalesceExec>();
        if shipped || node.is::<OnWorkersExec>() || node.is::<DistributedExec>() {
            // A boundary whose stage was sent already has no child: not a plan to keep.
            let [input] = node.children()[..] else {
                return None;
            };
            return Some(if shipped {
                ForeignInputs::Shipped(input.clone())
            } else {
                ForeignInputs::Through(input.clone())
            });
        }
        let leaf = node.downcast_ref::<DistributedLeafExec>()?;
        let mut variants = Vec::with_capacity(leaf.variants().len() + 1);
        variants.push(leaf.original().clone());
        variants.extend(leaf.variants().iter().cloned());
        Some(ForeignInputs::Variants(variants))
    }

    fn rebuild(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        mut inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(leaf) = node.downcast_ref::<DistributedLeafExec>() {
            if inputs.len() != leaf.variants().len() + 1 {
                return internal_err!("a distributed leaf rebuilt from other variants");
            }
            let original = inputs.remove(0);
            return Ok(Arc::new(DistributedLeafExec::try_new(original, inputs)?));
        }
        let [input] = <[_; 1]>::try_from(inputs)
            .map_err(|_| datafusion::common::internal_datafusion_err!("one input expected"))?;
        if let Some(root) = node.downcast_ref::<OnWorkersExec>() {
            return Ok(Arc::new(root.over(input)));
        }
        if node.is::<DistributedExec>() {
            // A fresh DistributedExec (no prepared stages), over stages of a new query.
            return node
                .clone()
                .replace_children(vec![new_query(input)?], keep_properties());
        }
        if node.is::<NetworkCoalesceExec>() {
            return node
                .clone()
                .replace_children(vec![input], keep_properties());
        }
        internal_err!("{} is not a distributed node", node.name())
    }
}

/// A node rebuilt over a re-bound input has the properties it had: they depend on the
/// schema and the split, not on the query vector.
fn keep_properties() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep)
}

//! The distributed planner's hooks for fragvec's leaves: how many tasks a stage reading a
//! fragvec table wants, and the per-task variants of the leaf once the count is final.
//!
//! Without these a custom leaf runs as one task and nothing is distributed. A
//! [`FragmentScanExec`] wants one task per fragment and is split into contiguous runs of
//! fragments; a [`KnnExec`] wants one task per segment and likely-unowned fragment (or per
//! partition, when its index can be sliced) and is split into shares (see [`super::split`]). The variants go into datafusion-distributed's
//! `DistributedLeafExec`, which sends each task only its own variant.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedLeafExec,
    ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse,
};

use super::split;
use crate::engine::knn::KnnExec;
use crate::engine::options::FragvecOptions;
use crate::engine::scan::FragmentScanExec;
use crate::format::index_meta::IndexDef;

/// How many tasks a fragvec leaf wants (`None` for other nodes).
pub fn desired_task_count(
    ev: DesiredTaskCountEvent<'_>,
) -> Option<Result<DesiredTaskCountEventResponse>> {
    if let Some(scan) = ev.plan.downcast_ref::<FragmentScanExec>() {
        if scan.fragment_subset().is_some() {
            return None; // already one task's part
        }
        let manifest = &scan.spec().snapshot.manifest;
        return Some(Ok(DesiredTaskCountEventResponse::desired(
            split::scan_task_count(manifest),
        )));
    }
    if let Some(knn) = ev.plan.downcast_ref::<KnnExec>() {
        if knn.share().is_some() {
            return None;
        }
        let manifest = &knn.scan_spec().snapshot.manifest;
        return Some(Ok(DesiredTaskCountEventResponse::desired(
            split::knn_task_count(manifest, searched_index(knn, ev.session_config)),
        )));
    }
    None
}

/// The per-task variants of a fragvec leaf for the stage's final task count.
pub fn scale_up_leaf(ev: ScaleUpLeafNodeEvent<'_>) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    if ev.task_count <= 1 {
        return None;
    }
    let variants: Result<Vec<Arc<dyn ExecutionPlan>>> =
        if let Some(scan) = ev.plan.downcast_ref::<FragmentScanExec>() {
            if scan.fragment_subset().is_some() {
                return None;
            }
            let spec = scan.spec();
            split::fragment_runs(&spec.snapshot.manifest, ev.task_count)
                .into_iter()
                .map(|ids| {
                    Ok(
                        Arc::new(FragmentScanExec::new(spec.clone())?.with_fragments(ids))
                            as Arc<dyn ExecutionPlan>,
                    )
                })
                .collect()
        } else if let Some(knn) = ev.plan.downcast_ref::<KnnExec>() {
            if knn.share().is_some() {
                return None;
            }
            let manifest = &knn.scan_spec().snapshot.manifest;
            let index = searched_index(knn, ev.session_config);
            split::knn_shares(manifest, index, ev.task_count)
                .into_iter()
                .map(|share| Ok(Arc::new(knn.with_share(share)?) as Arc<dyn ExecutionPlan>))
                .collect()
        } else {
            return None;
        };
    Some(
        variants
            .and_then(|v| DistributedLeafExec::try_new(ev.plan.clone(), v))
            .map(|leaf| ScaleUpLeafNodeEventResponse::new(Arc::new(leaf))),
    )
}

/// The index a KNN search will use ([`crate::engine::knn::searched_index`]: under `SET fragvec.exact = true`,
/// an IVF_FLAT index with every partition probed, else none).
fn searched_index<'a>(knn: &'a KnnExec, config: &SessionConfig) -> Option<&'a IndexDef> {
    let exact = config
        .options()
        .extensions
        .get::<FragvecOptions>()
        .is_some_and(|o| o.exact);
    crate::engine::knn::searched_index(knn.index(), exact)
}

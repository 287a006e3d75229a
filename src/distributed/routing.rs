//! Which worker runs which task of a stage that reads a fragvec table: the same share of the
//! table on the same worker from one query to the next, so that each worker's index cache
//! holds its own share (the cluster caches the sum of the workers' caches, not one cache
//! copied on every worker).
//!
//! datafusion-distributed places a stage's tasks round-robin from a random worker, which
//! sends a segment's partitions to a different worker on every query. Here each task is
//! named by what it reads (`task_key`: the segments, slice and fragments of its share, or
//! the fragments of its scan) and placed by rendezvous hashing ([`assign`]): every worker
//! gets a score per key, and the task goes to its best-scoring worker that still has room
//! (at most `ceil(tasks / workers)` tasks each, so a stage never piles onto one worker). A
//! worker that leaves the list moves only the tasks it held (and those that had to make
//! room for them); the rest stay where their caches are. Stages without a fragvec leaf are
//! left to the defaults.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, exec_err};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{
    DistributedGetterExt, DistributedLeafExec, RouteTasksEvent, RouteTasksEventResponse,
};
use url::Url;

use crate::engine::knn::KnnExec;
use crate::engine::scan::FragmentScanExec;

/// Routes the tasks of a stage whose leaf is a split fragvec node (see the module docs);
/// `None` for other stages.
pub fn route_tasks(ev: RouteTasksEvent<'_>) -> Option<Result<RouteTasksEventResponse>> {
    let keys = stage_keys(ev.plan)?;
    if keys.len() != ev.task_count {
        return None;
    }
    let urls = match ev
        .task_ctx
        .session_config()
        .get_distributed_worker_resolver()
        .and_then(|r| r.get_urls())
    {
        Ok(urls) if urls.is_empty() => return Some(exec_err!("no workers to route tasks to")),
        Ok(urls) => urls,
        Err(e) => return Some(Err(e)),
    };
    let names: Vec<&str> = urls.iter().map(Url::as_str).collect();
    let placed = assign(&keys, &names);
    Some(Ok(RouteTasksEventResponse::new(
        placed.into_iter().map(|w| urls[w].clone()).collect(),
    )))
}

/// The key of each task of the first split fragvec leaf in `plan`'s stage.
fn stage_keys(plan: &Arc<dyn ExecutionPlan>) -> Option<Vec<u64>> {
    let mut keys = None;
    plan.apply(|node| {
        if let Some(leaf) = node.downcast_ref::<DistributedLeafExec>() {
            keys = leaf.variants().iter().map(task_key).collect();
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .ok()?;
    keys
}

/// What a task reads, hashed: its share (segments, slice, fragments) or its fragments.
/// `None` for a node that is not fragvec's.
fn task_key(variant: &Arc<dyn ExecutionPlan>) -> Option<u64> {
    let mut h = Fnv::new();
    if let Some(knn) = variant.downcast_ref::<KnnExec>() {
        let share = knn.share()?;
        h.word(1);
        h.word(share.segments.len() as u64);
        share.segments.iter().for_each(|s| h.word(*s));
        match share.slice {
            // A slice's key leaves out the fragments: new fragments must not move it.
            Some(slice) => {
                h.word(u64::from(slice.index));
                h.word(u64::from(slice.of));
            }
            None => share.fragments.iter().for_each(|f| h.word(*f)),
        }
        return Some(h.finish());
    }
    let scan = variant.downcast_ref::<FragmentScanExec>()?;
    h.word(2);
    scan.fragment_subset()?.iter().for_each(|f| h.word(*f));
    Some(h.finish())
}

/// The worker (index into `workers`) of each task (by key): rendezvous hashing with at most
/// `ceil(tasks / workers)` tasks per worker. Tasks choose in order of their best score, so
/// the result does not depend on the order of `workers` or of tasks with distinct keys.
pub fn assign(keys: &[u64], workers: &[&str]) -> Vec<usize> {
    if workers.is_empty() {
        return Vec::new();
    }
    let cap = keys.len().div_ceil(workers.len());
    let worker_hashes: Vec<u64> = workers
        .iter()
        .map(|w| {
            let mut h = Fnv::new();
            h.bytes(w.as_bytes());
            h.finish()
        })
        .collect();
    // Each task's workers, best first (ties by worker hash, then name: never by position).
    let ranked: Vec<Vec<usize>> = keys
        .iter()
        .map(|k| {
            let mut order: Vec<usize> = (0..workers.len()).collect();
            order.sort_by_key(|w| {
                std::cmp::Reverse((mix(*k ^ worker_hashes[*w]), worker_hashes[*w], workers[*w]))
            });
            order
        })
        .collect();
    // Tasks whose best worker scores highest choose first.
    let mut turn: Vec<usize> = (0..keys.len()).collect();
    turn.sort_by_key(|t| {
        let best = ranked[*t][0];
        std::cmp::Reverse((mix(keys[*t] ^ worker_hashes[best]), keys[*t]))
    });
    let mut load = vec![0usize; workers.len()];
    let mut out = vec![0usize; keys.len()];
    for t in turn {
        let w = *ranked[t]
            .iter()
            .find(|w| load[**w] < cap)
            .expect("cap × workers ≥ tasks");
        load[w] += 1;
        out[t] = w;
    }
    out
}

/// 64-bit FNV-1a: a hash that is the same in every process and build (the assignment must
/// agree from one query, and one coordinator, to the next).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn word(&mut self, w: u64) {
        self.bytes(&w.to_le_bytes());
    }

    fn finish(&self) -> u64 {
        mix(self.0)
    }
}

/// A 64-bit finalizer (splitmix64's): spreads FNV's weak low bits over the whole word.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn workers(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://127.0.0.1:{}/", 9000 + i))
            .collect()
    }

    proptest! {
        /// Every task gets a worker, none gets more than its share, and the assignment does
        /// not depend on the order the workers are listed in. If this fails, a stage piles
        /// onto one worker, or two coordinators send a share to different workers.
        #[test]
        fn prop_assignment_is_balanced_and_order_free(
            keys in prop::collection::hash_set(any::<u64>(), 0..24),
            n in 1..6usize,
            rotate in 0..6usize,
        ) {
            let keys: Vec<u64> = keys.into_iter().collect();
            let names = workers(n);
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let placed = assign(&keys, &refs);
            prop_assert_eq!(placed.len(), keys.len());
            let cap = keys.len().div_ceil(n);
            for w in 0..n {
                prop_assert!(placed.iter().filter(|p| **p == w).count() <= cap);
            }
            let mut rotated = refs.clone();
            rotated.rotate_left(rotate % n);
            let again = assign(&keys, &rotated);
            for (a, b) in placed.iter().zip(&again) {
                prop_assert_eq!(refs[*a], rotated[*b]);
            }
        }

        /// With as many workers as tasks or more, removing a worker that runs none of the
        /// tasks moves none of them (their caches stay warm).
        #[test]
        fn prop_an_idle_worker_leaving_moves_nothing(
            keys in prop::collection::hash_set(any::<u64>(), 1..4),
            extra in 1..4usize,
        ) {
            let keys: Vec<u64> = keys.into_iter().collect();
            let names = workers(keys.len() + extra);
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let placed = assign(&keys, &refs);
            let idle = (0..refs.len()).find(|w| !placed.contains(w)).expect("an idle worker");
            let fewer: Vec<&str> =
                refs.iter().enumerate().filter(|(i, _)| *i != idle).map(|(_, w)| *w).collect();
            let again = assign(&keys, &fewer);
            for (a, b) in placed.iter().zip(&again) {
                prop_assert_eq!(refs[*a], fewer[*b]);
            }
        }
    }

    #[test]
    fn two_tasks_over_two_workers_use_both_and_keep_their_places() {
        let names = workers(2);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let first = assign(&[11, 12], &refs);
        assert_ne!(first[0], first[1]);
        assert_eq!(assign(&[11, 12], &refs), first);
        assert_eq!(assign(&[], &refs), Vec::<usize>::new());
        assert_eq!(assign(&[1], &[]), Vec::<usize>::new());
    }
}

//! Queries across machines, on datafusion-distributed: fragvec's integration in one place
//! (a layer above `engine`; nothing below names it).
//!
//! * [`coordinator`]: `FragvecSession::with_workers`, a session whose queries run on
//!   workers; statements that write stay on the coordinator.
//! * [`worker`]: the worker (`fragvec worker`): sessions with fragvec's functions, options,
//!   codec and databases; in-process workers for tests.
//! * [`codec`]: `FragmentScanExec` and `KnnExec` on the wire.
//! * [`tasks`]: the planner hooks that split fragvec's leaves into tasks; [`split`]: the
//!   pure split rules (scans by runs of fragments, KNN by segments plus unowned fragments,
//!   or by slices of the partitions when the segments do not deal evenly).
//! * [`routing`]: which worker runs which task (the same share on the same worker from one
//!   query to the next, so workers cache disjoint shares).
//! * [`sorts`]: sorts over a fragvec leaf (KNN's top-k) become per-task sorts merged on
//!   the coordinator.
//! * [`kept_plans`]: repeated KNN queries on workers reuse their plan, each run under a
//!   query id of its own.
//! * [`on_workers`]: the root of a query on workers: runs it again when a worker is lost,
//!   names the workers in its errors; [`health`]: which workers are up.
//! * [`databases`]: the databases a process serves, each with one index cache.
//!
//! Row order: a query whose plan is split returns its rows in no particular order without
//! ORDER BY; a plain `SELECT` without aggregates, joins or sorts is not split (nothing to
//! gain) and keeps the table's logical order. See docs/scaling-out.md.

pub mod codec;
pub mod coordinator;
pub mod databases;
pub mod error;
pub mod health;
pub mod kept_plans;
pub mod on_workers;
pub mod routing;
pub mod sorts;
pub mod split;
pub mod tasks;
pub mod worker;

#[cfg(test)]
mod tests;

pub use coordinator::worker_urls;
pub use error::DistributedError;
pub use worker::{LocalWorker, spawn};

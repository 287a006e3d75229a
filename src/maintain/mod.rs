//! Maintenance that runs by itself: the policy's decisions as a pure function of a table's
//! state ([`plan`]), the lease that keeps one maintainer per table across processes
//! ([`lease`]) and the journal of tasks ([`journal`]). No DataFusion here: running the tasks
//! (index builds, compaction, recluster, vacuum) is `crate::engine::maintain`, and the
//! schedule inside `fragvec serve` is `crate::serve::maintainer`.
//!
//! A table's policy is [`crate::format::policy::MaintenancePolicy`], stored in its manifest.

pub mod journal;
pub mod lease;
pub mod plan;

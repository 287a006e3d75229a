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

use futures::TryStreamExt;

use crate::format::error::{FormatError, Result};
use crate::format::store::TableDir;

/// The names (without `.json`) of the JSON objects in `folder` of the table, sorted.
async fn json_names(dir: &TableDir, folder: &str) -> Result<Vec<String>> {
    let prefix = dir.path(folder);
    let mut names: Vec<String> = dir
        .store()
        .list(Some(&prefix))
        .map_ok(|m| m.location)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| FormatError::store(&prefix, e))?
        .iter()
        .filter_map(|p| Some(p.filename()?.strip_suffix(".json")?.to_string()))
        .collect();
    names.sort();
    Ok(names)
}

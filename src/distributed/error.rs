//! Errors of the distributed layer, converted into `DataFusionError::External` once (here),
//! so `find_root()` and a downcast recover them.

use datafusion::common::DataFusionError;

/// What goes wrong sending plans to workers and running them there.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// An encoded plan node that cannot be decoded: damaged, or from another fragvec version.
    #[error("cannot decode {node} from the coordinator's plan: {what}")]
    BadPlanNode {
        /// The node's kind.
        node: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// A plan node this process cannot send to a worker.
    #[error("{node} runs on the coordinator only and cannot be sent to a worker")]
    CoordinatorOnly {
        /// The node, as `EXPLAIN` names it.
        node: String,
    },
    /// A table of the plan is in none of the databases this process has open, so its scan
    /// cannot be named to a worker.
    #[error(
        "table '{table}' is not in any database this process has open ({open}): its scan \
         cannot be sent to a worker"
    )]
    ForeignTable {
        /// The table's name.
        table: String,
        /// The databases open, by location (`none` when there is none).
        open: String,
    },
    /// A plan names a database this worker has not opened.
    #[error(
        "this worker has not opened database '{location}' (the coordinator sends it with the query)"
    )]
    UnknownDatabase {
        /// The database the plan names.
        location: String,
    },
    /// A worker started with `--db` was sent a plan over another database.
    #[error("this worker serves database '{served}' only, not '{location}'")]
    DatabaseNotServed {
        /// The database the plan names.
        location: String,
        /// The one this worker serves.
        served: String,
    },
    /// A worker URL that cannot be used.
    #[error("bad worker URL '{url}': {what}")]
    BadWorkerUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        what: String,
    },
}

impl From<DistributedError> for DataFusionError {
    fn from(e: DistributedError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

impl DistributedError {
    pub(crate) fn bad_node(node: &'static str, what: impl std::fmt::Display) -> Self {
        Self::BadPlanNode {
            node,
            what: what.to_string(),
        }
    }
}

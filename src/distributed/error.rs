//! Errors of the distributed layer, converted into `DataFusionError::External` once (here),
//! so `find_root()` and a downcast recover them.

use datafusion::common::DataFusionError;

#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// An encoded plan node that cannot be decoded: damaged, or from another fragvec version.
    #[error("cannot decode {node} from the coordinator's plan: {what}")]
    BadPlanNode { node: &'static str, what: String },
    /// A plan node this process cannot send to a worker.
    #[error("{node} runs on the coordinator only and cannot be sent to a worker")]
    CoordinatorOnly { node: String },
    /// A table of the plan is not in the database the codec serves.
    #[error("table '{table}' is not in database '{database}', which this session serves")]
    ForeignTable { table: String, database: String },
    /// A plan names a database this worker has not opened.
    #[error(
        "this worker has not opened database '{location}' (the coordinator sends it with the query)"
    )]
    UnknownDatabase { location: String },
    /// A worker started with `--db` was sent a plan over another database.
    #[error("this worker serves database '{served}' only, not '{location}'")]
    DatabaseNotServed { location: String, served: String },
    /// A worker URL that cannot be used.
    #[error("bad worker URL '{url}': {what}")]
    BadWorkerUrl { url: String, what: String },
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

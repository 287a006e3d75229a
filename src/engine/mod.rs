//! DataFusion glue: the only module that implements DataFusion traits.
//!
//! Statements and the session:
//! * [`session`]: [`FragvecSession`], [`StatementResult`] and [`register`]; routes each
//!   statement once to its family in [`statements`];
//! * [`statements`]: one file per statement family: DDL, DML, queries, index statements,
//!   COMPACT / RECLUSTER / VACUUM;
//! * [`error`]: layer errors into `DataFusionError` (once), and which errors a statement
//!   retries;
//! * [`options`]: `SET fragvec.*` options; [`plan_cache`]: reused physical plans of KNN
//!   queries.
//!
//! Tables, scans and writes:
//! * [`catalog`]: the database as a schema provider;
//! * [`provider`], [`scan`], [`write`](mod@write): the table provider and its scan / insert operators;
//!   [`prune`]: the scan skipping fragments by their column ranges;
//! * [`dml`]: gathering DELETE, UPDATE and MERGE changes from their finder queries (the format
//!   layer commits them, `format::changes`);
//!
//! Vector search:
//! * [`knn`]: `KnnExec`, the k nearest rows through a vector index;
//! * [`knn_rule`]: the physical optimizer rule that puts a `KnnExec` under `ORDER BY
//!   distance LIMIT k`;
//! * [`index_ops`]: building, dropping and optimizing vector indexes.
//!
//! Functions and maintenance:
//! * [`udf`]: the vector distance functions; [`vector_ops`]: pgvector's `<=>` (and explicit
//!   `OPERATOR(...)` syntax) planned by operand type; [`cluster_udf`]: `zorder` and
//!   `ivf_partition`; [`ivf_bind`]: `ivf_partition(col)` in ordinary queries, bound to the
//!   partitions the index assigned;
//! * [`functions`]: introspection table functions (`fragvec_fragments('t')`, ...);
//!   [`computed`]: the provider of a table function's batch, computed when the query runs;
//! * [`maintenance`]: COMPACT and VACUUM; [`recluster`]: RECLUSTER, `ALTER TABLE ... CLUSTER
//!   BY` and `recluster_information`.
//!
//! Scenarios that need more than one statement at a time or a model (concurrent sessions,
//! randomized DML and rewrites against a model or exact KNN, damaged index files) are the
//! integration tests in `tests/engine_scenarios.rs`.

pub mod catalog;
pub mod cluster_udf;
pub mod computed;
pub mod dml;
pub mod error;
pub mod functions;
pub mod index_ops;
pub mod ivf_bind;
pub mod knn;
pub mod knn_rule;
pub mod maintain;
pub mod maintenance;
pub mod options;
pub mod plan_cache;
pub mod provider;
pub mod prune;
pub mod recluster;
pub mod scan;
pub mod session;
pub mod statements;
pub mod udf;
pub mod vector_ops;
pub mod write;

pub use session::{FragvecSession, StatementResult, register};
pub use statements::stream::Streamed;

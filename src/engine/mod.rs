//! DataFusion glue: the only module that implements DataFusion traits.
//!
//! * [`session`]: `FragvecSession`, the statement front end, and [`register`];
//! * [`catalog`]: the database as a schema provider;
//! * [`provider`], [`scan`], [`write`]: the table provider and its scan / insert operators;
//! * [`dml`]: applying DELETE, UPDATE and MERGE;
//! * [`functions`]: introspection table functions;
//! * [`options`]: `SET fragvec.*` options; [`types`]: `VECTOR(n)`.

pub mod catalog;
pub mod cluster_udf;
pub mod dml;
pub mod error;
pub mod functions;
pub mod index_ops;
pub mod knn;
pub mod knn_rule;
pub mod maintenance;
pub mod options;
pub mod plan_cache;
pub mod provider;
pub mod recluster;
pub mod scan;
pub mod session;
pub mod statements;
pub mod types;
pub mod udf;
pub mod write;

pub use session::{FragvecSession, StatementResult, register};

#[cfg(test)]
mod tests;

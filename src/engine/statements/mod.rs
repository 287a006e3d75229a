//! The statements fragvec runs itself, one file per family. [`super::session`] routes each
//! parsed statement here once, passing the parts it already matched; every function runs one
//! statement (or one attempt of it, for those the session retries) and returns its
//! [`StatementResult`](super::StatementResult).
//!
//! * [`ddl`]: CREATE TABLE (with `VECTOR(n)` columns, `WITH` properties, `CLUSTER BY`),
//!   DROP TABLE, ALTER TABLE ... CLUSTER BY / DROP CLUSTERING KEY;
//! * [`dml`]: DELETE / UPDATE / MERGE as finder queries, their EXPLAIN, and their retry;
//! * [`query`]: everything DataFusion plans: pinning to table versions, `knn(...)` calls,
//!   vector literals as parameters, and reuse of cached KNN plans;
//! * [`index`]: CREATE VECTOR INDEX / DROP INDEX / OPTIMIZE INDEX, thin calls into
//!   [`super::index_ops`];
//! * [`rewrite`]: COMPACT / RECLUSTER / VACUUM, thin calls into [`super::maintenance`] and
//!   [`super::recluster`].

pub mod ddl;
pub mod dml;
pub mod index;
pub mod query;
pub mod rewrite;

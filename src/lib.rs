//! fragvec: versioned fragment tables with vector search, for Apache DataFusion.
//!
//! Layers; each uses only the ones below it:
//!
//! * [`cli`]: the `fragvec` binary's shell, output formats and demo.
//! * [`engine`]: the DataFusion glue (session and statement front end, catalog, table
//!   provider, scan / insert / KNN operators, the KNN optimizer rule, distance UDFs, table
//!   functions, options). The only module that implements DataFusion traits.
//! * [`sql`]: parsing (fragvec's statements first, then DataFusion's), relation pinning, DML
//!   finder queries and the `knn(...)` rewrite; works on ASTs, needs no session.
//! * [`index`]: vector indexes: kernels, k-means, IVF/PQ models, segment files and their
//!   cache, per-segment search with a row mask.
//! * [`format`]: the table format (manifests, fragments, deletion vectors, row ids, index
//!   metadata, optimistic commits). Speaks Arrow and `object_store` only.

pub mod cli;
pub mod engine;
pub mod format;
pub mod index;
pub mod ledger;
pub mod rewrite;
pub mod sql;

pub use engine::{FragvecSession, register};

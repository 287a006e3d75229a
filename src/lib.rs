//! fragvec: versioned fragment tables with vector search, for Apache DataFusion.
//!
//! Layers, arrows pointing down only:
//!
//! * [`cli`]: the `fragvec` binary's shell, output formats and demo.
//! * [`engine`]: the DataFusion glue (catalog, table provider, scan and DML operators,
//!   statement front end, table functions, options). The only module that implements
//!   DataFusion traits.
//! * [`sql`]: parsing and statement rewriting (no session needed).
//! * [`index`]: vector indexes (kernels, k-means, IVF models, segments, search).
//! * [`format`]: the table format (manifests, fragments, deletion vectors, row ids,
//!   optimistic commits). Speaks Arrow and `object_store` only.

pub mod cli;
pub mod engine;
pub mod format;
pub mod index;
pub mod sql;

pub use engine::{FragvecSession, register};

//! fragvec: versioned fragment tables with vector search, for Apache DataFusion.
//!
//! Nine layers; each uses only the ones below it (`tests/layering.rs` checks this):
//!
//! ```text
//! cli ─▶ serve ─▶ distributed ─▶ engine ─▶ sql ─▶ rewrite ─▶ index ─▶ format ─▶ ledger
//! ```
//!
//! * [`cli`]: the `fragvec` binary's shell, output formats and demo.
//! * [`serve`]: `fragvec serve`, the PostgreSQL-protocol server: connections with sessions of
//!   their own over one database and index cache, catalog, parameters, auth; and its Arrow
//!   Flight SQL endpoint (feature `flight`).
//! * `distributed` (feature `distributed`): queries across machines on
//!   datafusion-distributed: the plan codec of fragvec's operators, the planner hooks that
//!   split scans and KNN searches into tasks, workers and the coordinator session.
//! * [`engine`]: the DataFusion glue and nothing else: session and statement routing by
//!   family, catalog, table provider, scan / insert / KNN operators, the KNN optimizer rule,
//!   UDFs and table functions, options, and the one place where layer errors become
//!   `DataFusionError`. The only module that implements DataFusion traits.
//! * [`sql`]: parsing (fragvec's statements first, then DataFusion's), relation pinning, DML
//!   finder queries and the `knn(...)` rewrite; works on ASTs, needs no session.
//! * [`rewrite`]: COMPACT and RECLUSTER: pure planners, execution over row streams and
//!   already evaluated keys, one commit per rewrite recorded in the reuse ledger.
//! * [`index`]: vector indexes: kernels, k-means, IVF / PQ models, segment files, segment
//!   ownership, the index cache (one byte budget), the KNN search entry point, and index
//!   maintenance (create, append, merge, retrain, drop).
//! * [`format`](mod@format): the table format: manifests, fragments, deletion vectors, row ids, index
//!   metadata, commits (pure conflict rules, rebase, one retry loop), time travel, VACUUM.
//!   Speaks Arrow, Parquet and `object_store` only.
//! * [`ledger`]: the ground floor, no IO: the id types every layer shares, the reuse
//!   ledger's transitions, lineage order and validation, translation, ordered remaps and the
//!   row-map arithmetic and codec.
// Every public item is documented: the crate's rustdoc is the embedder's reference.
#![warn(missing_docs)]

pub mod cli;
#[cfg(feature = "distributed")]
pub mod distributed;
pub mod engine;
pub mod format;
pub mod index;
pub mod ledger;
pub mod maintain;
pub mod rewrite;
pub mod serve;
pub mod sql;

pub use engine::{FragvecSession, register};

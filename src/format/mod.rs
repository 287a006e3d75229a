//! The table format: manifests, fragments, deletion vectors, row ids and commits.
//!
//! * [`store`]: databases and table folders on an object store, snapshots, time travel;
//!   [`latest`]: the newest versions a database handle knows, and how long a query may
//!   rely on them (`fragvec.version_check_ms`);
//! * [`manifest`]: the manifest model (the logical-order contract every other layer relies
//!   on is written down there), [`index_meta`]: index definitions and segments in it;
//! * [`fragment_io`]: Parquet fragments; [`deletion`]: deletion vectors; [`rowids`]: stable
//!   row-id sequences; [`row_map_file`] and [`ledger_io`]: the files the reuse ledger needs;
//! * [`integrity`]: the CRC32C checks of data, deletion, segment and row-map files;
//! * [`commit`](mod@commit): optimistic commits (pure conflict rules, rebase, one retry loop);
//! * [`changes`]: DELETE / UPDATE / MERGE row changes turned into a transaction;
//! * [`views`]: views stored in the database; [`vacuum`]: removing unreferenced files; [`introspect`]: the table's state as batches;
//! * [`column_stats`]: each data file's column ranges, for skipping fragments;
//! * [`types`]: the `VECTOR(n)` type; [`conform`]: batches conformed to a table schema;
//!   [`storage_types`]: the types Parquet cannot store and what they are written as;
//!   [`packed_vectors`]: vector columns written as one fixed-width value per row;
//! * [`metered_store`]: a store wrapper counting requests and adding latency (benchmarks);
//!   [`ranges`]: several ranges of one object read with few, concurrent requests;
//! * [`progress`]: progress of long statements, reported to a sink the embedder provides;
//! * [`error`]: the layer's error type, `FormatError`.
//!
//! This layer speaks Arrow, Parquet and `object_store` only; it knows nothing of DataFusion's
//! planner.

pub mod changes;
pub mod column_stats;
pub mod commit;
pub mod conform;
pub mod deletion;
mod deletion_io;
pub mod error;
pub mod fetch_windows;
pub mod fragment_io;
pub mod index_meta;
pub mod integrity;
pub mod introspect;
pub mod latest;
pub mod ledger_io;
mod local;
pub mod manifest;
pub mod metered_store;
pub mod packed_vectors;
pub mod policy;
pub mod progress;
pub mod ranges;
pub mod recent_writes;
pub mod row_map_file;
pub mod rowids;
pub mod storage_types;
pub mod store;
pub mod table_names;
pub mod types;
pub mod vacuum;
pub mod views;

pub use commit::{NewFragment, NewRowIds, Rewrite, RowMapRef, Transaction, commit};
pub use error::{FormatError, Result};
pub use fragment_io::{WrittenFragment, read_fragment, write_fragments};
pub use manifest::{Fragment, Manifest, Operation, TableProperties};
pub use store::{Database, Snapshot, TableDir};

#[cfg(test)]
mod tests;

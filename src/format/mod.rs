//! The table format: manifests, fragments, deletion vectors, row ids and commits.
//!
//! This layer speaks Arrow and `object_store` only; it knows nothing of DataFusion's planner.
//! The logical-order contract that every other layer relies on is written down in [`manifest`].

pub mod commit;
pub mod deletion;
pub mod error;
pub mod fragment_io;
pub mod index_meta;
pub mod ledger_io;
pub mod manifest;
pub mod row_map_file;
pub mod rowids;
pub mod store;
pub mod vacuum;

pub use commit::{NewFragment, NewRowIds, Rewrite, RowMapRef, Transaction, commit};
pub use error::{FormatError, Result};
pub use fragment_io::{WrittenFragment, read_fragment, write_fragments};
pub use manifest::{Fragment, Manifest, Operation, TableProperties};
pub use store::{Database, Snapshot, TableDir};

#[cfg(test)]
mod tests;

//! The table format: manifests, fragments, deletion vectors, row ids and commits.
//!
//! This layer speaks Arrow and `object_store` only; it knows nothing of DataFusion's planner.
//! The logical-order contract that every other layer relies on is written down in [`manifest`].

pub mod commit;
pub mod deletion;
pub mod error;
pub mod fragment_io;
pub mod manifest;
pub mod rowids;
pub mod store;

pub use commit::{commit, NewFragment, NewRowIds, Transaction};
pub use error::{FormatError, Result};
pub use fragment_io::{read_fragment, write_fragments, WrittenFragment};
pub use manifest::{row_address, split_row_address, Fragment, Manifest, Operation, TableProperties};
pub use store::{Database, Snapshot, TableDir};

#[cfg(test)]
mod tests;

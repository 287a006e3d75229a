//! The fragment-reuse ledger: how rows moved when fragments were rewritten.
//!
//! A rewrite (COMPACT, RECLUSTER) replaces source fragments by destination fragments and
//! records one [`Transition`]: the ordered source and destination digests plus a **mapping**
//! that says where each source row went. Index segments are not rewritten; the row addresses
//! they hold are translated through the ledger when their partitions are loaded, and their
//! ownership follows the transitions ([`ownership`]).
//!
//! Two mapping kinds exist. `OrderedCompaction` keeps row order, so the surviving source
//! rows fill the destinations in order and plain rank arithmetic ([`ordered`]) maps them.
//! `StablePartition` routes each row to one destination in source order; one label per
//! source row is recorded in a row-map file ([`row_map`]).
//!
//! Translation chains through transitions in **lineage** order (a fragment's producer before
//! its consumers), which [`validate`] derives and checks: row conservation, at most one
//! producer and one consumer per fragment id, no cycles. Everything here is IO-free; reading
//! deletion vectors and row-map blocks lives in `format::ledger_io`; the id types every layer
//! shares are in [`ids`].
//!
//! Memory is O(fragments) plus the removed-row bitmaps of the sources (compressed): no map
//! per row.

#[cfg(test)]
pub(crate) mod fuzz;
pub mod ids;
pub mod ordered;
pub mod ownership;
pub mod row_map;
pub mod transition;
pub mod translate;

pub use ordered::OrderedRemap;
pub use ordered::Step;
pub use ownership::{Coverage, SegmentOwnership};
pub use transition::{FragmentDigest, Mapping, Transition, validate};
pub use translate::{LedgerView, LoadedMapping, LoadedTransition, PartitionMap};

/// Errors of the ledger arithmetic: the ledger (or a file it references) is inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The ledger as a whole breaks an invariant (a transition id or fragment appears twice,
    /// lineage forms a cycle), or a row map could not be read or answered inconsistently.
    #[error("reuse ledger is invalid: {0}")]
    Invalid(String),
    /// One transition is inconsistent: its digests or row counts do not add up, its row map
    /// names a destination row it does not have, or it is asked about a non-source fragment.
    #[error("reuse ledger transition {transition}: {reason}")]
    Transition {
        /// The transition's id (`Transition::id`, unique within the table's ledger).
        transition: u64,
        /// What is wrong with it, in words.
        reason: String,
    },
    /// A row address given to a transition is past its source fragment's physical rows (or,
    /// in a sorted sweep, comes before the previous one).
    #[error(
        "row address {addr:#x} (fragment {fragment}, offset {offset}) is outside its fragment in transition {transition}"
    )]
    OutOfRange {
        /// The row address asked about (`(fragment << 32) | offset`).
        addr: u64,
        /// The address's fragment id (a source of the transition).
        fragment: u64,
        /// The address's row offset within that fragment.
        offset: u64,
        /// The id of the transition that was asked to map it.
        transition: u64,
    },
    /// A row map refused an operation (bad parameters or writer input, a failed lookup).
    #[error(transparent)]
    RowMap(#[from] row_map::RowMapError),
    /// A block of a row-map file failed its checks when it was read.
    #[error("corrupt row map {path}: {source}")]
    RowMapFile {
        /// The row-map file's path in the object store.
        path: String,
        /// The check the block failed.
        #[source]
        source: row_map::RowMapError,
    },
}

/// The result of ledger operations, failing with [`LedgerError`].
pub type Result<T> = std::result::Result<T, LedgerError>;

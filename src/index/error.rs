//! Errors of the index layer.
//!
//! Each variant names its subject (index, segment file, fragment); the engine converts them
//! into `DataFusionError` once, keeping the type so callers can find the root error.

use crate::format::FormatError;
use crate::ledger::LedgerError;

/// What goes wrong building, reading or searching an index.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Reading or writing the table's files failed, or a file is corrupt.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// An Arrow kernel failed on the rows.
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// The reuse ledger could not translate a segment's rows.
    #[error("table '{table}': {source}")]
    Ledger {
        /// The name of the table whose segment was being translated.
        table: String,
        /// What the ledger refused.
        #[source]
        source: LedgerError,
    },
    /// The query vector does not fit the column (the user's input).
    #[error("query vector has {query} dimensions, column '{column}' has {column_dim}")]
    DimensionMismatch {
        /// The query vector's dimensions.
        query: usize,
        /// The vector column searched.
        column: String,
        /// The column's dimensions (its `VECTOR(n)`).
        column_dim: usize,
    },
    /// A segment names a row its fragment does not have.
    #[error("row {offset} is past the end of fragment {fragment} ({rows} rows): a corrupt index?")]
    RowOutOfRange {
        /// The fragment's id.
        fragment: u64,
        /// The row's offset in the fragment, as the segment names it.
        offset: u64,
        /// The rows the fragment has (deleted ones included), so `offset >= rows`.
        rows: u64,
    },
    /// A segment names a fragment the table does not have (a broken invariant).
    #[error("KNN candidate in fragment {fragment}, not in the table")]
    UnknownFragment {
        /// The fragment id the segment names.
        fragment: u64,
    },
    /// A fragment has no data file holding a column of the table schema.
    #[error("fragment {fragment} has no file for column {column}")]
    MissingColumn {
        /// The fragment's id.
        fragment: u64,
        /// The column's name, as in the table schema.
        column: String,
    },
    /// A statement names an index the table does not have.
    #[error("index '{index}' does not exist on table '{table}'; {}", its_indexes(.table, .existing))]
    NotFound {
        /// The index's name, as the statement gives it.
        index: String,
        /// The table's name.
        table: String,
        /// The indexes the table has, by name (the message lists them).
        existing: Vec<String>,
    },
    /// `CREATE VECTOR INDEX` of a name the table already has.
    #[error("index '{index}' already exists on table '{table}'")]
    AlreadyExists {
        /// The index's name, as the statement gives it.
        index: String,
        /// The table's name.
        table: String,
    },
    /// An index on a column the table does not have.
    #[error("column '{column}' does not exist in table '{table}'")]
    NoSuchColumn {
        /// The column's name, as the statement gives it.
        column: String,
        /// The table's name.
        table: String,
    },
    /// An index on a column that is not `VECTOR(n)`.
    #[error("column '{column}' is not a vector column (VECTOR(n))")]
    NotAVectorColumn {
        /// The column named.
        column: String,
    },
    /// Training or writing an index failed for a reason the user can act on.
    #[error("cannot build index '{index}': {reason}")]
    Build {
        /// The index's name.
        index: String,
        /// What went wrong, in words for the user (the message follows the index name).
        reason: String,
    },
}

impl IndexError {
    pub(crate) fn ledger(table: impl std::fmt::Display, source: LedgerError) -> Self {
        IndexError::Ledger {
            table: table.to_string(),
            source,
        }
    }

    /// Whether a concurrent commit caused it (the statement may run again).
    pub fn is_retryable(&self) -> bool {
        matches!(self, IndexError::Format(e) if e.is_retryable())
    }
}

/// The index layer's result.
pub type Result<T, E = IndexError> = std::result::Result<T, E>;

/// The next step after naming a missing index: the names the table has, or how to make one.
fn its_indexes(table: &str, existing: &[String]) -> String {
    if existing.is_empty() {
        format!(
            "it has none (CREATE VECTOR INDEX name ON {table} (column) USING IVF_FLAT makes one)"
        )
    } else {
        format!("its indexes: {}", existing.join(", "))
    }
}

//! Errors of the index layer.
//!
//! Each variant names its subject (index, segment file, fragment); the engine converts them
//! into `DataFusionError` once, keeping the type so callers can find the root error.

use crate::format::FormatError;
use crate::ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Reading or writing the table's files failed, or a file is corrupt.
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// The reuse ledger could not translate a segment's rows.
    #[error("table '{table}': {source}")]
    Ledger {
        table: String,
        #[source]
        source: LedgerError,
    },
    /// The query vector does not fit the column (the user's input).
    #[error("query vector has {query} dimensions, column '{column}' has {column_dim}")]
    DimensionMismatch {
        query: usize,
        column: String,
        column_dim: usize,
    },
    /// A segment names a row its fragment does not have.
    #[error("row {offset} is past the end of fragment {fragment} ({rows} rows): a corrupt index?")]
    RowOutOfRange {
        fragment: u64,
        offset: u64,
        rows: u64,
    },
    /// A segment names a fragment the table does not have (a broken invariant).
    #[error("KNN candidate in fragment {fragment}, not in the table")]
    UnknownFragment { fragment: u64 },
    /// A fragment has no data file holding a column of the table schema.
    #[error("fragment {fragment} has no file for column {column}")]
    MissingColumn { fragment: u64, column: String },
    #[error("index '{index}' does not exist on table '{table}'")]
    NotFound { index: String, table: String },
    #[error("index '{index}' already exists on table '{table}'")]
    AlreadyExists { index: String, table: String },
    #[error("column '{column}' does not exist in table '{table}'")]
    NoSuchColumn { column: String, table: String },
    #[error("column '{column}' is not a vector column (VECTOR(n))")]
    NotAVectorColumn { column: String },
    /// Training or writing an index failed for a reason the user can act on.
    #[error("cannot build index '{index}': {reason}")]
    Build { index: String, reason: String },
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

pub type Result<T, E = IndexError> = std::result::Result<T, E>;

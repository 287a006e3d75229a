//! Errors of the table-format layer: one enum, [`FormatError`], for every module under
//! `format`, with the table, path or version it concerns. A commit conflict carries its
//! typed reason ([`crate::format::commit::Conflict`]); [`FormatError::is_retryable`] is
//! what the statement retry loop ([`crate::format::commit::retry`]) asks.

use std::fmt;

/// Everything that can go wrong while reading or writing a table's files.
///
/// Each variant says whose fault it is: the caller's input (`InvalidInput`, `NotFound`,
/// `AlreadyExists`), a concurrent writer (`Conflict`, retryable), the bytes on disk
/// (`Corrupt`, `UnknownFeature`), or the storage layer underneath (`ObjectStore`, `Parquet`,
/// `Arrow`, `StorageType`).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// A table that does not exist.
    #[error("table '{0}' does not exist")]
    NotFound(String),
    /// `CREATE TABLE` of a table that exists.
    #[error("table '{0}' already exists")]
    AlreadyExists(String),
    /// `VERSION AS OF` a version the table does not have (or no longer keeps).
    #[error("version {version} of table '{table}' does not exist")]
    VersionNotFound {
        /// The table.
        table: String,
        /// The version asked for.
        version: u64,
    },
    /// Input the format refuses (the caller's; the message says what).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Another writer committed something this transaction cannot be rebased over
    /// (`version`: the latest version the commit saw). The statement may re-read the table
    /// and try again. `reason` says which rule of [`crate::format::commit::conflict`] failed.
    #[error("commit conflict on table '{table}' at version {version}: {reason} (retryable)")]
    Conflict {
        /// The table.
        table: String,
        /// The latest version the commit saw.
        version: u64,
        /// Which rule failed.
        #[source]
        reason: crate::format::commit::reason::Conflict,
    },
    /// The store of a database does not refuse a second create-if-absent put of one object,
    /// so two writers could both publish the same version (one commit silently lost).
    #[error(
        "database '{location}' cannot be used: its store does not support create-if-absent puts \
         ({reason}); fragvec publishes every commit with one (on S3: PutObject with \
         If-None-Match: *, supported by AWS S3, MinIO and Cloudflare R2; do not set \
         AWS_CONDITIONAL_PUT=disabled)"
    )]
    NoPutIfAbsent {
        /// The database.
        location: String,
        /// Why.
        reason: String,
    },
    /// A file that fails its checksum or does not decode.
    #[error("corrupt file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A table written with a feature this fragvec does not know (a newer writer's).
    #[error(
        "table '{table}' needs feature '{flag}', which this version of fragvec does not support"
    )]
    UnknownFeature {
        /// The table.
        table: String,
        /// The feature flag.
        flag: String,
    },
    /// The object store failed an operation.
    #[error("object store error at {path}: {source}")]
    ObjectStore {
        /// The object.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// A Parquet file could not be read or written.
    #[error("parquet error in {path}: {source}")]
    Parquet {
        /// The file.
        path: String,
        /// Parquet's error.
        #[source]
        source: datafusion::parquet::errors::ParquetError,
    },
    /// A local file operation outside object_store (VACUUM's temporary-file sweep).
    #[error("file system error at {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A column of a type Parquet cannot store as it is (see
    /// [`crate::format::storage_types`]) could not be turned into its stored form or back: a
    /// declared type too narrow for one batch (dictionary keys, run ends), or a type Parquet
    /// cannot store at all (a union).
    #[error("column '{column}' of type {data_type}: {reason}")]
    StorageType {
        /// The column.
        column: String,
        /// Its declared type.
        data_type: String,
        /// What went wrong.
        reason: String,
    },
    /// An Arrow kernel failed.
    #[error("arrow error: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// The table's reuse ledger is inconsistent.
    #[error("table '{table}': {source}")]
    Ledger {
        /// The table.
        table: String,
        /// What the ledger refused.
        #[source]
        source: crate::ledger::LedgerError,
    },
}

impl FormatError {
    /// Whether the statement may run again and succeed (a commit conflict).
    pub fn is_retryable(&self) -> bool {
        matches!(self, FormatError::Conflict { .. })
    }

    pub(crate) fn store(path: impl fmt::Display, source: object_store::Error) -> Self {
        FormatError::ObjectStore {
            path: path.to_string(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl fmt::Display, reason: impl Into<String>) -> Self {
        FormatError::Corrupt {
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn ledger(table: impl fmt::Display, source: crate::ledger::LedgerError) -> Self {
        FormatError::Ledger {
            table: table.to_string(),
            source,
        }
    }

    pub(crate) fn storage_type(
        field: &datafusion::arrow::datatypes::Field,
        reason: impl fmt::Display,
    ) -> Self {
        FormatError::StorageType {
            column: field.name().clone(),
            data_type: field.data_type().to_string(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        FormatError::InvalidInput(reason.into())
    }
}

/// The format layer's result.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

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
    #[error("table '{0}' does not exist")]
    NotFound(String),
    #[error("table '{0}' already exists")]
    AlreadyExists(String),
    #[error("version {version} of table '{table}' does not exist")]
    VersionNotFound { table: String, version: u64 },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Another writer committed something this transaction cannot be rebased over
    /// (`version`: the latest version the commit saw). The statement may re-read the table
    /// and try again. `reason` says which rule of [`crate::format::commit::conflict`] failed.
    #[error("commit conflict on table '{table}' at version {version}: {reason} (retryable)")]
    Conflict {
        table: String,
        version: u64,
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
    NoPutIfAbsent { location: String, reason: String },
    #[error("corrupt file {path}: {reason}")]
    Corrupt { path: String, reason: String },
    #[error(
        "table '{table}' needs feature '{flag}', which this version of fragvec does not support"
    )]
    UnknownFeature { table: String, flag: String },
    #[error("object store error at {path}: {source}")]
    ObjectStore {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("parquet error in {path}: {source}")]
    Parquet {
        path: String,
        #[source]
        source: datafusion::parquet::errors::ParquetError,
    },
    /// A local file operation outside object_store (VACUUM's temporary-file sweep).
    #[error("file system error at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A column of a type Parquet cannot store as it is (see
    /// [`crate::format::storage_types`]) could not be turned into its stored form or back: a
    /// declared type too narrow for one batch (dictionary keys, run ends), or a type Parquet
    /// cannot store at all (a union).
    #[error("column '{column}' of type {data_type}: {reason}")]
    StorageType {
        column: String,
        data_type: String,
        reason: String,
    },
    #[error("arrow error: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("table '{table}': {source}")]
    Ledger {
        table: String,
        #[source]
        source: crate::ledger::LedgerError,
    },
}

impl FormatError {
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

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

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
    /// The named table does not exist (it was never created, or was dropped); holds the
    /// table's name.
    #[error("table '{0}' does not exist")]
    NotFound(String),
    /// A table (or view) of that name already exists, so it cannot be created; holds the
    /// name.
    #[error("table '{0}' already exists")]
    AlreadyExists(String),
    /// The table has no manifest for the version asked for (`VERSION AS OF` a version
    /// never written, or one VACUUM removed).
    #[error("version {version} of table '{table}' does not exist")]
    VersionNotFound {
        /// The table's name.
        table: String,
        /// The version asked for.
        version: u64,
    },
    /// The caller's input is refused (a bad name, schema, option or argument); the message
    /// says what.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A statement would change one target row twice: MERGE with two source rows matching
    /// it (SQL's cardinality rule; PostgreSQL refuses it the same way).
    #[error(
        "a target row (fragment {fragment}, offset {offset}) matches more than one source row; \
         MERGE may change each target row at most once"
    )]
    RowChangedTwice {
        /// The fragment holding the row.
        fragment: u64,
        /// The row's offset in its fragment.
        offset: u64,
    },
    /// Another writer committed something this transaction cannot be rebased over
    /// (`version`: the latest version the commit saw). The statement may re-read the table
    /// and try again. `reason` says which rule of [`crate::format::commit::conflict`] failed.
    #[error("commit conflict on table '{table}' at version {version}: {reason} (retryable)")]
    Conflict {
        /// The table's name.
        table: String,
        /// The latest version the commit could not be applied onto (the version it read,
        /// when it gave up after too many lost races).
        version: u64,
        /// Which conflict rule failed, with the fragment, segment or index it concerns.
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
        /// The database's location, as it was opened (`s3://bucket/prefix`).
        location: String,
        /// What the probe saw: the store's error, or that a second create was accepted.
        reason: String,
    },
    /// A file fails its checksum or does not decode, or decodes to something that breaks
    /// the format's invariants.
    #[error("corrupt file {path}: {reason}")]
    Corrupt {
        /// The file's path in the object store.
        path: String,
        /// What is wrong with it, in words.
        reason: String,
    },
    /// The table needs a reader feature (to read it) or a writer feature (to write it) that
    /// this build does not know, typically because a newer fragvec wrote it.
    #[error(
        "table '{table}' needs feature '{flag}', which this version of fragvec does not support"
    )]
    UnknownFeature {
        /// The table's name.
        table: String,
        /// The unknown feature flag, as the manifest lists it.
        flag: String,
    },
    /// An object-store request failed.
    #[error("object store error at {path}: {source}")]
    ObjectStore {
        /// The object's path in the store.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// A Parquet data file could not be read or written.
    #[error("parquet error in {path}: {source}")]
    Parquet {
        /// The data file's path (in the store, or relative to the table root).
        path: String,
        /// The Parquet library's error.
        #[source]
        source: datafusion::parquet::errors::ParquetError,
    },
    /// A local file operation outside object_store (VACUUM's temporary-file sweep).
    #[error("file system error at {path}: {source}")]
    Io {
        /// The local directory being swept.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A column of a type Parquet cannot store as it is (see
    /// [`crate::format::storage_types`]) could not be turned into its stored form or back: a
    /// declared type too narrow for one batch (dictionary keys, run ends), or a type Parquet
    /// cannot store at all (a union).
    #[error("column '{column}' of type {data_type}: {reason}")]
    StorageType {
        /// The column's name.
        column: String,
        /// The column's declared Arrow type, as text.
        data_type: String,
        /// What could not be converted, in words.
        reason: String,
    },
    /// An Arrow compute kernel or array operation failed.
    #[error("arrow error: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// The table's reuse ledger is inconsistent, or a row-map block it needs could not be
    /// read or fails its checks.
    #[error("table '{table}': {source}")]
    Ledger {
        /// The table's name.
        table: String,
        /// The ledger's error.
        #[source]
        source: crate::ledger::LedgerError,
    },
}

impl FormatError {
    /// Whether running the statement again from a fresh read may succeed: true exactly for
    /// a commit conflict.
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

/// The result of format-layer operations, failing with [`FormatError`] by default.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

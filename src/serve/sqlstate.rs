//! The SQLSTATE of an error, as PostgreSQL's clients expect it (psycopg's `e.sqlstate`,
//! asyncpg's exception classes, psql's `\set VERBOSITY verbose`), and the error as the
//! client gets it ([`error_info`], [`df_error`]).
//!
//! fragvec's errors are typed below DataFusion (`FormatError`, `IndexError`): those are
//! recognised by downcasting the root error. DataFusion's own carry their class in the variant
//! (`SQL`, `NotImplemented`, `SchemaError`) or, for planning errors, only in their text; the few
//! texts matched here are DataFusion 55's wording, covered by the server's tests.

use datafusion::common::{DataFusionError, SchemaError};

use pgwire::error::{ErrorInfo, PgWireError};

use crate::format::FormatError;
use crate::index::IndexError;

/// SQLSTATEs the server sends (PostgreSQL's Appendix A).
pub mod code {
    /// A statement the parser refuses.
    pub const SYNTAX_ERROR: &str = "42601";
    /// A table or view that does not exist.
    pub const UNDEFINED_TABLE: &str = "42P01";
    /// A column the statement's tables do not have.
    pub const UNDEFINED_COLUMN: &str = "42703";
    /// A function (or an operator's function) with no such name or signature.
    pub const UNDEFINED_FUNCTION: &str = "42883";
    /// Another named object that does not exist (a setting, an index).
    pub const UNDEFINED_OBJECT: &str = "42704";
    /// `CREATE TABLE` of a name already taken.
    pub const DUPLICATE_TABLE: &str = "42P07";
    /// A column name more than one of the statement's tables has.
    pub const AMBIGUOUS_COLUMN: &str = "42702";
    /// A statement that parses but breaks a planning rule (42000 is the class).
    pub const SYNTAX_OR_ACCESS_RULE: &str = "42000";
    /// Values of types that do not fit together (a comparison, an insert).
    pub const DATATYPE_MISMATCH: &str = "42804";
    /// A commit that lost its race to a concurrent writer after its retries: run it again.
    pub const SERIALIZATION_FAILURE: &str = "40001";
    /// Something PostgreSQL has and fragvec does not (yet).
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    /// A statement stopped by the client's cancel request or `statement_timeout`.
    pub const QUERY_CANCELED: &str = "57014";
    /// A value the statement cannot take (a vector of the wrong dimension, say).
    pub const DATA_EXCEPTION: &str = "22000";
    /// A setting or option given a value it does not take.
    pub const INVALID_PARAMETER_VALUE: &str = "22023";
    /// A division by zero.
    pub const DIVISION_BY_ZERO: &str = "22012";
    /// A statement that would change one row twice (MERGE with two matching source rows).
    pub const CARDINALITY_VIOLATION: &str = "21000";
    /// A schema that does not exist.
    pub const INVALID_SCHEMA_NAME: &str = "3F000";
    /// A prepared statement (SQL `EXECUTE` / `DEALLOCATE`) that does not exist.
    pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
    /// A statement over its memory budget.
    pub const OUT_OF_MEMORY: &str = "53200";
    /// A table file that fails its checksum or does not decode.
    pub const DATA_CORRUPTED: &str = "XX001";
    /// A bug: something fragvec does not expect of itself.
    pub const INTERNAL_ERROR: &str = "XX000";
    /// The object store failed a read or write.
    pub const IO_ERROR: &str = "58030";
    /// `BEGIN` inside a transaction block (a warning, as in PostgreSQL).
    pub const ACTIVE_SQL_TRANSACTION: &str = "25001";
    /// `COMMIT` / `ROLLBACK` outside a transaction block (a warning).
    pub const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
    /// A statement in a block an error failed: only `ROLLBACK` runs until then.
    pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
    /// A `ROLLBACK` of a block whose writes have already committed.
    pub const INVALID_TRANSACTION_TERMINATION: &str = "2D000";
    /// A message the protocol does not allow at that point.
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    /// A refused password or an unknown user.
    pub const INVALID_PASSWORD: &str = "28P01";
    /// More connections than `--max-connections`.
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    /// The server is shutting down (a connection closed by SIGTERM).
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    /// A file path outside what `--allow-files` allows.
    pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
    /// A NULL into a `NOT NULL` column.
    pub const NOT_NULL_VIOLATION: &str = "23502";
    /// A column named twice in a column list.
    pub const DUPLICATE_COLUMN: &str = "42701";
    /// A value's text that does not parse as its type.
    pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
}

/// An error as the client gets it.
pub fn error_info(sqlstate: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo::new("ERROR".into(), sqlstate.into(), message.into())
}

/// A client's error (its statement or values were wrong) as pgwire sends it.
pub fn user_error(e: ErrorInfo) -> PgWireError {
    PgWireError::UserError(Box::new(e))
}

/// A DataFusion error as the client gets it: its SQLSTATE and its message.
pub fn df_error(e: &DataFusionError) -> ErrorInfo {
    error_info(of(e), e.to_string())
}

/// The SQLSTATE of `e`.
pub fn of(e: &DataFusionError) -> &'static str {
    if let Some(state) = typed(e) {
        return state;
    }
    match e.find_root() {
        DataFusionError::SQL(..) => code::SYNTAX_ERROR,
        DataFusionError::NotImplemented(_) => code::FEATURE_NOT_SUPPORTED,
        DataFusionError::SchemaError(s, _) => match s.as_ref() {
            SchemaError::FieldNotFound { .. } => code::UNDEFINED_COLUMN,
            SchemaError::AmbiguousReference { .. } => code::AMBIGUOUS_COLUMN,
            _ => code::SYNTAX_OR_ACCESS_RULE,
        },
        DataFusionError::ResourcesExhausted(_) => code::OUT_OF_MEMORY,
        DataFusionError::IoError(_) | DataFusionError::ObjectStore(_) => code::IO_ERROR,
        DataFusionError::ArrowError(a, _) => match a.as_ref() {
            datafusion::arrow::error::ArrowError::DivideByZero => code::DIVISION_BY_ZERO,
            datafusion::arrow::error::ArrowError::CastError(_)
            | datafusion::arrow::error::ArrowError::ParseError(_) => "22P02",
            // A NULL into a NOT NULL column, as Arrow words it when INSERT builds its batch.
            datafusion::arrow::error::ArrowError::InvalidArgumentError(m)
                if m.contains("non-nullable but contains null") =>
            {
                code::NOT_NULL_VIOLATION
            }
            _ => code::DATA_EXCEPTION,
        },
        DataFusionError::Plan(m) => plan_state(m),
        DataFusionError::Execution(m) => {
            if m.contains("Divide by zero") {
                code::DIVISION_BY_ZERO
            } else if m.contains("already exists") {
                code::DUPLICATE_TABLE
            } else {
                missing_object_state(m).unwrap_or(code::DATA_EXCEPTION)
            }
        }
        DataFusionError::Internal(_) => code::INTERNAL_ERROR,
        _ => code::INTERNAL_ERROR,
    }
}

/// The SQLSTATE of DataFusion's execution error about a missing object (`DROP VIEW` /
/// `DROP TABLE` / `DROP SCHEMA` of a name that is not there, `EXECUTE` of a statement never
/// prepared), from DataFusion 55's wording.
fn missing_object_state(m: &str) -> Option<&'static str> {
    let missing = m.contains("doesn't exist") || m.contains("does not exist");
    if !missing {
        return None;
    }
    Some(if m.starts_with("Table '") || m.starts_with("View '") {
        code::UNDEFINED_TABLE
    } else if m.starts_with("Schema '") {
        code::INVALID_SCHEMA_NAME
    } else if m.starts_with("Prepared statement '") {
        code::INVALID_SQL_STATEMENT_NAME
    } else if m.starts_with("Function ") {
        code::UNDEFINED_FUNCTION
    } else {
        return None;
    })
}

/// The SQLSTATE of a planning error, from DataFusion's wording.
fn plan_state(m: &str) -> &'static str {
    let lower = m.to_ascii_lowercase();
    if lower.contains("table '")
        && (lower.contains("not found") || lower.contains("does not exist"))
        || lower.contains("no table named")
    {
        code::UNDEFINED_TABLE
    } else if lower.contains("invalid function") || lower.contains("no function matches") {
        code::UNDEFINED_FUNCTION
    } else if lower.contains("unsupported sql type") || lower.contains("unsupported ast") {
        code::FEATURE_NOT_SUPPORTED
    } else if lower.contains("already exists") {
        code::DUPLICATE_TABLE
    } else if lower.contains("cannot be cast") || lower.contains("coercion") {
        code::DATATYPE_MISMATCH
    } else {
        code::SYNTAX_OR_ACCESS_RULE
    }
}

/// The SQLSTATE of a fragvec layer's error anywhere in the chain.
fn typed(e: &DataFusionError) -> Option<&'static str> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(f) = err.downcast_ref::<FormatError>() {
            return Some(format_state(f));
        }
        if let Some(i) = err.downcast_ref::<IndexError>() {
            return Some(match i {
                IndexError::Format(f) => format_state(f),
                _ => code::DATA_EXCEPTION,
            });
        }
        current = match err.downcast_ref::<DataFusionError>() {
            // DataFusion's own chain: `Context`, `Shared`, `External`, ...
            Some(DataFusionError::External(inner)) => Some(inner.as_ref()),
            Some(DataFusionError::Context(_, inner)) => Some(inner.as_ref()),
            Some(DataFusionError::Shared(inner)) => Some(inner.as_ref()),
            Some(DataFusionError::Diagnostic(_, inner)) => Some(inner.as_ref()),
            _ => err.source(),
        };
    }
    None
}

fn format_state(f: &FormatError) -> &'static str {
    match f {
        FormatError::NotFound(_) => code::UNDEFINED_TABLE,
        FormatError::AlreadyExists(_) => code::DUPLICATE_TABLE,
        FormatError::VersionNotFound { .. } => code::INVALID_PARAMETER_VALUE,
        // The write's own check (`format::conform`), worded there.
        FormatError::InvalidInput(m) if m.contains("is NOT NULL but") => code::NOT_NULL_VIOLATION,
        FormatError::InvalidInput(_) => code::INVALID_PARAMETER_VALUE,
        FormatError::RowChangedTwice { .. } => code::CARDINALITY_VIOLATION,
        FormatError::Conflict { .. } => code::SERIALIZATION_FAILURE,
        FormatError::Corrupt { .. } => code::DATA_CORRUPTED,
        FormatError::UnknownFeature { .. } => code::FEATURE_NOT_SUPPORTED,
        _ => code::IO_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FragvecSession;

    async fn state_of(session: &FragvecSession, sql: &str) -> &'static str {
        of(&session.sql(sql).await.expect_err(sql))
    }

    /// The states clients test for, from the errors fragvec really gives.
    #[tokio::test]
    async fn states_of_real_errors() {
        let s = FragvecSession::open("memory://sqlstate-test")
            .await
            .unwrap();
        s.sql("CREATE TABLE t (id BIGINT, emb VECTOR(2))")
            .await
            .unwrap();
        assert_eq!(state_of(&s, "SELEC 1").await, code::SYNTAX_ERROR);
        assert_eq!(
            state_of(&s, "SELECT * FROM nope").await,
            code::UNDEFINED_TABLE
        );
        assert_eq!(
            state_of(&s, "SELECT nope FROM t").await,
            code::UNDEFINED_COLUMN
        );
        assert_eq!(
            state_of(&s, "SELECT no_such_fn(1)").await,
            code::UNDEFINED_FUNCTION
        );
        assert_eq!(
            state_of(&s, "CREATE TABLE t (id BIGINT)").await,
            code::DUPLICATE_TABLE
        );
        assert_eq!(
            state_of(&s, "DELETE FROM nope WHERE id = 1").await,
            code::UNDEFINED_TABLE
        );
        assert_eq!(state_of(&s, "SELECT 1 / 0").await, code::DIVISION_BY_ZERO);
        assert_eq!(state_of(&s, "DROP VIEW nope").await, code::UNDEFINED_TABLE);
        assert_eq!(
            state_of(&s, "EXECUTE never_prepared").await,
            code::INVALID_SQL_STATEMENT_NAME
        );
        s.sql("INSERT INTO t VALUES (1, [0, 0])").await.unwrap();
        assert_eq!(
            state_of(
                &s,
                "MERGE INTO t USING (VALUES (1), (1)) AS src(id) ON t.id = src.id \
                 WHEN MATCHED THEN DELETE"
            )
            .await,
            code::CARDINALITY_VIOLATION
        );
        s.sql("CREATE TABLE k (id BIGINT NOT NULL)").await.unwrap();
        assert_eq!(
            state_of(&s, "INSERT INTO k VALUES (NULL)").await,
            code::NOT_NULL_VIOLATION
        );
    }

    #[test]
    fn a_commit_conflict_is_a_serialization_failure() {
        let conflict = FormatError::Conflict {
            table: "t".into(),
            version: 3,
            reason: crate::format::commit::Conflict::FragmentRemoved {
                fragment: crate::ledger::ids::FragmentId(7),
            },
        };
        let e = DataFusionError::Context("statement 1".into(), Box::new(conflict.into()));
        assert_eq!(of(&e), code::SERIALIZATION_FAILURE);
    }
}

//! fragvec's errors as gRPC statuses: the class comes from the error's SQLSTATE (the same
//! classification the Postgres endpoint sends, [`crate::serve::sqlstate`]), the message is
//! fragvec's, and the SQLSTATE rides along in the `x-sqlstate` metadata for clients that
//! want the finer class.

use datafusion::common::DataFusionError;
use tonic::{Code, Status};

use crate::serve::sqlstate::{self, code};

/// The gRPC code of a SQLSTATE.
pub fn code_of(sqlstate: &str) -> Code {
    match sqlstate {
        code::UNDEFINED_TABLE | code::UNDEFINED_OBJECT => Code::NotFound,
        code::DUPLICATE_TABLE => Code::AlreadyExists,
        code::SERIALIZATION_FAILURE => Code::Aborted,
        code::QUERY_CANCELED => Code::Cancelled,
        code::FEATURE_NOT_SUPPORTED => Code::Unimplemented,
        code::INSUFFICIENT_PRIVILEGE => Code::PermissionDenied,
        code::OUT_OF_MEMORY => Code::ResourceExhausted,
        code::INTERNAL_ERROR | code::DATA_CORRUPTED => Code::Internal,
        code::IO_ERROR => Code::Unavailable,
        _ => Code::InvalidArgument,
    }
}

/// A status with `sqlstate`'s code, `message` and the SQLSTATE in its metadata.
pub fn with_sqlstate(sqlstate: &str, message: impl Into<String>) -> Status {
    let mut status = Status::new(code_of(sqlstate), message);
    if let Ok(value) = sqlstate.parse() {
        status.metadata_mut().insert("x-sqlstate", value);
    }
    status
}

/// `e` as the client gets it.
pub fn of(e: &DataFusionError) -> Status {
    with_sqlstate(sqlstate::of(e), e.to_string())
}

/// An Arrow error of a client's input (a batch that does not decode, a wrong type).
pub fn invalid_input(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_the_codes_clients_branch_on() {
        assert_eq!(code_of(code::UNDEFINED_TABLE), Code::NotFound);
        assert_eq!(code_of(code::SERIALIZATION_FAILURE), Code::Aborted);
        assert_eq!(code_of(code::QUERY_CANCELED), Code::Cancelled);
        assert_eq!(code_of(code::SYNTAX_ERROR), Code::InvalidArgument);
        assert_eq!(code_of(code::UNDEFINED_COLUMN), Code::InvalidArgument);
        let s = with_sqlstate(code::UNDEFINED_TABLE, "table 'x' not found");
        assert_eq!(s.metadata().get("x-sqlstate").unwrap(), "42P01");
        assert_eq!(s.message(), "table 'x' not found");
    }
}

//! Where the errors of the layers below become `DataFusionError`, once.
//!
//! * A [`FormatError`] becomes `DataFusionError::External(Box::new(e))`: the type survives the
//!   trip through DataFusion, so [`DataFusionError::find_root`] and a downcast recover it (the
//!   commit retry does, through [`Retryable`]), and the message prints as
//!   `External error: <the format error>`.
//! * A [`RewriteError`] that wraps a `FormatError` converts as that `FormatError`. A rewrite
//!   that cannot be planned (bad options: the user's fault) is a planning error,
//!   `Error during planning: cannot plan compaction: ...`, as `plan_err!` would build it.
//! * An [`IndexError`] that wraps a `FormatError` converts as that `FormatError`; the others
//!   (a query vector of the wrong dimension, an unknown index, a corrupt segment reference)
//!   stay typed as `External`.
//! * [`Retryable`] for `DataFusionError`: whether a statement may run again from a fresh read
//!   because a concurrent commit won ([`FormatError::is_retryable`] of the root error).
//!
//! The engine's own failures do not come through here: they are built where they happen with
//! DataFusion's macros, `plan_err!` (the statement is wrong), `exec_err!` (the data is), and
//! `internal_err!` (a broken invariant of fragvec).

use datafusion::common::{DataFusionError, plan_datafusion_err};

use crate::format::FormatError;
use crate::format::commit::retry::Retryable;
use crate::index::IndexError;
use crate::rewrite::RewriteError;

impl From<FormatError> for DataFusionError {
    fn from(e: FormatError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

impl From<RewriteError> for DataFusionError {
    fn from(e: RewriteError) -> Self {
        match e {
            RewriteError::Format(f) => f.into(),
            RewriteError::Index(i) => i.into(),
            plan @ RewriteError::Plan(_) => plan_datafusion_err!("{plan}"),
            other @ (RewriteError::KeyEvaluation { .. } | RewriteError::FilterNotBoolean) => {
                DataFusionError::External(Box::new(other))
            }
        }
    }
}

impl From<IndexError> for DataFusionError {
    fn from(e: IndexError) -> Self {
        match e {
            // A file-level error keeps its own type (a commit conflict stays recognisable).
            IndexError::Format(f) => f.into(),
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

impl Retryable for DataFusionError {
    /// Whether the root of the error is a commit conflict the statement may retry.
    fn is_retryable(&self) -> bool {
        match self.find_root() {
            DataFusionError::External(inner) => inner
                .downcast_ref::<FormatError>()
                .is_some_and(FormatError::is_retryable),
            _ => false,
        }
    }
}

/// Whether an error is a commit conflict the statement may retry (see [`Retryable`]).
pub fn is_retryable(e: &DataFusionError) -> bool {
    Retryable::is_retryable(e)
}

/// The error of a statement whose commit still lost a race after `retries` retries, saying
/// so and what to do next; any other error unchanged. It stays a commit conflict underneath
/// (retryable, SQLSTATE 40001 on the server): only its message gains the first line.
pub fn after_retries(e: DataFusionError, retries: usize) -> DataFusionError {
    if !is_retryable(&e) {
        return e;
    }
    DataFusionError::Context(
        format!(
            "the commit lost to concurrent writers {} time(s) (fragvec.commit_retries = \
             {retries}); run the statement again, or raise fragvec.commit_retries when writers \
             of this table often race",
            retries + 1
        ),
        Box::new(e),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> FormatError {
        FormatError::Conflict {
            table: "t".into(),
            version: 3,
            reason: crate::format::commit::Conflict::FragmentRemoved {
                fragment: crate::ledger::ids::FragmentId(7),
            },
        }
    }

    #[test]
    fn format_errors_keep_their_type_and_text() {
        let e = DataFusionError::from(conflict());
        assert_eq!(e.to_string(), format!("External error: {}", conflict()));
        let DataFusionError::External(inner) = e.find_root() else {
            panic!("{e:?}");
        };
        assert!(inner.downcast_ref::<FormatError>().is_some());
    }

    #[test]
    fn conflicts_are_retryable_through_context() {
        let e = DataFusionError::Context("statement 2".into(), Box::new(conflict().into()));
        assert!(is_retryable(&e));
        let rewrite: DataFusionError = RewriteError::Format(conflict()).into();
        assert!(is_retryable(&rewrite));
        assert!(!is_retryable(&FormatError::NotFound("t".into()).into()));
        assert!(!is_retryable(&plan_datafusion_err!("no")));
    }

    #[test]
    fn a_conflict_after_its_retries_says_how_many_and_what_next() {
        let e = after_retries(conflict().into(), 3);
        let text = e.to_string();
        assert!(
            text.starts_with("the commit lost to concurrent writers 4 time(s)"),
            "{text}"
        );
        assert!(text.contains("fragvec.commit_retries = 3"), "{text}");
        assert!(text.contains(&conflict().to_string()), "{text}");
        assert!(is_retryable(&e), "still a conflict underneath");
        let other: DataFusionError = FormatError::NotFound("t".into()).into();
        let text = other.to_string();
        assert_eq!(after_retries(other, 3).to_string(), text);
    }

    #[test]
    fn rewrite_plan_errors_are_planning_errors() {
        let e: DataFusionError =
            RewriteError::Plan(crate::rewrite::plan::PlanError::ZeroTargetRows).into();
        assert_eq!(
            e.to_string(),
            "Error during planning: cannot plan compaction: target_rows_per_fragment must be positive"
        );
    }
}

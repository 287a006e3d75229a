//! Rewrites that keep indexes: compaction (order-preserving) and recluster (a stable
//! partition). Planning is pure ([`plan`]); execution reads the sources in logical order,
//! writes the outputs, and commits one transaction whose rewrites are spliced in place of
//! their sources and recorded in the reuse ledger, so index segments are translated rather
//! than rebuilt.

pub mod compact;
pub mod plan;

use crate::format::FormatError;

/// Errors of a rewrite.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("cannot plan compaction: {0}")]
    Plan(#[from] plan::PlanError),
    #[error(transparent)]
    Format(#[from] FormatError),
}

impl RewriteError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, RewriteError::Format(e) if e.is_retryable())
    }
}

impl From<RewriteError> for datafusion::error::DataFusionError {
    fn from(e: RewriteError) -> Self {
        match e {
            RewriteError::Format(f) => f.into(),
            other => datafusion::error::DataFusionError::Plan(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, RewriteError>;

//! COMPACT, RECLUSTER and VACUUM: one attempt each, on the table's latest version (the
//! session retries them on a commit conflict). The work is in
//! [`crate::engine::maintenance`] and [`crate::engine::recluster`]; each returns one row of
//! figures.

use std::time::Duration;

use datafusion::common::Result;

use crate::engine::session::{FragvecSession, StatementResult};
use crate::engine::{maintenance, recluster};

/// `COMPACT table [WITH (options)]`
pub async fn compact(
    session: &FragvecSession,
    table: &str,
    options: &[(String, String)],
) -> Result<StatementResult> {
    let snapshot = session.latest_snapshot(table).await?;
    Ok(StatementResult::one_row(
        maintenance::run_compact(&snapshot, options, &session.progress()).await?,
    ))
}

/// `RECLUSTER table [BY (keys)] [WITH (options)] [WHERE filter]`
pub async fn recluster(
    session: &FragvecSession,
    table: &str,
    keys: &[String],
    options: &[(String, String)],
    filter: Option<&str>,
) -> Result<StatementResult> {
    let snapshot = session.latest_snapshot(table).await?;
    let batch = recluster::run_recluster(
        &session.ctx.state(),
        &snapshot,
        keys,
        options,
        filter,
        session.schema.index_cache(),
    )
    .await?;
    Ok(StatementResult::one_row(batch))
}

/// `VACUUM table [RETAIN n VERSIONS]`, keeping files younger than `fragvec.vacuum_grace_seconds`.
pub async fn vacuum(
    session: &FragvecSession,
    table: &str,
    retain_versions: Option<u64>,
) -> Result<StatementResult> {
    let grace = Duration::from_secs(session.options().vacuum_grace_seconds);
    let snapshot = session.latest_snapshot(table).await?;
    Ok(StatementResult::one_row(
        maintenance::run_vacuum(&snapshot, retain_versions, grace, &session.progress()).await?,
    ))
}

//! CREATE VECTOR INDEX, DROP INDEX and OPTIMIZE INDEX: one attempt each, on the table's
//! latest version (the session retries them on a commit conflict). The work is in
//! [`crate::engine::index_ops`].

use datafusion::common::Result;

use crate::engine::index_ops;
use crate::engine::session::{FragvecSession, StatementResult};
use crate::sql::OptimizeAction;

/// `CREATE VECTOR INDEX name ON table (column) USING kind [WITH (options)]`
pub async fn create(
    session: &FragvecSession,
    name: &str,
    table: &str,
    column: &str,
    kind: &str,
    options: &[(String, String)],
) -> Result<StatementResult> {
    let snapshot = session.latest_snapshot(table).await?;
    let progress = session.progress();
    let budget = session.options().index_cache_bytes;
    StatementResult::count(
        index_ops::create(snapshot, name, column, kind, options, budget, &progress).await?,
    )
}

/// `DROP INDEX [IF EXISTS] name ON table`
pub async fn drop(
    session: &FragvecSession,
    name: &str,
    table: &str,
    if_exists: bool,
) -> Result<StatementResult> {
    let snapshot = session.latest_snapshot(table).await?;
    StatementResult::count(index_ops::drop(snapshot, name, if_exists).await?)
}

/// `OPTIMIZE INDEX name ON table [APPEND | MERGE n | RETRAIN]`
pub async fn optimize(
    session: &FragvecSession,
    name: &str,
    table: &str,
    action: OptimizeAction,
) -> Result<StatementResult> {
    let snapshot = session.latest_snapshot(table).await?;
    let cache = session.schema.index_cache();
    let progress = session.progress();
    let budget = session.options().index_cache_bytes;
    StatementResult::count(
        index_ops::optimize(snapshot, name, action, cache, budget, &progress).await?,
    )
}

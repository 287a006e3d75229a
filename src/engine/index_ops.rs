//! CREATE VECTOR INDEX, DROP INDEX and OPTIMIZE INDEX statements: options parsed from SQL,
//! then one call into [`crate::index::optimize`], which builds and commits.

use std::sync::Arc;

use datafusion::common::{Result, plan_datafusion_err, plan_err};

use crate::format::index_meta::IndexKind;
use crate::format::progress::Progress;
use crate::format::{self, FormatError, Snapshot};
use crate::index::cache::IndexCache;
use crate::index::distance::Metric;
use crate::index::optimize::{self as index_optimize, BuildOptions, Optimize};
use crate::sql::OptimizeAction;

/// Parses `WITH (...)` of `CREATE VECTOR INDEX ... USING kind`.
fn build_options(kind: &str, options: &[(String, String)]) -> Result<(BuildOptions, Option<u32>)> {
    let mut o = BuildOptions::default();
    let mut num_sub_vectors = None;
    let number = |k: &str, v: &str| -> Result<usize> {
        v.parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| plan_datafusion_err!("{k} must be a positive integer, not '{v}'"))
    };
    for (key, value) in options {
        match key.as_str() {
            "metric" => {
                o.metric = Metric::parse(value).ok_or_else(|| {
                    plan_datafusion_err!("metric must be 'l2', 'cosine' or 'dot', not '{value}'")
                })?
            }
            "num_partitions" => o.num_partitions = Some(number(key, value)?),
            "sample_size" => o.sample_size = Some(number(key, value)?),
            "num_sub_vectors" if kind == "IVF_PQ" => {
                num_sub_vectors = Some(number(key, value)? as u32)
            }
            other => {
                return plan_err!(
                    "unknown option '{other}' for {kind} (known: metric, num_partitions, sample_size{})",
                    if kind == "IVF_PQ" {
                        ", num_sub_vectors"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    Ok((o, num_sub_vectors))
}

/// `CREATE VECTOR INDEX name ON t (column) USING kind WITH (...)`; returns the rows indexed.
/// The build holds at most about `memory_budget_bytes` (the session's
/// `fragvec.index_cache_bytes`) of vectors.
pub async fn create(
    snapshot: Snapshot,
    name: &str,
    column: &str,
    kind: &str,
    options: &[(String, String)],
    memory_budget_bytes: usize,
    progress: &Progress,
) -> Result<u64> {
    let (mut opts, num_sub_vectors) = build_options(kind, options)?;
    opts.memory_budget_bytes = Some(memory_budget_bytes);
    let kind = match kind {
        "IVF_FLAT" => IndexKind::IvfFlat,
        "IVF_SQ" => IndexKind::IvfSq,
        "IVF_PQ" => IndexKind::IvfPq {
            num_sub_vectors: num_sub_vectors
                .ok_or_else(|| plan_datafusion_err!("IVF_PQ needs WITH (num_sub_vectors = m)"))?,
        },
        other => return plan_err!("unknown index type {other} (use IVF_FLAT, IVF_SQ or IVF_PQ)"),
    };
    Ok(index_optimize::create(&snapshot, name, column, kind, &opts, progress).await?)
}

/// `DROP INDEX [IF EXISTS] name ON t`.
pub async fn drop(snapshot: Snapshot, name: &str, if_exists: bool) -> Result<u64> {
    index_optimize::drop(&snapshot, name, if_exists).await?;
    Ok(0)
}

/// `OPTIMIZE INDEX name ON t [APPEND | MERGE n | RETRAIN]`; returns the rows written into
/// new segments. A RETRAIN holds at most about `memory_budget_bytes` of vectors.
pub async fn optimize(
    snapshot: Snapshot,
    name: &str,
    action: OptimizeAction,
    cache: &IndexCache,
    memory_budget_bytes: usize,
    progress: &Progress,
) -> Result<u64> {
    let action = match action {
        OptimizeAction::Append => Optimize::Append,
        OptimizeAction::Merge(n) => Optimize::Merge(n),
        OptimizeAction::Retrain => Optimize::Retrain,
    };
    Ok(index_optimize::optimize(
        snapshot,
        name,
        action,
        cache,
        Some(memory_budget_bytes),
        progress,
    )
    .await?)
}

/// The latest snapshot of a table, or "table does not exist".
pub async fn latest(db: &format::Database, table: &str) -> Result<Snapshot> {
    let dir = Arc::new(db.table(table)?);
    match dir.latest().await {
        Ok(s) => Ok(s),
        Err(FormatError::NotFound(t)) => plan_err!("table '{t}' does not exist"),
        Err(e) => Err(e.into()),
    }
}

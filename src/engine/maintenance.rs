//! Table maintenance statements: `COMPACT` and `VACUUM`.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{Result, plan_datafusion_err, plan_err};

use crate::format::Snapshot;
use crate::format::progress::Progress;
use crate::format::vacuum::{VacuumMetrics, vacuum};
use crate::rewrite::compact::{CompactionMetrics, compact};
use crate::rewrite::plan::CompactionOptions;

/// Parses `COMPACT ... WITH (...)` options over the table's defaults.
pub fn compaction_options(
    snapshot: &Snapshot,
    options: &[(String, String)],
) -> Result<CompactionOptions> {
    let max_rows = snapshot.manifest.properties.max_rows_per_fragment;
    let mut out = CompactionOptions {
        max_rows_per_fragment: max_rows,
        target_rows_per_fragment: max_rows,
        ..Default::default()
    };
    let int = |key: &str, value: &str| {
        value.parse::<u64>().map_err(|_| {
            plan_datafusion_err!(
                "COMPACT option {key} must be a non-negative integer, got '{value}'"
            )
        })
    };
    for (key, value) in options {
        match key.as_str() {
            "target_rows_per_fragment" => out.target_rows_per_fragment = int(key, value)?,
            "max_source_fragments" => out.max_source_fragments = Some(int(key, value)? as usize),
            "max_source_rows" => out.max_source_rows = Some(int(key, value)?),
            "deletion_threshold" => {
                out.deletion_threshold = value.parse::<f64>().map_err(|_| {
                    plan_datafusion_err!(
                        "COMPACT option deletion_threshold must be a number, got '{value}'"
                    )
                })?
            }
            other => {
                return plan_err!(
                    "unknown COMPACT option '{other}' (expected target_rows_per_fragment, \
                     max_source_fragments, max_source_rows or deletion_threshold)"
                );
            }
        }
    }
    out.validate()
        .map_err(|e| plan_datafusion_err!("COMPACT: {e}"))?;
    Ok(out)
}

/// One compaction run over the latest version; the caller retries on conflicts.
pub async fn run_compact(
    snapshot: &Snapshot,
    options: &[(String, String)],
    progress: &Progress,
) -> Result<RecordBatch> {
    let opts = compaction_options(snapshot, options)?;
    let (_, m) = compact(snapshot, &opts, progress).await?;
    compaction_batch(&m)
}

/// The columns of `COMPACT`'s one-row report.
pub const COMPACT_COLUMNS: [&str; 4] = [
    "fragments_removed",
    "fragments_added",
    "rows_rewritten",
    "version",
];

/// The columns of `VACUUM`'s one-row report.
pub const VACUUM_COLUMNS: [&str; 3] = ["versions_removed", "files_removed", "bytes_removed"];

/// `COMPACT`'s one-row report.
pub fn compaction_batch(m: &CompactionMetrics) -> Result<RecordBatch> {
    u64_row(
        &COMPACT_COLUMNS,
        &[
            m.fragments_removed,
            m.fragments_added,
            m.rows_rewritten,
            m.version,
        ],
    )
}

/// Runs `VACUUM` on the table of `snapshot` (keeping `retain` versions, files younger than
/// `grace`); gives its one-row report.
pub async fn run_vacuum(
    snapshot: &Snapshot,
    retain: Option<u64>,
    grace: std::time::Duration,
    progress: &Progress,
) -> Result<RecordBatch> {
    let VacuumMetrics {
        versions_removed,
        files_removed,
        bytes_removed,
    } = vacuum(&snapshot.dir, retain, grace, progress).await?;
    u64_row(
        &VACUUM_COLUMNS,
        &[versions_removed, files_removed, bytes_removed],
    )
}

/// Non-null `UInt64` columns named `names`: the schema of a maintenance statement's report.
pub fn u64_schema(names: &[&str]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::UInt64, false))
            .collect::<Vec<_>>(),
    ))
}

/// One row of `UInt64` columns `names` holding `values`.
pub fn u64_row(names: &[&str], values: &[u64]) -> Result<RecordBatch> {
    debug_assert_eq!(names.len(), values.len());
    let columns = values
        .iter()
        .map(|v| Arc::new(UInt64Array::from(vec![*v])) as _)
        .collect();
    Ok(RecordBatch::try_new(u64_schema(names), columns)?)
}

//! Gathering DELETE, UPDATE and MERGE changes from their finder queries.
//!
//! The front end turns each statement into a *finder* query over a pinned snapshot, which
//! DataFusion plans and runs like any SELECT (so subqueries, joins and casts all work). The
//! finder yields one row per affected target row: its row address, its row id, what to do with
//! it, and the new values. [`collect_changes`] reads those rows into
//! [`crate::format::changes::RowChanges`], which the format layer turns into one
//! transaction.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{SchemaRef, UInt64Type};
use datafusion::common::{Result, internal_datafusion_err, internal_err};
use futures::StreamExt;

use crate::format::changes::RowChanges;
use crate::format::conform::conform_batch;
use crate::sql::finder::{ACTION, ADDR, Action, ROWID};

/// Reads finder batches: `ADDR`, `ROWID`, optional `ACTION` (rows without it are
/// `default_action`), then the table's columns when the action carries values.
pub async fn collect_changes(
    mut finder: datafusion::execution::SendableRecordBatchStream,
    table_schema: &SchemaRef,
    default_action: Action,
) -> Result<RowChanges> {
    let mut changes = RowChanges::default();
    while let Some(batch) = finder.next().await {
        let batch = batch?;
        let addr = column(&batch, ADDR)?;
        let addr = addr.as_primitive::<UInt64Type>();
        let rowid = column(&batch, ROWID)?;
        let rowid = rowid.as_primitive::<UInt64Type>();
        let action = batch.column_by_name(ACTION).cloned();
        let values = table_schema
            .fields()
            .iter()
            .map(|f| batch.column_by_name(f.name()).cloned())
            .collect::<Option<Vec<_>>>();
        let mut take_update = Vec::new();
        let mut take_insert = Vec::new();
        for i in 0..batch.num_rows() {
            let act = match &action {
                None => default_action,
                Some(a) => {
                    let a = a.as_string::<i32>();
                    if a.is_null(i) {
                        continue;
                    }
                    Action::from_code(a.value(i))?
                }
            };
            match act {
                Action::Delete => changes.deleted.push(addr.value(i)),
                Action::Update => {
                    changes.updated_addrs.push(addr.value(i));
                    changes.updated_ids.push(rowid.value(i));
                    take_update.push(i as u64);
                }
                Action::Insert => take_insert.push(i as u64),
            }
        }
        for (take, out) in [
            (take_update, &mut changes.updated_rows),
            (take_insert, &mut changes.inserted_rows),
        ] {
            if take.is_empty() {
                continue;
            }
            let Some(values) = &values else {
                return internal_err!("finder lacks the table's columns");
            };
            let indices = datafusion::arrow::array::UInt64Array::from(take);
            let cols = values
                .iter()
                .map(|c| datafusion::arrow::compute::take(c.as_ref(), &indices, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let raw = RecordBatch::try_new(
                Arc::new(datafusion::arrow::datatypes::Schema::new(
                    table_schema
                        .fields()
                        .iter()
                        .zip(&cols)
                        .map(|(f, c)| {
                            f.as_ref()
                                .clone()
                                .with_data_type(c.data_type().clone())
                                .with_nullable(true)
                        })
                        .collect::<Vec<_>>(),
                )),
                cols,
            )?;
            out.push(conform_batch(&raw, table_schema)?);
        }
    }
    changes.check_single_match()?;
    Ok(changes)
}

fn column(batch: &RecordBatch, name: &str) -> Result<Arc<dyn Array>> {
    batch
        .column_by_name(name)
        .cloned()
        .ok_or_else(|| internal_datafusion_err!("finder lacks column {name}"))
}

//! Applying DELETE, UPDATE and MERGE.
//!
//! The front end turns each statement into a *finder* query over a pinned snapshot, which
//! DataFusion plans and runs like any SELECT (so subqueries, joins and casts all work). The
//! finder yields one row per affected target row: its row address, its row id, what to do with
//! it, and the new values. This module turns those rows into a transaction: deletion vectors,
//! appended fragments (`rewrite_rows`), or in-place column files (`rewrite_columns`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::{concat_batches, interleave};
use datafusion::arrow::datatypes::{SchemaRef, UInt64Type};
use datafusion::common::{Result, exec_err, internal_datafusion_err, internal_err};
use futures::StreamExt;
use roaring::RoaringBitmap;

use super::options::UpdateMode;
use super::write::conform_batch;
use crate::format::fragment_io::write_column_file;
use crate::format::rowids::RowIdSequence;
use crate::format::{
    self, FormatError, NewFragment, NewRowIds, Operation, Snapshot, Transaction, read_fragment,
};
use crate::ledger::ids::split_row_address;
use crate::sql::finder::{ACTION, ADDR, Action, ROWID};

/// The rows a statement changes, gathered from its finder.
#[derive(Default)]
pub struct RowChanges {
    deleted: Vec<u64>,
    updated_addrs: Vec<u64>,
    updated_ids: Vec<u64>,
    updated_rows: Vec<RecordBatch>,
    inserted_rows: Vec<RecordBatch>,
}

impl RowChanges {
    pub fn count(&self) -> u64 {
        (self.deleted.len()
            + self.updated_addrs.len()
            + self
                .inserted_rows
                .iter()
                .map(|b| b.num_rows())
                .sum::<usize>()) as u64
    }

    /// Reads finder batches: `ADDR`, `ROWID`, optional `ACTION` (rows without it are
    /// `default_action`), then the table's columns when the action carries values.
    pub async fn collect(
        mut finder: datafusion::execution::SendableRecordBatchStream,
        table_schema: &SchemaRef,
        default_action: Action,
    ) -> Result<Self> {
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

    /// A target row may be changed once per statement (MERGE's cardinality rule).
    fn check_single_match(&self) -> Result<()> {
        let mut seen = roaring::RoaringTreemap::new();
        for &a in self.deleted.iter().chain(&self.updated_addrs) {
            if !seen.insert(a) {
                let (frag, offset) = split_row_address(a);
                return exec_err!(
                    "a target row (fragment {frag}, offset {offset}) matches more than one source \
                     row; MERGE may change each target row at most once"
                );
            }
        }
        Ok(())
    }

    /// Builds and commits the transaction. Returns the number of rows changed.
    pub async fn commit(
        self,
        snapshot: &Snapshot,
        operation: Operation,
        mode: UpdateMode,
        assigned_columns: &[String],
    ) -> Result<u64> {
        let count = self.count();
        let mut txn = Transaction::new(operation, snapshot.version());
        let mut deletions: BTreeMap<u64, RoaringBitmap> = BTreeMap::new();
        let mut delete = |addr: u64| {
            let (frag, offset) = split_row_address(addr);
            deletions.entry(frag).or_default().insert(offset as u32);
        };
        self.deleted.iter().copied().for_each(&mut delete);
        let stable = snapshot.manifest.properties.stable_row_ids;
        if !self.updated_addrs.is_empty() {
            match mode {
                UpdateMode::RewriteRows => {
                    self.updated_addrs.iter().copied().for_each(&mut delete);
                    // New versions are appended in the logical order of the rows they replace,
                    // whatever order the (possibly parallel) finder produced them in.
                    let (rows, ids) = in_logical_order(
                        snapshot,
                        &self.updated_addrs,
                        &self.updated_ids,
                        &self.updated_rows,
                    )?;
                    let written = write_batches(snapshot, vec![rows]).await?;
                    let mut start = 0u64;
                    for w in written {
                        let row_ids = if stable {
                            let ids = &ids[start as usize..(start + w.physical_rows) as usize];
                            NewRowIds::Given(RowIdSequence::from_ids(ids.iter().copied()))
                        } else {
                            NewRowIds::Fresh
                        };
                        start += w.physical_rows;
                        txn.appends.push(NewFragment {
                            written: w,
                            row_ids,
                        });
                    }
                }
                UpdateMode::RewriteColumns => {
                    txn.column_rewrites = rewrite_columns(
                        snapshot,
                        &self.updated_addrs,
                        &self.updated_rows,
                        assigned_columns,
                    )
                    .await?;
                }
            }
        }
        for w in write_batches(snapshot, self.inserted_rows).await? {
            txn.appends.push(NewFragment {
                written: w,
                row_ids: NewRowIds::Fresh,
            });
        }
        txn.deletions = deletions;
        if !txn.is_empty() {
            format::commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
        }
        Ok(count)
    }
}

/// Reorders updated rows (and their ids) by the logical position of the rows they replace:
/// fragment position in the manifest, then offset.
fn in_logical_order(
    snapshot: &Snapshot,
    addrs: &[u64],
    ids: &[u64],
    rows: &[RecordBatch],
) -> Result<(RecordBatch, Vec<u64>)> {
    let position: HashMap<u64, usize> = snapshot
        .manifest
        .fragments
        .iter()
        .enumerate()
        .map(|(i, f)| (f.id, i))
        .collect();
    let key = |addr: u64| {
        let (frag, offset) = split_row_address(addr);
        (position.get(&frag).copied().unwrap_or(usize::MAX), offset)
    };
    let mut order: Vec<usize> = (0..addrs.len()).collect();
    order.sort_by_key(|&i| key(addrs[i]));
    let all = concat_batches(&snapshot.schema, rows)?;
    let indices =
        datafusion::arrow::array::UInt64Array::from_iter_values(order.iter().map(|&i| i as u64));
    let sorted = datafusion::arrow::compute::take_record_batch(&all, &indices)?;
    Ok((sorted, order.iter().map(|&i| ids[i]).collect()))
}

fn column(batch: &RecordBatch, name: &str) -> Result<Arc<dyn Array>> {
    batch
        .column_by_name(name)
        .cloned()
        .ok_or_else(|| internal_datafusion_err!("finder lacks column {name}"))
}

async fn write_batches(
    snapshot: &Snapshot,
    batches: Vec<RecordBatch>,
) -> Result<Vec<format::WrittenFragment>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(vec![]);
    }
    let stream = futures::stream::iter(batches.into_iter().map(Ok::<_, FormatError>));
    Ok(format::write_fragments(
        &snapshot.dir,
        &snapshot.schema,
        stream,
        snapshot.manifest.properties.max_rows_per_fragment,
    )
    .await?)
}

/// Writes, for every fragment with updated rows, one new file holding the assigned columns of
/// all its physical rows: the new values where a row was updated, the old ones elsewhere.
async fn rewrite_columns(
    snapshot: &Snapshot,
    addrs: &[u64],
    new_rows: &[RecordBatch],
    assigned: &[String],
) -> Result<BTreeMap<u64, format::manifest::DataFile>> {
    let indices: Vec<usize> = assigned
        .iter()
        .map(|c| snapshot.schema.index_of(c))
        .collect::<std::result::Result<_, _>>()?;
    let columns = Arc::new(snapshot.schema.project(&indices)?);
    let new_values = concat_batches(&snapshot.schema, new_rows)?.project(&indices)?;
    let mut by_fragment: BTreeMap<u64, HashMap<u64, usize>> = BTreeMap::new();
    for (row, &addr) in addrs.iter().enumerate() {
        let (frag, offset) = split_row_address(addr);
        by_fragment.entry(frag).or_default().insert(offset, row);
    }
    let mut files = BTreeMap::new();
    for (frag_id, updates) in by_fragment {
        let fragment = snapshot
            .manifest
            .fragment(frag_id)
            .ok_or_else(|| internal_datafusion_err!("updated row in unknown fragment {frag_id}"))?;
        let mut old = read_fragment(snapshot.dir.clone(), fragment, columns.clone(), 8192);
        let mut out = Vec::new();
        let mut offset = 0u64;
        while let Some(batch) = old.next().await {
            let batch = batch?;
            let picks: Vec<(usize, usize)> = (0..batch.num_rows())
                .map(|i| match updates.get(&(offset + i as u64)) {
                    Some(&row) => (1, row),
                    None => (0, i),
                })
                .collect();
            let arrays = (0..columns.fields().len())
                .map(|c| {
                    interleave(
                        &[batch.column(c).as_ref(), new_values.column(c).as_ref()],
                        &picks,
                    )
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            out.push(RecordBatch::try_new(columns.clone(), arrays)?);
            offset += batch.num_rows() as u64;
        }
        let (file, rows) = write_column_file(&snapshot.dir, out, &columns).await?;
        if rows != fragment.physical_rows {
            return internal_err!(
                "column rewrite of fragment {frag_id} wrote {rows} of {} rows",
                fragment.physical_rows
            );
        }
        files.insert(frag_id, file);
    }
    Ok(files)
}

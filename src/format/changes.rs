//! Row changes of DELETE, UPDATE and MERGE, turned into one transaction.
//!
//! The engine runs each statement's *finder* query and gathers the affected rows into
//! [`RowChanges`]: addresses to delete, updated rows (address, row id, new values) and
//! inserted rows. [`RowChanges::commit`] writes what the update mode needs and commits:
//! * deletion vectors for deleted rows;
//! * `rewrite_rows`: the updated rows' old versions deleted and their new versions appended at
//!   the end, in the logical order of the rows they replace (same row id under stable ids);
//! * `rewrite_columns`: per fragment with updated rows, one new file holding the assigned
//!   columns of all its physical rows (same fragment ids, same row addresses);
//! * inserted rows appended as new fragments with fresh row ids.
//!
//! A target row may be changed once per statement (MERGE's cardinality rule): a second
//! change is [`FormatError::InvalidInput`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::{concat_batches, interleave};
use futures::StreamExt;
use roaring::RoaringBitmap;

use super::error::{FormatError, Result};
use super::fragment_io::{WrittenFragment, write_column_file, write_fragments};
use super::manifest::{DataFile, Operation};
use super::rowids::RowIdSequence;
use super::store::Snapshot;
use super::{NewFragment, NewRowIds, Transaction, read_fragment};
use crate::ledger::ids::split_row_address;

/// How UPDATE (and MERGE's matched updates) store new values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UpdateMode {
    /// Delete the old rows and append their new versions (same row id under stable row ids).
    #[default]
    RewriteRows,
    /// Rewrite only the changed columns of the affected fragments in place: same fragment
    /// ids, same row addresses.
    RewriteColumns,
}

/// The rows a statement changes.
#[derive(Debug, Default)]
pub struct RowChanges {
    /// Addresses of deleted rows.
    pub deleted: Vec<u64>,
    /// Addresses of updated rows, their row ids, and their new values (table schema, in the
    /// same order, across the batches).
    pub updated_addrs: Vec<u64>,
    /// Row ids of the updated rows, one per entry of `updated_addrs`, in the same order.
    pub updated_ids: Vec<u64>,
    /// New values of the updated rows (table schema): across the batches, one row per
    /// entry of `updated_addrs`, in the same order.
    pub updated_rows: Vec<RecordBatch>,
    /// New rows (table schema).
    pub inserted_rows: Vec<RecordBatch>,
}

impl RowChanges {
    /// Rows changed: deleted, updated and inserted.
    pub fn count(&self) -> u64 {
        (self.deleted.len()
            + self.updated_addrs.len()
            + self
                .inserted_rows
                .iter()
                .map(|b| b.num_rows())
                .sum::<usize>()) as u64
    }

    /// A target row may be changed once per statement (MERGE's cardinality rule).
    pub fn check_single_match(&self) -> Result<()> {
        let mut seen = roaring::RoaringTreemap::new();
        for &a in self.deleted.iter().chain(&self.updated_addrs) {
            if !seen.insert(a) {
                let (fragment, offset) = split_row_address(a);
                return Err(FormatError::RowChangedTwice { fragment, offset });
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
                    for &addr in &self.updated_addrs {
                        let (frag, offset) = split_row_address(addr);
                        txn.updated_in_place
                            .entry(frag)
                            .or_default()
                            .insert(offset as u32);
                    }
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
            super::commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
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

async fn write_batches(
    snapshot: &Snapshot,
    batches: Vec<RecordBatch>,
) -> Result<Vec<WrittenFragment>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(vec![]);
    }
    let stream = futures::stream::iter(batches.into_iter().map(Ok::<_, FormatError>));
    write_fragments(
        &snapshot.dir,
        &snapshot.schema,
        stream,
        snapshot.manifest.properties.max_rows_per_fragment,
    )
    .await
}

/// Writes, for every fragment with updated rows, one new file holding the assigned columns of
/// all its physical rows: the new values where a row was updated, the old ones elsewhere.
async fn rewrite_columns(
    snapshot: &Snapshot,
    addrs: &[u64],
    new_rows: &[RecordBatch],
    assigned: &[String],
) -> Result<BTreeMap<u64, DataFile>> {
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
        let fragment = snapshot.manifest.fragment(frag_id).ok_or_else(|| {
            FormatError::invalid(format!("updated row in unknown fragment {frag_id}"))
        })?;
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
            return Err(FormatError::invalid(format!(
                "column rewrite of fragment {frag_id} wrote {rows} of {} rows",
                fragment.physical_rows
            )));
        }
        files.insert(frag_id, file);
    }
    Ok(files)
}

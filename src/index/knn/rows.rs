//! Reading rows by address: the k rows of a KNN answer, or the vectors of rows to re-rank.
//!
//! Small fixed-width columns come from whole decoded columns kept in the index cache (k
//! lookups instead of decoding pages); the other columns are read page by page with the
//! offsets pushed down. An address outside its fragment or table is an error naming it
//! (a corrupt index), never a wrong row.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use datafusion::arrow::array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, RecordBatchOptions, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::{StreamExt, TryStreamExt};

use super::{Counters, KnnAnswer};
use crate::format::fragment_io::read_fragment_rows;
use crate::format::manifest::{ROW_ADDR, ROW_ID};
use crate::format::ranges::CONCURRENT_REQUESTS;
use crate::format::{Fragment, Snapshot, read_fragment};
use crate::index::cache::IndexCache;
use crate::index::error::{IndexError, Result};
use crate::ledger::ids::{row_address, split_row_address};

/// Reads rows of one snapshot by address, through the cache.
pub struct RowReader<'a> {
    /// The table version read.
    pub snapshot: &'a Snapshot,
    /// The cache holding decoded columns.
    pub cache: &'a IndexCache,
    /// Counts data fragments read.
    pub fragments_read: &'a AtomicUsize,
}

impl<'a> RowReader<'a> {
    /// Groups addresses by fragment (in manifest order), offsets sorted and distinct.
    pub fn by_fragment(&self, addrs: &[u64]) -> Result<Vec<(&'a Fragment, Vec<u64>)>> {
        let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for a in addrs {
            let (frag, offset) = split_row_address(*a);
            groups.entry(frag).or_default().push(offset);
        }
        let mut out = Vec::with_capacity(groups.len());
        for fragment in &self.snapshot.manifest.fragments {
            if let Some(mut offsets) = groups.remove(&fragment.id) {
                offsets.sort_unstable();
                offsets.dedup();
                out.push((fragment, offsets));
            }
        }
        if let Some(id) = groups.keys().next() {
            return Err(IndexError::UnknownFragment { fragment: *id });
        }
        Ok(out)
    }

    /// Reads `schema`'s columns of the rows at `addrs`: (fragment, offsets, batch) triples,
    /// the offsets being those of the batch's rows.
    pub async fn read_rows(
        &self,
        addrs: &[u64],
        schema: SchemaRef,
    ) -> Result<Vec<(&'a Fragment, Vec<u64>, RecordBatch)>> {
        // The fragments are independent reads: sent together, results kept in order.
        // (The futures are made first: a closure inside the stream would not be `Send` for
        // every lifetime, which the operator's stream needs.)
        let reads: Vec<_> = self
            .by_fragment(addrs)?
            .into_iter()
            .map(|(fragment, offsets)| self.fragment_rows(fragment, offsets, &schema))
            .collect();
        futures::stream::iter(reads)
            .buffered(CONCURRENT_REQUESTS)
            .try_collect()
            .await
    }

    /// `schema`'s columns of the rows at `offsets` (sorted, distinct) of one fragment.
    async fn fragment_rows(
        &self,
        fragment: &'a Fragment,
        offsets: Vec<u64>,
        schema: &SchemaRef,
    ) -> Result<(&'a Fragment, Vec<u64>, RecordBatch)> {
        Counters::add(self.fragments_read, 1);
        if let Some(bad) = offsets.iter().find(|o| **o >= fragment.physical_rows) {
            return Err(IndexError::RowOutOfRange {
                fragment: fragment.id,
                offset: *bad,
                rows: fragment.physical_rows,
            });
        }
        let cached: Vec<bool> = schema
            .fields()
            .iter()
            .map(|f| self.column_is_cacheable(f.data_type(), fragment.physical_rows))
            .collect();
        let direct = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .zip(&cached)
                .filter(|(_, c)| !**c)
                .map(|(f, _)| f.as_ref().clone())
                .collect::<Vec<_>>(),
        ));
        let mut direct_columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); direct.fields().len()];
        if !direct.fields().is_empty() {
            let dir = self.snapshot.dir.clone();
            let mut stream = read_fragment_rows(dir, fragment, direct.clone(), &offsets);
            while let Some(batch) = stream.next().await {
                for (i, c) in batch?.columns().iter().enumerate() {
                    direct_columns[i].push(c.clone());
                }
            }
        }
        let indices = UInt64Array::from(offsets.clone());
        let mut columns = Vec::with_capacity(schema.fields().len());
        let mut next_direct = 0;
        for (field, cached) in schema.fields().iter().zip(&cached) {
            if *cached {
                let whole = self.whole_column(fragment, field).await?;
                columns.push(datafusion::arrow::compute::take(&whole, &indices, None)?);
            } else {
                let parts: Vec<&dyn Array> = direct_columns[next_direct]
                    .iter()
                    .map(|a| a.as_ref())
                    .collect();
                columns.push(datafusion::arrow::compute::concat(&parts)?);
                next_direct += 1;
            }
        }
        let batch = RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(offsets.len())),
        )?;
        Ok((fragment, offsets, batch))
    }

    /// Every physical row of `schema`'s columns of `fragment`, from whole columns decoded once
    /// per session and kept in the cache; `None` when a column is not a small fixed-width one
    /// (see `Self::column_is_cacheable`), which the caller then reads from the file.
    pub async fn cached_columns(
        &self,
        fragment: &Fragment,
        schema: &SchemaRef,
    ) -> Result<Option<RecordBatch>> {
        let rows = fragment.physical_rows;
        if !self.columns_cacheable(fragment, schema) {
            return Ok(None);
        }
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            columns.push(self.whole_column(fragment, field).await?);
        }
        let batch = RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows as usize)),
        )?;
        Ok(Some(batch))
    }

    /// Whether [`Self::cached_columns`] serves `schema`'s columns of `fragment` (no IO).
    pub fn columns_cacheable(&self, fragment: &Fragment, schema: &SchemaRef) -> bool {
        schema
            .fields()
            .iter()
            .all(|f| self.column_is_cacheable(f.data_type(), fragment.physical_rows))
    }

    /// Fixed-width columns whose decoded size is a small share of the cache budget.
    fn column_is_cacheable(&self, data_type: &DataType, rows: u64) -> bool {
        data_type
            .primitive_width()
            .is_some_and(|w| (w as u64).saturating_mul(rows) <= (self.cache.budget() / 16) as u64)
    }

    /// Every physical row of one column of a fragment, decoded once per session.
    async fn whole_column(&self, fragment: &Fragment, field: &Field) -> Result<ArrayRef> {
        let dir = self.snapshot.dir.clone();
        let file =
            fragment
                .file_for_column(field.name())
                .ok_or_else(|| IndexError::MissingColumn {
                    fragment: fragment.id,
                    column: field.name().clone(),
                })?;
        // A fragment this handle just wrote: its rows as written, not read back.
        let written = dir
            .written_column(file, field.name())
            .filter(|parts| parts.iter().all(|a| a.data_type() == field.data_type()));
        let file = format!("{}/{}", dir.name(), file.path);
        let schema = Arc::new(Schema::new(vec![field.clone()]));
        let fragment = fragment.clone();
        self.cache
            .column(&file, field.name(), || async move {
                let mut parts = written.unwrap_or_default();
                if parts.is_empty() {
                    let mut stream = read_fragment(dir, &fragment, schema.clone(), 65536);
                    while let Some(batch) = stream.next().await {
                        parts.push(batch?.column(0).clone());
                    }
                }
                let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                let whole = if refs.is_empty() {
                    datafusion::arrow::array::new_empty_array(schema.field(0).data_type())
                } else {
                    datafusion::arrow::compute::concat(&refs)?
                };
                if whole.len() as u64 != fragment.physical_rows {
                    return Err(crate::format::FormatError::corrupt(
                        format!("fragment {}", fragment.id),
                        "column row count differs from the fragment's",
                    )
                    .into());
                }
                Ok(whole)
            })
            .await
    }

    /// The rows of a KNN answer with the columns of `output` (table columns plus the virtual
    /// `_rowaddr` / `_rowid`), in fragment order. The vector column `column` is taken from
    /// the answer's vectors when it has every candidate's.
    pub async fn fetch(
        &self,
        answer: &KnnAnswer,
        column: &str,
        output: &SchemaRef,
    ) -> Result<RecordBatch> {
        let addrs: Vec<u64> = answer.candidates.iter().map(|c| c.addr).collect();
        let vectors: &HashMap<u64, Vec<f32>> = &answer.vectors;
        let from_index = addrs.iter().all(|a| vectors.contains_key(a));
        let table_fields: Vec<Field> = output
            .fields()
            .iter()
            .filter(|f| f.name() != ROW_ADDR && f.name() != ROW_ID)
            .filter(|f| !(from_index && f.name() == column))
            .map(|f| f.as_ref().clone())
            .collect();
        let read_schema = Arc::new(Schema::new(table_fields));
        let mut batches = Vec::new();
        for (fragment, offs, batch) in self.read_rows(&addrs, read_schema).await? {
            let n = batch.num_rows();
            let mut columns = Vec::with_capacity(output.fields().len());
            for field in output.fields() {
                let array: ArrayRef = match field.name().as_str() {
                    ROW_ADDR => Arc::new(UInt64Array::from_iter_values(
                        offs.iter().map(|o| row_address(fragment.id, *o)),
                    )),
                    ROW_ID => Arc::new(UInt64Array::from_iter_values(offs.iter().map(|o| {
                        match &fragment.row_ids {
                            Some(seq) => {
                                let mut id = Vec::with_capacity(1);
                                seq.extend_slice(*o, 1, &mut id);
                                id[0]
                            }
                            None => row_address(fragment.id, *o),
                        }
                    }))),
                    name if from_index && name == column => {
                        let DataType::FixedSizeList(item, dim) = field.data_type() else {
                            return Err(IndexError::MissingColumn {
                                fragment: fragment.id,
                                column: format!("{name} (not a vector column)"),
                            });
                        };
                        let values: Vec<f32> = offs
                            .iter()
                            .flat_map(|o| vectors[&row_address(fragment.id, *o)].iter().copied())
                            .collect();
                        Arc::new(FixedSizeListArray::try_new(
                            item.clone(),
                            *dim,
                            Arc::new(Float32Array::from(values)),
                            None,
                        )?)
                    }
                    name => batch.column_by_name(name).cloned().ok_or_else(|| {
                        IndexError::MissingColumn {
                            fragment: fragment.id,
                            column: name.to_string(),
                        }
                    })?,
                };
                columns.push(array);
            }
            batches.push(RecordBatch::try_new_with_options(
                output.clone(),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(n)),
            )?);
        }
        if batches.is_empty() {
            return Ok(RecordBatch::new_empty(output.clone()));
        }
        Ok(datafusion::arrow::compute::concat_batches(
            output, &batches,
        )?)
    }
}

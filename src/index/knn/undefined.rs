//! Rows without a distance: what `ORDER BY <distance> ... NULLS FIRST` puts before every
//! distance (DataFusion's default for DESC, so `ORDER BY inner_product(v, q) DESC LIMIT k`
//! asks for them).
//!
//! A row has no distance to any query when its vector is NULL (or holds a NULL element, which
//! writes refuse but external data may have had); no index segment holds such a row. They are
//! found from the data files: row groups whose Parquet statistics count no NULL in the vector
//! column are skipped without reading them (usually all of them), the others' vector columns
//! are read and checked row by row. Under the cosine metric a zero vector has no distance
//! either; finding those would mean reading every vector, so the KNN rule does not ask for
//! them (see `engine::knn_rule`).
//!
//! Rows come in logical order (fragments in manifest order, offsets ascending), deleted rows,
//! rows outside the mask and (in a share of a split search) rows of other shares skipped. Cost: one footer per fragment (cached), plus the vector
//! column of the row groups that may hold a NULL.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Schema;
use futures::StreamExt;
use std::sync::Arc;

use super::{Counters, Searcher};
use crate::format::fragment_io::{read_fragment_ranges, row_groups_with_nulls};
use crate::format::types::has_null_element;
use crate::index::error::Result;
use crate::ledger::ids::row_address;

impl Searcher<'_> {
    /// Up to `limit` live rows passing the mask whose vector is NULL or holds a NULL element,
    /// in logical order.
    pub(super) async fn undefined_rows(&self, limit: usize) -> Result<Vec<u64>> {
        let snapshot = self.req.snapshot;
        let column = self.req.column;
        let field = snapshot.schema.field_with_name(column)?.clone();
        let schema = Arc::new(Schema::new(vec![field]));
        let mut found = Vec::new();
        for fragment in &snapshot.manifest.fragments {
            if found.len() >= limit {
                break;
            }
            let id = fragment.id;
            if fragment.physical_rows == 0 {
                continue;
            }
            // A share answers only for its own rows: without this, every share of a split
            // search would return the same NULL rows and the merge would repeat them.
            if self
                .scope
                .as_ref()
                .is_some_and(|s| !s.rows.contains_fragment(id))
            {
                continue;
            }
            // Mask rows in this fragment: rank of its last address minus rank before its first.
            let first = row_address(id, 0);
            let last = row_address(id, fragment.physical_rows - 1);
            if self.req.mask.is_some_and(|m| {
                m.rank(last) == first.checked_sub(1).map_or(0, |before| m.rank(before))
            }) {
                continue;
            }
            let ranges = row_groups_with_nulls(&snapshot.dir, fragment, column).await?;
            if ranges.is_empty() {
                continue;
            }
            Counters::add(&self.counters.fragments_read, 1);
            let deleted = self.deletions.get(&id);
            // Offsets of the rows read, in order: the ranges one after another.
            let mut offsets = ranges.iter().flat_map(|r| r.clone());
            let mut stream = read_fragment_ranges(
                snapshot.dir.clone(),
                fragment,
                schema.clone(),
                &ranges,
                8192,
            );
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                let list = batch.column(0).as_fixed_size_list();
                let dim = list.value_length() as usize;
                for i in 0..list.len() {
                    let Some(offset) = offsets.next() else {
                        return Err(crate::format::FormatError::corrupt(
                            format!("fragment {id}"),
                            "read more rows than the row groups hold",
                        )
                        .into());
                    };
                    let undefined =
                        list.is_null(i) || has_null_element(list.values().as_ref(), i * dim, dim);
                    let addr = row_address(id, offset);
                    if undefined
                        && !deleted.is_some_and(|d| d.contains(offset as u32))
                        && self.req.mask.is_none_or(|m| m.contains(addr))
                        && self.scope.as_ref().is_none_or(|s| s.rows.contains(addr))
                    {
                        found.push(addr);
                        if found.len() >= limit {
                            return Ok(found);
                        }
                    }
                }
            }
        }
        Ok(found)
    }
}

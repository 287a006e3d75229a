//! Exact scoring: brute force over whole fragments (on every core for large ones), and the
//! exact keys of given rows (masked rows, PQ re-ranking). Vector columns are decoded once and
//! kept in the [`IndexCache`](crate::index::cache::IndexCache) within its budget.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float32Type, Schema};
use futures::StreamExt;
use roaring::RoaringBitmap;

use super::rows::RowReader;
use super::{Counters, Searcher, exact_key};
use crate::format::{Fragment, read_fragment};
use crate::index::cache::ColumnVectors;
use crate::index::error::{IndexError, Result};
use crate::index::search::{Candidate, TopK};
use crate::ledger::ids::row_address;

/// Fragments with at least this many rows are scored exactly on every core.
const PARALLEL_SCORING_ROWS: u64 = 32 * 1024;

impl Searcher<'_> {
    pub(super) fn rows(&self) -> RowReader<'_> {
        RowReader {
            snapshot: self.req.snapshot,
            cache: self.cache,
            fragments_read: &self.counters.fragments_read,
        }
    }

    /// Exact top-k over `fragments`, with deletions and the mask.
    /// `skip`: rows some segment already answers for (of fragments segments own in part).
    pub(super) async fn brute_force(
        &self,
        fragments: &[Fragment],
        skip: &HashMap<u64, RoaringBitmap>,
    ) -> Result<Vec<Candidate>> {
        let q = self.req.vector;
        let k = self.req.k;
        let metric = self.req.metric;
        let mut top = TopK::new(k);
        let mut rows = 0usize;
        for fragment in fragments {
            let vectors = self.fragment_vectors(fragment).await?;
            let deleted = self.deletions.get(&fragment.id);
            let skipped = skip.get(&fragment.id);
            let mask = self.req.mask;
            let id = fragment.id;
            // Scores rows `range` of this fragment into a local top-k.
            let score = |range: std::ops::Range<u64>| {
                let mut top = TopK::new(k);
                let mut rows = 0usize;
                for offset in range {
                    let addr = row_address(id, offset);
                    if deleted.is_some_and(|d| d.contains(offset as u32))
                        || skipped.is_some_and(|d| d.contains(offset as u32))
                        || mask.is_some_and(|a| !a.contains(addr))
                    {
                        continue;
                    }
                    rows += 1;
                    let key = exact_key(metric, q, vectors.row(offset as usize));
                    top.push(Candidate { key, addr });
                }
                (top, rows)
            };
            let n = fragment.physical_rows;
            let threads = if n >= PARALLEL_SCORING_ROWS {
                std::thread::available_parallelism().map_or(1, |p| p.get())
            } else {
                1
            };
            let chunk = n.div_ceil(threads as u64).max(1);
            let parts: Vec<(TopK, usize)> = if threads > 1 {
                std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..n)
                        .step_by(chunk as usize)
                        .map(|start| {
                            let score = &score;
                            scope.spawn(move || score(start..(start + chunk).min(n)))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("scoring thread"))
                        .collect()
                })
            } else {
                vec![score(0..n)]
            };
            for (part, scored) in parts {
                rows += scored;
                for c in part.into_sorted() {
                    top.push(c);
                }
            }
        }
        Counters::add(&self.counters.rows_scored, rows);
        Ok(top.into_sorted())
    }

    /// The whole vector column of a fragment, decoded once per session (the cache's budget
    /// decides whether it stays).
    async fn fragment_vectors(&self, fragment: &Fragment) -> Result<Arc<ColumnVectors>> {
        let snapshot = self.req.snapshot;
        let dir = &snapshot.dir;
        let column = self.req.column;
        let field = snapshot.schema.field_with_name(column)?.clone();
        let schema = Arc::new(Schema::new(vec![field]));
        let file = fragment
            .file_for_column(column)
            .ok_or_else(|| IndexError::MissingColumn {
                fragment: fragment.id,
                column: column.to_string(),
            })?;
        let file = format!("{}/{}", dir.name(), file.path);
        self.cache
            .vectors(&file, column, || {
                load_vectors(dir.clone(), fragment.clone(), schema)
            })
            .await
    }

    /// Exact keys of the given rows: from the fragment's cached vector column when it is
    /// small enough to keep, else by reading only those rows' vectors.
    pub(super) async fn score_addresses(&self, addrs: &[u64]) -> Result<Vec<Candidate>> {
        let q = self.req.vector;
        let metric = self.req.metric;
        let rows = self.rows();
        let groups = rows.by_fragment(addrs)?;
        let worth_caching = |f: &Fragment| {
            (f.physical_rows as usize).saturating_mul(q.len() * 4) <= self.cache.budget() / 4
        };
        let mut out = Vec::with_capacity(addrs.len());
        if groups.iter().all(|(f, _)| worth_caching(f)) {
            for (fragment, offsets) in groups {
                let vectors = self.fragment_vectors(fragment).await?;
                for o in offsets {
                    if o as usize >= vectors.valid.len() {
                        return Err(IndexError::RowOutOfRange {
                            fragment: fragment.id,
                            offset: o,
                            rows: vectors.valid.len() as u64,
                        });
                    }
                    out.push(Candidate {
                        key: exact_key(metric, q, vectors.row(o as usize)),
                        addr: row_address(fragment.id, o),
                    });
                }
            }
        } else {
            let field = self
                .req
                .snapshot
                .schema
                .field_with_name(self.req.column)?
                .clone();
            let schema = Arc::new(Schema::new(vec![field]));
            for (fragment, offsets, batch) in rows.read_rows(addrs, schema).await? {
                let list = batch.column(0).as_fixed_size_list();
                let dim = list.value_length() as usize;
                let values = list.values().as_primitive::<Float32Type>().values();
                for (i, o) in offsets.iter().enumerate() {
                    let v = list.is_valid(i).then(|| &values[i * dim..(i + 1) * dim]);
                    out.push(Candidate {
                        key: exact_key(metric, q, v),
                        addr: row_address(fragment.id, *o),
                    });
                }
            }
        }
        Counters::add(&self.counters.rows_scored, out.len());
        Ok(out)
    }
}

/// Decodes the vector column of a fragment (all physical rows).
async fn load_vectors(
    dir: Arc<crate::format::TableDir>,
    fragment: Fragment,
    schema: Arc<Schema>,
) -> Result<ColumnVectors> {
    let mut out = ColumnVectors::default();
    let mut stream = read_fragment(dir, &fragment, schema, 8192);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let list = batch.column(0).as_fixed_size_list();
        out.dim = list.value_length() as usize;
        out.values
            .extend_from_slice(list.values().as_primitive::<Float32Type>().values());
        out.valid.extend((0..list.len()).map(|i| list.is_valid(i)));
    }
    if out.valid.len() as u64 != fragment.physical_rows {
        return Err(crate::format::FormatError::corrupt(
            format!("fragment {}", fragment.id),
            "vector column row count differs from the fragment's",
        )
        .into());
    }
    Ok(out)
}

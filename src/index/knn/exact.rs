//! Exact scoring: brute force over whole fragments (on every core once there are enough rows),
//! and the exact keys of given rows (masked rows, PQ re-ranking). Vector columns are decoded
//! once and kept in the [`IndexCache`](crate::index::cache::IndexCache) within its budget; a
//! column larger than the whole budget is streamed in bounded batches instead (memory:
//! one batch of about [`STREAM_BATCH_BYTES`] plus a top-k per thread). The scoring loop itself
//! is in [`super::scan`].

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float32Type, Schema};
use futures::{StreamExt, TryStreamExt};
use roaring::{RoaringBitmap, RoaringTreemap};

use super::rows::RowReader;
use super::scan::{Query, RowBlock, scorable_runs, score_run, split_runs};
use super::{Counters, Searcher, exact_key};
use crate::format::ranges::CONCURRENT_REQUESTS;
use crate::format::{Fragment, read_fragment};
use crate::index::cache::ColumnVectors;
use crate::index::error::{IndexError, Result};
use crate::index::ivf::IvfModel;
use crate::index::row_centroids::{QueryBound, background, prune_runs};
use crate::index::search::{Candidate, TopK};
use crate::ledger::ids::row_address;

/// What lets brute force rule unindexed rows out unscored: the index's model, whose
/// centroids the rows are assigned to, and the query's distances to those centroids.
pub(super) struct Bounds<'a> {
    pub model: &'a Arc<IvfModel>,
    pub query: QueryBound,
}

/// Scoring runs on every core once it covers at least this many rows.
const PARALLEL_SCORING_ROWS: u64 = 32 * 1024;

/// A fragment whose vector column exceeds the cache budget is read and scored in batches of
/// at most this many bytes (and at most a quarter of the budget, but at least
/// [`STREAM_BATCH_MIN_ROWS`] rows), so memory stays bounded whatever the fragment's size.
const STREAM_BATCH_BYTES: usize = 32 * 1024 * 1024;
const STREAM_BATCH_MIN_ROWS: usize = 256;

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
    ///
    /// Each fragment's scorable rows are computed once as runs ([`scorable_runs`]); vector
    /// columns that fit the cache budget are taken from the cache (decoded once per session)
    /// and scored in groups of at most the budget's bytes, on every core; a column larger than
    /// the whole budget is streamed from Parquet in bounded batches.
    pub(super) async fn brute_force(
        &self,
        fragments: &[&Fragment],
        skip: &HashMap<u64, RoaringBitmap>,
    ) -> Result<Vec<Candidate>> {
        self.brute_force_below(fragments, skip, None, None).await
    }

    /// [`Self::brute_force`] for rows whose answer is merged into a top-k whose k-th best is
    /// `ceiling` (the index's candidates, when it found `k`): rows above it are not kept, and
    /// with `bounds`, rows whose centroid bound puts them above the k-th best so far are not
    /// even scored (once their fragment's rows are assigned; the first query to meet a
    /// fragment asks for that and scores it in full). The answer merged with the ceiling's
    /// top-k is the one plain brute force gives.
    pub(super) async fn brute_force_below(
        &self,
        fragments: &[&Fragment],
        skip: &HashMap<u64, RoaringBitmap>,
        ceiling: Option<Candidate>,
        bounds: Option<&Bounds<'_>>,
    ) -> Result<Vec<Candidate>> {
        let query = Query::new(self.req.vector, self.req.metric);
        let k = self.req.k;
        let budget = self.cache.budget();
        let row_bytes = (self.req.vector.len() * 4 + 1) as u64;
        let mut top = TopK::below(k, ceiling);
        let mut rows = 0usize;
        // Fragments whose columns fit the budget together form a group; a group's columns
        // are loaded concurrently (independent reads), then scored.
        let mut group: Vec<(&Fragment, Vec<Range<u32>>)> = Vec::new();
        let mut group_bytes = 0u64;
        for &fragment in fragments {
            let runs = self.scorable(fragment, skip)?;
            if runs.is_empty() {
                continue;
            }
            let bytes = fragment.physical_rows.saturating_mul(row_bytes);
            if bytes > budget as u64 {
                rows += self
                    .stream_fragment(fragment, &runs, &query, &mut top)
                    .await?;
                continue;
            }
            if group_bytes + bytes > budget as u64 {
                rows += self
                    .score_fragments(std::mem::take(&mut group), &query, &mut top, bounds)
                    .await?;
                group_bytes = 0;
            }
            group.push((fragment, runs));
            group_bytes += bytes;
        }
        rows += self
            .score_fragments(group, &query, &mut top, bounds)
            .await?;
        Counters::add(&self.counters.rows_scored, rows);
        Ok(top.into_sorted())
    }

    /// Loads the vector columns of `group` concurrently and scores their runs (less the rows
    /// `bounds` rule out against `top`'s k-th best).
    async fn score_fragments(
        &self,
        group: Vec<(&Fragment, Vec<Range<u32>>)>,
        query: &Query<'_>,
        top: &mut TopK,
        bounds: Option<&Bounds<'_>>,
    ) -> Result<usize> {
        // What every fragment's load shares, made once per group (hundreds of small
        // fragments on a live table).
        let schema = self.vector_schema()?;
        let loads: Vec<_> = group
            .iter()
            .map(|(fragment, _)| self.fragment_vectors_of(fragment, &schema))
            .collect();
        let loaded: Vec<Arc<ColumnVectors>> = futures::stream::iter(loads)
            .buffered(CONCURRENT_REQUESTS)
            .try_collect()
            .await?;
        let bound = top.bound();
        let mut ruled_out = 0usize;
        let scored: Vec<(Arc<ColumnVectors>, u64, Vec<Range<u32>>)> = loaded
            .into_iter()
            .zip(group)
            .filter_map(|(vectors, (fragment, runs))| {
                let runs = match bounds {
                    Some(b) => match vectors.centroids.get(b.model) {
                        Some(assigned) => {
                            let (kept, skipped) = prune_runs(&runs, assigned, &b.query, bound);
                            ruled_out += skipped;
                            kept
                        }
                        None => {
                            background::request(&vectors, b.model);
                            runs
                        }
                    },
                    None => runs,
                };
                (!runs.is_empty()).then_some((vectors, fragment.id, runs))
            })
            .collect();
        Counters::add(&self.counters.skipped_by_bound, ruled_out);
        Ok(score_group(&scored, query, top))
    }

    /// The rows of `fragment` brute force may score: not deleted, not answered by a segment
    /// (`skip`), and in the query's mask.
    pub(super) fn scorable(
        &self,
        fragment: &Fragment,
        skip: &HashMap<u64, RoaringBitmap>,
    ) -> Result<Vec<Range<u32>>> {
        let rows = u32::try_from(fragment.physical_rows).map_err(|_| {
            crate::format::FormatError::corrupt(
                format!("fragment {}", fragment.id),
                "more rows than a row address can hold",
            )
        })?;
        let deleted = self.deletions.get(&fragment.id).map(|d| d.as_ref());
        // The deletion vector itself unless a segment's rows are to be skipped too.
        let merged;
        let excluded = match (deleted, skip.get(&fragment.id)) {
            (Some(d), Some(s)) => {
                merged = d | s;
                &merged
            }
            (Some(only), None) | (None, Some(only)) => only,
            (None, None) => &RoaringBitmap::new(),
        };
        let allowed = self.req.mask.map(|mask| fragment_mask(mask, fragment.id));
        Ok(scorable_runs(rows, excluded, allowed.as_ref()))
    }

    /// Scores a fragment whose vector column is larger than the cache budget: batch by batch
    /// from Parquet, each batch on every core, never holding more than one batch.
    async fn stream_fragment(
        &self,
        fragment: &Fragment,
        runs: &[Range<u32>],
        query: &Query<'_>,
        top: &mut TopK,
    ) -> Result<usize> {
        let row_bytes = (query.vector.len() * 4).max(1);
        let batch_rows = (STREAM_BATCH_BYTES.min(self.cache.budget() / 4) / row_bytes)
            .max(STREAM_BATCH_MIN_ROWS);
        let mut stream = read_fragment(
            self.req.snapshot.dir.clone(),
            fragment,
            self.vector_schema()?,
            batch_rows,
        );
        let (mut first, mut rows, mut next_run) = (0u32, 0usize, 0usize);
        while let Some(batch) = stream.next().await {
            let vectors = decode_vectors(&batch?)?;
            let block = block(&vectors, fragment.id, first);
            let end = block.offsets().end;
            if end as u64 > fragment.physical_rows {
                break;
            }
            // The runs (or their parts) inside this batch.
            let mut inside = Vec::new();
            while next_run < runs.len() && runs[next_run].start < end {
                let r = &runs[next_run];
                inside.push((0, r.start.max(first)..r.end.min(end)));
                if r.end <= end {
                    next_run += 1;
                } else {
                    break;
                }
            }
            rows += score_runs(&[block], &inside, query, top);
            first = end;
        }
        if first as u64 != fragment.physical_rows {
            return Err(crate::format::FormatError::corrupt(
                format!("fragment {}", fragment.id),
                "vector column row count differs from the fragment's",
            )
            .into());
        }
        Ok(rows)
    }

    /// The schema of the vector column alone.
    fn vector_schema(&self) -> Result<Arc<Schema>> {
        let field = self
            .req
            .snapshot
            .schema
            .field_with_name(self.req.column)?
            .clone();
        Ok(Arc::new(Schema::new(vec![field])))
    }

    /// The cache key of a fragment's vector column: the file holding it.
    fn vectors_file(&self, fragment: &Fragment) -> Result<String> {
        let column = self.req.column;
        let file = fragment
            .file_for_column(column)
            .ok_or_else(|| IndexError::MissingColumn {
                fragment: fragment.id,
                column: column.to_string(),
            })?;
        Ok(format!("{}/{}", self.req.snapshot.dir.name(), file.path))
    }

    /// The vector of row `offset` of `fragment` if its column is cached and the row is not
    /// NULL (no read): the brute-force winners' vectors, so their rows need no Parquet read.
    pub(super) fn cached_row_vector(&self, fragment: &Fragment, offset: u64) -> Option<Vec<f32>> {
        let file = self.vectors_file(fragment).ok()?;
        let vectors = self.cache.cached_vectors(file, self.req.column)?;
        let i = usize::try_from(offset).ok()?;
        (i < vectors.valid.len())
            .then(|| vectors.row(i).map(<[f32]>::to_vec))
            .flatten()
    }

    /// The whole vector column of a fragment, decoded once per session (the cache's budget
    /// decides whether it stays).
    async fn fragment_vectors(&self, fragment: &Fragment) -> Result<Arc<ColumnVectors>> {
        self.fragment_vectors_of(fragment, &self.vector_schema()?)
            .await
    }

    /// [`Self::fragment_vectors`] with the vector column's schema ([`Self::vector_schema`]).
    async fn fragment_vectors_of(
        &self,
        fragment: &Fragment,
        schema: &Arc<Schema>,
    ) -> Result<Arc<ColumnVectors>> {
        let dir = &self.req.snapshot.dir;
        let file = self.vectors_file(fragment)?;
        self.cache
            .vectors(file, self.req.column, || {
                load_vectors(dir.clone(), fragment.clone(), schema.clone())
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
    if let Some(written) = written_vectors(&dir, &fragment, &schema) {
        return Ok(written);
    }
    let mut out = ColumnVectors::default();
    let mut stream = read_fragment(dir, &fragment, schema, 8192);
    while let Some(batch) = stream.next().await {
        out.append(&decode_vectors(&batch?)?);
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

/// The vectors of a fragment that this database handle wrote a moment ago, from the rows as
/// it wrote them ([`crate::format::TableDir::written_column`]): the first query on a live
/// table's new version scores its new rows without reading them back. `None` when the rows
/// are not held or not of the column's type (the file is read instead).
fn written_vectors(
    dir: &crate::format::TableDir,
    fragment: &Fragment,
    schema: &Schema,
) -> Option<ColumnVectors> {
    let field = schema.fields().first()?;
    let file = fragment.file_for_column(field.name())?;
    let arrays = dir.written_column(file, field.name())?;
    let mut out = ColumnVectors::default();
    for array in arrays {
        let same_type = match (array.data_type(), field.data_type()) {
            (DataType::FixedSizeList(item, n), DataType::FixedSizeList(want, m)) => {
                n == m
                    && item.data_type() == &DataType::Float32
                    && want.data_type() == item.data_type()
            }
            _ => false,
        };
        if !same_type {
            return None;
        }
        out.append(&decode_vector_array(array.as_ref()));
    }
    (out.valid.len() as u64 == fragment.physical_rows).then_some(out)
}

/// The vectors of a batch whose one column is a vector column.
fn decode_vectors(batch: &RecordBatch) -> Result<ColumnVectors> {
    Ok(decode_vector_array(batch.column(0).as_ref()))
}

/// The vectors of a `FixedSizeList<Float32>` array.
fn decode_vector_array(array: &dyn Array) -> ColumnVectors {
    let list = array.as_fixed_size_list();
    let dim = list.value_length() as usize;
    let values = list.values().as_primitive::<Float32Type>().values();
    let valid: Vec<bool> = (0..list.len()).map(|i| list.is_valid(i)).collect();
    ColumnVectors {
        dim,
        values: values[..list.len() * dim].to_vec(),
        nulls: list.null_count(),
        valid,
        ..Default::default()
    }
}

/// The rows of fragment `id` the mask admits (the mask holds row addresses, whose high 32 bits
/// are the fragment id).
fn fragment_mask(mask: &RoaringTreemap, id: u64) -> RoaringBitmap {
    mask.bitmaps()
        .find(|(high, _)| u64::from(*high) == id)
        .map(|(_, b)| b.clone())
        .unwrap_or_default()
}

/// `vectors` as a block of fragment `fragment` starting at offset `first`.
fn block(vectors: &ColumnVectors, fragment: u64, first: u32) -> RowBlock<'_> {
    RowBlock {
        fragment,
        first,
        dim: vectors.dim,
        values: &vectors.values,
        valid: (vectors.nulls > 0).then_some(&vectors.valid[..]),
    }
}

/// A cached fragment to score: its vectors, its id and the runs of rows to score.
type CachedRuns = (Arc<ColumnVectors>, u64, Vec<Range<u32>>);

/// Scores cached fragments together.
fn score_group(group: &[CachedRuns], query: &Query, top: &mut TopK) -> usize {
    let blocks: Vec<RowBlock> = group.iter().map(|(v, id, _)| block(v, *id, 0)).collect();
    let runs: Vec<(usize, Range<u32>)> = group
        .iter()
        .enumerate()
        .flat_map(|(b, (_, _, runs))| runs.iter().map(move |r| (b, r.clone())))
        .collect();
    score_runs(&blocks, &runs, query, top)
}

/// Scores `runs` of `blocks` into `top`, on every core when there are enough rows.
fn score_runs(
    blocks: &[RowBlock],
    runs: &[(usize, Range<u32>)],
    query: &Query,
    top: &mut TopK,
) -> usize {
    let total: u64 = runs.iter().map(|(_, r)| r.len() as u64).sum();
    let threads = if total >= PARALLEL_SCORING_ROWS {
        crate::index::parallel::cores()
    } else {
        1
    };
    let k = top.k();
    let score = |part: &[(usize, Range<u32>)]| {
        let mut local = TopK::new(k);
        let rows: usize = part
            .iter()
            .map(|(b, r)| score_run(&blocks[*b], r.clone(), query, &mut local))
            .sum();
        (local, rows)
    };
    let parts: Vec<(TopK, usize)> = if threads > 1 {
        crate::index::parallel::run_shares(&split_runs(runs, threads), |share| score(share))
    } else {
        vec![score(runs)]
    };
    let mut rows = 0;
    for (part, scored) in parts {
        rows += scored;
        for c in part.into_sorted() {
            top.push(c);
        }
    }
    rows
}

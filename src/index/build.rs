//! Building index models and segments from a table snapshot (the IO side of the index),
//! holding every vector at once: [`read_vectors`], [`train`], [`partition`],
//! [`write_partitions`]. A full build over the memory budget uses the same pieces in passes
//! instead ([`super::build_stream`]: [`scan_vectors`], [`train_on_sample`],
//! `assign_partitions`, `pq_codes`), so both builds assign, encode and order rows alike.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float32Type, Schema};
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};

use super::distance::Metric;
use super::ivf::{IvfModel, ProductQuantizer};
use super::kmeans;
use super::nearest::CentroidTable;
use super::sample::BottomK;
use super::segment::{self, Partition};
use super::sq::{self, ScalarGrid};
use crate::format::commit::NewSegment;
use crate::format::index_meta::IndexKind;
use crate::format::progress::{Phase, Progress};
use crate::format::store::random_tag;
use crate::format::{FormatError, Result, Snapshot, TableDir, read_fragment};
use crate::ledger::ids::row_address;

/// Most IVF partitions an index may have: every query sorts all centroids and every
/// segment's footer lists every partition, so a typo like 1,000,000 must not be built.
pub const MAX_PARTITIONS: usize = 65536;

/// Seed of every k-means run and of the training sample, so builds are reproducible
/// (defined with the sample, which sits below the build).
pub use super::sample::SEED;

/// Most Lloyd iterations when training IVF centroids: faiss trains its IVF quantizer with
/// 10 as well; later iterations move centroids little and cost a full pass over the sample
/// each (recall@10 at the default nprobes did not change on the benchmark's data).
pub const KMEANS_ITERATIONS: usize = 10;

/// The live, non-NULL vectors of some fragments: addresses and a flat `n × dim` matrix.
#[derive(Debug, Default)]
pub struct Vectors {
    /// Each vector's row address, `(fragment_id << 32) | offset`.
    pub addrs: Vec<u64>,
    /// The vectors, `dim` floats each, in the order of `addrs`.
    pub values: Vec<f32>,
}

/// The physical rows of `fragments` (ids): the total of a phase reading them.
pub fn physical_rows(snapshot: &Snapshot, fragments: &BTreeSet<u64>) -> u64 {
    snapshot
        .manifest
        .fragments
        .iter()
        .filter(|f| fragments.contains(&f.id))
        .map(|f| f.physical_rows)
        .sum()
}

/// Rows an in-memory build reads at once (one Arrow batch).
pub const READ_BATCH_ROWS: usize = 8192;

/// The live, non-NULL rows of one batch read by [`scan_vectors`].
#[derive(Debug, Clone, Copy)]
pub struct LiveRows<'a> {
    /// The rows' addresses, `(fragment_id << 32) | offset`.
    pub addrs: &'a [u64],
    /// `addrs.len() × dim` floats.
    pub values: &'a [f32],
    /// Bytes of the vector column's batch as read (every physical row, NULL and deleted
    /// rows included).
    pub read_bytes: usize,
}

/// Reads `column` of `fragments` (ids) in manifest order, `batch_rows` physical rows at a
/// time, and calls `each` with each batch's live non-NULL rows (deleted rows and NULLs
/// skipped). Advances `phase` by the physical rows read (see [`physical_rows`]). Holds one
/// batch at a time.
pub async fn scan_vectors<E: From<FormatError>>(
    snapshot: &Snapshot,
    column: &str,
    fragments: &BTreeSet<u64>,
    batch_rows: usize,
    phase: &Phase,
    mut each: impl FnMut(LiveRows<'_>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let field = snapshot
        .schema
        .field_with_name(column)
        .map_err(FormatError::from)?
        .clone();
    let schema = Arc::new(Schema::new(vec![field]));
    let mut addrs = Vec::new();
    let mut live = Vec::new();
    for frag in snapshot
        .manifest
        .fragments
        .iter()
        .filter(|f| fragments.contains(&f.id))
    {
        let deleted = snapshot.dir.read_deletions(frag).await?;
        let mut stream = read_fragment(snapshot.dir.clone(), frag, schema.clone(), batch_rows);
        let mut offset = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let list = batch.column(0).as_fixed_size_list_opt().ok_or_else(|| {
                FormatError::invalid(format!("column '{column}' is not a vector column"))
            })?;
            let dim = list.value_length() as usize;
            let values = list
                .values()
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(|| {
                    FormatError::invalid(format!("column '{column}' does not hold float32 vectors"))
                })?
                .values();
            addrs.clear();
            live.clear();
            for i in 0..list.len() {
                let o = offset + i as u64;
                if list.is_null(i) || deleted.contains(o as u32) {
                    continue;
                }
                addrs.push(row_address(frag.id, o));
                live.extend_from_slice(&values[i * dim..(i + 1) * dim]);
            }
            offset += list.len() as u64;
            each(LiveRows {
                addrs: &addrs,
                values: &live,
                read_bytes: values.len() * 4,
            })?;
            phase.advance(list.len() as u64);
        }
    }
    Ok(())
}

/// Reads the vectors of `fragments` (ids) of `column`, skipping deleted rows and NULLs.
/// Advances `phase` by the physical rows read (see [`physical_rows`]).
pub async fn read_vectors(
    snapshot: &Snapshot,
    column: &str,
    fragments: &BTreeSet<u64>,
    phase: &Phase,
) -> Result<Vectors> {
    let mut out = Vectors::default();
    scan_vectors(
        snapshot,
        column,
        fragments,
        READ_BATCH_ROWS,
        phase,
        |rows| {
            out.addrs.extend_from_slice(rows.addrs);
            out.values.extend_from_slice(rows.values);
            Ok::<_, FormatError>(())
        },
    )
    .await?;
    Ok(out)
}

/// The partitions of a build over `rows` live non-NULL vectors: `requested`, or by default
/// √rows clamped to [1, 1024].
pub fn partitions_for(rows: usize, requested: Option<usize>) -> usize {
    requested.unwrap_or_else(|| ((rows as f64).sqrt() as usize).clamp(1, 1024))
}

/// The training sample size of a build with `partitions` partitions: `requested`, or by
/// default 256 per partition; never fewer rows than partitions.
pub fn sample_size_for(partitions: usize, requested: Option<usize>) -> usize {
    requested
        .unwrap_or(partitions.saturating_mul(256))
        .max(partitions)
}

/// Bytes a training sample holds per float: the sample and the copy k-means prepares of it.
pub const SAMPLE_BYTES_PER_FLOAT: usize = 8;

/// Fewest training rows per partition a budget cuts a default sample to: below about this
/// many, k-means leaves centroids placed on a handful of rows (faiss warns under 39).
pub const MIN_SAMPLE_PER_PARTITION: usize = 64;

/// The training sample of a build that should hold it within half of `budget_bytes` (the
/// sample and k-means' copy of it): the `requested` size as asked, or [`sample_size_for`]'s
/// default of 256 rows per partition cut to what fits, but not below
/// [`MIN_SAMPLE_PER_PARTITION`] rows per partition (a budget that small is exceeded by that
/// floor, as a budget of 0 does not make a build write a row at a time).
pub fn sample_size_within(
    partitions: usize,
    requested: Option<usize>,
    dim: usize,
    budget_bytes: usize,
) -> usize {
    if requested.is_some() {
        return sample_size_for(partitions, requested);
    }
    let fits = budget_bytes / 2 / SAMPLE_BYTES_PER_FLOAT.saturating_mul(dim.max(1));
    let floor = partitions.saturating_mul(MIN_SAMPLE_PER_PARTITION);
    sample_size_for(partitions, None).min(fits.max(floor))
}

/// The rows an IVF_SQ grid is trained on: the training sample, but never fewer than the
/// default 256 per partition (a partition's range from fewer rows is too narrow: most rows
/// fall outside it and their bounds rule little out). A streaming build reads them in a pass
/// of their own when its k-means sample is smaller.
pub fn grid_sample_size(partitions: usize, requested: Option<usize>) -> usize {
    sample_size_for(partitions, requested).max(sample_size_for(partitions, None))
}

/// Trains the IVF model (and PQ codebooks) on a sample of `vectors` (chosen as
/// [`super::sample`] describes, the same rows a streaming build trains on), reporting the
/// phases "k-means" (iterations) and, for IVF_PQ, "PQ codebooks" (one per sub-vector).
pub fn train(
    vectors: &Vectors,
    dim: usize,
    metric: Metric,
    kind: &IndexKind,
    num_partitions: usize,
    sample_size: usize,
    progress: &Progress,
) -> std::result::Result<IvfModel, String> {
    // An IVF_SQ grid takes a larger sample of the same rows (as a streaming build's does):
    // both from one bottom-k.
    let grid_rows = grid_sample_size(num_partitions, Some(sample_size));
    let held = if *kind == IndexKind::IvfSq {
        grid_rows.max(sample_size)
    } else {
        sample_size
    };
    let mut rows = BottomK::new(held, dim);
    for (addr, v) in vectors
        .addrs
        .iter()
        .zip(vectors.values.chunks_exact(dim.max(1)))
    {
        rows.offer(*addr, v);
    }
    let sample = rows.sample(sample_size);
    let mut model = train_on_sample(&sample, dim, metric, kind, num_partitions, progress)?;
    if model.sq.is_some() && grid_rows > sample_size {
        let larger = rows.sample(grid_rows);
        let assigned = assign_partitions(&model, &larger);
        model.sq = Some(ScalarGrid::train(&larger, dim, &assigned, num_partitions));
    }
    Ok(model)
}

/// Trains the IVF model (and PQ codebooks) on `sample` (`n × dim`, in stream order), reporting
/// the phases of [`train`].
pub fn train_on_sample(
    sample: &[f32],
    dim: usize,
    metric: Metric,
    kind: &IndexKind,
    num_partitions: usize,
    progress: &Progress,
) -> std::result::Result<IvfModel, String> {
    if sample.is_empty() || dim == 0 {
        return Err("the column has no non-NULL vectors to train on".into());
    }
    if num_partitions == 0 || num_partitions > MAX_PARTITIONS {
        return Err(format!(
            "num_partitions must be between 1 and {MAX_PARTITIONS}, not {num_partitions}"
        ));
    }
    let shell = IvfModel {
        metric,
        dim,
        centroids: vec![],
        pq: None,
        sq: None,
    };
    let mut data = Vec::with_capacity(sample.len());
    for v in sample.chunks_exact(dim) {
        if let Some(v) = shell.prepare(v) {
            data.extend_from_slice(&v);
        }
    }
    if data.is_empty() {
        return Err("every vector has zero norm; a cosine index needs non-zero vectors".into());
    }
    let iterations = progress.phase("k-means", Some(KMEANS_ITERATIONS as u64));
    let mut centroids =
        kmeans::train_observed(&data, dim, num_partitions, KMEANS_ITERATIONS, SEED, &|| {
            iterations.advance(1)
        });
    iterations.finish();
    // Fewer distinct training rows than partitions: pad so the model has exactly the
    // partitions its definition records (the extra ones stay empty).
    while centroids.len() < num_partitions * dim {
        let first = centroids[..dim].to_vec();
        centroids.extend_from_slice(&first);
    }
    let pq = match kind {
        IndexKind::IvfFlat | IndexKind::IvfSq => None,
        IndexKind::IvfPq { num_sub_vectors } => {
            let m = *num_sub_vectors as usize;
            if m == 0 || !dim.is_multiple_of(m) {
                return Err(format!(
                    "num_sub_vectors ({m}) must divide the dimension ({dim})"
                ));
            }
            let codebooks = progress.phase("PQ codebooks", Some(m as u64));
            Some(ProductQuantizer::train(&data, dim, m, SEED, &|| {
                codebooks.advance(1)
            }))
        }
    };
    let mut model = IvfModel {
        metric,
        dim,
        centroids,
        pq,
        sq: None,
    };
    if *kind == IndexKind::IvfSq {
        // Each partition's grid from the sample rows the centroids assign to it (raw
        // vectors: the codes bound the rows as the table stores them).
        let assigned = assign_partitions(&model, sample);
        model.sq = Some(ScalarGrid::train(sample, dim, &assigned, num_partitions));
    }
    Ok(model)
}

/// Writes `model` as the model file of index `index`; gives its name and size in bytes.
pub async fn write_model(dir: &TableDir, index: &str, model: &IvfModel) -> Result<(String, u64)> {
    let relative = format!("_indexes/{index}/{}.model", random_tag());
    let bytes = model.encode();
    let size = bytes.len() as u64;
    let path = dir.path(&relative);
    dir.store()
        .put(&path, PutPayload::from(bytes))
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    Ok((relative, size))
}

/// Rows assigned between two progress reports (each block is split over every core).
const ASSIGN_REPORT_ROWS: usize = 64 * 1024;

/// Groups vectors by partition and encodes them as the model's index kind stores them;
/// advances `phase` by the rows assigned.
///
/// Assignment (every centroid per row) and PQ encoding are the expensive part: each block of
/// rows is split into one contiguous share per core, each share grouped on its own, and the
/// shares appended in row order, so every partition lists its rows in the order of `vectors`
/// (the same result as one thread).
pub fn partition(model: &IvfModel, vectors: &Vectors, phase: &Phase) -> Vec<Partition> {
    let dim = model.dim;
    let mut parts = vec![Partition::default(); model.partitions()];
    if dim == 0 {
        return parts;
    }
    let threads = super::parallel::build_threads();
    for (addrs, values) in vectors
        .addrs
        .chunks(ASSIGN_REPORT_ROWS)
        .zip(vectors.values.chunks(ASSIGN_REPORT_ROWS * dim))
    {
        let share = addrs.len().div_ceil(threads).max(1);
        let grouped: Vec<Vec<Partition>> = std::thread::scope(|scope| {
            let handles: Vec<_> = addrs
                .chunks(share)
                .zip(values.chunks(share * dim))
                .map(|(addrs, values)| scope.spawn(move || partition_rows(model, addrs, values)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        for share in grouped {
            for (part, piece) in parts.iter_mut().zip(share) {
                part.addrs.extend_from_slice(&piece.addrs);
                part.vectors.extend_from_slice(&piece.vectors);
                part.codes.extend_from_slice(&piece.codes);
            }
        }
        phase.advance(addrs.len() as u64);
    }
    parts
}

/// One share of [`partition`]: its rows grouped by partition, in row order.
fn partition_rows(model: &IvfModel, addrs: &[u64], values: &[f32]) -> Vec<Partition> {
    let dim = model.dim;
    let assigned = assign_rows(model, values);
    let mut prepared = assigned.prepared.chunks_exact(dim);
    let mut parts = vec![Partition::default(); model.partitions()];
    let coders = model.sq.as_ref().map(sq::Coders::new);
    for (((addr, v), p), defined) in addrs
        .iter()
        .zip(values.chunks_exact(dim))
        .zip(&assigned.partitions)
        .zip(&assigned.defined)
    {
        let prepared = if *defined { prepared.next() } else { None };
        let part = &mut parts[*p as usize];
        part.addrs.push(*addr);
        if model.coded() {
            payload_codes(model, coders.as_ref(), *p, v, prepared, &mut part.codes);
        } else {
            part.vectors.extend_from_slice(v);
        }
    }
    parts
}

/// Rows of `values` assigned to their partitions.
struct AssignedRows {
    /// Per row: its partition.
    partitions: Vec<u32>,
    /// Per row: whether it has a prepared form (a zero vector under cosine has none).
    defined: Vec<bool>,
    /// The prepared forms of the defined rows, in row order.
    prepared: Vec<f32>,
}

/// The partition of every row of `values` (`n × dim`): the nearest centroid of its prepared
/// form. Zero vectors under cosine have no direction; they live in partition 0 and score as
/// "no distance". The others are prepared side by side and assigned in one pass; a row's
/// partition does not depend on the other rows (see [`super::nearest`]), so any batching of
/// the rows gives the same partitions.
fn assign_rows(model: &IvfModel, values: &[f32]) -> AssignedRows {
    let dim = model.dim;
    let mut prepared = Vec::with_capacity(values.len());
    let mut defined = Vec::with_capacity(values.len() / dim.max(1));
    for v in values.chunks_exact(dim) {
        let p = model.prepare(v);
        defined.push(p.is_some());
        prepared.extend(p.into_iter().flatten());
    }
    let mut assigned = vec![(0u32, 0f32); prepared.len() / dim];
    CentroidTable::new(&model.centroids, dim).assign(&prepared, &mut assigned);
    let mut next = assigned.iter();
    let partitions = defined
        .iter()
        .map(|d| match d.then(|| next.next()).flatten() {
            Some((p, _)) => *p,
            None => 0,
        })
        .collect();
    AssignedRows {
        partitions,
        defined,
        prepared,
    }
}

/// Appends the payload of row `v` of partition `p` with prepared form `prepared`: PQ codes
/// of the prepared form (all zero codes for a row without one), or the IVF_SQ payload of
/// the row as stored; nothing for IVF_FLAT.
fn payload_codes(
    model: &IvfModel,
    coders: Option<&sq::Coders>,
    p: u32,
    v: &[f32],
    prepared: Option<&[f32]>,
    out: &mut Vec<u8>,
) {
    if let Some(pq) = &model.pq {
        match prepared {
            Some(x) => pq.encode(x, out),
            None => out.extend(std::iter::repeat_n(0u8, pq.sub_vectors)),
        }
    } else if let Some(coders) = coders {
        sq::encode_row(coders.get(p as usize), v, out);
    }
}

/// Runs `work` on contiguous shares of `values` (`n × dim`), one per core, and returns the
/// results in row order.
fn on_every_core<T: Send>(
    values: &[f32],
    dim: usize,
    work: impl Fn(&[f32]) -> Vec<T> + Sync,
) -> Vec<T> {
    if dim == 0 {
        return work(values);
    }
    in_shares(values, dim, work)
}

/// Runs `work` on contiguous shares of `items` (rows of `unit` items each), one share per
/// build thread, and returns the results in order.
fn in_shares<I: Sync, T: Send>(
    items: &[I],
    unit: usize,
    work: impl Fn(&[I]) -> Vec<T> + Sync,
) -> Vec<T> {
    let rows = items.len() / unit.max(1);
    let threads = super::parallel::build_threads();
    let share = rows.div_ceil(threads).max(1);
    if rows <= share {
        return work(items);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(share * unit.max(1))
            .map(|items| scope.spawn(move || work(items)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// The partition of every row of `values` (`n × dim`), as [`partition`] assigns them, on
/// every core.
pub(crate) fn assign_partitions(model: &IvfModel, values: &[f32]) -> Vec<u32> {
    on_every_core(values, model.dim, |values| {
        assign_rows(model, values).partitions
    })
}

/// The coded payload of every row of `values` (`n × dim`) in its partition `assigned[i]`,
/// as [`partition`] stores them, on every core: `n × row_width` bytes (nothing for
/// IVF_FLAT).
pub(crate) fn coded_payload(model: &IvfModel, values: &[f32], assigned: &[u32]) -> Vec<u8> {
    let dim = model.dim.max(1);
    let rows: Vec<(u32, &[f32])> = assigned
        .iter()
        .copied()
        .zip(values.chunks_exact(dim))
        .collect();
    let coders = model.sq.as_ref().map(sq::Coders::new);
    let coders = coders.as_ref();
    in_shares(&rows, 1, |rows: &[(u32, &[f32])]| {
        let mut out = Vec::with_capacity(rows.len() * model.row_width());
        for (p, v) in rows {
            payload_codes(model, coders, *p, v, model.prepare(v).as_deref(), &mut out);
        }
        out
    })
}

/// Writes already partitioned rows as a segment file covering `fragments`.
pub async fn write_partitions(
    dir: &TableDir,
    index: &str,
    model: &IvfModel,
    parts: Vec<Partition>,
    fragments: BTreeSet<u64>,
) -> Result<NewSegment> {
    let rows: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let bytes = segment::encode(&parts, model.row_width());
    drop(parts);
    let size = bytes.len() as u64;
    let relative = format!("_indexes/{index}/{}.seg", random_tag());
    let path = dir.path(&relative);
    dir.store()
        .put(&path, PutPayload::from(bytes))
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    Ok(NewSegment {
        file: relative,
        size_bytes: size,
        rows,
        fragment_bitmap: fragments,
    })
}

//! Building index models and segments from a table snapshot (the IO side of the index).

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float32Type, Schema};
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rand::SeedableRng;
use rand::seq::index::sample;

use super::distance::Metric;
use super::ivf::{IvfModel, ProductQuantizer};
use super::kmeans;
use super::nearest::CentroidTable;
use super::segment::{self, Partition};
use crate::format::commit::NewSegment;
use crate::format::index_meta::IndexKind;
use crate::format::progress::{Phase, Progress};
use crate::format::store::random_tag;
use crate::format::{FormatError, Result, Snapshot, TableDir, read_fragment};
use crate::ledger::ids::row_address;

/// Most IVF partitions an index may have: every query sorts all centroids and every
/// segment's footer lists every partition, so a typo like 1,000,000 must not be built.
pub const MAX_PARTITIONS: usize = 65536;

/// Seed of every k-means run, so builds are reproducible.
pub const SEED: u64 = 0x5eed_f4a9;

/// Most Lloyd iterations when training IVF centroids: faiss trains its IVF quantizer with
/// 10 as well; later iterations move centroids little and cost a full pass over the sample
/// each (recall@10 at the default nprobes did not change on the benchmark's data).
pub const KMEANS_ITERATIONS: usize = 10;

/// The live, non-NULL vectors of some fragments: addresses and a flat `n × dim` matrix.
#[derive(Debug, Default)]
pub struct Vectors {
    pub addrs: Vec<u64>,
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

/// Reads the vectors of `fragments` (ids) of `column`, skipping deleted rows and NULLs.
/// Advances `phase` by the physical rows read (see [`physical_rows`]).
pub async fn read_vectors(
    snapshot: &Snapshot,
    column: &str,
    fragments: &BTreeSet<u64>,
    phase: &Phase,
) -> Result<Vectors> {
    let field = snapshot
        .schema
        .field_with_name(column)
        .map_err(FormatError::from)?
        .clone();
    let schema = Arc::new(Schema::new(vec![field]));
    let mut out = Vectors::default();
    for frag in snapshot
        .manifest
        .fragments
        .iter()
        .filter(|f| fragments.contains(&f.id))
    {
        let deleted = snapshot.dir.read_deletions(frag).await?;
        let mut stream = read_fragment(snapshot.dir.clone(), frag, schema.clone(), 8192);
        let mut offset = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let list = batch.column(0).as_fixed_size_list();
            let dim = list.value_length() as usize;
            let values = list.values().as_primitive::<Float32Type>().values();
            for i in 0..list.len() {
                let o = offset + i as u64;
                if list.is_null(i) || deleted.contains(o as u32) {
                    continue;
                }
                out.addrs.push(row_address(frag.id, o));
                out.values
                    .extend_from_slice(&values[i * dim..(i + 1) * dim]);
            }
            offset += list.len() as u64;
            phase.advance(list.len() as u64);
        }
    }
    Ok(out)
}

/// Trains the IVF model (and PQ codebooks) on a sample of `vectors`, reporting the phases
/// "k-means" (iterations) and, for IVF_PQ, "PQ codebooks" (one per sub-vector).
pub fn train(
    vectors: &Vectors,
    dim: usize,
    metric: Metric,
    kind: &IndexKind,
    num_partitions: usize,
    sample_size: usize,
    progress: &Progress,
) -> std::result::Result<IvfModel, String> {
    let n = vectors.addrs.len();
    if n == 0 {
        return Err("the column has no non-NULL vectors to train on".into());
    }
    if num_partitions == 0 || num_partitions > MAX_PARTITIONS {
        return Err(format!(
            "num_partitions must be between 1 and {MAX_PARTITIONS}, not {num_partitions}"
        ));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let picks: Vec<usize> = if n > sample_size {
        sample(&mut rng, n, sample_size).into_vec()
    } else {
        (0..n).collect()
    };
    let shell = IvfModel {
        metric,
        dim,
        centroids: vec![],
        pq: None,
    };
    let mut data = Vec::with_capacity(picks.len() * dim);
    for i in picks {
        if let Some(v) = shell.prepare(&vectors.values[i * dim..(i + 1) * dim]) {
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
        IndexKind::IvfFlat => None,
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
    Ok(IvfModel {
        metric,
        dim,
        centroids,
        pq,
    })
}

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
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
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
    // Zero vectors under cosine have no direction; they live in partition 0 and score as "no
    // distance". The others are prepared side by side and assigned in one pass.
    let mut prepared = Vec::with_capacity(values.len());
    let mut defined = Vec::with_capacity(addrs.len());
    for v in values.chunks_exact(dim) {
        let p = model.prepare(v);
        defined.push(p.is_some());
        prepared.extend(p.into_iter().flatten());
    }
    let mut assigned = vec![(0u32, 0f32); prepared.len() / dim];
    CentroidTable::new(&model.centroids, dim).assign(&prepared, &mut assigned);
    let mut next = assigned.iter().zip(prepared.chunks_exact(dim));
    let mut parts = vec![Partition::default(); model.partitions()];
    for ((addr, v), defined) in addrs.iter().zip(values.chunks_exact(dim)).zip(defined) {
        let (p, prepared) = match defined.then(|| next.next()).flatten() {
            Some(((p, _), x)) => (*p as usize, Some(x)),
            None => (0, None),
        };
        let part = &mut parts[p];
        part.addrs.push(*addr);
        match &model.pq {
            None => part.vectors.extend_from_slice(v),
            Some(pq) => match prepared {
                Some(x) => pq.encode(x, &mut part.codes),
                None => part.codes.extend(std::iter::repeat_n(0u8, pq.sub_vectors)),
            },
        }
    }
    parts
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
    let width = model.pq.as_ref().map_or(model.dim * 4, |pq| pq.sub_vectors);
    let bytes = segment::encode(&parts, width);
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

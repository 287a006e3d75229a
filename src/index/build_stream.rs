//! An index build whose memory is bounded by a byte budget (`fragvec.index_cache_bytes`): for
//! tables whose vectors do not fit it, it reads the column twice and keeps the rows in
//! temporary files between assigning and writing them, instead of loading every vector (the
//! in-memory build is in [`super::build`]; [`super::optimize`] chooses).
//!
//! Passes, each reading the column fragment by fragment in manifest order, batch by batch,
//! skipping deleted rows and NULLs ([`build::scan_vectors`]):
//! 1. **Sample** ("reading vectors"): every row is offered to a [`BottomK`] sized for an upper
//!    bound of the rows (the fragments' live rows, NULLs included), and counted. k-means then
//!    trains ("k-means", "PQ codebooks") on the bottom-k sample for the actual row count:
//!    the rows an in-memory build of the same snapshot trains on (see [`super::sample`]), so
//!    both builds make the same model.
//! 2. **Assign** ("assigning rows"): every row's partition, on every core, with the
//!    in-memory build's own assignment (`build::assign_partitions`); each row (address
//!    and payload: floats, or PQ codes) is appended to the `Spill` file of its bucket of
//!    partitions, and the partition sizes are counted.
//! 3. **Write** ("writing index files": the model, then one unit per group): the segment's
//!    data section is cut into groups of at most half the budget ([`plan_groups`]; at most
//!    `MAX_GROUPS` groups, see there); each group is collected from the spill buckets
//!    holding its partitions, ranked within their partition in row order (so every
//!    partition lists its rows as the in-memory build does), checksummed by a
//!    [`SegmentEncoder`] and appended to a multipart upload; then the footer. The file is the
//!    one [`super::segment::encode`] makes for the in-memory build's partitions.
//!
//! Why spill rather than read the column once per group (as this build did before): a group
//! pass decodes every Parquet page of the column to keep a slice of it; at 1M × 768 with a
//! 1 GiB budget that was 6 more passes and nearly doubled the build. The spill is read
//! sequentially, about 1.25 times over, without decoding.
//!
//! Ordering: both passes must see the same rows in the same order. The snapshot's files are
//! immutable, so they do; a pass that sees a different row count fails as
//! [`IndexError::Build`] rather than write a wrong file.
//!
//! Memory, for a budget `B`: a group's bytes (≤ `B/2`, or one row when a row is larger, or
//! 1/64 of the segment when that is more); a read batch of at most `B/16` of vector data,
//! its live rows, their prepared copy and payloads; the spill's write buffers (≤ `B/16`)
//! or one read chunk (≤ `B/16`); during pass 1 and training, the sample (two copies while
//! training, ≤ `B/2`: the default of 256 rows per partition is cut to fit, down to 64 rows
//! per partition; a `sample_size` asked for is kept as asked; see
//! [`build::sample_size_within`]). Outside the count: up to [`UPLOAD_BYTES`] of upload parts and the Parquet
//! reader's fetched pages, at most about [`FETCH_BYTES`] at a time whatever the row group's
//! size. [`BuildStats::peak_bytes`] reports the most held at once.
//!
//! [`FETCH_BYTES`]: crate::format::fetch_windows::FETCH_BYTES
//! Disk: the spill holds each row once (12 bytes plus its payload), in the system's
//! temporary directory (`TMPDIR`), freed when the build ends.

use std::collections::BTreeSet;

use object_store::path::Path;
use object_store::{ObjectStoreExt, WriteMultipart};

use super::build::{self, LiveRows};
use super::distance::Metric;
use super::error::{IndexError, Result};
use super::ivf::IvfModel;
use super::nearest::CentroidTable;
use super::parallel::cores;
use super::sample::{BottomK, KeyBound, sample_key};
use super::segment::SegmentEncoder;
use super::segment::groups::{Block, Slice, plan_groups};
use super::sq::{GridTrainer, ScalarGrid};
use spill::Spill;

mod spill;
use crate::format::commit::NewSegment;
use crate::format::index_meta::IndexKind;
use crate::format::progress::{Phase, Progress};
use crate::format::store::random_tag;
use crate::format::{FormatError, Snapshot};

/// Bytes of each part of the segment's multipart upload (S3's smallest part is 5 MiB).
pub const UPLOAD_PART_BYTES: usize = 5 * 1024 * 1024;

/// Upload parts in flight before writing waits for one to finish.
const PARTS_IN_FLIGHT: usize = 2;

/// Most bytes of upload parts a streaming build holds: the parts in flight, one more started
/// by a write, and the part being filled.
pub const UPLOAD_BYTES: usize = (PARTS_IN_FLIGHT + 2) * UPLOAD_PART_BYTES;

/// Most groups a segment is written in: a budget so small that half of it holds less than
/// 1/64 of the segment is exceeded rather than the spill read group by group more than 64
/// times (a cache budget of 0, "cache nothing", must not make a build write a row at a
/// time).
const MAX_GROUPS: u64 = 64;

/// Most temporary files the rows are spilled to (one per bucket of partitions).
const MAX_SPILL_BUCKETS: usize = 256;

/// Most bytes of rows a spill file buffers before it writes them (the spill reads back 8
/// times that at once).
const SPILL_BUFFER_BYTES: usize = 1 << 20;

/// Fewest physical rows a streaming read asks for at once, whatever the budget.
const MIN_BATCH_ROWS: usize = 64;

/// What a build did and held (for tests and diagnostics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// Whether the build streamed (false: it held every vector at once).
    pub streamed: bool,
    /// Reads of the whole column.
    pub passes: usize,
    /// Groups the segment's data section was written in.
    pub groups: usize,
    /// Bytes of rows written to temporary files between assigning and writing them.
    pub spilled_bytes: u64,
    /// The most bytes of vectors, samples, partitions, per-row ids and read batches held at
    /// once (see the module docs for what is outside the count).
    pub peak_bytes: usize,
}

/// A segment and model written by [`build`](fn@build), uncommitted.
#[derive(Debug)]
pub struct StreamedIndex {
    /// IVF partitions trained.
    pub partitions: usize,
    /// The model file written.
    pub model_file: String,
    /// Its size in bytes.
    pub model_size_bytes: u64,
    /// The segment written (not yet committed).
    pub segment: NewSegment,
    /// What the build did and how long each phase took.
    pub stats: BuildStats,
}

/// The index to build and the budget to build it in.
#[derive(Debug, Clone, Copy)]
pub struct StreamBuild<'a> {
    /// The table version indexed.
    pub snapshot: &'a Snapshot,
    /// The index's name.
    pub index: &'a str,
    /// The vector column.
    pub column: &'a str,
    /// Its dimensions.
    pub dim: usize,
    /// The index type.
    pub kind: &'a IndexKind,
    /// The distance it serves.
    pub metric: Metric,
    /// IVF partitions (default: √rows, clamped to [1, 1024]; see [`build::partitions_for`]).
    pub num_partitions: Option<usize>,
    /// Rows k-means trains on (default: 256 per partition, cut to fit the budget but not
    /// below 64; see [`build::sample_size_within`]).
    pub sample_size: Option<usize>,
    /// Memory the build may hold (samples, spill buffers).
    pub budget_bytes: usize,
}

/// Bytes held now and the most held at once.
#[derive(Debug, Default)]
struct Held {
    now: usize,
    peak: usize,
}

impl Held {
    fn hold(&mut self, bytes: usize) {
        self.now += bytes;
        self.peak = self.peak.max(self.now);
    }

    fn release(&mut self, bytes: usize) {
        self.now = self.now.saturating_sub(bytes);
    }

    /// Something held only for a moment, on top of what is held.
    fn touch(&mut self, bytes: usize) {
        self.peak = self.peak.max(self.now + bytes);
    }
}

/// Bytes of a batch being read: the column as read plus its live rows.
fn batch_bytes(rows: &LiveRows<'_>) -> usize {
    rows.read_bytes + rows.values.len() * 4 + rows.addrs.len() * 8
}

fn changed(index: &str) -> IndexError {
    IndexError::Build {
        index: index.to_string(),
        reason: "the column's rows differ between two reads of one snapshot".into(),
    }
}

/// Builds the model and one segment over `fragments` (ids) in passes (see the module docs).
pub async fn build(
    req: StreamBuild<'_>,
    fragments: &BTreeSet<u64>,
    progress: &Progress,
) -> Result<StreamedIndex> {
    let batch_rows = (req.budget_bytes / 16 / (req.dim.max(1) * 4))
        .clamp(MIN_BATCH_ROWS, build::READ_BATCH_ROWS);
    let scan = Scan {
        req,
        fragments,
        batch_rows,
    };
    let mut held = Held::default();
    let (model, rows, training_passes) = scan.train(&mut held, progress).await?;
    let row_width = model.row_width();
    let data_bytes = rows as u64 * (8 + row_width as u64);
    let group_limit = group_bytes(req.budget_bytes, data_bytes, row_width);
    // Buckets of about an eighth of a group: a group reads its own buckets and at most
    // parts of two more, so the spill is read about (1 + 2/8) times over.
    let spill_bytes = rows as u64 * (spill::RECORD_HEADER_BYTES + row_width) as u64;
    let buckets = spill::bucket_count(
        model.partitions(),
        spill_bytes,
        (group_limit / 8) as u64,
        MAX_SPILL_BUCKETS,
    );
    let mut spill = Spill::create(
        req.index,
        &std::env::temp_dir(),
        model.partitions(),
        buckets,
        row_width,
        (req.budget_bytes / 16 / buckets).min(SPILL_BUFFER_BYTES),
    )?;
    let sizes = scan
        .assign(&model, rows, &mut spill, &mut held, progress)
        .await?;
    let groups = plan_groups(&sizes, row_width, group_limit);
    let writing = progress.phase("writing index files", Some(1 + groups.len() as u64));
    let (model_file, model_size_bytes) =
        build::write_model(&req.snapshot.dir, req.index, &model).await?;
    writing.advance(1);
    let writer = SegmentWriter {
        scan,
        spill: &spill,
        row_width,
        chunk_bytes: (req.budget_bytes / 16).min(SPILL_BUFFER_BYTES * 8),
    };
    let (file, size_bytes) = writer.write(&groups, &sizes, &mut held, &writing).await?;
    writing.finish();
    Ok(StreamedIndex {
        partitions: model.partitions(),
        model_file,
        model_size_bytes,
        segment: NewSegment {
            file,
            size_bytes,
            rows: rows as u64,
            fragment_bitmap: fragments.clone(),
        },
        stats: BuildStats {
            streamed: true,
            passes: training_passes + 1,
            groups: groups.len(),
            spilled_bytes: spill.bytes_written(),
            peak_bytes: held.peak,
        },
    })
}

/// Bytes of each group of a segment whose data section has `data_bytes` and whose rows
/// have `row_width` payload bytes: half the budget, unless that would make more than
/// [`MAX_GROUPS`] groups. (A full group wastes less than one row of a block, so groups of
/// `data_bytes / MAX_GROUPS` plus the widest block row are at most [`MAX_GROUPS`].)
fn group_bytes(budget: usize, data_bytes: u64, row_width: usize) -> usize {
    let widest = row_width.max(8) as u64;
    let fewest = data_bytes.div_ceil(MAX_GROUPS).saturating_add(widest);
    (budget / 2).max(usize::try_from(fewest).unwrap_or(usize::MAX))
}

/// The column of the snapshot to read, and how.
#[derive(Clone, Copy)]
struct Scan<'a> {
    req: StreamBuild<'a>,
    fragments: &'a BTreeSet<u64>,
    batch_rows: usize,
}

impl Scan<'_> {
    fn build_error(&self, reason: String) -> IndexError {
        IndexError::Build {
            index: self.req.index.to_string(),
            reason,
        }
    }

    /// The training sample's rows for `partitions` partitions, within the budget.
    fn sample_size(&self, partitions: usize) -> usize {
        build::sample_size_within(
            partitions,
            self.req.sample_size,
            self.req.dim,
            self.req.budget_bytes,
        )
    }

    /// Pass 1: the training sample, then k-means on it (and, for an IVF_SQ grid whose
    /// sample the budget cut, one more pass for the grid). Returns the model, the rows (live,
    /// non-NULL) of the column and the passes made.
    async fn train(
        &self,
        held: &mut Held,
        progress: &Progress,
    ) -> Result<(IvfModel, usize, usize)> {
        let StreamBuild {
            snapshot,
            column,
            dim,
            ..
        } = self.req;
        // The live rows (NULLs included) bound the rows, so the sample for them holds the
        // sample for the rows (see `super::sample`).
        let upper_bound: u64 = snapshot
            .manifest
            .fragments
            .iter()
            .filter(|f| self.fragments.contains(&f.id))
            .map(|f| f.live_rows())
            .sum();
        let upper_bound = usize::try_from(upper_bound).unwrap_or(usize::MAX);
        let most_partitions = build::partitions_for(upper_bound, self.req.num_partitions);
        let capacity = self.sample_size(most_partitions);
        let mut sample = BottomK::new(capacity, dim);
        // A cut sample trains the centroids; an IVF_SQ grid wants the full one, whose rows
        // are told apart by their keys in one more pass (see `sq::GridTrainer`).
        let full = build::grid_sample_size(most_partitions, self.req.sample_size);
        let mut grid_keys =
            (*self.req.kind == IndexKind::IvfSq && capacity < full).then(|| KeyBound::new(full));
        let reading = progress.phase(
            "reading vectors",
            Some(build::physical_rows(snapshot, self.fragments)),
        );
        let fragments = self.fragments;
        build::scan_vectors(
            snapshot,
            column,
            fragments,
            self.batch_rows,
            &reading,
            |rows| {
                for (addr, v) in rows.addrs.iter().zip(rows.values.chunks_exact(dim)) {
                    sample.offer(*addr, v);
                }
                if let Some(keys) = &mut grid_keys {
                    rows.addrs.iter().for_each(|a| keys.offer(*a));
                }
                let keys = grid_keys.as_ref().map_or(0, KeyBound::bytes);
                held.touch(sample.bytes() + keys + batch_bytes(&rows));
                Ok::<_, IndexError>(())
            },
        )
        .await?;
        reading.finish();
        let rows = usize::try_from(sample.offered()).map_err(|_| changed(self.req.index))?;
        let partitions = build::partitions_for(rows, self.req.num_partitions);
        let sample = sample.into_sample(self.sample_size(partitions));
        // The sample and the prepared copy k-means trains on.
        held.touch(sample.len() * build::SAMPLE_BYTES_PER_FLOAT);
        let kind = self.req.kind;
        let mut model =
            build::train_on_sample(&sample, dim, self.req.metric, kind, partitions, progress)
                .map_err(|reason| self.build_error(reason))?;
        drop(sample);
        let mut passes = 1;
        let full = build::grid_sample_size(partitions, self.req.sample_size);
        if let Some(bound) = grid_keys.and_then(|keys| keys.bound(full)) {
            model.sq = Some(self.train_grid(&model, bound, held, progress).await?);
            passes += 1;
        }
        Ok((model, rows, passes))
    }

    /// The scalar grid of `model`'s partitions from the rows whose sample key is at most
    /// `bound` (the full sample), read again and assigned to the model's centroids.
    async fn train_grid(
        &self,
        model: &IvfModel,
        bound: u64,
        held: &mut Held,
        progress: &Progress,
    ) -> Result<ScalarGrid> {
        let dim = self.req.dim;
        let mut trainer = GridTrainer::new(dim, model.partitions());
        let reading = progress.phase(
            "reading vectors for the scalar grid",
            Some(build::physical_rows(self.req.snapshot, self.fragments)),
        );
        let mut picked = Vec::new();
        build::scan_vectors(
            self.req.snapshot,
            self.req.column,
            self.fragments,
            self.batch_rows,
            &reading,
            |rows| {
                picked.clear();
                for (addr, v) in rows.addrs.iter().zip(rows.values.chunks_exact(dim)) {
                    if sample_key(*addr) <= bound {
                        picked.extend_from_slice(v);
                    }
                }
                let assigned = build::assign_partitions(model, &picked);
                for (row, p) in picked.chunks_exact(dim).zip(&assigned) {
                    trainer.offer(row, *p as usize);
                }
                held.touch(trainer.bytes() + picked.len() * 4 + batch_bytes(&rows));
                Ok::<_, IndexError>(())
            },
        )
        .await?;
        reading.finish();
        Ok(trainer.finish())
    }

    /// Pass 2: the partition of each of the `rows` rows, each row appended to `spill` with
    /// its payload (floats, or PQ codes); returns the rows of each partition.
    async fn assign(
        &self,
        model: &IvfModel,
        rows: usize,
        spill: &mut Spill,
        held: &mut Held,
        progress: &Progress,
    ) -> Result<Vec<u64>> {
        let index = self.req.index;
        let row_width = spill.record_bytes() - spill::RECORD_HEADER_BYTES;
        held.hold(spill.buffer_bytes());
        let mut sizes = vec![0u64; model.partitions()];
        let assigning = progress.phase("assigning rows", Some(rows as u64));
        let unreported = Progress::none().phase("", None);
        let StreamBuild {
            snapshot, column, ..
        } = self.req;
        let fragments = self.fragments;
        let mut payload: Vec<u8> = Vec::new();
        build::scan_vectors(
            snapshot,
            column,
            fragments,
            self.batch_rows,
            &unreported,
            |batch| {
                if batch.addrs.is_empty() {
                    return Ok(());
                }
                let assigned = build::assign_partitions(model, batch.values);
                if spill.records() + assigned.len() as u64 > rows as u64 {
                    return Err(changed(index));
                }
                // The segment's payload bytes of every row of the batch.
                payload.clear();
                if model.coded() {
                    payload = build::coded_payload(model, batch.values, &assigned);
                } else {
                    payload.reserve(batch.values.len() * 4);
                    for x in batch.values {
                        payload.extend_from_slice(&x.to_le_bytes());
                    }
                }
                if payload.len() != assigned.len() * row_width {
                    return Err(self.build_error(format!(
                        "{} payload bytes for {} rows of {row_width} bytes",
                        payload.len(),
                        assigned.len()
                    )));
                }
                for (j, (&p, addr)) in assigned.iter().zip(batch.addrs).enumerate() {
                    sizes[p as usize] += 1;
                    spill.push(p, *addr, &payload[j * row_width..(j + 1) * row_width])?;
                }
                // The batch, its prepared copy, the assignment scratch, the payloads, and
                // each core's copy of the centroids in the nearest-centroid table's panels.
                held.touch(
                    batch_bytes(&batch)
                        + batch.values.len() * 4
                        + batch.addrs.len() * 12
                        + payload.capacity()
                        + CentroidTable::bytes_for(model.partitions(), model.dim) * cores(),
                );
                assigning.advance(batch.addrs.len() as u64);
                Ok::<_, IndexError>(())
            },
        )
        .await?;
        spill.flush()?;
        held.release(spill.buffer_bytes());
        assigning.finish();
        if spill.records() != rows as u64 {
            return Err(changed(index));
        }
        Ok(sizes)
    }
}

/// Writes the segment file from the spilled rows, one group at a time.
struct SegmentWriter<'a> {
    scan: Scan<'a>,
    spill: &'a Spill,
    row_width: usize,
    /// Bytes of spilled rows read at once.
    chunk_bytes: usize,
}

impl SegmentWriter<'_> {
    /// Writes the segment of `sizes` rows per partition in `groups` through a multipart
    /// upload (aborted on failure); advances `writing` once per group. Returns the file
    /// (relative to the table) and its size.
    async fn write(
        &self,
        groups: &[Vec<Slice>],
        sizes: &[u64],
        held: &mut Held,
        writing: &Phase,
    ) -> Result<(String, u64)> {
        let dir = &self.scan.req.snapshot.dir;
        let relative = format!("_indexes/{}/{}.seg", self.scan.req.index, random_tag());
        let path = dir.path(&relative);
        let upload = dir
            .store()
            .put_multipart(&path)
            .await
            .map_err(|e| FormatError::store(&path, e))?;
        let mut upload = WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART_BYTES);
        let written: Result<u64> = async {
            let mut encoder = SegmentEncoder::new(sizes, self.row_width);
            for group in groups {
                let buffers = self.collect(group, held)?;
                for buffer in &buffers {
                    encoder
                        .push(buffer)
                        .map_err(|reason| self.scan.build_error(reason))?;
                    upload_bytes(&mut upload, buffer, &path).await?;
                }
                held.release(buffers.iter().map(Vec::capacity).sum());
                writing.advance(1);
            }
            let data_bytes = encoder.written();
            let footer = encoder
                .finish()
                .map_err(|reason| self.scan.build_error(reason))?;
            upload_bytes(&mut upload, &footer, &path).await?;
            Ok(data_bytes + footer.len() as u64)
        }
        .await;
        match written {
            Ok(size) => {
                upload
                    .finish()
                    .await
                    .map_err(|e| FormatError::store(&path, e))?;
                Ok((relative, size))
            }
            Err(e) => {
                // The partial upload is discarded; the error that stopped it is the one to
                // report.
                let _ = upload.abort().await;
                Err(e)
            }
        }
    }

    /// The bytes of each slice of `group`, in the group's order, from the buckets of the
    /// spill holding its partitions.
    fn collect(&self, group: &[Slice], held: &mut Held) -> Result<Vec<Vec<u8>>> {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            return Ok(Vec::new());
        };
        let (first, last) = (first.partition, last.partition);
        // Per partition of the group: which slice takes its addresses, which its payload.
        let mut slices = vec![[None, None]; last - first + 1];
        for (i, s) in group.iter().enumerate() {
            let block = match s.block {
                Block::Addrs => 0,
                Block::Payload => 1,
            };
            slices[s.partition - first][block] = Some(i);
        }
        let mut buffers: Vec<Vec<u8>> = group
            .iter()
            .map(|s| Vec::with_capacity(s.bytes(self.row_width) as usize))
            .collect();
        held.hold(buffers.iter().map(Vec::capacity).sum());
        held.touch(self.chunk_bytes);
        // Rows of each partition of the group seen so far: the next row's rank. A bucket
        // holds every row of its partitions in row order, so ranks count from its start.
        let mut ranks = vec![0u64; last - first + 1];
        for bucket in self.spill.buckets_of(first..last + 1) {
            self.spill
                .read_bucket(bucket, self.chunk_bytes, |p, addr, payload| {
                    if p < first || p > last {
                        return Ok(());
                    }
                    let rank = ranks[p - first];
                    ranks[p - first] += 1;
                    let [addrs_slice, payload_slice] = slices[p - first];
                    if let Some(i) = addrs_slice.filter(|&i| group[i].rows.contains(&rank)) {
                        buffers[i].extend_from_slice(&addr.to_le_bytes());
                    }
                    if let Some(i) = payload_slice.filter(|&i| group[i].rows.contains(&rank)) {
                        buffers[i].extend_from_slice(payload);
                    }
                    Ok(())
                })?;
        }
        if let Some((s, b)) = group
            .iter()
            .zip(&buffers)
            .find(|(s, b)| b.len() as u64 != s.bytes(self.row_width))
        {
            return Err(self.scan.build_error(format!(
                "the spilled rows of partition {} gave {} bytes of its {:?} block, not {}",
                s.partition,
                b.len(),
                s.block,
                s.bytes(self.row_width)
            )));
        }
        Ok(buffers)
    }
}

/// Appends `bytes` to the upload, waiting whenever [`PARTS_IN_FLIGHT`] parts are in flight.
async fn upload_bytes(writer: &mut WriteMultipart, bytes: &[u8], path: &Path) -> Result<()> {
    for chunk in bytes.chunks(UPLOAD_PART_BYTES) {
        writer
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|e| FormatError::store(path, e))?;
        writer.write(chunk);
    }
    Ok(())
}

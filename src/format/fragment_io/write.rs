//! Writing fragments' Parquet data files.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
// `ParquetObjectReader` is deprecated in parquet 59 in favour of hand-written readers; it is
// still what DataFusion 55 itself builds on, and it does exactly the range reads we want.
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::KeyValue;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use datafusion::parquet::schema::types::ColumnPath;
use futures::{Stream, StreamExt};
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;

use crate::format::column_stats::StatsAccumulator;
use crate::format::error::{FormatError, Result};
use crate::format::integrity::parquet_io::PageChecksummer;
use crate::format::integrity::units::PAGE_CRC_KEY;
use crate::format::manifest::DataFile;
use crate::format::packed_vectors::packed_type;
use crate::format::recent_writes;
use crate::format::storage_types::{storage_schema, to_storage, unstorable};
use crate::format::store::{TableDir, random_tag};

/// Rows per Parquet row group: small enough that a writer buffers tens of MB, not hundreds.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;

/// A fragment written but not yet committed: it gets its id when the commit assigns one.
#[derive(Clone, Debug, PartialEq)]
pub struct WrittenFragment {
    /// The data files written for the fragment; together they hold every column.
    pub files: Vec<DataFile>,
    /// Rows written, the same in every data file.
    pub physical_rows: u64,
}

/// Parquet's settings for a file of `stored` (the storage types of `declared`).
fn writer_properties(declared: &SchemaRef, stored: &SchemaRef) -> WriterProperties {
    let mut builder = WriterProperties::builder();
    // Vector values almost never repeat: a dictionary only costs hashing every float.
    for (field, stored) in declared.fields().iter().zip(stored.fields()) {
        let path = match stored.data_type() {
            DataType::FixedSizeList(item, _) | DataType::List(item) => ColumnPath::new(vec![
                field.name().clone(),
                "list".to_string(),
                item.name().clone(),
            ]),
            // Packed vectors: min / max of their bytes would mean nothing and a column index
            // of them would cost up to 128 bytes per page; chunk statistics keep the NULL
            // counts that `row_groups_with_nulls` reads.
            _ if packed_type(field.data_type()).is_some() => {
                let path = ColumnPath::new(vec![field.name().clone()]);
                builder =
                    builder.set_column_statistics_enabled(path.clone(), EnabledStatistics::Chunk);
                path
            }
            _ => continue,
        };
        builder = builder
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_data_page_size_limit(path, VECTOR_PAGE_BYTES);
    }
    builder
        .set_compression(Compression::LZ4_RAW)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        // Small pages (and the page index the writer adds by default) let a reader that wants
        // a few rows by offset, as a KNN query does, decode a few small pages instead of
        // whole column chunks.
        .set_data_page_size_limit(PAGE_BYTES)
        .build()
}

/// Target size of a Parquet data page.
const PAGE_BYTES: usize = 64 * 1024;

/// Target size of a data page of a vector column: a KNN query re-ranks a few dozen scattered
/// rows and reads the page of each, so a page should hold few rows (about 5 of 768 floats;
/// 64 KB pages made a 1M × 768 query read 3–10 MB for its ~50 rows). The cost is a larger
/// page index (one entry per page, ~24 bytes: about 5 MB per million 768-float rows).
const VECTOR_PAGE_BYTES: usize = 16 * 1024;

/// Writes one Parquet file of rows in `schema`, returning it (with the rows written).
///
/// Parquet's synchronous writer encodes into memory; each flushed row group is uploaded and,
/// while its bytes are still at hand, checksummed page by page (see [`super::integrity`]).
struct FileWriter {
    dir: Arc<TableDir>,
    relative: String,
    columns: Vec<String>,
    /// The Parquet schema's Arrow form when some column is stored as another type.
    storage: Option<SchemaRef>,
    writer: ArrowWriter<Vec<u8>>,
    object: BufWriter,
    checksums: PageChecksummer,
    /// The columns' value ranges, from the batches as written (declared types).
    stats: StatsAccumulator,
    rows: u64,
    /// The batches written so far (declared types) and the bytes they keep alive, while
    /// those are few enough to be kept for the reads after the commit
    /// ([`crate::format::recent_writes`]).
    held: Option<(Vec<RecordBatch>, usize)>,
}

impl FileWriter {
    fn try_new(dir: &Arc<TableDir>, schema: &SchemaRef) -> Result<Self> {
        // The writer panics on a type it cannot store at all: refuse it first.
        for field in schema.fields() {
            if let Some(reason) = unstorable(field.data_type()) {
                return Err(FormatError::storage_type(field, reason));
            }
        }
        let stored = storage_schema(schema);
        let relative = format!("data/{}.parquet", random_tag());
        let path = dir.path(&relative);
        let object = BufWriter::new(dir.store().clone(), path.clone());
        let writer = ArrowWriter::try_new(
            Vec::new(),
            stored.clone(),
            Some(writer_properties(schema, &stored)),
        )
        .map_err(|e| FormatError::Parquet {
            path: path.to_string(),
            source: e,
        })?;
        Ok(Self {
            dir: dir.clone(),
            relative,
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            storage: (!Arc::ptr_eq(&stored, schema)).then_some(stored),
            writer,
            object,
            checksums: PageChecksummer::new(path.as_ref()),
            stats: StatsAccumulator::new(schema),
            rows: 0,
            held: Some((Vec::new(), 0)),
        })
    }

    fn parquet_err(&self, e: ParquetError) -> FormatError {
        FormatError::Parquet {
            path: self.relative.clone(),
            source: e,
        }
    }

    /// Uploads what the encoder produced (after pushing its buffered tail into memory) and
    /// hands it to the checksummer.
    async fn upload(&mut self) -> Result<()> {
        self.writer
            .sync()
            .map_err(|e| self.parquet_err(ParquetError::External(Box::new(e))))?;
        let bytes = Bytes::from(std::mem::take(self.writer.inner_mut()));
        if bytes.is_empty() {
            return Ok(());
        }
        self.checksums.push(bytes.clone());
        let path = self.dir.path(&self.relative);
        self.object
            .put(bytes)
            .await
            .map_err(|e| FormatError::store(&path, e))
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.stats.update(batch.columns());
        if let Some((held, bytes)) = &mut self.held {
            *bytes += batch.get_array_memory_size();
            held.push(batch.clone());
            if *bytes > recent_writes::MAX_FILE_BYTES {
                self.held = None;
            }
        }
        let before = self.writer.flushed_row_groups().len();
        let stored;
        let batch = match &self.storage {
            None => batch,
            Some(storage) => {
                stored = stored_batch(batch, storage)?;
                &stored
            }
        };
        self.writer.write(batch).map_err(|e| self.parquet_err(e))?;
        if self.writer.flushed_row_groups().len() != before {
            self.upload().await?;
            self.checksums.absorb(self.writer.flushed_row_groups())?;
        }
        Ok(())
    }

    async fn finish(mut self) -> Result<(DataFile, u64)> {
        self.writer.flush().map_err(|e| self.parquet_err(e))?;
        self.upload().await?;
        self.checksums.absorb(self.writer.flushed_row_groups())?;
        let footer_offset = self.checksums.written();
        self.writer.append_key_value_metadata(KeyValue::new(
            PAGE_CRC_KEY.to_string(),
            self.checksums.page_table(),
        ));
        let metadata = self.writer.finish().map_err(|e| self.parquet_err(e))?;
        self.upload().await?;
        let path = self.dir.path(&self.relative);
        self.object.shutdown().await.map_err(|e| FormatError::Io {
            path: path.to_string(),
            source: e,
        })?;
        let written = self.checksums.written();
        let footer = self.checksums.finish(footer_offset, &metadata)?;
        let meta = self
            .dir
            .store()
            .head(&path)
            .await
            .map_err(|e| FormatError::store(&path, e))?;
        if meta.size != written {
            return Err(FormatError::corrupt(
                &path,
                format!("wrote {written} bytes, the store holds {}", meta.size),
            ));
        }
        if let Some((held, _)) = self.held {
            self.dir
                .keep_written(&self.relative, self.columns.clone(), held);
        }
        let file = DataFile {
            path: self.relative,
            columns: self.columns,
            size_bytes: meta.size,
            footer: Some(footer),
            stats: self.stats.finish(),
        };
        Ok((file, self.rows))
    }
}

/// `batch` (of the table's declared types) in its stored form, of schema `storage`.
fn stored_batch(batch: &RecordBatch, storage: &SchemaRef) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(batch.schema().fields())
        .map(|(c, f)| to_storage(c).map_err(|e| FormatError::storage_type(f, e)))
        .collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        storage.clone(),
        columns,
        &options,
    )?)
}

/// Writes a stream of batches into fragments of at most `max_rows` rows each, in input order.
pub async fn write_fragments<S>(
    dir: &Arc<TableDir>,
    schema: &SchemaRef,
    batches: S,
    max_rows: u64,
) -> Result<Vec<WrittenFragment>>
where
    S: Stream<Item = Result<RecordBatch>> + Unpin,
{
    let max_rows = max_rows.max(1);
    write_sized_fragments(dir, schema, batches, std::iter::repeat(max_rows)).await
}

/// Writes a stream of batches into fragments, in input order: the i-th fragment gets
/// `sizes[i]` rows (the last one fewer if the input ends; rows past the sizes are an error).
pub async fn write_sized_fragments<S, I>(
    dir: &Arc<TableDir>,
    schema: &SchemaRef,
    mut batches: S,
    sizes: I,
) -> Result<Vec<WrittenFragment>>
where
    S: Stream<Item = Result<RecordBatch>> + Unpin,
    I: IntoIterator<Item = u64>,
{
    let mut sizes = sizes.into_iter();
    let mut done = Vec::new();
    let mut current: Option<(FileWriter, u64)> = None;
    while let Some(batch) = batches.next().await {
        let mut batch = batch?;
        while batch.num_rows() > 0 {
            let (writer, size) = match &mut current {
                Some(w) => w,
                None => {
                    let size = sizes.next().filter(|s| *s > 0).ok_or_else(|| {
                        FormatError::invalid("more rows than the fragment sizes allow")
                    })?;
                    current.insert((FileWriter::try_new(dir, schema)?, size))
                }
            };
            let room = (*size - writer.rows) as usize;
            let take = room.min(batch.num_rows());
            writer.write(&batch.slice(0, take)).await?;
            batch = batch.slice(take, batch.num_rows() - take);
            if writer.rows == *size {
                let (w, _) = current.take().expect("writer present");
                let (file, rows) = w.finish().await?;
                done.push(WrittenFragment {
                    files: vec![file],
                    physical_rows: rows,
                });
            }
        }
    }
    if let Some((w, _)) = current.take()
        && w.rows > 0
    {
        let (file, rows) = w.finish().await?;
        done.push(WrittenFragment {
            files: vec![file],
            physical_rows: rows,
        });
    }
    Ok(done)
}

/// Writes a stream of batches into `destinations` fragments at once: row `i` of the stream
/// goes to fragment `labels[i]`, and each fragment receives its rows in stream order (a
/// stable partition). Every destination must receive at least one row.
pub async fn write_partitioned<S>(
    dir: &Arc<TableDir>,
    schema: &SchemaRef,
    mut batches: S,
    labels: &[u16],
    destinations: usize,
) -> Result<Vec<WrittenFragment>>
where
    S: Stream<Item = Result<RecordBatch>> + Unpin,
{
    let mut writers: Vec<Option<FileWriter>> = (0..destinations).map(|_| None).collect();
    let mut seen = 0usize;
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        let n = batch.num_rows();
        let Some(mine) = labels.get(seen..seen + n) else {
            return Err(FormatError::invalid("more rows than routing labels"));
        };
        seen += n;
        // One gather per batch: rows grouped by destination (a stable counting sort, so each
        // group keeps stream order), then a zero-copy slice per destination.
        let mut starts = vec![0usize; destinations + 1];
        for &d in mine {
            if d as usize >= destinations {
                return Err(FormatError::invalid(format!("no destination {d}")));
            }
            starts[d as usize + 1] += 1;
        }
        for d in 0..destinations {
            starts[d + 1] += starts[d];
        }
        let mut fill = starts.clone();
        let mut order = vec![0u32; n];
        for (i, &d) in mine.iter().enumerate() {
            order[fill[d as usize]] = i as u32;
            fill[d as usize] += 1;
        }
        let indices = datafusion::arrow::array::UInt32Array::from(order);
        let grouped = datafusion::arrow::compute::take_record_batch(&batch, &indices)?;
        for d in 0..destinations {
            let (from, to) = (starts[d], starts[d + 1]);
            if from == to {
                continue;
            }
            let writer = match &mut writers[d] {
                Some(w) => w,
                None => writers[d].insert(FileWriter::try_new(dir, schema)?),
            };
            writer.write(&grouped.slice(from, to - from)).await?;
        }
    }
    if seen != labels.len() {
        return Err(FormatError::invalid(format!(
            "{} routing labels for {seen} rows",
            labels.len()
        )));
    }
    let mut out = Vec::with_capacity(destinations);
    for (d, w) in writers.into_iter().enumerate() {
        let w = w.ok_or_else(|| FormatError::invalid(format!("destination {d} got no rows")))?;
        let (file, rows) = w.finish().await?;
        out.push(WrittenFragment {
            files: vec![file],
            physical_rows: rows,
        });
    }
    Ok(out)
}

/// Writes one file holding `schema`'s columns for every physical row of a fragment (used by
/// in-place column rewrites). The caller guarantees the row count matches the fragment.
pub async fn write_column_file(
    dir: &Arc<TableDir>,
    batches: Vec<RecordBatch>,
    schema: &SchemaRef,
) -> Result<(DataFile, u64)> {
    let mut writer = FileWriter::try_new(dir, schema)?;
    for b in &batches {
        writer.write(b).await?;
    }
    writer.finish().await
}

//! Reading and writing the Parquet data files of fragments.
//!
//! Readers return a fragment's **physical** rows in offset order (deleted rows included); the
//! scan layer applies deletion vectors, because only it knows which offsets it needs.
//!
//! Every read goes through [`read_file`]: a file whose manifest entry records a footer
//! checksum is read through the verifying range reader of [`super::integrity`], so a damaged
//! page or footer is a `Corrupt` error naming the file before any value is decoded.
//!
//! Callers speak the table's declared (logical) types only: a column of a type Parquet cannot
//! store is written as its storage type and turned back on read, here and nowhere else (see
//! [`super::storage_types`]). Readers take no predicate and no Parquet statistic but the null
//! counts of [`row_groups_with_nulls`], which every storage type keeps exact.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex};

use bytes::Bytes;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
// `ParquetObjectReader` is deprecated in parquet 59 in favour of hand-written readers; it is
// still what DataFusion 55 itself builds on, and it does exactly the range reads we want.
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection,
};
#[allow(deprecated)]
use datafusion::parquet::arrow::async_reader::ParquetObjectReader;
use datafusion::parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use datafusion::parquet::basic::Compression;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::{KeyValue, PageIndexPolicy};
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::parquet::schema::types::ColumnPath;
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;

use super::error::{FormatError, Result};
use super::integrity::parquet_io::{PageChecksummer, VerifyingReader, format_error, load_verified};
use super::integrity::units::{PAGE_CRC_KEY, UnitTable};
use super::manifest::{DataFile, Fragment};
use super::storage_types::{from_storage, storage_schema, storage_type, to_storage, unstorable};
use super::store::{TableDir, random_tag};

/// Rows per Parquet row group: small enough that a writer buffers tens of MB, not hundreds.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;

/// A fragment written but not yet committed: it gets its id when the commit assigns one.
#[derive(Clone, Debug, PartialEq)]
pub struct WrittenFragment {
    pub files: Vec<DataFile>,
    pub physical_rows: u64,
}

fn writer_properties(schema: &SchemaRef) -> WriterProperties {
    let mut builder = WriterProperties::builder();
    // Vector values almost never repeat: a dictionary only costs hashing every float.
    for field in schema.fields() {
        if let DataType::FixedSizeList(item, _) | DataType::List(item) = field.data_type() {
            let path = ColumnPath::new(vec![
                field.name().clone(),
                "list".to_string(),
                item.name().clone(),
            ]);
            builder = builder.set_column_dictionary_enabled(path, false);
        }
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

/// A data file opened for reading: its footer (with page indexes) and, when the manifest
/// records a footer checksum, its verified checksum table.
#[derive(Clone)]
struct OpenedFile {
    metadata: ArrowReaderMetadata,
    units: Option<Arc<UnitTable>>,
}

/// Footers of recently read data files. Data files are immutable and named uniquely, so an
/// entry never goes stale (the key holds the footer checksum too, so a file read once
/// unverified through an old manifest entry is verified when read through a new one); the
/// map is bounded by count.
static METADATA: LazyLock<Mutex<HashMap<String, OpenedFile>>> = LazyLock::new(Default::default);
const METADATA_ENTRIES: usize = 4096;

/// Forgets every cached footer, so the next read of each data file starts cold, as in a new
/// process (benchmarks measuring a cold start use it; nothing else needs to).
pub fn forget_cached_footers() {
    METADATA.lock().expect("metadata cache").clear();
}

async fn open_file(dir: &TableDir, file: &DataFile) -> Result<OpenedFile> {
    let path = dir.path(&file.path);
    let key = format!("{}:{}:{:?}", dir.store(), path, file.footer);
    if let Some(m) = METADATA.lock().expect("metadata cache").get(&key) {
        return Ok(m.clone());
    }
    let opened = match &file.footer {
        Some(footer) => {
            let (metadata, units) = load_verified(dir, &file.path, file.size_bytes, footer).await?;
            OpenedFile {
                metadata,
                units: Some(units),
            }
        }
        None => {
            // Written before checksums: read as it is (see `integrity`).
            #[allow(deprecated)]
            let mut reader = ParquetObjectReader::new(dir.store().clone(), path.clone())
                .with_file_size(file.size_bytes);
            let metadata = ArrowReaderMetadata::load_async(
                &mut reader,
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::from(true)),
            )
            .await
            .map_err(|e| format_error(path.as_ref(), e))?;
            OpenedFile {
                metadata,
                units: None,
            }
        }
    };
    let mut cache = METADATA.lock().expect("metadata cache");
    if cache.len() >= METADATA_ENTRIES {
        cache.clear();
    }
    cache.insert(key, opened.clone());
    Ok(opened)
}

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
    rows: u64,
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
        let writer =
            ArrowWriter::try_new(Vec::new(), stored.clone(), Some(writer_properties(&stored)))
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
            rows: 0,
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
        let file = DataFile {
            path: self.relative,
            columns: self.columns,
            size_bytes: meta.size,
            footer: Some(footer),
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

/// `batch`, read from the file at `path`, with each column turned into its declared type (the
/// field of `declared` of the same name): a column holding neither its declared type nor its
/// storage type is corrupt.
fn declared_batch(batch: RecordBatch, declared: &[FieldRef], path: &str) -> Result<RecordBatch> {
    let schema = batch.schema();
    let same = |f: &FieldRef| declared.iter().find(|d| d.name() == f.name());
    if schema
        .fields()
        .iter()
        .all(|f| same(f).is_none_or(|d| d.data_type() == f.data_type()))
    {
        return Ok(batch);
    }
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, column) in schema.fields().iter().zip(batch.columns()) {
        let Some(d) = same(f).filter(|d| d.data_type() != f.data_type()) else {
            fields.push(f.clone());
            columns.push(column.clone());
            continue;
        };
        if f.data_type() != &storage_type(d.data_type()) {
            return Err(FormatError::corrupt(
                path,
                format!(
                    "column '{}' holds {}, the table declares {}",
                    f.name(),
                    f.data_type(),
                    d.data_type()
                ),
            ));
        }
        let column = from_storage(column, d.data_type())
            .map_err(|e| FormatError::storage_type(d, format!("reading {path}: {e}")))?;
        fields.push(Arc::new(Field::new(
            f.name(),
            d.data_type().clone(),
            f.is_nullable(),
        )));
        columns.push(column);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
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

/// Streams the physical rows of `fragment`, restricted to `schema`'s columns (a subset of the
/// table schema, in any order), in batches of at most `batch_size` rows.
pub fn read_fragment(
    dir: Arc<TableDir>,
    fragment: &Fragment,
    schema: SchemaRef,
    batch_size: usize,
) -> BoxStream<'static, Result<RecordBatch>> {
    read_columns(dir, fragment, schema, batch_size, None)
}

fn read_columns(
    dir: Arc<TableDir>,
    fragment: &Fragment,
    schema: SchemaRef,
    batch_size: usize,
    selection: Option<RowSelection>,
) -> BoxStream<'static, Result<RecordBatch>> {
    if schema.fields().is_empty() {
        // Nothing to read: only the row count matters (e.g. COUNT(*)).
        let total = fragment.physical_rows as usize;
        let chunks = (0..total).step_by(batch_size.max(1)).map(move |start| {
            let n = batch_size.min(total - start);
            RecordBatch::try_new_with_options(
                Arc::new(Schema::empty()),
                vec![],
                &RecordBatchOptions::new().with_row_count(Some(n)),
            )
            .map_err(FormatError::from)
        });
        return stream::iter(chunks.collect::<Vec<_>>()).boxed();
    }
    // Group the wanted columns by the file that holds them, keeping file order.
    let mut per_file: Vec<(DataFile, Vec<FieldRef>)> = Vec::new();
    for field in schema.fields() {
        let Some(file) = fragment.file_for_column(field.name()) else {
            let err = FormatError::corrupt(
                format!("fragment {}", fragment.id),
                format!("no data file holds column '{}'", field.name()),
            );
            return stream::once(async move { Err(err) }).boxed();
        };
        match per_file.iter_mut().find(|(f, _)| f.path == file.path) {
            Some((_, cols)) => cols.push(field.clone()),
            None => per_file.push((file.clone(), vec![field.clone()])),
        }
    }
    let expected_rows = fragment.physical_rows;
    let streams: Vec<_> = per_file
        .into_iter()
        .map(|(file, cols)| {
            read_file(
                dir.clone(),
                file,
                cols,
                batch_size,
                expected_rows,
                selection.clone(),
            )
        })
        .collect();
    zip_columns(streams, schema)
}

/// Reads only the rows at `offsets` (ascending, distinct) of a fragment, in that order.
/// Parquet pages holding none of them are skipped.
pub fn read_fragment_rows(
    dir: Arc<TableDir>,
    fragment: &Fragment,
    schema: SchemaRef,
    offsets: &[u64],
) -> BoxStream<'static, Result<RecordBatch>> {
    if let Some(bad) = offsets.iter().find(|o| **o >= fragment.physical_rows) {
        let err = FormatError::invalid(format!(
            "offset {bad} is past fragment {}'s end",
            fragment.id
        ));
        return stream::once(async move { Err(err) }).boxed();
    }
    let ranges = offsets.iter().map(|&o| o as usize..o as usize + 1);
    let selection = RowSelection::from_consecutive_ranges(ranges, fragment.physical_rows as usize);
    if schema.fields().is_empty() {
        let n = offsets.len();
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .map_err(FormatError::from);
        return stream::once(async move { batch }).boxed();
    }
    read_columns(dir, fragment, schema, offsets.len().max(1), Some(selection))
}

/// Reads `schema`'s columns of the rows in `ranges` (ascending, disjoint offset ranges) of a
/// fragment, in that order; row groups and pages outside them are skipped.
pub fn read_fragment_ranges(
    dir: Arc<TableDir>,
    fragment: &Fragment,
    schema: SchemaRef,
    ranges: &[Range<u64>],
    batch_size: usize,
) -> BoxStream<'static, Result<RecordBatch>> {
    let rows = fragment.physical_rows;
    if let Some(bad) = ranges
        .windows(2)
        .find(|w| w[0].end > w[1].start)
        .map(|w| w[1].clone())
        .or_else(|| {
            ranges
                .iter()
                .find(|r| r.start > r.end || r.end > rows)
                .cloned()
        })
    {
        let err = FormatError::invalid(format!(
            "row range {bad:?} of fragment {} is out of order or past its {rows} rows",
            fragment.id
        ));
        return stream::once(async move { Err(err) }).boxed();
    }
    let selection = RowSelection::from_consecutive_ranges(
        ranges.iter().map(|r| r.start as usize..r.end as usize),
        rows as usize,
    );
    read_columns(dir, fragment, schema, batch_size, Some(selection))
}

/// The offset ranges of the row groups of a fragment whose `column` may hold a NULL at any
/// level (a NULL vector or a NULL element), by the Parquet statistics of the file holding it:
/// row groups whose statistics count no NULL are left out, those without statistics kept.
/// Reads the file's footer only (cached).
pub async fn row_groups_with_nulls(
    dir: &Arc<TableDir>,
    fragment: &Fragment,
    column: &str,
) -> Result<Vec<Range<u64>>> {
    let file = fragment.file_for_column(column).ok_or_else(|| {
        FormatError::corrupt(
            format!("fragment {}", fragment.id),
            format!("no data file holds column '{column}'"),
        )
    })?;
    let path = dir.path(&file.path);
    // The footer through the same (verified, cached) opening as every read.
    let metadata = open_file(dir, file).await?.metadata;
    let mut ranges = Vec::new();
    let mut start = 0u64;
    for group in metadata.metadata().row_groups() {
        let rows = group.num_rows() as u64;
        let may_hold_null = group
            .columns()
            .iter()
            .filter(|c| c.column_path().parts().first().map(String::as_str) == Some(column))
            .any(|c| {
                c.statistics()
                    .and_then(|s| s.null_count_opt())
                    .is_none_or(|n| n > 0)
            });
        if may_hold_null && rows > 0 {
            ranges.push(start..start + rows);
        }
        start += rows;
    }
    if start != fragment.physical_rows {
        return Err(FormatError::corrupt(
            &path,
            format!(
                "holds {start} rows, its fragment has {}",
                fragment.physical_rows
            ),
        ));
    }
    Ok(ranges)
}

/// Reads the `columns` (declared fields) of one data file, in the file's column order.
fn read_file(
    dir: Arc<TableDir>,
    file: DataFile,
    columns: Vec<FieldRef>,
    batch_size: usize,
    expected_rows: u64,
    selection: Option<RowSelection>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let open = async move {
        let path = dir.path(&file.path);
        let perr = |e| format_error(path.as_ref(), e);
        let opened = open_file(&dir, &file).await?;
        #[allow(deprecated)]
        let object = ParquetObjectReader::new(dir.store().clone(), path.clone())
            .with_file_size(file.size_bytes);
        // Every range the decoder asks for is verified first when the file has checksums.
        let reader: Box<dyn AsyncFileReader> = match opened.units {
            Some(units) => Box::new(VerifyingReader::new(
                object,
                path.clone(),
                units,
                opened.metadata.metadata().clone(),
            )),
            None => Box::new(object),
        };
        let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, opened.metadata);
        let file_rows = builder.metadata().file_metadata().num_rows() as u64;
        if file_rows != expected_rows {
            return Err(FormatError::corrupt(
                &path,
                format!("holds {file_rows} rows, its fragment has {expected_rows}"),
            ));
        }
        let file_schema = builder.schema().clone();
        let indices = columns
            .iter()
            .map(|c| {
                let c = c.name();
                file_schema.index_of(c).map_err(|_| {
                    FormatError::corrupt(&path, format!("column '{c}' missing from the file"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), indices.iter().copied());
        let mut builder = builder.with_projection(mask).with_batch_size(batch_size);
        if let Some(selection) = selection {
            builder = builder.with_row_selection(selection);
        }
        let stream = builder.build().map_err(perr)?;
        let path_for_err = path.to_string();
        Ok(stream.map(move |b| {
            let b = b.map_err(|e| format_error(&path_for_err, e))?;
            declared_batch(b, &columns, &path_for_err)
        }))
    };
    stream::once(open).try_flatten().boxed()
}

/// Stitches the per-file streams of one fragment into batches of `schema`, re-slicing so that
/// files with different batch boundaries still line up row for row.
fn zip_columns(
    streams: Vec<BoxStream<'static, Result<RecordBatch>>>,
    schema: SchemaRef,
) -> BoxStream<'static, Result<RecordBatch>> {
    if streams.len() == 1 {
        let schema2 = schema.clone();
        return streams
            .into_iter()
            .next()
            .expect("one stream")
            .map(move |b| reorder(&b?, &schema2))
            .boxed();
    }
    struct State {
        streams: Vec<BoxStream<'static, Result<RecordBatch>>>,
        pending: Vec<VecDeque<RecordBatch>>,
        schema: SchemaRef,
    }
    let n = streams.len();
    let state = State {
        streams,
        pending: vec![VecDeque::new(); n],
        schema,
    };
    stream::try_unfold(state, |mut st| async move {
        // Make sure every file has a batch ready (or is exhausted).
        for i in 0..st.streams.len() {
            if st.pending[i].is_empty()
                && let Some(b) = st.streams[i].next().await
            {
                st.pending[i].push_back(b?);
            }
        }
        let lens: Vec<usize> = st
            .pending
            .iter()
            .map(|q| q.front().map_or(0, |b| b.num_rows()))
            .collect();
        let Some(&take) = lens.iter().min() else {
            return Ok(None);
        };
        if take == 0 {
            if lens.iter().any(|&l| l > 0) {
                return Err(FormatError::corrupt(
                    "fragment",
                    "data files hold different row counts",
                ));
            }
            return Ok(None);
        }
        let mut columns: Vec<(String, ArrayRef)> = Vec::new();
        for q in st.pending.iter_mut() {
            let front = q.pop_front().expect("non-empty");
            let head = front.slice(0, take);
            if front.num_rows() > take {
                q.push_front(front.slice(take, front.num_rows() - take));
            }
            for (f, c) in head.schema().fields().iter().zip(head.columns()) {
                columns.push((f.name().clone(), c.clone()));
            }
        }
        let arrays = st
            .schema
            .fields()
            .iter()
            .map(|f| {
                columns
                    .iter()
                    .find(|(n, _)| n == f.name())
                    .map(|(_, a)| a.clone())
                    .ok_or_else(|| {
                        FormatError::corrupt("fragment", format!("column '{}' missing", f.name()))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new(st.schema.clone(), arrays)?;
        Ok(Some((batch, st)))
    })
    .boxed()
}

fn reorder(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let arrays = schema
        .fields()
        .iter()
        .map(|f| {
            batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                FormatError::corrupt("fragment", format!("column '{}' missing", f.name()))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), arrays)?)
}

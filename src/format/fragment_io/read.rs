//! Reading fragments' Parquet data files.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{Field, FieldRef, Schema, SchemaRef};
// `ParquetObjectReader` is deprecated in parquet 59 in favour of hand-written readers; it is
// still what DataFusion 55 itself builds on, and it does exactly the range reads we want.
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection,
};
#[allow(deprecated)]
use datafusion::parquet::arrow::async_reader::ParquetObjectReader;
use datafusion::parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use datafusion::parquet::file::metadata::PageIndexPolicy;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};

use crate::format::error::{FormatError, Result};
use crate::format::fetch_windows::{
    FETCH_BYTES, GroupSize, batch_rows, concurrent_windows, fetch_windows, selected_ranges,
    selected_rows, window_selection,
};
use crate::format::integrity::parquet_io::{VerifyingReader, format_error, load_verified};
use crate::format::integrity::units::UnitTable;
use crate::format::manifest::{DataFile, Fragment};
use crate::format::storage_types::{from_storage, storage_type};
use crate::format::store::TableDir;

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

/// The footer of data file `file` (verified and cached, as every read opens it): its row
/// groups with their Parquet statistics, and its Arrow schema as stored.
pub async fn data_file_footer(dir: &Arc<TableDir>, file: &DataFile) -> Result<ArrowReaderMetadata> {
    Ok(open_file(dir, file).await?.metadata)
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

/// Reads the `columns` (declared fields) of one data file, in the file's column order. A row
/// group whose projected columns are larger than [`FETCH_BYTES`] is read in windows of rows
/// (see [`super::fetch_windows`]), so a read never fetches more than about that much at once.
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
        let opened = open_file(&dir, &file).await?;
        let metadata = opened.metadata.metadata().clone();
        let file_rows = metadata.file_metadata().num_rows() as u64;
        if file_rows != expected_rows {
            return Err(FormatError::corrupt(
                &path,
                format!("holds {file_rows} rows, its fragment has {expected_rows}"),
            ));
        }
        let file_schema = opened.metadata.schema().clone();
        let indices = columns
            .iter()
            .map(|c| {
                let c = c.name();
                file_schema.index_of(c).map_err(|_| {
                    FormatError::corrupt(&path, format!("column '{c}' missing from the file"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mask = ProjectionMask::roots(metadata.file_metadata().schema_descr(), indices);
        let sizes: Vec<GroupSize> = metadata
            .row_groups()
            .iter()
            .map(|g| GroupSize {
                rows: g.num_rows() as u64,
                bytes: g
                    .columns()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask.leaf_included(*i))
                    .map(|(_, c)| c.compressed_size().max(0) as u64)
                    .sum(),
            })
            .collect();
        let reader = FileReader {
            dir,
            path,
            size: file.size_bytes,
            opened,
            mask,
            batch_size,
            columns: Arc::new(columns),
        };
        let Some(windows) = fetch_windows(&sizes, FETCH_BYTES, batch_size) else {
            return reader.stream(None, selection);
        };
        let selected = selection.as_ref().map(selected_ranges);
        let mut starts = Vec::with_capacity(sizes.len());
        let mut at = 0u64;
        for g in &sizes {
            starts.push(at);
            at += g.rows;
        }
        let reads: Vec<(usize, RowSelection)> = windows
            .into_iter()
            .filter_map(|w| {
                let selection = window_selection(
                    selected.as_deref(),
                    starts[w.group],
                    sizes[w.group].rows,
                    &w.rows,
                )?;
                Some((w.group, selection))
            })
            .collect();
        let at_once = concurrent_windows(
            reads.iter().map(|(group, selection)| {
                let g = sizes[*group];
                selected_rows(selection) * g.bytes.div_ceil(g.rows.max(1))
            }),
            FETCH_BYTES,
        );
        let reader = Arc::new(reader);
        if at_once == 1 {
            // One window at a time: the next is opened when the last has been read.
            return Ok(stream::iter(reads)
                .map(move |(group, selection)| reader.stream(Some(group), Some(selection)))
                .try_flatten()
                .boxed());
        }
        // Windows of few selected rows: several fetched at once, their batches in order.
        Ok(stream::iter(reads)
            .map(move |(group, selection)| {
                let reader = reader.clone();
                async move {
                    let batches: Vec<RecordBatch> = reader
                        .stream(Some(group), Some(selection))?
                        .try_collect()
                        .await?;
                    Ok::<_, FormatError>(stream::iter(batches.into_iter().map(Ok)))
                }
            })
            .buffered(at_once)
            .try_flatten()
            .boxed())
    };
    stream::once(open).try_flatten().boxed()
}

/// What [`read_file`] needs to open a stream over (part of) one data file.
struct FileReader {
    dir: Arc<TableDir>,
    path: object_store::path::Path,
    size: u64,
    opened: OpenedFile,
    mask: ProjectionMask,
    batch_size: usize,
    columns: Arc<Vec<FieldRef>>,
}

impl FileReader {
    /// The declared batches of row group `group` (or of every row group), restricted to
    /// `selection` (over that group's rows, or the file's).
    fn stream(
        &self,
        group: Option<usize>,
        selection: Option<RowSelection>,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        #[allow(deprecated)]
        let object = ParquetObjectReader::new(self.dir.store().clone(), self.path.clone())
            .with_file_size(self.size);
        // Every range the decoder asks for is verified first when the file has checksums.
        let reader: Box<dyn AsyncFileReader> = match &self.opened.units {
            Some(units) => Box::new(VerifyingReader::new(
                object,
                self.path.clone(),
                units.clone(),
                self.opened.metadata.metadata().clone(),
            )),
            None => Box::new(object),
        };
        let groups = self.opened.metadata.metadata().row_groups();
        let group_rows = match group {
            Some(g) => groups.get(g..=g).unwrap_or_default().iter(),
            None => groups.iter(),
        }
        .map(|g| g.num_rows().max(0) as u64);
        let batch_size = batch_rows(self.batch_size, selection.as_ref(), group_rows);
        let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
            reader,
            self.opened.metadata.clone(),
        )
        .with_projection(self.mask.clone())
        .with_batch_size(batch_size);
        if let Some(group) = group {
            builder = builder.with_row_groups(vec![group]);
        }
        if let Some(selection) = selection {
            builder = builder.with_row_selection(selection);
        }
        let stream = builder
            .build()
            .map_err(|e| format_error(self.path.as_ref(), e))?;
        let path = self.path.to_string();
        let columns = self.columns.clone();
        Ok(stream
            .map(move |b| {
                let b = b.map_err(|e| format_error(&path, e))?;
                declared_batch(b, &columns, &path)
            })
            .boxed())
    }
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

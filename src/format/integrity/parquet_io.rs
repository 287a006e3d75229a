//! The IO side of data-file checksums: the writer's page checksummer, which sees each row
//! group's bytes while they are still in memory, and an `AsyncFileReader` that verifies
//! every range the Parquet reader fetches. The checksum table and its arithmetic are in [`super::units`].
//!
//! Cost: writing CRCs each byte once, in memory (no re-read); reading fetches the same
//! ranges as before (the footer in one request instead of two or three) and CRCs them.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
#[allow(deprecated)]
use datafusion::parquet::arrow::async_reader::ParquetObjectReader;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::page_walk::page_lengths;
use super::units::{PAGE_CRC_KEY, UnitTable, chunk_layouts, decode_crcs};
use crate::format::error::{FormatError, Result};
use crate::format::manifest::FooterChecksum;
use crate::format::store::TableDir;

/// Bytes the writer produced and has not checksummed yet, from file offset `start`.
#[derive(Debug, Default)]
struct Tee {
    start: u64,
    chunks: Vec<Bytes>,
    written: u64,
}

impl Tee {
    /// The bytes of `range` (contiguous; copied only if they straddle two writes).
    fn slice(&self, range: &Range<u64>) -> Option<Bytes> {
        if range.start < self.start || range.end > self.written || range.start > range.end {
            return None;
        }
        let mut at = self.start;
        for c in &self.chunks {
            let end = at + c.len() as u64;
            if range.start >= at && range.end <= end {
                return Some(c.slice((range.start - at) as usize..(range.end - at) as usize));
            }
            at = end;
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        let mut at = self.start;
        for c in &self.chunks {
            let end = at + c.len() as u64;
            let from = range.start.max(at);
            let to = range.end.min(end);
            if from < to {
                out.extend_from_slice(&c[(from - at) as usize..(to - at) as usize]);
            }
            at = end;
        }
        Some(out.freeze())
    }

    /// Forgets every byte before `offset`.
    fn release_before(&mut self, offset: u64) {
        while let Some(c) = self.chunks.first() {
            let end = self.start + c.len() as u64;
            if end > offset {
                break;
            }
            self.start = end;
            self.chunks.remove(0);
        }
    }
}

/// Checksums the pages of each row group the writer flushes, then the footer. The writer
/// hands it every byte it uploads ([`push`](Self::push)); bytes are kept only until their
/// row group is checksummed (at most about one row group, which the Parquet writer buffers
/// in memory anyway).
#[derive(Debug)]
pub struct PageChecksummer {
    path: String,
    tee: Tee,
    crcs: Vec<u32>,
    /// Unit lengths, cross-checked against the footer's offset index at the end.
    lengths: Vec<u64>,
    row_groups_done: usize,
}

impl PageChecksummer {
    /// An empty checksummer for the file being written at `path`; the path only names the
    /// file in errors.
    pub fn new(path: &str) -> Self {
        Self {
            path: path.to_string(),
            tee: Tee::default(),
            crcs: Vec::new(),
            lengths: Vec::new(),
            row_groups_done: 0,
        }
    }

    fn corrupt(&self, reason: impl Into<String>) -> FormatError {
        FormatError::corrupt(&self.path, reason)
    }

    /// The next bytes of the file, in order.
    pub fn push(&mut self, bytes: Bytes) {
        self.tee.written += bytes.len() as u64;
        self.tee.chunks.push(bytes);
    }

    /// Bytes pushed so far.
    pub fn written(&self) -> u64 {
        self.tee.written
    }

    /// Checksums the pages of the row groups in `flushed` not done yet. Every byte of them
    /// must have been pushed.
    pub fn absorb(&mut self, flushed: &[RowGroupMetaData]) -> Result<()> {
        for rg in &flushed[self.row_groups_done.min(flushed.len())..] {
            let mut end = 0;
            for column in rg.columns() {
                let (start, len) = column.byte_range();
                let range = start..start + len;
                let bytes = self.tee.slice(&range).ok_or_else(|| {
                    self.corrupt(format!(
                        "writing: column chunk {range:?} was not handed to the checksummer"
                    ))
                })?;
                let lengths =
                    page_lengths(&bytes).map_err(|e| self.corrupt(format!("writing: {e}")))?;
                let mut at = 0usize;
                for len in lengths {
                    self.crcs
                        .push(crc32c::crc32c(&bytes[at..at + len as usize]));
                    self.lengths.push(len);
                    at += len as usize;
                }
                end = end.max(range.end);
            }
            self.tee.release_before(end);
        }
        self.row_groups_done = flushed.len();
        Ok(())
    }

    /// The table to store in the footer's key-value metadata.
    pub fn page_table(&self) -> String {
        super::units::encode_crcs(&self.crcs)
    }

    /// After the writer closed and every byte was pushed: the footer's checksum, once the
    /// pages recorded agree with the offset index the writer put in the footer.
    pub fn finish(self, footer_offset: u64, metadata: &ParquetMetaData) -> Result<FooterChecksum> {
        let expected: Vec<u64> = chunk_layouts(metadata)
            .and_then(|chunks| {
                chunks
                    .iter()
                    .map(|c| c.unit_ranges())
                    .collect::<std::result::Result<Vec<_>, String>>()
            })
            .map_err(|e| self.corrupt(format!("writing: {e}")))?
            .into_iter()
            .flatten()
            .map(|r| r.end - r.start)
            .collect();
        if expected != self.lengths {
            return Err(self.corrupt(
                "writing: the pages found in the column chunks disagree with the offset index",
            ));
        }
        let footer = self
            .tee
            .slice(&(footer_offset..self.tee.written))
            .filter(|f| !f.is_empty())
            .ok_or_else(|| self.corrupt("writing: the footer was not handed to the checksummer"))?;
        Ok(FooterChecksum {
            offset: footer_offset,
            crc32c: crc32c::crc32c(&footer),
        })
    }
}

/// Reads and verifies a data file's footer (one range read), returning its metadata (with
/// the page index) and its checksum table.
pub async fn load_verified(
    dir: &TableDir,
    relative: &str,
    size: u64,
    footer: &FooterChecksum,
) -> Result<(ArrowReaderMetadata, Arc<UnitTable>)> {
    let path = dir.path(relative);
    let corrupt = |reason: String| FormatError::corrupt(&path, reason);
    if footer.offset < 4 || footer.offset >= size {
        return Err(corrupt(format!(
            "footer offset {} is outside the {size}-byte file",
            footer.offset
        )));
    }
    let bytes = dir
        .store()
        .get_range(&path, footer.offset..size)
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    super::check(
        &path,
        &format!("footer (bytes {}..{size})", footer.offset),
        &bytes,
        footer.crc32c,
    )?;
    let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Required);
    reader
        .try_parse_sized(&bytes, size)
        .map_err(|e| corrupt(format!("unreadable footer: {e}")))?;
    let metadata = reader
        .finish()
        .map_err(|e| corrupt(format!("unreadable footer: {e}")))?;
    let table = metadata
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == PAGE_CRC_KEY))
        .and_then(|kv| kv.value.as_deref())
        .ok_or_else(|| corrupt("the footer has no page checksum table".into()))?;
    let crcs = decode_crcs(table).map_err(&corrupt)?;
    let chunks = chunk_layouts(&metadata).map_err(&corrupt)?;
    let units =
        UnitTable::new(&chunks, &crcs, footer.offset..size, footer.crc32c).map_err(&corrupt)?;
    let metadata = ArrowReaderMetadata::try_new(
        Arc::new(metadata),
        ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::from(true)),
    )
    .map_err(|e| corrupt(format!("unreadable footer: {e}")))?;
    Ok((metadata, Arc::new(units)))
}

/// A range reader that fetches whole checksummed units and verifies them before the Parquet
/// decoder sees a byte. A mismatch is a [`FormatError::Corrupt`] naming the file, carried
/// through Parquet as [`ParquetError::External`] (see [`format_error`]).
pub struct VerifyingReader {
    #[allow(deprecated)]
    inner: ParquetObjectReader,
    path: Path,
    units: Arc<UnitTable>,
    metadata: Arc<ParquetMetaData>,
}

impl VerifyingReader {
    /// A reader of the file at `path` through `inner` that widens every request to whole
    /// `units` and verifies them; `metadata` is the file's footer, already verified.
    #[allow(deprecated)]
    pub fn new(
        inner: ParquetObjectReader,
        path: Path,
        units: Arc<UnitTable>,
        metadata: Arc<ParquetMetaData>,
    ) -> Self {
        Self {
            inner,
            path,
            units,
            metadata,
        }
    }

    fn corrupt(&self, reason: String) -> ParquetError {
        ParquetError::External(Box::new(FormatError::corrupt(&self.path, reason)))
    }
}

impl AsyncFileReader for VerifyingReader {
    fn get_bytes(
        &mut self,
        range: Range<u64>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Bytes>> {
        async move {
            let mut got = self.get_byte_ranges(vec![range]).await?;
            Ok(got.pop().unwrap_or_default())
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let widened = ranges
                .iter()
                .map(|r| self.units.widen(r))
                .collect::<std::result::Result<Vec<_>, String>>()
                .map_err(|e| self.corrupt(e))?;
            let fetched = self.inner.get_byte_ranges(widened.clone()).await?;
            let mut out = Vec::with_capacity(ranges.len());
            for ((r, w), bytes) in ranges.iter().zip(&widened).zip(fetched) {
                self.units
                    .verify(w.start, &bytes)
                    .map_err(|e| self.corrupt(e))?;
                out.push(bytes.slice((r.start - w.start) as usize..(r.end - w.start) as usize));
            }
            Ok(out)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, datafusion::parquet::errors::Result<Arc<ParquetMetaData>>> {
        futures::future::ready(Ok(self.metadata.clone())).boxed()
    }
}

/// A Parquet error of file `path` as a [`FormatError`]: a corruption found by the
/// verifying reader comes back as itself.
pub fn format_error(path: &str, e: ParquetError) -> FormatError {
    match e {
        ParquetError::External(inner) => match inner.downcast::<FormatError>() {
            Ok(format) => *format,
            Err(other) => FormatError::Parquet {
                path: path.to_string(),
                source: ParquetError::External(other),
            },
        },
        other => FormatError::Parquet {
            path: path.to_string(),
            source: other,
        },
    }
}

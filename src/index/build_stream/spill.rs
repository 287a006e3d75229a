//! The rows of a streaming build, kept in temporary files between its assignment pass and
//! the writing of its segment (see [`super`]), so the segment is written from these files
//! rather than from more passes over the Parquet column.
//!
//! Partitions are cut into buckets of consecutive ids, one file per bucket. Each row is
//! appended to its partition's bucket as a record `partition: u32 | address: u64 | payload`
//! (little endian; the payload is the segment's row bytes: floats or PQ codes). A bucket
//! reads back in the order its rows were appended: in scan order, so every partition's rows
//! come back in row order, ranked as the segment lists them.
//!
//! The files go to the system's temporary directory (`TMPDIR` on Unix). On Unix each is
//! unlinked as soon as it is created, so a crash leaves nothing behind; elsewhere it is
//! removed when the [`Spill`] is dropped. Nothing read back is trusted blindly: a record
//! whose partition is outside its bucket, or a file whose length is not whole records, is
//! an error.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::format::store::random_tag;
use crate::index::error::{IndexError, Result};

/// Bytes of a record before its payload: the partition (`u32`) and the row address (`u64`).
pub const RECORD_HEADER_BYTES: usize = 12;

/// Fewest bytes a spill file is written or read in at once, whatever the budget (a budget
/// of 0 must not make a system call per row).
pub const MIN_IO_BYTES: usize = 4096;

/// Rows of a streaming build, bucketed by partition, in temporary files.
pub struct Spill {
    index: String,
    buckets: Vec<Bucket>,
    partitions: usize,
    partitions_per_bucket: usize,
    row_width: usize,
    buffer_bytes: usize,
    records: u64,
}

/// One bucket's file and the records not yet written to it.
struct Bucket {
    file: File,
    /// The name the file was created with (for errors).
    path: PathBuf,
    /// Whether the name is still in the directory (it could not be unlinked at creation).
    remove_on_drop: bool,
    pending: Vec<u8>,
    /// Bytes written to the file.
    len: u64,
}

impl Drop for Bucket {
    fn drop(&mut self) {
        if self.remove_on_drop {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// How many buckets of consecutive partitions `partitions` make when each is to hold about
/// `bucket_bytes` of `total_bytes` (at least one, at most one per partition and `most`).
pub fn bucket_count(partitions: usize, total_bytes: u64, bucket_bytes: u64, most: usize) -> usize {
    let wanted = total_bytes.div_ceil(bucket_bytes.max(1));
    usize::try_from(wanted)
        .unwrap_or(usize::MAX)
        .min(most)
        .min(partitions)
        .max(1)
}

impl Spill {
    /// Creates `buckets` files in `dir` for the rows of `partitions` partitions whose
    /// payloads are `row_width` bytes, each buffering about `buffer_bytes` (at least
    /// [`MIN_IO_BYTES`]) before it writes.
    pub fn create(
        index: &str,
        dir: &Path,
        partitions: usize,
        buckets: usize,
        row_width: usize,
        buffer_bytes: usize,
    ) -> Result<Self> {
        let buckets = buckets.clamp(1, partitions.max(1));
        let partitions_per_bucket = partitions.div_ceil(buckets).max(1);
        let count = partitions.div_ceil(partitions_per_bucket).max(1);
        let tag = random_tag();
        let mut spill = Spill {
            index: index.to_string(),
            buckets: Vec::with_capacity(count),
            partitions,
            partitions_per_bucket,
            row_width,
            buffer_bytes: buffer_bytes.max(MIN_IO_BYTES),
            records: 0,
        };
        for b in 0..count {
            let path = dir.join(format!("fragvec-index-build-{tag}-{b}.spill"));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| spill.error(&path, "create", e))?;
            // Unlinked at once where an open file outlives its name (Unix): the space is
            // freed when the file is closed, even by a crash.
            let remove_on_drop = !(cfg!(unix) && std::fs::remove_file(&path).is_ok());
            spill.buckets.push(Bucket {
                file,
                path,
                remove_on_drop,
                // Flushed once it reaches `buffer_bytes`, so one more record never makes it
                // grow (its capacity is what `buffer_bytes()` counts).
                pending: Vec::with_capacity(spill.buffer_bytes + spill.record_bytes()),
                len: 0,
            });
        }
        Ok(spill)
    }

    fn error(&self, path: &Path, doing: &str, e: std::io::Error) -> IndexError {
        IndexError::Build {
            index: self.index.clone(),
            reason: format!(
                "cannot {doing} the temporary file {} (rows spilled by a build larger than \
                 fragvec.index_cache_bytes; TMPDIR chooses where): {e}",
                path.display()
            ),
        }
    }

    fn bucket_error(&self, bucket: usize, doing: &str, e: std::io::Error) -> IndexError {
        self.error(&self.buckets[bucket].path, doing, e)
    }

    fn corrupt(&self, bucket: usize, what: String) -> IndexError {
        IndexError::Build {
            index: self.index.clone(),
            reason: format!(
                "the temporary file {} changed under the build: {what}",
                self.buckets[bucket].path.display()
            ),
        }
    }

    /// Buckets.
    #[cfg(test)]
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> usize {
        RECORD_HEADER_BYTES + self.row_width
    }

    /// Most bytes the write buffers hold at once.
    pub fn buffer_bytes(&self) -> usize {
        self.buckets.len() * (self.buffer_bytes + self.record_bytes())
    }

    /// Records appended.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes written to the files (after [`Spill::flush`], every record's).
    pub fn bytes_written(&self) -> u64 {
        self.buckets.iter().map(|b| b.len).sum()
    }

    /// The buckets holding partitions `partitions` (ids; a non-empty range).
    pub fn buckets_of(&self, partitions: Range<usize>) -> Range<usize> {
        let start = partitions.start / self.partitions_per_bucket;
        let end = partitions.end.div_ceil(self.partitions_per_bucket);
        start.min(self.buckets.len())..end.min(self.buckets.len())
    }

    /// Appends the row at `addr` of `partition` with `payload` (`row_width` bytes).
    pub fn push(&mut self, partition: u32, addr: u64, payload: &[u8]) -> Result<()> {
        let p = partition as usize;
        if p >= self.partitions || payload.len() != self.row_width {
            return Err(IndexError::Build {
                index: self.index.clone(),
                reason: format!(
                    "spilled row of partition {p} ({} bytes) does not fit {} partitions of \
                     {}-byte rows",
                    payload.len(),
                    self.partitions,
                    self.row_width
                ),
            });
        }
        let b = p / self.partitions_per_bucket;
        let bucket = &mut self.buckets[b];
        bucket.pending.extend_from_slice(&partition.to_le_bytes());
        bucket.pending.extend_from_slice(&addr.to_le_bytes());
        bucket.pending.extend_from_slice(payload);
        self.records += 1;
        if bucket.pending.len() >= self.buffer_bytes {
            self.write_pending(b)?;
        }
        Ok(())
    }

    fn write_pending(&mut self, b: usize) -> Result<()> {
        let bucket = &mut self.buckets[b];
        let written = bucket.file.write_all(&bucket.pending);
        if let Err(e) = written {
            return Err(self.bucket_error(b, "write", e));
        }
        bucket.len += bucket.pending.len() as u64;
        bucket.pending.clear();
        Ok(())
    }

    /// Writes every buffered record and frees the buffers: the spill is then read only.
    pub fn flush(&mut self) -> Result<()> {
        for b in 0..self.buckets.len() {
            self.write_pending(b)?;
            self.buckets[b].pending = Vec::new();
        }
        Ok(())
    }

    /// Calls `each(partition, address, payload)` for every record of `bucket`, in the order
    /// they were appended, reading about `chunk_bytes` (at least [`MIN_IO_BYTES`]) at a time
    /// (after [`Spill::flush`]).
    pub fn read_bucket(
        &self,
        bucket: usize,
        chunk_bytes: usize,
        mut each: impl FnMut(usize, u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let record = self.record_bytes();
        let len = self.buckets[bucket].len;
        if !len.is_multiple_of(record as u64) {
            return Err(self.corrupt(bucket, format!("{len} bytes, not whole records")));
        }
        let on_disk = self.buckets[bucket]
            .file
            .metadata()
            .map_err(|e| self.bucket_error(bucket, "read", e))?
            .len();
        if on_disk != len {
            return Err(self.corrupt(bucket, format!("{on_disk} bytes, {len} written")));
        }
        let partitions = self.partitions_per_bucket * bucket
            ..(self.partitions_per_bucket * (bucket + 1)).min(self.partitions);
        let mut file = &self.buckets[bucket].file;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| self.bucket_error(bucket, "read", e))?;
        let per_chunk = (chunk_bytes.max(MIN_IO_BYTES) / record).max(1);
        let mut chunk = vec![0u8; per_chunk * record];
        let mut left = len;
        while left > 0 {
            let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
            file.read_exact(&mut chunk[..n])
                .map_err(|e| self.bucket_error(bucket, "read", e))?;
            left -= n as u64;
            for r in chunk[..n].chunks_exact(record) {
                let (head, payload) = r.split_at(RECORD_HEADER_BYTES);
                let mut p = [0u8; 4];
                let mut addr = [0u8; 8];
                p.copy_from_slice(&head[..4]);
                addr.copy_from_slice(&head[4..]);
                let (p, addr) = (u32::from_le_bytes(p) as usize, u64::from_le_bytes(addr));
                if !partitions.contains(&p) {
                    return Err(self.corrupt(bucket, format!("a row of partition {p}")));
                }
                each(p, addr, payload)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

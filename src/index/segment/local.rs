//! Reading partitions of a segment file in a local directory: each partition's two blocks are
//! read with positional reads straight into the typed buffers a [`Partition`] holds (not
//! zeroed first), and checksummed there, on the blocking pool.
//!
//! Why not object_store's local reads: each request allocates a byte buffer that decoding
//! then copies into the partition's vectors, so every byte crossed memory twice more than it
//! must. A search whose index is larger than the cache budget reads tens of
//! megabytes per query (every partition, for an exact search), where that is most of the time.
//! The checks are the same ones [`super::read_partitions`] makes: sizes from the verified
//! footer, a short read is a truncated partition, each block's CRC32C.

use std::fs::File;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;

use super::{Footer, Partition, PartitionChecksum};
use crate::format::ranges::CONCURRENT_REQUESTS;
use crate::format::{FormatError, Result};

/// Where one partition is and what it must check against (copied out of the footer, so the
/// read can move to the blocking pool).
#[derive(Debug, Clone, Copy)]
struct Job {
    p: usize,
    offset: u64,
    rows: usize,
    row_width: usize,
    sums: Option<PartitionChecksum>,
    pq: bool,
}

/// Why a partition could not be read.
enum ReadError {
    Io(std::io::Error),
    Corrupt(String),
}

/// Reads, verifies and decodes partitions `ps` of the segment file at `file` (`path`: its store
/// path, for errors), concurrently; an empty partition is not read.
pub(super) async fn read_partitions(
    file: std::path::PathBuf,
    path: &Path,
    footer: &Footer,
    ps: &[usize],
    pq: bool,
) -> Result<Vec<Partition>> {
    let jobs: Vec<Job> = ps
        .iter()
        .map(|&p| Job {
            p,
            offset: footer.partitions[p].0,
            rows: footer.partitions[p].1 as usize,
            row_width: footer.row_width,
            sums: footer.checksums.as_ref().map(|s| s[p]),
            pq,
        })
        .collect();
    if jobs.iter().all(|j| j.rows == 0) {
        return Ok(vec![Partition::default(); jobs.len()]);
    }
    let opened = {
        let file = file.clone();
        tokio::task::spawn_blocking(move || File::open(file))
            .await
            .map_err(|e| FormatError::corrupt(path, format!("reading task failed: {e}")))?
    };
    let handle = Arc::new(opened.map_err(|e| io_error(path, e))?);
    let reads = jobs.into_iter().map(|job| {
        let handle = handle.clone();
        async move {
            if job.rows == 0 {
                return Ok(Partition::default());
            }
            // The buffers are allocated here, on the runtime's thread, not on the blocking
            // pool's: glibc gives each allocating thread an arena and keeps what is freed in
            // it, so buffers made on many short-lived threads inflate the resident size.
            let buffers = Buffers::for_job(&job);
            tokio::task::spawn_blocking(move || read_one(&handle, job, buffers))
                .await
                .map_err(|e| FormatError::corrupt(path, format!("reading task failed: {e}")))?
                .map_err(|e| match e {
                    ReadError::Io(e) => io_error(path, e),
                    ReadError::Corrupt(reason) => FormatError::corrupt(path, reason),
                })
        }
    });
    futures::stream::iter(reads)
        .buffered(CONCURRENT_REQUESTS)
        .try_collect()
        .await
}

/// A local read failure as the store would report it (a missing file is `NotFound`).
pub(super) fn io_error(path: &Path, e: std::io::Error) -> FormatError {
    let error = if e.kind() == std::io::ErrorKind::NotFound {
        object_store::Error::NotFound {
            path: path.to_string(),
            source: Box::new(e),
        }
    } else {
        object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        }
    };
    FormatError::store(path, error)
}

/// Empty vectors with the capacity one partition's blocks need.
struct Buffers {
    addrs: Vec<u64>,
    codes: Vec<u8>,
    vectors: Vec<f32>,
}

impl Buffers {
    fn for_job(job: &Job) -> Self {
        // Sizes come from a verified footer, whose blocks fill the file exactly.
        let payload = job.rows.saturating_mul(job.row_width);
        Self {
            addrs: Vec::with_capacity(job.rows),
            codes: Vec::with_capacity(if job.pq { payload } else { 0 }),
            vectors: Vec::with_capacity(if job.pq { 0 } else { payload / 4 }),
        }
    }
}

fn read_one(file: &File, job: Job, buffers: Buffers) -> std::result::Result<Partition, ReadError> {
    let Job {
        p,
        offset,
        rows,
        row_width,
        sums,
        pq,
    } = job;
    let check = |what: &str, bytes: &[u8], expected: Option<u32>| match expected {
        Some(expected) => super::check_block(p, what, bytes, expected).map_err(ReadError::Corrupt),
        None => Ok(()),
    };
    let mut addrs = read_vec(file, buffers.addrs, rows, offset, p)?;
    check("addresses", bytes_of(&addrs), sums.map(|s| s.addrs))?;
    for a in &mut addrs {
        *a = u64::from_le(*a);
    }
    let payload_at = offset + rows as u64 * 8;
    let payload_sum = sums.map(|s| s.payload);
    if pq {
        let codes = read_vec(file, buffers.codes, rows * row_width, payload_at, p)?;
        check("payload", &codes, payload_sum)?;
        return Ok(Partition {
            quantized: Default::default(),
            addrs,
            codes,
            vectors: vec![],
        });
    }
    if row_width % 4 != 0 {
        return Err(ReadError::Corrupt(format!(
            "rows of {row_width} bytes cannot hold 32-bit floats"
        )));
    }
    let mut vectors = read_vec(file, buffers.vectors, rows * row_width / 4, payload_at, p)?;
    check("payload", bytes_of(&vectors), payload_sum)?;
    if cfg!(target_endian = "big") {
        for v in &mut vectors {
            *v = f32::from_bits(u32::from_le(v.to_bits()));
        }
    }
    Ok(Partition {
        quantized: Default::default(),
        addrs,
        codes: vec![],
        vectors,
    })
}

/// Element types read as raw file bytes: no padding, and every bit pattern is a valid value
/// (a NaN `f32` included, which scoring handles like any value; checksums come first).
trait Plain: Copy {}
impl Plain for u8 {}
impl Plain for u64 {}
impl Plain for f32 {}

/// `len` values of `T` read from `at` into `values` (emptied first), in the file's byte order.
/// The vector is filled by the kernel without being zeroed first: zeroing a fresh buffer
/// cost as much as the read.
fn read_vec<T: Plain>(
    file: &File,
    mut values: Vec<T>,
    len: usize,
    at: u64,
    p: usize,
) -> std::result::Result<Vec<T>, ReadError> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| ReadError::Corrupt(format!("partition {p} is too large to read")))?;
    values.clear();
    values.reserve_exact(len);
    let base = values.as_mut_ptr().cast::<u8>();
    let mut done = 0usize;
    while done < bytes {
        let offset = at
            .checked_add(done as u64)
            .and_then(|o| libc::off_t::try_from(o).ok())
            .ok_or_else(|| ReadError::Corrupt(format!("partition {p} lies past any file")))?;
        // SAFETY: `base + done .. base + bytes` is inside the vector's allocation (a capacity
        // of at least `len` values of `T`, `bytes` bytes) and nothing else refers to it; the kernel
        // writes at most `bytes - done` bytes there.
        let n = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(file),
                base.add(done).cast(),
                bytes - done,
                offset,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(ReadError::Corrupt(format!("partition {p} is truncated"))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(ReadError::Io(e));
                }
            }
        }
    }
    // SAFETY: all `bytes` bytes were written by the reads above, and any bytes are valid
    // values of a `Plain` type.
    unsafe { values.set_len(len) };
    Ok(values)
}

/// The bytes of `values` (to checksum them as the file holds them).
fn bytes_of<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding, and `u8` has alignment 1; the slice covers
    // exactly the values' memory, borrowed for as long as `values`.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::segment::{decode_footer, encode};

    fn parts(pq: bool) -> Vec<Partition> {
        let flat = |addrs: Vec<u64>, vectors: Vec<f32>| Partition {
            quantized: Default::default(),
            addrs,
            codes: vec![],
            vectors,
        };
        let coded = |addrs: Vec<u64>, codes: Vec<u8>| Partition {
            quantized: Default::default(),
            addrs,
            codes,
            vectors: vec![],
        };
        if pq {
            vec![coded(vec![7, 8], vec![1, 2, 3, 4]), coded(vec![], vec![])]
        } else {
            vec![
                flat(vec![1, 1 << 40], vec![1.5, -2.0, 3.25, f32::MAX]),
                Partition::default(),
                flat(vec![9], vec![5.0, 6.0]),
            ]
        }
    }

    async fn read_file(bytes: &[u8], footer_from: &[u8], pq: bool) -> Result<Vec<Partition>> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.seg");
        std::fs::write(&file, bytes).unwrap();
        let footer = decode_footer_of(footer_from);
        let all: Vec<usize> = (0..footer.partitions.len()).rev().collect();
        let mut read = read_partitions(file, &Path::from("t/s.seg"), &footer, &all, pq).await?;
        read.reverse();
        Ok(read)
    }

    /// What is read equals what was encoded, and a flipped bit or a truncated file is a
    /// `Corrupt` error naming the partition, never different values.
    #[tokio::test]
    async fn partitions_read_in_place_equal_the_encoded_ones_or_fail() {
        for (pq, width) in [(false, 8), (true, 2)] {
            let want = parts(pq);
            let bytes = encode(&want, width);
            assert_eq!(read_file(&bytes, &bytes, pq).await.unwrap(), want);
            // Flip a bit in the first partition's payload (after its two addresses).
            let mut damaged = bytes.clone();
            damaged[16 + 1] ^= 0x10;
            let err = read_file(&damaged, &bytes, pq)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("partition 0 payload: CRC32C"), "{err}");
            damaged = bytes.clone();
            damaged[3] ^= 1;
            let err = read_file(&damaged, &bytes, pq)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("partition 0 addresses: CRC32C"), "{err}");
            let err = read_file(&bytes[..10], &bytes, pq)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("is truncated"), "{err}");
        }
        let missing = read_partitions(
            "/nonexistent/fragvec/s.seg".into(),
            &Path::from("t/s.seg"),
            &decode_footer_of(&encode(&parts(false), 8)),
            &[0],
            false,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(missing.contains("t/s.seg"), "{missing}");
    }

    fn decode_footer_of(bytes: &[u8]) -> Footer {
        let n = bytes.len();
        let len = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
        decode_footer(&bytes[n - 16 - len..n - 16], n as u64).unwrap()
    }
}

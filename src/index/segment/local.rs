//! Reading partitions of a segment file in a local directory: each partition's two blocks are
//! read with positional reads straight into the typed buffers a [`Partition`] holds, and
//! checksummed there, on the blocking pool.
//!
//! Why not object_store's local reads: each request allocates a byte buffer that decoding
//! then copies into the partition's vectors, so every byte crossed memory twice more than it
//! must, on fresh pages. A search whose index is larger than the cache budget reads tens of
//! megabytes per query (every partition, for an exact search), where that is most of the time.
//! The checks are the same ones [`super::read_partitions`] makes: sizes from the verified
//! footer, a short read is a truncated partition, each block's CRC32C.

use std::fs::File;
use std::os::unix::fs::FileExt;
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
            tokio::task::spawn_blocking(move || read_one(&handle, job))
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
fn io_error(path: &Path, e: std::io::Error) -> FormatError {
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

fn read_one(file: &File, job: Job) -> std::result::Result<Partition, ReadError> {
    let Job {
        p,
        offset,
        rows,
        row_width,
        sums,
        pq,
    } = job;
    let read = |buf: &mut [u8], at: u64| {
        file.read_exact_at(buf, at).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                ReadError::Corrupt(format!("partition {p} is truncated"))
            } else {
                ReadError::Io(e)
            }
        })
    };
    let check = |what: &str, bytes: &[u8], expected: Option<u32>| match expected {
        Some(expected) => super::check_block(p, what, bytes, expected).map_err(ReadError::Corrupt),
        None => Ok(()),
    };
    let mut addrs = vec![0u64; rows];
    read(u64_bytes(&mut addrs), offset)?;
    check("addresses", u64_bytes(&mut addrs), sums.map(|s| s.addrs))?;
    for a in &mut addrs {
        *a = u64::from_le(*a);
    }
    let payload_at = offset + rows as u64 * 8;
    let payload_sum = sums.map(|s| s.payload);
    if pq {
        let mut codes = vec![0u8; rows * row_width];
        read(&mut codes, payload_at)?;
        check("payload", &codes, payload_sum)?;
        return Ok(Partition {
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
    let mut vectors = vec![0f32; rows * row_width / 4];
    read(f32_bytes(&mut vectors), payload_at)?;
    check("payload", f32_bytes(&mut vectors), payload_sum)?;
    if cfg!(target_endian = "big") {
        for v in &mut vectors {
            *v = f32::from_bits(u32::from_le(v.to_bits()));
        }
    }
    Ok(Partition {
        addrs,
        codes: vec![],
        vectors,
    })
}

/// The bytes of `values`, to read into. Sound: `u64` has no padding and every bit pattern is
/// a valid `u64`, and `u8` has alignment 1.
fn u64_bytes(values: &mut [u64]) -> &mut [u8] {
    // SAFETY: see above; the slice covers exactly the values' memory and borrows it mutably.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), values.len() * 8) }
}

/// The bytes of `values`, to read into. Sound: `f32` has no padding and every bit pattern is
/// a valid `f32` (possibly a NaN, which scoring handles like any value), and `u8` has
/// alignment 1.
fn f32_bytes(values: &mut [f32]) -> &mut [u8] {
    // SAFETY: see above; the slice covers exactly the values' memory and borrows it mutably.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), values.len() * 4) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::segment::{decode_footer, encode};

    fn parts(pq: bool) -> Vec<Partition> {
        let flat = |addrs: Vec<u64>, vectors: Vec<f32>| Partition {
            addrs,
            codes: vec![],
            vectors,
        };
        let coded = |addrs: Vec<u64>, codes: Vec<u8>| Partition {
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

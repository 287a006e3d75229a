//! Reading single rows' floats of IVF_FLAT partitions by range, for a search that holds a
//! partition's sketch ([`crate::index::sketch`]) and needs the floats of a few of its rows.
//!
//! A partition's checksums cover its whole payload, so a row read alone is checked against
//! its own CRC32C, which the sketch computed from the verified partition: a file damaged or
//! replaced since is a `Corrupt` error naming the file, partition and row, never a wrong
//! distance. Adjacent rows are read together; in a local directory with positional reads
//! on the blocking pool, elsewhere through [`crate::format::ranges::read_ranges`].

use std::ops::Range;

use object_store::path::Path;

use super::Footer;
use crate::format::integrity::crc32c;
use crate::format::{FormatError, Result, TableDir};

/// One row to read: partition `partition`, row `row` within it, and the CRC32C its bytes
/// must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowAt {
    /// The partition's position in the segment's footer, from 0.
    pub partition: usize,
    /// The row's rank within the partition, from 0.
    pub row: u32,
    /// The CRC32C its bytes must have.
    pub crc: u32,
}

impl Footer {
    /// Where row `row` of partition `p` keeps its payload, or `None` when it has no such row.
    pub fn row_range(&self, p: usize, row: u32) -> Option<Range<u64>> {
        let &(offset, rows) = self.partitions.get(p)?;
        if row as u64 >= rows {
            return None;
        }
        let width = self.row_width as u64;
        let start = offset + rows * 8 + row as u64 * width;
        Some(start..start + width)
    }
}

/// The floats of `rows` of the IVF_FLAT segment file `file`, in order (`row_width / 4`
/// per row), each checked against its CRC32C.
pub async fn read_rows(
    dir: &TableDir,
    file: &str,
    footer: &Footer,
    rows: &[RowAt],
) -> Result<Vec<f32>> {
    let path = dir.path(file);
    let ranges = rows
        .iter()
        .map(|r| {
            footer.row_range(r.partition, r.row).ok_or_else(|| {
                FormatError::corrupt(
                    &path,
                    format!("partition {} has no row {}", r.partition, r.row),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    #[cfg(unix)]
    let bytes = if let Some(folder) = dir.local_dir() {
        let local = folder.join(file);
        let asked = ranges.clone();
        tokio::task::spawn_blocking(move || read_local(&local, &asked))
            .await
            .map_err(|e| FormatError::corrupt(&path, format!("reading task failed: {e}")))?
            .map_err(|e| super::local::io_error(&path, e))?
    } else {
        read_remote(dir, &path, &ranges).await?
    };
    #[cfg(not(unix))]
    let bytes = read_remote(dir, &path, &ranges).await?;
    check_rows(&path, rows, footer.row_width, &bytes)
}

/// Checks each row's bytes (`width` each, in order) against its CRC32C and decodes them.
fn check_rows(path: &Path, rows: &[RowAt], width: usize, bytes: &[u8]) -> Result<Vec<f32>> {
    if bytes.len() != rows.len() * width {
        return Err(FormatError::corrupt(path, "a partition row is truncated"));
    }
    for (r, row) in rows.iter().zip(bytes.chunks_exact(width.max(1))) {
        let found = crc32c(row);
        if found != r.crc {
            return Err(FormatError::corrupt(
                path,
                format!(
                    "partition {} row {}: CRC32C is {found:#010x}, it was {:#010x} when the \
                     partition was read and verified",
                    r.partition, r.row, r.crc
                ),
            ));
        }
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
        .collect())
}

/// The bytes of `ranges`, in order, through the table's store.
async fn read_remote(dir: &TableDir, path: &Path, ranges: &[Range<u64>]) -> Result<Vec<u8>> {
    let fetched = crate::format::ranges::read_ranges(dir.store().as_ref(), path, ranges)
        .await
        .map_err(|e| FormatError::store(path, e))?;
    let mut out = Vec::with_capacity(ranges.iter().map(|r| (r.end - r.start) as usize).sum());
    for b in fetched {
        out.extend_from_slice(&b);
    }
    Ok(out)
}

/// The bytes of `ranges` of a local file, in order: each run of adjacent ranges in one
/// positional read. A short read leaves the output short (reported as truncated).
#[cfg(unix)]
fn read_local(file: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let handle = std::fs::File::open(file)?;
    let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut out = vec![0u8; total as usize];
    let mut at = 0usize;
    let mut i = 0;
    while i < ranges.len() {
        let start = ranges[i].start;
        let mut end = ranges[i].end;
        let mut j = i + 1;
        while j < ranges.len() && ranges[j].start == end {
            end = ranges[j].end;
            j += 1;
        }
        let len = (end - start) as usize;
        match handle.read_exact_at(&mut out[at..at + len], start) {
            Ok(()) => at += len,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                out.truncate(at);
                return Ok(out);
            }
            Err(e) => return Err(e),
        }
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;

    use super::*;
    use crate::index::segment::{Partition, encode};
    use crate::index::sketch::row_sums;

    fn part(rows: u64, dim: usize, base: f32) -> Partition {
        Partition {
            addrs: (0..rows).collect(),
            vectors: (0..rows as usize * dim).map(|i| base + i as f32).collect(),
            ..Default::default()
        }
    }

    /// Rows read alone are the partition's rows, and a flipped byte in one is named, in a
    /// local directory and in memory.
    #[tokio::test]
    async fn rows_read_alone_are_checked_against_their_own_checksums() {
        let dim = 3;
        let parts = vec![part(4, dim, 0.0), part(0, dim, 0.0), part(5, dim, 100.0)];
        let bytes = encode(&parts, dim * 4);
        let folder = tempfile::tempdir().unwrap();
        for url in [
            format!("file://{}", folder.path().display()),
            "memory://segment-rows".into(),
        ] {
            let dir = crate::format::Database::open(&url)
                .await
                .unwrap()
                .table("t")
                .unwrap();
            dir.store()
                .put(&dir.path("seg"), bytes.clone().into())
                .await
                .unwrap();
            let size = bytes.len() as u64;
            let footer = super::super::read_footer(&dir, "seg", size).await.unwrap();
            let sums: Vec<Vec<u32>> = parts.iter().map(|p| row_sums(&p.vectors, dim)).collect();
            let at = |p: usize, row: u32| RowAt {
                partition: p,
                row,
                crc: sums[p][row as usize],
            };
            let asked = [at(2, 4), at(0, 1), at(0, 2), at(2, 0)];
            let got = read_rows(&dir, "seg", &footer, &asked).await.unwrap();
            let want: Vec<f32> = asked
                .iter()
                .flat_map(|a| {
                    let v = &parts[a.partition].vectors;
                    v[a.row as usize * dim..(a.row as usize + 1) * dim].to_vec()
                })
                .collect();
            assert_eq!(got, want, "{url}");
            let mut wrong = at(0, 2);
            wrong.crc ^= 1;
            let e = read_rows(&dir, "seg", &footer, &[wrong]).await.unwrap_err();
            assert!(e.to_string().contains("partition 0 row 2"), "{e}");
            let e = read_rows(
                &dir,
                "seg",
                &footer,
                &[
                    at(0, 0),
                    RowAt {
                        partition: 1,
                        row: 0,
                        crc: 0,
                    },
                ],
            )
            .await
            .unwrap_err();
            assert!(e.to_string().contains("partition 1 has no row 0"), "{e}");
        }
    }
}

//! Segment files: the rows of some fragments, grouped by IVF partition, so a query reads only
//! the partitions it probes (one range read each).
//!
//! Layout (little-endian): for each partition in order, its row addresses (`u64` each) then its
//! payload (`dim` f32 per row for IVF_FLAT, `sub_vectors` code bytes per row for IVF_PQ); then a
//! footer: magic `FVSEG002`, `u32` partitions, `u32` payload bytes per row, per partition
//! `u64` offset, `u64` rows, `u32` CRC32C of its addresses and `u32` CRC32C of its payload,
//! then `u32` CRC32C of the footer bytes before it; then `u64` footer length and the end
//! magic `FVSEGEND`.
//!
//! Opening checks the footer's checksum and that it describes contiguous blocks that exactly
//! fill the file; reading a partition (or only its addresses) checks the checksums of what
//! was read, so a damaged segment is a `Corrupt` error naming the file, never a wrong
//! neighbour. Format 1 (`FVSEG001`: no checksums, 16-byte entries) is still read, unverified.
//!
//! A segment's *coverage* (the fragments its file holds, `fragment_bitmap` in the manifest)
//! and its *ownership* (the rows it may answer for, see [`super::ownership`]) are different
//! sets: only ownership may be used to answer a query. Caching lives in [`super::cache`].
//!
//! Writing: [`encode`] makes a whole file in memory; [`SegmentEncoder`] checksums a file
//! whose data section arrives in pieces (a streaming build, cut by [`groups`]) and makes
//! the same bytes.

mod encoder;
pub mod groups;
#[cfg(unix)]
mod local;
mod rows;

use std::ops::Range;
use std::sync::OnceLock;

use bytes::Bytes;
use object_store::ObjectStoreExt;

use crate::format::integrity::crc32c;
use crate::format::{FormatError, Result, TableDir};
use crate::index::quantized::QuantizedRows;

pub use encoder::SegmentEncoder;
pub use rows::{RowAt, read_rows};

const MAGIC: &[u8; 8] = b"FVSEG002";
/// Format 1, written before checksums: read unverified.
const MAGIC_V1: &[u8; 8] = b"FVSEG001";
const END_MAGIC: &[u8; 8] = b"FVSEGEND";
/// Magic, partition count, row width.
const FOOTER_HEAD: usize = 16;

/// The rows of one partition of one segment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Partition {
    /// The rows' addresses, `(fragment_id << 32) | offset`.
    pub addrs: Vec<u64>,
    /// `addrs.len() × width` bytes for PQ codes, or empty for IVF_FLAT.
    pub codes: Vec<u8>,
    /// `addrs.len() × dim` floats for IVF_FLAT, or empty for IVF_PQ.
    pub vectors: Vec<f32>,
    /// The vectors at one byte per value with error bounds, once the cache has quantized
    /// the partition (on admission or reuse, while its budget has room: see
    /// [`crate::index::cache`]; `Some(None)` when they cannot be bounded); a search then
    /// skips the rows that cannot enter its top-k ([`crate::index::quantized`]). Not in the
    /// file.
    pub quantized: OnceLock<Option<QuantizedRows>>,
}

impl Partition {
    /// Rows in the partition.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether it has no row.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Heap bytes held, quantized rows included.
    pub(crate) fn bytes(&self) -> usize {
        let quantized = self.quantized.get().and_then(Option::as_ref);
        self.addrs.len() * 8
            + self.codes.len()
            + self.vectors.len() * 4
            + quantized.map_or(0, QuantizedRows::bytes)
    }

    /// Quantizes the rows once (IVF_FLAT partitions only; see [`QuantizedRows::quantize`]).
    pub(crate) fn quantize(&self) {
        if !self.vectors.is_empty() {
            self.quantized.get_or_init(|| {
                QuantizedRows::quantize(&self.vectors, self.vectors.len() / self.len().max(1))
            });
        }
    }
}

/// CRC32C of a partition's two byte blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionChecksum {
    /// CRC32C of the partition's address block.
    pub addrs: u32,
    /// CRC32C of the partition's payload block (vectors or codes).
    pub payload: u32,
}

/// Where each partition lives in a segment file.
#[derive(Debug, Clone, PartialEq)]
pub struct Footer {
    /// Payload bytes per row (`4 × dim` for flat vectors, `sub_vectors` for PQ codes).
    pub row_width: usize,
    /// Per partition: its byte offset and row count.
    pub partitions: Vec<(u64, u64)>,
    /// One per partition; `None` for a format-1 file (no checksums).
    pub checksums: Option<Vec<PartitionChecksum>>,
}

impl Footer {
    /// Rows in the segment.
    pub fn rows(&self) -> u64 {
        self.partitions.iter().map(|p| p.1).sum()
    }

    fn range(&self, p: usize) -> Range<u64> {
        let (offset, rows) = self.partitions[p];
        offset..offset + rows * (8 + self.row_width as u64)
    }

    /// Bytes of partition `p` in the file (addresses and payload).
    pub fn partition_bytes(&self, p: usize) -> u64 {
        let (_, rows) = self.partitions[p];
        rows * (8 + self.row_width as u64)
    }

    /// Bytes of every partition (the file less its footer).
    pub fn data_bytes(&self) -> u64 {
        (0..self.partitions.len())
            .map(|p| self.partition_bytes(p))
            .sum()
    }

    /// Cuts `ps` (partitions in the order they are probed) into consecutive groups of at
    /// most `max_bytes` bytes each (a partition larger than that alone), so a search probing
    /// many partitions holds one group at a time. Every partition of `ps` is in exactly one
    /// group, in order; no group is empty.
    pub fn probe_groups(&self, ps: &[usize], max_bytes: u64) -> Vec<Range<usize>> {
        let mut groups = Vec::new();
        let (mut start, mut used) = (0usize, 0u64);
        for (i, &p) in ps.iter().enumerate() {
            let bytes = self.partition_bytes(p);
            if i > start && used.saturating_add(bytes) > max_bytes {
                groups.push(start..i);
                (start, used) = (i, 0);
            }
            used = used.saturating_add(bytes);
        }
        if start < ps.len() {
            groups.push(start..ps.len());
        }
        groups
    }

    /// Where partition `p`'s row addresses are (they come first in the partition).
    pub fn addrs_range(&self, p: usize) -> Range<u64> {
        let (offset, rows) = self.partitions[p];
        offset..offset + rows * 8
    }

    /// Checks the bytes of [`addrs_range`](Self::addrs_range)`(p)`.
    pub fn verify_addrs(&self, p: usize, bytes: &[u8]) -> std::result::Result<(), String> {
        match &self.checksums {
            None => Ok(()),
            Some(sums) => check_block(p, "addresses", bytes, sums[p].addrs),
        }
    }

    /// Checks the bytes of the whole partition `p` (addresses, then payload).
    fn verify_partition(&self, p: usize, bytes: &[u8]) -> std::result::Result<(), String> {
        let Some(sums) = &self.checksums else {
            return Ok(());
        };
        let split = (self.partitions[p].1 * 8) as usize;
        check_block(p, "addresses", &bytes[..split], sums[p].addrs)?;
        check_block(p, "payload", &bytes[split..], sums[p].payload)
    }
}

fn check_block(
    p: usize,
    what: &str,
    bytes: &[u8],
    expected: u32,
) -> std::result::Result<(), String> {
    let found = crc32c(bytes);
    if found != expected {
        return Err(format!(
            "partition {p} {what}: CRC32C is {found:#010x}, the footer records {expected:#010x}"
        ));
    }
    Ok(())
}

/// Decodes a partition's address bytes (see [`Footer::addrs_range`]).
pub fn decode_addrs(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect()
}

/// Encodes partitions (flat vectors when `pq_width == 0`, else PQ codes of that width).
pub fn encode(partitions: &[Partition], row_width: usize) -> Vec<u8> {
    // Sized exactly: grown by doubling, a 520 MB segment took a 1 GiB buffer and, while it
    // moved, 1.5 GiB — the peak of a whole 1M × 128 build.
    let data: usize = partitions
        .iter()
        .map(|p| p.addrs.len() * 8 + p.vectors.len() * 4 + p.codes.len())
        .sum();
    let mut out = Vec::with_capacity(data + footer_len(partitions.len()));
    let mut index = Vec::with_capacity(partitions.len());
    for p in partitions {
        let start = out.len();
        for a in &p.addrs {
            out.extend_from_slice(&a.to_le_bytes());
        }
        let payload = out.len();
        for v in &p.vectors {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&p.codes);
        let sums = PartitionChecksum {
            addrs: crc32c(&out[start..payload]),
            payload: crc32c(&out[payload..]),
        };
        index.push((start as u64, p.len() as u64, sums));
    }
    append_footer(&mut out, row_width, &index);
    debug_assert_eq!(out.len(), data + footer_len(partitions.len()));
    out
}

/// Bytes [`append_footer`] appends for `partitions` partitions.
fn footer_len(partitions: usize) -> usize {
    MAGIC.len() + 4 + 4 + partitions * (8 + 8 + 4 + 4) + 4 + 8 + END_MAGIC.len()
}

/// Appends the footer describing `index` (per partition: offset, rows, checksums), its
/// length and the end magic: everything after the data section.
fn append_footer(out: &mut Vec<u8>, row_width: usize, index: &[(u64, u64, PartitionChecksum)]) {
    let footer_start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(index.len() as u32).to_le_bytes());
    out.extend_from_slice(&(row_width as u32).to_le_bytes());
    for (offset, rows, sums) in index {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&rows.to_le_bytes());
        out.extend_from_slice(&sums.addrs.to_le_bytes());
        out.extend_from_slice(&sums.payload.to_le_bytes());
    }
    let sum = crc32c(&out[footer_start..]);
    out.extend_from_slice(&sum.to_le_bytes());
    let footer_len = (out.len() - footer_start) as u64;
    out.extend_from_slice(&footer_len.to_le_bytes());
    out.extend_from_slice(END_MAGIC);
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("4"))
}

fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8"))
}

/// Decodes and checks a footer (`footer` excludes the trailing length and end magic).
pub fn decode_footer(footer: &[u8], file_size: u64) -> std::result::Result<Footer, String> {
    if footer.len() < FOOTER_HEAD {
        return Err("not a fragvec segment footer".into());
    }
    let (entry, checked) = match &footer[..8] {
        m if m == MAGIC => (24, true),
        m if m == MAGIC_V1 => (16, false),
        _ => return Err("not a fragvec segment footer".into()),
    };
    let partitions = le_u32(&footer[8..12]) as usize;
    let row_width = le_u32(&footer[12..16]) as usize;
    let entries_end = partitions
        .checked_mul(entry)
        .and_then(|n| n.checked_add(FOOTER_HEAD))
        .ok_or("footer length does not match its partition count")?;
    if footer.len() != entries_end + if checked { 4 } else { 0 } {
        return Err("footer length does not match its partition count".into());
    }
    if checked {
        let stored = le_u32(&footer[entries_end..]);
        let found = crc32c(&footer[..entries_end]);
        if stored != found {
            return Err(format!(
                "footer CRC32C is {found:#010x}, the footer records {stored:#010x}"
            ));
        }
    }
    let mut index = Vec::with_capacity(partitions);
    let mut sums = Vec::with_capacity(if checked { partitions } else { 0 });
    let mut expected = 0u64;
    for p in 0..partitions {
        let at = FOOTER_HEAD + p * entry;
        let offset = le_u64(&footer[at..at + 8]);
        let rows = le_u64(&footer[at + 8..at + 16]);
        if offset != expected {
            return Err(format!(
                "partition {p} starts at {offset}, expected {expected}"
            ));
        }
        expected = rows
            .checked_mul(8 + row_width as u64)
            .and_then(|b| b.checked_add(offset))
            .ok_or("partition sizes overflow")?;
        index.push((offset, rows));
        if checked {
            sums.push(PartitionChecksum {
                addrs: le_u32(&footer[at + 16..at + 20]),
                payload: le_u32(&footer[at + 20..at + 24]),
            });
        }
    }
    if expected.checked_add(footer.len() as u64 + 16) != Some(file_size) {
        return Err("partitions and footer do not fill the file exactly".into());
    }
    Ok(Footer {
        row_width,
        partitions: index,
        checksums: checked.then_some(sums),
    })
}

fn decode_partition(bytes: &[u8], rows: usize, row_width: usize, pq: bool) -> Partition {
    let (addrs, payload) = bytes.split_at(rows * 8);
    let addrs = addrs
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect();
    if pq {
        Partition {
            quantized: Default::default(),
            addrs,
            codes: payload[..rows * row_width].to_vec(),
            vectors: vec![],
        }
    } else {
        let vectors = payload
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        Partition {
            quantized: Default::default(),
            addrs,
            codes: vec![],
            vectors,
        }
    }
}

/// Bytes read from the end of a segment file to find its footer in one request: the footer
/// of a segment of up to ~2,700 partitions fits (24 bytes per partition); a larger one costs
/// a second read.
const FOOTER_GUESS: u64 = 64 * 1024;

/// Reads a segment file's footer (the file's last bytes), checking its structure.
pub async fn read_footer(dir: &TableDir, file: &str, size: u64) -> Result<Footer> {
    let path = dir.path(file);
    let corrupt = |reason: String| FormatError::corrupt(&path, reason);
    if size < 16 {
        return Err(corrupt("too small to be a segment file".into()));
    }
    let tail = dir
        .store()
        .get_range(&path, size - size.min(FOOTER_GUESS)..size)
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    if tail.len() < 16 || &tail[tail.len() - 8..] != END_MAGIC {
        return Err(corrupt("not a fragvec segment file (bad end magic)".into()));
    }
    let end = tail.len() - 16;
    let footer_len = u64::from_le_bytes(tail[end..end + 8].try_into().expect("8"));
    if footer_len > size - 16 {
        return Err(corrupt("footer longer than the file".into()));
    }
    let bytes = if footer_len <= end as u64 {
        tail.slice(end - footer_len as usize..end)
    } else {
        dir.store()
            .get_range(&path, size - 16 - footer_len..size - 16)
            .await
            .map_err(|e| FormatError::store(&path, e))?
    };
    decode_footer(&bytes, size).map_err(corrupt)
}

/// Reads, verifies and decodes partitions `ps` of a segment file: their ranges are
/// coalesced when close and fetched concurrently ([`crate::format::ranges`]), so a query
/// probing 16 partitions waits for about one round trip instead of 16 in a row.
pub async fn read_partitions(
    dir: &TableDir,
    file: &str,
    footer: &Footer,
    ps: &[usize],
    pq: bool,
) -> Result<Vec<Partition>> {
    let path = dir.path(file);
    #[cfg(unix)]
    if let Some(folder) = dir.local_dir() {
        return local::read_partitions(folder.join(file), &path, footer, ps, pq).await;
    }
    let wanted: Vec<usize> = ps
        .iter()
        .copied()
        .filter(|&p| footer.partitions[p].1 > 0)
        .collect();
    let ranges: Vec<Range<u64>> = wanted.iter().map(|&p| footer.range(p)).collect();
    let fetched = if ranges.is_empty() {
        vec![]
    } else {
        crate::format::ranges::read_ranges(dir.store().as_ref(), &path, &ranges)
            .await
            .map_err(|e| FormatError::store(&path, e))?
    };
    let mut by_partition: std::collections::HashMap<usize, Bytes> =
        wanted.into_iter().zip(fetched).collect();
    ps.iter()
        .map(|&p| match by_partition.remove(&p) {
            None => Ok(Partition::default()),
            Some(bytes) => decode_checked(&path, footer, p, &bytes, pq),
        })
        .collect()
}

/// Checks and decodes the bytes read for partition `p`.
fn decode_checked(
    path: &object_store::path::Path,
    footer: &Footer,
    p: usize,
    bytes: &[u8],
    pq: bool,
) -> Result<Partition> {
    if bytes.len() as u64 != footer.range(p).end - footer.range(p).start {
        return Err(FormatError::corrupt(
            path,
            format!("partition {p} is truncated"),
        ));
    }
    footer
        .verify_partition(p, bytes)
        .map_err(|e| FormatError::corrupt(path, e))?;
    Ok(decode_partition(
        bytes,
        footer.partitions[p].1 as usize,
        footer.row_width,
        pq,
    ))
}

/// Reads, verifies and decodes partition `p` of a segment file (one range read).
pub async fn read_partition(
    dir: &TableDir,
    file: &str,
    footer: &Footer,
    p: usize,
    pq: bool,
) -> Result<Partition> {
    let mut read = read_partitions(dir, file, footer, &[p], pq).await?;
    Ok(read.pop().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fuzz::mutated;
    use proptest::prelude::*;

    fn parts() -> Vec<Partition> {
        vec![
            Partition {
                quantized: Default::default(),
                addrs: vec![1, 2],
                codes: vec![],
                vectors: vec![1.0, 2.0, 3.0, 4.0],
            },
            Partition::default(),
            Partition {
                quantized: Default::default(),
                addrs: vec![9],
                codes: vec![],
                vectors: vec![5.0, 6.0],
            },
        ]
    }

    fn split(bytes: &[u8]) -> (&[u8], u64) {
        let n = bytes.len();
        let footer_len = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
        (&bytes[n - 16 - footer_len..n - 16], n as u64)
    }

    /// A format-1 file (no checksums), as builds before checksums wrote them.
    fn encode_v1(partitions: &[Partition], row_width: usize) -> Vec<u8> {
        let v2 = encode(partitions, row_width);
        let (footer, _) = split(&v2);
        let data_len = v2.len() - 16 - footer.len();
        let mut out = v2[..data_len].to_vec();
        let start = out.len();
        out.extend_from_slice(MAGIC_V1);
        out.extend_from_slice(&footer[8..16]);
        for p in 0..partitions.len() {
            let at = FOOTER_HEAD + p * 24;
            out.extend_from_slice(&footer[at..at + 16]);
        }
        let footer_len = (out.len() - start) as u64;
        out.extend_from_slice(&footer_len.to_le_bytes());
        out.extend_from_slice(END_MAGIC);
        out
    }

    /// Decodes every partition of a whole file the way the readers do (footer, then each
    /// partition verified), or the first error.
    fn read_all(bytes: &[u8], pq: bool) -> std::result::Result<Vec<Partition>, String> {
        let footer = footer_of(bytes).ok_or("no footer")?;
        let footer = decode_footer(footer, bytes.len() as u64)?;
        (0..footer.partitions.len())
            .map(|p| {
                let r = footer.range(p);
                let b = &bytes[r.start as usize..r.end as usize];
                footer.verify_partition(p, b)?;
                let a = footer.addrs_range(p);
                footer.verify_addrs(p, &bytes[a.start as usize..a.end as usize])?;
                Ok(decode_partition(
                    b,
                    footer.partitions[p].1 as usize,
                    footer.row_width,
                    pq,
                ))
            })
            .collect()
    }

    #[test]
    fn probe_groups_cover_the_probes_in_order_within_the_bound() {
        let footer = Footer {
            row_width: 8, // 16 bytes per row with its address
            partitions: vec![(0, 4), (64, 0), (64, 10), (224, 1), (240, 3)],
            checksums: None,
        };
        // Bytes: 64, 0, 160, 16, 48.
        assert_eq!(
            footer.probe_groups(&[0, 1, 2, 3, 4], 100),
            vec![0..2, 2..3, 3..5]
        );
        assert_eq!(footer.probe_groups(&[4, 3, 0], 1000), vec![0..3]);
        assert_eq!(footer.probe_groups(&[2, 2], 10), vec![0..1, 1..2]);
        assert!(footer.probe_groups(&[], 10).is_empty());
    }

    #[test]
    fn partitions_round_trip() {
        let bytes = encode(&parts(), 8);
        let (footer, size) = split(&bytes);
        let footer = decode_footer(footer, size).unwrap();
        assert_eq!(footer.rows(), 3);
        assert_eq!(footer.checksums.as_ref().map(Vec::len), Some(3));
        assert_eq!(read_all(&bytes, false).unwrap(), parts());
    }

    #[test]
    fn format_1_files_are_read_unverified() {
        let bytes = encode_v1(&parts(), 8);
        let (footer, size) = split(&bytes);
        assert_eq!(decode_footer(footer, size).unwrap().checksums, None);
        assert_eq!(read_all(&bytes, false).unwrap(), parts());
    }

    #[test]
    fn a_flipped_bit_in_a_partition_is_named_not_decoded() {
        let clean = encode(&parts(), 8);
        // Partition 0: addresses at 0..16, vectors at 16..32.
        for (at, what) in [(3, "partition 0 addresses"), (20, "partition 0 payload")] {
            let mut bytes = clean.clone();
            bytes[at] ^= 0x04;
            let e = read_all(&bytes, false).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
        let mut bytes = clean.clone();
        let (footer, _) = split(&clean);
        let at = clean.len() - 16 - footer.len() + 18; // partition 0's row count
        bytes[at] ^= 0x01;
        let e = read_all(&bytes, false).unwrap_err();
        assert!(e.contains("footer CRC32C"), "{e}");
    }

    /// The footer bytes of a whole file, checked the way [`read_footer`] checks them.
    fn footer_of(bytes: &[u8]) -> Option<&[u8]> {
        let n = bytes.len();
        if n < 16 || &bytes[n - 8..] != END_MAGIC {
            return None;
        }
        let footer_len = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap());
        (footer_len <= n as u64 - 16).then(|| &bytes[n - 16 - footer_len as usize..n - 16])
    }

    /// Whatever footer decodes must describe blocks inside the file, and every partition
    /// must then decode from its byte range.
    fn check_file(bytes: &[u8], pq: bool) {
        let Some(footer) = footer_of(bytes) else {
            return;
        };
        let Ok(footer) = decode_footer(footer, bytes.len() as u64) else {
            return;
        };
        for (p, &(_, rows)) in footer.partitions.iter().enumerate() {
            let r = footer.range(p);
            assert!(r.start <= r.end && r.end <= bytes.len() as u64);
            let a = footer.addrs_range(p);
            let addrs = decode_addrs(&bytes[a.start as usize..a.end as usize]);
            assert_eq!(addrs.len() as u64, rows);
            let part = decode_partition(
                &bytes[r.start as usize..r.end as usize],
                rows as usize,
                footer.row_width,
                pq,
            );
            assert_eq!(part.addrs, addrs);
        }
    }

    fn valid_parts() -> impl Strategy<Value = (Vec<Partition>, bool)> {
        (any::<bool>(), prop::collection::vec(0usize..4, 0..5)).prop_map(|(pq, sizes)| {
            let parts: Vec<Partition> = sizes
                .iter()
                .enumerate()
                .map(|(p, &n)| Partition {
                    quantized: Default::default(),
                    addrs: (0..n as u64).map(|i| i * 7 + p as u64).collect(),
                    codes: if pq { vec![p as u8; n * 3] } else { vec![] },
                    vectors: if pq { vec![] } else { vec![p as f32; n * 2] },
                })
                .collect();
            (parts, pq)
        })
    }

    fn width(pq: bool) -> usize {
        if pq { 3 } else { 8 }
    }

    #[test]
    fn huge_row_counts_are_refused_not_overflowed() {
        // One partition of u64::MAX / 8 rows of width 0: its end plus the footer overflows.
        let mut footer = MAGIC_V1.to_vec();
        footer.extend_from_slice(&1u32.to_le_bytes());
        footer.extend_from_slice(&0u32.to_le_bytes());
        footer.extend_from_slice(&0u64.to_le_bytes());
        footer.extend_from_slice(&(u64::MAX / 8).to_le_bytes());
        let e = decode_footer(&footer, 48).unwrap_err();
        assert!(e.contains("do not fill the file"), "{e}");
        // A partition count whose entries overflow usize arithmetic.
        let mut footer = MAGIC.to_vec();
        footer.extend_from_slice(&u32::MAX.to_le_bytes());
        footer.extend_from_slice(&0u32.to_le_bytes());
        assert!(decode_footer(&footer, 48).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_decode_footer_never_panics_on_arbitrary_bytes(
            magic in 0u8..3,
            rest in prop::collection::vec(any::<u8>(), 0..200),
            size in prop_oneof![any::<u64>(), 0u64..400],
        ) {
            let mut footer = match magic {
                0 => vec![],
                1 => MAGIC.to_vec(),
                _ => MAGIC_V1.to_vec(),
            };
            footer.extend_from_slice(&rest);
            if let Ok(f) = decode_footer(&footer, size) {
                let entry = if f.checksums.is_some() { 24 } else { 16 };
                let tail = if f.checksums.is_some() { 4 } else { 0 };
                prop_assert_eq!(f.partitions.len() * entry + 16 + tail, footer.len());
            }
            decode_addrs(&rest);
            let mut file = rest.clone();
            file.extend_from_slice(END_MAGIC);
            check_file(&rest, magic == 1);
            check_file(&file, magic == 1);
        }

        #[test]
        fn prop_decode_footer_never_panics_on_mutated_valid_input(
            (bytes, pq) in valid_parts().prop_flat_map(|(parts, pq)| {
                let v1 = encode_v1(&parts, width(pq));
                let v2 = encode(&parts, width(pq));
                (prop_oneof![mutated(v1), mutated(v2)], Just(pq))
            }),
        ) {
            check_file(&bytes, pq);
        }

        /// A damaged format-2 segment reads back exactly as written or fails: never
        /// different addresses or vectors (which would be a silently wrong KNN answer).
        #[test]
        fn prop_mutated_segments_read_back_exactly_or_fail(
            (parts, pq, bytes) in valid_parts().prop_flat_map(|(parts, pq)| {
                let v2 = encode(&parts, width(pq));
                (Just(parts), Just(pq), mutated(v2))
            }),
        ) {
            if let Ok(read) = read_all(&bytes, pq) {
                prop_assert_eq!(read, parts);
            }
        }
    }

    #[test]
    fn damaged_footers_are_refused() {
        for bytes in [encode(&parts(), 8), encode_v1(&parts(), 8)] {
            let (footer, size) = split(&bytes);
            assert!(decode_footer(footer, size + 1).is_err());
            let mut bad = footer.to_vec();
            bad[16] = 7; // first partition offset
            assert!(decode_footer(&bad, size).is_err());
            assert!(decode_footer(&footer[..footer.len() - 1], size).is_err());
            let mut bad = footer.to_vec();
            bad[0] = b'x';
            assert!(decode_footer(&bad, size).is_err());
        }
    }
}

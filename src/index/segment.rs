//! Segment files: the rows of some fragments, grouped by IVF partition, so a query reads only
//! the partitions it probes (one range read each).
//!
//! Layout (little-endian): for each partition in order, its row addresses (`u64` each) then its
//! payload (`dim` f32 per row for IVF_FLAT, `sub_vectors` code bytes per row for IVF_PQ); then a
//! footer: magic `FVSEG001`, `u32` partitions, `u32` payload bytes per row, and per partition
//! `u64` offset and `u64` rows; then `u64` footer length and the end magic `FVSEGEND`.
//! Opening checks that the footer describes contiguous blocks that exactly fill the file.
//!
//! A segment's *coverage* (the fragments its file holds, `fragment_bitmap` in the manifest)
//! and its *ownership* (the rows it may answer for, see [`super::ownership`]) are different
//! sets: only ownership may be used to answer a query. Caching lives in [`super::cache`].

use std::ops::Range;

use bytes::Bytes;
use object_store::ObjectStoreExt;

use crate::format::{FormatError, Result, TableDir};

const MAGIC: &[u8; 8] = b"FVSEG001";
const END_MAGIC: &[u8; 8] = b"FVSEGEND";

/// The rows of one partition of one segment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Partition {
    pub addrs: Vec<u64>,
    /// `addrs.len() × width` bytes for PQ codes, or empty for IVF_FLAT.
    pub codes: Vec<u8>,
    /// `addrs.len() × dim` floats for IVF_FLAT, or empty for IVF_PQ.
    pub vectors: Vec<f32>,
}

impl Partition {
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.addrs.len() * 8 + self.codes.len() + self.vectors.len() * 4
    }
}

/// Where each partition lives in a segment file.
#[derive(Debug, Clone, PartialEq)]
pub struct Footer {
    /// Payload bytes per row (`4 × dim` for flat vectors, `sub_vectors` for PQ codes).
    pub row_width: usize,
    pub partitions: Vec<(u64, u64)>,
}

impl Footer {
    pub fn rows(&self) -> u64 {
        self.partitions.iter().map(|p| p.1).sum()
    }

    fn range(&self, p: usize) -> Range<u64> {
        let (offset, rows) = self.partitions[p];
        offset..offset + rows * (8 + self.row_width as u64)
    }

    /// Where partition `p`'s row addresses are (they come first in the partition).
    pub fn addrs_range(&self, p: usize) -> Range<u64> {
        let (offset, rows) = self.partitions[p];
        offset..offset + rows * 8
    }
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
    let mut out = Vec::new();
    let mut index = Vec::with_capacity(partitions.len());
    for p in partitions {
        index.push((out.len() as u64, p.len() as u64));
        for a in &p.addrs {
            out.extend_from_slice(&a.to_le_bytes());
        }
        for v in &p.vectors {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&p.codes);
    }
    let footer_start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(partitions.len() as u32).to_le_bytes());
    out.extend_from_slice(&(row_width as u32).to_le_bytes());
    for (offset, rows) in index {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&rows.to_le_bytes());
    }
    let footer_len = (out.len() - footer_start) as u64;
    out.extend_from_slice(&footer_len.to_le_bytes());
    out.extend_from_slice(END_MAGIC);
    out
}

/// Decodes and checks a footer (`footer` excludes the trailing length and end magic).
pub fn decode_footer(footer: &[u8], file_size: u64) -> std::result::Result<Footer, String> {
    if footer.len() < 16 || &footer[..8] != MAGIC {
        return Err("not a fragvec segment footer".into());
    }
    let partitions = u32::from_le_bytes(footer[8..12].try_into().expect("4")) as usize;
    let row_width = u32::from_le_bytes(footer[12..16].try_into().expect("4")) as usize;
    if footer.len() != 16 + partitions * 16 {
        return Err("footer length does not match its partition count".into());
    }
    let mut index = Vec::with_capacity(partitions);
    let mut expected = 0u64;
    for p in 0..partitions {
        let at = 16 + p * 16;
        let offset = u64::from_le_bytes(footer[at..at + 8].try_into().expect("8"));
        let rows = u64::from_le_bytes(footer[at + 8..at + 16].try_into().expect("8"));
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
    }
    if expected.checked_add(footer.len() as u64 + 16) != Some(file_size) {
        return Err("partitions and footer do not fill the file exactly".into());
    }
    Ok(Footer {
        row_width,
        partitions: index,
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
            addrs,
            codes: vec![],
            vectors,
        }
    }
}

/// Reads a segment file's footer (the file's last bytes), checking its structure.
pub async fn read_footer(dir: &TableDir, file: &str, size: u64) -> Result<Footer> {
    let path = dir.path(file);
    let corrupt = |reason: String| FormatError::corrupt(&path, reason);
    if size < 16 {
        return Err(corrupt("too small to be a segment file".into()));
    }
    let tail = dir
        .store()
        .get_range(&path, size - 16..size)
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    if &tail[8..] != END_MAGIC {
        return Err(corrupt("not a fragvec segment file (bad end magic)".into()));
    }
    let footer_len = u64::from_le_bytes(tail[..8].try_into().expect("8"));
    if footer_len > size - 16 {
        return Err(corrupt("footer longer than the file".into()));
    }
    let bytes = dir
        .store()
        .get_range(&path, size - 16 - footer_len..size - 16)
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    decode_footer(&bytes, size).map_err(corrupt)
}

/// Reads and decodes partition `p` of a segment file (one range read).
pub async fn read_partition(
    dir: &TableDir,
    file: &str,
    footer: &Footer,
    p: usize,
    pq: bool,
) -> Result<Partition> {
    let rows = footer.partitions[p].1 as usize;
    if rows == 0 {
        return Ok(Partition::default());
    }
    let path = dir.path(file);
    let bytes: Bytes = dir
        .store()
        .get_range(&path, footer.range(p))
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    Ok(decode_partition(&bytes, rows, footer.row_width, pq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fuzz::mutated;
    use proptest::prelude::*;

    fn parts() -> Vec<Partition> {
        vec![
            Partition {
                addrs: vec![1, 2],
                codes: vec![],
                vectors: vec![1.0, 2.0, 3.0, 4.0],
            },
            Partition::default(),
            Partition {
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

    #[test]
    fn partitions_round_trip() {
        let bytes = encode(&parts(), 8);
        let (footer, size) = split(&bytes);
        let footer = decode_footer(footer, size).unwrap();
        assert_eq!(footer.rows(), 3);
        for (p, expected) in parts().iter().enumerate() {
            let r = footer.range(p);
            let got = decode_partition(
                &bytes[r.start as usize..r.end as usize],
                expected.len(),
                8,
                false,
            );
            assert_eq!(&got, expected);
        }
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

    fn valid_file() -> impl Strategy<Value = (Vec<u8>, bool)> {
        (any::<bool>(), prop::collection::vec(0usize..4, 0..5)).prop_map(|(pq, sizes)| {
            let width = if pq { 3 } else { 8 };
            let parts: Vec<Partition> = sizes
                .iter()
                .enumerate()
                .map(|(p, &n)| Partition {
                    addrs: (0..n as u64).map(|i| i * 7 + p as u64).collect(),
                    codes: if pq { vec![p as u8; n * 3] } else { vec![] },
                    vectors: if pq { vec![] } else { vec![p as f32; n * 2] },
                })
                .collect();
            (encode(&parts, width), pq)
        })
    }

    #[test]
    fn huge_row_counts_are_refused_not_overflowed() {
        // One partition of u64::MAX / 8 rows of width 0: its end plus the footer overflows.
        let mut footer = MAGIC.to_vec();
        footer.extend_from_slice(&1u32.to_le_bytes());
        footer.extend_from_slice(&0u32.to_le_bytes());
        footer.extend_from_slice(&0u64.to_le_bytes());
        footer.extend_from_slice(&(u64::MAX / 8).to_le_bytes());
        let e = decode_footer(&footer, 48).unwrap_err();
        assert!(e.contains("do not fill the file"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_decode_footer_never_panics_on_arbitrary_bytes(
            magic in any::<bool>(),
            rest in prop::collection::vec(any::<u8>(), 0..200),
            size in prop_oneof![any::<u64>(), 0u64..400],
        ) {
            let mut footer = if magic { MAGIC.to_vec() } else { vec![] };
            footer.extend_from_slice(&rest);
            if let Ok(f) = decode_footer(&footer, size) {
                prop_assert_eq!(f.partitions.len() * 16 + 16, footer.len());
            }
            decode_addrs(&rest);
            let mut file = rest.clone();
            file.extend_from_slice(END_MAGIC);
            check_file(&rest, magic);
            check_file(&file, magic);
        }

        #[test]
        fn prop_decode_footer_never_panics_on_mutated_valid_input(
            (bytes, pq) in valid_file().prop_flat_map(|(v, pq)| (mutated(v), Just(pq))),
        ) {
            check_file(&bytes, pq);
        }
    }

    #[test]
    fn damaged_footers_are_refused() {
        let bytes = encode(&parts(), 8);
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

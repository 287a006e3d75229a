//! A segment file written in pieces: the caller writes the data section itself, in file
//! order and in pieces of any size, and passes each piece through [`SegmentEncoder::push`],
//! which checksums it; [`SegmentEncoder::finish`] then gives the footer. Data section plus
//! footer are exactly the bytes [`super::encode`] makes for the same partitions (tested).
//!
//! Caller guarantees: the row count of every partition is known before the first byte (a
//! streaming build counts them in its assignment pass). Rejected, as an error message: more
//! bytes than those partitions hold, or [`finish`](SegmentEncoder::finish) before all of
//! them. Memory: 24 bytes per partition; no data is kept.

use super::groups::Block;
use super::{PartitionChecksum, append_footer, footer_len};
use crate::format::integrity::crc32c_append;

/// Checksums a segment's data section as it is written, then makes its footer.
#[derive(Debug)]
pub struct SegmentEncoder {
    row_width: usize,
    /// Per partition: offset in the file, rows, checksums (filled as its blocks end).
    index: Vec<(u64, u64, PartitionChecksum)>,
    /// The block being written: (partition, block), or `None` after the last.
    at: Option<(usize, Block)>,
    /// Bytes of the current block still to come.
    left: u64,
    /// CRC32C of the current block's bytes so far.
    crc: u32,
    /// Bytes of the data section so far.
    written: u64,
}

impl SegmentEncoder {
    /// An encoder for partitions of `rows_per_partition` rows, each row `8 + row_width` bytes.
    pub fn new(rows_per_partition: &[u64], row_width: usize) -> Self {
        let mut offset = 0u64;
        let index = rows_per_partition
            .iter()
            .map(|&rows| {
                let start = offset;
                offset = offset.saturating_add(rows.saturating_mul(8 + row_width as u64));
                let sums = PartitionChecksum {
                    addrs: 0,
                    payload: 0,
                };
                (start, rows, sums)
            })
            .collect();
        let mut encoder = Self {
            row_width,
            index,
            at: None,
            left: 0,
            crc: 0,
            written: 0,
        };
        if !encoder.index.is_empty() {
            encoder.enter(0, Block::Addrs);
        }
        encoder.close_finished_blocks();
        encoder
    }

    /// Bytes of the data section received so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The next bytes of the data section, in file order.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            if self.at.is_none() {
                return Err(format!(
                    "segment data longer than its partitions' {} bytes",
                    self.written
                ));
            }
            let n = bytes
                .len()
                .min(usize::try_from(self.left).unwrap_or(usize::MAX));
            self.crc = crc32c_append(self.crc, &bytes[..n]);
            self.left -= n as u64;
            self.written += n as u64;
            bytes = &bytes[n..];
            self.close_finished_blocks();
        }
        Ok(())
    }

    /// The bytes after the data section (footer, its length, end magic), once every block
    /// was written.
    pub fn finish(self) -> Result<Vec<u8>, String> {
        if let Some((partition, block)) = self.at {
            return Err(format!(
                "segment data ended after {} bytes, inside partition {partition}'s {block:?}",
                self.written
            ));
        }
        let mut out = Vec::with_capacity(footer_len(self.index.len()));
        append_footer(&mut out, self.row_width, &self.index);
        Ok(out)
    }

    fn enter(&mut self, partition: usize, block: Block) {
        let rows = self.index[partition].1;
        let width = match block {
            Block::Addrs => 8,
            Block::Payload => self.row_width as u64,
        };
        self.at = Some((partition, block));
        self.left = rows.saturating_mul(width);
        self.crc = 0;
    }

    /// Records the checksum of every block with no bytes left and moves to the next one
    /// (empty blocks close at once: their CRC32C is that of no bytes, 0).
    fn close_finished_blocks(&mut self) {
        while let Some((partition, block)) = self.at
            && self.left == 0
        {
            let sums = &mut self.index[partition].2;
            match block {
                Block::Addrs => {
                    sums.addrs = self.crc;
                    self.enter(partition, Block::Payload);
                }
                Block::Payload => {
                    sums.payload = self.crc;
                    if partition + 1 < self.index.len() {
                        self.enter(partition + 1, Block::Addrs);
                    } else {
                        self.at = None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Partition, encode};
    use super::*;
    use proptest::prelude::*;

    /// The data section of `parts` as [`encode`] lays it out.
    fn data_section(parts: &[Partition]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            for a in &p.addrs {
                out.extend_from_slice(&a.to_le_bytes());
            }
            for v in &p.vectors {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&p.codes);
        }
        out
    }

    fn encode_in_pieces(parts: &[Partition], width: usize, cuts: &[usize]) -> Vec<u8> {
        let rows: Vec<u64> = parts.iter().map(|p| p.len() as u64).collect();
        let data = data_section(parts);
        let mut encoder = SegmentEncoder::new(&rows, width);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        cuts.sort();
        let mut start = 0;
        for cut in cuts.into_iter().chain([data.len()]) {
            encoder.push(&data[start..cut]).unwrap();
            start = cut;
        }
        assert_eq!(encoder.written(), data.len() as u64);
        let mut out = data;
        out.extend(encoder.finish().unwrap());
        out
    }

    fn parts(pq: bool, sizes: &[usize], seed: u64) -> Vec<Partition> {
        sizes
            .iter()
            .enumerate()
            .map(|(p, &n)| {
                let x = seed.wrapping_mul(p as u64 + 1);
                Partition {
                    quantized: Default::default(),
                    addrs: (0..n as u64).map(|i| x ^ (i << 32)).collect(),
                    codes: if pq {
                        (0..n * 3).map(|i| (x as usize + i) as u8).collect()
                    } else {
                        vec![]
                    },
                    vectors: if pq {
                        vec![]
                    } else {
                        (0..n * 2).map(|i| (x % 1000) as f32 + i as f32).collect()
                    },
                }
            })
            .collect()
    }

    #[test]
    fn pieces_of_one_byte_make_the_same_file() {
        let parts = parts(false, &[2, 0, 3, 0], 7);
        let data = data_section(&parts);
        let cuts: Vec<usize> = (0..data.len()).collect();
        assert_eq!(encode_in_pieces(&parts, 8, &cuts), encode(&parts, 8));
        assert_eq!(encode_in_pieces(&[], 8, &[]), encode(&[], 8));
    }

    #[test]
    fn too_many_or_too_few_bytes_are_refused() {
        let mut encoder = SegmentEncoder::new(&[1, 0], 4);
        encoder.push(&[0; 10]).unwrap();
        let e = SegmentEncoder::new(&[1, 0], 4).push(&[0; 13]).unwrap_err();
        assert!(e.contains("longer"), "{e}");
        let e = encoder.finish().unwrap_err();
        assert!(
            e.contains("ended after 10 bytes, inside partition 0's Payload"),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A segment written in pieces is byte for byte the one [`encode`] makes, wherever
        /// the pieces are cut (inside blocks, on block edges, around empty partitions). If it
        /// fails, a streamed index build writes a file readers reject as corrupt.
        #[test]
        fn prop_pieces_encode_like_encode(
            pq in any::<bool>(),
            sizes in prop::collection::vec(prop_oneof![Just(0usize), 1usize..5, 30usize..60], 0..7),
            seed in any::<u64>(),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let width = if pq { 3 } else { 8 };
            let parts = parts(pq, &sizes, seed);
            prop_assert_eq!(encode_in_pieces(&parts, width, &cuts), encode(&parts, width));
        }
    }
}

//! [`RowMapWriter`]: builds a row-map file from the labels of live rows. The layout is
//! described in the parent module.

use super::codec::{Digest, checksum, encode_block, encode_block_counts, put_varint};
use super::{
    CountsMatrix, FILE_MAGIC, FORMAT_VERSION, MAX_DESTINATIONS, REPR_BLOCKED_LABELS, Result,
    RowMapError,
};

/// One source fragment as the rewrite scanned it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceRows {
    /// Physical rows, deleted ones included.
    pub physical_rows: u64,
    /// Offsets of deleted rows, strictly increasing, each below `physical_rows`.
    pub deleted: Vec<u32>,
}

/// Builds a row-map file from the labels of the live rows, in scan order.
///
/// The rewrite scans with deletions applied, so it never sees a deleted row; the writer
/// re-inserts the deleted slots itself from the sources' deletion lists. Blocks are encoded
/// as soon as they fill, so memory is one block plus the encoded bytes.
#[derive(Debug)]
pub struct RowMapWriter<'a> {
    sources: &'a [SourceRows],
    num_destinations: usize,
    block_rows: u32,
    total_rows: u64,
    live_rows: u64,
    pushed: u64,
    /// Cursor: source index, row offset in it, index of its next deleted offset.
    source: usize,
    offset: u64,
    next_deleted: usize,
    /// Rows placed so far (deleted and live).
    row: u64,
    /// The open block: in-block positions of deleted rows, labels of live rows, and
    /// per-destination counts with the destinations touched (in first-seen order).
    block_deleted: Vec<u32>,
    block_live: Vec<u16>,
    block_counts: Vec<u32>,
    touched: Vec<u16>,
    /// Dictionary code per destination, valid for the destinations of the open block.
    code_of: Vec<u16>,
    totals: Vec<u64>,
    out: Vec<u8>,
    counts_bytes: Vec<u8>,
    block_sizes: Vec<u64>,
    block_checksums: Vec<u32>,
}

impl<'a> RowMapWriter<'a> {
    /// Checks the sources and parameters; nothing is written yet.
    pub fn new(
        sources: &'a [SourceRows],
        num_destinations: usize,
        block_rows: u32,
    ) -> Result<Self> {
        CountsMatrix::blocks_for(block_rows, 0)?;
        let mut total_rows = 0u64;
        let mut deleted_rows = 0u64;
        for (i, s) in sources.iter().enumerate() {
            for (j, &offset) in s.deleted.iter().enumerate() {
                if u64::from(offset) >= s.physical_rows {
                    return Err(RowMapError::DeletedOffsetOutOfRange {
                        source_index: i,
                        offset,
                        physical_rows: s.physical_rows,
                    });
                }
                if j > 0 && offset <= s.deleted[j - 1] {
                    return Err(RowMapError::DeletedOffsetsUnsorted {
                        source_index: i,
                        index: j,
                        previous: s.deleted[j - 1],
                        offset,
                    });
                }
            }
            total_rows = total_rows
                .checked_add(s.physical_rows)
                .ok_or(RowMapError::TooLarge { what: "total rows" })?;
            deleted_rows += s.deleted.len() as u64;
        }
        let live_rows = total_rows - deleted_rows;
        if num_destinations > MAX_DESTINATIONS || (num_destinations == 0 && live_rows > 0) {
            return Err(RowMapError::Destinations {
                num_destinations,
                live_rows,
            });
        }
        CountsMatrix::blocks_for(block_rows, total_rows)?;
        let mut out = Vec::new();
        out.extend_from_slice(&FILE_MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&REPR_BLOCKED_LABELS.to_le_bytes());
        Ok(Self {
            sources,
            num_destinations,
            block_rows,
            total_rows,
            live_rows,
            pushed: 0,
            source: 0,
            offset: 0,
            next_deleted: 0,
            row: 0,
            block_deleted: Vec::new(),
            block_live: Vec::new(),
            block_counts: vec![0; num_destinations],
            touched: Vec::new(),
            code_of: vec![0; num_destinations],
            totals: vec![0; num_destinations],
            out,
            counts_bytes: Vec::new(),
            block_sizes: Vec::new(),
            block_checksums: Vec::new(),
        })
    }

    /// Live rows the sources hold (labels `finish` expects in total).
    pub fn live_rows(&self) -> u64 {
        self.live_rows
    }

    /// Labels pushed so far.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Pretends destination `d` already holds `rows` rows (to reach u32 limits in tests).
    #[cfg(test)]
    pub(super) fn preset_total(&mut self, d: usize, rows: u64) {
        self.totals[d] = rows;
    }

    /// Records the destination of the next live row.
    pub fn push(&mut self, label: u16) -> Result<()> {
        if label as usize >= self.num_destinations {
            return Err(RowMapError::LabelOutOfRange {
                label,
                live_row: self.pushed,
                num_destinations: self.num_destinations,
            });
        }
        if self.pushed == self.live_rows {
            return Err(RowMapError::TooManyLabels {
                live_rows: self.live_rows,
            });
        }
        if self.totals[label as usize] >= u64::from(u32::MAX) {
            return Err(RowMapError::DestinationOverflow { destination: label });
        }
        self.place_deleted();
        self.totals[label as usize] += 1;
        let count = &mut self.block_counts[label as usize];
        if *count == 0 {
            self.touched.push(label);
        }
        *count += 1;
        self.block_live.push(label);
        self.pushed += 1;
        self.offset += 1;
        self.advance();
        Ok(())
    }

    /// [`push`](Self::push) for each label; stops at the first error.
    pub fn push_all(&mut self, labels: &[u16]) -> Result<()> {
        labels.iter().try_for_each(|&l| self.push(l))
    }

    /// Places deleted rows (and skips exhausted sources) up to the next live row or the
    /// end of the sources.
    fn place_deleted(&mut self) {
        while let Some(s) = self.sources.get(self.source) {
            if self.offset == s.physical_rows {
                self.source += 1;
                self.offset = 0;
                self.next_deleted = 0;
                continue;
            }
            if s.deleted.get(self.next_deleted).map(|&d| u64::from(d)) != Some(self.offset) {
                return;
            }
            let pos = (self.row % u64::from(self.block_rows)) as u32;
            self.block_deleted.push(pos);
            self.next_deleted += 1;
            self.offset += 1;
            self.advance();
        }
    }

    /// One row was placed: close the block if it is full.
    fn advance(&mut self) {
        self.row += 1;
        if self.row.is_multiple_of(u64::from(self.block_rows)) {
            self.flush_block();
        }
    }

    fn flush_block(&mut self) {
        let len = (self.block_deleted.len() + self.block_live.len()) as u32;
        if len == 0 {
            return;
        }
        // The block's dictionary: its destinations in ascending order, code = rank.
        self.touched.sort_unstable();
        for (code, &d) in self.touched.iter().enumerate() {
            self.code_of[d as usize] = code as u16;
        }
        let codes: Vec<u16> = self
            .block_live
            .iter()
            .map(|&l| self.code_of[l as usize])
            .collect();
        let start = self.out.len();
        encode_block(
            len,
            &self.block_deleted,
            &codes,
            self.touched.len(),
            &mut self.out,
        );
        self.block_sizes.push((self.out.len() - start) as u64);
        self.block_checksums.push(checksum(&self.out[start..]));
        encode_block_counts(
            self.num_destinations,
            &self.touched,
            &self.block_counts,
            &mut self.counts_bytes,
        );
        for &d in &self.touched {
            self.block_counts[d as usize] = 0;
        }
        self.touched.clear();
        self.block_live.clear();
        self.block_deleted.clear();
    }

    /// Closes the map and returns the whole file. `expected_destination_rows[d]` is the
    /// row count the rewrite wrote to destination `d`; any disagreement is an error.
    pub fn finish(mut self, expected_destination_rows: &[u64]) -> Result<Vec<u8>> {
        if self.pushed < self.live_rows {
            return Err(RowMapError::TooFewLabels {
                pushed: self.pushed,
                live_rows: self.live_rows,
            });
        }
        // Deleted rows after the last live row.
        self.place_deleted();
        debug_assert_eq!(self.row, self.total_rows);
        self.flush_block();
        if expected_destination_rows.len() != self.num_destinations {
            return Err(RowMapError::ExpectedTotalsLen {
                expected: self.num_destinations,
                found: expected_destination_rows.len(),
            });
        }
        for (d, (&found, &expected)) in self
            .totals
            .iter()
            .zip(expected_destination_rows)
            .enumerate()
        {
            if found != expected {
                return Err(RowMapError::DestinationTotal {
                    destination: d,
                    expected,
                    found,
                });
            }
        }
        let totals: Vec<u32> = self.totals.iter().map(|&t| t as u32).collect();
        let footer = FooterParts {
            version: FORMAT_VERSION,
            representation: REPR_BLOCKED_LABELS,
            num_destinations: self.num_destinations as u32,
            block_rows: self.block_rows,
            total_rows: self.total_rows,
            num_blocks: self.block_sizes.len() as u64,
            totals: &totals,
            counts: &self.counts_bytes,
            block_sizes: &self.block_sizes,
            block_checksums: &self.block_checksums,
        };
        footer.append_to(&mut self.out);
        Ok(self.out)
    }
}

/// The footer's fields before encoding. Kept separate from the writer so tests can build
/// footers that are well-formed byte-wise but wrong in content.
pub(super) struct FooterParts<'p> {
    pub(super) version: u16,
    pub(super) representation: u16,
    pub(super) num_destinations: u32,
    pub(super) block_rows: u32,
    pub(super) total_rows: u64,
    pub(super) num_blocks: u64,
    pub(super) totals: &'p [u32],
    pub(super) counts: &'p [u8],
    pub(super) block_sizes: &'p [u64],
    pub(super) block_checksums: &'p [u32],
}

impl FooterParts<'_> {
    /// Appends footer and trailer.
    pub(super) fn append_to(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&FILE_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.representation.to_le_bytes());
        out.extend_from_slice(&self.num_destinations.to_le_bytes());
        out.extend_from_slice(&self.block_rows.to_le_bytes());
        out.extend_from_slice(&self.total_rows.to_le_bytes());
        out.extend_from_slice(&self.num_blocks.to_le_bytes());
        for t in self.totals {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(self.counts);
        for &s in self.block_sizes {
            put_varint(out, s);
        }
        for c in self.block_checksums {
            out.extend_from_slice(&c.to_le_bytes());
        }
        let footer_len = (out.len() - start) as u64;
        let sum = Digest::of_version(self.version).sum(&out[start..]);
        out.extend_from_slice(&footer_len.to_le_bytes());
        out.extend_from_slice(&sum.to_le_bytes());
        out.extend_from_slice(&FILE_MAGIC);
    }
}

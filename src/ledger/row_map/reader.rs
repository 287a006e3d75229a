//! [`RowMapFooter`]: reads a row-map file's tail and decodes its blocks. The layout is
//! described in the parent module.

use std::ops::Range;

use super::block::{BlockLabels, Placement, SweepTranslator, translate_sorted};
use super::codec::{Digest, Reader, decode_block, decode_block_counts};
use super::{
    CountsMatrix, FILE_MAGIC, FORMAT_VERSION, HEADER_LEN, MAX_DESTINATIONS,
    OLDEST_READABLE_VERSION, REPR_BLOCKED_LABELS, Result, RowMapError, TAIL_READ_HINT, TRAILER_LEN,
};

/// The decoded footer: what a reader keeps in memory for the life of the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMapFooter {
    counts: CountsMatrix,
    /// Start of every block, plus the footer's start at the end.
    block_offsets: Vec<u64>,
    block_checksums: Vec<u32>,
    /// The checksum the file's format version uses.
    digest: Digest,
    file_len: u64,
}

impl RowMapFooter {
    /// Bytes to fetch from the end of the file for the first read; see
    /// [`required_tail_len`](Self::required_tail_len).
    pub const fn tail_len_hint() -> u64 {
        TAIL_READ_HINT
    }

    /// From the last bytes of the file (at least [`TRAILER_LEN`]): how many tail bytes
    /// [`decode`](Self::decode) needs. If that is more than was read, read that many.
    pub fn required_tail_len(tail: &[u8], file_len: u64) -> Result<u64> {
        if tail.len() as u64 > file_len {
            return Err(RowMapError::Corrupt(format!(
                "a tail of {} bytes cannot come from a {file_len}-byte file",
                tail.len()
            )));
        }
        if (tail.len() as u64) < TRAILER_LEN {
            return Err(RowMapError::Truncated {
                what: "file tail (trailer)".into(),
                needed: TRAILER_LEN,
                available: tail.len() as u64,
            });
        }
        let mut r = Reader::new(&tail[tail.len() - TRAILER_LEN as usize..], "trailer");
        let footer_len = r.u64("footer length")?;
        let _checksum = r.u32("footer checksum")?;
        let magic = r.magic("magic")?;
        if magic != FILE_MAGIC {
            return Err(RowMapError::BadMagic {
                what: "trailer",
                found: magic,
            });
        }
        let needed = footer_len
            .checked_add(TRAILER_LEN)
            .filter(|&n| n <= file_len.saturating_sub(HEADER_LEN))
            .ok_or_else(|| {
                RowMapError::Corrupt(format!(
                    "footer of {footer_len} bytes does not fit a {file_len}-byte file"
                ))
            })?;
        Ok(needed)
    }

    /// Decodes and fully validates the footer from the file's last `tail.len()` bytes.
    pub fn decode(tail: &[u8], file_len: u64) -> Result<Self> {
        let needed = Self::required_tail_len(tail, file_len)?;
        if needed > tail.len() as u64 {
            return Err(RowMapError::Truncated {
                what: "file tail (footer)".into(),
                needed,
                available: tail.len() as u64,
            });
        }
        let trailer_at = tail.len() - TRAILER_LEN as usize;
        let body = &tail[tail.len() - needed as usize..trailer_at];
        let stored_sum = u32::from_le_bytes([
            tail[trailer_at + 8],
            tail[trailer_at + 9],
            tail[trailer_at + 10],
            tail[trailer_at + 11],
        ]);
        let mut r = Reader::new(body, "footer");
        // Version and representation come before the checksum check so a file from a
        // newer writer is reported as such, not as corruption.
        let digest = Digest::of_version(check_identity(&mut r, "footer")?);
        let found_sum = digest.sum(body);
        if found_sum != stored_sum {
            return Err(RowMapError::FooterChecksum {
                expected: stored_sum,
                found: found_sum,
            });
        }

        let m = r.u32("num_destinations")? as usize;
        let block_rows = r.u32("block_rows")?;
        let total_rows = r.u64("total_rows")?;
        let num_blocks = r.u64("num_blocks")?;
        if m > MAX_DESTINATIONS {
            return Err(RowMapError::Corrupt(format!(
                "{m} destinations, at most {MAX_DESTINATIONS} are possible"
            )));
        }
        let expected_blocks = CountsMatrix::blocks_for(block_rows, total_rows)?;
        if num_blocks != expected_blocks as u64 {
            return Err(RowMapError::Corrupt(format!(
                "{num_blocks} blocks recorded, but {total_rows} rows in blocks of \
                 {block_rows} make {expected_blocks}"
            )));
        }
        // Every block costs at least one byte of counts and one of data: a block count the
        // footer and file cannot hold is rejected before anything is allocated for it.
        let data_len = file_len - HEADER_LEN - needed;
        if expected_blocks > r.remaining() || expected_blocks as u64 > data_len {
            return Err(RowMapError::Corrupt(format!(
                "{expected_blocks} blocks cannot fit {} footer and {data_len} data bytes",
                r.remaining()
            )));
        }
        let totals: Vec<u32> = (0..m).map(|_| r.u32("totals")).collect::<Result<_>>()?;

        let cells = (expected_blocks + 1)
            .checked_mul(m)
            .ok_or(RowMapError::TooLarge {
                what: "counts matrix",
            })?;
        let mut cum: Vec<u32> = Vec::new();
        cum.try_reserve_exact(cells)
            .map_err(|_| RowMapError::TooLarge {
                what: "counts matrix",
            })?;
        cum.resize(m, 0);
        for b in 0..expected_blocks {
            decode_block_counts(&mut r, m, b, &mut cum)?;
        }
        let counts = CountsMatrix::from_raw(m, block_rows, total_rows, cum)?;
        counts.validate()?;
        for (d, (&total, &last)) in totals.iter().zip(counts.totals()).enumerate() {
            if total != last {
                return Err(RowMapError::TotalsDisagree {
                    destination: d,
                    total,
                    last,
                });
            }
        }

        let mut block_offsets = Vec::with_capacity(expected_blocks + 1);
        let mut at = HEADER_LEN;
        block_offsets.push(at);
        for b in 0..expected_blocks {
            let size = r.varint("block size")?;
            // A block holds at least its flag byte, so offsets strictly increase.
            if size == 0 || size > data_len {
                return Err(RowMapError::Corrupt(format!("block {b} has size {size}")));
            }
            at += size;
            block_offsets.push(at);
        }
        if at != HEADER_LEN + data_len {
            return Err(RowMapError::Corrupt(format!(
                "blocks end at byte {at}, but the footer starts at byte {}",
                HEADER_LEN + data_len
            )));
        }
        let block_checksums: Vec<u32> = (0..expected_blocks)
            .map(|_| r.u32("block checksum"))
            .collect::<Result<_>>()?;
        r.finish()?;
        Ok(Self {
            counts,
            block_offsets,
            block_checksums,
            digest,
            file_len,
        })
    }

    /// The counts matrix: cumulative rows per destination at every block boundary.
    pub fn counts(&self) -> &CountsMatrix {
        &self.counts
    }

    /// Blocks the source rows are split into.
    pub fn num_blocks(&self) -> usize {
        self.counts.num_blocks()
    }

    /// Destinations the map routes rows to.
    pub fn num_destinations(&self) -> usize {
        self.counts.num_destinations()
    }

    /// Physical source rows the map covers, deleted ones included.
    pub fn total_rows(&self) -> u64 {
        self.counts.total_rows()
    }

    /// Source rows per block; only the last block may have fewer.
    pub fn block_rows(&self) -> u32 {
        self.counts.block_rows()
    }

    /// Rows each destination received.
    pub fn totals(&self) -> &[u32] {
        self.counts.totals()
    }

    /// Length in bytes of the whole row-map file the footer was read from.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Byte range of block `b` in the file. Panics if `b >= num_blocks`.
    pub fn block_range(&self, b: usize) -> Range<u64> {
        self.block_offsets[b]..self.block_offsets[b + 1]
    }

    /// Byte range covering blocks `blocks` (for one coalesced read of neighbours). Panics
    /// if the range is empty or past the last block.
    pub fn blocks_range(&self, blocks: Range<usize>) -> Range<u64> {
        assert!(!blocks.is_empty(), "empty block range");
        self.block_offsets[blocks.start]..self.block_offsets[blocks.end]
    }

    /// Block and in-block position of source row `row`.
    pub fn locate(&self, row: u64) -> Result<(usize, u32)> {
        self.counts.locate(row)
    }

    /// Decodes block `b` from exactly the bytes of [`block_range`](Self::block_range),
    /// verifying its checksum and its counts against the footer.
    pub fn decode_block(&self, b: usize, bytes: &[u8]) -> Result<BlockLabels> {
        if b >= self.num_blocks() {
            return Err(RowMapError::BlockOutOfRange {
                block: b,
                num_blocks: self.num_blocks(),
            });
        }
        let range = self.block_range(b);
        if bytes.len() as u64 != range.end - range.start {
            return Err(RowMapError::BlockMismatch {
                block: b,
                what: "block bytes",
                expected: range.end - range.start,
                found: bytes.len() as u64,
            });
        }
        let found = self.digest.sum(bytes);
        if found != self.block_checksums[b] {
            return Err(RowMapError::BlockChecksum {
                block: b,
                expected: self.block_checksums[b],
                found,
            });
        }
        self.decode_block_unchecked(b, bytes)
    }

    /// Like [`decode_block`](Self::decode_block) without the checksum, so tests can show
    /// that the count checks alone catch corrupt blocks.
    pub(super) fn decode_block_unchecked(&self, b: usize, bytes: &[u8]) -> Result<BlockLabels> {
        decode_block(
            b,
            self.counts.block_len(b),
            &self.counts.block_counts(b),
            bytes,
        )
    }

    /// Point translation of source row `row`, which must lie in `block`.
    pub fn translate(&self, row: u64, block: &BlockLabels) -> Result<Option<Placement>> {
        let (b, pos) = self.locate(row)?;
        if block.index() != b {
            return Err(RowMapError::BlockMismatch {
                block: b,
                what: "index of the supplied block",
                expected: b as u64,
                found: block.index() as u64,
            });
        }
        block.translate(pos, self.counts.base(b))
    }

    /// A sweep whose first row is `start_row`.
    pub fn sweep_from(&self, start_row: u64) -> Result<SweepTranslator> {
        SweepTranslator::new(&self.counts, start_row)
    }

    /// See [`translate_sorted`].
    pub fn translate_sorted<'b>(
        &self,
        rows: &[u64],
        blocks: impl Fn(usize) -> Option<&'b BlockLabels>,
    ) -> Result<Vec<Option<Placement>>> {
        translate_sorted(&self.counts, rows, blocks)
    }
}

/// Checks the first bytes of a row-map file (magic, version, representation).
pub fn check_header(head: &[u8]) -> Result<()> {
    check_identity(&mut Reader::new(head, "header"), "header").map(drop)
}

/// Magic, version and representation tag, as the header and the footer both start; returns
/// the version (format 1 files, with the older digest, stay readable).
fn check_identity(r: &mut Reader<'_>, what: &'static str) -> Result<u16> {
    let magic = r.magic("magic")?;
    if magic != FILE_MAGIC {
        return Err(RowMapError::BadMagic { what, found: magic });
    }
    let version = r.u16("version")?;
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(RowMapError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let representation = r.u16("representation")?;
    if representation != REPR_BLOCKED_LABELS {
        return Err(RowMapError::UnknownRepresentation {
            found: representation,
            supported: REPR_BLOCKED_LABELS,
        });
    }
    Ok(version)
}

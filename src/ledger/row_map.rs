//! Stable-partition row maps: where every source row of a RECLUSTER rewrite went.
//!
//! # What is recorded, and the ordering contract
//!
//! A RECLUSTER rewrite scans its n source fragments in order (sources in list order, each
//! source's physical rows in ascending offset, deleted rows included in the numbering) and
//! appends each live row to exactly one of m destinations. The only decision it makes per
//! row is *which* destination; that index into the ordered destination list is the row's
//! **label** (a u16). The map stores one label per physical source row, deleted rows
//! marked as such.
//!
//! Offsets inside a destination are not stored; they are derived. That is only correct
//! under this contract, which the rewrite must honour:
//!
//! * labels are recorded in source scan order;
//! * each destination receives its rows in that same order and is never re-sorted (the
//!   rewrite is a **stable partition**): a row's offset in its destination is then the
//!   number of earlier rows with the same label;
//! * the destination list is fixed for the whole rewrite. Parallel writers must restore
//!   per-destination source order before recording the map.
//!
//! A rewrite that sorts rows *within* a destination is not representable: two rows with
//! equal labels always rank in source order. Such a rewrite needs a per-row permutation
//! format, not a relaxation of this one.
//!
//! Deriving offsets is what makes the map small: a label costs `ceil(log2 k)` bits for the
//! k destinations a block feeds (about 10 bits for 1000 destinations, 4 when a block feeds
//! 16), where a stored offset would cost 32.
//!
//! # Translating without replaying the file
//!
//! Rows are grouped in blocks of `block_rows` (65,536 by default). A [`CountsMatrix`]
//! holds, for every block boundary, the cumulative number of rows each destination has
//! received so far. Then:
//!
//! * **point** lookup of row g: block `b = g / block_rows`, position `p = g % block_rows`;
//!   decode block b; a deleted row maps to `None`, otherwise
//!   `offset = base(b)[label] + rank`, where the rank counts the rows with the same label
//!   before p in the block: a vectorized count over at most one block
//!   ([`translate_in_block`]);
//! * **sweep** from any block boundary (or mid-block, counting the skipped prefix):
//!   counters start at `base(b)`, then `offset = counter[label]++`, O(1) per row
//!   ([`SweepTranslator`]);
//! * **sorted batches** rank each row, or sweep a block once when its rows are dense
//!   ([`translate_sorted`]).
//!
//! # File layout
//!
//! All integers little-endian. The file is built for range reads: one tail read for the
//! footer, then one read per block.
//!
//! ```text
//! header   "FVRM" | version u16 | representation u16                        (8 bytes)
//! block 0  flags u8 | deletions | packed label codes
//! block 1  ...
//! footer   "FVRM" | version u16 | representation u16 | num_destinations u32
//!          | block_rows u32 | total_rows u64 | num_blocks u64
//!          | totals: m × u32                       (rows per destination)
//!          | counts: per block, tag u8 then
//!              0 dense:  m varints, the block's per-destination row counts
//!              1 sparse: varint n, n × (varint destination gap, varint count)
//!          | block sizes: num_blocks varints       (offsets follow from the header)
//!          | block checksums: num_blocks × u32
//! trailer  footer_len u64 | footer checksum u32 | "FVRM"                    (16 bytes)
//! ```
//!
//! A block's flags say how deletions are stored (none; a bitset over the block's rows,
//! LSB first; or a varint count then varint gaps, whichever is smallest) and how labels
//! are stored. The one label encoding so far packs,
//! at `ceil(log2 k)` bits, each live row's code in the block's **dictionary**: the sorted
//! destinations whose count grows in this block. The dictionary itself is not stored,
//! since the footer's counts already name those destinations, so it is never larger than
//! packing raw labels and a block feeding one destination stores no label bits at all.
//!
//! Readers reject an unknown version, representation, or block flag by name. Both the
//! footer and every block carry a checksum (CRC32C from version 2; version 1 files, whose
//! digest was home-made, are still read with it), and decoding a block also checks its live row
//! count and per-label counts against the counts matrix, so corruption fails loudly
//! instead of translating rows to wrong places.
//!
//! Everything here is IO-free: [`RowMapWriter`] returns the file's bytes,
//! [`RowMapFooter::decode`] takes the file's tail, [`RowMapFooter::decode_block`] one
//! block's bytes.

mod block;
mod codec;
mod reader;
#[cfg(test)]
mod tests;
mod writer;

pub use block::{
    BlockLabels, BlockRun, Placement, SweepRows, SweepTranslator, block_runs, translate_in_block,
    translate_run, translate_sorted,
};
pub use reader::{RowMapFooter, check_header};
pub use writer::{RowMapWriter, SourceRows};

/// First and last four bytes of a row-map file.
pub const FILE_MAGIC: [u8; 4] = *b"FVRM";
/// The format version this code writes (and the newest it reads). Version 2 checksums with
/// CRC32C; version 1 used a home-made 32-bit digest and is still read.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest format version this code reads.
pub const OLDEST_READABLE_VERSION: u16 = 1;
/// Representation tag: labels in blocks plus a counts matrix (the only one so far).
pub const REPR_BLOCKED_LABELS: u16 = 0;
/// Magic, version and representation; blocks start right after.
pub const HEADER_LEN: u64 = 8;
/// `footer_len u64 | footer checksum u32 | magic`.
pub const TRAILER_LEN: u64 = 16;
/// How many bytes a reader should fetch from the end of the file first. That holds the
/// footer of a map of ~4M rows whose blocks all feed 1000 destinations (the counts cost
/// about one byte per destination per block), and of far larger maps whose blocks feed
/// few; a longer footer is reported by [`RowMapFooter::required_tail_len`] and takes a
/// second read.
pub const TAIL_READ_HINT: u64 = 64 << 10;

/// Rows per block unless the writer is told otherwise.
pub const DEFAULT_BLOCK_ROWS: u32 = 1 << 16;
/// Largest block: a decoded block holds every label of its rows in memory, and a corrupt
/// footer must not be able to ask for gigabytes per block.
pub const MAX_BLOCK_ROWS: u32 = 1 << 24;
/// Labels are u16 and `u16::MAX` is never a label, so at most 65,535 destinations.
pub const MAX_DESTINATIONS: usize = u16::MAX as usize;

/// A row-map operation's result.
pub type Result<T> = std::result::Result<T, RowMapError>;

/// Everything that can go wrong building, decoding or using a row map. Messages name the
/// block, destination or field involved and the expected and found values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowMapError {
    // Parameters.
    /// Reported as `row map: block_rows is {found}, it must be in 1..={max}`.
    #[error("row map: block_rows is {found}, it must be in 1..={max}")]
    BlockRows {
        /// What was found.
        found: u64,
        /// The largest allowed.
        max: u32,
    },
    /// Reported as `row map: {num_destinations} destinations for {live_rows} live rows; need 1..=65535 (0 only when no row is live)`.
    #[error(
        "row map: {num_destinations} destinations for {live_rows} live rows; \
         need 1..=65535 (0 only when no row is live)"
    )]
    Destinations {
        /// Destinations of the map.
        num_destinations: usize,
        /// Live rows of the sources.
        live_rows: u64,
    },
    /// Reported as `row map: {what} overflows`.
    #[error("row map: {what} overflows")]
    TooLarge {
        /// What was being read or computed.
        what: &'static str,
    },

    // Writer input.
    /// Reported as `row map writer: source {source_index} lists deleted offset {offset}, but has only {physical_rows} physical rows`.
    #[error(
        "row map writer: source {source_index} lists deleted offset {offset}, \
         but has only {physical_rows} physical rows"
    )]
    DeletedOffsetOutOfRange {
        /// The source fragment, by position.
        source_index: usize,
        /// The offset.
        offset: u32,
        /// Physical rows of the source.
        physical_rows: u64,
    },
    /// Reported as `row map writer: source {source_index} deleted offsets must strictly increase, but entry {index} is {offset} after {previous}`.
    #[error(
        "row map writer: source {source_index} deleted offsets must strictly increase, \
         but entry {index} is {offset} after {previous}"
    )]
    DeletedOffsetsUnsorted {
        /// The source fragment, by position.
        source_index: usize,
        /// Position in the list.
        index: usize,
        /// The value before it.
        previous: u32,
        /// The offset.
        offset: u32,
    },
    /// Reported as `row map writer: label {label} of live row {live_row} is not below num_destinations = {num_destinations}`.
    #[error(
        "row map writer: label {label} of live row {live_row} is not below \
         num_destinations = {num_destinations}"
    )]
    LabelOutOfRange {
        /// The label.
        label: u16,
        /// The live row, in order.
        live_row: u64,
        /// Destinations of the map.
        num_destinations: usize,
    },
    /// Reported as `row map writer: more labels than the sources' {live_rows} live rows`.
    #[error("row map writer: more labels than the sources' {live_rows} live rows")]
    TooManyLabels {
        /// Live rows of the sources.
        live_rows: u64,
    },
    /// Reported as `row map writer: finished after {pushed} labels, but the sources have {live_rows} live rows`.
    #[error(
        "row map writer: finished after {pushed} labels, but the sources have {live_rows} live rows"
    )]
    TooFewLabels {
        /// Labels pushed.
        pushed: u64,
        /// Live rows of the sources.
        live_rows: u64,
    },
    /// Reported as `row map writer: destination {destination} would receive more than u32::MAX rows`.
    #[error("row map writer: destination {destination} would receive more than u32::MAX rows")]
    DestinationOverflow {
        /// The destination.
        destination: u16,
    },
    /// Reported as `row map writer: expected totals list {found} destinations, the map has {expected}`.
    #[error("row map writer: expected totals list {found} destinations, the map has {expected}")]
    ExpectedTotalsLen {
        /// What was expected.
        expected: usize,
        /// What was found.
        found: usize,
    },
    /// Reported as `row map writer: destination {destination} received {found} rows, expected {expected}`.
    #[error("row map writer: destination {destination} received {found} rows, expected {expected}")]
    DestinationTotal {
        /// The destination.
        destination: usize,
        /// What was expected.
        expected: u64,
        /// What was found.
        found: u64,
    },

    // Decoding.
    /// Reported as `row map {what}: bad magic {found:02x?}, expected "FVRM"`.
    #[error("row map {what}: bad magic {found:02x?}, expected \"FVRM\"")]
    BadMagic {
        /// What was being read or computed.
        what: &'static str,
        /// What was found.
        found: [u8; 4],
    },
    /// Reported as `row map: format version {found} is not supported (this reader knows versions 1 to {supported})`.
    #[error(
        "row map: format version {found} is not supported (this reader knows versions 1 to {supported})"
    )]
    UnsupportedVersion {
        /// What was found.
        found: u16,
        /// The newest this reader knows.
        supported: u16,
    },
    /// Reported as `row map: representation tag {found} is unknown (this reader knows tag {supported}, blocked labels)`.
    #[error(
        "row map: representation tag {found} is unknown (this reader knows tag {supported}, \
         blocked labels)"
    )]
    UnknownRepresentation {
        /// What was found.
        found: u16,
        /// The newest this reader knows.
        supported: u16,
    },
    /// Reported as `row map {what}: needs {needed} bytes, only {available} available`.
    #[error("row map {what}: needs {needed} bytes, only {available} available")]
    Truncated {
        /// What was being read or computed.
        what: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// Reported as `row map footer: checksum {found:#010x} does not match the stored {expected:#010x}`.
    #[error("row map footer: checksum {found:#010x} does not match the stored {expected:#010x}")]
    FooterChecksum {
        /// What was expected.
        expected: u32,
        /// What was found.
        found: u32,
    },
    /// Reported as `row map block {block}: checksum {found:#010x} does not match the stored {expected:#010x}`.
    #[error(
        "row map block {block}: checksum {found:#010x} does not match the stored {expected:#010x}"
    )]
    BlockChecksum {
        /// The block.
        block: usize,
        /// What was expected.
        expected: u32,
        /// What was found.
        found: u32,
    },
    /// Reported as `row map footer: {0}`.
    #[error("row map footer: {0}")]
    Corrupt(String),
    /// Reported as `row map counts: destination {destination} goes from {previous} to {found} at block {block}; cumulative counts must not decrease`.
    #[error(
        "row map counts: destination {destination} goes from {previous} to {found} at block \
         {block}; cumulative counts must not decrease"
    )]
    CountsNotMonotone {
        /// The block.
        block: usize,
        /// The destination.
        destination: usize,
        /// The value before it.
        previous: u32,
        /// What was found.
        found: u32,
    },
    /// Reported as `row map counts: block {block} has {live} live rows but only {block_len} rows`.
    #[error("row map counts: block {block} has {live} live rows but only {block_len} rows")]
    BlockOverBudget {
        /// The block.
        block: usize,
        /// Live rows the counts give it.
        live: u64,
        /// Rows in the block.
        block_len: u32,
    },
    /// Reported as `row map counts: destination {destination} totals {total} rows, but its cumulative counts end at {last}`.
    #[error(
        "row map counts: destination {destination} totals {total} rows, \
         but its cumulative counts end at {last}"
    )]
    TotalsDisagree {
        /// The destination.
        destination: usize,
        /// The destination's total.
        total: u32,
        /// Where its cumulative counts end.
        last: u32,
    },
    /// Reported as `row map block {block}: {what}: expected {expected}, found {found}`.
    #[error("row map block {block}: {what}: expected {expected}, found {found}")]
    BlockMismatch {
        /// The block.
        block: usize,
        /// What was being read or computed.
        what: &'static str,
        /// What was expected.
        expected: u64,
        /// What was found.
        found: u64,
    },
    /// Reported as `row map block {block}: label {label} appears {found} times, the counts say {expected}`.
    #[error(
        "row map block {block}: label {label} appears {found} times, the counts say {expected}"
    )]
    BlockLabelCount {
        /// The block.
        block: usize,
        /// The label.
        label: u16,
        /// What was expected.
        expected: u32,
        /// What was found.
        found: u32,
    },
    /// Reported as `row map block {block}: unknown encoding flags {flags:#04x}`.
    #[error("row map block {block}: unknown encoding flags {flags:#04x}")]
    UnknownBlockEncoding {
        /// The block.
        block: usize,
        /// The encoding flags.
        flags: u8,
    },
    /// Reported as `row map block {block}: {reason}`.
    #[error("row map block {block}: {reason}")]
    CorruptBlock {
        /// The block.
        block: usize,
        /// What is wrong.
        reason: String,
    },

    // Lookups.
    /// Reported as `row map: block {block} does not exist ({num_blocks} blocks)`.
    #[error("row map: block {block} does not exist ({num_blocks} blocks)")]
    BlockOutOfRange {
        /// The block.
        block: usize,
        /// Blocks in the map.
        num_blocks: usize,
    },
    /// Reported as `row map: row {row} is outside the {total_rows} source rows`.
    #[error("row map: row {row} is outside the {total_rows} source rows")]
    RowOutOfRange {
        /// The row.
        row: u64,
        /// Source rows of the map.
        total_rows: u64,
    },
    /// Reported as `row map: position {pos} is outside block {block} of {len} rows`.
    #[error("row map: position {pos} is outside block {block} of {len} rows")]
    PositionOutOfRange {
        /// The block.
        block: usize,
        /// The position.
        pos: u32,
        /// Rows in the block.
        len: u32,
    },
    /// Reported as `row map block {block}: label {label} has no base count ({num_destinations} destinations)`.
    #[error(
        "row map block {block}: label {label} has no base count ({num_destinations} destinations)"
    )]
    LabelWithoutBase {
        /// The block.
        block: usize,
        /// The label.
        label: u16,
        /// Destinations of the map.
        num_destinations: usize,
    },
    /// Reported as `row map: rows must be sorted, but row {row} at index {index} follows {previous}`.
    #[error("row map: rows must be sorted, but row {row} at index {index} follows {previous}")]
    UnsortedRows {
        /// Position in the list.
        index: usize,
        /// The value before it.
        previous: u64,
        /// The row.
        row: u64,
    },
    /// Reported as `row map: block {block} is needed but was not supplied`.
    #[error("row map: block {block} is needed but was not supplied")]
    MissingBlock {
        /// The block.
        block: usize,
    },
    /// Reported as `row map sweep: expected block {expected_block} ({expected_len} rows), got block {found_block} ({found_len} rows)`.
    #[error(
        "row map sweep: expected block {expected_block} ({expected_len} rows), \
         got block {found_block} ({found_len} rows)"
    )]
    SweepOrder {
        /// The block expected next.
        expected_block: usize,
        /// Its rows.
        expected_len: u32,
        /// The block given.
        found_block: usize,
        /// Its rows.
        found_len: u32,
    },
    /// Reported as `row map sweep: all {total_rows} rows were already emitted`.
    #[error("row map sweep: all {total_rows} rows were already emitted")]
    SweepFinished {
        /// Source rows of the map.
        total_rows: u64,
    },
}

/// Cumulative per-destination row counts at every block boundary.
///
/// Row `b` (for `b` in `0..num_blocks`) holds, for each destination, the rows labelled
/// with it in blocks `0..=b`. Internally a zero row is kept in front, so the base of block
/// `b` (counts before it) is always a plain slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountsMatrix {
    num_destinations: usize,
    block_rows: u32,
    total_rows: u64,
    num_blocks: usize,
    /// `(num_blocks + 1) × num_destinations`, row-major, first row zeros.
    cum: Vec<u32>,
}

impl CountsMatrix {
    /// From `num_blocks × num_destinations` cumulative counts (row-major, block by
    /// block); validated.
    pub fn new(
        num_destinations: usize,
        block_rows: u32,
        total_rows: u64,
        cumulative: &[u32],
    ) -> Result<Self> {
        let num_blocks = Self::blocks_for(block_rows, total_rows)?;
        let cells = num_blocks
            .checked_mul(num_destinations)
            .ok_or(RowMapError::TooLarge {
                what: "counts matrix",
            })?;
        if cumulative.len() != cells {
            return Err(RowMapError::Corrupt(format!(
                "counts matrix has {} cells, expected {num_blocks} blocks × \
                 {num_destinations} destinations",
                cumulative.len()
            )));
        }
        let mut cum = vec![0u32; num_destinations];
        cum.extend_from_slice(cumulative);
        let counts = Self {
            num_destinations,
            block_rows,
            total_rows,
            num_blocks,
            cum,
        };
        counts.validate()?;
        Ok(counts)
    }

    /// Counts of a complete label sequence (`None` = deleted), e.g. for an in-memory map.
    pub fn from_labels(
        num_destinations: usize,
        block_rows: u32,
        labels: &[Option<u16>],
    ) -> Result<Self> {
        let num_blocks = Self::blocks_for(block_rows, labels.len() as u64)?;
        let mut cum = vec![0u32; num_destinations];
        let mut running = vec![0u32; num_destinations];
        let mut live_row = 0u64;
        for chunk in labels.chunks(block_rows as usize) {
            for &l in chunk.iter().flatten() {
                let c = running
                    .get_mut(l as usize)
                    .ok_or(RowMapError::LabelOutOfRange {
                        label: l,
                        live_row,
                        num_destinations,
                    })?;
                live_row += 1;
                *c = c
                    .checked_add(1)
                    .ok_or(RowMapError::DestinationOverflow { destination: l })?;
            }
            cum.extend_from_slice(&running);
        }
        let counts = Self {
            num_destinations,
            block_rows,
            total_rows: labels.len() as u64,
            num_blocks,
            cum,
        };
        counts.validate()?;
        Ok(counts)
    }

    /// Assembles from an already zero-prefixed matrix (the decoder builds it in place);
    /// not validated.
    pub(super) fn from_raw(
        num_destinations: usize,
        block_rows: u32,
        total_rows: u64,
        cum: Vec<u32>,
    ) -> Result<Self> {
        let num_blocks = Self::blocks_for(block_rows, total_rows)?;
        Ok(Self {
            num_destinations,
            block_rows,
            total_rows,
            num_blocks,
            cum,
        })
    }

    pub(super) fn blocks_for(block_rows: u32, total_rows: u64) -> Result<usize> {
        if block_rows == 0 || block_rows > MAX_BLOCK_ROWS {
            return Err(RowMapError::BlockRows {
                found: u64::from(block_rows),
                max: MAX_BLOCK_ROWS,
            });
        }
        usize::try_from(total_rows.div_ceil(u64::from(block_rows))).map_err(|_| {
            RowMapError::TooLarge {
                what: "block count",
            }
        })
    }

    /// Checks the invariants translation relies on: the shape, counts that never
    /// decrease, and no block with more live rows than rows (the last block may be
    /// short).
    pub fn validate(&self) -> Result<()> {
        let m = self.num_destinations;
        if m > MAX_DESTINATIONS {
            return Err(RowMapError::Destinations {
                num_destinations: m,
                live_rows: u64::from(self.totals().iter().copied().max().unwrap_or(0)),
            });
        }
        if self.num_blocks != Self::blocks_for(self.block_rows, self.total_rows)?
            || Some(self.cum.len()) != (self.num_blocks + 1).checked_mul(m)
            || self.cum[..m].iter().any(|&c| c != 0)
        {
            return Err(RowMapError::Corrupt(
                "counts matrix has the wrong shape".into(),
            ));
        }
        if m == 0 {
            return Ok(());
        }
        for (b, pair) in self.cum.windows(2 * m).step_by(m).enumerate() {
            let (prev, cur) = pair.split_at(m);
            let mut live = 0u64;
            for (d, (&p, &c)) in prev.iter().zip(cur).enumerate() {
                if c < p {
                    return Err(RowMapError::CountsNotMonotone {
                        block: b,
                        destination: d,
                        previous: p,
                        found: c,
                    });
                }
                live += u64::from(c - p);
            }
            let block_len = self.block_len(b);
            if live > u64::from(block_len) {
                return Err(RowMapError::BlockOverBudget {
                    block: b,
                    live,
                    block_len,
                });
            }
        }
        Ok(())
    }

    /// Destinations rows are mapped to.
    pub fn num_destinations(&self) -> usize {
        self.num_destinations
    }

    /// Rows per block (the last block may have fewer).
    pub fn block_rows(&self) -> u32 {
        self.block_rows
    }

    /// Physical source rows, deleted ones included.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// How many blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Rows in block `b`: `block_rows`, except a short last block. Zero past the end.
    pub fn block_len(&self, b: usize) -> u32 {
        let start = (b as u64).saturating_mul(u64::from(self.block_rows));
        self.total_rows
            .saturating_sub(start)
            .min(u64::from(self.block_rows)) as u32
    }

    /// Block and in-block position of source row `row`.
    pub fn locate(&self, row: u64) -> Result<(usize, u32)> {
        if row >= self.total_rows {
            return Err(RowMapError::RowOutOfRange {
                row,
                total_rows: self.total_rows,
            });
        }
        let block_rows = u64::from(self.block_rows);
        Ok(((row / block_rows) as usize, (row % block_rows) as u32))
    }

    /// Per-destination rows before block `b` (zeros for block 0, the totals for
    /// `b == num_blocks`). Panics if `b > num_blocks`.
    pub fn base(&self, b: usize) -> &[u32] {
        let m = self.num_destinations;
        &self.cum[b * m..(b + 1) * m]
    }

    /// Per-destination rows in blocks `0..=b`. Panics if `b >= num_blocks`.
    pub fn cumulative(&self, b: usize) -> &[u32] {
        assert!(b < self.num_blocks, "block {b} of {}", self.num_blocks);
        self.base(b + 1)
    }

    /// Rows each destination received in the whole rewrite.
    pub fn totals(&self) -> &[u32] {
        self.base(self.num_blocks)
    }

    /// Rows of destination `d` inside block `b` alone.
    pub fn block_count(&self, b: usize, d: usize) -> u32 {
        self.cumulative(b)[d] - self.base(b)[d]
    }

    /// Per-destination rows inside block `b` alone.
    pub fn block_counts(&self, b: usize) -> Vec<u32> {
        self.cumulative(b)
            .iter()
            .zip(self.base(b))
            .map(|(c, p)| c - p)
            .collect()
    }

    /// Live rows of block `b`.
    pub fn block_live_rows(&self, b: usize) -> u64 {
        self.cumulative(b)
            .iter()
            .zip(self.base(b))
            .map(|(c, p)| u64::from(c - p))
            .sum()
    }
}

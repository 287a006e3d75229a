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
    /// `block_rows` is 0 or above [`MAX_BLOCK_ROWS`] (given to a writer or counts matrix,
    /// or read from a footer).
    #[error("row map: block_rows is {found}, it must be in 1..={max}")]
    BlockRows {
        /// The rows per block asked for or read.
        found: u64,
        /// The largest allowed, [`MAX_BLOCK_ROWS`].
        max: u32,
    },
    /// The destination count is above [`MAX_DESTINATIONS`], or zero while some source row
    /// is live.
    #[error(
        "row map: {num_destinations} destinations for {live_rows} live rows; \
         need 1..=65535 (0 only when no row is live)"
    )]
    Destinations {
        /// The destination count asked for (or found in a counts matrix).
        num_destinations: usize,
        /// Live rows of the sources (for a counts matrix, its largest destination total).
        live_rows: u64,
    },
    /// A size computed from the input (total rows, block count, counts matrix, a
    /// destination offset) overflows its integer type or cannot be allocated.
    #[error("row map: {what} overflows")]
    TooLarge {
        /// The quantity that overflowed.
        what: &'static str,
    },

    // Writer input.
    /// A writer source lists a deleted offset at or past its physical row count.
    #[error(
        "row map writer: source {source_index} lists deleted offset {offset}, \
         but has only {physical_rows} physical rows"
    )]
    DeletedOffsetOutOfRange {
        /// Position of the source in the writer's source list.
        source_index: usize,
        /// The deleted offset, a row position within that source.
        offset: u32,
        /// Physical rows of the source, deleted ones included.
        physical_rows: u64,
    },
    /// A writer source's deleted offsets are not strictly increasing.
    #[error(
        "row map writer: source {source_index} deleted offsets must strictly increase, \
         but entry {index} is {offset} after {previous}"
    )]
    DeletedOffsetsUnsorted {
        /// Position of the source in the writer's source list.
        source_index: usize,
        /// Position of the offending entry in the source's deleted list.
        index: usize,
        /// The entry before it.
        previous: u32,
        /// The offending entry, not greater than `previous`.
        offset: u32,
    },
    /// A label pushed to the writer (or given to `CountsMatrix::from_labels`) is not
    /// below the destination count.
    #[error(
        "row map writer: label {label} of live row {live_row} is not below \
         num_destinations = {num_destinations}"
    )]
    LabelOutOfRange {
        /// The label, an index into the destination list.
        label: u16,
        /// How many live rows came before the labelled row (0 for the first).
        live_row: u64,
        /// The map's destination count.
        num_destinations: usize,
    },
    /// A label is pushed after every live source row already has one.
    #[error("row map writer: more labels than the sources' {live_rows} live rows")]
    TooManyLabels {
        /// Live rows of the sources, the number of labels the writer takes.
        live_rows: u64,
    },
    /// The writer is finished before every live source row got a label.
    #[error(
        "row map writer: finished after {pushed} labels, but the sources have {live_rows} live rows"
    )]
    TooFewLabels {
        /// Labels pushed before `finish`.
        pushed: u64,
        /// Live rows of the sources, the number of labels expected.
        live_rows: u64,
    },
    /// One more row for a destination would take it past `u32::MAX` rows (a row
    /// address's offset).
    #[error("row map writer: destination {destination} would receive more than u32::MAX rows")]
    DestinationOverflow {
        /// The destination's label.
        destination: u16,
    },
    /// The per-destination row counts given to `finish` do not have one entry per
    /// destination.
    #[error("row map writer: expected totals list {found} destinations, the map has {expected}")]
    ExpectedTotalsLen {
        /// The map's destination count.
        expected: usize,
        /// Entries given.
        found: usize,
    },
    /// At `finish`, the rows labelled for a destination differ from the rows the rewrite
    /// says it wrote there.
    #[error("row map writer: destination {destination} received {found} rows, expected {expected}")]
    DestinationTotal {
        /// The destination's index in the destination list.
        destination: usize,
        /// Rows the rewrite says it wrote to the destination.
        expected: u64,
        /// Rows the pushed labels sent there.
        found: u64,
    },

    // Decoding.
    /// The header, footer or trailer lacks [`FILE_MAGIC`]: not a row-map file, or a
    /// damaged one.
    #[error("row map {what}: bad magic {found:02x?}, expected \"FVRM\"")]
    BadMagic {
        /// The part read: `header`, `footer` or `trailer`.
        what: &'static str,
        /// The four bytes found where the magic belongs.
        found: [u8; 4],
    },
    /// The file's format version is outside [`OLDEST_READABLE_VERSION`] to
    /// [`FORMAT_VERSION`] (typically a newer writer's file).
    #[error(
        "row map: format version {found} is not supported (this reader knows versions 1 to {supported})"
    )]
    UnsupportedVersion {
        /// The version the file records.
        found: u16,
        /// The newest version this reader knows, [`FORMAT_VERSION`].
        supported: u16,
    },
    /// The file's representation tag is not [`REPR_BLOCKED_LABELS`].
    #[error(
        "row map: representation tag {found} is unknown (this reader knows tag {supported}, \
         blocked labels)"
    )]
    UnknownRepresentation {
        /// The tag the file records.
        found: u16,
        /// The one tag this reader knows, [`REPR_BLOCKED_LABELS`].
        supported: u16,
    },
    /// Fewer bytes than a field or section needs: a tail read too short for the trailer or
    /// footer, or a footer or block that ends early.
    #[error("row map {what}: needs {needed} bytes, only {available} available")]
    Truncated {
        /// The part and field being read (`footer totals`, `file tail (footer)`, ...).
        what: String,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes that were left.
        available: u64,
    },
    /// The footer's checksum does not match the one stored in the trailer.
    #[error("row map footer: checksum {found:#010x} does not match the stored {expected:#010x}")]
    FooterChecksum {
        /// The checksum stored in the trailer.
        expected: u32,
        /// The checksum of the footer bytes as read.
        found: u32,
    },
    /// A block's bytes do not match the checksum the footer stores for it.
    #[error(
        "row map block {block}: checksum {found:#010x} does not match the stored {expected:#010x}"
    )]
    BlockChecksum {
        /// The block's index.
        block: usize,
        /// The checksum the footer stores.
        expected: u32,
        /// The checksum of the bytes as read.
        found: u32,
    },
    /// The file is malformed in a way no more specific variant names (footer shape or
    /// sizes, an over-long varint, trailing bytes); the message says what.
    #[error("row map footer: {0}")]
    Corrupt(String),
    /// A destination's cumulative count decreases from one block to the next.
    #[error(
        "row map counts: destination {destination} goes from {previous} to {found} at block \
         {block}; cumulative counts must not decrease"
    )]
    CountsNotMonotone {
        /// The block across which the count decreases.
        block: usize,
        /// The destination's index.
        destination: usize,
        /// Its cumulative count before the block.
        previous: u32,
        /// Its cumulative count after the block, below `previous`.
        found: u32,
    },
    /// The counts give a block more live rows than the block has rows.
    #[error("row map counts: block {block} has {live} live rows but only {block_len} rows")]
    BlockOverBudget {
        /// The block's index.
        block: usize,
        /// Live rows the counts give the block (summed over destinations).
        live: u64,
        /// Rows in the block, deleted ones included.
        block_len: u32,
    },
    /// The footer's per-destination total differs from where that destination's cumulative
    /// counts end.
    #[error(
        "row map counts: destination {destination} totals {total} rows, \
         but its cumulative counts end at {last}"
    )]
    TotalsDisagree {
        /// The destination's index.
        destination: usize,
        /// The total the footer records for it.
        total: u32,
        /// Its cumulative count after the last block.
        last: u32,
    },
    /// A block disagrees with the footer or with the block asked for: wrong byte length,
    /// wrong index, wrong row count, or a live-row count other than its counts say.
    #[error("row map block {block}: {what}: expected {expected}, found {found}")]
    BlockMismatch {
        /// The index of the block concerned (for an index mismatch, the one expected).
        block: usize,
        /// The quantity compared.
        what: &'static str,
        /// The value the footer or the request implies.
        expected: u64,
        /// The value the block has.
        found: u64,
    },
    /// A decoded block holds a label a different number of times than the footer's counts
    /// for that block say.
    #[error(
        "row map block {block}: label {label} appears {found} times, the counts say {expected}"
    )]
    BlockLabelCount {
        /// The block's index.
        block: usize,
        /// The label (destination index).
        label: u16,
        /// Rows the footer's counts give that label in the block.
        expected: u32,
        /// Rows of the decoded block that carry it.
        found: u32,
    },
    /// A block's flags byte names a deletion or label encoding this reader does not know,
    /// or sets a reserved bit.
    #[error("row map block {block}: unknown encoding flags {flags:#04x}")]
    UnknownBlockEncoding {
        /// The block's index.
        block: usize,
        /// The flags byte as read.
        flags: u8,
    },
    /// A block's bytes do not decode (deletions past its end, set padding bits, a label code
    /// outside its dictionary, trailing bytes).
    #[error("row map block {block}: {reason}")]
    CorruptBlock {
        /// The block's index.
        block: usize,
        /// What the decoder found, in words.
        reason: String,
    },

    // Lookups.
    /// A block index at or past the map's block count is asked for.
    #[error("row map: block {block} does not exist ({num_blocks} blocks)")]
    BlockOutOfRange {
        /// The block index asked for.
        block: usize,
        /// Blocks in the map.
        num_blocks: usize,
    },
    /// A source row at or past the map's total rows is looked up (or a sweep starts past the
    /// end).
    #[error("row map: row {row} is outside the {total_rows} source rows")]
    RowOutOfRange {
        /// The source row asked for, numbered over all sources in scan order.
        row: u64,
        /// Physical source rows of the map, deleted ones included.
        total_rows: u64,
    },
    /// An in-block position at or past the block's row count is translated (or a row of a
    /// sorted run falls outside the run's block).
    #[error("row map: position {pos} is outside block {block} of {len} rows")]
    PositionOutOfRange {
        /// The block's index.
        block: usize,
        /// The position asked for within the block (saturated to `u32::MAX`).
        pos: u32,
        /// Rows in the block, deleted ones included.
        len: u32,
    },
    /// A block's label has no base count: it is not below the destination count of the
    /// counts it is translated with (a block built in memory, or paired with the wrong map).
    #[error(
        "row map block {block}: label {label} has no base count ({num_destinations} destinations)"
    )]
    LabelWithoutBase {
        /// The block's index.
        block: usize,
        /// The label.
        label: u16,
        /// Destinations the base counts cover.
        num_destinations: usize,
    },
    /// Rows given for a sorted batch translation decrease somewhere.
    #[error("row map: rows must be sorted, but row {row} at index {index} follows {previous}")]
    UnsortedRows {
        /// Position in the batch of the first row smaller than its predecessor.
        index: usize,
        /// The row before it.
        previous: u64,
        /// The row at `index`, less than `previous`.
        row: u64,
    },
    /// A sorted batch needs a block the caller's block supplier does not have.
    #[error("row map: block {block} is needed but was not supplied")]
    MissingBlock {
        /// The block's index.
        block: usize,
    },
    /// A sweep is given a block other than the one it is at (blocks must come in order,
    /// each with its full row count).
    #[error(
        "row map sweep: expected block {expected_block} ({expected_len} rows), \
         got block {found_block} ({found_len} rows)"
    )]
    SweepOrder {
        /// The block the sweep is at.
        expected_block: usize,
        /// Rows that block has.
        expected_len: u32,
        /// The index of the block given.
        found_block: usize,
        /// Rows of the block given.
        found_len: u32,
    },
    /// A sweep is given a block after it already emitted every row.
    #[error("row map sweep: all {total_rows} rows were already emitted")]
    SweepFinished {
        /// Physical source rows of the map, all of them emitted.
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

    /// Destinations the map routes rows to (the length of every row of counts).
    pub fn num_destinations(&self) -> usize {
        self.num_destinations
    }

    /// Source rows per block; only the last block may have fewer.
    pub fn block_rows(&self) -> u32 {
        self.block_rows
    }

    /// Physical source rows, deleted ones included.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Blocks the source rows are split into: `total_rows` divided by `block_rows`, rounded
    /// up.
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

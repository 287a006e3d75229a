//! Translation arithmetic over decoded blocks: point lookup (rank), the sweep, and sorted
//! batches. No IO and no byte formats.

use std::ops::Range;

use super::{CountsMatrix, Result, RowMapError};

/// Where a live source row went: `(destination index, offset inside that destination)`.
pub type Placement = (u16, u32);

/// One decoded block of labels.
///
/// Deleted rows are a bitset over the block's rows; live rows keep only their labels, in
/// row order. The live index of row `pos` is `pos` minus the deleted rows before it (a
/// popcount), so no per-row NULL marker is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLabels {
    index: usize,
    len: u32,
    deleted: Vec<u64>,
    num_deleted: u32,
    live: Vec<u16>,
}

/// Words of a bitset over `len` rows.
pub(super) fn bitset_words(len: u32) -> usize {
    (len as usize).div_ceil(64)
}

impl BlockLabels {
    /// Builds block `index` from one entry per row (`None` = deleted). Labels are checked
    /// against the destination count when the block is translated.
    pub fn from_labels(index: usize, labels: &[Option<u16>]) -> Result<Self> {
        let len = u32::try_from(labels.len()).map_err(|_| RowMapError::TooLarge {
            what: "rows in one block",
        })?;
        let mut deleted = vec![0u64; bitset_words(len)];
        let mut live = Vec::with_capacity(labels.len());
        for (pos, label) in labels.iter().enumerate() {
            match label {
                Some(l) => live.push(*l),
                None => deleted[pos / 64] |= 1 << (pos % 64),
            }
        }
        let num_deleted = len - live.len() as u32;
        Ok(Self::from_parts(index, len, deleted, num_deleted, live))
    }

    /// The caller guarantees `deleted` has `bitset_words(len)` words, no bit past `len`,
    /// `num_deleted` bits set, and `live.len() == len - num_deleted`.
    pub(super) fn from_parts(
        index: usize,
        len: u32,
        deleted: Vec<u64>,
        num_deleted: u32,
        live: Vec<u16>,
    ) -> Self {
        debug_assert_eq!(deleted.len(), bitset_words(len));
        debug_assert_eq!(live.len() as u64 + u64::from(num_deleted), u64::from(len));
        Self {
            index,
            len,
            deleted,
            num_deleted,
            live,
        }
    }

    /// Which block of the row map this is.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Rows in the block, deleted ones included.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the block has no row at all (deleted or live).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows of the block that were deleted before the rewrite; they carry no label.
    pub fn num_deleted(&self) -> u32 {
        self.num_deleted
    }

    /// Labels of the live rows, in row order.
    pub fn live(&self) -> &[u16] {
        &self.live
    }

    /// The deletion bitset, bit `pos % 64` of word `pos / 64`.
    pub fn deleted_words(&self) -> &[u64] {
        &self.deleted
    }

    /// Whether row `pos` was deleted; rows past the end count as deleted.
    pub fn is_deleted(&self, pos: u32) -> bool {
        pos >= self.len || (self.deleted[pos as usize / 64] >> (pos % 64)) & 1 == 1
    }

    /// Deleted rows among `range` (which must lie inside the block).
    fn deleted_in(&self, range: Range<u32>) -> u32 {
        if self.num_deleted == 0 || range.is_empty() {
            return 0;
        }
        let (start, end) = (range.start as usize, range.end as usize);
        let (first, last) = (start / 64, (end - 1) / 64);
        let head_mask = u64::MAX << (start % 64);
        let tail_mask = u64::MAX >> (63 - (end - 1) % 64);
        if first == last {
            return (self.deleted[first] & head_mask & tail_mask).count_ones();
        }
        let middle: u32 = self.deleted[first + 1..last]
            .iter()
            .map(|w| w.count_ones())
            .sum();
        (self.deleted[first] & head_mask).count_ones()
            + middle
            + (self.deleted[last] & tail_mask).count_ones()
    }

    /// Index into [`live`](Self::live) of row `pos` (or of the first live row after it).
    pub fn live_index(&self, pos: u32) -> usize {
        let pos = pos.min(self.len);
        (pos - self.deleted_in(0..pos)) as usize
    }

    /// The label of row `pos`, `None` if deleted or past the end.
    pub fn label(&self, pos: u32) -> Option<u16> {
        if self.is_deleted(pos) {
            None
        } else {
            Some(self.live[self.live_index(pos)])
        }
    }

    /// Every row's label in order (`None` = deleted).
    pub fn labels(&self) -> impl Iterator<Item = Option<u16>> + '_ {
        let mut live = self.live.iter();
        (0..self.len).map(move |pos| {
            if self.is_deleted(pos) {
                None
            } else {
                live.next().copied()
            }
        })
    }

    /// Live rows before live index `live_index` whose label is `label`.
    pub fn rank(&self, live_index: usize, label: u16) -> u32 {
        count_equal(&self.live[..live_index.min(self.live.len())], label)
    }

    /// Point translation of row `pos` given the block's base counts (`counts.base(block)`):
    /// `None` for a deleted row.
    pub fn translate(&self, pos: u32, base: &[u32]) -> Result<Option<Placement>> {
        if pos >= self.len {
            return Err(RowMapError::PositionOutOfRange {
                block: self.index,
                pos,
                len: self.len,
            });
        }
        if self.is_deleted(pos) {
            return Ok(None);
        }
        let i = self.live_index(pos);
        let label = self.live[i];
        let offset = self.place(label, base, self.rank(i, label))?;
        Ok(Some((label, offset)))
    }

    /// `base[label] + in_block`, checked: a label outside the base or an offset past u32
    /// means the block and counts do not belong together.
    fn place(&self, label: u16, base: &[u32], in_block: u32) -> Result<u32> {
        let base = base
            .get(label as usize)
            .ok_or(RowMapError::LabelWithoutBase {
                block: self.index,
                label,
                num_destinations: base.len(),
            })?;
        base.checked_add(in_block).ok_or(RowMapError::TooLarge {
            what: "destination offset",
        })
    }
}

/// Point translation of row `pos` of `block` (see [`BlockLabels::translate`]).
pub fn translate_in_block(
    block: &BlockLabels,
    pos: u32,
    base: &[u32],
) -> Result<Option<Placement>> {
    block.translate(pos, base)
}

/// Number of `values` equal to `needle`.
///
/// Written so it vectorizes even for the baseline x86-64 target (SSE2): a u16 reduction
/// of the 0/1 compare results, i.e. one compare and one add per eight labels.
/// `.filter().count()` widens every match to a usize and runs several times slower; a
/// hand-laned accumulator array gets vectorized across lanes instead (strided gathers).
/// Chunks stay below 2^16 values so the u16 sum cannot overflow.
pub(super) fn count_equal(values: &[u16], needle: u16) -> u32 {
    values
        .chunks(u16::MAX as usize)
        .map(|chunk| {
            let n = chunk
                .iter()
                .fold(0u16, |n, &v| n.wrapping_add(u16::from(v == needle)));
            u32::from(n)
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// Sweep

/// One counter per possible u16 label, so indexing by a label never needs a bounds check
/// on the hot path (labels outside `num_destinations` are rejected when blocks decode).
const COUNTER_SLOTS: usize = 1 << 16;

fn new_counters() -> Box<[u32; COUNTER_SLOTS]> {
    vec![0u32; COUNTER_SLOTS]
        .into_boxed_slice()
        .try_into()
        .expect("length is COUNTER_SLOTS")
}

/// Translates consecutive rows in O(1) each: `offset = counter[label]++`.
///
/// Seeded at any block boundary with that block's base counts, it then consumes decoded
/// blocks in order. A start in the middle of a block first counts the skipped prefix of
/// that block (no output), so the first emitted offset is already right.
#[derive(Debug, Clone)]
pub struct SweepTranslator {
    counters: Box<[u32; COUNTER_SLOTS]>,
    num_destinations: usize,
    block_rows: u32,
    total_rows: u64,
    /// Block the cursor is in.
    block: usize,
    /// Rows of `block` already reflected in `counters`.
    pos: u32,
    /// Live rows of `block` already reflected in `counters`.
    live_pos: usize,
    /// First row of `block` to emit (> 0 only for a mid-block start).
    start: u32,
    /// Whether `block`'s labels were checked against `num_destinations`.
    verified: bool,
}

impl SweepTranslator {
    /// A sweep whose first emitted row is `start_row` (`== total_rows` gives an empty
    /// sweep).
    pub fn new(counts: &CountsMatrix, start_row: u64) -> Result<Self> {
        let total_rows = counts.total_rows();
        if start_row > total_rows {
            return Err(RowMapError::RowOutOfRange {
                row: start_row,
                total_rows,
            });
        }
        let block_rows = counts.block_rows();
        let block = (start_row / u64::from(block_rows)) as usize;
        let mut counters = new_counters();
        let m = counts.num_destinations();
        counters[..m].copy_from_slice(counts.base(block.min(counts.num_blocks())));
        Ok(Self {
            counters,
            num_destinations: m,
            block_rows,
            total_rows,
            block,
            pos: 0,
            live_pos: 0,
            start: (start_row % u64::from(block_rows)) as u32,
            verified: false,
        })
    }

    /// A sweep starting at the first row of `block`.
    pub fn at_block(counts: &CountsMatrix, block: usize) -> Result<Self> {
        if block > counts.num_blocks() {
            return Err(RowMapError::BlockOutOfRange {
                block,
                num_blocks: counts.num_blocks(),
            });
        }
        Self::new(
            counts,
            (block as u64 * u64::from(counts.block_rows())).min(counts.total_rows()),
        )
    }

    fn block_len(&self, block: usize) -> u32 {
        let start = block as u64 * u64::from(self.block_rows);
        (self.total_rows - start).min(u64::from(self.block_rows)) as u32
    }

    /// Global row number of the next row the sweep will emit.
    pub fn next_row(&self) -> u64 {
        self.block as u64 * u64::from(self.block_rows) + u64::from(self.pos.max(self.start))
    }

    /// The block the next call must be given, `None` once every row was emitted.
    pub fn next_block(&self) -> Option<usize> {
        if self.next_row() >= self.total_rows {
            None
        } else if self.pos == self.block_len(self.block) {
            Some(self.block + 1)
        } else {
            Some(self.block)
        }
    }

    /// Current per-destination counters: the offset the next row of each destination
    /// gets. After a mid-block start they lag until the first block is given, which is
    /// when the skipped prefix is counted.
    pub fn counters(&self) -> &[u32] {
        &self.counters[..self.num_destinations]
    }

    /// Moves to the next block when the current one is done, checks that `block` is the
    /// one the sweep is at, and counts a skipped prefix if the sweep started mid-block.
    fn enter(&mut self, block: &BlockLabels) -> Result<()> {
        let Some(expected) = self.next_block() else {
            return Err(RowMapError::SweepFinished {
                total_rows: self.total_rows,
            });
        };
        if expected != self.block {
            self.block = expected;
            self.pos = 0;
            self.live_pos = 0;
            self.start = 0;
            self.verified = false;
        }
        if block.index() != self.block || block.len() != self.block_len(self.block) {
            return Err(RowMapError::SweepOrder {
                expected_block: self.block,
                expected_len: self.block_len(self.block),
                found_block: block.index(),
                found_len: block.len(),
            });
        }
        if !self.verified {
            // Decoded blocks are already checked; this guards blocks built in memory, for
            // which a bad label would otherwise come out as a plausible placement. One
            // vectorized pass per block (a fold: `Iterator::max` does not vectorize and
            // costs ~40 µs a block), small next to the sweep itself.
            let m = self.num_destinations;
            let max = block.live().iter().fold(0u16, |a, &l| a.max(l));
            if !block.live().is_empty() && max as usize >= m {
                let label = block.live().iter().copied().find(|&l| l as usize >= m);
                return Err(RowMapError::LabelWithoutBase {
                    block: self.block,
                    label: label.unwrap_or_default(),
                    num_destinations: m,
                });
            }
            self.verified = true;
        }
        if self.pos < self.start {
            let live_start = block.live_index(self.start);
            for &label in &block.live()[self.live_pos..live_start] {
                let c = &mut self.counters[label as usize];
                *c = c.wrapping_add(1);
            }
            self.pos = self.start;
            self.live_pos = live_start;
        }
        Ok(())
    }

    /// Translates the next rows of `block` into `out` (`None` = deleted), stopping at the
    /// end of `out` or of the block; returns how many were written. Blocks must be given
    /// in order, each until it is exhausted.
    pub fn fill(&mut self, block: &BlockLabels, out: &mut [Option<Placement>]) -> Result<usize> {
        self.enter(block)?;
        let n = out.len().min((block.len() - self.pos) as usize);
        let out = &mut out[..n];
        self.live_pos = sweep_rows(&mut self.counters, block, self.pos, self.live_pos, out);
        self.pos += n as u32;
        Ok(n)
    }

    /// The remaining rows of `block` one at a time (`Some(None)` = a deleted row).
    pub fn rows<'s>(&'s mut self, block: &'s BlockLabels) -> Result<SweepRows<'s>> {
        self.enter(block)?;
        Ok(SweepRows { sweep: self, block })
    }
}

/// Iterator over the rest of one block of a sweep; see [`SweepTranslator::rows`].
#[derive(Debug)]
pub struct SweepRows<'s> {
    sweep: &'s mut SweepTranslator,
    block: &'s BlockLabels,
}

impl Iterator for SweepRows<'_> {
    type Item = Option<Placement>;

    fn next(&mut self) -> Option<Option<Placement>> {
        let s = &mut *self.sweep;
        if s.pos >= self.block.len() {
            return None;
        }
        let deleted = self.block.is_deleted(s.pos);
        s.pos += 1;
        if deleted {
            return Some(None);
        }
        let label = self.block.live()[s.live_pos];
        s.live_pos += 1;
        let c = &mut s.counters[label as usize];
        let offset = *c;
        *c = offset.wrapping_add(1);
        Some(Some((label, offset)))
    }
}

/// The bulk sweep: translates rows `pos..pos + out.len()` of `block`, whose first live
/// row is `live[live_pos]`; returns the live position after them.
fn sweep_rows(
    counters: &mut [u32; COUNTER_SLOTS],
    block: &BlockLabels,
    pos: u32,
    live_pos: usize,
    out: &mut [Option<Placement>],
) -> usize {
    let live = block.live();
    if block.num_deleted() == 0 {
        for (slot, &label) in out.iter_mut().zip(&live[live_pos..]) {
            let c = &mut counters[label as usize];
            *slot = Some((label, *c));
            *c = c.wrapping_add(1);
        }
        return live_pos + out.len();
    }
    let Some(last) = live.len().checked_sub(1) else {
        out.fill(None);
        return live_pos;
    };
    // Branch-free over deletions: with deletions scattered at random, a branch per row
    // would mispredict about once every eight rows and halve the throughput. A deleted
    // row still reads a (clamped) label but adds zero to its counter and to `j`.
    let deleted = block.deleted_words();
    let mut j = live_pos;
    for (k, slot) in out.iter_mut().enumerate() {
        let p = pos as usize + k;
        let keep = (!(deleted[p / 64] >> (p % 64))) & 1;
        let label = live[j.min(last)];
        let c = &mut counters[label as usize];
        let offset = *c;
        *c = offset.wrapping_add(keep as u32);
        j += keep as usize;
        *slot = if keep == 1 {
            Some((label, offset))
        } else {
            None
        };
    }
    j
}

// ---------------------------------------------------------------------------------------
// Sorted batches

/// A run of sorted row numbers that fall in one block: `rows[range]` of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRun {
    /// The block's index in the row map.
    pub block: usize,
    /// Positions in the batch (indexes into its `rows`) of the rows that fall in the block.
    pub range: Range<usize>,
}

/// Splits sorted (non-decreasing) row numbers into per-block runs, so an IO layer can
/// fetch exactly the blocks it needs (and release each after its run).
pub fn block_runs(counts: &CountsMatrix, rows: &[u64]) -> Result<Vec<BlockRun>> {
    let block_rows = u64::from(counts.block_rows());
    let mut runs: Vec<BlockRun> = Vec::new();
    for (i, &row) in rows.iter().enumerate() {
        if row >= counts.total_rows() {
            return Err(RowMapError::RowOutOfRange {
                row,
                total_rows: counts.total_rows(),
            });
        }
        if i > 0 && row < rows[i - 1] {
            return Err(RowMapError::UnsortedRows {
                index: i,
                previous: rows[i - 1],
                row,
            });
        }
        let block = (row / block_rows) as usize;
        match runs.last_mut() {
            Some(run) if run.block == block => run.range.end = i + 1,
            _ => runs.push(BlockRun {
                block,
                range: i..i + 1,
            }),
        }
    }
    Ok(runs)
}

/// How many times more a sweep step (a histogram update, ~0.2 ns) costs than one label
/// of a vectorized rank (~0.03 ns), as measured by the row-map bench.
const SWEEP_COST: u64 = 8;

/// Translates sorted rows that all lie in `block`, appending to `out`.
///
/// Each query can be ranked from the block start (vectorized, cost ~ its position) or
/// the run can be swept once, keeping a per-destination histogram up to the query
/// (cost ~ the last position, at a higher price per row). The cheaper one is picked per
/// run, so a dense run costs O(block) rather than O(queries × block) and a sparse one
/// does not pay for a sweep.
pub fn translate_run(
    counts: &CountsMatrix,
    block: &BlockLabels,
    rows: &[u64],
    out: &mut Vec<Option<Placement>>,
) -> Result<()> {
    let b = block.index();
    if b >= counts.num_blocks() || block.len() != counts.block_len(b) {
        return Err(RowMapError::BlockMismatch {
            block: b,
            what: "rows in block (decoded vs counts)",
            expected: u64::from(counts.block_len(b)),
            found: u64::from(block.len()),
        });
    }
    let first_row = b as u64 * u64::from(counts.block_rows());
    let mut rank_cost = 0u64;
    for (i, &row) in rows.iter().enumerate() {
        if i > 0 && row < rows[i - 1] {
            return Err(RowMapError::UnsortedRows {
                index: i,
                previous: rows[i - 1],
                row,
            });
        }
        if row < first_row || row - first_row >= u64::from(block.len()) {
            return Err(RowMapError::PositionOutOfRange {
                block: b,
                pos: row.saturating_sub(first_row).min(u64::from(u32::MAX)) as u32,
                len: block.len(),
            });
        }
        rank_cost += row - first_row;
    }
    let sweep_cost = rows.last().map_or(0, |&r| r - first_row) * SWEEP_COST;
    let mut hist = (rank_cost > sweep_cost).then(new_counters);

    let base = counts.base(b);
    let live = block.live();
    // Live labels before `cursor` are counted in `hist`.
    let mut cursor = 0usize;
    // Live index of each query, incrementally: only deletions between consecutive
    // queries need counting.
    let (mut last_pos, mut last_live) = (0u32, 0usize);
    out.reserve(rows.len());
    for &row in rows {
        let pos = (row - first_row) as u32;
        let li = last_live + (pos - last_pos - block.deleted_in(last_pos..pos)) as usize;
        (last_pos, last_live) = (pos, li);
        if block.is_deleted(pos) {
            out.push(None);
            continue;
        }
        let label = live[li];
        let in_block = match hist.as_mut() {
            Some(h) => {
                for &l in &live[cursor..li] {
                    h[l as usize] += 1;
                }
                cursor = li;
                h[label as usize]
            }
            None => count_equal(&live[..li], label),
        };
        out.push(Some((label, block.place(label, base, in_block)?)));
    }
    Ok(())
}

/// Translates sorted (non-decreasing) source rows. `blocks(b)` supplies decoded block `b`
/// for every block the rows touch (see [`block_runs`]); `None` is an error.
pub fn translate_sorted<'b>(
    counts: &CountsMatrix,
    rows: &[u64],
    blocks: impl Fn(usize) -> Option<&'b BlockLabels>,
) -> Result<Vec<Option<Placement>>> {
    let mut out = Vec::with_capacity(rows.len());
    for run in block_runs(counts, rows)? {
        let block = blocks(run.block).ok_or(RowMapError::MissingBlock { block: run.block })?;
        if block.index() != run.block {
            return Err(RowMapError::BlockMismatch {
                block: run.block,
                what: "index of the supplied block",
                expected: run.block as u64,
                found: block.index() as u64,
            });
        }
        translate_run(counts, block, &rows[run.range], &mut out)?;
    }
    Ok(out)
}

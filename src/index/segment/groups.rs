//! Cutting a segment file's data section into groups of bounded size, so a build that streams
//! can write the file in order while holding one group at a time (see
//! [`crate::index::build_stream`]). Pure arithmetic.
//!
//! The data section is, per partition in order, its addresses block (8 bytes per row) then
//! its payload block (`row_width` bytes per row) (layout in [`super`]). A [`Slice`] is a run of
//! rows of one block; [`plan_groups`] lists the slices in file order and cuts them into groups
//! of at most `group_bytes` bytes each.
//!
//! Invariants: concatenating every group's slices gives each partition's addresses block
//! then its payload block, each as contiguous row ranges from 0 to the partition's rows;
//! no slice is empty; every group holds at most `group_bytes` bytes, or one row when a row
//! alone is larger; every group but the last is full (its next row would not fit).

use std::ops::Range;

/// The two blocks of a partition, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// The rows' addresses, 8 bytes each.
    Addrs,
    /// The rows' payload (vectors or codes).
    Payload,
}

/// Rows `rows` (ranks within the partition, in row order) of one block of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// The partition's position in the segment (file order), from 0.
    pub partition: usize,
    /// Which of its blocks.
    pub block: Block,
    /// Which of its rows.
    pub rows: Range<u64>,
}

impl Slice {
    /// Bytes of this slice in the file.
    pub fn bytes(&self, row_width: usize) -> u64 {
        (self.rows.end - self.rows.start) * block_width(self.block, row_width)
    }
}

fn block_width(block: Block, row_width: usize) -> u64 {
    match block {
        Block::Addrs => 8,
        Block::Payload => row_width as u64,
    }
}

/// The data section of a segment with `rows_per_partition` rows per partition, in groups of
/// at most `group_bytes` bytes (see the module's invariants).
pub fn plan_groups(
    rows_per_partition: &[u64],
    row_width: usize,
    group_bytes: usize,
) -> Vec<Vec<Slice>> {
    let limit = group_bytes as u64;
    let mut groups = Vec::new();
    let mut group: Vec<Slice> = Vec::new();
    let mut used = 0u64;
    for (partition, &rows) in rows_per_partition.iter().enumerate() {
        for block in [Block::Addrs, Block::Payload] {
            let width = block_width(block, row_width);
            if width == 0 {
                continue;
            }
            let mut start = 0;
            while start < rows {
                let mut fit = (limit - used.min(limit)) / width;
                if fit == 0 {
                    if !group.is_empty() {
                        groups.push(std::mem::take(&mut group));
                        used = 0;
                        continue;
                    }
                    fit = 1;
                }
                let end = start + fit.min(rows - start);
                group.push(Slice {
                    partition,
                    block,
                    rows: start..end,
                });
                used += (end - start) * width;
                start = end;
            }
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious plan: one unit per row of each block in file order, packed greedily.
    fn reference(
        rows: &[u64],
        row_width: usize,
        group_bytes: usize,
    ) -> Vec<Vec<(usize, Block, u64)>> {
        let mut groups: Vec<Vec<(usize, Block, u64)>> = Vec::new();
        let mut used = 0u64;
        for (p, &n) in rows.iter().enumerate() {
            for block in [Block::Addrs, Block::Payload] {
                let w = block_width(block, row_width);
                if w == 0 {
                    continue;
                }
                for r in 0..n {
                    if groups.is_empty() || (used + w > group_bytes as u64 && used > 0) {
                        groups.push(Vec::new());
                        used = 0;
                    }
                    groups.last_mut().unwrap().push((p, block, r));
                    used += w;
                }
            }
        }
        groups
    }

    fn rows_of(groups: &[Vec<Slice>]) -> Vec<Vec<(usize, Block, u64)>> {
        groups
            .iter()
            .map(|g| {
                g.iter()
                    .flat_map(|s| s.rows.clone().map(move |r| (s.partition, s.block, r)))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_worked_example() {
        // Partition 0: 3 rows, partition 1: empty, partition 2: 1 row; 4-byte payloads.
        // Bytes in file order: addrs 0 (24), payload 0 (12), addrs 2 (8), payload 2 (4).
        let groups = plan_groups(&[3, 0, 1], 4, 20);
        let s = |partition, block, rows| Slice {
            partition,
            block,
            rows,
        };
        assert_eq!(
            groups,
            vec![
                vec![s(0, Block::Addrs, 0..2)],
                vec![s(0, Block::Addrs, 2..3), s(0, Block::Payload, 0..3)],
                vec![s(2, Block::Addrs, 0..1), s(2, Block::Payload, 0..1)],
            ]
        );
    }

    #[test]
    fn a_row_larger_than_a_group_gets_a_group_of_its_own() {
        // Addresses (8 bytes) fit one per group; payloads (100 bytes) do not fit at all.
        let groups = plan_groups(&[2], 100, 10);
        let rows: Vec<(Block, Range<u64>)> = groups
            .iter()
            .map(|g| {
                assert_eq!(g.len(), 1);
                (g[0].block, g[0].rows.clone())
            })
            .collect();
        assert_eq!(
            rows,
            [
                (Block::Addrs, 0..1),
                (Block::Addrs, 1..2),
                (Block::Payload, 0..1),
                (Block::Payload, 1..2)
            ]
        );
        assert!(plan_groups(&[0, 0], 4, 10).is_empty());
    }

    proptest! {
        /// The plan packs the file's rows exactly like the row-by-row reference, with
        /// non-empty slices within the byte limit. If it fails, a streamed segment misses,
        /// repeats or reorders rows, or a group exceeds the build's memory budget.
        #[test]
        fn prop_plan_matches_row_by_row_reference(
            rows in prop::collection::vec(prop_oneof![Just(0u64), 1u64..6, 20u64..40], 0..8),
            row_width in prop_oneof![Just(0usize), 1usize..5, Just(32), Just(200)],
            group_bytes in prop_oneof![Just(0usize), 1usize..64, 64usize..600],
        ) {
            let groups = plan_groups(&rows, row_width, group_bytes);
            prop_assert_eq!(rows_of(&groups), reference(&rows, row_width, group_bytes));
            for g in &groups {
                prop_assert!(!g.is_empty());
                prop_assert!(g.iter().all(|s| s.rows.start < s.rows.end));
                let bytes: u64 = g.iter().map(|s| s.bytes(row_width)).sum();
                let one_row = g.len() == 1 && g[0].rows.end - g[0].rows.start == 1;
                prop_assert!(bytes <= group_bytes as u64 || one_row, "{g:?}");
            }
        }
    }
}

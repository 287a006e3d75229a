//! How much of a Parquet file one read fetches at once: the arithmetic, no IO.
//!
//! Parquet's reader fetches every selected page of a row group's projected columns before it
//! decodes the first row of it. A fragment's row group holds up to 65,536 rows, so reading a
//! 768-float vector column whole fetched 200 MB in one go, outside any budget (an index build
//! under a 1 GB memory cap was killed there). A read whose row group is larger than
//! [`FETCH_BYTES`] is therefore cut into windows of rows, one row group's rows each, read one
//! after another: with the page index, each window fetches only the pages holding its rows.
//! Row groups below the limit are read as before, in one stream.

use std::ops::Range;

use datafusion::parquet::arrow::arrow_reader::RowSelection;

/// Most compressed bytes of a file's projected columns one read fetches at once (estimated
/// from the row group's average row, so a window of uneven pages can exceed it a little).
pub const FETCH_BYTES: u64 = 8 << 20;

/// A row group's size in the projected columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSize {
    /// Rows in the row group.
    pub rows: u64,
    /// Compressed bytes of the projected columns' chunks.
    pub bytes: u64,
}

/// Rows `rows` (numbered within the file) of row group `group`, read as one fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchWindow {
    /// Index of the row group in the file, from 0.
    pub group: usize,
    /// The window's rows, numbered from the file's first row; all inside `group`.
    pub rows: Range<u64>,
}

/// The windows to read a file of row groups `groups` in, each estimated at no more than
/// `limit` bytes (or one row, when a row is larger): `None` when every row group fits, so the
/// file is read in one stream. Windows are in file order, cover every row once, never cross a
/// row group, and hold a multiple of `batch_rows` rows when they hold more than that, so the
/// batches a window yields are whole.
pub fn fetch_windows(
    groups: &[GroupSize],
    limit: u64,
    batch_rows: usize,
) -> Option<Vec<FetchWindow>> {
    if groups.iter().all(|g| g.bytes <= limit) {
        return None;
    }
    let batch_rows = batch_rows.max(1) as u64;
    let mut windows = Vec::new();
    let mut start = 0u64;
    for (group, g) in groups.iter().enumerate() {
        let end = start + g.rows;
        let step = window_rows(*g, limit, batch_rows);
        let mut at = start;
        while at < end {
            let next = (at + step).min(end);
            windows.push(FetchWindow {
                group,
                rows: at..next,
            });
            at = next;
        }
        start = end;
    }
    Some(windows)
}

/// Rows of `g` one window holds: as many as fit `limit` at the group's average row size, at
/// least one, rounded down to whole batches when that is more than one batch.
fn window_rows(g: GroupSize, limit: u64, batch_rows: u64) -> u64 {
    if g.bytes <= limit || g.rows == 0 {
        return g.rows.max(1);
    }
    let per_row = g.bytes.div_ceil(g.rows);
    let rows = (limit / per_row).max(1);
    if rows >= batch_rows {
        rows / batch_rows * batch_rows
    } else {
        rows
    }
}

/// The selected rows of `selection` (over a whole file), as ascending disjoint ranges.
pub fn selected_ranges(selection: &RowSelection) -> Vec<Range<u64>> {
    let mut ranges = Vec::new();
    let mut at = 0u64;
    for s in selection.iter() {
        let next = at + s.row_count as u64;
        if !s.skip && next > at {
            ranges.push(at..next);
        }
        at = next;
    }
    ranges
}

/// The selection to read window `window` of the row group starting at file row `group_start`
/// with `group_rows` rows, as the reader wants it when told to read only that row group: the
/// rows of the window that `selected` (file rows; `None` = all) holds, over the group's rows.
/// `None` when the window holds no selected row, so it need not be read at all.
pub fn window_selection(
    selected: Option<&[Range<u64>]>,
    group_start: u64,
    group_rows: u64,
    window: &Range<u64>,
) -> Option<RowSelection> {
    let clipped: Vec<Range<usize>> = match selected {
        None => vec![window.clone()],
        Some(ranges) => ranges
            .iter()
            .map(|r| r.start.max(window.start)..r.end.min(window.end))
            .filter(|r| r.start < r.end)
            .collect(),
    }
    .into_iter()
    .map(|r| (r.start - group_start) as usize..(r.end - group_start) as usize)
    .collect();
    if clipped.is_empty() {
        return None;
    }
    Some(RowSelection::from_consecutive_ranges(
        clipped.into_iter(),
        group_rows as usize,
    ))
}

/// Most windows read at once.
pub const MAX_CONCURRENT_WINDOWS: usize = 8;

/// How many windows to read at once when each fetches about `selected_bytes` (its selected
/// rows at its row group's average row size): as many as keep all of them within `limit`
/// (from 1 to [`MAX_CONCURRENT_WINDOWS`]). A whole read goes one window at a time; the few
/// scattered rows a KNN re-rank asks for are fetched several windows at once, so their
/// round trips overlap (on an object store each costs tens of milliseconds).
pub fn concurrent_windows(selected_bytes: impl IntoIterator<Item = u64>, limit: u64) -> usize {
    let largest = selected_bytes.into_iter().max().unwrap_or(0).max(1);
    usize::try_from(limit / largest)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_CONCURRENT_WINDOWS)
}

/// Rows of `selection` (over a group's rows, as [`window_selection`] makes it) selected.
pub fn selected_rows(selection: &RowSelection) -> u64 {
    selection
        .iter()
        .filter(|s| !s.skip)
        .map(|s| s.row_count as u64)
        .sum()
}

/// The batch size to read `selection` (over row groups of `group_rows` rows, in file
/// order; `None` = every row) with: `batch_size`, or fewer when no row group gives that many
/// selected rows. Parquet's decoder reserves a whole batch per column before each read and
/// the array it returns keeps that capacity, and a batch never spans row groups: a re-rank
/// of 1,000 rows over 16 row groups held 16 arrays sized for 1,000 rows of 768 floats.
pub fn batch_rows(
    batch_size: usize,
    selection: Option<&RowSelection>,
    group_rows: impl IntoIterator<Item = u64>,
) -> usize {
    let Some(selection) = selection else {
        return batch_size.max(1);
    };
    let ranges = selected_ranges(selection);
    let mut next = ranges.iter().peekable();
    let (mut most, mut start) = (0u64, 0u64);
    for rows in group_rows {
        let end = start + rows;
        let mut in_group = 0;
        // Ranges are ascending and disjoint; one may run on into the next row groups.
        while let Some(r) = next.peek() {
            if r.start >= end {
                break;
            }
            in_group += r.end.min(end) - r.start.max(start);
            if r.end > end {
                break;
            }
            next.next();
        }
        most = most.max(in_group);
        start = end;
    }
    usize::try_from(most)
        .unwrap_or(usize::MAX)
        .min(batch_size)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn groups() -> impl Strategy<Value = Vec<GroupSize>> {
        prop::collection::vec(
            (0u64..5_000, 0u64..40).prop_map(|(rows, per_row)| GroupSize {
                rows,
                bytes: rows * per_row,
            }),
            0..6,
        )
    }

    #[test]
    fn a_file_of_small_row_groups_is_one_read() {
        let g = [
            GroupSize {
                rows: 100,
                bytes: 100,
            },
            GroupSize {
                rows: 5,
                bytes: 1000,
            },
        ];
        assert_eq!(fetch_windows(&g, 1000, 10), None);
        assert!(fetch_windows(&g, 999, 10).is_some());
    }

    #[test]
    fn a_large_row_group_is_cut_in_whole_batches() {
        // 65,536 rows of 3,072 bytes (a 768-float vector) under 8 MiB: 2,730 rows fit,
        // rounded down to 2 batches of 1,024.
        let g = [GroupSize {
            rows: 65_536,
            bytes: 65_536 * 3072,
        }];
        let w = fetch_windows(&g, 8 << 20, 1024).unwrap();
        assert_eq!(w[0].rows, 0..2048);
        assert_eq!(w.len(), 32);
        assert_eq!(w.last().unwrap().rows.end, 65_536);
    }

    #[test]
    fn whole_windows_are_read_one_at_a_time_and_scattered_rows_together() {
        let limit = 8 << 20;
        assert_eq!(concurrent_windows([limit, limit / 3], limit), 1);
        assert_eq!(concurrent_windows([limit / 3, 10], limit), 3);
        assert_eq!(
            concurrent_windows([3072, 6144], limit),
            MAX_CONCURRENT_WINDOWS
        );
        assert_eq!(concurrent_windows([], limit), MAX_CONCURRENT_WINDOWS);
        let s = RowSelection::from_consecutive_ranges([2..5, 9..10].into_iter(), 20);
        assert_eq!(selected_rows(&s), 4);
    }

    proptest! {
        #[test]
        fn windows_cover_every_row_once_within_the_limit(
            g in groups(), limit in 1u64..20_000, batch in 1usize..3_000,
        ) {
            let Some(w) = fetch_windows(&g, limit, batch) else {
                prop_assert!(g.iter().all(|g| g.bytes <= limit));
                return Ok(());
            };
            // In order, contiguous from 0 to the file's end, each within one group.
            let mut at = 0u64;
            let mut starts = vec![0u64];
            for x in &g {
                starts.push(starts.last().unwrap() + x.rows);
            }
            for x in &w {
                prop_assert_eq!(x.rows.start, at);
                prop_assert!(x.rows.end > x.rows.start);
                prop_assert!(x.rows.start >= starts[x.group] && x.rows.end <= starts[x.group + 1]);
                let size = g[x.group];
                let rows = x.rows.end - x.rows.start;
                let per_row = size.bytes.div_ceil(size.rows.max(1));
                if size.bytes <= limit {
                    prop_assert_eq!(rows, size.rows);
                } else {
                    prop_assert!(rows == 1 || rows * per_row <= limit,
                        "window {:?} of {} rows at {} bytes a row over {}", x, rows, per_row, limit);
                }
                at = x.rows.end;
            }
            prop_assert_eq!(at, *starts.last().unwrap());
        }

        #[test]
        fn a_batch_is_no_larger_than_the_most_rows_one_row_group_gives(
            sizes in prop::collection::vec(0u64..300, 0..5),
            picks in prop::collection::vec(any::<bool>(), 0..1200),
            batch_size in 0usize..400,
        ) {
            let total: u64 = sizes.iter().sum();
            let selection = RowSelection::from_consecutive_ranges(
                (0..total)
                    .filter(|&r| picks.get(r as usize).copied().unwrap_or(false))
                    .map(|r| r as usize..r as usize + 1),
                total as usize,
            );
            let mut start = 0;
            let most = sizes.iter().map(|&rows| {
                let n = (start..start + rows)
                    .filter(|&r| picks.get(r as usize).copied().unwrap_or(false))
                    .count();
                start += rows;
                n
            }).max().unwrap_or(0);
            prop_assert_eq!(
                batch_rows(batch_size, Some(&selection), sizes.iter().copied()),
                most.min(batch_size).max(1)
            );
            prop_assert_eq!(batch_rows(batch_size, None, sizes.iter().copied()), batch_size.max(1));
        }

        #[test]
        fn window_selections_read_exactly_the_selected_rows(
            sizes in prop::collection::vec(1u64..300, 1..4),
            picks in prop::collection::vec(any::<bool>(), 0..1200),
            limit in 1u64..400,
        ) {
            let groups: Vec<GroupSize> =
                sizes.iter().map(|&rows| GroupSize { rows, bytes: rows * 3 }).collect();
            let total: u64 = sizes.iter().sum();
            let wanted: Vec<u64> = (0..total)
                .filter(|&r| picks.get(r as usize).copied().unwrap_or(false))
                .collect();
            let selection = RowSelection::from_consecutive_ranges(
                wanted.iter().map(|&r| r as usize..r as usize + 1),
                total as usize,
            );
            let selected = selected_ranges(&selection);
            let naive: Vec<u64> = selected.iter().flat_map(|r| r.clone()).collect();
            prop_assert_eq!(&naive, &wanted);
            let windows = fetch_windows(&groups, limit, 7).unwrap_or_else(|| {
                let mut at = 0;
                groups.iter().enumerate().map(|(group, g)| {
                    at += g.rows;
                    FetchWindow { group, rows: at - g.rows..at }
                }).collect()
            });
            let mut read = Vec::new();
            for w in &windows {
                let start: u64 = sizes[..w.group].iter().sum();
                let rows = sizes[w.group];
                let Some(sel) = window_selection(Some(&selected), start, rows, &w.rows) else {
                    prop_assert!(wanted.iter().all(|r| !w.rows.contains(r)));
                    continue;
                };
                prop_assert_eq!(sel.iter().map(|s| s.row_count as u64).sum::<u64>(), rows);
                read.extend(selected_ranges(&sel).into_iter().flatten().map(|r| r + start));
            }
            prop_assert_eq!(read, wanted);
        }
    }
}

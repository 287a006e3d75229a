//! How well a table is clustered by a key: `recluster_information`'s arithmetic.
//!
//! Each fragment's key range is `[min, max]` over its live rows (keys compared in the row
//! format Arrow's `RowConverter` produces, so any sortable key type works). Two fragments
//! *overlap* when their ranges intersect; the *depth* at a key value is the number of ranges
//! containing it. A perfectly clustered table has 0 average overlaps and depth 1.
//!
//! [`overlaps_and_depth`] is pure (O(n log n) in fragments); [`clustering_info`] reads the
//! live rows of every fragment with the key's columns and evaluates the key through
//! [`RowColumns`].

use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use futures::StreamExt;

use super::recluster::RowColumns;
use super::{Result, RewriteError, live_rows};
use crate::format::Snapshot;

/// The figures `recluster_information` reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusteringInfo {
    /// Fragments with at least one live row.
    pub fragments: u64,
    /// Live rows.
    pub rows: u64,
    /// Other fragments whose key range overlaps a fragment's, on average.
    pub average_overlaps: f64,
    /// Average overlaps + 1.
    pub average_depth: f64,
    /// Most fragments covering one key value.
    pub max_depth: u64,
}

/// Ordered pairs of distinct ranges that intersect, and the largest number of ranges
/// containing one point. Ranges are closed: `[lo, hi]` with `lo <= hi`.
pub fn overlaps_and_depth<K: Ord>(ranges: &[(K, K)]) -> (u64, u64) {
    let n = ranges.len() as u64;
    // A pair does not intersect exactly when one range ends before the other starts.
    let mut his: Vec<&K> = ranges.iter().map(|r| &r.1).collect();
    his.sort();
    let disjoint: u64 = ranges
        .iter()
        .map(|(lo, _)| his.partition_point(|hi| *hi < lo) as u64)
        .sum();
    let overlaps = n * n.saturating_sub(1) - 2 * disjoint;
    // Depth: sweep the endpoints, opening before closing at equal keys.
    let mut events: Vec<(&K, i32)> = Vec::with_capacity(2 * ranges.len());
    for (lo, hi) in ranges {
        events.push((lo, 0));
        events.push((hi, 1));
    }
    events.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
    let (mut depth, mut max_depth) = (0i64, 0i64);
    for (_, kind) in events {
        depth += if kind == 0 { 1 } else { -1 };
        max_depth = max_depth.max(depth);
    }
    (overlaps, max_depth as u64)
}

/// Reads every fragment's live rows, evaluates the key and reports how well the table is
/// clustered by it.
pub async fn clustering_info(snapshot: &Snapshot, key: &dyn RowColumns) -> Result<ClusteringInfo> {
    let mut ranges: Vec<(OwnedRow, OwnedRow)> = Vec::new();
    let mut converter: Option<RowConverter> = None;
    let mut rows = 0;
    for f in &snapshot.manifest.fragments {
        let deleted = snapshot.dir.shared_deletions(f).await?;
        let mut stream = live_rows(snapshot, f, deleted, key.input_schema());
        let mut range: Option<(OwnedRow, OwnedRow)> = None;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            rows += batch.num_rows() as u64;
            let cols = key
                .evaluate(&batch)
                .map_err(|source| RewriteError::KeyEvaluation { source })?;
            let conv = match &mut converter {
                Some(c) => c,
                None => converter.insert(RowConverter::new(
                    cols.iter()
                        .map(|c| SortField::new(c.data_type().clone()))
                        .collect(),
                )?),
            };
            let keyed = conv.convert_columns(&cols)?;
            for r in keyed.iter() {
                match &mut range {
                    None => range = Some((r.owned(), r.owned())),
                    Some((lo, hi)) => {
                        if r < lo.row() {
                            *lo = r.owned();
                        }
                        if r > hi.row() {
                            *hi = r.owned();
                        }
                    }
                }
            }
        }
        ranges.extend(range);
    }
    let n = ranges.len();
    let (overlaps, max_depth) = overlaps_and_depth(&ranges);
    let average_overlaps = if n == 0 {
        0.0
    } else {
        overlaps as f64 / n as f64
    };
    Ok(ClusteringInfo {
        fragments: n as u64,
        rows,
        average_overlaps,
        average_depth: if n == 0 { 0.0 } else { average_overlaps + 1.0 },
        max_depth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious quadratic count and a point-by-point depth.
    fn reference(ranges: &[(u8, u8)]) -> (u64, u64) {
        let mut overlaps = 0;
        for (i, a) in ranges.iter().enumerate() {
            for (j, b) in ranges.iter().enumerate() {
                if i != j && a.0 <= b.1 && b.0 <= a.1 {
                    overlaps += 1;
                }
            }
        }
        let depth = (0..=u8::MAX)
            .map(|x| ranges.iter().filter(|r| r.0 <= x && x <= r.1).count() as u64)
            .max()
            .unwrap_or(0);
        (overlaps, depth)
    }

    #[test]
    fn clustered_and_stacked_ranges() {
        assert_eq!(overlaps_and_depth(&[(0, 1), (2, 3), (4, 5)]), (0, 1));
        assert_eq!(overlaps_and_depth(&[(0, 9), (0, 9), (0, 9)]), (6, 3));
        // Touching ranges share a key value: they overlap.
        assert_eq!(overlaps_and_depth(&[(0, 2), (2, 4)]), (2, 2));
        assert_eq!(overlaps_and_depth::<u8>(&[]), (0, 0));
    }

    proptest! {
        /// If this failed, `recluster_information` would misreport how well a table is
        /// clustered (and users would recluster needlessly, or not when they should).
        #[test]
        fn prop_overlaps_and_depth_match_the_reference(
            raw in proptest::collection::vec((any::<u8>(), any::<u8>()), 0..40)
        ) {
            let ranges: Vec<(u8, u8)> = raw.iter().map(|&(a, b)| (a.min(b), a.max(b))).collect();
            prop_assert_eq!(overlaps_and_depth(&ranges), reference(&ranges));
        }
    }
}

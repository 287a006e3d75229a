//! How a query's leaves are split into tasks: pure functions of one snapshot (no IO).
//!
//! * A scan is split into contiguous runs of fragments in manifest order, balanced by live
//!   rows ([`fragment_runs`]). Each task reads its run in logical order; the tasks' outputs
//!   are merged in no particular order.
//! * A KNN search is split into [`KnnShare`]s ([`knn_shares`]): every segment of the index
//!   goes to exactly one share and every fragment of the snapshot to exactly one share (its
//!   rows that no segment owns are scored there), which is what makes the merged answer the
//!   single-machine one (see [`crate::index::knn::share`]). Segments and the fragments no
//!   segment's bitmap names (likely unowned: appended since the index was built) are weighed
//!   by rows and dealt to the least loaded share, largest first; the other fragments (whose
//!   rows a segment most likely owns) are dealt round-robin.
//! * When whole segments cannot be dealt evenly (fewer segments than tasks, as after
//!   `OPTIMIZE INDEX ... MERGE`, or one much larger than the rest), an IVF_FLAT or IVF_SQ
//!   search is split into slices instead: share `i` of `n` searches partitions `p % n == i`
//!   of every segment (see [`crate::index::knn::share`]). The same partitions go to the same
//!   share from one query to the next, so each worker caches its own share of the index.
//!   IVF_PQ segments are not sliced: their re-rank depth is per segment, so a slice would
//!   re-rank other candidates than the single machine.
//!
//! Task counts are wishes: the planner caps them by the number of workers.

use std::collections::BTreeSet;
use std::ops::Range;

use crate::format::Manifest;
use crate::format::index_meta::{IndexDef, IndexKind};
use crate::index::knn::{KnnShare, Slice};

/// Whole segments are dealt to tasks unless the most loaded task would carry more than this
/// many times its even share of the rows; then the index is sliced by partitions.
const MAX_IMBALANCE: f64 = 1.25;

/// Tasks a sliced search asks for at most (the planner caps them by the workers).
const MAX_SLICES: usize = 64;

/// Tasks a scan of `manifest` can use: one per fragment.
pub fn scan_task_count(manifest: &Manifest) -> usize {
    manifest.fragments.len().max(1)
}

/// The fragments (ids) of each of `tasks` tasks: contiguous runs in manifest order, balanced
/// by live rows (some runs may be empty when there are fewer fragments than tasks).
pub fn fragment_runs(manifest: &Manifest, tasks: usize) -> Vec<BTreeSet<u64>> {
    // +1: empty fragments still spread, and an all-empty table splits by count.
    let weights: Vec<u64> = manifest
        .fragments
        .iter()
        .map(|f| f.live_rows() + 1)
        .collect();
    balanced_runs(&weights, tasks)
        .into_iter()
        .map(|run| manifest.fragments[run].iter().map(|f| f.id).collect())
        .collect()
}

/// Tasks a KNN search can use: one per segment and per likely-unowned fragment (with an
/// index; as many as there are partitions, up to `MAX_SLICES`, when the index can be
/// sliced), or one per fragment (exact search).
pub fn knn_task_count(manifest: &Manifest, index: Option<&IndexDef>) -> usize {
    let units = match index {
        Some(def) => {
            let index = def.name.as_str();
            let named = named_fragments(manifest, index);
            let whole = manifest.segments_of(index).count()
                + manifest
                    .fragments
                    .iter()
                    .filter(|f| !named.contains(&f.id))
                    .count();
            if sliceable(def) {
                whole.max((def.num_partitions as usize).min(MAX_SLICES))
            } else {
                whole
            }
        }
        None => manifest.fragments.len(),
    };
    units.max(1)
}

/// Whether searches of `index` may be sliced by partitions (see the module docs).
fn sliceable(index: &IndexDef) -> bool {
    !matches!(index.kind, IndexKind::IvfPq { .. })
}

/// `tasks` shares of a KNN search over `manifest` with `index` (`None`: exact search): whole
/// segments and fragments when they deal evenly, else slices (see the module docs).
pub fn knn_shares(manifest: &Manifest, index: Option<&IndexDef>, tasks: usize) -> Vec<KnnShare> {
    let tasks = tasks.max(1);
    let whole = whole_shares(manifest, index.map(|i| i.name.as_str()), tasks);
    let Some(index) = index.filter(|i| tasks > 1 && sliceable(i)) else {
        return whole;
    };
    let segment_rows: Vec<u64> = manifest.segments_of(&index.name).map(|s| s.rows).collect();
    let total: u64 = segment_rows.iter().sum();
    let heaviest = least_loaded(&segment_rows, tasks)
        .iter()
        .zip(&segment_rows)
        .fold(vec![0u64; tasks], |mut load, (t, rows)| {
            load[*t] += rows;
            load
        })
        .into_iter()
        .max()
        .unwrap_or(0);
    if total == 0 || (heaviest as f64) <= MAX_IMBALANCE * total as f64 / tasks as f64 {
        return whole;
    }
    let segments: BTreeSet<u64> = manifest.segments_of(&index.name).map(|s| s.id).collect();
    let fragments: BTreeSet<u64> = manifest.fragments.iter().map(|f| f.id).collect();
    (0..tasks)
        .map(|i| KnnShare {
            segments: segments.clone(),
            fragments: fragments.clone(),
            slice: Slice::new(i as u32, tasks as u32),
        })
        .collect()
}

/// `tasks` shares dealing whole segments and fragments.
fn whole_shares(manifest: &Manifest, index: Option<&str>, tasks: usize) -> Vec<KnnShare> {
    let mut shares = vec![KnnShare::default(); tasks];
    let named = index.map_or_else(BTreeSet::new, |i| named_fragments(manifest, i));
    // Weighed units: segments, then fragments no segment names.
    let mut units: Vec<(Unit, u64)> = Vec::new();
    if let Some(index) = index {
        units.extend(
            manifest
                .segments_of(index)
                .map(|s| (Unit::Segment(s.id), s.rows)),
        );
    }
    units.extend(
        manifest
            .fragments
            .iter()
            .filter(|f| !named.contains(&f.id))
            .map(|f| (Unit::Fragment(f.id), f.physical_rows)),
    );
    let weights: Vec<u64> = units.iter().map(|(_, w)| *w).collect();
    for ((unit, _), task) in units.iter().zip(least_loaded(&weights, tasks)) {
        match unit {
            Unit::Segment(id) => shares[task].segments.insert(*id),
            Unit::Fragment(id) => shares[task].fragments.insert(*id),
        };
    }
    for (i, f) in manifest
        .fragments
        .iter()
        .filter(|f| named.contains(&f.id))
        .enumerate()
    {
        shares[i % tasks].fragments.insert(f.id);
    }
    shares
}

#[derive(Clone, Copy, Debug)]
enum Unit {
    Segment(u64),
    Fragment(u64),
}

/// Fragments some segment of `index` names as owned (bitmap minus invalidated).
fn named_fragments(manifest: &Manifest, index: &str) -> BTreeSet<u64> {
    manifest
        .segments_of(index)
        .flat_map(|s| s.ownership())
        .collect()
}

/// `tasks` contiguous runs covering `0..weights.len()` in order; run `i` starts at the first
/// item whose preceding weight reaches `i / tasks` of the total, so no run exceeds
/// `total / tasks` by more than one item's weight.
pub fn balanced_runs(weights: &[u64], tasks: usize) -> Vec<Range<usize>> {
    let tasks = tasks.max(1);
    let total: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    let mut starts = Vec::with_capacity(tasks + 1);
    let mut prefix: u128 = 0;
    let mut item = 0;
    for i in 0..tasks {
        let target = total * i as u128 / tasks as u128;
        while item < weights.len() && prefix < target {
            prefix += u128::from(weights[item]);
            item += 1;
        }
        starts.push(item);
    }
    starts.push(weights.len());
    starts.windows(2).map(|w| w[0]..w[1]).collect()
}

/// The task (of `tasks`) each item goes to: largest first, to the least loaded task (lowest
/// index on ties), so the most loaded task carries at most `total / tasks` plus one item.
pub fn least_loaded(weights: &[u64], tasks: usize) -> Vec<usize> {
    let tasks = tasks.max(1);
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|i| (std::cmp::Reverse(weights[*i]), *i));
    let mut load = vec![0u128; tasks];
    let mut out = vec![0; weights.len()];
    for i in order {
        let task = (0..tasks)
            .min_by_key(|t| (load[*t], *t))
            .expect("at least one task");
        load[task] += u128::from(weights[i]);
        out[i] = task;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Runs are contiguous, cover every item once in order, and none exceeds its share
        /// of the total by more than one item. If this fails, a split scan reads a fragment
        /// twice, never, or leaves one task with most of the work.
        #[test]
        fn prop_balanced_runs_cover_in_order(
            weights in prop::collection::vec(0..1000u64, 0..40),
            tasks in 1..9usize,
        ) {
            let runs = balanced_runs(&weights, tasks);
            prop_assert_eq!(runs.len(), tasks);
            let mut next = 0;
            for run in &runs {
                prop_assert_eq!(run.start, next);
                prop_assert!(run.end >= run.start);
                next = run.end;
            }
            prop_assert_eq!(next, weights.len());
            let total: u64 = weights.iter().sum();
            let biggest = weights.iter().copied().max().unwrap_or(0);
            for run in runs {
                let w: u64 = weights[run].iter().sum();
                prop_assert!(w <= total.div_ceil(tasks as u64) + biggest);
            }
        }

        /// Every item goes to one task in range, and the most loaded task carries at most
        /// its share of the total plus one item (the greedy bound).
        #[test]
        fn prop_least_loaded_is_balanced(
            weights in prop::collection::vec(0..1000u64, 0..40),
            tasks in 1..9usize,
        ) {
            let assigned = least_loaded(&weights, tasks);
            prop_assert_eq!(assigned.len(), weights.len());
            let mut load = vec![0u64; tasks];
            for (w, t) in weights.iter().zip(&assigned) {
                prop_assert!(*t < tasks);
                load[*t] += w;
            }
            let total: u64 = weights.iter().sum();
            let biggest = weights.iter().copied().max().unwrap_or(0);
            prop_assert!(load.iter().all(|l| *l <= total.div_ceil(tasks as u64) + biggest));
        }
    }

    /// A manifest with fragments of `sizes` rows (ids 0..) and one segment of index "i" per
    /// entry of `segments`, naming those fragments.
    fn manifest(sizes: &[u64], segments: &[BTreeSet<u64>]) -> Manifest {
        use crate::format::index_meta::IndexSegment;
        use crate::format::manifest::TableProperties;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let mut m = Manifest::new_table(&schema, TableProperties::default(), "t".into())
            .expect("a manifest");
        m.fragments = sizes
            .iter()
            .enumerate()
            .map(|(id, n)| crate::format::Fragment {
                id: id as u64,
                files: vec![],
                physical_rows: *n,
                deletion: None,
                row_ids: None,
            })
            .collect();
        m.index_segments = segments
            .iter()
            .enumerate()
            .map(|(id, named)| IndexSegment {
                id: id as u64 + 10,
                index: "i".into(),
                file: format!("s{id}"),
                size_bytes: 0,
                rows: named.iter().map(|f| sizes[*f as usize]).sum(),
                built_at_version: 1,
                fragment_bitmap: named.clone(),
                invalidated_fragments: BTreeSet::new(),
            })
            .collect();
        m
    }

    /// Index "i" of `kind` with 16 partitions.
    fn def(kind: IndexKind) -> IndexDef {
        IndexDef {
            name: "i".into(),
            column: "v".into(),
            kind,
            metric: crate::index::distance::Metric::L2,
            num_partitions: 16,
            model_file: String::new(),
            model_size_bytes: 0,
            created_at_version: 1,
        }
    }

    proptest! {
        /// Either each segment and each fragment is in exactly one share, or (a sliced split,
        /// only for an index that can be sliced) every share names all of them under its own
        /// slice: what makes the merged answer the single-machine one, with and without an
        /// index.
        #[test]
        fn prop_knn_shares_partition_segments_and_fragments(
            owner in prop::collection::vec(prop::option::of(0..4usize), 0..20),
            tasks in 1..6usize,
            kind in 0..3usize,
        ) {
            let sizes: Vec<u64> = (0..owner.len() as u64).map(|i| 1 + i * 7 % 13).collect();
            let mut segments = vec![BTreeSet::new(); 4];
            for (f, o) in owner.iter().enumerate() {
                if let Some(s) = o {
                    segments[*s].insert(f as u64);
                }
            }
            let m = manifest(&sizes, &segments);
            let def = match kind {
                0 => None,
                1 => Some(def(IndexKind::IvfFlat)),
                _ => Some(def(IndexKind::IvfPq { num_sub_vectors: 4 })),
            };
            let shares = knn_shares(&m, def.as_ref(), tasks);
            prop_assert_eq!(shares.len(), tasks);
            if shares[0].slice.is_some() {
                prop_assert_eq!(kind, 1);
                let slices: BTreeSet<u32> =
                    shares.iter().map(|s| s.slice.map(|s| s.index).unwrap_or(u32::MAX)).collect();
                prop_assert_eq!(slices, (0..tasks as u32).collect::<BTreeSet<_>>());
                for s in &shares {
                    prop_assert_eq!(s.slice.map(|s| s.of), Some(tasks as u32));
                    prop_assert_eq!(s.segments.len(), m.index_segments.len());
                    prop_assert_eq!(s.fragments.len(), m.fragments.len());
                }
            } else {
                for f in &m.fragments {
                    prop_assert_eq!(shares.iter().filter(|s| s.fragments.contains(&f.id)).count(), 1);
                }
                for seg in &m.index_segments {
                    let holders = shares.iter().filter(|s| s.segments.contains(&seg.id)).count();
                    prop_assert_eq!(holders, usize::from(kind != 0));
                }
            }
            prop_assert!(knn_task_count(&m, def.as_ref()) >= 1);
        }
    }

    #[test]
    fn knn_shares_deal_segments_and_unnamed_fragments_by_rows() {
        // Fragments 0-2 (10 rows each) are in segment 10, fragment 3 (25 rows) in segment 11,
        // fragment 4 (8 rows) is new. Two tasks: segment 10 (30 rows) alone, the rest
        // (25 + 8) together; named fragments go round-robin.
        let named = [[0, 1, 2].into_iter().collect(), [3].into_iter().collect()];
        let m = manifest(&[10, 10, 10, 25, 8], &named);
        let flat = def(IndexKind::IvfFlat);
        let shares = knn_shares(&m, Some(&flat), 2);
        assert_eq!(shares[0].segments, [10].into());
        assert_eq!(shares[1].segments, [11].into());
        assert_eq!(shares[0].fragments, [0, 2].into());
        assert_eq!(shares[1].fragments, [1, 3, 4].into());
        let pq = def(IndexKind::IvfPq { num_sub_vectors: 4 });
        assert_eq!(knn_task_count(&m, Some(&pq)), 3);
        // A sliceable index asks for a task per partition.
        assert_eq!(knn_task_count(&m, Some(&flat)), 16);
        assert_eq!(knn_task_count(&m, None), 5);
    }

    #[test]
    fn one_segment_is_sliced_unless_its_index_is_pq() {
        // One segment of 30 rows: two whole shares would leave one idle.
        let m = manifest(&[10, 10, 10, 5], &[[0, 1, 2].into_iter().collect()]);
        let shares = knn_shares(&m, Some(&def(IndexKind::IvfSq)), 2);
        assert_eq!(shares[0].slice, Slice::new(0, 2));
        assert_eq!(shares[1].slice, Slice::new(1, 2));
        assert_eq!(shares[1].segments, [10].into());
        assert_eq!(shares[1].fragments, [0, 1, 2, 3].into());
        let pq = def(IndexKind::IvfPq { num_sub_vectors: 4 });
        let shares = knn_shares(&m, Some(&pq), 2);
        assert!(shares.iter().all(|s| s.slice.is_none()));
        assert_eq!(
            shares.iter().filter(|s| s.segments.contains(&10)).count(),
            1
        );
        // One task: never sliced.
        assert!(
            knn_shares(&m, Some(&def(IndexKind::IvfFlat)), 1)[0]
                .slice
                .is_none()
        );
    }

    #[test]
    fn balanced_runs_worked_example() {
        // 10 rows in 5 items over 2 tasks: the cut falls where 5 rows precede it.
        assert_eq!(balanced_runs(&[3, 1, 1, 4, 1], 2), vec![0..3, 3..5]);
        assert_eq!(balanced_runs(&[5], 3), vec![0..1, 1..1, 1..1]);
        assert_eq!(balanced_runs(&[], 2), vec![0..0, 0..0]);
    }
}

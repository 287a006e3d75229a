//! Tests of the compaction planner: worked examples and properties against a naive
//! reference.

use super::*;
use proptest::prelude::*;

// ----- helpers ---------------------------------------------------------

fn frag(id: u64, physical_rows: u64, deleted_rows: u64, coverage: u64) -> FragmentStats {
    FragmentStats {
        id,
        physical_rows,
        deleted_rows,
        coverage,
    }
}

/// Fragments with the given live row counts, no deletions, one coverage.
/// Ids are deliberately not positions.
fn sized(rows: &[u64]) -> Vec<FragmentStats> {
    rows.iter()
        .enumerate()
        .map(|(i, &r)| frag(100 + 10 * i as u64, r, 0, 0))
        .collect()
}

fn with_target(target: u64) -> CompactionOptions {
    CompactionOptions {
        target_rows_per_fragment: target,
        ..CompactionOptions::default()
    }
}

fn ids(fragments: &[FragmentStats]) -> Vec<u64> {
    fragments.iter().map(|f| f.id).collect()
}

fn live(fragments: &[FragmentStats]) -> Vec<u64> {
    fragments.iter().map(|f| f.live_rows()).collect()
}

/// A fragment in the simulation: its live rows as (original fragment,
/// offset) tokens, plus a count of deleted rows.
#[derive(Debug, Clone)]
struct SimFragment {
    stats: FragmentStats,
    rows: Vec<(u64, u64)>,
}

fn simulate(fragments: &[FragmentStats]) -> Vec<SimFragment> {
    fragments
        .iter()
        .map(|f| SimFragment {
            stats: *f,
            // The first `deleted_rows` offsets are the deleted ones.
            rows: (f.deleted_rows..f.physical_rows)
                .map(|o| (f.id, o))
                .collect(),
        })
        .collect()
}

fn sim_stats(fragments: &[SimFragment]) -> Vec<FragmentStats> {
    fragments.iter().map(|f| f.stats).collect()
}

fn sim_rows(fragments: &[SimFragment]) -> Vec<(u64, u64)> {
    fragments
        .iter()
        .flat_map(|f| f.rows.iter().copied())
        .collect()
}

/// Applies a plan the way the engine does: each bin's sources are
/// replaced in place by its outputs (fresh ids, deletions materialized).
/// Checks that the plan refers to the fragments it claims to.
fn apply(fragments: &[SimFragment], plan: &CompactionPlan, next_id: &mut u64) -> Vec<SimFragment> {
    let mut out = Vec::new();
    let mut position = 0;
    for bin in &plan.bins {
        assert!(
            bin.first_position >= position,
            "bins overlap or are out of order"
        );
        out.extend_from_slice(&fragments[position..bin.first_position]);
        let end = bin.first_position + bin.fragments.len();
        let sources = &fragments[bin.first_position..end];
        assert_eq!(
            sources.iter().map(|f| f.stats.id).collect::<Vec<_>>(),
            bin.fragments,
            "bin does not name the fragments at its position"
        );
        let rows: Vec<(u64, u64)> = sim_rows(sources);
        let coverage = sources[0].stats.coverage;
        let mut offset = 0usize;
        for &n in &bin.output_rows {
            let n = n as usize;
            out.push(SimFragment {
                stats: frag(*next_id, n as u64, 0, coverage),
                rows: rows[offset..offset + n].to_vec(),
            });
            *next_id += 1;
            offset += n;
        }
        assert_eq!(
            offset,
            rows.len(),
            "outputs do not hold exactly the live rows"
        );
        position = end;
    }
    out.extend_from_slice(&fragments[position..]);
    out
}

/// Stats-only application of a plan.
fn apply_stats(
    fragments: &[FragmentStats],
    plan: &CompactionPlan,
    next_id: &mut u64,
) -> Vec<FragmentStats> {
    let mut out = Vec::new();
    let mut position = 0;
    for bin in &plan.bins {
        out.extend_from_slice(&fragments[position..bin.first_position]);
        let end = bin.first_position + bin.fragments.len();
        assert_eq!(ids(&fragments[bin.first_position..end]), bin.fragments);
        let coverage = fragments[bin.first_position].coverage;
        for &n in &bin.output_rows {
            out.push(frag(*next_id, n, 0, coverage));
            *next_id += 1;
        }
        position = end;
    }
    out.extend_from_slice(&fragments[position..]);
    out
}

/// Plans and applies until the plan is empty; returns the final fragments
/// and the number of non-empty plans.
fn converge(
    mut fragments: Vec<FragmentStats>,
    options: &CompactionOptions,
    max_plans: usize,
) -> (Vec<FragmentStats>, usize) {
    let mut next_id = 1_000_000;
    for plans in 0..=max_plans {
        let plan = plan_compaction(&fragments, options).unwrap();
        if plan.is_empty() {
            return (fragments, plans);
        }
        fragments = apply_stats(&fragments, &plan, &mut next_id);
    }
    panic!("no convergence within {max_plans} plans");
}

// ----- naive reference -------------------------------------------------

fn ref_heavy(f: &FragmentStats, o: &CompactionOptions) -> bool {
    o.deletion_threshold < 1.0
        && f.physical_rows > 0
        && (f.deleted_rows as f64 / f.physical_rows as f64) > o.deletion_threshold
}

fn ref_target(o: &CompactionOptions) -> u128 {
    u128::from(o.target_rows_per_fragment.min(o.max_rows_per_fragment))
}

fn ref_candidate(f: &FragmentStats, o: &CompactionOptions) -> bool {
    ref_heavy(f, o) || u128::from(f.physical_rows - f.deleted_rows) < ref_target(o)
}

fn ref_outputs(live: u128, o: &CompactionOptions) -> u128 {
    if live == 0 {
        return 0;
    }
    let t = ref_target(o);
    let m = u128::from(o.max_rows_per_fragment);
    let mut n = std::cmp::max(1, live / t);
    if n * m < live {
        n = live.div_ceil(m);
    }
    n
}

fn ref_progress(group: &[usize], fragments: &[FragmentStats], o: &CompactionOptions) -> bool {
    let live: u128 = group
        .iter()
        .map(|&i| u128::from(fragments[i].live_rows()))
        .sum();
    group.iter().any(|&i| ref_heavy(&fragments[i], o)) || ref_outputs(live, o) < group.len() as u128
}

/// Every progress-making bin, as position lists, without budgets: the
/// rules of the module docs written as plainly as possible.
fn reference_bins(fragments: &[FragmentStats], o: &CompactionOptions) -> Vec<Vec<usize>> {
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for (i, f) in fragments.iter().enumerate() {
        if !ref_candidate(f, o) {
            continue;
        }
        let extends = runs.last().is_some_and(|run| {
            let last = *run.last().unwrap();
            last + 1 == i && fragments[last].coverage == f.coverage
        });
        if extends {
            runs.last_mut().unwrap().push(i);
        } else {
            runs.push(vec![i]);
        }
    }
    let mut bins = Vec::new();
    for run in runs {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        for i in run {
            current.push(i);
            let sum: u128 = current
                .iter()
                .map(|&j| u128::from(fragments[j].live_rows()))
                .sum();
            if sum >= ref_target(o) {
                groups.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            match groups.last_mut() {
                Some(last) => last.extend(current),
                None => groups.push(current),
            }
        }
        bins.extend(groups.into_iter().filter(|g| ref_progress(g, fragments, o)));
    }
    bins
}

/// The budgeted selection of the module docs over `reference_bins`:
/// whole bins oldest first, then the longest fitting prefix of the next
/// bin if it makes progress, or the first bin's smallest useful prefix if
/// nothing else was taken.
fn reference_budgeted(fragments: &[FragmentStats], o: &CompactionOptions) -> Vec<Vec<usize>> {
    let mut fragments_left = o.max_source_fragments.unwrap_or(usize::MAX) as u128;
    let mut rows_left = o.max_source_rows.map_or(u128::MAX, u128::from);
    let rows_of = |bin: &[usize]| -> u128 {
        bin.iter()
            .map(|&i| u128::from(fragments[i].live_rows()))
            .sum()
    };
    let mut out: Vec<Vec<usize>> = Vec::new();
    for bin in reference_bins(fragments, o) {
        if bin.len() as u128 <= fragments_left && rows_of(&bin) <= rows_left {
            fragments_left -= bin.len() as u128;
            rows_left -= rows_of(&bin);
            out.push(bin);
            continue;
        }
        let fitting = (0..=bin.len())
            .filter(|&p| p as u128 <= fragments_left && rows_of(&bin[..p]) <= rows_left)
            .max()
            .unwrap();
        if ref_progress(&bin[..fitting], fragments, o) {
            out.push(bin[..fitting].to_vec());
        } else if out.is_empty() {
            let smallest = (1..=bin.len())
                .find(|&p| ref_progress(&bin[..p], fragments, o))
                .unwrap();
            out.push(bin[..smallest].to_vec());
        }
        break;
    }
    out
}

fn eligible_work_exists(fragments: &[FragmentStats], o: &CompactionOptions) -> bool {
    !reference_bins(fragments, o).is_empty()
}

/// Convergence potential: every candidate counts 1, a deletion-heavy one
/// additionally `max(1, ceil(live / max_rows))`. Every planned bin lowers
/// it by at least one.
fn potential(fragments: &[FragmentStats], o: &CompactionOptions) -> u64 {
    fragments
        .iter()
        .filter(|f| ref_candidate(f, o))
        .map(|f| {
            if ref_heavy(f, o) {
                1 + f.live_rows().div_ceil(o.max_rows_per_fragment).max(1)
            } else {
                1
            }
        })
        .sum()
}

/// Structural checks that hold for every plan.
fn check_well_formed(fragments: &[FragmentStats], o: &CompactionOptions, plan: &CompactionPlan) {
    let mut next_free = 0;
    for bin in &plan.bins {
        assert!(!bin.fragments.is_empty(), "empty bin");
        assert!(
            bin.first_position >= next_free,
            "bins overlap or are out of order"
        );
        let end = bin.first_position + bin.fragments.len();
        let sources = &fragments[bin.first_position..end];
        assert_eq!(ids(sources), bin.fragments, "bin is not adjacent/in order");
        assert!(
            sources.iter().all(|f| f.coverage == sources[0].coverage),
            "bin straddles coverage"
        );
        assert!(
            sources.iter().all(|f| ref_candidate(f, o)),
            "bin holds a non-candidate"
        );
        let live: u64 = sources.iter().map(|f| f.live_rows()).sum();
        assert_eq!(bin.live_rows, live);
        assert_eq!(bin.output_rows.iter().sum::<u64>(), live);
        assert_eq!(
            bin.output_rows.len() as u128,
            ref_outputs(u128::from(live), o)
        );
        assert!(bin.output_rows.iter().all(|&n| n > 0), "zero-row output");
        assert!(
            bin.output_rows
                .iter()
                .all(|&n| n <= o.max_rows_per_fragment),
            "output above max rows"
        );
        if let (Some(min), Some(max)) = (bin.output_rows.iter().min(), bin.output_rows.iter().max())
        {
            assert!(
                max - min <= 1,
                "outputs not split evenly: {:?}",
                bin.output_rows
            );
        }
        let positions: Vec<usize> = (bin.first_position..end).collect();
        assert!(
            ref_progress(&positions, fragments, o),
            "bin makes no progress"
        );
        next_free = end;
    }
}

// ----- scenarios -------------------------------------------------------

#[test]
fn ten_small_fragments_budget_three_takes_the_first_three() {
    let fragments = sized(&[100; 10]);
    let options = CompactionOptions {
        max_source_fragments: Some(3),
        ..CompactionOptions::default()
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(
        plan.bins,
        vec![CompactionBin {
            first_position: 0,
            fragments: ids(&fragments[..3]),
            live_rows: 300,
            output_rows: vec![300],
        }]
    );
}

/// Seed 001: tasks [4, 6] with max 4 must not yield an empty plan.
#[test]
fn ten_quarter_target_fragments_budget_four_removes_the_four_oldest() {
    let fragments = sized(&[262_144; 10]);
    let options = CompactionOptions {
        max_source_fragments: Some(4),
        ..CompactionOptions::default()
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.num_source_fragments(), 4);
    assert_eq!(
        plan.bins,
        vec![CompactionBin {
            first_position: 0,
            fragments: ids(&fragments[..4]),
            live_rows: 1 << 20,
            output_rows: vec![1 << 20],
        }]
    );
    let (rest, plans) = converge(fragments, &options, 10);
    assert_eq!(live(&rest), vec![1 << 20, 1 << 20, 524_288]);
    assert_eq!(plans, 3);
}

/// Seed 001: a "suffix cut" stranded this pair forever.
#[test]
fn small_pair_before_healthy_tail_is_compacted_and_converges() {
    let fragments = sized(&[100, 100, 1000, 1000]);
    let options = CompactionOptions {
        max_source_fragments: Some(2),
        ..with_target(250)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.bins.len(), 1);
    assert_eq!(plan.bins[0].first_position, 0);
    assert_eq!(plan.bins[0].fragments, ids(&fragments[..2]));
    assert_eq!(plan.bins[0].output_rows, vec![200]);
    let (rest, plans) = converge(fragments, &options, 10);
    assert_eq!(live(&rest), vec![200, 1000, 1000]);
    assert_eq!(plans, 1);
}

/// Lance #8506 wrote [500, 100, 500, 100, 500, 300] here.
#[test]
fn no_small_leftovers_from_a_long_run() {
    let fragments = sized(&[200; 10]);
    let options = with_target(500);
    let plan = plan_compaction(&fragments, &options).unwrap();
    let outputs: Vec<u64> = plan
        .bins
        .iter()
        .flat_map(|b| b.output_rows.clone())
        .collect();
    assert_eq!(outputs, vec![600, 600, 800]);
    assert_eq!(plan.num_source_fragments(), 10);
    let mut next_id = 1_000;
    let after = apply_stats(&fragments, &plan, &mut next_id);
    assert!(after.iter().all(|f| f.live_rows() >= 500));
    assert!(plan_compaction(&after, &options).unwrap().is_empty());
}

#[test]
fn a_run_below_target_becomes_one_small_fragment() {
    let fragments = sized(&[100, 100, 100]);
    let plan = plan_compaction(&fragments, &with_target(500)).unwrap();
    assert_eq!(plan.bins.len(), 1);
    assert_eq!(plan.bins[0].output_rows, vec![300]);
}

#[test]
fn large_bins_split_evenly_within_max_rows() {
    // A target above the table limit is capped by it.
    let fragments = sized(&[90, 90, 90, 90]);
    let options = CompactionOptions {
        target_rows_per_fragment: 1_000,
        max_rows_per_fragment: 100,
        ..CompactionOptions::default()
    };
    // Effective target 100: [90, 90] reaches it twice and writes [90, 90]
    // again, which is no progress; nothing else is possible.
    assert!(plan_compaction(&fragments, &options).unwrap().is_empty());

    let fragments = sized(&[60, 30, 60, 30, 25]);
    let plan = plan_compaction(&fragments, &options).unwrap();
    let outputs: Vec<Vec<u64>> = plan.bins.iter().map(|b| b.output_rows.clone()).collect();
    // [60, 30, 60] reaches 150 ≥ 100 → ceil(150/100) = 2 outputs < 3;
    // the remainder [30, 25] is folded in → 205 rows, 3 outputs < 5.
    assert_eq!(outputs, vec![vec![69, 68, 68]]);
}

#[test]
fn single_small_fragment_is_left_alone() {
    let fragments = sized(&[100, 5_000, 100]);
    assert!(
        plan_compaction(&fragments, &with_target(1_000))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn coverage_boundary_splits_runs() {
    let fragments = vec![
        frag(1, 100, 0, 7),
        frag(2, 100, 0, 7),
        frag(3, 100, 0, 8),
        frag(4, 100, 0, 8),
        frag(5, 100, 0, 7),
    ];
    let options = with_target(1_000);
    let plan = plan_compaction(&fragments, &options).unwrap();
    check_well_formed(&fragments, &options, &plan);
    let bins: Vec<Vec<u64>> = plan.bins.iter().map(|b| b.fragments.clone()).collect();
    // Fragment 5 has coverage 7 like 1 and 2 but is not adjacent to them.
    assert_eq!(bins, vec![vec![1, 2], vec![3, 4]]);
}

#[test]
fn deletion_heavy_fragment_compacts_alone() {
    let fragments = vec![
        frag(1, 5_000, 0, 0),
        frag(2, 5_000, 1_000, 0),
        frag(3, 5_000, 0, 0),
    ];
    let options = with_target(1_000);
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(
        plan.bins,
        vec![CompactionBin {
            first_position: 1,
            fragments: vec![2],
            live_rows: 4_000,
            output_rows: vec![1_000; 4],
        }]
    );
    // At or below the threshold is not deletion-heavy.
    let light = vec![frag(1, 5_000, 500, 0)];
    assert!(plan_compaction(&light, &options).unwrap().is_empty());
}

#[test]
fn threshold_at_or_above_one_disables_materialization() {
    let fragments = vec![frag(1, 5_000, 4_999, 0), frag(2, 5_000, 4_000, 0)];
    for threshold in [1.0, 1.5, f64::INFINITY] {
        let options = CompactionOptions {
            deletion_threshold: threshold,
            ..with_target(100)
        };
        assert!(plan_compaction(&fragments, &options).unwrap().is_empty());
    }
    let options = CompactionOptions {
        deletion_threshold: 0.5,
        ..with_target(100)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.num_source_fragments(), 2);
    assert_eq!(plan.bins[0].live_rows, 1_001);
}

#[test]
fn fully_deleted_fragments_disappear() {
    let options = CompactionOptions {
        deletion_threshold: 1.0,
        ..with_target(100)
    };
    let fragments = vec![
        frag(1, 500, 0, 0),
        frag(2, 50, 50, 0),
        frag(3, 0, 0, 0),
        frag(4, 500, 0, 0),
    ];
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(
        plan.bins,
        vec![CompactionBin {
            first_position: 1,
            fragments: vec![2, 3],
            live_rows: 0,
            output_rows: vec![],
        }]
    );
}

#[test]
fn oversized_deletion_heavy_fragment_is_split_to_max_rows() {
    let fragments = vec![frag(1, 10_000, 2_000, 0)];
    let options = CompactionOptions {
        target_rows_per_fragment: 3_000,
        max_rows_per_fragment: 3_000,
        ..CompactionOptions::default()
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.bins[0].output_rows, vec![2_667, 2_667, 2_666]);
}

#[test]
fn budget_truncates_a_later_bin_when_it_still_makes_progress() {
    let fragments = sized(&[200; 10]);
    let options = CompactionOptions {
        max_source_fragments: Some(5),
        ..with_target(500)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    let bins: Vec<(usize, Vec<u64>)> = plan
        .bins
        .iter()
        .map(|b| (b.fragments.len(), b.output_rows.clone()))
        .collect();
    assert_eq!(bins, vec![(3, vec![600]), (2, vec![400])]);

    let options = CompactionOptions {
        max_source_fragments: Some(4),
        ..with_target(500)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(
        plan.num_source_fragments(),
        3,
        "a one-fragment remainder is no progress"
    );

    let (rest, _) = converge(fragments, &options, 40);
    assert!(rest.iter().all(|f| f.live_rows() >= 500));
    assert_eq!(rest.iter().map(|f| f.live_rows()).sum::<u64>(), 2_000);
}

#[test]
fn row_budget_below_the_smallest_useful_prefix_still_makes_progress() {
    let fragments = sized(&[200; 10]);
    let options = CompactionOptions {
        max_source_rows: Some(300),
        ..with_target(500)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.bins.len(), 1);
    assert_eq!(plan.bins[0].fragments, ids(&fragments[..2]));
    assert_eq!(plan.bins[0].output_rows, vec![400]);

    // A zero row budget still lets a deletion-heavy fragment go alone.
    let fragments = vec![frag(1, 1_000, 500, 0), frag(2, 100, 0, 0)];
    let options = CompactionOptions {
        max_source_rows: Some(0),
        ..with_target(500)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.bins.len(), 1);
    assert_eq!(plan.bins[0].fragments, vec![1]);
}

#[test]
fn fragment_budget_of_one() {
    let options = CompactionOptions {
        max_source_fragments: Some(1),
        ..with_target(500)
    };
    // Two small fragments: the smallest useful prefix is both of them.
    let plan = plan_compaction(&sized(&[100, 100, 100]), &options).unwrap();
    assert_eq!(plan.num_source_fragments(), 2);
    // A deletion-heavy fragment fits on its own.
    let fragments = vec![frag(1, 100, 50, 0), frag(2, 100, 0, 0)];
    let plan = plan_compaction(&fragments, &options).unwrap();
    assert_eq!(plan.bins[0].fragments, vec![1]);
    assert_eq!(plan.bins[0].output_rows, vec![50]);
}

#[test]
fn budget_reaches_past_a_gap_of_healthy_fragments() {
    let fragments = sized(&[100, 100, 5_000, 100, 100, 100]);
    let options = CompactionOptions {
        max_source_fragments: Some(4),
        ..with_target(1_000)
    };
    let plan = plan_compaction(&fragments, &options).unwrap();
    let bins: Vec<(usize, usize)> = plan
        .bins
        .iter()
        .map(|b| (b.first_position, b.fragments.len()))
        .collect();
    assert_eq!(bins, vec![(0, 2), (3, 2)]);
}

#[test]
fn default_target_equal_to_max_rows_leaves_unpackable_pairs() {
    let fragments = sized(&[600_000, 600_000]);
    assert!(
        plan_compaction(&fragments, &CompactionOptions::default())
            .unwrap()
            .is_empty()
    );
    // Three of them pack into two.
    let fragments = sized(&[600_000, 600_000, 600_000]);
    let plan = plan_compaction(&fragments, &CompactionOptions::default()).unwrap();
    assert_eq!(plan.bins[0].output_rows, vec![900_000, 900_000]);
}

#[test]
fn invalid_options_are_rejected() {
    let fragments = sized(&[1]);
    let cases = [
        (
            CompactionOptions {
                target_rows_per_fragment: 0,
                ..CompactionOptions::default()
            },
            PlanError::ZeroTargetRows,
        ),
        (
            CompactionOptions {
                max_rows_per_fragment: 0,
                ..CompactionOptions::default()
            },
            PlanError::ZeroMaxRows,
        ),
        (
            CompactionOptions {
                deletion_threshold: -0.5,
                ..CompactionOptions::default()
            },
            PlanError::InvalidDeletionThreshold { threshold: -0.5 },
        ),
        (
            CompactionOptions {
                max_source_fragments: Some(0),
                ..CompactionOptions::default()
            },
            PlanError::ZeroSourceFragmentBudget,
        ),
    ];
    for (options, expected) in cases {
        assert_eq!(plan_compaction(&fragments, &options), Err(expected));
        assert!(!expected.to_string().is_empty());
    }
    let nan = CompactionOptions {
        deletion_threshold: f64::NAN,
        ..CompactionOptions::default()
    };
    assert!(matches!(
        plan_compaction(&fragments, &nan),
        Err(PlanError::InvalidDeletionThreshold { threshold }) if threshold.is_nan()
    ));
    assert!(CompactionOptions::default().validate().is_ok());
}

#[test]
fn invalid_fragments_are_rejected() {
    let options = CompactionOptions::default();
    assert_eq!(
        plan_compaction(&[frag(1, 10, 11, 0)], &options),
        Err(PlanError::DeletedExceedsPhysical {
            id: 1,
            physical_rows: 10,
            deleted_rows: 11
        })
    );
    assert_eq!(
        plan_compaction(
            &[frag(1, 10, 0, 0), frag(2, 10, 0, 0), frag(1, 10, 0, 0)],
            &options
        ),
        Err(PlanError::DuplicateFragmentId { id: 1 })
    );
    let huge = vec![
        frag(1, u64::MAX, u64::MAX / 2, 0),
        frag(2, u64::MAX, u64::MAX / 2, 0),
    ];
    let options = CompactionOptions {
        target_rows_per_fragment: u64::MAX,
        max_rows_per_fragment: u64::MAX,
        ..CompactionOptions::default()
    };
    assert_eq!(
        plan_compaction(&huge, &options),
        Err(PlanError::RowCountOverflow { first_position: 0 })
    );
}

#[test]
fn empty_table_plans_nothing() {
    assert!(
        plan_compaction(&[], &CompactionOptions::default())
            .unwrap()
            .is_empty()
    );
}

// ----- properties ------------------------------------------------------

/// Random fragments with unique ids, `0..=max_rows` physical rows, some
/// deletions and a few coverage keys (mostly one, so runs form).
fn fragments_strategy(max_len: usize, max_rows: u64) -> impl Strategy<Value = Vec<FragmentStats>> {
    let fragment = (
        prop_oneof![2 => 0..=max_rows / 8, 3 => 0..=max_rows],
        prop_oneof![4 => Just(0u64), 2 => 0u64..=100, 1 => Just(100u64)],
        prop_oneof![3 => Just(0u64), 1 => 0u64..3],
    );
    proptest::collection::vec(fragment, 0..=max_len).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (physical, pct, coverage))| {
                frag(7 + 3 * i as u64, physical, physical * pct / 100, coverage)
            })
            .collect()
    })
}

/// Random options scaled to fragments of up to `scale` rows.
fn options_strategy(scale: u64, budgets: bool) -> impl Strategy<Value = CompactionOptions> {
    let fragment_budget = if budgets {
        proptest::option::of(1usize..8).boxed()
    } else {
        Just(None).boxed()
    };
    let row_budget = if budgets {
        proptest::option::of(0..=scale * 3).boxed()
    } else {
        Just(None).boxed()
    };
    (
        1..=scale,
        prop_oneof![1 => Just(DEFAULT_MAX_ROWS_PER_FRAGMENT), 3 => (scale / 8).max(1)..=scale * 2],
        prop_oneof![Just(0.1), Just(0.0), Just(1.0), 0.0f64..1.2],
        fragment_budget,
        row_budget,
    )
        .prop_map(
            |(target, max_rows, threshold, max_fragments, max_rows_budget)| CompactionOptions {
                target_rows_per_fragment: target,
                max_rows_per_fragment: max_rows,
                max_source_fragments: max_fragments,
                max_source_rows: max_rows_budget,
                deletion_threshold: threshold,
            },
        )
}

fn spans(plan: &CompactionPlan) -> Vec<Vec<usize>> {
    plan.bins
        .iter()
        .map(|b| (b.first_position..b.first_position + b.fragments.len()).collect())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn prop_plans_are_well_formed(
        fragments in fragments_strategy(40, 2_000),
        options in options_strategy(2_000, true),
    ) {
        let plan = plan_compaction(&fragments, &options).unwrap();
        check_well_formed(&fragments, &options, &plan);
    }

    #[test]
    fn prop_unbounded_plan_matches_reference(
        fragments in fragments_strategy(40, 2_000),
        options in options_strategy(2_000, false),
    ) {
        let plan = plan_compaction(&fragments, &options).unwrap();
        prop_assert_eq!(spans(&plan), reference_bins(&fragments, &options));
    }

    /// The budgeted plan is the unbudgeted one cut oldest first: whole
    /// bins, then possibly a prefix of the next. Budgets hold unless the
    /// plan is the smallest useful prefix of the first eligible bin.
    #[test]
    fn prop_budget_is_an_oldest_first_prefix(
        fragments in fragments_strategy(40, 2_000),
        options in options_strategy(2_000, true),
    ) {
        let plan = plan_compaction(&fragments, &options).unwrap();
        let full = reference_bins(&fragments, &options);
        let got = spans(&plan);
        prop_assert_eq!(&got, &reference_budgeted(&fragments, &options));
        prop_assert!(got.len() <= full.len());
        for (k, bin) in got.iter().enumerate() {
            if k + 1 < got.len() {
                prop_assert_eq!(bin, &full[k]);
            } else {
                prop_assert!(full[k].starts_with(bin), "last bin is not a prefix of an eligible bin");
            }
        }
        let sources = plan.num_source_fragments();
        let rows: u64 = plan.bins.iter().map(|b| b.live_rows).sum();
        let within = options.max_source_fragments.is_none_or(|m| sources <= m)
            && options.max_source_rows.is_none_or(|m| rows <= m);
        if !within {
            prop_assert_eq!(got.len(), 1, "only a lone first bin may exceed a budget");
            let bin = &got[0];
            prop_assert!(ref_progress(bin, &fragments, &options));
            prop_assert!(
                !ref_progress(&bin[..bin.len() - 1], &fragments, &options),
                "an over-budget bin must be the smallest useful prefix"
            );
            // With target <= max_rows / 2 that prefix is tiny.
            if ref_target(&options) * 2 <= u128::from(options.max_rows_per_fragment) {
                prop_assert!(bin.len() <= 2);
            }
        }
    }

    #[test]
    fn prop_plan_is_non_empty_iff_eligible_work_exists(
        fragments in fragments_strategy(40, 2_000),
        options in options_strategy(2_000, true),
    ) {
        let plan = plan_compaction(&fragments, &options).unwrap();
        prop_assert_eq!(!plan.is_empty(), eligible_work_exists(&fragments, &options));
        // Plain sufficient conditions, independent of the binning.
        let heavy_or_empty = fragments
            .iter()
            .any(|f| ref_heavy(f, &options) || f.live_rows() == 0);
        let packable_pair = ref_target(&options) * 2 <= u128::from(options.max_rows_per_fragment)
            && fragments.windows(2).any(|w| {
                w[0].coverage == w[1].coverage
                    && ref_candidate(&w[0], &options)
                    && ref_candidate(&w[1], &options)
            });
        if heavy_or_empty || packable_pair {
            prop_assert!(!plan.is_empty());
        }
    }

    /// Repeated bounded runs strictly lower the potential, preserve the
    /// live rows and their order, and end with an empty plan.
    #[test]
    fn prop_repeated_bounded_runs_converge(
        fragments in fragments_strategy(24, 300),
        options in options_strategy(300, true),
    ) {
        let expected_rows = sim_rows(&simulate(&fragments));
        let mut sim = simulate(&fragments);
        let mut phi = potential(&fragments, &options);
        let bound = phi + 1;
        if fragments.iter().all(|f| f.physical_rows <= options.max_rows_per_fragment) {
            prop_assert!(bound <= 4 * fragments.len() as u64 + 1);
        }
        let mut next_id = 1_000_000;
        let mut plans = 0u64;
        loop {
            let stats = sim_stats(&sim);
            let plan = plan_compaction(&stats, &options).unwrap();
            check_well_formed(&stats, &options, &plan);
            if plan.is_empty() {
                prop_assert!(!eligible_work_exists(&stats, &options));
                break;
            }
            plans += 1;
            prop_assert!(plans < bound, "no convergence within {} plans", bound);
            sim = apply(&sim, &plan, &mut next_id);
            prop_assert_eq!(sim_rows(&sim), expected_rows.clone());
            let next_phi = potential(&sim_stats(&sim), &options);
            prop_assert!(next_phi < phi, "potential did not drop: {} -> {}", phi, next_phi);
            phi = next_phi;
        }
        // Healthy input fragments are never touched.
        let finals: HashSet<u64> = sim.iter().map(|f| f.stats.id).collect();
        for f in &fragments {
            if !ref_candidate(f, &options) {
                prop_assert!(finals.contains(&f.id));
            }
        }
    }
}

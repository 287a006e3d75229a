//! The round planner's rules, one by one, and its compaction trigger against a naive
//! reference.

use proptest::prelude::*;

use super::*;

fn policy() -> MaintenancePolicy {
    MaintenancePolicy {
        auto_index: true,
        auto_compact: true,
        auto_index_rows: 1000,
        auto_index_age_seconds: 60,
        auto_merge_segments: 8,
        auto_compact_small_fragments: 4,
        ..Default::default()
    }
}

fn fragment(id: u64, rows: u64, coverage: u64) -> FragmentFacts {
    FragmentFacts {
        id,
        physical_rows: rows,
        deleted_rows: 0,
        coverage,
    }
}

fn index(segments: &[u64], unindexed_rows: u64) -> IndexFacts {
    IndexFacts {
        name: "i".into(),
        segments: segments
            .iter()
            .enumerate()
            .map(|(id, rows)| SegmentFacts {
                id: id as u64,
                rows: *rows,
            })
            .collect(),
        unindexed_fragments: if unindexed_rows > 0 { vec![99] } else { vec![] },
        unindexed_rows,
        oldest_unindexed_age_ms: Some(0),
        imbalance: Some(2.0),
        bytes_per_row: 520,
    }
}

fn facts(fragments: Vec<FragmentFacts>, indexes: Vec<IndexFacts>) -> TableFacts {
    TableFacts {
        fragments,
        indexes,
        versions: 3,
        max_rows_per_fragment: 1 << 20,
        bytes_per_row: 600,
        since_last_vacuum_ms: None,
    }
}

fn kinds(p: &Plan) -> Vec<&'static str> {
    p.tasks.iter().map(Task::kind).collect()
}

#[test]
fn size_tiers_are_powers_of_the_fanout_above_its_square() {
    assert_eq!(size_tier(0, 16), 0);
    assert_eq!(size_tier(1, 16), 0);
    assert_eq!(
        size_tier(255, 16),
        0,
        "a 1-row and a 100-row fragment are one tier"
    );
    assert_eq!(size_tier(256, 16), 1);
    assert_eq!(size_tier(4095, 16), 1);
    assert_eq!(size_tier(4096, 16), 2);
    assert_eq!(size_tier(u64::MAX, 2), 62);
    assert_eq!(
        size_tier(100, 1),
        size_tier(100, 2),
        "a fanout below 2 acts as 2"
    );
}

#[test]
fn a_default_policy_plans_nothing_whatever_the_state() {
    let f = facts(
        (0..40).map(|i| fragment(i, 10, 0)).collect(),
        vec![index(&[1; 20], 1_000_000)],
    );
    let p = plan(&MaintenancePolicy::default(), &f).unwrap();
    assert_eq!(p, Plan::default());
}

#[test]
fn append_is_due_by_rows_or_by_age_and_never_for_nothing() {
    let p = policy();
    let mut i = index(&[5000], 999);
    i.oldest_unindexed_age_ms = Some(59_999);
    assert!(
        plan(&p, &facts(vec![], vec![i.clone()]))
            .unwrap()
            .tasks
            .is_empty()
    );
    i.unindexed_rows = 1000;
    assert_eq!(
        kinds(&plan(&p, &facts(vec![], vec![i.clone()])).unwrap()),
        ["index_append"]
    );
    i.unindexed_rows = 1;
    i.oldest_unindexed_age_ms = Some(60_000);
    assert_eq!(
        kinds(&plan(&p, &facts(vec![], vec![i.clone()])).unwrap()),
        ["index_append"]
    );
    let rows_alone = MaintenancePolicy {
        auto_index_age_seconds: 0,
        ..p.clone()
    };
    assert!(
        plan(&rows_alone, &facts(vec![], vec![i.clone()]))
            .unwrap()
            .tasks
            .is_empty()
    );
    i.unindexed_rows = 0;
    i.unindexed_fragments.clear();
    assert!(plan(&p, &facts(vec![], vec![i])).unwrap().tasks.is_empty());
}

#[test]
fn recluster_goes_before_the_append_it_prepares() {
    let p = MaintenancePolicy {
        auto_recluster: Some("ivf_partition(emb)".into()),
        ..policy()
    };
    let plan = plan(&p, &facts(vec![], vec![index(&[5000], 2000)])).unwrap();
    assert_eq!(kinds(&plan), ["recluster", "index_append"]);
    assert_eq!(
        plan.tasks[0],
        Task::Recluster {
            key: "ivf_partition(emb)".into(),
            fragments: vec![99]
        }
    );
    // Nothing due: no recluster either.
    let quiet = super::plan(&p, &facts(vec![], vec![index(&[5000], 10)])).unwrap();
    assert!(quiet.tasks.is_empty());
}

#[test]
fn merge_brings_segments_back_to_half_and_keeps_the_oldest() {
    let p = policy();
    // 9 segments > 8: merge the newest 9 + 1 - 4 = 6, with the unindexed rows.
    let i = index(&[100_000, 10, 10, 10, 10, 10, 10, 10, 10], 5);
    let plan = plan(&p, &facts(vec![], vec![i])).unwrap();
    assert_eq!(
        plan.tasks,
        [Task::Merge {
            index: "i".into(),
            segments: 6,
            rows: 65
        }]
    );
    // 8 segments: nothing.
    let i = index(&[100_000, 10, 10, 10, 10, 10, 10, 10], 5);
    assert!(
        super::plan(&p, &facts(vec![], vec![i]))
            .unwrap()
            .tasks
            .is_empty()
    );
    // A merge replaces the append that was due: it indexes the unindexed rows too.
    let i = index(&[100_000, 10, 10, 10, 10, 10, 10, 10, 10], 5000);
    assert_eq!(
        kinds(&super::plan(&p, &facts(vec![], vec![i])).unwrap()),
        ["index_merge"]
    );
}

#[test]
fn merge_stays_within_the_step_budget_or_says_why_not() {
    let p = MaintenancePolicy {
        auto_step_bytes: 520 * 1000,
        ..policy()
    };
    // Newest first: 300, 300, 300, 600, ...: three fit in 1000 rows, four do not.
    let i = index(&[5000, 600, 600, 600, 600, 300, 300, 300, 300], 0);
    let plan = plan(&p, &facts(vec![], vec![i])).unwrap();
    assert_eq!(
        plan.tasks,
        [Task::Merge {
            index: "i".into(),
            segments: 3,
            rows: 900
        }]
    );
    let i = index(&[5000; 9], 0);
    let plan = super::plan(&p, &facts(vec![], vec![i])).unwrap();
    assert!(plan.tasks.is_empty());
    assert!(
        plan.notes[0].contains("over auto_step_bytes"),
        "{:?}",
        plan.notes
    );
}

#[test]
fn retrain_when_partitions_drift_past_the_threshold() {
    let p = MaintenancePolicy {
        auto_retrain_imbalance: 6.0,
        ..policy()
    };
    let mut i = index(&[5000], 0);
    i.imbalance = Some(5.9);
    assert!(
        plan(&p, &facts(vec![], vec![i.clone()]))
            .unwrap()
            .tasks
            .is_empty()
    );
    i.imbalance = Some(6.1);
    assert_eq!(
        kinds(&plan(&p, &facts(vec![], vec![i.clone()])).unwrap()),
        ["index_retrain"]
    );
    assert!(
        plan(&policy(), &facts(vec![], vec![i]))
            .unwrap()
            .tasks
            .is_empty(),
        "0 = never"
    );
}

#[test]
fn compaction_waits_for_a_run_of_one_tier_and_never_mixes_coverage() {
    let p = policy();
    // One big indexed fragment, then 3 small unindexed ones: nothing yet.
    let mut frags = vec![fragment(0, 500_000, 7)];
    frags.extend((1..4).map(|i| fragment(i, 100, 0)));
    assert!(
        plan(&p, &facts(frags.clone(), vec![]))
            .unwrap()
            .tasks
            .is_empty()
    );
    // A fourth makes a run of 4 = auto_compact_small_fragments.
    frags.push(fragment(4, 100, 0));
    let plan = plan(&p, &facts(frags.clone(), vec![])).unwrap();
    let Task::Compact { bins } = &plan.tasks[0] else {
        panic!("{plan:?}")
    };
    assert_eq!(bins.len(), 1);
    assert_eq!(bins[0].fragments, [1, 2, 3, 4]);
    // The output (400 rows: tier 1 of fanout 4) later sits beside new small ones (tier 0)
    // without being rewritten with them until its own tier fills; 1-row and 10-row
    // fragments (an UPDATE's, an INSERT's) are one tier.
    let mut later = vec![fragment(0, 500_000, 7), fragment(5, 400, 0)];
    later.extend((6..10).map(|i| fragment(i, 1 + 9 * (i % 2), 0)));
    let p2 = super::plan(&p, &facts(later, vec![])).unwrap();
    let Task::Compact { bins } = &p2.tasks[0] else {
        panic!("{p2:?}")
    };
    assert_eq!(bins[0].fragments, [6, 7, 8, 9]);
}

#[test]
fn a_fragment_heavy_with_deletions_is_compacted_though_no_run_is_long() {
    let mut f = fragment(0, 500_000, 7);
    f.deleted_rows = 100_000;
    let plan = plan(&policy(), &facts(vec![f, fragment(1, 500_000, 7)], vec![])).unwrap();
    let Task::Compact { bins } = &plan.tasks[0] else {
        panic!("{plan:?}")
    };
    // Its neighbour of the same tier fits in the same output, so it goes along.
    assert_eq!(bins[0].fragments, [0, 1]);
    // Without the deletions, two fragments are no run worth a rewrite.
    let quiet = super::plan(
        &policy(),
        &facts(
            vec![fragment(0, 500_000, 7), fragment(1, 500_000, 7)],
            vec![],
        ),
    );
    assert!(quiet.unwrap().tasks.is_empty());
}

#[test]
fn vacuum_when_versions_pile_up_at_most_once_a_minute() {
    let p = MaintenancePolicy {
        auto_vacuum_retain: 10,
        ..Default::default()
    };
    let mut f = facts(vec![], vec![]);
    f.versions = 16;
    assert!(plan(&p, &f).unwrap().tasks.is_empty());
    f.versions = 17;
    assert_eq!(
        plan(&p, &f).unwrap().tasks,
        [Task::Vacuum {
            retain: 10,
            grace_seconds: p.auto_vacuum_grace_seconds
        }]
    );
    f.since_last_vacuum_ms = Some(VACUUM_EVERY_MS - 1);
    assert!(plan(&p, &f).unwrap().tasks.is_empty());
}

/// The naive trigger: some run of adjacent fragments with equal coverage and size tier,
/// all below the fragment size limit, at least `fanout` long.
fn naive_compaction_due(fragments: &[FragmentFacts], fanout: u64) -> bool {
    let key = |f: &FragmentFacts| {
        (
            f.coverage,
            size_tier(f.physical_rows - f.deleted_rows, fanout),
        )
    };
    let mut run = 0u64;
    for (i, f) in fragments.iter().enumerate() {
        run = if i > 0 && key(&fragments[i - 1]) == key(f) {
            run + 1
        } else {
            1
        };
        if run >= fanout {
            return true;
        }
    }
    false
}

proptest! {
    #[test]
    fn compaction_is_planned_exactly_when_the_naive_trigger_says(
        sizes in prop::collection::vec((1u64..300, 0u64..3), 0..60),
        fanout in 2u64..6,
    ) {
        let fragments: Vec<FragmentFacts> = sizes
            .iter()
            .enumerate()
            .map(|(i, (rows, coverage))| fragment(i as u64, *rows, *coverage))
            .collect();
        let p = MaintenancePolicy {
            auto_compact: true,
            auto_compact_small_fragments: fanout,
            ..Default::default()
        };
        let planned = plan(&p, &facts(fragments.clone(), vec![])).unwrap();
        let bins = match planned.tasks.as_slice() {
            [] => vec![],
            [Task::Compact { bins }] => bins.clone(),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(!bins.is_empty(), naive_compaction_due(&fragments, fanout));
        for bin in &bins {
            let first = &fragments[bin.first_position];
            let want = (first.coverage, size_tier(first.physical_rows, fanout));
            for (k, id) in bin.fragments.iter().enumerate() {
                let f = &fragments[bin.first_position + k];
                prop_assert_eq!(f.id, *id, "bins are adjacent fragments in order");
                prop_assert_eq!((f.coverage, size_tier(f.physical_rows, fanout)), want);
            }
        }
    }
}

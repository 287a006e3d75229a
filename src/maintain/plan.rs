//! What one maintenance round should do, decided from a table's state: a pure function of
//! [`TableFacts`] and the table's [`MaintenancePolicy`], no IO.
//!
//! The rules, in the order a round runs them:
//! 1. **Recluster** (with `auto_recluster`): when an append is due, the unindexed
//!    fragments are first rewritten ordered by the key, so rows of one partition sit
//!    together before they are indexed.
//! 2. **Append** (`auto_index`): an index whose unindexed fragments hold at least
//!    `auto_index_rows` live rows, or whose oldest unindexed fragment has waited
//!    `auto_index_age_seconds`, gets a new segment over them.
//! 3. **Merge** (`auto_index`, `auto_merge_segments = M`): an index with more than `M`
//!    segments merges its newest ones down to about `M / 2`, never more than
//!    `auto_step_bytes` of vectors at once (a merge holds the rows it writes). The oldest
//!    segment, usually the largest, is left alone for `M ≥ 4`, so merges stay small:
//!    segments grow as in a log-structured merge, not by rewriting the whole index.
//! 4. **Retrain** (`auto_index`, `auto_retrain_imbalance = x`): an index whose partition
//!    imbalance — largest partition's rows × partitions ÷ rows — exceeds `x` has drifted
//!    away from its centroids (new rows crowd a few partitions, so a probe reads more).
//! 5. **Compact** (`auto_compact`): fragments are grouped by size tier (a factor
//!    `auto_compact_small_fragments` per tier, everything below its square one tier) within
//!    one index coverage, and the
//!    compaction planner runs over them once some run of one tier holds
//!    `auto_compact_small_fragments` fragments or a fragment is heavy with deleted rows.
//!    Tiers keep each row's rewrites to about log_F(rows) as a table grows by small
//!    appends, instead of rewriting the growing tail fragment every round.
//! 6. **Vacuum** (`auto_vacuum_retain = n`): once there are more than `n + n/2 + 1`
//!    versions, at most once every 30 s.
//!
//! What a rule would do but may not (over the step budget) is reported as a note, so
//! `MAINTAIN` and `fragvec_maintenance` say why nothing happened.

use std::hash::{Hash, Hasher};

use crate::format::policy::MaintenancePolicy;
use crate::rewrite::plan::{
    CompactionBin, CompactionOptions, DEFAULT_DELETION_THRESHOLD, FragmentStats, PlanError,
    plan_compaction,
};

/// One fragment, in logical order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragmentFacts {
    /// The fragment's id.
    pub id: u64,
    /// Rows in its data files, deleted ones included.
    pub physical_rows: u64,
    /// Rows its deletion vector marks.
    pub deleted_rows: u64,
    /// Equal for fragments owned the same way by the same index segments
    /// (`rewrite::compact::coverage_keys`).
    pub coverage: u64,
}

/// One segment of an index, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFacts {
    /// The segment's id.
    pub id: u64,
    /// Rows it holds.
    pub rows: u64,
}

/// One vector index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexFacts {
    /// The index's name.
    pub name: String,
    /// Its segments, oldest first.
    pub segments: Vec<SegmentFacts>,
    /// Ids of the fragments no segment owns.
    pub unindexed_fragments: Vec<u64>,
    /// Live rows of those fragments (what an append would index).
    pub unindexed_rows: u64,
    /// How long the oldest unindexed fragment has existed.
    pub oldest_unindexed_age_ms: Option<u64>,
    /// Largest partition's rows × partitions ÷ rows (1 = perfectly even); `None` when
    /// unknown or the index is empty.
    pub imbalance: Option<f64>,
    /// Bytes a merge or append holds per row (the vector and its address).
    pub bytes_per_row: u64,
}

/// What a round knows about a table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableFacts {
    /// Its fragments, in logical order.
    pub fragments: Vec<FragmentFacts>,
    /// Its vector indexes.
    pub indexes: Vec<IndexFacts>,
    /// Versions kept (what a vacuum may remove).
    pub versions: u64,
    /// The table's `max_rows_per_fragment` (what compaction fills fragments to).
    pub max_rows_per_fragment: u64,
    /// Average stored bytes per physical row (for the compaction budget).
    pub bytes_per_row: u64,
    /// Since this process (or the journal) last saw a vacuum of the table.
    pub since_last_vacuum_ms: Option<u64>,
}

/// One maintenance task.
#[derive(Clone, Debug, PartialEq)]
pub enum Task {
    /// `RECLUSTER` unindexed fragments by the table's `auto_recluster` key.
    Recluster {
        /// The clustering key (`ivf_partition(emb)`, ...).
        key: String,
        /// The fragments to rewrite.
        fragments: Vec<u64>,
    },
    /// `OPTIMIZE INDEX ... APPEND`: index the unindexed fragments.
    Append {
        /// The index's name.
        index: String,
        /// Rows it will index.
        rows: u64,
    },
    /// `OPTIMIZE INDEX ... MERGE`: merge the newest segments into one.
    Merge {
        /// The index's name.
        index: String,
        /// How many of its newest segments.
        segments: usize,
        /// Rows they hold.
        rows: u64,
    },
    /// Retrain the index: its partitions drifted apart in size.
    Retrain {
        /// The index's name.
        index: String,
        /// Its partition imbalance (see [`IndexFacts::imbalance`]).
        imbalance: f64,
    },
    /// `COMPACT` runs of small fragments, bin by bin.
    Compact {
        /// The planned bins.
        bins: Vec<CompactionBin>,
    },
    /// `VACUUM`: remove old versions and unreferenced files.
    Vacuum {
        /// Versions to keep.
        retain: u64,
        /// Files younger than this stay (a concurrent writer's, not yet committed).
        grace_seconds: u64,
    },
}

impl Task {
    /// The task's kind as `fragvec_maintenance` shows it.
    pub fn kind(&self) -> &'static str {
        match self {
            Task::Recluster { .. } => "recluster",
            Task::Append { .. } => "index_append",
            Task::Merge { .. } => "index_merge",
            Task::Retrain { .. } => "index_retrain",
            Task::Compact { .. } => "compact",
            Task::Vacuum { .. } => "vacuum",
        }
    }

    /// Rows the task reads or rewrites (its size, for logs and the journal).
    pub fn rows(&self) -> u64 {
        match self {
            Task::Append { rows, .. } | Task::Merge { rows, .. } => *rows,
            Task::Compact { bins } => bins.iter().map(|b| b.live_rows).sum(),
            _ => 0,
        }
    }

    /// What it is about, in words.
    pub fn detail(&self) -> String {
        match self {
            Task::Recluster { key, fragments } => {
                format!("{} unindexed fragments by {key}", fragments.len())
            }
            Task::Append { index, rows } => format!("{index}: {rows} unindexed rows"),
            Task::Merge {
                index, segments, ..
            } => format!("{index}: newest {segments} segments"),
            Task::Retrain { index, imbalance } => {
                format!("{index}: partition imbalance {imbalance:.1}")
            }
            Task::Compact { bins } => format!(
                "{} fragments into {}",
                bins.iter().map(|b| b.fragments.len()).sum::<usize>(),
                bins.iter().map(|b| b.output_rows.len()).sum::<usize>()
            ),
            Task::Vacuum { retain, .. } => format!("retain {retain} versions"),
        }
    }
}

/// A round's decision: the tasks in order, and why rules that fired did nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The tasks, in the order they run.
    pub tasks: Vec<Task>,
    /// Rules that fired and did nothing, and why.
    pub notes: Vec<String>,
}

/// Least time between two vacuums of a table by the maintainer (a vacuum reads every
/// manifest younger than its grace period).
pub const VACUUM_EVERY_MS: u64 = 30_000;

/// The size tier of a fragment of `live` rows: ⌊log_fanout(live)⌋ − 1, so that everything
/// below fanout² rows is one tier. A streaming table interleaves fragments of very
/// different small sizes (a 100-row insert, a 1-row UPDATE's new version): were they tiers
/// of their own, no run of one tier would ever grow long enough to be compacted.
pub fn size_tier(live: u64, fanout: u64) -> u32 {
    let fanout = fanout.max(2);
    let (mut tier, mut bound) = (0u32, fanout);
    while live >= bound {
        tier += 1;
        bound = bound.saturating_mul(fanout);
        if bound == u64::MAX {
            break;
        }
    }
    tier.saturating_sub(1)
}

fn tiered(coverage: u64, tier: u32) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (coverage, tier).hash(&mut h);
    h.finish()
}

/// Decides one round. Fails only on facts the compaction planner refuses (a fragment with
/// more deleted than physical rows: a corrupt manifest).
pub fn plan(policy: &MaintenancePolicy, facts: &TableFacts) -> Result<Plan, PlanError> {
    let mut out = Plan::default();
    let step = policy.auto_step_bytes;
    if policy.auto_index {
        let due: Vec<&IndexFacts> = facts
            .indexes
            .iter()
            .filter(|i| append_due(policy, i))
            .collect();
        if let (Some(key), false) = (&policy.auto_recluster, due.is_empty()) {
            let mut fragments: Vec<u64> = due
                .iter()
                .flat_map(|i| i.unindexed_fragments.iter().copied())
                .collect();
            fragments.sort_unstable();
            fragments.dedup();
            out.tasks.push(Task::Recluster {
                key: key.clone(),
                fragments,
            });
        }
        for index in &facts.indexes {
            let appends = due.iter().any(|d| d.name == index.name);
            let m = policy.auto_merge_segments as usize;
            let merge = (m >= 2 && index.segments.len() > m).then(|| merge_size(index, m, step));
            let merges = matches!(merge, Some(Ok(_)));
            match merge {
                // A merge takes the unindexed rows too: no append needed.
                Some(Ok((segments, rows))) => out.tasks.push(Task::Merge {
                    index: index.name.clone(),
                    segments,
                    rows,
                }),
                Some(Err(note)) => out.notes.push(note),
                None => {}
            }
            if appends && !merges {
                out.tasks.push(Task::Append {
                    index: index.name.clone(),
                    rows: index.unindexed_rows,
                });
            }
            if let Some(imbalance) = index.imbalance
                && policy.auto_retrain_imbalance > 0.0
                && imbalance > policy.auto_retrain_imbalance
            {
                out.tasks.push(Task::Retrain {
                    index: index.name.clone(),
                    imbalance,
                });
            }
        }
    }
    if policy.auto_compact
        && let Some(bins) = compaction(policy, facts)?
    {
        out.tasks.push(Task::Compact { bins });
    }
    let retain = policy.auto_vacuum_retain;
    if retain > 0
        && facts.versions > retain + retain / 2 + 1
        && facts
            .since_last_vacuum_ms
            .is_none_or(|ms| ms >= VACUUM_EVERY_MS)
    {
        out.tasks.push(Task::Vacuum {
            retain,
            grace_seconds: policy.auto_vacuum_grace_seconds,
        });
    }
    Ok(out)
}

fn append_due(policy: &MaintenancePolicy, index: &IndexFacts) -> bool {
    if index.unindexed_rows == 0 {
        return false;
    }
    let aged = policy.auto_index_age_seconds > 0
        && index
            .oldest_unindexed_age_ms
            .is_some_and(|ms| ms >= policy.auto_index_age_seconds.saturating_mul(1000));
    index.unindexed_rows >= policy.auto_index_rows || aged
}

/// How many of the newest segments to merge (with the unindexed rows, which a merge takes
/// too) to bring `index` back to about `m / 2` segments, and the rows it writes; or why no
/// merge of two segments fits the step budget.
fn merge_size(index: &IndexFacts, m: usize, step_bytes: u64) -> Result<(usize, u64), String> {
    let count = index.segments.len();
    let wanted = (count + 1).saturating_sub(m / 2).clamp(2, count);
    let newest_first = index.segments.iter().rev().map(|s| s.rows);
    let mut rows = index.unindexed_rows;
    let mut best = None;
    for (k, size) in newest_first.enumerate().take(wanted) {
        rows += size;
        if k >= 1 && rows.saturating_mul(index.bytes_per_row) <= step_bytes {
            best = Some((k + 1, rows));
        }
    }
    best.ok_or_else(|| {
        let two = index.unindexed_rows
            + index
                .segments
                .iter()
                .rev()
                .take(2)
                .map(|s| s.rows)
                .sum::<u64>();
        format!(
            "{}: {count} segments, but merging the newest two would hold {} bytes, over \
             auto_step_bytes = {step_bytes}",
            index.name,
            two.saturating_mul(index.bytes_per_row)
        )
    })
}

/// The compaction bins of a round, when some run of one size tier is long enough or some
/// fragment is heavy with deletions.
fn compaction(
    policy: &MaintenancePolicy,
    facts: &TableFacts,
) -> Result<Option<Vec<CompactionBin>>, PlanError> {
    let fanout = policy.auto_compact_small_fragments;
    let stats: Vec<FragmentStats> = facts
        .fragments
        .iter()
        .map(|f| {
            let live = f.physical_rows.saturating_sub(f.deleted_rows);
            FragmentStats {
                id: f.id,
                physical_rows: f.physical_rows,
                deleted_rows: f.deleted_rows,
                coverage: tiered(f.coverage, size_tier(live, fanout)),
            }
        })
        .collect();
    let options = CompactionOptions {
        target_rows_per_fragment: facts.max_rows_per_fragment,
        max_rows_per_fragment: facts.max_rows_per_fragment,
        max_source_fragments: None,
        max_source_rows: Some((policy.auto_step_bytes / facts.bytes_per_row.max(1)).max(1)),
        deletion_threshold: DEFAULT_DELETION_THRESHOLD,
    };
    let plan = plan_compaction(&stats, &options)?;
    let heavy = |id: u64| {
        facts.fragments.iter().any(|f| {
            f.id == id
                && f.physical_rows > 0
                && f.deleted_rows as f64 / f.physical_rows as f64 > DEFAULT_DELETION_THRESHOLD
        })
    };
    let worth = plan
        .bins
        .iter()
        .any(|b| b.fragments.len() as u64 >= fanout || b.fragments.iter().any(|id| heavy(*id)));
    Ok(worth.then_some(plan.bins))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

//! Running maintenance: one round on a table (`MAINTAIN t`, [`FragvecSession::maintain`])
//! and the scheduler that runs rounds by itself ([`Maintainer`], inside `fragvec serve`).
//!
//! A round takes the table's lease ([`crate::maintain::lease`]), then repeatedly reads the
//! latest version, gathers its facts (`facts`), asks the planner
//! ([`crate::maintain::plan`]) what to do and runs the first task of a kind not yet run this
//! round, until nothing is left or [`MAX_TASKS`] ran. Every task is an ordinary commit
//! through the conflict rules: one that loses a race re-plans on the new latest version and
//! tries again, up to `fragvec.commit_retries` times, then gives way ("gave way" in the
//! journal) — a user's statement is never made to fail by maintenance beyond what the
//! conflict matrix already says of two concurrent statements. Each task is journaled
//! ([`crate::maintain::journal`]) when it starts and when it ends, and the lease is renewed
//! while it runs.

mod facts;
pub mod scheduler;

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::common::{Result, plan_datafusion_err};

pub use scheduler::{Maintainer, MaintainerConfig};

use super::error::is_retryable;
use super::session::{FragvecSession, StatementResult};
use crate::format::Snapshot;
use crate::format::manifest::{Manifest, ROW_ADDR, now_ms};
use crate::format::policy::{MaintenancePolicy, NAMES, PolicyError};
use crate::format::vacuum::vacuum;
use crate::index::optimize::{Optimize, optimize};
use crate::maintain::journal::{self, TaskRecord, journal_batch, journal_schema};
use crate::maintain::lease::{DEFAULT_TTL, Lease, holder_name};
use crate::maintain::plan::{self, Task};

/// Tasks one round runs at most (each of a different kind).
pub const MAX_TASKS: usize = 8;

/// Where a round runs a VACUUM it finds due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VacuumIn {
    /// In the round, after its other tasks (`MAINTAIN t`, `fragvec maintain --interval 0`).
    Round,
    /// Handed back in [`RoundReport::vacuum`] for the caller to run beside the following
    /// rounds ([`FragvecSession::run_vacuum`], as the [`Maintainer`] does): on a table that
    /// commits many times a second a VACUUM reads thousands of retained manifests, and
    /// indexing and compaction should not wait seconds for it.
    Caller,
}

/// What one round did.
#[derive(Clone, Debug, Default)]
pub struct RoundReport {
    /// The table's name.
    pub table: String,
    /// The tasks run, as journaled.
    pub tasks: Vec<TaskRecord>,
    /// Why something did not happen: a rule over its step budget, the lease held by
    /// another maintainer, no `auto_*` property on.
    pub notes: Vec<String>,
    /// A VACUUM found due and not run ([`VacuumIn::Caller`]).
    pub vacuum: Option<Task>,
}

/// This process's name as a lease holder.
pub fn holder() -> &'static str {
    static HOLDER: OnceLock<String> = OnceLock::new();
    HOLDER.get_or_init(holder_name)
}

/// A policy error as the user sees it: the closest property name for a misspelt one.
pub fn policy_error(e: PolicyError) -> datafusion::error::DataFusionError {
    match e {
        PolicyError::Unknown(name) => {
            match super::options::closest_name(&name, NAMES.iter().copied()) {
                Some(close) => {
                    plan_datafusion_err!("unknown table property '{name}'; did you mean {close}?")
                }
                None => plan_datafusion_err!(
                    "unknown table property '{name}'; the properties are {}",
                    NAMES.join(", ")
                ),
            }
        }
        other => plan_datafusion_err!("{other}"),
    }
}

/// The table's policy with a round's overrides (`MAINTAIN t WITH (...)`).
fn policy_of(snapshot: &Snapshot, overrides: &[(String, String)]) -> Result<MaintenancePolicy> {
    let mut policy = snapshot.manifest.properties.maintenance.clone();
    for (name, value) in overrides {
        policy.set(name, Some(value)).map_err(policy_error)?;
    }
    Ok(policy)
}

/// What a task produced.
#[derive(Default)]
struct Done {
    rows: u64,
    bytes: u64,
    version: u64,
    nothing: bool,
}

impl FragvecSession {
    /// Runs one maintenance round on `table` now, under its policy with `overrides` applied
    /// for this round (`MAINTAIN t WITH (auto_compact = on)`). Returns what it did; when
    /// another maintainer holds the table's lease it does nothing and says so in the notes.
    pub async fn maintain(
        &self,
        table: &str,
        overrides: &[(String, String)],
    ) -> Result<RoundReport> {
        self.maintain_leased(table, overrides, DEFAULT_TTL, VacuumIn::Round)
            .await
    }

    /// [`Self::maintain`] with a lease of `lease_ttl` (how long the table waits for this
    /// process if it dies mid-round), running a VACUUM that is due where `vacuum` says.
    pub async fn maintain_leased(
        &self,
        table: &str,
        overrides: &[(String, String)],
        lease_ttl: Duration,
        vacuum: VacuumIn,
    ) -> Result<RoundReport> {
        let first = self.latest_snapshot(table).await?;
        let policy = policy_of(&first, overrides)?;
        let mut report = RoundReport {
            table: table.to_string(),
            ..Default::default()
        };
        if !policy.is_active() {
            report.notes.push(format!(
                "no maintenance is switched on for {table}: ALTER TABLE {table} SET \
                 (auto_index = on, auto_compact = on, ...), or MAINTAIN {table} WITH (...)"
            ));
            return Ok(report);
        }
        // A visit with nothing due writes nothing: the lease and the journal are store
        // writes, and a maintainer may visit every second (docs/maintenance.md).
        let mut planned = self.plan(&first, &policy).await?;
        if planned.tasks.is_empty() {
            report.notes = planned.notes;
            return Ok(report);
        }
        // Only a VACUUM due, for a caller that runs it beside its rounds: handed back
        // without writing a lease of its own, unless another maintainer holds the lease.
        let only_vacuum = |t: &Task| matches!(t, Task::Vacuum { .. });
        if vacuum == VacuumIn::Caller && planned.tasks.iter().all(only_vacuum) {
            report.notes = planned.notes;
            match crate::maintain::lease::current(&first.dir).await? {
                Some((_, state)) if state.held_by_another(holder(), now_ms()) => {
                    report.notes.push(format!(
                        "VACUUM left to {}, which holds the table's lease",
                        state.holder
                    ));
                }
                _ => report.vacuum = planned.tasks.pop(),
            }
            return Ok(report);
        }
        let dir = first.dir.clone();
        let mut lease = match Lease::acquire(&dir, holder(), lease_ttl).await? {
            Ok(lease) => lease,
            Err(busy) => {
                report.notes.push(busy.to_string());
                return Ok(report);
            }
        };
        let planned = Some((first.version(), planned));
        let outcome = self
            .round(table, overrides, planned, vacuum, &mut lease, &mut report)
            .await;
        lease.release(&dir).await?;
        journal::trim(&dir).await?;
        outcome.map(|()| report)
    }

    async fn round(
        &self,
        table: &str,
        overrides: &[(String, String)],
        mut planned_before: Option<(u64, plan::Plan)>,
        vacuum: VacuumIn,
        lease: &mut Lease,
        report: &mut RoundReport,
    ) -> Result<()> {
        let mut ran: HashSet<&'static str> = HashSet::new();
        for _ in 0..MAX_TASKS {
            let snapshot = self.latest_snapshot(table).await?;
            let policy = policy_of(&snapshot, overrides)?;
            // The plan made before the lease was taken (`planned_before`, with the version
            // it read) holds when nothing committed since: its facts are not gathered again.
            let planned = match planned_before.take() {
                Some((version, planned)) if version == snapshot.version() => planned,
                _ => self.plan(&snapshot, &policy).await?,
            };
            for note in planned.notes {
                if !report.notes.contains(&note) {
                    report.notes.push(note);
                }
            }
            let Some(task) = planned.tasks.into_iter().find(|t| !ran.contains(t.kind())) else {
                break;
            };
            ran.insert(task.kind());
            if vacuum == VacuumIn::Caller && matches!(task, Task::Vacuum { .. }) {
                // VACUUM is the planner's last rule: nothing else is due after it.
                report.vacuum = Some(task);
                break;
            }
            let dir = snapshot.dir.clone();
            let record = self
                .run_task(table, snapshot, &policy, overrides, task, Some(lease))
                .await?;
            let failed = record.outcome.starts_with("failed");
            report.tasks.push(record);
            if failed || !lease.renew(&dir).await? {
                if !failed {
                    report
                        .notes
                        .push("the lease was lost: another maintainer took over".into());
                }
                break;
            }
        }
        Ok(())
    }

    /// Runs a VACUUM a round handed back ([`VacuumIn::Caller`]) on the table's latest
    /// version, journaled like a round's tasks. It takes no lease: VACUUM commits nothing
    /// and is safe beside any writer (its grace period), and the round that found it due
    /// held the lease or saw that no other maintainer did, so two maintainers seldom both
    /// run it (and if they do, the second finds less to remove).
    pub async fn run_vacuum(&self, table: &str, task: Task) -> Result<TaskRecord> {
        let snapshot = self.latest_snapshot(table).await?;
        let policy = policy_of(&snapshot, &[])?;
        self.run_task(table, snapshot, &policy, &[], task, None)
            .await
    }

    async fn plan(&self, snapshot: &Snapshot, policy: &MaintenancePolicy) -> Result<plan::Plan> {
        let versions = policy.auto_vacuum_retain > 0;
        let facts = facts::gather(snapshot, self.schema.index_cache(), versions).await?;
        plan::plan(policy, &facts).map_err(|e| plan_datafusion_err!("maintenance planner: {e}"))
    }

    /// Runs `task` (planned on `snapshot`), re-planning it on the latest version after each
    /// lost commit race, renewing `lease` (if any) while it runs; journals it. A task error
    /// is the record's outcome, not an error of the round (the round stops after it).
    async fn run_task(
        &self,
        table: &str,
        mut snapshot: Snapshot,
        policy: &MaintenancePolicy,
        overrides: &[(String, String)],
        mut task: Task,
        mut lease: Option<&mut Lease>,
    ) -> Result<TaskRecord> {
        let dir = snapshot.dir.clone();
        let mut record = TaskRecord::start(task.kind(), task.detail(), holder(), task.rows());
        journal::write(&dir, &record).await?;
        let retries = self.options().commit_retries as u32;
        let outcome = loop {
            let work = self.run_attempt(&snapshot, policy, &task);
            match renewing(work, lease.as_deref_mut(), &dir).await {
                Ok(done) => break Ok(done),
                Err(e) if is_retryable(&e) && record.retries < retries => {
                    record.retries += 1;
                    snapshot = self.latest_snapshot(table).await?;
                    let policy = policy_of(&snapshot, overrides)?;
                    let kind = task.kind();
                    match self
                        .plan(&snapshot, &policy)
                        .await?
                        .tasks
                        .into_iter()
                        .find(|t| t.kind() == kind)
                    {
                        Some(again) => task = again,
                        None => {
                            break Ok(Done {
                                nothing: true,
                                ..Default::default()
                            });
                        }
                    }
                }
                Err(e) if is_retryable(&e) => {
                    break Err(format!("gave way after {} conflicts", record.retries));
                }
                Err(e) => break Err(format!("failed: {e}")),
            }
        };
        match outcome {
            Ok(done) => {
                record.rows = done.rows;
                record.bytes = done.bytes;
                record.version = Some(done.version);
                record.finish(if done.nothing {
                    "nothing to do"
                } else {
                    "done"
                });
            }
            Err(outcome) => record.finish(outcome),
        }
        journal::write(&dir, &record).await?;
        Ok(record)
    }

    /// One attempt at `task` on `snapshot`.
    async fn run_attempt(
        &self,
        snapshot: &Snapshot,
        policy: &MaintenancePolicy,
        task: &Task,
    ) -> Result<Done> {
        let cache = self.schema.index_cache();
        let progress = self.progress();
        let budget = Some(policy.auto_step_bytes as usize);
        let before = snapshot.manifest.clone();
        let rows = match task {
            Task::Recluster { key, fragments } => {
                let ids: Vec<String> = fragments.iter().map(u64::to_string).collect();
                let filter = format!("({ROW_ADDR} / 4294967296) IN ({})", ids.join(", "));
                let batch = super::recluster::run_recluster(
                    &self.ctx.state(),
                    snapshot,
                    std::slice::from_ref(key),
                    &[],
                    Some(&filter),
                    cache,
                )
                .await?;
                let version = column(&batch, "version");
                return self
                    .done_with_data(snapshot, &before, column(&batch, "rows_rewritten"), version)
                    .await;
            }
            Task::Append { index, .. } => {
                optimize(
                    snapshot.clone(),
                    index,
                    Optimize::Append,
                    cache,
                    budget,
                    &progress,
                )
                .await?
            }
            Task::Merge {
                index, segments, ..
            } => {
                let action = Optimize::Merge(*segments);
                optimize(snapshot.clone(), index, action, cache, budget, &progress).await?
            }
            Task::Retrain { index, .. } => {
                optimize(
                    snapshot.clone(),
                    index,
                    Optimize::Retrain,
                    cache,
                    budget,
                    &progress,
                )
                .await?
            }
            Task::Compact { bins } => {
                let (_, m) = crate::rewrite::compact::execute(snapshot, bins, &progress).await?;
                return self
                    .done_with_data(snapshot, &before, m.rows_rewritten, m.version)
                    .await;
            }
            Task::Vacuum {
                retain,
                grace_seconds,
            } => {
                let m = vacuum(
                    &snapshot.dir,
                    Some(*retain),
                    Duration::from_secs(*grace_seconds),
                    &progress,
                )
                .await?;
                facts::vacuumed_now(snapshot);
                return Ok(Done {
                    rows: 0,
                    bytes: m.bytes_removed,
                    version: snapshot.version(),
                    nothing: m.files_removed == 0 && m.versions_removed == 0,
                });
            }
        };
        // Index tasks: the segment files written (other writers add no segments).
        let after = self.latest_snapshot(snapshot.name()).await?;
        Ok(Done {
            rows,
            bytes: new_bytes(&before, &after.manifest, false),
            version: after.version(),
            nothing: rows == 0,
        })
    }

    /// The result of a rewrite that committed `version`: the data files it added.
    async fn done_with_data(
        &self,
        snapshot: &Snapshot,
        before: &Manifest,
        rows: u64,
        version: u64,
    ) -> Result<Done> {
        let after = snapshot.dir.load_manifest(version).await?;
        Ok(Done {
            rows,
            bytes: new_bytes(before, &after, true),
            version,
            nothing: rows == 0,
        })
    }
}

/// Bytes of the files `after` has and `before` has not: data files (`data`) or segment
/// files.
fn new_bytes(before: &Manifest, after: &Manifest, data: bool) -> u64 {
    if data {
        let old: HashSet<&str> = before
            .fragments
            .iter()
            .flat_map(|f| f.files.iter().map(|d| d.path.as_str()))
            .collect();
        after
            .fragments
            .iter()
            .flat_map(|f| f.files.iter())
            .filter(|d| !old.contains(d.path.as_str()))
            .map(|d| d.size_bytes)
            .sum()
    } else {
        let old: HashSet<&str> = before
            .index_segments
            .iter()
            .map(|s| s.file.as_str())
            .collect();
        after
            .index_segments
            .iter()
            .filter(|s| !old.contains(s.file.as_str()))
            .map(|s| s.size_bytes)
            .sum()
    }
}

fn column(batch: &RecordBatch, name: &str) -> u64 {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
        .map_or(0, |a| a.value(0))
}

/// Awaits `work` while renewing `lease` (if any) every third of its time to live, so a long
/// task keeps the table. A lost lease does not stop the task (its commit is checked like
/// any other); the round stops after it.
async fn renewing<T>(
    work: impl std::future::Future<Output = Result<T>>,
    lease: Option<&mut Lease>,
    dir: &Arc<crate::format::store::TableDir>,
) -> Result<T> {
    let Some(lease) = lease else {
        return work.await;
    };
    let mut work = std::pin::pin!(work);
    let mut held = true;
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tokio::time::sleep(lease.ttl() / 3), if held => {
                held = lease.renew(dir).await.unwrap_or(false);
            }
        }
    }
}

/// `MAINTAIN t [WITH (...)]`: one row per task run, then one per note (kind `note`).
pub async fn maintain_statement(
    session: &FragvecSession,
    table: &str,
    options: &[(String, String)],
) -> Result<StatementResult> {
    let threads = session.options().maintenance_threads;
    let report =
        crate::index::parallel::with_build_threads(threads, session.maintain(table, options))
            .await?;
    let mut records = report.tasks;
    for note in report.notes {
        let mut r = TaskRecord::start("note", note, holder(), 0);
        r.finish("skipped");
        records.push(r);
    }
    let batch = journal_batch(&records)?;
    Ok(StatementResult::rows(journal_schema(), vec![batch]))
}

/// `ALTER TABLE t SET (...)` / `RESET (...)`: every change is checked first (an impossible
/// value or a key that does not compile is an error now, not in a background task), then
/// committed as one ALTER TABLE transaction, retried on conflicts like every statement.
pub async fn alter_properties(
    session: &FragvecSession,
    table: &str,
    changes: &[(String, Option<String>)],
) -> Result<StatementResult> {
    use crate::format::policy::PolicyChange;
    use crate::format::{Operation, Transaction};
    let changes: Vec<PolicyChange> = changes
        .iter()
        .map(|(name, value)| PolicyChange {
            name: name.clone(),
            value: value.clone(),
        })
        .collect();
    let snapshot = session.latest_snapshot(table).await?;
    let mut checked = snapshot.manifest.properties.maintenance.clone();
    checked.apply(&changes).map_err(policy_error)?;
    if let Some(key) = &checked.auto_recluster {
        super::recluster::compile(
            &session.ctx.state(),
            &snapshot,
            std::slice::from_ref(key),
            session.schema.index_cache(),
        )
        .await
        .map_err(|e| {
            plan_datafusion_err!("table property auto_recluster = '{key}' does not compile: {e}")
        })?;
    }
    let changes = &changes;
    session
        .retrying(|| async move {
            let snapshot = session.latest_snapshot(table).await?;
            let mut txn = Transaction::new(Operation::AlterTable, snapshot.version());
            txn.policy_changes = changes.clone();
            crate::format::commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
            Ok(())
        })
        .await?;
    Ok(StatementResult::empty())
}

//! The maintainer: a background scheduler that runs a maintenance round on every table of a
//! database whose policy switches something on, every `interval`. `fragvec serve` starts
//! one; an embedder starts one with [`Maintainer::start`].
//!
//! Its work runs on a runtime of its own, on `threads` threads (`fragvec.maintenance_threads`,
//! default 1) whose scheduling priority is lowered (nice 10), and index builds inside it use
//! that many threads: queries on the server's runtime keep the other cores and win the
//! contended ones. Memory per task is bounded by the table's `auto_step_bytes`.
//!
//! A VACUUM a round finds due runs beside the following rounds (one per table at a time),
//! not in the round: it reads every retained manifest, thousands on a table that commits
//! many times a second, and the rounds keep indexing and compacting meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::Result;
use tokio::sync::watch;

use super::{VacuumIn, holder};
use crate::engine::session::FragvecSession;
use crate::index::parallel::with_build_threads;
use crate::maintain::journal::TaskRecord;

/// Where a maintainer's one-line task logs go.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How a [`Maintainer`] runs.
#[derive(Clone)]
pub struct MaintainerConfig {
    /// Time between the starts of two passes over the database's tables.
    pub interval: Duration,
    /// Threads its tasks use.
    pub threads: usize,
    /// How long its lease on a table lasts unrenewed (how long a table waits for a
    /// maintainer that died).
    pub lease_ttl: Duration,
    /// Where each task's one-line log goes (`None`: nowhere).
    pub log: Option<LogSink>,
}

impl std::fmt::Debug for MaintainerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaintainerConfig")
            .field("interval", &self.interval)
            .field("threads", &self.threads)
            .field("lease_ttl", &self.lease_ttl)
            .field("log", &self.log.is_some())
            .finish()
    }
}

impl Default for MaintainerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            threads: 1,
            lease_ttl: crate::maintain::lease::DEFAULT_TTL,
            log: None,
        }
    }
}

/// A running maintainer; [`Maintainer::stop`] ends it after the task in progress.
pub struct Maintainer {
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Maintainer {
    /// Starts maintaining the database of `session` (with a session of its own sharing the
    /// index cache).
    pub async fn start(session: &FragvecSession, config: MaintainerConfig) -> Result<Self> {
        let session = session.new_sharing().await?;
        let (stop, stopped) = watch::channel(false);
        let threads = config.threads.max(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("fragvec-maintainer")
            .on_thread_start(crate::index::parallel::lower_this_thread_priority)
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("fragvec-maintainer".into())
            .spawn(move || {
                runtime.block_on(with_build_threads(threads, run(session, config, stopped)))
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Asks the maintainer to stop and waits until it has (a running task finishes first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Maintainer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One pass over the tables of `session`'s database on the calling task (`fragvec maintain
/// --interval 0`), with index builds capped at `config.threads` threads.
pub async fn maintain_once(session: &FragvecSession, config: &MaintainerConfig) -> Result<()> {
    let log = |line: &str| {
        if let Some(log) = &config.log {
            log(line)
        }
    };
    let (_keep, stopped) = watch::channel(false);
    let pass = pass(session, config, &log, &stopped, None);
    with_build_threads(config.threads, pass).await
}

async fn run(
    session: FragvecSession,
    config: MaintainerConfig,
    mut stopped: watch::Receiver<bool>,
) {
    let log = |line: &str| {
        if let Some(log) = &config.log {
            log(line)
        }
    };
    let mut vacuums = Vacuums::default();
    loop {
        let pass = pass(&session, &config, &log, &stopped, Some(&mut vacuums));
        if let Err(e) = pass.await {
            log(&format!("maintenance: {e}"));
        }
        tokio::select! {
            _ = tokio::time::sleep(config.interval) => {}
            _ = stopped.changed() => {}
        }
        if *stopped.borrow() {
            // A running VACUUM finishes: stopped midway, it would leave versions listed
            // whose files it had removed.
            for (_, running) in vacuums.0.drain() {
                let _ = running.await;
            }
            return;
        }
    }
}

/// The VACUUMs running beside the rounds, by table.
#[derive(Default)]
struct Vacuums(HashMap<String, tokio::task::JoinHandle<()>>);

impl Vacuums {
    /// Starts `task` on `table` unless a VACUUM of it is still running.
    fn start(
        &mut self,
        session: &FragvecSession,
        config: &MaintainerConfig,
        table: &str,
        task: super::plan::Task,
    ) {
        self.0.retain(|_, running| !running.is_finished());
        if self.0.contains_key(table) {
            return;
        }
        let (session, sink, name) = (session.clone(), config.log.clone(), table.to_string());
        let running = tokio::spawn(async move {
            let line = match session.run_vacuum(&name, task).await {
                Ok(record) => task_line(&name, &record),
                Err(e) => format!("maintenance {name}: {e}"),
            };
            if let Some(log) = sink {
                log(&line);
            }
        });
        self.0.insert(table.to_string(), running);
    }
}

/// A task's one-line log.
fn task_line(table: &str, t: &TaskRecord) -> String {
    format!(
        "maintenance {table}: {} ({}) {} in {} ms, {} rows, {} bytes, {} retries, by {}",
        t.kind,
        t.detail,
        t.outcome,
        t.finished_ms.unwrap_or(t.started_ms) - t.started_ms,
        t.rows,
        t.bytes,
        t.retries,
        holder(),
    )
}

/// One pass over the database's tables; a VACUUM found due starts in `vacuums` when given,
/// else runs in the round.
async fn pass(
    session: &FragvecSession,
    config: &MaintainerConfig,
    log: &dyn Fn(&str),
    stopped: &watch::Receiver<bool>,
    mut vacuums: Option<&mut Vacuums>,
) -> Result<()> {
    let vacuum_in = match vacuums {
        Some(_) => VacuumIn::Caller,
        None => VacuumIn::Round,
    };
    for table in session.database().list_tables().await? {
        if *stopped.borrow() {
            break;
        }
        // A table dropped since the listing is not an error.
        let Ok(snapshot) = session.latest_snapshot(&table).await else {
            continue;
        };
        if !snapshot.manifest.properties.maintenance.is_active() {
            continue;
        }
        let round = session.maintain_leased(&table, &[], config.lease_ttl, vacuum_in);
        match round.await {
            Ok(report) => {
                for t in &report.tasks {
                    log(&task_line(&table, t));
                }
                if let (Some(vacuums), Some(task)) = (vacuums.as_deref_mut(), report.vacuum) {
                    vacuums.start(session, config, &table, task);
                }
            }
            Err(e) => log(&format!("maintenance {table}: {e}")),
        }
    }
    Ok(())
}

//! The maintainer: a background scheduler that runs a maintenance round on every table of a
//! database whose policy switches something on, every `interval`. `fragvec serve` starts
//! one; an embedder starts one with [`Maintainer::start`].
//!
//! Its work runs on a runtime of its own, on `threads` threads (`fragvec.maintenance_threads`,
//! default 1) whose scheduling priority is lowered (nice 10), and index builds inside it use
//! that many threads: queries on the server's runtime keep the other cores and win the
//! contended ones. Memory per task is bounded by the table's `auto_step_bytes`.

use std::sync::Arc;
use std::time::Duration;

use datafusion::common::Result;
use tokio::sync::watch;

use super::holder;
use crate::engine::session::FragvecSession;
use crate::index::parallel::with_build_threads;

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
            .on_thread_start(lower_priority)
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
    with_build_threads(config.threads, pass(session, config, &log, &stopped)).await
}

/// Nice 10 for the calling thread (Linux applies nice per thread); best effort.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
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
    loop {
        if let Err(e) = pass(&session, &config, &log, &stopped).await {
            log(&format!("maintenance: {e}"));
        }
        tokio::select! {
            _ = tokio::time::sleep(config.interval) => {}
            _ = stopped.changed() => {}
        }
        if *stopped.borrow() {
            return;
        }
    }
}

/// One pass over the database's tables.
async fn pass(
    session: &FragvecSession,
    config: &MaintainerConfig,
    log: &dyn Fn(&str),
    stopped: &watch::Receiver<bool>,
) -> Result<()> {
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
        match session.maintain_leased(&table, &[], config.lease_ttl).await {
            Ok(report) => {
                for t in &report.tasks {
                    log(&format!(
                        "maintenance {table}: {} ({}) {} in {} ms, {} rows, {} bytes, {} retries, by {}",
                        t.kind,
                        t.detail,
                        t.outcome,
                        t.finished_ms.unwrap_or(t.started_ms) - t.started_ms,
                        t.rows,
                        t.bytes,
                        t.retries,
                        holder(),
                    ));
                }
            }
            Err(e) => log(&format!("maintenance {table}: {e}")),
        }
    }
    Ok(())
}

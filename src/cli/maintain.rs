//! `fragvec maintain`: the maintainer in the foreground, for a database that no `fragvec
//! serve` maintains (a sidecar, a cron job with `--interval 0`). It runs rounds on every
//! table whose properties switch maintenance on, logs one line per task to stderr, and on
//! SIGTERM or Ctrl-C finishes the task in progress and exits. Any number of maintainers may
//! run against one database: the tables' leases let one act on a table at a time.

use std::sync::Arc;
use std::time::Duration;

use crate::FragvecSession;
use crate::engine::maintain::scheduler::maintain_once;
use crate::engine::maintain::{Maintainer, MaintainerConfig};

/// What `fragvec maintain --help` ends with.
pub const EXAMPLES: &str = "\
Examples:
  fragvec --db mydb maintain                      every 10 s until SIGTERM
  fragvec --db s3://bucket/db maintain --interval 0   one pass, then exit (cron)

Tables are maintained once their properties say so: ALTER TABLE t SET (auto_index = on, ...).
See docs/maintenance.md.";

/// Options of `fragvec maintain`.
#[derive(clap::Args, Debug, Clone)]
pub struct MaintainArgs {
    /// Seconds between passes over the tables; 0: one pass, then exit.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub interval: f64,
    /// Threads the tasks use, at lowered priority.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds a maintainer's lease on a table lasts unrenewed: how long the table waits
    /// for a maintainer that died before another takes over.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub lease_seconds: u64,
}

/// `fragvec maintain`: maintains the database of `session` until SIGTERM or Ctrl-C.
pub async fn run(session: FragvecSession, args: &MaintainArgs) -> Result<(), String> {
    if !(args.interval.is_finite() && args.interval >= 0.0) {
        return Err(format!(
            "--interval must be a number of seconds, not {}",
            args.interval
        ));
    }
    if args.lease_seconds == 0 {
        return Err("--lease-seconds must be at least 1".into());
    }
    let config = MaintainerConfig {
        interval: Duration::from_secs_f64(args.interval),
        threads: args.threads.max(1),
        lease_ttl: Duration::from_secs(args.lease_seconds),
        log: Some(Arc::new(|line: &str| eprintln!("{line}"))),
    };
    if args.interval == 0.0 {
        return maintain_once(&session, &config)
            .await
            .map_err(|e| e.to_string());
    }
    let maintainer = Maintainer::start(&session, config)
        .await
        .map_err(|e| format!("cannot start the maintainer: {e}"))?;
    eprintln!(
        "fragvec maintain: maintaining {}",
        session.database().location()
    );
    super::serve::wait_for_signal().await;
    tokio::task::spawn_blocking(move || maintainer.stop())
        .await
        .map_err(|e| e.to_string())
}

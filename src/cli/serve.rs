//! `fragvec serve --db URL [--pg ADDR] [--flight ADDR]`: the PostgreSQL-protocol server
//! and, with `--flight`, the Arrow Flight SQL endpoint (see [`crate::serve`]). Prints
//! `fragvec serve listening on postgresql://ADDR` (then `... on grpc://ADDR` for Flight)
//! once it accepts connections, serves until SIGTERM or Ctrl-C, then lets running statements finish (up to
//! `--shutdown-grace`) and exits 0.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::FragvecSession;
use crate::engine::maintain::{Maintainer, MaintainerConfig};
use crate::serve::auth::{Authentication, TlsFiles, Users};
use crate::serve::files::AllowedFiles;
use crate::serve::{PgServer, PgServerConfig};

/// What `fragvec serve --help` ends with.
pub const EXAMPLES: &str = "\
Examples:
  fragvec --db mydb serve                              psql -h 127.0.0.1 -p 5433 -U fragvec
  fragvec --db mydb serve --pg 127.0.0.1:0 --flight 127.0.0.1:0   any free ports, printed at start
  FRAGVEC_PASSWORD=secret fragvec --db mydb serve --pg 0.0.0.0:5433 --tls-cert c.pem --tls-key k.pem
  fragvec --db mydb serve --users users.txt --allow-files /data/imports --statement-timeout 30000
  fragvec --db mydb serve --maintenance-interval 5    tables with ALTER TABLE t SET (auto_index = on)

Clients: docs/serving.md (PostgreSQL), docs/flight-sql.md (Flight SQL).";

/// Options of `fragvec serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address of the PostgreSQL endpoint (port 0: any free port; the line printed at start
    /// tells which).
    #[arg(long, default_value = "127.0.0.1:5433")]
    pub pg: SocketAddr,
    /// Address of the Arrow Flight SQL endpoint (ADBC, pyarrow, JDBC Flight SQL clients);
    /// off unless given. Same users, TLS and --allow-files as the PostgreSQL endpoint.
    #[cfg(feature = "flight")]
    #[arg(long)]
    pub flight: Option<SocketAddr>,
    /// Seconds a Flight SQL session's bearer token stays valid unused; the client then
    /// authenticates again (Handshake).
    #[cfg(feature = "flight")]
    #[arg(long, default_value_t = 3600, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub flight_token_ttl: u64,
    /// Users allowed to connect, one `name:password` per line (SCRAM-SHA-256). Without it
    /// and without FRAGVEC_PASSWORD, anyone reaching the address may connect, so only a
    /// loopback address is allowed.
    #[arg(long)]
    pub users: Option<PathBuf>,
    /// Connections served at once; more are refused (SQLSTATE 53300).
    #[arg(long, default_value_t = 100)]
    pub max_connections: usize,
    /// Default statement_timeout in milliseconds (0: none); sessions may SET their own.
    #[arg(long, default_value_t = 0)]
    pub statement_timeout: u64,
    /// Seconds SIGTERM waits for running statements before exiting.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
    /// TLS certificate chain (PEM); with --tls-key, clients may use sslmode=require.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A directory whose files clients may read (CREATE EXTERNAL TABLE) and write (COPY ...
    /// TO); may be given several times. Without it clients may name no server file.
    #[arg(long = "allow-files", value_name = "DIR")]
    pub allow_files: Vec<PathBuf>,
    /// Seconds between the maintainer's passes over the tables whose properties switch
    /// maintenance on (ALTER TABLE t SET (auto_index = on, ...)); 0: no maintainer.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub maintenance_interval: f64,
    /// Threads the maintainer's tasks use, at lowered priority.
    #[arg(long, default_value_t = 1)]
    pub maintenance_threads: usize,
}

/// The authentication `args` and the environment ask for: `--users FILE`, or
/// `FRAGVEC_PASSWORD` for one user (`FRAGVEC_USER`, default `fragvec`).
fn authentication(args: &ServeArgs) -> Result<Authentication, String> {
    if let Some(path) = &args.users {
        return Ok(Authentication::Scram(Arc::new(Users::from_file(path)?)));
    }
    if let Ok(password) = std::env::var("FRAGVEC_PASSWORD")
        && !password.is_empty()
    {
        let user = std::env::var("FRAGVEC_USER").unwrap_or_else(|_| "fragvec".into());
        return Ok(Authentication::Scram(Arc::new(Users::new([(
            user, password,
        )]))));
    }
    Ok(Authentication::Trust)
}

/// The database's name as clients see it: the last part of its location.
fn database_name(location: &str) -> String {
    let trimmed = location.trim_end_matches('/');
    let name = trimmed.rsplit(['/', ':']).next().unwrap_or("fragvec");
    if name.is_empty() {
        "fragvec".into()
    } else {
        name.into()
    }
}

/// `fragvec serve`: serves the database of `session` (at `location`) until SIGTERM or Ctrl-C.
pub async fn run(session: FragvecSession, args: &ServeArgs, location: &str) -> Result<(), String> {
    let mut config = PgServerConfig::new(args.pg);
    config.max_connections = args.max_connections.max(1);
    config.statement_timeout_ms = args.statement_timeout;
    config.shutdown_grace = Duration::from_secs(args.shutdown_grace);
    config.authentication = authentication(args)?;
    config.database_name = database_name(location);
    config.allow_files = AllowedFiles::new(&args.allow_files)?;
    config.tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    #[cfg(feature = "flight")]
    let flight = match args.flight {
        Some(listen) => {
            let mut flight = crate::serve::flight::FlightServerConfig::new(listen);
            flight.authentication = config.authentication.clone();
            flight.tls = config.tls.clone();
            flight.allow_files = config.allow_files.clone();
            flight.statement_timeout_ms = config.statement_timeout_ms;
            flight.token_ttl = Duration::from_secs(args.flight_token_ttl);
            Some(crate::serve::flight::FlightServer::bind(session.clone(), flight).await?)
        }
        None => None,
    };
    let maintainer = start_maintainer(&session, args).await?;
    let server = PgServer::bind(session, config).await?;
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "fragvec serve listening on postgresql://{addr}");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    #[cfg(feature = "flight")]
    let flight = match flight {
        Some(flight) => {
            let addr = flight.local_addr().map_err(|e| e.to_string())?;
            let scheme = if args.tls_cert.is_some() {
                "grpc+tls"
            } else {
                "grpc"
            };
            let _ = writeln!(out, "fragvec serve listening on {scheme}://{addr}");
            Some(tokio::spawn(flight.serve(stopped.clone())))
        }
        None => None,
    };
    let _ = out.flush();
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = stop.send(true);
    });
    let served = server.serve(stopped).await.map_err(|e| e.to_string());
    if let Some(maintainer) = maintainer {
        // Waits for the task in progress (its commit lands or it does not; nothing is half).
        let _ = tokio::task::spawn_blocking(move || maintainer.stop()).await;
    }
    #[cfg(feature = "flight")]
    if let Some(flight) = flight {
        // Stopped by the same signal; its running calls finish within its own shutdown.
        let grace = Duration::from_secs(args.shutdown_grace);
        if let Ok(Ok(Err(e))) = tokio::time::timeout(grace, flight).await {
            return Err(e);
        }
    }
    served
}

/// The maintainer of the database (see `crate::engine::maintain`), logging a line per task
/// to stderr; `None` with `--maintenance-interval 0`.
async fn start_maintainer(
    session: &FragvecSession,
    args: &ServeArgs,
) -> Result<Option<Maintainer>, String> {
    if !(args.maintenance_interval.is_finite() && args.maintenance_interval >= 0.0) {
        return Err(format!(
            "--maintenance-interval must be a number of seconds, not {}",
            args.maintenance_interval
        ));
    }
    if args.maintenance_interval == 0.0 {
        return Ok(None);
    }
    let config = MaintainerConfig {
        interval: Duration::from_secs_f64(args.maintenance_interval),
        threads: args.maintenance_threads.max(1),
        log: Some(Arc::new(|line: &str| eprintln!("{line}"))),
        ..Default::default()
    };
    Maintainer::start(session, config)
        .await
        .map(Some)
        .map_err(|e| format!("cannot start the maintainer: {e}"))
}

pub(super) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

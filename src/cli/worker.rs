//! `fragvec worker --listen ADDR [--db URL]`: serves the tasks of distributed queries.
//!
//! Prints `fragvec worker listening on http://ADDR` (the bound address, so `--listen
//! 127.0.0.1:0` tells which port it got) and serves until the process ends. With `--db` the
//! worker opens that database at start (failing fast when it cannot) and refuses plans over
//! any other; without it, it opens each database a coordinator names.
//!
//! On `SIGUSR1` the worker prints, for each database it serves, the bytes its index cache
//! holds (`fragvec worker cache: LOCATION BYTES`), so an operator (or the scale-out
//! benchmark) can see which share of an index each worker keeps.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::distributed::coordinator::absolute_location;
use crate::distributed::databases::Databases;
use crate::distributed::worker::{bind, serve};

/// `fragvec worker`: runs query tasks for coordinators on `listen` (over `db` only, when
/// given) until SIGTERM or Ctrl-C.
pub async fn run(listen: SocketAddr, db: Option<&str>) -> Result<(), String> {
    let databases = match db {
        Some(location) => {
            let location = absolute_location(location).map_err(|e| e.to_string())?;
            let databases = Databases::new(Some(location.clone()));
            databases.open(&location).await.map_err(|e| e.to_string())?;
            databases
        }
        None => Databases::new(None),
    };
    let (incoming, addr) = bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "fragvec worker listening on http://{addr}");
    let _ = out.flush();
    let databases = Arc::new(databases);
    report_caches_on_signal(databases.clone());
    serve(incoming, databases, std::future::pending())
        .await
        .map_err(|e| e.to_string())
}

/// Prints each served database's cache bytes on stdout at every `SIGUSR1` (Unix only).
fn report_caches_on_signal(databases: Arc<Databases>) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
            return;
        };
        while usr1.recv().await.is_some() {
            let mut out = std::io::stdout().lock();
            for (location, bytes) in databases.cache_bytes() {
                let _ = writeln!(out, "fragvec worker cache: {location} {bytes}");
            }
            let _ = writeln!(out, "fragvec worker cache: end");
            let _ = out.flush();
        }
    });
    #[cfg(not(unix))]
    let _ = databases;
}

//! `fragvec worker --listen ADDR [--db URL]`: serves the tasks of distributed queries.
//!
//! Prints `fragvec worker listening on http://ADDR` (the bound address, so `--listen
//! 127.0.0.1:0` tells which port it got) and serves until the process ends. With `--db` the
//! worker opens that database at start (failing fast when it cannot) and refuses plans over
//! any other; without it, it opens each database a coordinator names.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::distributed::coordinator::absolute_location;
use crate::distributed::databases::Databases;
use crate::distributed::worker::{bind, serve};

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
    serve(incoming, Arc::new(databases), std::future::pending())
        .await
        .map_err(|e| e.to_string())
}

//! A `fragvec serve` process for the client tests: started on free ports, its addresses read
//! from the lines it prints at start, stopped with SIGTERM (which must exit 0).

// Each test crate that includes this uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub struct ServeProcess {
    child: Child,
    /// What it printed: `postgresql://ADDR`, then `grpc://ADDR` with `--flight`.
    pub addresses: Vec<String>,
}

impl ServeProcess {
    /// Starts `fragvec --db DB serve --pg 127.0.0.1:0 ARGS...` and waits for its `lines`
    /// "listening on" lines.
    pub fn start(db: &Path, args: &[&str], lines: usize) -> ServeProcess {
        Self::start_with_env(db, args, lines, &[])
    }

    /// As `start`, with `env` added to the server's environment (`FRAGVEC_PASSWORD`, say).
    pub fn start_with_env(
        db: &Path,
        args: &[&str],
        lines: usize,
        env: &[(&str, &str)],
    ) -> ServeProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fragvec"))
            .args(["--db", db.to_str().unwrap(), "serve", "--pg", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fragvec serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut addresses = vec![];
        for _ in 0..lines {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            let address = line
                .trim()
                .rsplit(' ')
                .next()
                .filter(|a| a.contains("://"))
                .unwrap_or_else(|| panic!("unexpected line from fragvec serve: {line:?}"));
            addresses.push(address.to_string());
        }
        ServeProcess { child, addresses }
    }

    /// The address printed for `scheme` (`postgresql`, `grpc`), as `scheme://host:port`.
    pub fn address(&self, scheme: &str) -> &str {
        let prefix = format!("{scheme}://");
        self.addresses
            .iter()
            .find(|a| a.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {scheme} address in {:?}", self.addresses))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM: the server stops accepting, lets running statements finish, exits 0.
    pub fn stop(mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on the child's own pid.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "fragvec serve exited with {status} after SIGTERM"
        );
    }
}

impl ServeProcess {
    /// Waits for a server that was told to stop (by a client's SIGTERM, say) to exit, and
    /// checks it exited 0 within `limit`.
    pub fn wait_for_exit(mut self, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "fragvec serve exited with {status}");
                return;
            }
            assert!(
                start.elapsed() < limit,
                "fragvec serve still runs {limit:?} after it was told to stop"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The port of the PostgreSQL endpoint.
    pub fn pg_port(&self) -> u16 {
        self.address("postgresql")
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port in the postgresql address")
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// The Python of the client virtualenv (`FRAGVEC_PG_PYTHON`, set by
/// `eval "$(.ci/pg-clients setup)"`); `None` after saying the tests are skipped, unless
/// `FRAGVEC_REQUIRE_PG_CLIENTS` makes a missing client a failure.
pub fn client_python() -> Option<String> {
    match std::env::var("FRAGVEC_PG_PYTHON") {
        Ok(p) => Some(p),
        Err(_) => {
            assert!(
                std::env::var("FRAGVEC_REQUIRE_PG_CLIENTS").is_err(),
                "FRAGVEC_REQUIRE_PG_CLIENTS is set but FRAGVEC_PG_PYTHON is not: run `eval \"$(.ci/pg-clients setup)\"`"
            );
            eprintln!(
                "skipping: no client virtualenv (eval \"$(.ci/pg-clients setup)\" to run these)"
            );
            None
        }
    }
}

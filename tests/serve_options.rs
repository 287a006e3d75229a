//! `fragvec serve`'s own options, each on a server of its own, driven by real clients
//! (psycopg 3 and asyncpg; `tests/pg_clients/server_options.py`): a password from
//! `FRAGVEC_PASSWORD` (wrong ones refused with 28P01), `--max-connections` (53300 past it),
//! a server-wide `--statement-timeout`, and SIGTERM letting a running statement finish.
//!
//! Without the clients (`FRAGVEC_PG_PYTHON` unset) each test says so and passes, unless
//! `FRAGVEC_REQUIRE_PG_CLIENTS=1`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[path = "support/server.rs"]
mod server;

use server::ServeProcess;

/// Runs `server_options.py` part `part` against `server` with `env` added.
fn run_part(python: &str, server: &ServeProcess, part: &str, env: &[(&str, String)]) {
    let out = Command::new(python)
        .arg("server_options.py")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pg_clients"))
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", server.pg_port().to_string())
        .env("PGUSER", "fragvec")
        .env("PGDATABASE", "fragvec")
        .env("PGCONNECT_TIMEOUT", "10")
        .env_remove("PGPASSWORD")
        .env("FV_TARGET", "fragvec")
        .env("FV_PART", part)
        .envs(env.iter().map(|(k, v)| (k, v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("cannot run server_options.py: {e}"));
    assert!(
        out.status.success(),
        "server_options.py {part} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_password_from_the_environment_admits_only_its_user() {
    let Some(python) = server::client_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let password = "pw-from-env-7";
    let server = ServeProcess::start_with_env(
        &dir.path().join("db"),
        &[],
        1,
        &[("FRAGVEC_USER", "ann"), ("FRAGVEC_PASSWORD", password)],
    );
    run_part(
        &python,
        &server,
        "auth",
        &[("PGUSER", "ann".into()), ("PGPASSWORD", password.into())],
    );
    server.stop();
}

#[test]
fn connections_past_max_connections_are_refused() {
    let Some(python) = server::client_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &["--max-connections", "2"], 1);
    run_part(&python, &server, "max_connections", &[]);
    server.stop();
}

#[test]
fn the_server_statement_timeout_is_every_session_default() {
    let Some(python) = server::client_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &["--statement-timeout", "300"], 1);
    run_part(&python, &server, "statement_timeout", &[]);
    server.stop();
}

#[test]
fn sigterm_lets_a_running_statement_finish() {
    let Some(python) = server::client_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &["--shutdown-grace", "60"], 1);
    // The script sends the SIGTERM itself, while its statement runs.
    run_part(
        &python,
        &server,
        "drain",
        &[("FV_SERVER_PID", server.pid().to_string())],
    );
    server.wait_for_exit(Duration::from_secs(30));
}

//! `fragvec serve --flight` driven by a real Flight SQL client nobody here wrote: ADBC's
//! driver (`adbc-driver-flightsql`, with pyarrow) running `tests/flight_clients/adbc_flight.py`
//! — DDL, parameters, KNN with a bound vector, bulk ingest of 1M rows then an index and an
//! exact KNN, metadata, errors, cancel, and username/password on a second server.
//!
//! The client lives in the virtualenv `.ci/pg-clients setup` makes (which `.ci/run` calls).
//! Without it (`FRAGVEC_PG_PYTHON` unset) the test says so and passes, unless
//! `FRAGVEC_REQUIRE_PG_CLIENTS=1`.

#[path = "support/server.rs"]
mod server;

use std::path::Path;
use std::process::Command;

use server::ServeProcess;

#[test]
fn adbc_flight_sql_client_against_fragvec_serve() {
    let Some(python) = server::client_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let open = ServeProcess::start(&dir.path().join("open"), &["--flight", "127.0.0.1:0"], 2);
    let users = dir.path().join("users");
    // A password whose user:password length is not a multiple of 3: the Go client sends
    // basic credentials unpadded, which the server must read.
    std::fs::write(&users, "ann:secret-pw\n").unwrap();
    let guarded = ServeProcess::start(
        &dir.path().join("guarded"),
        &[
            "--flight",
            "127.0.0.1:0",
            "--users",
            users.to_str().unwrap(),
        ],
        2,
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/flight_clients/adbc_flight.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("FRAGVEC_FLIGHT_URI", open.address("grpc"))
        .env("FRAGVEC_FLIGHT_AUTH_URI", guarded.address("grpc"))
        .env("FRAGVEC_FLIGHT_USER", "ann")
        .env("FRAGVEC_FLIGHT_PASSWORD", "secret-pw")
        .env("FRAGVEC_SERVER_PID", open.pid().to_string())
        .env("FV_ROWS", "1000000")
        .env("FV_TIMEOUT", "900")
        .output()
        .expect("run adbc_flight.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "adbc_flight.py failed:\n{stdout}\n{stderr}"
    );
    open.stop();
    guarded.stop();
}

/// A non-loopback Flight address without users is refused at start, like the Postgres one.
#[test]
fn refuses_to_serve_flight_openly_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .args(["--db", dir.path().join("db").to_str().unwrap()])
        .args(["serve", "--pg", "127.0.0.1:0", "--flight", "0.0.0.0:0"])
        .env_remove("FRAGVEC_PASSWORD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("without authentication"), "{stderr}");
}

//! `fragvec serve` driven by real PostgreSQL clients nobody here wrote: psycopg 3 with
//! pgvector, asyncpg, and Debian's psql (the scripts are in `tests/pg_clients/`, their
//! virtualenv is made by `.ci/pg-clients setup`, which `.ci/run` calls).
//!
//! Without the clients (`FRAGVEC_PG_PYTHON` unset) the test says so and passes, unless
//! `FRAGVEC_REQUIRE_PG_CLIENTS=1` (CI sets it when the clients could be installed).

use std::path::Path;
use std::process::Command;

#[path = "support/server.rs"]
mod server;

use server::ServeProcess;

/// A `fragvec serve` the client scripts connect to.
struct Server {
    process: ServeProcess,
    port: u16,
}

impl Server {
    fn start(db: &Path) -> Server {
        let process = ServeProcess::start(db, &[], 1);
        let port = process
            .address("postgresql")
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap();
        Server { process, port }
    }

    fn client(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pg_clients"))
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", self.port.to_string())
            .env("PGUSER", "fragvec")
            .env("PGDATABASE", "fragvec")
            .env("PGCONNECT_TIMEOUT", "10")
            .env("FV_TARGET", "fragvec");
        c
    }

    /// SIGTERM: the server stops accepting, lets running statements finish, exits 0.
    fn stop(self) {
        self.process.stop();
    }
}

fn clients() -> Option<(String, String)> {
    let psql = std::env::var("FRAGVEC_PSQL").unwrap_or_else(|_| "psql".into());
    server::client_python().map(|python| (python, psql))
}

fn run_ok(mut c: Command, what: &str) -> String {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    stdout
}

#[test]
fn real_clients_against_fragvec_serve() {
    let Some((python, psql)) = clients() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("fragvec"));
    for script in [
        "psycopg_pgvector.py",
        "statements.py",
        "copy_in.py",
        "copy_out.py",
        "asyncpg_vector.py",
        "concurrent_model.py",
        "limits.py",
        "hostile.py",
    ] {
        run_ok(server.client(&python, &[script]), script);
    }
    // psql's backslash commands (\dt, \d, \d TABLE, \l), a KNN query, errors' SQLSTATEs.
    let mut smoke = server.client("bash", &["psql_smoke.sh"]);
    smoke.env("FRAGVEC_PSQL", &psql);
    run_ok(smoke, "psql_smoke.sh");

    // psql: tables, a KNN query, and an error's SQLSTATE.
    let psql_c = |sql: &str| server.client(&psql, &["-X", "-v", "ON_ERROR_STOP=1", "-c", sql]);
    run_ok(
        psql_c("CREATE TABLE docs (id BIGINT, emb VECTOR(3))"),
        "psql CREATE TABLE",
    );
    let inserted = run_ok(
        psql_c("INSERT INTO docs VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0,0,1]')"),
        "psql INSERT",
    );
    assert!(inserted.contains("INSERT 0 3"), "{inserted}");
    // psql's \copy streams a client-side file through COPY FROM STDIN.
    let csv = dir.path().join("more.csv");
    std::fs::write(&csv, "id,emb\n4,\"[1,1,0]\"\n5,\"[0,1,1]\"\n").unwrap();
    let copied = run_ok(
        psql_c(&format!(
            "\\copy docs (id, emb) FROM '{}' WITH (FORMAT csv, HEADER true)",
            csv.display()
        )),
        "psql \\copy",
    );
    assert!(copied.contains("COPY 2"), "{copied}");
    // ... and `\copy ... TO` a client-side file through COPY TO STDOUT.
    let exported = dir.path().join("exported.csv");
    let copied = run_ok(
        psql_c(&format!(
            "\\copy (SELECT id, emb FROM docs ORDER BY id) TO '{}' WITH (FORMAT csv, HEADER true)",
            exported.display()
        )),
        "psql \\copy TO",
    );
    assert!(copied.contains("COPY 5"), "{copied}");
    let csv_out = std::fs::read_to_string(&exported).unwrap();
    assert_eq!(
        csv_out.lines().take(2).collect::<Vec<_>>(),
        ["id,emb", "1,\"[1,0,0]\""],
        "{csv_out}"
    );
    assert_eq!(csv_out.lines().count(), 6, "{csv_out}");
    let deleted = run_ok(psql_c("DELETE FROM docs WHERE id > 3"), "psql DELETE");
    assert!(deleted.contains("DELETE 2"), "{deleted}");
    let listed = run_ok(psql_c("\\dt"), "psql \\dt");
    assert!(
        listed.contains("docs") && listed.contains("table"),
        "{listed}"
    );
    let knn = run_ok(
        psql_c("SELECT id FROM docs ORDER BY emb <-> '[0,0.9,0.1]' LIMIT 1"),
        "psql KNN",
    );
    assert!(knn.contains(" 2\n") && knn.contains("(1 row)"), "{knn}");
    // fragvec's index statement reports the rows it indexed, as in the CLI.
    let indexed = run_ok(
        psql_c(
            "CREATE VECTOR INDEX docs_idx ON docs (emb) USING IVF_FLAT WITH (num_partitions = 1)",
        ),
        "psql CREATE VECTOR INDEX",
    );
    assert!(indexed.contains('3'), "{indexed}");
    let plan = run_ok(
        psql_c("EXPLAIN SELECT id FROM docs ORDER BY emb <-> '[0,1,0]' LIMIT 1"),
        "psql EXPLAIN",
    );
    assert!(plan.contains("KnnExec"), "{plan}");
    let out = server
        .client(
            &psql,
            &[
                "-X",
                "-v",
                "VERBOSITY=verbose",
                "-c",
                "SELECT * FROM no_such_table",
            ],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("42P01"), "{err}");
    server.stop();
}

/// A non-loopback address without authentication is refused at start, with the reason.
#[test]
fn refuses_to_listen_openly_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .args([
            "--db",
            dir.path().join("db").to_str().unwrap(),
            "serve",
            "--pg",
            "0.0.0.0:0",
        ])
        .env_remove("FRAGVEC_PASSWORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("without authentication"), "{err}");
}

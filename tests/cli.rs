//! The `fragvec` binary: output formats, error lines and exit codes, and processes racing
//! commits on one table (on a local directory and on the test S3 server).

use std::process::Command;

#[macro_use]
mod support;
use support::Location;

fn fragvec(db: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .expect("run fragvec");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn statements_run_in_order_and_print_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let (code, _, err) = fragvec(
        &db,
        &[
            "-c",
            "CREATE TABLE t (id BIGINT, v VECTOR(2))",
            "-c",
            "INSERT INTO t VALUES (1, [1, 2]), (2, NULL)",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = fragvec(&db, &["--format", "json", "-c", "SELECT id, v FROM t"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "{\"id\":1,\"v\":[1.0,2.0]}\n{\"id\":2}\n");
    let (code, out, _) = fragvec(&db, &["--format", "csv", "-c", "SELECT id FROM t"]);
    assert_eq!(code, 0);
    assert_eq!(out, "id\n1\n2\n");
}

#[test]
fn an_error_names_the_statement_and_fails_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let script = dir.path().join("script.sql");
    std::fs::write(&script, "CREATE TABLE t (id BIGINT);\nINSERT INTO t VALUES (1);\nSELECT nope FROM t;\nINSERT INTO t VALUES (2);\n")
        .unwrap();
    let (code, _, err) = fragvec(&db, &["-f", script.to_str().unwrap()]);
    assert_eq!(code, 1);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("error: statement 3:") && lines[0].contains("nope"),
        "{err}"
    );
    // Statements after the failing one did not run.
    let (_, out, _) = fragvec(
        &db,
        &["--format", "csv", "-c", "SELECT count(*) AS n FROM t"],
    );
    assert_eq!(out, "n\n1\n");
}

#[test]
fn bad_sql_is_a_parse_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = fragvec(dir.path().join("db"), &["-c", "SELEC 1"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: statement 1:") && !err.contains("panicked"),
        "{err}"
    );
}

on_local_and_s3!(processes_racing_commits_lose_nothing);
/// Three processes commit to one table at once: one appends rows one statement at a time,
/// one updates rows, one deletes rows. Every interleaving gives the same table, so the result
/// shows that no commit was lost and no deleted row came back, whichever process won each
/// race for a version.
async fn processes_racing_commits_lose_nothing(db: Location) {
    let url = db.url();
    let (code, _, err) = fragvec(
        url,
        &[
            "-c",
            "CREATE TABLE t (id BIGINT, v BIGINT) WITH (max_rows_per_fragment = 8)",
            "-c",
            "INSERT INTO t SELECT value, 0 FROM generate_series(0, 39)",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let inserts: Vec<String> = (100..110)
        .map(|i| format!("INSERT INTO t VALUES ({i}, 0)"))
        .collect();
    let retries = "SET fragvec.commit_retries = 100";
    let update = "UPDATE t SET v = v + 1 WHERE id < 40";
    let scripts: Vec<Vec<&str>> = vec![
        inserts.iter().map(String::as_str).collect(),
        vec![retries, update, update, update],
        vec![
            retries,
            "DELETE FROM t WHERE id % 4 = 0 AND id < 40",
            "DELETE FROM t WHERE id % 4 = 1 AND id < 40",
        ],
    ];
    let children: Vec<_> = scripts
        .iter()
        .map(|statements| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_fragvec"));
            command.arg("--db").arg(url);
            for s in statements {
                command.arg("-c").arg(s);
            }
            command
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run fragvec")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (code, out, err) = fragvec(
        url,
        &["--format", "csv", "-c", "SELECT id, v FROM t ORDER BY id"],
    );
    assert_eq!(code, 0, "{err}");
    let mut expected = String::from("id,v\n");
    for id in (0..40).filter(|i| i % 4 >= 2) {
        expected.push_str(&format!("{id},3\n"));
    }
    for id in 100..110 {
        expected.push_str(&format!("{id},0\n"));
    }
    assert_eq!(out, expected);
}

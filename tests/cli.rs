//! The `fragvec` binary: output formats, error lines and exit codes.

use std::process::Command;

fn fragvec(db: &std::path::Path, args: &[&str]) -> (i32, String, String) {
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
    let (code, _, err) = fragvec(&dir.path().join("db"), &["-c", "SELEC 1"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: statement 1:") && !err.contains("panicked"),
        "{err}"
    );
}

//! The `fragvec` binary: output formats, error lines and exit codes, `--timing`, progress on
//! stderr, the shell's backslash commands fed on stdin, and processes racing commits on one
//! table (on a local directory and on the test S3 server).

use std::io::Write;
use std::process::{Command, Stdio};

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
    assert_eq!(out, "{\"id\":1,\"v\":[1.0,2.0]}\n{\"id\":2,\"v\":null}\n");
    let (code, out, _) = fragvec(&db, &["--format", "csv", "-c", "SELECT id FROM t"]);
    assert_eq!(code, 0);
    assert_eq!(out, "id\n1\n2\n");
}

/// A table `t (id, note, v VECTOR(2))` of `rows` rows (every 4th vector NULL, every 3rd note
/// NULL) in a new database; returns the database path.
fn database_with_rows(dir: &tempfile::TempDir, rows: u32) -> std::path::PathBuf {
    let db = dir.path().join("db");
    let insert = format!(
        "INSERT INTO t SELECT value, CASE WHEN value % 3 = 0 THEN NULL ELSE 'n' || value END, \
         CASE WHEN value % 4 = 0 THEN NULL ELSE [value, value % 7] END \
         FROM generate_series(1, {rows})"
    );
    let (code, _, err) = fragvec(
        &db,
        &[
            "-c",
            "CREATE TABLE t (id BIGINT NOT NULL, note VARCHAR, v VECTOR(2)) \
             WITH (max_rows_per_fragment = 500)",
            "-c",
            &insert,
        ],
    );
    assert_eq!(code, 0, "{err}");
    db
}

#[test]
fn json_rows_have_every_key_with_null_for_null() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_with_rows(&dir, 12);
    let (code, out, err) = fragvec(
        &db,
        &[
            "--format",
            "json",
            "-c",
            "SELECT id, note, v, l2_distance(v, [0, 0]) AS d, NULL AS nothing FROM t ORDER BY id",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Map<String, serde_json::Value>> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert_eq!(rows.len(), 12);
    for (i, row) in rows.iter().enumerate() {
        let id = i as i64 + 1;
        // What `jq '.id, .note, .v, .d, .nothing'` reads: every key present in every row.
        let keys: Vec<&str> = row.keys().map(String::as_str).collect();
        assert_eq!(keys, ["d", "id", "note", "nothing", "v"], "{row:?}");
        assert_eq!(row["id"], id);
        assert!(row["nothing"].is_null());
        assert_eq!(row["note"].is_null(), id % 3 == 0, "{row:?}");
        assert_eq!(row["v"].is_null(), id % 4 == 0, "{row:?}");
        assert_eq!(row["d"].is_null(), id % 4 == 0, "{row:?}");
    }
    assert_eq!(rows[0]["v"], serde_json::json!([1.0, 1.0]));
}

#[test]
fn csv_quotes_fields_and_keeps_null_apart_from_empty() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_with_rows(&dir, 2);
    let (code, out, err) = fragvec(
        &db,
        &[
            "--format",
            "csv",
            "-c",
            "SELECT id, v, 'a, \"b\"' AS \"quoted, name\", '' AS empty, NULL AS nothing, \
             'two' || chr(10) || 'lines' AS lines FROM t ORDER BY id",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "id,v,\"quoted, name\",empty,nothing,lines\n\
         1,\"[1.0, 1.0]\",\"a, \"\"b\"\"\",\"\",,\"two\nlines\"\n\
         2,\"[2.0, 2.0]\",\"a, \"\"b\"\"\",\"\",,\"two\nlines\"\n"
    );
}

#[test]
fn timing_prints_each_statements_wall_time_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_with_rows(&dir, 10);
    let (code, out, err) = fragvec(
        &db,
        &[
            "--timing",
            "--format",
            "csv",
            "-c",
            "SELECT count(*) AS n FROM t; SELECT max(id) AS m FROM t",
            "-c",
            "DELETE FROM t WHERE id = 1",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "n\n10\nm\n10\ncount\n1\n", "timing stays off stdout");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    for line in lines {
        let ms = line
            .strip_prefix("Time: ")
            .and_then(|l| l.strip_suffix(" ms"))
            .unwrap_or_else(|| panic!("not a timing line: {line}"));
        let ms: f64 = ms.parse().unwrap();
        assert!(ms > 0.0 && ms < 60_000.0, "{line}");
    }
    let (_, _, err) = fragvec(&db, &["-c", "SELECT 1"]);
    assert!(err.is_empty(), "no timing without --timing: {err}");
}

/// Runs the shell on `db` with `input` as stdin; returns (exit code, stdout, stderr).
fn shell(db: &std::path::Path, home: &std::path::Path, input: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .arg("--db")
        .arg(db)
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fragvec");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn shell_commands_describe_tables_and_toggle_timing() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_with_rows(&dir, 1200);
    let (code, _, err) = fragvec(
        &db,
        &[
            "-c",
            "CREATE VECTOR INDEX vi ON t (v) USING IVF_FLAT WITH (num_partitions = 4, metric = 'cosine')",
            "-c",
            "DELETE FROM t WHERE id <= 10",
            "-c",
            "ALTER TABLE t CLUSTER BY (id % 2)",
            "-c",
            "CREATE VIEW recent AS SELECT id FROM t WHERE id > 1000",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = shell(
        &db,
        dir.path(),
        "\\?\n\\d\n\\d T\n\\d recent\n\\timing\nSELECT\n  count(*) AS n FROM t;\n\\timing\nSELECT 2 AS two;\n\\nope\n\\d missing\n\\q\nSELECT 3;\n",
    );
    assert_eq!(code, 0, "{err}");
    for help in ["\\?", "\\d NAME", "\\timing", "\\q"] {
        assert!(out.contains(help), "\\? lists {help}: {out}");
    }
    // \d: the table and the view.
    assert!(
        out.lines()
            .any(|l| l.contains("| t ") && l.contains("| table") && l.contains("| 1190 ")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("| recent") && l.contains("| view")),
        "{out}"
    );
    // \d t: schema, fragments, indexes, clustering key, version.
    let described = out
        .split("Table \"t\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no description of t: {out}"));
    assert!(described.starts_with(" (version 5)"), "{described}");
    for (column, ty, nullable) in [
        ("id", "Int64", "no"),
        ("note", "Utf8", "yes"),
        ("v", "VECTOR(2)", "yes"),
    ] {
        assert!(
            described.lines().any(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                cells.len() > 3
                    && cells[1] == column
                    && cells[2].starts_with(ty)
                    && cells[3] == nullable
            }),
            "column {column}: {described}"
        );
    }
    assert!(
        described.contains("Fragments: 3 (1200 rows, 10 deleted, 1190 live)"),
        "{described}"
    );
    assert!(
        described.lines().any(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            cells[..]
                == [
                    "", "vi", "v", "IVF_FLAT", "cosine", "4", "1", "900", "0", "0", "",
                ]
        }),
        "index vi: {described}"
    );
    assert!(
        described.contains("Clustering key: (id % 2)"),
        "{described}"
    );
    assert!(
        out.contains("View \"recent\":\nSELECT id FROM t WHERE id > 1000"),
        "{out}"
    );
    // \timing on for one statement, then off.
    assert!(
        out.contains("Timing is on.") && out.contains("Timing is off."),
        "{out}"
    );
    assert!(out.contains("| 1190 |") && out.contains("| 2   |"), "{out}");
    let timings = err.lines().filter(|l| l.starts_with("Time: ")).count();
    assert_eq!(timings, 1, "{err}");
    assert!(err.contains("error: unknown command \\nope"), "{err}");
    assert!(err.contains("'missing' does not exist"), "{err}");
    assert!(!out.contains("Int64(3)"), "\\q ends the shell: {out}");
}

#[test]
fn progress_goes_to_stderr_when_asked_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_with_rows(&dir, 2000);
    let create = "CREATE VECTOR INDEX vi ON t (v) USING IVF_FLAT WITH (num_partitions = 8)";
    let (code, out, err) = fragvec(&db, &["--progress", "always", "-c", create]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "1500 rows affected\n", "progress stays off stdout");
    for phase in [
        "reading vectors [00:00:",
        "k-means [00:00:",
        "assigning rows [00:00:",
        "writing index files [00:00:",
    ] {
        assert!(err.contains(phase), "{phase}: {err}");
    }
    // Each phase ends at its total: rows read, vectors assigned, files written.
    for done in ["] 2,000/2,000", "] 1,500/1,500", "] 2/2"] {
        assert!(err.lines().any(|l| l.ends_with(done)), "{done}: {err}");
    }
    let (code, _, err) = fragvec(
        &db,
        &[
            "--progress",
            "never",
            "-c",
            "OPTIMIZE INDEX vi ON t RETRAIN",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "");
    // auto: stderr is a pipe here, not a terminal.
    let (code, _, err) = fragvec(&db, &["-c", "OPTIMIZE INDEX vi ON t RETRAIN"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "");
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

/// The demo on an in-memory store: empty index partitions are not requested as empty ranges
/// (object_store's InMemory refuses `0..0`), so every step runs.
#[test]
fn the_demo_runs_on_an_in_memory_store() {
    let (code, out, err) = fragvec("memory://demo", &["demo"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("The demo database is at memory://demo"),
        "{out}"
    );
}

/// The `--flags` a help text lists.
fn flags(help: &str) -> Vec<String> {
    let mut found: Vec<String> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.split(['=', '<']).next().unwrap().to_string())
        .filter(|w| w != "--help" && w != "--version")
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Every option `fragvec --help` and each subcommand's `--help` list is in the command-line
/// page, so the page cannot fall behind the binary.
#[test]
fn every_option_in_help_is_documented() {
    let dir = tempfile::tempdir().unwrap();
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/command-line.md"),
    )
    .unwrap();
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["maintain", "--help"],
        vec!["worker", "--help"],
    ] {
        let (code, out, err) = fragvec(dir.path().join("db"), &args);
        assert_eq!(code, 0, "{err}");
        // Only the options part: the examples at the end quote them again.
        let options = out.split("Examples:").next().unwrap();
        let listed = flags(options);
        assert!(!listed.is_empty(), "{out}");
        for flag in listed {
            // The flag as a whole word (not the start of a longer one).
            let documented = page.match_indices(flag.as_str()).any(|(i, _)| {
                !page[i + flag.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '-')
            });
            assert!(
                documented,
                "fragvec {args:?} lists {flag}, which docs/command-line.md does not document"
            );
        }
    }
}

//! DataFusion's own conformance corpus through fragvec.
//!
//! fragvec replaces DataFusion's SQL front end and table storage, so DataFusion's own
//! sqllogictest corpus (the `datafusion-sqllogictest` 55.2.0 crate's `test_files/`, fetched at
//! test time, see [`fetch`]) is the fairest check that nothing DataFusion users rely on
//! broke. Every file runs record by record twice: once on a plain DataFusion `SessionContext`
//! and once through a fragvec session whose default schema is a fragvec database (so its
//! `CREATE TABLE`s make fragvec tables), both configured and formatted as DataFusion's
//! harness does ([`engines`]). A record DataFusion itself fails is not counted; one that
//! DataFusion passes and fragvec fails is a *regression*.
//!
//! `known_differences.txt` lists the regressions known and why (`file.slt:line  # reason`).
//! The test fails on a regression the list does not name, and reports (without failing)
//! listed records that now pass, so the list can shrink.
//!
//! By default `cargo test` runs the files named in `ci_files.txt` (a committed subset that
//! keeps a debug build's run short). Environment:
//! * `FRAGVEC_CORPUS=all`: every file (504);
//! * `FRAGVEC_CORPUS_FILES=a,b`: only files whose path contains one of these;
//! * `FRAGVEC_CORPUS_UPDATE=1`: rewrite `known_differences.txt` from this run (entries of
//!   files that ran are replaced; reasons of entries still failing are kept, new entries get
//!   a reason guessed from the error, to be reviewed);
//! * `FRAGVEC_CORPUS_JOBS=n`: files run concurrently (default: available parallelism);
//! * `FRAGVEC_CORPUS_RECORD_TIMEOUT=secs`: one record's time limit (default 120).
//!
//! Without the corpus (offline and not in cargo's cache) the test says so and passes.

mod engines;
mod fetch;
mod known;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use sqllogictest::harness::{Arguments, Failed, Trial};
use sqllogictest::{AsyncDB, MakeConnection, Record, RecordOutput, Runner, parse_file};

use engines::{DataFusionDb, DfColumnType, Formatting, FragvecDb};
use known::{KnownDifferences, Regression};

/// How one engine did on one record.
#[derive(Debug, Clone)]
enum Outcome {
    Pass,
    Fail(String),
}

/// One SQL record of a file and how both engines did (`None`: skipped by a condition).
struct RecordRun {
    id: String,
    sql: String,
    datafusion: Option<Outcome>,
    fragvec: Option<Outcome>,
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    let arguments = Arguments::from_args();
    let trials = vec![
        Trial::test("checks", || {
            fetch::sha256_self_check()?;
            engines::round_decimal_self_check()?;
            Ok(())
        }),
        Trial::test("datafusion_corpus", run_corpus),
    ];
    sqllogictest::harness::run(&arguments, trials).exit();
}

fn run_corpus() -> Result<(), Failed> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let here = Path::new(&manifest_dir)
        .join("tests")
        .join("datafusion_corpus");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("datafusion-corpus");
    let crate_dir = match fetch::crate_dir(&cache) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!(
                "datafusion_corpus: SKIPPED: the {} {} crate's files are not available: {e}",
                fetch::CRATE_NAME,
                fetch::CRATE_VERSION
            );
            return Ok(());
        }
    };
    let mut files = slt_files(&crate_dir.join("test_files")).map_err(Failed::from)?;
    let all = env_var("FRAGVEC_CORPUS").is_some_and(|v| v == "all");
    if let Some(filter) = env_var("FRAGVEC_CORPUS_FILES") {
        let parts: Vec<&str> = filter.split(',').collect();
        files.retain(|f| parts.iter().any(|p| f.contains(p)));
    } else if !all {
        let subset = read_list(&here.join("ci_files.txt")).map_err(Failed::from)?;
        files.retain(|f| subset.contains(f));
    }
    // The files name their data and scratch paths relative to the crate's directory.
    std::env::set_current_dir(&crate_dir).map_err(|e| Failed::from(e.to_string()))?;
    // A panic inside an engine fails that record (reported with the record), nothing more.
    std::panic::set_hook(Box::new(|_| {}));
    let started = Instant::now();
    let jobs = env_var("FRAGVEC_CORPUS_JOBS")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let timeout = Duration::from_secs(
        env_var("FRAGVEC_CORPUS_RECORD_TIMEOUT")
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    );
    let workspace_root = crate_dir
        .parent()
        .and_then(Path::parent)
        .map(|p| p.to_string_lossy().trim_start_matches('/').to_string())
        .unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(jobs.max(2))
        .enable_all()
        .build()
        .map_err(|e| Failed::from(e.to_string()))?;
    let count = files.len();
    let timed: Vec<(String, Result<Vec<RecordRun>, String>, Duration)> = runtime.block_on(async {
        futures::stream::iter(files.clone())
            .map(|file| {
                let formatting = Formatting {
                    workspace_root: workspace_root.clone(),
                    spark: file.starts_with("spark/"),
                };
                async move {
                    let started = Instant::now();
                    let task = tokio::spawn(run_file(file.clone(), formatting, timeout));
                    let result = match task.await {
                        Ok(r) => r,
                        Err(e) => Err(format!("the file's run panicked: {e}")),
                    };
                    (file, result, started.elapsed())
                }
            })
            .buffer_unordered(jobs)
            .collect()
            .await
    });
    let _ = std::panic::take_hook();
    let mut slowest: Vec<(Duration, String)> =
        timed.iter().map(|(f, _, t)| (*t, f.clone())).collect();
    slowest.sort_by(|a, b| b.cmp(a));
    let runs: BTreeMap<String, Result<Vec<RecordRun>, String>> =
        timed.into_iter().map(|(f, r, _)| (f, r)).collect();
    let known =
        KnownDifferences::read(&here.join("known_differences.txt")).map_err(Failed::from)?;
    let report = Report::of(&runs, &known);
    report.print(count, started.elapsed(), &cache);
    report
        .write_details(&cache.join("report.txt"), &slowest)
        .map_err(Failed::from)?;
    if env_var("FRAGVEC_CORPUS_UPDATE").is_some_and(|v| v == "1") {
        known
            .updated(&runs_ids(&runs), &report.regressions)
            .write(&here.join("known_differences.txt"))
            .map_err(Failed::from)?;
        eprintln!("datafusion_corpus: known_differences.txt rewritten; review the diff");
        return Ok(());
    }
    report.verdict()
}

/// Every `*.slt` under `dir`, as paths relative to it, sorted.
fn slt_files(dir: &Path) -> Result<Vec<String>, String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) -> Result<(), String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "scratch") {
                    walk(&path, root, out)?;
                }
            } else if path.extension().is_some_and(|e| e == "slt")
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// Non-empty lines that are not `#` comments.
fn read_list(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect())
}

/// The record ids of the files that ran, by file.
fn runs_ids(runs: &BTreeMap<String, Result<Vec<RecordRun>, String>>) -> Vec<String> {
    runs.keys().cloned().collect()
}

/// Runs one file on DataFusion, then on fragvec (each from a clean scratch directory).
async fn run_file(
    file: String,
    formatting: Formatting,
    timeout: Duration,
) -> Result<Vec<RecordRun>, String> {
    let path = PathBuf::from("test_files").join(&file);
    let records: Vec<Record<DfColumnType>> =
        parse_file(&path).map_err(|e| format!("parsing {file}: {e}"))?;

    reset_scratch(&file)?;
    let ctx = engines::session_context(&file);
    let df_formatting = formatting.clone();
    let datafusion = run_records(
        Runner::new(move || {
            let db = DataFusionDb {
                ctx: ctx.clone(),
                formatting: df_formatting.clone(),
            };
            async move { Ok(db) }
        }),
        &records,
        timeout,
    )
    .await;

    reset_scratch(&file)?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let location = dir.path().join("db").to_string_lossy().to_string();
    let session = fragvec::register(&engines::session_context(&file), &location)
        .await
        .map_err(|e| format!("opening a fragvec session: {e}"))?;
    let fragvec = run_records(
        Runner::new(move || {
            let db = FragvecDb {
                session: session.clone(),
                formatting: formatting.clone(),
            };
            async move { Ok(db) }
        }),
        &records,
        timeout,
    )
    .await;

    let mut out = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let (loc, sql) = match record {
            Record::Statement { loc, sql, .. } | Record::Query { loc, sql, .. } => (loc, sql),
            _ => continue,
        };
        let (Some(df), Some(fv)) = (datafusion.get(i), fragvec.get(i)) else {
            break; // after `halt`
        };
        out.push(RecordRun {
            id: loc
                .to_string()
                .replace("test_files/", "")
                .replace("\nat ", " at "),
            sql: sql.clone(),
            datafusion: df.clone(),
            fragvec: fv.clone(),
        });
    }
    Ok(out)
}

/// `test_files/scratch/<file stem>`, empty (files write there and expect it fresh).
fn reset_scratch(file: &str) -> Result<(), String> {
    let stem = Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let dir = Path::new("test_files").join("scratch").join(stem);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Runs the records in order on one engine; one entry per record up to `halt` (`None`:
/// skipped or not SQL).
async fn run_records<D, M>(
    mut runner: Runner<D, M>,
    records: &[Record<DfColumnType>],
    timeout: Duration,
) -> Vec<Option<Outcome>>
where
    D: AsyncDB<ColumnType = DfColumnType>,
    M: MakeConnection<Conn = D>,
{
    runner.add_label("Datafusion");
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner.with_normalizer(known::value_normalizer);
    runner.with_validator(known::df_value_validator);
    let mut out = Vec::with_capacity(records.len());
    for record in records {
        if matches!(record, Record::Halt { .. }) {
            break;
        }
        let is_sql = matches!(record, Record::Statement { .. } | Record::Query { .. });
        let run = AssertUnwindSafe(runner.run_async(record.clone())).catch_unwind();
        let outcome = match tokio::time::timeout(timeout, run).await {
            Err(_) => Some(Outcome::Fail(format!("timed out after {timeout:?}"))),
            Ok(Err(panic)) => Some(Outcome::Fail(format!("panicked: {}", panic_text(&panic)))),
            Ok(Ok(Err(e))) => Some(Outcome::Fail(e.to_string())),
            Ok(Ok(Ok(RecordOutput::Nothing))) => None,
            Ok(Ok(Ok(_))) => Some(Outcome::Pass),
        };
        out.push(if is_sql { outcome } else { None });
    }
    runner.shutdown_async().await;
    out
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// The totals of a run and its regressions, against the known differences.
struct Report {
    records: usize,
    datafusion_pass: usize,
    fragvec_pass: usize,
    regressions: Vec<Regression>,
    /// Regressions `known_differences.txt` does not name.
    new: Vec<Regression>,
    /// Listed records of files that ran which no longer regress.
    fixed: Vec<String>,
    file_errors: Vec<(String, String)>,
}

impl Report {
    fn of(
        runs: &BTreeMap<String, Result<Vec<RecordRun>, String>>,
        known: &KnownDifferences,
    ) -> Self {
        let mut report = Report {
            records: 0,
            datafusion_pass: 0,
            fragvec_pass: 0,
            regressions: vec![],
            new: vec![],
            fixed: vec![],
            file_errors: vec![],
        };
        for (file, run) in runs {
            let records = match run {
                Ok(r) => r,
                Err(e) => {
                    report.file_errors.push((file.clone(), e.clone()));
                    continue;
                }
            };
            for r in records {
                let (Some(df), Some(fv)) = (&r.datafusion, &r.fragvec) else {
                    continue;
                };
                report.records += 1;
                if matches!(fv, Outcome::Pass) {
                    report.fragvec_pass += 1;
                }
                let Outcome::Pass = df else {
                    continue;
                };
                report.datafusion_pass += 1;
                if let Outcome::Fail(error) = fv {
                    let regression = Regression {
                        id: r.id.clone(),
                        sql: r.sql.clone(),
                        error: error.clone(),
                    };
                    if !known.contains(&r.id) {
                        report.new.push(regression.clone());
                    }
                    report.regressions.push(regression);
                }
            }
        }
        let failing: std::collections::HashSet<&str> =
            report.regressions.iter().map(|r| r.id.as_str()).collect();
        report.fixed = known
            .ids_of_files(runs.keys())
            .into_iter()
            .filter(|id| !failing.contains(id.as_str()))
            .collect();
        report
    }

    fn print(&self, files: usize, elapsed: Duration, cache: &Path) {
        let explain = self.regressions.iter().filter(|r| r.is_explain()).count();
        eprintln!(
            "datafusion_corpus: {files} files, {} records in {:.0?}: DataFusion passes {}, fragvec passes {}, \
             regressions {} ({} EXPLAIN text, {} other); {} not in known_differences.txt, {} listed now pass",
            self.records,
            elapsed,
            self.datafusion_pass,
            self.fragvec_pass,
            self.regressions.len(),
            explain,
            self.regressions.len() - explain,
            self.new.len(),
            self.fixed.len(),
        );
        for (file, e) in &self.file_errors {
            eprintln!("datafusion_corpus: {file}: {e}");
        }
        if !self.fixed.is_empty() {
            eprintln!(
                "datafusion_corpus: these listed records now pass; remove them from known_differences.txt \
                 (or run with FRAGVEC_CORPUS_UPDATE=1):"
            );
            for id in &self.fixed {
                eprintln!("  {id}");
            }
        }
        eprintln!(
            "datafusion_corpus: every regression, with SQL and error: {}",
            cache.join("report.txt").display()
        );
    }

    /// Every regression with its SQL and error, then the slowest files (both engines).
    fn write_details(&self, path: &Path, slowest: &[(Duration, String)]) -> Result<(), String> {
        let mut text = String::new();
        for r in &self.regressions {
            text.push_str(&r.details());
        }
        text.push_str("slowest files:\n");
        for (elapsed, file) in slowest.iter().take(40) {
            text.push_str(&format!("{:>8.1?}  {file}\n", elapsed));
        }
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn verdict(&self) -> Result<(), Failed> {
        if self.new.is_empty() && self.file_errors.is_empty() {
            return Ok(());
        }
        let mut message = format!(
            "{} regressions not in tests/datafusion_corpus/known_differences.txt \
             (DataFusion passes, fragvec fails):\n",
            self.new.len()
        );
        for r in self.new.iter().take(50) {
            message.push_str(&r.details());
        }
        if self.new.len() > 50 {
            message.push_str(&format!("... and {} more\n", self.new.len() - 50));
        }
        for (file, e) in &self.file_errors {
            message.push_str(&format!("{file}: {e}\n"));
        }
        Err(Failed::from(message))
    }
}

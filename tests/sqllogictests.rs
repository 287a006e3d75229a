//! Runs the conformance suite in `sql-tests/*.slt`.
//!
//! Each file gets a fresh scratch database directory. Besides SQL, the files may use one
//! test-only statement, `REOPEN DATABASE`, which drops the session and opens a new one on the
//! same directory, so persistence is tested.
//!
//! `cargo test --test sqllogictests -- --complete` (or `FRAGVEC_SLT_COMPLETE=1`) rewrites the
//! expected output of every record from what fragvec returns now; review the diff.
//!
//! The whole suite runs a second time with each file's database on S3 (trials `s3/<file>`,
//! each under its own prefix of `FRAGVEC_TEST_S3`; see `tests/support`). Without a server
//! configured, one trial `s3` says the S3 run was skipped.

mod support;

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use fragvec::FragvecSession;
use sqllogictest::harness::{Arguments, Failed, Trial};
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType, Runner};

struct Db {
    location: String,
    session: FragvecSession,
}

impl Db {
    async fn open(location: String) -> Result<Self, DataFusionError> {
        let session = FragvecSession::open(&location).await?;
        Ok(Self { location, session })
    }
}

#[async_trait]
impl AsyncDB for Db {
    type Error = DataFusionError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        if sql
            .trim()
            .trim_end_matches(';')
            .eq_ignore_ascii_case("REOPEN DATABASE")
        {
            self.session = FragvecSession::open(&self.location).await?;
            return Ok(DBOutput::StatementComplete(0));
        }
        let mut results = self.session.sql(sql).await?;
        let Some(result) = results.pop() else {
            return Ok(DBOutput::StatementComplete(0));
        };
        if let Some(n) = result.rows_affected {
            return Ok(DBOutput::StatementComplete(n));
        }
        if result.schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        let types = result
            .schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        let mut rows = Vec::new();
        for batch in &result.batches {
            for row in batch_rows(batch)? {
                rows.extend(split_multiline(row));
            }
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "fragvec"
    }

    async fn sleep(duration: std::time::Duration) {
        tokio::time::sleep(duration).await;
    }
}

/// A row whose last cell spans several lines (EXPLAIN) becomes one row per line, so expected
/// output can be written line by line.
fn split_multiline(mut row: Vec<String>) -> Vec<Vec<String>> {
    let Some(last) = row.pop() else {
        return vec![row];
    };
    let mut lines = last.lines();
    row.push(lines.next().unwrap_or_default().to_string());
    let mut out = vec![row];
    out.extend(lines.map(|l| vec![l.to_string()]));
    out
}

fn column_type(dt: &DataType) -> DefaultColumnType {
    if dt.is_integer() {
        DefaultColumnType::Integer
    } else if dt.is_floating() || matches!(dt, DataType::Decimal128(..) | DataType::Decimal256(..))
    {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

/// Cells as text: NULL as `NULL`, empty strings as `(empty)`, floats rounded to 12 digits.
fn batch_rows(batch: &RecordBatch) -> Result<Vec<Vec<String>>, DataFusionError> {
    let options = FormatOptions::default().with_null("NULL");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut cells = Vec::with_capacity(batch.num_columns());
        for (col, formatter) in batch.columns().iter().zip(&formatters) {
            cells.push(cell(col, row, &formatter.value(row).to_string()));
        }
        rows.push(cells);
    }
    Ok(rows)
}

fn cell(column: &ArrayRef, row: usize, text: &str) -> String {
    if column.is_null(row) {
        return "NULL".into();
    }
    // Float64 is rounded to 12 digits (as DataFusion's own suite does); Float32 is printed
    // with its shortest round-trip form, which is already stable.
    if column.data_type() == &DataType::Float64 {
        if let Ok(v) = text.parse::<f64>()
            && v.is_finite()
        {
            let s = format!("{v:.12}");
            let s = s.trim_end_matches('0').trim_end_matches('.');
            return if s == "-0" { "0".into() } else { s.to_string() };
        }
        return text.to_string();
    }
    if text.is_empty()
        && matches!(
            column.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
    {
        return "(empty)".into();
    }
    // Multi-line text (EXPLAIN plans) ends with a newline that is not part of the value.
    text.trim_end_matches('\n').to_string()
}

/// Runs one file on a fresh database: a scratch directory, or `s3_location` (a prefix on
/// the test S3 server).
fn run_file(path: PathBuf, complete: bool, s3_location: Option<String>) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(e.to_string()))?;
    runtime.block_on(async move {
        let dir = tempfile::tempdir().map_err(|e| Failed::from(e.to_string()))?;
        let location = match s3_location {
            Some(s3) => s3,
            None => dir.path().join("db").to_string_lossy().to_string(),
        };
        let mut runner = Runner::new(move || {
            let location = location.clone();
            async move { Db::open(location).await }
        });
        if complete {
            runner
                .update_test_file(
                    &path,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::default_column_validator,
                )
                .await
                .map_err(|e| Failed::from(e.to_string()))
        } else {
            runner
                .run_file_async(&path)
                .await
                .map_err(|e| Failed::from(e.display(true).to_string()))
        }
    })
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let complete = args.iter().any(|a| a == "--complete")
        || std::env::var("FRAGVEC_SLT_COMPLETE").is_ok_and(|v| v == "1");
    args.retain(|a| a != "--complete");
    let arguments = Arguments::from_iter(args);
    // The directory cargo runs the tests for (the same test binary may be reused by another
    // checkout of the crate sharing the target directory), else the one it was built in.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let root = Path::new(&manifest_dir).join("sql-tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("sql-tests directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    let mut trials: Vec<Trial> = files
        .iter()
        .cloned()
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            Trial::test(name, move || run_file(path, complete, None))
        })
        .collect();
    // The same files with the database on S3 (never rewritten by --complete).
    if support::s3_base().is_some() {
        trials.extend(files.into_iter().map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            Trial::test(format!("s3/{name}"), move || {
                let location = support::s3_location(&format!("slt-{name}"));
                run_file(path, false, location)
            })
        }));
    } else {
        trials.push(Trial::test("s3", || {
            support::skip("sqllogictests").map_err(Failed::from)
        }));
    }
    sqllogictest::harness::run(&arguments, trials).exit();
}

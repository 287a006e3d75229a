//! The two engines the corpus runs on, answering exactly as DataFusion's own harness
//! (`datafusion-sqllogictest` 55.2.0, `engines/datafusion_engine`) does: the same session
//! configuration (`target_partitions = 4`), the same column types, the same cell text
//! (NULL, `(empty)`, floats and decimals rounded to 12 places by decimal arithmetic,
//! multi-line cells split into numbered rows, the workspace root in paths replaced) and the
//! same error text (`DataFusion error: ...`).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type, DecimalType, Field,
    Float16Type, Float32Type, Float64Type,
};
use datafusion::arrow::util::display::ArrayFormatter;
use datafusion::config::{ConfigField, Dialect};
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::common::collect;
use datafusion::physical_plan::execute_stream;
use datafusion::prelude::{SessionConfig, SessionContext};
use fragvec::FragvecSession;
use sqllogictest::{AsyncDB, ColumnType, DBOutput};

/// Column types as DataFusion's harness names them (`query IRT...`).
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum DfColumnType {
    Boolean,
    DateTime,
    Integer,
    Float,
    Text,
    Timestamp,
    Another,
}

impl ColumnType for DfColumnType {
    fn from_char(value: char) -> Option<Self> {
        Some(match value {
            'B' => Self::Boolean,
            'D' => Self::DateTime,
            'I' => Self::Integer,
            'P' => Self::Timestamp,
            'R' => Self::Float,
            'T' => Self::Text,
            _ => Self::Another,
        })
    }

    fn to_char(&self) -> char {
        match self {
            Self::Boolean => 'B',
            Self::DateTime => 'D',
            Self::Integer => 'I',
            Self::Timestamp => 'P',
            Self::Float => 'R',
            Self::Text => 'T',
            Self::Another => '?',
        }
    }
}

/// An engine's error, displayed as DataFusion's harness displays it (the corpus matches
/// expected errors against this text).
#[derive(Debug)]
pub enum EngineError {
    DataFusion(DataFusionError),
    Arrow(datafusion::arrow::error::ArrowError),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DataFusion(e) => write!(f, "DataFusion error: {}", e.strip_backtrace()),
            Self::Arrow(e) => write!(f, "Arrow error: {e}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<DataFusionError> for EngineError {
    fn from(e: DataFusionError) -> Self {
        Self::DataFusion(e)
    }
}

type Output = DBOutput<DfColumnType>;

/// A session configured as DataFusion's harness configures one for `relative_path`
/// (`target_partitions = 4`; the Spark dialect under `spark/`).
pub fn session_context(relative_path: &str) -> SessionContext {
    let mut config = SessionConfig::new().with_target_partitions(4);
    if relative_path.starts_with("spark/") {
        config.options_mut().sql_parser.dialect = Dialect::Spark;
    }
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(Arc::new(RuntimeEnv::default()))
        .with_default_features()
        .build();
    SessionContext::new_with_state(state)
}

/// What both engines share: where the workspace root is, and whether floats round as on
/// Spark paths.
#[derive(Clone)]
pub struct Formatting {
    /// The `WORKSPACE_ROOT` expected output names, as an object-store path (no leading `/`).
    pub workspace_root: String,
    pub spark: bool,
}

/// Plain DataFusion.
pub struct DataFusionDb {
    pub ctx: SessionContext,
    pub formatting: Formatting,
}

#[async_trait]
impl AsyncDB for DataFusionDb {
    type Error = EngineError;
    type ColumnType = DfColumnType;

    async fn run(&mut self, sql: &str) -> Result<Output, EngineError> {
        let df = self.ctx.sql(sql).await?;
        let task_ctx = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        let stream = execute_stream(plan, task_ctx)?;
        let fields: Vec<Field> = stream
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let batches = collect(stream).await?;
        output(&fields, &batches, &self.formatting)
    }

    fn engine_name(&self) -> &str {
        "DataFusion"
    }

    async fn shutdown(&mut self) {}

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}

/// fragvec: the same session made a fragvec session, its default schema a fragvec database
/// (so `CREATE TABLE` makes fragvec tables), statements run through fragvec's front end.
pub struct FragvecDb {
    pub session: FragvecSession,
    pub formatting: Formatting,
}

#[async_trait]
impl AsyncDB for FragvecDb {
    type Error = EngineError;
    type ColumnType = DfColumnType;

    async fn run(&mut self, sql: &str) -> Result<Output, EngineError> {
        let mut results = self.session.sql(sql).await?;
        let Some(result) = results.pop() else {
            return Ok(DBOutput::StatementComplete(0));
        };
        let fields: Vec<Field> = result
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        output(&fields, &result.batches, &self.formatting)
    }

    /// The corpus's `onlyif` / `skipif` name DataFusion; fragvec answers for it.
    fn engine_name(&self) -> &str {
        "DataFusion"
    }

    async fn shutdown(&mut self) {}

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}

/// A statement's result as the harness reports it: rows of cells, or nothing.
fn output(
    fields: &[Field],
    batches: &[RecordBatch],
    formatting: &Formatting,
) -> Result<Output, EngineError> {
    let types: Vec<DfColumnType> = fields.iter().map(|f| column_type(f.data_type())).collect();
    let mut rows = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let cells = batch
                .columns()
                .iter()
                .map(|c| cell(c, row, formatting.spark))
                .collect::<Result<Vec<_>, _>>()?;
            for mut expanded in expand_row(cells) {
                for cell in expanded.iter_mut() {
                    if !formatting.workspace_root.is_empty()
                        && cell.contains(&formatting.workspace_root)
                    {
                        *cell = cell.replace(&formatting.workspace_root, "WORKSPACE_ROOT");
                    }
                }
                rows.push(expanded);
            }
        }
    }
    if rows.is_empty() && types.is_empty() {
        Ok(DBOutput::StatementComplete(0))
    } else {
        Ok(DBOutput::Rows { types, rows })
    }
}

fn column_type(data_type: &DataType) -> DfColumnType {
    match data_type {
        DataType::Boolean => DfColumnType::Boolean,
        t if t.is_integer() => DfColumnType::Integer,
        DataType::Float16 | DataType::Float32 | DataType::Float64 => DfColumnType::Float,
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => DfColumnType::Float,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DfColumnType::Text,
        DataType::Date32 | DataType::Date64 | DataType::Time32(_) | DataType::Time64(_) => {
            DfColumnType::DateTime
        }
        DataType::Timestamp(..) => DfColumnType::Timestamp,
        DataType::Dictionary(key, value) if key.is_integer() => match value.as_ref() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DfColumnType::Text,
            _ => DfColumnType::Another,
        },
        _ => DfColumnType::Another,
    }
}

/// A cell whose last column spans lines (EXPLAIN) becomes one row per line, numbered, leading
/// spaces shown as `-` (sqllogictest ignores whitespace differences).
fn expand_row(mut row: Vec<String>) -> Vec<Vec<String>> {
    let Some(last) = row.pop() else {
        return vec![row];
    };
    let lines: Vec<&str> = last.split('\n').collect();
    if lines.len() < 2 {
        row.push(last);
        return vec![row];
    }
    let mut out = vec![row];
    for (i, line) in lines.iter().enumerate() {
        let content = line.trim_start();
        let prefix = "-".repeat(line.len() - content.len());
        out.push(vec![format!("{:02}){prefix}{content}", i + 1)]);
    }
    out
}

fn cell(column: &ArrayRef, row: usize, spark: bool) -> Result<String, EngineError> {
    if column.is_null(row) {
        return Ok("NULL".into());
    }
    Ok(match column.data_type() {
        DataType::Null => "NULL".into(),
        DataType::Boolean => column.as_boolean().value(row).to_string(),
        DataType::Float16 => float_text(
            column.as_primitive::<Float16Type>().value(row).to_f64(),
            || {
                column
                    .as_primitive::<Float16Type>()
                    .value(row)
                    .to_f32()
                    .to_string()
            },
            12,
        ),
        DataType::Float32 => {
            let v = column.as_primitive::<Float32Type>().value(row);
            float_text(f64::from(v), || v.to_string(), 12)
        }
        DataType::Float64 => {
            let v = column.as_primitive::<Float64Type>().value(row);
            float_text(v, || v.to_string(), if spark { 15 } else { 12 })
        }
        DataType::Decimal32(_, scale) => {
            decimal_text::<Decimal32Type>(column.as_primitive::<Decimal32Type>().value(row), *scale)
        }
        DataType::Decimal64(_, scale) => {
            decimal_text::<Decimal64Type>(column.as_primitive::<Decimal64Type>().value(row), *scale)
        }
        DataType::Decimal128(_, scale) => decimal_text::<Decimal128Type>(
            column.as_primitive::<Decimal128Type>().value(row),
            *scale,
        ),
        DataType::Decimal256(_, scale) => decimal_text::<Decimal256Type>(
            column.as_primitive::<Decimal256Type>().value(row),
            *scale,
        ),
        DataType::Utf8 => varchar(column.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => varchar(column.as_string::<i64>().value(row)),
        DataType::Utf8View => varchar(column.as_string_view().value(row)),
        DataType::Dictionary(..) => {
            let dict = column.as_any_dictionary();
            let key = dict.normalized_keys()[row];
            return cell(dict.values(), key, spark);
        }
        _ => {
            let mut options = datafusion::config::FormatOptions::default();
            options
                .set("null", "NULL")
                .map_err(EngineError::DataFusion)?;
            let options: datafusion::arrow::util::display::FormatOptions =
                (&options).try_into().map_err(EngineError::DataFusion)?;
            let formatter =
                ArrayFormatter::try_new(column.as_ref(), &options).map_err(EngineError::Arrow)?;
            formatter.value(row).to_string()
        }
    })
}

fn varchar(value: &str) -> String {
    if value.is_empty() {
        "(empty)".into()
    } else {
        value.trim_end_matches('\n').replace('\u{0000}', "\\0")
    }
}

/// NaN and infinities by name, anything else as its shortest decimal text rounded to
/// `digits` places (half to even, on the decimal text, as `BigDecimal::round`).
fn float_text(value: f64, text: impl FnOnce() -> String, digits: usize) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value == f64::INFINITY {
        "Infinity".into()
    } else if value == f64::NEG_INFINITY {
        "-Infinity".into()
    } else {
        round_decimal(&text(), digits)
    }
}

fn decimal_text<T: DecimalType>(value: T::Native, scale: i8) -> String {
    let text = T::format_decimal(value, u8::MAX, scale);
    round_decimal(&text, usize::try_from(scale).unwrap_or(0))
}

/// Rounds plain decimal text (`-12.3450`, no exponent) to `digits` places, half to even, and
/// prints it without trailing zeros; zero has no sign.
pub fn round_decimal(text: &str, digits: usize) -> String {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int_part, frac_part) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let mut all: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes().take(digits))
        .map(|b| b - b'0')
        .collect();
    let kept_frac = frac_part.len().min(digits);
    if frac_part.len() > digits {
        let rest = &frac_part.as_bytes()[digits..];
        let first = rest[0] - b'0';
        let beyond = rest[1..].iter().any(|&b| b != b'0');
        let last_odd = all.last().is_some_and(|d| d % 2 == 1);
        if first > 5 || (first == 5 && (beyond || last_odd)) {
            let mut i = all.len();
            loop {
                if i == 0 {
                    all.insert(0, 1);
                    break;
                }
                i -= 1;
                if all[i] == 9 {
                    all[i] = 0;
                } else {
                    all[i] += 1;
                    break;
                }
            }
        }
    }
    let split = all.len() - kept_frac;
    let int_digits: String = all[..split].iter().map(|d| char::from(b'0' + d)).collect();
    let frac_digits: String = all[split..].iter().map(|d| char::from(b'0' + d)).collect();
    let int_digits = int_digits.trim_start_matches('0');
    let frac_digits = frac_digits.trim_end_matches('0');
    let int_digits = if int_digits.is_empty() {
        "0"
    } else {
        int_digits
    };
    let mut out = String::new();
    if negative && (int_digits != "0" || !frac_digits.is_empty()) {
        out.push('-');
    }
    out.push_str(int_digits);
    if !frac_digits.is_empty() {
        out.push('.');
        out.push_str(frac_digits);
    }
    out
}

/// Known answers of [`round_decimal`], checked before the corpus runs.
pub fn round_decimal_self_check() -> Result<(), String> {
    for (text, digits, want) in [
        ("1.0000000000011", 12, "1.000000000001"),
        ("0.5", 0, "0"),
        ("1.5", 0, "2"),
        ("2.5", 0, "2"),
        ("2.51", 0, "3"),
        ("-0.0000000000001", 12, "0"),
        ("-0", 12, "0"),
        ("9.9999999999999", 12, "10"),
        ("123.4500", 4, "123.45"),
        ("100", 12, "100"),
        ("-12.345", 2, "-12.34"),
        ("0.30000000000000004", 12, "0.3"),
    ] {
        let got = round_decimal(text, digits);
        if got != want {
            return Err(format!(
                "round_decimal({text}, {digits}) = {got}, expected {want}"
            ));
        }
    }
    Ok(())
}

//! Printing statement results.
//!
//! * table: aligned text (DataFusion's pretty printer), NULL as an empty cell;
//! * csv (RFC 4180): a header row, fields quoted when they hold a comma, a quote or a line
//!   break (quotes doubled); NULL is an empty field and an empty string a quoted `""`, so the
//!   two stay apart; vectors and other nested values in their display form (`[1.0, 2.0]`);
//! * json: one object per row with every column, NULL as `null` (never a missing key), so
//!   scripts can index rows by key; non-finite floats are `null` too (JSON has no NaN).

use std::io::Write;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::json::WriterBuilder as JsonWriterBuilder;
use datafusion::arrow::json::writer::LineDelimited;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;

use super::Format;
use crate::engine::StatementResult;

/// Prints `result` to `out` in `format`. As a table, a statement without columns prints `OK`
/// and one that changed rows prints `n rows affected`; CSV and JSON print only rows.
pub fn print(result: &StatementResult, format: Format, out: &mut impl Write) -> Result<()> {
    if result.schema.fields().is_empty() {
        if format == Format::Table {
            writeln!(out, "OK")?;
        }
        return Ok(());
    }
    match format {
        Format::Table => {
            if let Some(n) = result.rows_affected {
                writeln!(out, "{n} row{} affected", if n == 1 { "" } else { "s" })?;
            } else {
                // With no batches, still print the column headers.
                let empty = [datafusion::arrow::array::RecordBatch::new_empty(
                    result.schema.clone(),
                )];
                let batches = if result.batches.is_empty() {
                    &empty[..]
                } else {
                    &result.batches[..]
                };
                writeln!(out, "{}", pretty_format_batches(batches)?)?;
                let n = result.num_rows();
                writeln!(out, "({n} row{})", if n == 1 { "" } else { "s" })?;
            }
        }
        Format::Csv => write_csv(&result.schema, &result.batches, out)?,
        Format::Json => {
            let mut writer = JsonWriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, LineDelimited>(&mut *out);
            for batch in &result.batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// Writes `batches` as CSV with a header row.
fn write_csv(schema: &Schema, batches: &[RecordBatch], out: &mut impl Write) -> Result<()> {
    let header: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| csv_field(f.name()))
        .collect();
    writeln!(out, "{}", header.join(","))?;
    let options = FormatOptions::default().with_null("");
    let mut line = String::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // Logical nulls: a column of type Null has no null buffer, yet every value is NULL.
        let nulls: Vec<_> = batch.columns().iter().map(|c| c.logical_nulls()).collect();
        for row in 0..batch.num_rows() {
            line.clear();
            for (i, (formatter, nulls)) in formatters.iter().zip(&nulls).enumerate() {
                if i > 0 {
                    line.push(',');
                }
                if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                    continue;
                }
                line.push_str(&csv_field(&formatter.value(row).to_string()));
            }
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// One CSV field: quoted when it holds a delimiter, a quote or a line break, or is empty (an
/// empty string, which an unquoted empty field, NULL, must not be mistaken for).
fn csv_field(value: &str) -> String {
    if value.is_empty() || value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Float32Array, Int64Array, StringArray};
    use datafusion::arrow::array::{FixedSizeListArray, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::engine::StatementResult;

    fn result() -> StatementResult {
        let vectors = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            2,
            Arc::new(Float32Array::from(vec![1.0, 2.5, 0.0, 0.0])),
            Some(vec![true, false].into()),
        )
        .unwrap();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec![Some("a, \"b\"\nc"), Some("")])),
            Arc::new(vectors),
            Arc::new(Float32Array::from(vec![f32::NAN, 0.5])),
        ];
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("note, quoted", DataType::Utf8, true),
            Field::new("v", columns[2].data_type().clone(), true),
            Field::new("d", DataType::Float32, true),
        ]));
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        StatementResult {
            schema,
            batches: vec![batch],
            rows_affected: None,
        }
    }

    fn printed(format: Format) -> String {
        let mut out = Vec::new();
        print(&result(), format, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_quotes_what_needs_it_and_tells_null_from_empty() {
        assert_eq!(
            printed(Format::Csv),
            "id,\"note, quoted\",v,d\n\
             1,\"a, \"\"b\"\"\nc\",\"[1.0, 2.5]\",NaN\n\
             ,\"\",,0.5\n"
        );
    }

    #[test]
    fn json_writes_every_column_with_null_for_missing_values() {
        assert_eq!(
            printed(Format::Json),
            "{\"id\":1,\"note, quoted\":\"a, \\\"b\\\"\\nc\",\"v\":[1.0,2.5],\"d\":null}\n\
             {\"id\":null,\"note, quoted\":\"\",\"v\":null,\"d\":0.5}\n"
        );
    }
}

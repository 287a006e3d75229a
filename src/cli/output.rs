//! Printing statement results.

use std::io::Write;

use datafusion::arrow::csv::WriterBuilder;
use datafusion::arrow::json::LineDelimitedWriter;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;

use super::Format;
use crate::engine::StatementResult;

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
        Format::Csv => {
            let mut writer = WriterBuilder::new().with_header(true).build(&mut *out);
            if result.batches.is_empty() {
                writer.write(&datafusion::arrow::array::RecordBatch::new_empty(
                    result.schema.clone(),
                ))?;
            }
            for batch in &result.batches {
                writer.write(batch)?;
            }
        }
        Format::Json => {
            let mut writer = LineDelimitedWriter::new(&mut *out);
            for batch in &result.batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

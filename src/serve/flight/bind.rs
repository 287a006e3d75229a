//! A prepared statement's parameters, as a Flight SQL client binds them (one Arrow batch,
//! a row per execution, a column per parameter), spliced into its text as SQL literals —
//! the same splice the Postgres endpoint makes ([`crate::serve::params`]), so a KNN query
//! with a bound vector reaches the same `[..]::VECTOR` literal, the index and the kept plan
//! of its shape.
//!
//! Placeholders are `?` (ADBC, JDBC, ODBC) or `$n`. A vector arrives as a `List<Float64>`
//! (what pyarrow makes of a Python list), a `FixedSizeList<Float32>` or any list of floats.

use datafusion::arrow::array::{
    Array, AsArray, BooleanArray, FixedSizeListArray, RecordBatch, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::serve::params::{self, float_literal, quote_string, vector_literal};

/// The text of `sql` for row `row` of `parameters` (`None`: no parameters bound).
pub fn bind(sql: &str, parameters: Option<&RecordBatch>, row: usize) -> Result<String, String> {
    let found = params::placeholders_with_qmarks(sql);
    let wanted = found.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let Some(batch) = parameters else {
        if wanted > 0 {
            return Err(format!(
                "the statement has {wanted} parameter(s) but none were bound"
            ));
        }
        return Ok(sql.to_string());
    };
    if batch.num_columns() < wanted {
        return Err(format!(
            "the statement uses parameter {wanted} but {} were bound",
            batch.num_columns()
        ));
    }
    let literals = batch
        .columns()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            literal(column.as_ref(), row).map_err(|e| format!("parameter {}: {e}", i + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    params::substitute_at(sql, found, &literals).map_err(|e| e.message)
}

/// The SQL literal of `column[row]`.
pub fn literal(column: &dyn Array, row: usize) -> Result<String, String> {
    if column.is_null(row) {
        return Ok("NULL".into());
    }
    macro_rules! int {
        ($t:ty) => {
            column.as_primitive::<$t>().value(row).to_string()
        };
    }
    Ok(match column.data_type() {
        DataType::Boolean => {
            let b: &BooleanArray = column.as_boolean();
            if b.value(row) { "TRUE" } else { "FALSE" }.into()
        }
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float16 => float_literal(column.as_primitive::<Float16Type>().value(row).into()),
        DataType::Float32 => float_literal(column.as_primitive::<Float32Type>().value(row).into()),
        DataType::Float64 => float_literal(column.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => quote_string(
            column
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(row),
        ),
        DataType::LargeUtf8 => quote_string(column.as_string::<i64>().value(row)),
        DataType::Utf8View => quote_string(column.as_string_view().value(row)),
        DataType::Binary => hex_literal(column.as_binary::<i32>().value(row)),
        DataType::LargeBinary => hex_literal(column.as_binary::<i64>().value(row)),
        DataType::List(_) => vector(column.as_list::<i32>().value(row).as_ref())?,
        DataType::LargeList(_) => vector(column.as_list::<i64>().value(row).as_ref())?,
        DataType::FixedSizeList(_, _) => {
            let list: &FixedSizeListArray = column.as_fixed_size_list();
            vector(list.value(row).as_ref())?
        }
        DataType::Date32 | DataType::Date64 => typed_text(column, row, "DATE")?,
        DataType::Timestamp(_, None) => typed_text(column, row, "TIMESTAMP")?,
        DataType::Timestamp(_, Some(_)) => typed_text(column, row, "TIMESTAMPTZ")?,
        DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => {
            ArrayFormatter::try_new(column, &FormatOptions::default())
                .map_err(|e| e.to_string())?
                .value(row)
                .to_string()
        }
        other => return Err(format!("values of type {other} cannot be bound")),
    })
}

/// A list of numbers as a vector literal (`[..]::VECTOR`).
fn vector(values: &dyn Array) -> Result<String, String> {
    if values.null_count() > 0 {
        return Err("a vector has a NULL element".into());
    }
    if !values.data_type().is_numeric() {
        return Err(format!("a list of {} is not a vector", values.data_type()));
    }
    let floats = cast(values, &DataType::Float32).map_err(|e| e.to_string())?;
    let floats = floats
        .as_primitive::<Float32Type>()
        .values()
        .iter()
        .copied();
    vector_literal(floats).map_err(|e| e.message)
}

fn hex_literal(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("X'{hex}'")
}

/// A value DataFusion reads from its text: `CAST('...' AS type)`.
fn typed_text(column: &dyn Array, row: usize, sql_type: &str) -> Result<String, String> {
    let text = ArrayFormatter::try_new(column, &FormatOptions::default())
        .map_err(|e| e.to_string())?
        .value(row)
        .to_string();
    Ok(format!("CAST({} AS {sql_type})", quote_string(&text)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Float64Builder, Int64Array, ListBuilder};
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let mut vectors = ListBuilder::new(Float64Builder::new());
        vectors.values().append_slice(&[0.5, -1.0, 2.25]);
        vectors.append(true);
        vectors.append_null();
        let vectors = vectors.finish();
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
            Field::new("c", vectors.data_type().clone(), true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![Some(7), None])),
                Arc::new(StringArray::from(vec![Some("it's ?"), Some("x")])),
                Arc::new(vectors),
            ],
        )
        .unwrap()
    }

    #[test]
    fn qmarks_and_dollars_take_the_values_of_their_row() {
        let b = batch();
        let sql = "SELECT ? AS a, '?' AS q, ? AS b FROM t ORDER BY emb <-> ? LIMIT 1";
        assert_eq!(
            bind(sql, Some(&b), 0).unwrap(),
            "SELECT  7  AS a, '?' AS q,  'it''s ?'  AS b FROM t ORDER BY emb <->  [0.5,-1,2.25]::VECTOR  LIMIT 1"
        );
        assert_eq!(
            bind("SELECT $2, $1", Some(&b), 1).unwrap(),
            "SELECT  'x' ,  NULL "
        );
        assert!(bind("SELECT ?", None, 0).is_err());
        assert_eq!(bind("SELECT 1", None, 0).unwrap(), "SELECT 1");
        assert!(bind("SELECT ?, ?, ?, ?", Some(&b), 0).is_err());
    }

    #[test]
    fn a_vector_with_a_null_element_or_a_non_number_is_refused() {
        let mut vectors = ListBuilder::new(Float64Builder::new());
        vectors.values().append_value(1.0);
        vectors.values().append_null();
        vectors.append(true);
        let vectors = vectors.finish();
        assert!(literal(&vectors, 0).unwrap_err().contains("NULL element"));
        let mut strings = ListBuilder::new(datafusion::arrow::array::StringBuilder::new());
        strings.values().append_value("x");
        strings.append(true);
        assert!(
            literal(&strings.finish(), 0)
                .unwrap_err()
                .contains("not a vector")
        );
    }
}

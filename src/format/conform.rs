//! Conforming rows to a table's schema before they are written: same column types (a value
//! that does not fit is an error, never a silent NULL), NOT NULL enforced, and no NULL
//! element inside a vector (a NULL vector is fine). Every way rows enter a table (INSERT,
//! CREATE TABLE AS, UPDATE, MERGE) goes through [`conform_batch`].

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;

use super::error::{FormatError, Result};
use super::types::{display_type, has_null_element, vector_dim};

/// Conforms a batch to the table schema: same column types, nullability enforced.
pub fn conform_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.num_columns() != schema.fields().len() {
        return Err(FormatError::invalid(format!(
            "expected {} columns, got {}",
            schema.fields().len(),
            batch.num_columns()
        )));
    }
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(FormatError::invalid(format!(
                "column '{}' is NOT NULL but the statement gives it a NULL value",
                field.name()
            )));
        }
        let column = if column.data_type() == field.data_type() {
            column.clone()
        } else {
            // `safe: false`: a value that does not fit is an error, never a silent NULL.
            let options = datafusion::arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            datafusion::arrow::compute::cast_with_options(column, field.data_type(), &options)
                .map_err(|e| {
                    FormatError::invalid(format!(
                        "cannot store a {} value in column '{}' of type {}: {e}",
                        column.data_type(),
                        field.name(),
                        display_type(field.data_type())
                    ))
                })?
        };
        if vector_dim(field.data_type()).is_some()
            && let Some(row) = row_with_null_element(&column)
        {
            return Err(FormatError::invalid(format!(
                "column '{}': the vector in row {} of the statement holds a NULL element; a \
                 vector must have a value in every element (a NULL vector is allowed)",
                field.name(),
                row + 1
            )));
        }
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The first non-NULL vector of a `FixedSizeList` column with a NULL element, if any.
fn row_with_null_element(column: &ArrayRef) -> Option<usize> {
    let list = column.as_fixed_size_list_opt()?;
    let n = list.value_length() as usize;
    (0..list.len()).find(|&i| list.is_valid(i) && has_null_element(list.values(), i * n, n))
}

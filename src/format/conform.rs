//! Conforming rows to a table's schema before they are written: same column types (a value
//! that does not fit is an error, never a silent NULL), NOT NULL enforced, and no NULL,
//! NaN or infinite element inside a vector (a NULL vector is fine; as in pgvector, a
//! distance to a vector that is not finite means nothing, and an index cannot bound it). Every way rows enter a table (INSERT,
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
        if vector_dim(field.data_type()).is_some()
            && let Some(row) = row_with_non_finite_element(&column)
        {
            return Err(FormatError::invalid(format!(
                "column '{}': the vector in row {} of the statement holds NaN or an infinite \
                 value; vector elements must be finite numbers",
                field.name(),
                row + 1
            )));
        }
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The first non-NULL vector of a `FixedSizeList` column of floats with a NaN or infinite
/// element, if any.
fn row_with_non_finite_element(column: &ArrayRef) -> Option<usize> {
    use datafusion::arrow::datatypes::{Float16Type, Float32Type, Float64Type};
    let list = column.as_fixed_size_list_opt()?;
    let n = list.value_length() as usize;
    let values = list.values();
    let bad_at = |finite: &dyn Fn(usize) -> bool| {
        (0..list.len()).find(|&i| list.is_valid(i) && !(i * n..(i + 1) * n).all(finite))
    };
    if let Some(v) = values.as_primitive_opt::<Float32Type>() {
        bad_at(&|j| v.value(j).is_finite())
    } else if let Some(v) = values.as_primitive_opt::<Float64Type>() {
        bad_at(&|j| v.value(j).is_finite())
    } else if let Some(v) = values.as_primitive_opt::<Float16Type>() {
        bad_at(&|j| v.value(j).is_finite())
    } else {
        None
    }
}

/// The first non-NULL vector of a `FixedSizeList` column with a NULL element, if any.
fn row_with_null_element(column: &ArrayRef) -> Option<usize> {
    let list = column.as_fixed_size_list_opt()?;
    let n = list.value_length() as usize;
    (0..list.len()).find(|&i| list.is_valid(i) && has_null_element(list.values(), i * n, n))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{FixedSizeListArray, Float32Array};
    use datafusion::arrow::buffer::NullBuffer;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn vectors(values: Vec<f32>, valid: Vec<bool>) -> (SchemaRef, RecordBatch) {
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let ty = DataType::FixedSizeList(item.clone(), 2);
        let schema = Arc::new(Schema::new(vec![Field::new("v", ty, true)]));
        let list = FixedSizeListArray::new(
            item,
            2,
            Arc::new(Float32Array::from(values)),
            Some(NullBuffer::from(valid)),
        );
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list)]).unwrap();
        (schema, batch)
    }

    #[test]
    fn vectors_with_nan_or_infinite_elements_are_refused() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (schema, batch) = vectors(vec![1.0, 2.0, 3.0, bad], vec![true, true]);
            let e = conform_batch(&batch, &schema).unwrap_err().to_string();
            assert!(
                e.contains("row 2") && e.contains("NaN or an infinite"),
                "{e}"
            );
        }
        // A NULL vector's hidden elements are not values.
        let (schema, batch) = vectors(vec![1.0, 2.0, f32::NAN, 0.0], vec![true, false]);
        conform_batch(&batch, &schema).unwrap();
    }
}

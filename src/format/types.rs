//! SQL types fragvec adds: `VECTOR(n)` is `FixedSizeList<Float32>[n]`, as is `FLOAT[n]`.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};

/// The Arrow type of a `VECTOR(dim)` column.
pub fn vector_type(dim: i32) -> DataType {
    DataType::FixedSizeList(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        dim,
    )
}

/// The dimension, if `dt` is a vector type.
pub fn vector_dim(dt: &DataType) -> Option<i32> {
    match dt {
        DataType::FixedSizeList(f, n) if f.data_type() == &DataType::Float32 => Some(*n),
        _ => None,
    }
}

/// A type as users write it in SQL where we have a name for it, else Arrow's name.
pub fn display_type(dt: &DataType) -> String {
    match vector_dim(dt) {
        Some(n) => format!("VECTOR({n})"),
        None => dt.to_string(),
    }
}

/// Normalizes a column type for storage: every `FixedSizeList<Float32>` gets the canonical
/// (nullable `item`) child field, whatever the SQL planner produced.
pub fn normalize(dt: &DataType) -> DataType {
    match vector_dim(dt) {
        Some(n) => vector_type(n),
        None => dt.clone(),
    }
}

/// Whether elements `start..start + len` of a vector's values hold a NULL. A vector with a
/// NULL element has no distance and may not be stored (a NULL vector is fine).
#[inline]
pub fn has_null_element(
    values: &dyn datafusion::arrow::array::Array,
    start: usize,
    len: usize,
) -> bool {
    values
        .nulls()
        .is_some_and(|n| n.null_count() > 0 && n.slice(start, len).null_count() > 0)
}

//! Column types Parquet cannot store as they are, and the storable types they are written as.
//!
//! A table's manifest keeps its declared (*logical*) Arrow schema. Parquet 59's `ArrowWriter`
//! and reader do not round-trip every Arrow type (measured, not assumed, by the test
//! `writer_rejects_exactly_the_mapped_types`):
//! * `Interval(MonthDayNano)` makes the writer panic (Parquet's INTERVAL has milliseconds);
//! * a dictionary whose values are not bytes, numbers, dates or times (a boolean, a nested
//!   dictionary, a list, a struct, a view type, an interval, ...) fails to write or to read
//!   back, some with a panic in the writer or the reader;
//! * a run-end encoded column is written decoded and read back decoded.
//!
//! Such a column is written as its *storage type* ([`storage_type`]) and turned back into the
//! declared type on read, so a query sees exactly what DataFusion's memory tables hold:
//! * `Interval(MonthDayNano)` → `Struct{months: Int32, days: Int32, nanoseconds: Int64}`
//!   (children NOT NULL). The struct's validity is the interval's, one definition level, so a
//!   NULL interval comes back NULL and a non-NULL one never has a NULL part; the three parts
//!   stay readable (and correctly typed) for other Parquet readers, which a
//!   `FixedSizeBinary(16)` of native-endian bytes would not be.
//! * `Dictionary(K, V)` that Parquet rejects → the storage type of `V`, decoded; on read the
//!   values are dictionary-encoded again (distinct values by Arrow's row format, which keeps
//!   distinct bit patterns apart, so `-0.0` and `0.0` stay two values).
//! * `RunEndEncoded(R, V)` → the storage type of `V`, decoded; re-encoded with Arrow's `cast`.
//! * `Struct`, `List`, `LargeList`, `FixedSizeList` and `Map` map their children.
//!
//! One mapping is for speed, not because Parquet needs it: a table's vector column
//! (`FixedSizeList<Float32>[n]`, a column of its own, not nested in another type) is stored
//! packed as `FixedSizeBinary(4n)` (see [`super::packed_vectors`]).
//!
//! Every other type is its own storage type, and its arrays pass through untouched (a table of
//! such types is written exactly as before this module existed).
//!
//! Invariants:
//! * the stored value is NULL exactly where the declared value is (logically) NULL, so the
//!   Parquet null counts of a mapped column are still right (`row_groups_with_nulls` relies on
//!   them); no other Parquet statistic is read for pruning anywhere in fragvec;
//! * `from_storage(to_storage(a), a.data_type())` equals `a` logically: same length, same
//!   NULLs, same values, same declared type (dictionary keys and run ends may differ).
//!
//! The caller ([`super::fragment_io`]) checks that a file holds the storage type before calling
//! [`from_storage`]; a type that is neither the declared nor its storage type is rejected as an
//! Arrow error, never a panic. A re-encoding can fail where the declared type is too narrow for
//! a read batch (a `Dictionary(Int8, _)` batch with more than 128 distinct values, a
//! `RunEndEncoded(Int16, _)` batch longer than 32,767 rows): that is an error too.
//!
//! Pure arithmetic, no IO; costs one pass (and, to re-encode a dictionary, a hash table of
//! the batch's distinct values) per mapped column and batch, nothing for other columns.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, GenericListArray, Int32Array, Int64Array,
    IntervalMonthDayNanoArray, MapArray, OffsetSizeTrait, StructArray, UInt64Array, make_array,
};
use datafusion::arrow::compute::{CastOptions, cast, cast_with_options, take};
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Fields, Int32Type, Int64Type, IntervalMonthDayNano,
    IntervalMonthDayNanoType, IntervalUnit, Schema, SchemaRef, UInt64Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::row::{RowConverter, SortField};

use super::packed_vectors::{pack, packed_type, unpack};

type Result<T> = std::result::Result<T, ArrowError>;

/// The struct an `Interval(MonthDayNano)` is stored as.
fn interval_fields() -> Fields {
    Fields::from(vec![
        Field::new("months", DataType::Int32, false),
        Field::new("days", DataType::Int32, false),
        Field::new("nanoseconds", DataType::Int64, false),
    ])
}

/// Whether Parquet writes and reads back a dictionary of `values` as it is.
fn parquet_keeps_dictionary_of(values: &DataType) -> bool {
    use DataType::*;
    matches!(
        values,
        Utf8 | LargeUtf8
            | Binary
            | LargeBinary
            | FixedSizeBinary(_)
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float32
            | Float64
            | Decimal32(_, _)
            | Decimal64(_, _)
            | Decimal128(_, _)
            | Decimal256(_, _)
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
    )
}

/// The type a column declared as `dt` is written to Parquet as (`dt` itself for every type
/// Parquet stores as it is).
pub fn storage_type(dt: &DataType) -> DataType {
    packed_type(dt).unwrap_or_else(|| nested_storage_type(dt))
}

/// The storage type of `dt` anywhere in a column (a vector inside a struct or a list is
/// stored as a list).
fn nested_storage_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Interval(IntervalUnit::MonthDayNano) => DataType::Struct(interval_fields()),
        DataType::Dictionary(_, values) if !parquet_keeps_dictionary_of(values) => {
            nested_storage_type(values)
        }
        DataType::RunEndEncoded(_, values) => nested_storage_type(values.data_type()),
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().map(nested_storage_field).collect::<Fields>())
        }
        DataType::List(f) => DataType::List(nested_storage_field(f)),
        DataType::LargeList(f) => DataType::LargeList(nested_storage_field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(nested_storage_field(f), *n),
        DataType::Map(f, sorted) => DataType::Map(nested_storage_field(f), *sorted),
        _ => dt.clone(),
    }
}

/// `field` (a column) with its storage type (the same `Arc` when nothing changes).
pub fn storage_field(field: &FieldRef) -> FieldRef {
    with_type(field, storage_type(field.data_type()))
}

fn nested_storage_field(field: &FieldRef) -> FieldRef {
    with_type(field, nested_storage_type(field.data_type()))
}

fn with_type(field: &FieldRef, stored: DataType) -> FieldRef {
    if &stored == field.data_type() {
        field.clone()
    } else {
        Arc::new(field.as_ref().clone().with_data_type(stored))
    }
}

/// `schema` with every column's storage type (the same `Arc` when nothing changes).
pub fn storage_schema(schema: &SchemaRef) -> SchemaRef {
    if schema
        .fields()
        .iter()
        .all(|f| &storage_type(f.data_type()) == f.data_type())
    {
        return schema.clone();
    }
    let fields: Fields = schema.fields().iter().map(storage_field).collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Whether a column of type `dt` is stored as another type.
pub fn is_mapped(dt: &DataType) -> bool {
    &storage_type(dt) != dt
}

/// A type the Parquet writer cannot handle at all (it panics on a union), as a reason.
pub fn unstorable(dt: &DataType) -> Option<String> {
    match dt {
        DataType::Union(_, _) => Some(format!("Parquet cannot store a union ({dt})")),
        DataType::Dictionary(_, v) => unstorable(v),
        DataType::RunEndEncoded(_, f)
        | DataType::List(f)
        | DataType::LargeList(f)
        | DataType::FixedSizeList(f, _)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::Map(f, _) => unstorable(f.data_type()),
        DataType::Struct(fields) => fields.iter().find_map(|f| unstorable(f.data_type())),
        _ => None,
    }
}

/// The stored form of `array`, a column of its own, declared type.
pub fn to_storage(array: &ArrayRef) -> Result<ArrayRef> {
    match packed_type(array.data_type()) {
        Some(_) => Ok(Arc::new(pack(array.as_fixed_size_list())?)),
        None => nested_to_storage(array),
    }
}

fn nested_to_storage(array: &ArrayRef) -> Result<ArrayRef> {
    let dt = array.data_type();
    if &nested_storage_type(dt) == dt {
        return Ok(array.clone());
    }
    match dt {
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let a = array.as_primitive::<IntervalMonthDayNanoType>();
            let values = a.values();
            let months = Int32Array::from_iter_values(values.iter().map(|v| v.months));
            let days = Int32Array::from_iter_values(values.iter().map(|v| v.days));
            let nanos = Int64Array::from_iter_values(values.iter().map(|v| v.nanoseconds));
            let columns: Vec<ArrayRef> = vec![Arc::new(months), Arc::new(days), Arc::new(nanos)];
            Ok(Arc::new(StructArray::try_new(
                interval_fields(),
                columns,
                a.nulls().cloned(),
            )?))
        }
        DataType::Dictionary(_, _) => nested_to_storage(&decode_dictionary(array)?),
        DataType::RunEndEncoded(_, values) => nested_to_storage(&cast(array, values.data_type())?),
        DataType::Struct(_) => {
            let s = array.as_struct();
            let columns = s
                .columns()
                .iter()
                .map(nested_to_storage)
                .collect::<Result<Vec<_>>>()?;
            let fields = fields_of(&nested_storage_type(dt))?;
            Ok(Arc::new(StructArray::try_new(
                fields,
                columns,
                s.nulls().cloned(),
            )?))
        }
        DataType::List(_) => list(
            array.as_list::<i32>(),
            &nested_storage_type(dt),
            nested_to_storage,
        ),
        DataType::LargeList(_) => list(
            array.as_list::<i64>(),
            &nested_storage_type(dt),
            nested_to_storage,
        ),
        DataType::FixedSizeList(_, _) => fixed_list(
            array.as_fixed_size_list(),
            &nested_storage_type(dt),
            nested_to_storage,
        ),
        DataType::Map(_, _) => map(array.as_map(), &nested_storage_type(dt), nested_to_storage),
        _ => Err(mismatch(dt, dt)),
    }
}

/// The declared form (`logical`) of `array`, which holds `storage_type(logical)` (or already
/// `logical`).
pub fn from_storage(array: &ArrayRef, logical: &DataType) -> Result<ArrayRef> {
    match array.as_fixed_size_binary_opt() {
        Some(packed) if packed_type(logical).is_some() => Ok(Arc::new(unpack(packed, logical)?)),
        // A vector column written before packing holds its declared type.
        _ => nested_from_storage(array, logical),
    }
}

fn nested_from_storage(array: &ArrayRef, logical: &DataType) -> Result<ArrayRef> {
    let dt = array.data_type();
    if dt == logical {
        return Ok(array.clone());
    }
    if dt != &nested_storage_type(logical) {
        return Err(mismatch(dt, logical));
    }
    match logical {
        DataType::Interval(IntervalUnit::MonthDayNano) => interval_from_struct(array.as_struct()),
        DataType::Dictionary(key, values) => {
            let decoded = nested_from_storage(array, values)?;
            encode_dictionary(&decoded, key, values)
        }
        DataType::RunEndEncoded(_, values) => {
            let decoded = nested_from_storage(array, values.data_type())?;
            let options = CastOptions {
                safe: false,
                ..Default::default()
            };
            retag(cast_with_options(&decoded, logical, &options)?, logical)
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let columns = s
                .columns()
                .iter()
                .zip(fields.iter())
                .map(|(c, f)| nested_from_storage(c, f.data_type()))
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                columns,
                s.nulls().cloned(),
            )?))
        }
        DataType::List(f) => list(array.as_list::<i32>(), logical, |v| {
            nested_from_storage(v, f.data_type())
        }),
        DataType::LargeList(f) => list(array.as_list::<i64>(), logical, |v| {
            nested_from_storage(v, f.data_type())
        }),
        DataType::FixedSizeList(f, _) => fixed_list(array.as_fixed_size_list(), logical, |v| {
            nested_from_storage(v, f.data_type())
        }),
        DataType::Map(f, _) => map(array.as_map(), logical, |v| {
            nested_from_storage(v, f.data_type())
        }),
        _ => Err(mismatch(dt, logical)),
    }
}

fn mismatch(stored: &DataType, logical: &DataType) -> ArrowError {
    ArrowError::InvalidArgumentError(format!(
        "a column declared {logical} is stored as {}, not {stored}",
        storage_type(logical)
    ))
}

fn fields_of(dt: &DataType) -> Result<Fields> {
    match dt {
        DataType::Struct(f) => Ok(f.clone()),
        _ => Err(ArrowError::InvalidArgumentError(format!(
            "{dt} is no struct"
        ))),
    }
}

fn interval_from_struct(s: &StructArray) -> Result<ArrayRef> {
    let valid = |i: usize| s.is_valid(i);
    for (c, f) in s.columns().iter().zip(s.fields()) {
        if c.null_count() > 0 && (0..s.len()).any(|i| valid(i) && c.is_null(i)) {
            return Err(ArrowError::InvalidArgumentError(format!(
                "a stored interval has a NULL '{}'",
                f.name()
            )));
        }
    }
    let months = s.column(0).as_primitive::<Int32Type>();
    let days = s.column(1).as_primitive::<Int32Type>();
    let nanos = s.column(2).as_primitive::<Int64Type>();
    let values: Vec<IntervalMonthDayNano> = (0..s.len())
        .map(|i| IntervalMonthDayNano::new(months.value(i), days.value(i), nanos.value(i)))
        .collect();
    Ok(Arc::new(IntervalMonthDayNanoArray::try_new(
        values.into(),
        s.nulls().cloned(),
    )?))
}

/// The values of a dictionary array, one per row (a NULL key gives a NULL).
fn decode_dictionary(array: &ArrayRef) -> Result<ArrayRef> {
    let dict = array.as_any_dictionary();
    let keys = cast(dict.keys(), &DataType::UInt64)?;
    take(
        dict.values().as_ref(),
        keys.as_primitive::<UInt64Type>(),
        None,
    )
}

/// `values` dictionary-encoded with keys of type `key`: one dictionary entry per distinct
/// non-NULL value, in order of first appearance; a NULL value gets a NULL key.
fn encode_dictionary(values: &ArrayRef, key: &DataType, value_type: &DataType) -> Result<ArrayRef> {
    let converter = RowConverter::new(vec![SortField::new(values.data_type().clone())])?;
    let rows = converter.convert_columns(std::slice::from_ref(values))?;
    let nulls = values.logical_nulls();
    let mut seen: HashMap<_, u64> = HashMap::new();
    let mut firsts: Vec<u64> = Vec::new();
    let keys: UInt64Array = (0..values.len())
        .map(|i| {
            if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
                return None;
            }
            let next = firsts.len() as u64;
            let k = *seen.entry(rows.row(i)).or_insert(next);
            if k == next {
                firsts.push(i as u64);
            }
            Some(k)
        })
        .collect();
    let dictionary = take(values.as_ref(), &UInt64Array::from(firsts), None)?;
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let keys = cast_with_options(&keys, key, &options).map_err(|e| {
        ArrowError::InvalidArgumentError(format!(
            "{} distinct values do not fit keys of type {key}: {e}",
            dictionary.len()
        ))
    })?;
    let dt = DataType::Dictionary(Box::new(key.clone()), Box::new(value_type.clone()));
    let data = keys
        .to_data()
        .into_builder()
        .data_type(dt)
        .child_data(vec![dictionary.to_data()])
        .build()?;
    Ok(make_array(data))
}

/// `array` re-labelled as `logical` (field names and nullability of a cast's result may differ
/// from the declared ones); the data is validated against the new type.
fn retag(array: ArrayRef, logical: &DataType) -> Result<ArrayRef> {
    if array.data_type() == logical {
        return Ok(array);
    }
    let data = array
        .to_data()
        .into_builder()
        .data_type(logical.clone())
        .build()?;
    Ok(make_array(data))
}

fn child_field(dt: &DataType) -> Result<FieldRef> {
    match dt {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => Ok(f.clone()),
        _ => Err(ArrowError::InvalidArgumentError(format!(
            "{dt} has no child"
        ))),
    }
}

/// A list of type `to` with `convert`ed values and the same offsets and NULLs.
fn list<O: OffsetSizeTrait>(
    a: &GenericListArray<O>,
    to: &DataType,
    convert: impl Fn(&ArrayRef) -> Result<ArrayRef>,
) -> Result<ArrayRef> {
    let values = convert(a.values())?;
    Ok(Arc::new(GenericListArray::<O>::try_new(
        child_field(to)?,
        a.offsets().clone(),
        values,
        a.nulls().cloned(),
    )?))
}

fn fixed_list(
    a: &FixedSizeListArray,
    to: &DataType,
    convert: impl Fn(&ArrayRef) -> Result<ArrayRef>,
) -> Result<ArrayRef> {
    let values = convert(a.values())?;
    Ok(Arc::new(FixedSizeListArray::try_new(
        child_field(to)?,
        a.value_length(),
        values,
        a.nulls().cloned(),
    )?))
}

fn map(
    a: &MapArray,
    to: &DataType,
    convert: impl Fn(&ArrayRef) -> Result<ArrayRef>,
) -> Result<ArrayRef> {
    let DataType::Map(_, sorted) = to else {
        return Err(ArrowError::InvalidArgumentError(format!("{to} is no map")));
    };
    let entries: ArrayRef = Arc::new(a.entries().clone());
    let entries = convert(&entries)?;
    Ok(Arc::new(MapArray::try_new(
        child_field(to)?,
        a.offsets().clone(),
        entries.as_struct().clone(),
        a.nulls().cloned(),
        *sorted,
    )?))
}

#[cfg(test)]
pub(crate) mod tests;

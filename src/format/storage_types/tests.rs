//! What Parquet really stores (measured, not assumed), and round trips of the mapped types
//! through their storage types and a real Parquet file.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, FixedSizeBinaryArray, Float64Array, Int8Array,
    Int32Array, Int64Array, IntervalDayTimeArray, IntervalMonthDayNanoArray,
    IntervalYearMonthArray, ListArray, RecordBatch, StringArray, StructArray, UInt64Array,
};
use datafusion::arrow::compute::{cast, concat};
use datafusion::arrow::datatypes::{
    DataType, Field, Fields, Int32Type, IntervalDayTime, IntervalMonthDayNano, IntervalUnit,
    Schema, TimeUnit, UnionFields, UnionMode,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use proptest::prelude::*;

use super::*;

/// Writes `array` as the one column of a Parquet file and reads it back, as fragvec's writer
/// and reader do (the Arrow schema embedded as a hint). A writer panic is an error here.
pub(crate) fn through_parquet(array: &ArrayRef) -> std::result::Result<ArrayRef, String> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "c",
        array.data_type().clone(),
        true,
    )]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![array.clone()]).map_err(|e| e.to_string())?;
    let written = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut writer = ArrowWriter::try_new(Vec::new(), schema, None)?;
        writer.write(&batch)?;
        writer.into_inner()
    }))
    .map_err(|_| "the writer panicked".to_string())?
    .map_err(|e| e.to_string())?;
    // The reader panics on some hints too.
    let batches = std::panic::catch_unwind(|| {
        ParquetRecordBatchReaderBuilder::try_new(Bytes::from(written))
            .and_then(|b| b.build())
            .map_err(|e| e.to_string())?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    })
    .map_err(|_| "the reader panicked".to_string())??;
    let columns: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
    if columns.is_empty() {
        return Ok(datafusion::arrow::array::new_empty_array(array.data_type()));
    }
    concat(&columns).map_err(|e| e.to_string())
}

/// The values of `array` as text, row by row (dictionary keys and run ends do not show), with
/// its type: what a query sees.
fn seen(array: &dyn Array) -> (DataType, Vec<String>) {
    let options = FormatOptions::default().with_null("NULL");
    let f = ArrayFormatter::try_new(array, &options).expect("formattable");
    let nulls = array.logical_nulls();
    let rows = (0..array.len())
        .map(|i| match nulls.as_ref().is_some_and(|n| n.is_null(i)) {
            true => "NULL".to_string(),
            false => f.value(i).to_string(),
        })
        .collect();
    (array.data_type().clone(), rows)
}

fn null_mask(array: &dyn Array) -> Vec<bool> {
    let nulls = array.logical_nulls();
    (0..array.len())
        .map(|i| nulls.as_ref().is_some_and(|n| n.is_null(i)))
        .collect()
}

/// Whether Parquet alone gives `array` back with its type and values.
fn parquet_keeps(array: &ArrayRef) -> std::result::Result<(), String> {
    let back = through_parquet(array)?;
    if seen(&back) != seen(array) {
        return Err(format!("read back as {}", back.data_type()));
    }
    Ok(())
}

/// `array` through its storage type and a Parquet file, back to its declared type.
fn mapped_round_trip(array: &ArrayRef) -> ArrayRef {
    let stored = to_storage(array).unwrap();
    assert_eq!(stored.data_type(), &storage_type(array.data_type()));
    assert_eq!(null_mask(&stored), null_mask(array), "NULLs are kept");
    let back = through_parquet(&stored).unwrap();
    from_storage(&back, array.data_type()).unwrap()
}

fn dictionary(values: ArrayRef, key: DataType) -> ArrayRef {
    let value_type = values.data_type().clone();
    encode_dictionary(&values, &key, &value_type).unwrap()
}

fn intervals() -> ArrayRef {
    Arc::new(IntervalMonthDayNanoArray::from(vec![
        Some(IntervalMonthDayNano::new(1, 2, 3)),
        None,
        Some(IntervalMonthDayNano::new(-1, 0, i64::MAX)),
        Some(IntervalMonthDayNano::new(1, 2, 3)),
    ]))
}

fn strings() -> ArrayRef {
    Arc::new(StringArray::from(vec![
        Some("a"),
        None,
        Some("b"),
        Some("a"),
    ]))
}

fn int_lists() -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![Some(1), None]),
        None,
        Some(vec![]),
        Some(vec![Some(1), None]),
    ]))
}

fn ree(values: ArrayRef, run_ends: DataType) -> ArrayRef {
    let dt = DataType::RunEndEncoded(
        Arc::new(Field::new("run_ends", run_ends, false)),
        Arc::new(Field::new("values", values.data_type().clone(), true)),
    );
    cast(&values, &dt).unwrap()
}

/// One array of each type whose storage was in question, with NULLs and repeats.
fn samples() -> Vec<ArrayRef> {
    let i32s: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(2), Some(1)]));
    let by = |values: ArrayRef| dictionary(values, DataType::Int32);
    let cast_to = |a: &ArrayRef, dt: DataType| cast(a, &dt).unwrap();
    let struct_of = |name: &str, a: ArrayRef| -> ArrayRef {
        Arc::new(StructArray::from(vec![(
            Arc::new(Field::new(name, a.data_type().clone(), true)),
            a,
        )]))
    };
    vec![
        intervals(),
        Arc::new(IntervalYearMonthArray::from(vec![Some(14), None])),
        Arc::new(IntervalDayTimeArray::from(vec![
            Some(IntervalDayTime::new(3, 4)),
            None,
        ])),
        by(strings()),
        dictionary(strings(), DataType::UInt8),
        by(cast_to(&strings(), DataType::LargeUtf8)),
        by(cast_to(&strings(), DataType::Binary)),
        dictionary(cast_to(&strings(), DataType::Binary), DataType::UInt32),
        by(cast_to(&strings(), DataType::LargeBinary)),
        by(cast_to(&strings(), DataType::Utf8View)),
        by(cast_to(&strings(), DataType::BinaryView)),
        by(Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![Some(b"ab".to_vec()), None, Some(b"ab".to_vec())].into_iter(),
                2,
            )
            .unwrap(),
        )),
        by(Arc::new(Int8Array::from(vec![Some(1), None, Some(1)]))),
        dictionary(i32s.clone(), DataType::Int16),
        by(Arc::new(Int64Array::from(vec![Some(1), None, Some(1)]))),
        by(Arc::new(UInt64Array::from(vec![Some(u64::MAX), None]))),
        by(Arc::new(Float64Array::from(vec![
            Some(-0.0),
            Some(0.0),
            None,
        ]))),
        by(cast_to(&i32s, DataType::Decimal128(10, 2))),
        by(Arc::new(Date32Array::from(vec![Some(1), None, Some(1)]))),
        by(cast_to(
            &i32s,
            DataType::Timestamp(TimeUnit::Nanosecond, None),
        )),
        by(Arc::new(BooleanArray::from(vec![Some(true), None]))),
        by(dictionary(strings(), DataType::UInt32)),
        by(int_lists()),
        by(struct_of("a", i32s.clone())),
        by(intervals()),
        ree(strings(), DataType::Int32),
        ree(i32s.clone(), DataType::Int64),
        ree(dictionary(strings(), DataType::UInt32), DataType::Int16),
        struct_of("iv", intervals()),
        struct_of("x", i32s.clone()),
        Arc::new(
            ListArray::try_new(
                Arc::new(Field::new_list_field(
                    DataType::Interval(IntervalUnit::MonthDayNano),
                    true,
                )),
                datafusion::arrow::buffer::OffsetBuffer::from_lengths([2, 0, 2]),
                intervals(),
                None,
            )
            .unwrap(),
        ),
    ]
}

/// The mapping is exactly what Parquet needs: every type kept as it is round-trips through
/// Parquet alone, and every mapped one does not (if this fails after a Parquet upgrade, a
/// mapping may be dropped, or one is missing; the message lists the types).
#[test]
fn writer_rejects_exactly_the_mapped_types() {
    let mut wrong = Vec::new();
    for array in samples() {
        let dt = array.data_type().clone();
        match (parquet_keeps(&array), is_mapped(&dt)) {
            (Ok(()), true) => wrong.push(format!("{dt}: Parquet keeps it, yet it is mapped")),
            (Err(e), false) => wrong.push(format!("{dt}: not mapped, yet Parquet: {e}")),
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every sample comes back through its storage type and Parquet as it was.
#[test]
fn samples_round_trip_through_parquet() {
    for array in samples() {
        let back = mapped_round_trip(&array);
        assert_eq!(seen(&back), seen(&array), "{}", array.data_type());
        let empty = array.slice(0, 0);
        assert_eq!(seen(&mapped_round_trip(&empty)), seen(&empty));
        let tail = array.slice(1, array.len() - 1);
        assert_eq!(
            seen(&mapped_round_trip(&tail)),
            seen(&tail),
            "{}",
            array.data_type()
        );
    }
}

#[test]
fn plain_types_are_their_own_storage() {
    for dt in [
        DataType::Int64,
        DataType::Utf8,
        DataType::Interval(IntervalUnit::DayTime),
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
    ] {
        assert_eq!(storage_type(&dt), dt);
    }
    // A vector column is packed; a vector inside another type stays a list.
    let vector = crate::format::types::vector_type(3);
    assert_eq!(storage_type(&vector), DataType::FixedSizeBinary(12));
    let nested = DataType::List(Arc::new(Field::new_list_field(vector.clone(), true)));
    assert_eq!(storage_type(&nested), nested);
    let nested_struct = DataType::Struct(Fields::from(vec![Field::new("v", vector, true)]));
    assert_eq!(storage_type(&nested_struct), nested_struct);
    let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
    assert!(Arc::ptr_eq(&storage_schema(&schema), &schema));
}

#[test]
fn storage_types_of_the_mapped_types() {
    let nested = DataType::Dictionary(
        Box::new(DataType::Int32),
        Box::new(DataType::Dictionary(
            Box::new(DataType::UInt32),
            Box::new(DataType::Utf8),
        )),
    );
    assert_eq!(
        storage_type(&nested),
        DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8))
    );
    let iv = DataType::Interval(IntervalUnit::MonthDayNano);
    assert_eq!(storage_type(&iv), DataType::Struct(interval_fields()));
    let list = DataType::List(Arc::new(Field::new_list_field(iv, true)));
    assert_eq!(
        storage_type(&list),
        DataType::List(Arc::new(Field::new_list_field(
            DataType::Struct(interval_fields()),
            true
        )))
    );
}

/// A file holding something else than the storage type is an error, not a panic.
#[test]
fn unexpected_stored_types_are_refused() {
    let iv = DataType::Interval(IntervalUnit::MonthDayNano);
    let e = from_storage(&strings(), &iv).unwrap_err();
    assert!(e.to_string().contains("stored as"), "{e}");
    // A NULL part of a non-NULL interval.
    let parts: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vec![Some(1), None])),
        Arc::new(Int32Array::from(vec![1, 1])),
        Arc::new(Int64Array::from(vec![1, 1])),
    ];
    let loose: Fields = interval_fields()
        .iter()
        .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
        .collect();
    let s = StructArray::try_new(loose, parts, None).unwrap();
    // Same shape as the storage type but for nullability: refused as a mismatch.
    assert!(from_storage(&(Arc::new(s.clone()) as ArrayRef), &iv).is_err());
    assert!(interval_from_struct(&s).is_err());
}

/// Keys too narrow for a batch's distinct values are an error naming the count.
#[test]
fn too_many_distinct_values_for_the_keys() {
    let values: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
        (0..200).map(|i| Some(vec![Some(i)])),
    ));
    let dt = DataType::Dictionary(
        Box::new(DataType::Int8),
        Box::new(values.data_type().clone()),
    );
    let e = from_storage(&values, &dt).unwrap_err();
    assert!(e.to_string().contains("200 distinct values"), "{e}");
}

#[test]
fn unions_are_refused_before_the_writer_panics() {
    let union = DataType::Union(
        UnionFields::try_new(vec![0], vec![Field::new("a", DataType::Int32, true)]).unwrap(),
        UnionMode::Sparse,
    );
    assert!(unstorable(&union).is_some());
    assert!(
        unstorable(&DataType::List(Arc::new(Field::new_list_field(
            union, true
        ))))
        .is_some()
    );
    assert!(unstorable(&DataType::Interval(IntervalUnit::MonthDayNano)).is_none());
}

fn sliced(array: ArrayRef, from: usize, len: usize) -> ArrayRef {
    let from = from.min(array.len());
    array.slice(from, len.min(array.len() - from))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Intervals with NULLs, any slice: back bit for bit (a wrong part would be a wrong
    /// date arithmetic result).
    #[test]
    fn prop_intervals_round_trip(
        values in prop::collection::vec(prop::option::of((any::<i32>(), any::<i32>(), any::<i64>())), 0..40),
        from in 0usize..40,
        len in 0usize..40,
    ) {
        let array: ArrayRef = Arc::new(IntervalMonthDayNanoArray::from(
            values.iter().map(|v| v.map(|(m, d, n)| IntervalMonthDayNano::new(m, d, n))).collect::<Vec<_>>(),
        ));
        let array = sliced(array, from, len);
        let back = mapped_round_trip(&array);
        prop_assert_eq!(back.to_data(), array.to_data());
    }

    /// Dictionaries of lists (Parquet rejects them) with NULL keys, NULL lists and NULL
    /// elements, any slice: the same values in the same type.
    #[test]
    fn prop_dictionaries_of_lists_round_trip(
        values in prop::collection::vec(prop::option::of(prop::collection::vec(prop::option::of(0i32..3), 0..3)), 0..40),
        from in 0usize..40,
        len in 0usize..40,
    ) {
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(values));
        let array = sliced(dictionary(lists, DataType::Int16), from, len);
        let back = mapped_round_trip(&array);
        prop_assert_eq!(seen(&back), seen(&array));
    }

    /// Run-end encoded strings (Parquet stores them decoded), any slice: declared type back.
    #[test]
    fn prop_run_end_encoded_round_trip(
        values in prop::collection::vec(prop::option::of(0u8..3), 0..40),
        from in 0usize..40,
        len in 0usize..40,
    ) {
        let strings: ArrayRef = Arc::new(StringArray::from(
            values.iter().map(|v| v.map(|v| v.to_string())).collect::<Vec<_>>(),
        ));
        let array = sliced(ree(strings, DataType::Int32), from, len);
        let back = mapped_round_trip(&array);
        prop_assert_eq!(seen(&back), seen(&array));
    }
}

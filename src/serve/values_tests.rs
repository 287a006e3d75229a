//! Tests of `values`: each type's text and binary forms, NUMERIC against a reference decoder.

use super::*;
use crate::serve::types::{VECTOR_OID, decode_vector_binary, fields};
use datafusion::arrow::array::{
    Date64Array, Decimal128Array, DurationMillisecondArray, FixedSizeListArray, Float32Array,
    Int32Array, Int64Array, IntervalMonthDayNanoArray, ListArray, StringArray, StructArray,
    Time64MicrosecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{Field, Int32Type, IntervalMonthDayNano, Schema};
use proptest::prelude::*;
use std::sync::Arc;

fn batch() -> RecordBatch {
    let values = Float32Array::from(vec![1.0, 2.5, -3.0, 0.0, 0.0, 0.0]);
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let vectors =
        FixedSizeListArray::new(item, 3, Arc::new(values), Some(vec![true, false].into()));
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("emb", vectors.data_type().clone(), true),
        Field::new("s", DataType::Utf8, true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from(vec![Some(7), None])),
            Arc::new(vectors),
            Arc::new(StringArray::from(vec![Some("a"), Some("b")])),
        ],
    )
    .unwrap()
}

/// A batch of one row from named columns.
fn row_of(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let schema = Schema::new(
        columns
            .iter()
            .map(|(n, c)| Field::new(*n, c.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, c)| c).collect(),
    )
    .unwrap()
}

/// The fields of a DataRow: each value's bytes or None for NULL.
fn values(row: &DataRow) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![];
    let mut at = 0;
    for _ in 0..row.field_count {
        let n = i32::from_be_bytes(row.data[at..at + 4].try_into().unwrap());
        at += 4;
        if n < 0 {
            out.push(None);
        } else {
            out.push(Some(row.data[at..at + n as usize].to_vec()));
            at += n as usize;
        }
    }
    assert_eq!(at, row.data.len());
    out
}

/// Every column of a one-row batch, encoded in `binary` or text.
fn encoded(b: &RecordBatch, binary: bool) -> Vec<Vec<u8>> {
    let f = fields(b.schema().as_ref(), |_| binary);
    let rows = encode_rows(b, &f).unwrap();
    values(&rows[0]).into_iter().map(Option::unwrap).collect()
}

#[test]
fn text_rows() {
    let b = batch();
    let f = fields(b.schema().as_ref(), |_| false);
    assert_eq!(f[1].datatype().oid(), VECTOR_OID);
    let rows = encode_rows(&b, &f).unwrap();
    assert_eq!(
        values(&rows[0]),
        vec![
            Some(b"7".to_vec()),
            Some(b"[1,2.5,-3]".to_vec()),
            Some(b"a".to_vec())
        ]
    );
    assert_eq!(values(&rows[1]), vec![None, None, Some(b"b".to_vec())]);
}

#[test]
fn binary_rows_and_vectors_round_trip() {
    let b = batch();
    let f = fields(b.schema().as_ref(), |_| true);
    let rows = encode_rows(&b, &f).unwrap();
    let v = values(&rows[0]);
    assert_eq!(v[0].as_deref(), Some(&7i64.to_be_bytes()[..]));
    assert_eq!(
        decode_vector_binary(v[1].as_ref().unwrap()).unwrap(),
        vec![1.0, 2.5, -3.0]
    );
    assert!(decode_vector_binary(&[0, 2, 0, 0, 0]).is_err());
    assert!(decode_vector_binary(&[0, 0, 0, 0]).is_err());
}

/// The columns psycopg's binary cursors and asyncpg could not read when they went as text
/// (fragvec_versions' UInt64s, DECIMAL, INTERVAL, TIME, ...) all go in binary when asked.
#[test]
fn every_type_is_sent_in_the_format_asked() {
    let strings = ListArray::from_iter_primitive::<Int32Type, _, _>([Some([Some(1), None])]);
    let interval = IntervalMonthDayNano::new(1, 2, 3_000);
    let b = row_of(vec![
        ("u64", Arc::new(UInt64Array::from(vec![u64::MAX]))),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(vec![-1_234_567_i128])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
        ),
        (
            "iv",
            Arc::new(IntervalMonthDayNanoArray::from(vec![interval])),
        ),
        (
            "dur",
            Arc::new(DurationMillisecondArray::from(vec![90_061_500])),
        ),
        ("t", Arc::new(Time64MicrosecondArray::from(vec![1_000_001]))),
        (
            "d64",
            Arc::new(Date64Array::from(vec![(10_957 + 1) * 86_400_000])),
        ),
        (
            "f16",
            datafusion::arrow::compute::cast(&Float32Array::from(vec![1.5]), &DataType::Float16)
                .unwrap(),
        ),
        ("ints", Arc::new(strings)),
        (
            "st",
            Arc::new(StructArray::from(vec![(
                Arc::new(Field::new("a", DataType::Int32, true)),
                Arc::new(Int32Array::from(vec![4])) as ArrayRef,
            )])),
        ),
    ]);
    let f = fields(b.schema().as_ref(), |_| true);
    assert!(f.iter().all(|f| f.format() == FieldFormat::Binary));
    let bin = encoded(&b, true);
    assert_eq!(numeric_text(&bin[0]), u64::MAX.to_string());
    assert_eq!(numeric_text(&bin[1]), "-12345.67");
    assert_eq!(
        bin[2],
        [
            3i64.to_be_bytes().as_slice(),
            &2i32.to_be_bytes(),
            &1i32.to_be_bytes()
        ]
        .concat()
    );
    assert_eq!(&bin[3][..8], &90_061_500_000i64.to_be_bytes());
    assert_eq!(bin[4], 1_000_001i64.to_be_bytes());
    assert_eq!(bin[5], 1i32.to_be_bytes());
    assert_eq!(bin[6], 1.5f32.to_be_bytes());
    // int4[] {1,NULL}: one dimension, has NULLs, element int4, 2 elements from 1.
    let mut array = vec![];
    for x in [1i32, 1, 23, 2, 1, 4, 1, -1] {
        array.extend_from_slice(&x.to_be_bytes());
    }
    assert_eq!(bin[7], array);
    assert_eq!(bin[8], b"{a: 4}");

    let text: Vec<String> = encoded(&b, false)
        .into_iter()
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    assert_eq!(
        text[..7],
        [
            u64::MAX.to_string().as_str(),
            "-12345.67",
            "1 mon 2 days 00:00:00.000003",
            "25:01:01.5",
            "00:00:01.000001",
            "2000-01-02",
            "1.5",
        ]
    );
    assert_eq!(text[7], "{1,NULL}");
}

#[test]
fn array_text_quotes_what_postgresql_would() {
    let list = ListArray::new(
        Arc::new(Field::new("item", DataType::Utf8, true)),
        datafusion::arrow::buffer::OffsetBuffer::from_lengths([7]),
        Arc::new(StringArray::from(vec![
            Some("a b"),
            Some(""),
            Some("null"),
            Some("x"),
            None,
            Some("q\"\\"),
            Some("{,}"),
        ])),
        None,
    );
    let b = row_of(vec![("l", Arc::new(list))]);
    let text = String::from_utf8(encoded(&b, false).remove(0)).unwrap();
    assert_eq!(text, r#"{"a b","","null",x,NULL,"q\"\\","{,}"}"#);
    // In binary, text elements are their bytes, a NULL is length -1.
    let bin = encoded(&b, true).remove(0);
    assert_eq!(&bin[8..12], &Type::TEXT.oid().to_be_bytes());
    assert_eq!(&bin[4..8], &1i32.to_be_bytes());
}

#[test]
fn interval_text_is_postgresql_style() {
    let hms = |h: i64, m: i64, s: f64| (h * 3600 + m * 60) * 1_000_000 + (s * 1e6) as i64;
    assert_eq!(
        interval_text(14, 3, hms(4, 5, 6.5)),
        "1 year 2 mons 3 days 04:05:06.5"
    );
    assert_eq!(interval_text(0, 0, 0), "00:00:00");
    assert_eq!(interval_text(-1, 0, -hms(1, 0, 0.0)), "-1 mons -01:00:00");
    assert_eq!(interval_text(24, -1, 0), "2 years -1 days");
}

/// A NUMERIC's binary form read back as PostgreSQL prints it, checking that it is canonical
/// (digits below 10000, no leading or trailing zero digits, nothing past the display scale).
fn numeric_text(b: &[u8]) -> String {
    let i16_at = |at: usize| i16::from_be_bytes([b[at], b[at + 1]]);
    let (n, weight, sign, dscale) = (i16_at(0), i16_at(2) as i32, i16_at(4) as u16, i16_at(6));
    assert!(sign == 0 || sign == 0x4000, "sign {sign:#x}");
    assert_eq!(b.len(), 8 + 2 * n as usize);
    let digits: Vec<i16> = (0..n as usize).map(|i| i16_at(8 + 2 * i)).collect();
    assert!(digits.iter().all(|d| (0..10_000).contains(d)));
    assert_ne!(digits.first(), Some(&0));
    assert_ne!(digits.last(), Some(&0));
    let groups = (dscale as i32 + 3) / 4;
    assert!(
        digits.is_empty() || weight - (n as i32 - 1) >= -groups,
        "digits past the scale"
    );
    let digit = |pow: i32| -> i16 {
        let idx = weight - pow;
        if idx >= 0 && idx < n as i32 {
            digits[idx as usize]
        } else {
            0
        }
    };
    let int: String = (0..=weight.max(0))
        .rev()
        .map(|p| format!("{:04}", digit(p)))
        .collect();
    let int = match int.trim_start_matches('0') {
        "" => "0",
        s => s,
    };
    let mut frac: String = (1..=groups).map(|p| format!("{:04}", digit(-p))).collect();
    frac.truncate(dscale as usize);
    let sign = if sign == 0x4000 { "-" } else { "" };
    if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

/// How PostgreSQL prints `unscaled × 10^-scale` with `max(scale, 0)` decimals.
fn reference_text(unscaled: i128, scale: i8) -> String {
    let sign = if unscaled < 0 { "-" } else { "" };
    let abs = unscaled.unsigned_abs();
    if scale <= 0 {
        return format!("{sign}{}", abs * 10u128.pow(scale.unsigned_abs() as u32));
    }
    let p = 10u128.pow(scale as u32);
    format!("{sign}{}.{:0w$}", abs / p, abs % p, w = scale as usize)
}

#[test]
fn numeric_examples() {
    for (v, s, want) in [
        (0i128, 0i8, "0"),
        (0, 3, "0.000"),
        (1, 4, "0.0001"),
        (100_000_000, 0, "100000000"),
        (-5, 1, "-0.5"),
        (123, -2, "12300"),
        (1_234_567, 2, "12345.67"),
    ] {
        let mut out = BytesMut::new();
        put_numeric(&mut out, &v.to_string(), s);
        assert_eq!(numeric_text(&out), want, "{v} scale {s}");
    }
}

proptest! {
    #[test]
    fn numeric_binary_is_the_decimal(
        unscaled in -(10i128.pow(24))..10i128.pow(24),
        scale in -6i8..38,
    ) {
        let mut out = BytesMut::new();
        put_numeric(&mut out, &unscaled.to_string(), scale);
        prop_assert_eq!(numeric_text(&out), reference_text(unscaled, scale));
    }
}

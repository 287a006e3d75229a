//! Arrow types as PostgreSQL types, and values in PostgreSQL's text and binary formats.
//!
//! A `VECTOR(n)` column (`FixedSizeList<Float32>[n]`) is pgvector's `vector`, with the OID the
//! server's `pg_type` gives it ([`VECTOR_OID`]); its text form is `[1,2,3]` and its binary form
//! pgvector's: `int16` dimension, `int16` zero, then the elements as big-endian `float32`.
//! Everything else maps to the nearest built-in type; a type with no binary encoding here is
//! sent as text whatever the client asked, and its RowDescription says so.

use bytes::{BufMut, BytesMut};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    TimeUnit, UInt8Type, UInt16Type, UInt32Type,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use pgwire::api::Type;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::messages::data::DataRow;
use postgres_types::Kind;

/// pgvector's `vector` as this server's `pg_type` lists it (stable across restarts; a real
/// PostgreSQL assigns one at `CREATE EXTENSION`, so clients always look it up by name).
pub const VECTOR_OID: u32 = 16_385;
/// `vector[]`.
pub const VECTOR_ARRAY_OID: u32 = 16_386;
/// pgvector's `halfvec` and `sparsevec` (listed so type lookups find them; no column has them).
pub const HALFVEC_OID: u32 = 16_387;
/// `halfvec[]`.
pub const HALFVEC_ARRAY_OID: u32 = 16_388;
/// pgvector's `sparsevec`.
pub const SPARSEVEC_OID: u32 = 16_389;
/// `sparsevec[]`.
pub const SPARSEVEC_ARRAY_OID: u32 = 16_390;

/// The `vector` type.
pub fn vector_type() -> Type {
    Type::new("vector".into(), VECTOR_OID, Kind::Simple, "public".into())
}

/// Whether `ty` is the `vector` type (by OID).
pub fn is_vector(ty: &Type) -> bool {
    ty.oid() == VECTOR_OID
}

/// The type a client named by OID in Parse (0: left to the server).
pub fn type_of_oid(oid: u32) -> Option<Type> {
    match oid {
        0 => None,
        VECTOR_OID => Some(vector_type()),
        _ => Some(Type::from_oid(oid).unwrap_or(Type::UNKNOWN)),
    }
}

/// The PostgreSQL type a column of Arrow type `dt` is sent as.
pub fn pg_type(dt: &DataType) -> Type {
    match dt {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 => Type::INT8,
        DataType::UInt64 | DataType::Decimal128(..) | DataType::Decimal256(..) => Type::NUMERIC,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::TEXT,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Type::BYTEA,
        DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Time32(_) | DataType::Time64(_) => Type::TIME,
        DataType::Interval(_) | DataType::Duration(_) => Type::INTERVAL,
        DataType::FixedSizeList(f, _) if f.data_type() == &DataType::Float32 => vector_type(),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            match f.data_type() {
                DataType::Float32 => Type::FLOAT4_ARRAY,
                DataType::Float64 => Type::FLOAT8_ARRAY,
                DataType::Int64 => Type::INT8_ARRAY,
                DataType::Int32 => Type::INT4_ARRAY,
                DataType::Boolean => Type::BOOL_ARRAY,
                _ => Type::TEXT_ARRAY,
            }
        }
        _ => Type::TEXT,
    }
}

/// Whether values of `dt` can be sent in binary (else they go as text).
fn has_binary(dt: &DataType) -> bool {
    match dt {
        DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::UInt8
        | DataType::Int32
        | DataType::UInt16
        | DataType::Int64
        | DataType::UInt32
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::Date32 => true,
        DataType::Timestamp(_, _) => true,
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
            matches!(f.data_type(), DataType::Float32 | DataType::Float64)
        }
        _ => false,
    }
}

/// Field metadata naming the PostgreSQL type a column is sent as, where its Arrow type
/// alone would say otherwise (the catalog's `"char"` and `name` columns).
pub const PG_TYPE_METADATA: &str = "fragvec.pg_type";

/// The PostgreSQL type of `field`: its metadata's, else its Arrow type's.
pub fn field_type(field: &datafusion::arrow::datatypes::Field) -> Type {
    match field.metadata().get(PG_TYPE_METADATA).map(String::as_str) {
        Some("char") if field.data_type() == &DataType::Utf8 => Type::CHAR,
        Some("name") if field.data_type() == &DataType::Utf8 => Type::NAME,
        _ => pg_type(field.data_type()),
    }
}

/// The RowDescription of `schema`, each column in the format the client asked for
/// (`binary(i)`), or text where this server has no binary encoding of its type.
pub fn fields(
    schema: &datafusion::arrow::datatypes::Schema,
    binary: impl Fn(usize) -> bool,
) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let format = if binary(i) && has_binary(f.data_type()) {
                FieldFormat::Binary
            } else {
                FieldFormat::Text
            };
            FieldInfo::new(f.name().clone(), None, None, field_type(f), format)
        })
        .collect()
}

/// The rows of `batch` as DataRows in the formats of `fields`.
pub fn encode_rows(batch: &RecordBatch, fields: &[FieldInfo]) -> Result<Vec<DataRow>, String> {
    let options = FormatOptions::default().with_null("");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::with_capacity(batch.num_rows());
    let mut buf = BytesMut::new();
    for row in 0..batch.num_rows() {
        for (index, (col, field)) in batch.columns().iter().zip(fields).enumerate() {
            if col.is_null(row) {
                buf.put_i32(-1);
                continue;
            }
            let at = buf.len();
            buf.put_i32(0);
            match field.format() {
                FieldFormat::Binary => encode_binary(col, row, &mut buf)?,
                FieldFormat::Text => encode_text(col, row, &formatters[index], &mut buf)?,
            }
            let len = (buf.len() - at - 4) as i32;
            buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
        rows.push(DataRow::new(buf.split(), fields.len() as i16));
    }
    Ok(rows)
}

/// One value in PostgreSQL's text format.
fn encode_text(
    col: &ArrayRef,
    row: usize,
    formatter: &ArrayFormatter,
    out: &mut BytesMut,
) -> Result<(), String> {
    use std::fmt::Write;
    let mut s = String::new();
    match col.data_type() {
        DataType::Boolean => s.push(if col.as_boolean().value(row) {
            't'
        } else {
            'f'
        }),
        DataType::Float32 => s.push_str(&float_text(
            col.as_primitive::<Float32Type>().value(row) as f64,
            true,
        )),
        DataType::Float64 => s.push_str(&float_text(
            col.as_primitive::<Float64Type>().value(row),
            false,
        )),
        DataType::Timestamp(_, _) => {
            write!(s, "{}", formatter.value(row)).map_err(|e| e.to_string())?;
            s = s.replacen('T', " ", 1);
        }
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
            let values = list_values(col, row);
            let vector = matches!(col.data_type(), DataType::FixedSizeList(..))
                && f.data_type() == &DataType::Float32;
            let (open, close) = if vector { ('[', ']') } else { ('{', '}') };
            s.push(open);
            // Floats are printed here; any other element type by Arrow's formatter.
            let fmt_opts = FormatOptions::default().with_null("NULL");
            let inner = match values.data_type() {
                DataType::Float32 | DataType::Float64 => None,
                _ => Some(
                    ArrayFormatter::try_new(values.as_ref(), &fmt_opts)
                        .map_err(|e| e.to_string())?,
                ),
            };
            for i in 0..values.len() {
                if i > 0 {
                    s.push(',');
                }
                match values.data_type() {
                    DataType::Float32 if values.is_valid(i) => s.push_str(&float_text(
                        values.as_primitive::<Float32Type>().value(i) as f64,
                        true,
                    )),
                    DataType::Float64 if values.is_valid(i) => s.push_str(&float_text(
                        values.as_primitive::<Float64Type>().value(i),
                        false,
                    )),
                    _ => match &inner {
                        Some(f) => write!(s, "{}", f.value(i)).map_err(|e| e.to_string())?,
                        None => s.push_str("NULL"),
                    },
                }
            }
            s.push(close);
        }
        _ => write!(s, "{}", formatter.value(row)).map_err(|e| e.to_string())?,
    }
    out.put_slice(s.as_bytes());
    Ok(())
}

/// A float as PostgreSQL prints it (`Infinity`, `NaN`, shortest round-trip digits).
fn float_text(v: f64, single: bool) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else if single {
        (v as f32).to_string()
    } else {
        v.to_string()
    }
}

/// The elements of list `col` at `row`.
fn list_values(col: &ArrayRef, row: usize) -> ArrayRef {
    match col.data_type() {
        DataType::FixedSizeList(..) => col.as_fixed_size_list().value(row),
        DataType::List(_) => col.as_list::<i32>().value(row),
        _ => col.as_list::<i64>().value(row),
    }
}

/// Days from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_DAYS: i32 = 10_957;
const PG_EPOCH_MICROS: i64 = PG_EPOCH_DAYS as i64 * 86_400_000_000;

/// One value in PostgreSQL's binary format (only types [`has_binary`] accepts).
fn encode_binary(col: &ArrayRef, row: usize, out: &mut BytesMut) -> Result<(), String> {
    match col.data_type() {
        DataType::Boolean => out.put_u8(col.as_boolean().value(row) as u8),
        DataType::Int8 => out.put_i16(col.as_primitive::<Int8Type>().value(row) as i16),
        DataType::Int16 => out.put_i16(col.as_primitive::<Int16Type>().value(row)),
        DataType::UInt8 => out.put_i16(col.as_primitive::<UInt8Type>().value(row) as i16),
        DataType::Int32 => out.put_i32(col.as_primitive::<Int32Type>().value(row)),
        DataType::UInt16 => out.put_i32(col.as_primitive::<UInt16Type>().value(row) as i32),
        DataType::Int64 => out.put_i64(col.as_primitive::<Int64Type>().value(row)),
        DataType::UInt32 => out.put_i64(col.as_primitive::<UInt32Type>().value(row) as i64),
        DataType::Float32 => out.put_f32(col.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => out.put_f64(col.as_primitive::<Float64Type>().value(row)),
        // `"char"` is one byte in binary; text and `name` are their bytes.
        DataType::Utf8 => out.put_slice(col.as_string::<i32>().value(row).as_bytes()),
        DataType::LargeUtf8 => out.put_slice(col.as_string::<i64>().value(row).as_bytes()),
        DataType::Utf8View => out.put_slice(col.as_string_view().value(row).as_bytes()),
        DataType::Binary => out.put_slice(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => out.put_slice(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => out.put_slice(col.as_binary_view().value(row)),
        DataType::Date32 => {
            out.put_i32(col.as_primitive::<Date32Type>().value(row) - PG_EPOCH_DAYS)
        }
        DataType::Timestamp(unit, _) => {
            let micros = timestamp_micros(col, row, unit);
            out.put_i64(micros - PG_EPOCH_MICROS)
        }
        DataType::FixedSizeList(f, _) if f.data_type() == &DataType::Float32 => {
            let values = list_values(col, row);
            let values = values.as_primitive::<Float32Type>();
            if values.null_count() > 0 {
                return Err("a vector holds a NULL element".into());
            }
            let dim = i16::try_from(values.len()).map_err(|_| {
                format!(
                    "a vector of {} dimensions exceeds pgvector's limit",
                    values.len()
                )
            })?;
            out.put_i16(dim);
            out.put_i16(0);
            for v in values.values() {
                out.put_f32(*v);
            }
        }
        DataType::FixedSizeList(..) | DataType::List(_) | DataType::LargeList(_) => {
            let values = list_values(col, row);
            let (elem_oid, width) = match values.data_type() {
                DataType::Float32 => (Type::FLOAT4.oid(), 4),
                _ => (Type::FLOAT8.oid(), 8),
            };
            out.put_i32(1); // dimensions
            out.put_i32((values.null_count() > 0) as i32);
            out.put_u32(elem_oid);
            out.put_i32(values.len() as i32);
            out.put_i32(1); // lower bound
            for i in 0..values.len() {
                if values.is_null(i) {
                    out.put_i32(-1);
                    continue;
                }
                out.put_i32(width);
                match values.data_type() {
                    DataType::Float32 => out.put_f32(values.as_primitive::<Float32Type>().value(i)),
                    _ => out.put_f64(values.as_primitive::<Float64Type>().value(i)),
                }
            }
        }
        other => return Err(format!("no binary encoding for {other}")),
    }
    Ok(())
}

fn timestamp_micros(col: &ArrayRef, row: usize, unit: &TimeUnit) -> i64 {
    use datafusion::arrow::datatypes::{
        TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
        TimestampSecondType,
    };
    match unit {
        TimeUnit::Second => col.as_primitive::<TimestampSecondType>().value(row) * 1_000_000,
        TimeUnit::Millisecond => col.as_primitive::<TimestampMillisecondType>().value(row) * 1_000,
        TimeUnit::Microsecond => col.as_primitive::<TimestampMicrosecondType>().value(row),
        TimeUnit::Nanosecond => col.as_primitive::<TimestampNanosecondType>().value(row) / 1_000,
    }
}

/// A pgvector binary value: `int16` dimension, `int16` unused, the elements.
pub fn decode_vector_binary(b: &[u8]) -> Result<Vec<f32>, String> {
    if b.len() < 4 {
        return Err(format!(
            "a binary vector has {} bytes, fewer than its 4-byte header",
            b.len()
        ));
    }
    let dim = i16::from_be_bytes([b[0], b[1]]);
    if dim < 1 {
        return Err(format!("a binary vector claims {dim} dimensions"));
    }
    let body = &b[4..];
    if body.len() != dim as usize * 4 {
        return Err(format!(
            "a binary vector of {dim} dimensions has {} bytes of elements, expected {}",
            body.len(),
            dim as usize * 4
        ));
    }
    Ok(body
        .chunks_exact(4)
        .map(|c| f32::from_be_bytes(c.try_into().unwrap()))
        .collect())
}

/// A one-dimensional `float4[]` / `float8[]` in binary format; `None` if it has a NULL.
pub fn decode_float_array_binary(b: &[u8]) -> Result<Option<Vec<f64>>, String> {
    let int = |at: usize| -> Result<i32, String> {
        b.get(at..at + 4)
            .map(|s| i32::from_be_bytes(s.try_into().unwrap()))
            .ok_or_else(|| "a binary array parameter is truncated".to_string())
    };
    let ndim = int(0)?;
    if ndim == 0 {
        return Ok(Some(vec![]));
    }
    if ndim != 1 {
        return Err(format!(
            "a binary array parameter has {ndim} dimensions, expected 1"
        ));
    }
    let elem = int(8)? as u32;
    let len = int(12)?;
    if len < 0 {
        return Err("a binary array parameter has a negative length".into());
    }
    let mut at = 20;
    let mut out = Vec::with_capacity(len as usize);
    for _ in 0..len {
        let n = int(at)?;
        at += 4;
        if n == -1 {
            return Ok(None);
        }
        let v = b
            .get(at..at + n as usize)
            .ok_or("a binary array parameter is truncated")?;
        out.push(match (elem, n) {
            (700, 4) => f32::from_be_bytes(v.try_into().unwrap()) as f64,
            (701, 8) => f64::from_be_bytes(v.try_into().unwrap()),
            _ => {
                return Err(format!(
                    "a binary array element of type {elem} and {n} bytes is not a float"
                ));
            }
        });
        at += n as usize;
    }
    if at != b.len() {
        return Err("a binary array parameter has trailing bytes".into());
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
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

    #[test]
    fn float_arrays_in_binary() {
        let mut b = vec![];
        for x in [1i32, 0, 701, 2, 1] {
            b.extend_from_slice(&x.to_be_bytes());
        }
        for v in [1.5f64, -2.0] {
            b.extend_from_slice(&8i32.to_be_bytes());
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(
            decode_float_array_binary(&b).unwrap(),
            Some(vec![1.5, -2.0])
        );
        assert!(decode_float_array_binary(&b[..b.len() - 1]).is_err());
    }
}

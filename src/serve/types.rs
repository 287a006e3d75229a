//! Arrow types as PostgreSQL types, and values in PostgreSQL's text and binary formats.
//!
//! A `VECTOR(n)` column (`FixedSizeList<Float32>[n]`) is pgvector's `vector`, with the OID the
//! server's `pg_type` gives it ([`VECTOR_OID`]); its text form is `[1,2,3]` and its binary form
//! pgvector's: `int16` dimension, `int16` zero, then the elements as big-endian `float32`.
//! Everything else maps to the nearest built-in type, or to `text` where there is none; the
//! values themselves are encoded in `values`.

use datafusion::arrow::datatypes::DataType;
use pgwire::api::Type;
use pgwire::api::results::{FieldFormat, FieldInfo};
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
        DataType::UInt64
        | DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => Type::NUMERIC,
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
            array_type(&element_type(f.data_type())).unwrap_or(Type::TEXT_ARRAY)
        }
        _ => Type::TEXT,
    }
}

/// The element type of an array whose elements are Arrow `dt`: its own type where that has
/// an array type, else `text` (a list of lists, of structs, ...: elements sent as text).
pub fn element_type(dt: &DataType) -> Type {
    let t = pg_type(dt);
    if array_type(&t).is_some() {
        t
    } else {
        Type::TEXT
    }
}

/// The array type of element type `elem`, for the types [`pg_type`] gives.
fn array_type(elem: &Type) -> Option<Type> {
    Some(match elem.oid() {
        VECTOR_OID => Type::new(
            "_vector".into(),
            VECTOR_ARRAY_OID,
            Kind::Array(vector_type()),
            "public".into(),
        ),
        _ => {
            [
                (Type::BOOL, Type::BOOL_ARRAY),
                (Type::INT2, Type::INT2_ARRAY),
                (Type::INT4, Type::INT4_ARRAY),
                (Type::INT8, Type::INT8_ARRAY),
                (Type::NUMERIC, Type::NUMERIC_ARRAY),
                (Type::FLOAT4, Type::FLOAT4_ARRAY),
                (Type::FLOAT8, Type::FLOAT8_ARRAY),
                (Type::TEXT, Type::TEXT_ARRAY),
                (Type::BYTEA, Type::BYTEA_ARRAY),
                (Type::DATE, Type::DATE_ARRAY),
                (Type::TIMESTAMP, Type::TIMESTAMP_ARRAY),
                (Type::TIMESTAMPTZ, Type::TIMESTAMPTZ_ARRAY),
                (Type::TIME, Type::TIME_ARRAY),
                (Type::INTERVAL, Type::INTERVAL_ARRAY),
            ]
            .into_iter()
            .find(|(e, _)| e == elem)?
            .1
        }
    })
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
/// (`binary(i)`): every type has both forms.
pub fn fields(
    schema: &datafusion::arrow::datatypes::Schema,
    binary: impl Fn(usize) -> bool,
) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let format = if binary(i) {
                FieldFormat::Binary
            } else {
                FieldFormat::Text
            };
            FieldInfo::new(f.name().clone(), None, None, field_type(f), format)
        })
        .collect()
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

    #[test]
    fn lists_are_arrays_of_their_elements() {
        use datafusion::arrow::datatypes::Field;
        use std::sync::Arc;
        let list = |dt: DataType| DataType::List(Arc::new(Field::new("item", dt, true)));
        assert_eq!(pg_type(&list(DataType::Int16)), Type::INT2_ARRAY);
        assert_eq!(pg_type(&list(DataType::Utf8)), Type::TEXT_ARRAY);
        assert_eq!(
            pg_type(&list(DataType::Decimal128(10, 2))),
            Type::NUMERIC_ARRAY
        );
        let vector =
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 3);
        assert_eq!(pg_type(&vector).oid(), VECTOR_OID);
        assert_eq!(pg_type(&list(vector)).oid(), VECTOR_ARRAY_OID);
        // A list of lists has no array type of its own: its elements go as text.
        assert_eq!(pg_type(&list(list(DataType::Int32))), Type::TEXT_ARRAY);
        assert_eq!(element_type(&list(DataType::Int32)), Type::TEXT);
    }
}

//! Values in PostgreSQL's text and binary formats, for DataRows and binary COPY.
//!
//! Every Arrow type has both forms, so a column is always sent in the format the client asked
//! for: psycopg's binary cursors read every column of a result in the format of the first,
//! and asyncpg asks for binary throughout, so one column sent as text breaks the whole row.
//! Types with no PostgreSQL counterpart (structs, maps, dictionaries, ...) are `text`, whose
//! binary form is its text bytes.

use bytes::{BufMut, BytesMut};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type,
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    IntervalDayTimeType, IntervalMonthDayNanoType, IntervalUnit, IntervalYearMonthType,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::arrow::temporal_conversions::as_date;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use pgwire::api::Type;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::messages::data::DataRow;

use super::types::{element_type, pg_type};

/// The rows of `batch` as DataRows in the formats of `fields`.
pub fn encode_rows(batch: &RecordBatch, fields: &[FieldInfo]) -> Result<Vec<DataRow>, String> {
    let mut rows = Vec::with_capacity(batch.num_rows());
    let mut buf = BytesMut::new();
    for row in 0..batch.num_rows() {
        for (col, field) in batch.columns().iter().zip(fields) {
            encode_value(col, row, field.format(), &mut buf)?;
        }
        rows.push(DataRow::new(buf.split(), fields.len() as i16));
    }
    Ok(rows)
}

/// One value with its length prefix (-1 for NULL), in `format`.
fn encode_value(
    col: &ArrayRef,
    row: usize,
    format: FieldFormat,
    out: &mut BytesMut,
) -> Result<(), String> {
    if col.is_null(row) {
        out.put_i32(-1);
        return Ok(());
    }
    let at = out.len();
    out.put_i32(0);
    match format {
        FieldFormat::Binary => encode_binary(col, row, out)?,
        FieldFormat::Text => out.put_slice(encode_text(col, row)?.as_bytes()),
    }
    let len = i32::try_from(out.len() - at - 4).map_err(|_| "a value exceeds 2 GiB".to_string())?;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// One non-NULL value in PostgreSQL's text format.
pub fn encode_text(col: &ArrayRef, row: usize) -> Result<String, String> {
    Ok(match col.data_type() {
        DataType::Boolean => if col.as_boolean().value(row) {
            "t"
        } else {
            "f"
        }
        .into(),
        DataType::Int8 => col.as_primitive::<Int8Type>().value(row).to_string(),
        DataType::Int16 => col.as_primitive::<Int16Type>().value(row).to_string(),
        DataType::Int32 => col.as_primitive::<Int32Type>().value(row).to_string(),
        DataType::Int64 => col.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::UInt8 => col.as_primitive::<UInt8Type>().value(row).to_string(),
        DataType::UInt16 => col.as_primitive::<UInt16Type>().value(row).to_string(),
        DataType::UInt32 => col.as_primitive::<UInt32Type>().value(row).to_string(),
        DataType::UInt64 => col.as_primitive::<UInt64Type>().value(row).to_string(),
        DataType::Utf8 => col.as_string::<i32>().value(row).to_string(),
        DataType::LargeUtf8 => col.as_string::<i64>().value(row).to_string(),
        DataType::Utf8View => col.as_string_view().value(row).to_string(),
        DataType::Binary => bytea_text(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => bytea_text(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => bytea_text(col.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => bytea_text(col.as_fixed_size_binary().value(row)),
        DataType::Float16 => {
            float_text(col.as_primitive::<Float16Type>().value(row).to_f64(), true)
        }
        DataType::Float32 => float_text(col.as_primitive::<Float32Type>().value(row) as f64, true),
        DataType::Float64 => float_text(col.as_primitive::<Float64Type>().value(row), false),
        DataType::Timestamp(..) => arrow_text(col, row)?.replacen('T', " ", 1),
        DataType::Date64 => as_date::<Date64Type>(col.as_primitive::<Date64Type>().value(row))
            .ok_or("a DATE out of range")?
            .to_string(),
        DataType::Interval(_) | DataType::Duration(_) => {
            let (months, days, micros) = interval_parts(col, row)?;
            interval_text(months, days, micros)
        }
        DataType::FixedSizeList(f, _) if f.data_type() == &DataType::Float32 => {
            let values = list_values(col, row);
            let values = values.as_primitive::<Float32Type>();
            if values.null_count() > 0 {
                return Err("a vector holds a NULL element".into());
            }
            let items: Vec<String> = values
                .values()
                .iter()
                .map(|v| float_text(*v as f64, true))
                .collect();
            format!("[{}]", items.join(","))
        }
        DataType::FixedSizeList(..) | DataType::List(_) | DataType::LargeList(_) => {
            let values = list_values(col, row);
            let mut s = String::from("{");
            for i in 0..values.len() {
                if i > 0 {
                    s.push(',');
                }
                if values.is_null(i) {
                    s.push_str("NULL");
                } else {
                    push_array_element(&mut s, &encode_text(&values, i)?);
                }
            }
            s.push('}');
            s
        }
        _ => arrow_text(col, row)?,
    })
}

/// Arrow's display of one value (integers, decimals, strings, dates, times, ...).
fn arrow_text(col: &ArrayRef, row: usize) -> Result<String, String> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(col.as_ref(), &options).map_err(|e| e.to_string())?;
    Ok(formatter.value(row).to_string())
}

/// A `bytea` in PostgreSQL's hex text form, `\\x0a1b`.
fn bytea_text(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("\\x");
    for byte in b {
        let _ = write!(s, "{byte:02x}");
    }
    s
}

/// An element of an array's text form, quoted as PostgreSQL's array input needs.
fn push_array_element(s: &mut String, item: &str) {
    let plain = !item.is_empty()
        && !item.eq_ignore_ascii_case("NULL")
        && !item
            .chars()
            .any(|c| matches!(c, '{' | '}' | ',' | '"' | '\\') || c.is_whitespace());
    if plain {
        s.push_str(item);
        return;
    }
    s.push('"');
    for c in item.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
}

/// A float as PostgreSQL prints it (`Infinity`, `NaN`, shortest round-trip digits).
pub fn float_text(v: f64, single: bool) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else if single {
        (v as f32).to_string()
    } else {
        v.to_string()
    }
}

/// The elements of list `col` at `row`.
pub fn list_values(col: &ArrayRef, row: usize) -> ArrayRef {
    match col.data_type() {
        DataType::FixedSizeList(..) => col.as_fixed_size_list().value(row),
        DataType::List(_) => col.as_list::<i32>().value(row),
        _ => col.as_list::<i64>().value(row),
    }
}

/// Days from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_DAYS: i32 = 10_957;
const PG_EPOCH_MICROS: i64 = PG_EPOCH_DAYS as i64 * 86_400_000_000;

/// One non-NULL value in PostgreSQL's binary format, for the type [`pg_type`] gives it.
pub fn encode_binary(col: &ArrayRef, row: usize, out: &mut BytesMut) -> Result<(), String> {
    match col.data_type() {
        DataType::Boolean => out.put_u8(col.as_boolean().value(row) as u8),
        DataType::Int8 => out.put_i16(col.as_primitive::<Int8Type>().value(row) as i16),
        DataType::Int16 => out.put_i16(col.as_primitive::<Int16Type>().value(row)),
        DataType::UInt8 => out.put_i16(col.as_primitive::<UInt8Type>().value(row) as i16),
        DataType::Int32 => out.put_i32(col.as_primitive::<Int32Type>().value(row)),
        DataType::UInt16 => out.put_i32(col.as_primitive::<UInt16Type>().value(row) as i32),
        DataType::Int64 => out.put_i64(col.as_primitive::<Int64Type>().value(row)),
        DataType::UInt32 => out.put_i64(col.as_primitive::<UInt32Type>().value(row) as i64),
        DataType::UInt64 => put_numeric(out, &native_text::<UInt64Type>(col, row), 0),
        DataType::Decimal32(_, s) => put_numeric(out, &native_text::<Decimal32Type>(col, row), *s),
        DataType::Decimal64(_, s) => put_numeric(out, &native_text::<Decimal64Type>(col, row), *s),
        DataType::Decimal128(_, s) => {
            put_numeric(out, &native_text::<Decimal128Type>(col, row), *s)
        }
        DataType::Decimal256(_, s) => {
            put_numeric(out, &native_text::<Decimal256Type>(col, row), *s)
        }
        DataType::Float16 => out.put_f32(col.as_primitive::<Float16Type>().value(row).to_f32()),
        DataType::Float32 => out.put_f32(col.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => out.put_f64(col.as_primitive::<Float64Type>().value(row)),
        // `"char"` is one byte in binary; text and `name` are their bytes.
        DataType::Utf8 => out.put_slice(col.as_string::<i32>().value(row).as_bytes()),
        DataType::LargeUtf8 => out.put_slice(col.as_string::<i64>().value(row).as_bytes()),
        DataType::Utf8View => out.put_slice(col.as_string_view().value(row).as_bytes()),
        DataType::Binary => out.put_slice(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => out.put_slice(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => out.put_slice(col.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => out.put_slice(col.as_fixed_size_binary().value(row)),
        DataType::Date32 => {
            out.put_i32(col.as_primitive::<Date32Type>().value(row) - PG_EPOCH_DAYS)
        }
        DataType::Date64 => {
            let days = col
                .as_primitive::<Date64Type>()
                .value(row)
                .div_euclid(86_400_000);
            let days = i32::try_from(days).map_err(|_| "a DATE out of range".to_string())?;
            out.put_i32(days - PG_EPOCH_DAYS)
        }
        DataType::Timestamp(unit, _) => {
            out.put_i64(timestamp_micros(col, row, unit) - PG_EPOCH_MICROS)
        }
        DataType::Time32(_) | DataType::Time64(_) => out.put_i64(time_micros(col, row)),
        DataType::Interval(_) | DataType::Duration(_) => {
            let (months, days, micros) = interval_parts(col, row)?;
            out.put_i64(micros);
            out.put_i32(days);
            out.put_i32(months);
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
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
            let values = list_values(col, row);
            let elem = element_type(f.data_type());
            // An element type with no array type of its own is sent as text elements.
            let as_text = elem == Type::TEXT;
            if values.is_empty() {
                out.put_i32(0); // no dimensions
                out.put_i32(0);
                out.put_u32(elem.oid());
                return Ok(());
            }
            out.put_i32(1); // dimensions
            out.put_i32((values.null_count() > 0) as i32);
            out.put_u32(elem.oid());
            out.put_i32(i32::try_from(values.len()).map_err(|_| "an array is too long")?);
            out.put_i32(1); // lower bound
            for i in 0..values.len() {
                if as_text && values.is_valid(i) {
                    let text = encode_text(&values, i)?;
                    out.put_i32(text.len() as i32);
                    out.put_slice(text.as_bytes());
                } else {
                    encode_value(&values, i, FieldFormat::Binary, out)?;
                }
            }
        }
        // Everything else is `text` (see `pg_type`), whose binary form is its text.
        other => {
            debug_assert_eq!(
                pg_type(other),
                Type::TEXT,
                "{other} has a type but no encoder"
            );
            out.put_slice(encode_text(col, row)?.as_bytes())
        }
    }
    Ok(())
}

/// The integer a primitive column holds at `row`, in decimal (a decimal's unscaled value).
fn native_text<T: datafusion::arrow::datatypes::ArrowPrimitiveType>(
    col: &ArrayRef,
    row: usize,
) -> String
where
    T::Native: std::fmt::Display,
{
    col.as_primitive::<T>().value(row).to_string()
}

fn timestamp_micros(col: &ArrayRef, row: usize, unit: &TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => col.as_primitive::<TimestampSecondType>().value(row) * 1_000_000,
        TimeUnit::Millisecond => col.as_primitive::<TimestampMillisecondType>().value(row) * 1_000,
        TimeUnit::Microsecond => col.as_primitive::<TimestampMicrosecondType>().value(row),
        TimeUnit::Nanosecond => col.as_primitive::<TimestampNanosecondType>().value(row) / 1_000,
    }
}

/// A TIME as microseconds since midnight.
fn time_micros(col: &ArrayRef, row: usize) -> i64 {
    match col.data_type() {
        DataType::Time32(TimeUnit::Second) => {
            col.as_primitive::<Time32SecondType>().value(row) as i64 * 1_000_000
        }
        DataType::Time32(_) => {
            col.as_primitive::<Time32MillisecondType>().value(row) as i64 * 1_000
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            col.as_primitive::<Time64MicrosecondType>().value(row)
        }
        _ => col.as_primitive::<Time64NanosecondType>().value(row) / 1_000,
    }
}

/// An INTERVAL or duration as PostgreSQL keeps one: (months, days, microseconds).
fn interval_parts(col: &ArrayRef, row: usize) -> Result<(i32, i32, i64), String> {
    Ok(match col.data_type() {
        DataType::Interval(IntervalUnit::YearMonth) => {
            (col.as_primitive::<IntervalYearMonthType>().value(row), 0, 0)
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            let v = col.as_primitive::<IntervalDayTimeType>().value(row);
            (0, v.days, v.milliseconds as i64 * 1_000)
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = col.as_primitive::<IntervalMonthDayNanoType>().value(row);
            (v.months, v.days, v.nanoseconds / 1_000)
        }
        DataType::Duration(unit) => {
            let micros = match unit {
                TimeUnit::Second => col
                    .as_primitive::<DurationSecondType>()
                    .value(row)
                    .checked_mul(1_000_000),
                TimeUnit::Millisecond => col
                    .as_primitive::<DurationMillisecondType>()
                    .value(row)
                    .checked_mul(1_000),
                TimeUnit::Microsecond => {
                    Some(col.as_primitive::<DurationMicrosecondType>().value(row))
                }
                TimeUnit::Nanosecond => {
                    Some(col.as_primitive::<DurationNanosecondType>().value(row) / 1_000)
                }
            };
            (0, 0, micros.ok_or("a duration out of INTERVAL's range")?)
        }
        other => return Err(format!("{other} is not an interval")),
    })
}

/// An interval in PostgreSQL's default output style: `1 year 2 mons 3 days 04:05:06.5`.
fn interval_text(months: i32, days: i32, micros: i64) -> String {
    let mut parts = vec![];
    let unit = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let (years, months) = (months / 12, months % 12);
    if years != 0 {
        parts.push(unit(years as i64, "year", "years"));
    }
    if months != 0 {
        parts.push(unit(months as i64, "mon", "mons"));
    }
    if days != 0 {
        parts.push(unit(days as i64, "day", "days"));
    }
    if micros != 0 || parts.is_empty() {
        let sign = if micros < 0 { "-" } else { "" };
        let m = micros.unsigned_abs();
        let (secs, frac) = (m / 1_000_000, m % 1_000_000);
        let mut t = format!(
            "{sign}{:02}:{:02}:{:02}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        if frac != 0 {
            let f = format!("{frac:06}");
            t.push('.');
            t.push_str(f.trim_end_matches('0'));
        }
        parts.push(t);
    }
    parts.join(" ")
}

/// A NUMERIC in binary: `int16` digit count, `int16` weight (of the first base-10000 digit),
/// `uint16` sign, `int16` display scale, then base-10000 digits, grouped from the decimal
/// point outwards. `unscaled` is the decimal integer (maybe negative) that `10^-scale` scales.
fn put_numeric(out: &mut BytesMut, unscaled: &str, scale: i8) {
    let (negative, digits) = match unscaled.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, unscaled),
    };
    // A negative scale multiplies by a power of ten: those are more integer digits.
    let mut digits = digits.to_string();
    if scale < 0 {
        digits.extend(std::iter::repeat_n('0', scale.unsigned_abs() as usize));
    }
    let scale = scale.max(0) as usize;
    let int_len = digits.len().saturating_sub(scale);
    let (int_part, frac_part) = digits.split_at(int_len);
    let frac = format!("{frac_part:0>scale$}");
    let int_pad = (4 - int_part.len() % 4) % 4;
    let int_padded = format!("{}{int_part}", "0".repeat(int_pad));
    let frac_padded = format!("{frac}{}", "0".repeat((4 - frac.len() % 4) % 4));
    let group = |s: &str| -> Vec<i16> {
        s.as_bytes()
            .chunks(4)
            .map(|c| std::str::from_utf8(c).unwrap().parse::<i16>().unwrap())
            .collect()
    };
    let int_groups = group(&int_padded);
    let mut groups: Vec<i16> = int_groups
        .iter()
        .copied()
        .chain(group(&frac_padded))
        .collect();
    let mut weight = int_groups.len() as i16 - 1;
    let leading = groups.iter().take_while(|g| **g == 0).count();
    groups.drain(..leading);
    weight -= leading as i16;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let zero = groups.is_empty();
    out.put_i16(groups.len() as i16);
    out.put_i16(if zero { 0 } else { weight });
    out.put_u16(if negative && !zero { 0x4000 } else { 0 });
    out.put_i16(scale as i16);
    for g in groups {
        out.put_i16(g);
    }
}

#[cfg(test)]
#[path = "values_tests.rs"]
mod tests;

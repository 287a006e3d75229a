//! A prepared `INSERT INTO t [(columns)] VALUES ($1, $2, ...), ($4, ...)` whose values are
//! all parameters, run on its bound values directly: they become Arrow columns and one
//! append, instead of SQL text with every value spliced in as a literal.
//!
//! Why: splicing makes a 100-row insert of 128-d vectors a statement of 12,800 float
//! literals, which are printed, tokenized, parsed and planned one by one — about 50 ms of
//! the server's CPU for 50 KB of data (a streaming writer could insert ~2,000 rows/s). The
//! rows themselves take well under a millisecond to append.
//!
//! Only the plain form takes this path; anything else (expressions among the values,
//! `ON CONFLICT`, `RETURNING`, a session table, a column left out that has a `DEFAULT` or
//! is `NOT NULL`, a parameter of a type this file does not decode) falls back to the
//! general path, so the result is always what the spliced statement would give. Values are
//! cast to the column types as INSERT casts them (a value that does not fit is an error);
//! vectors must have the column's dimension and finite elements.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array,
    RecordBatch, StringArray, new_null_array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::sql::sqlparser::ast::{self as sql, Expr, SetExpr, Statement, TableObject};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use pgwire::api::results::FieldFormat;
use postgres_types::Type;

use super::params::ParamError;
use super::types::{decode_float_array_binary, decode_vector_binary, is_vector};
use crate::format::types::vector_dim;
use crate::sql::pin::normalize_ident;

/// The shape of a plain parameterized INSERT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertShape {
    /// The table inserted into (normalized).
    pub table: String,
    /// The columns named, or `None` for all in table order.
    pub columns: Option<Vec<String>>,
    /// Per row, per value: the 0-based parameter it is.
    pub rows: Vec<Vec<usize>>,
}

/// The shape of `sql`, if it is a plain `INSERT ... VALUES` of parameters only.
pub fn shape(sql: &str) -> Option<InsertShape> {
    let lower = sql.trim_start().get(..6)?.to_ascii_lowercase();
    if lower != "insert" {
        return None;
    }
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let Some(Statement::Insert(insert)) = statements.pop() else {
        return None;
    };
    if !statements.is_empty()
        || insert.on.is_some()
        || insert.returning.is_some()
        || insert.partitioned.is_some()
        || !insert.after_columns.is_empty()
        || insert.overwrite
        || insert.table_alias.is_some()
        || !insert.assignments.is_empty()
    {
        return None;
    }
    let TableObject::TableName(name) = &insert.table else {
        return None;
    };
    let [part] = name.0.as_slice() else {
        return None;
    };
    let table = normalize_ident(part.as_ident()?);
    let source = insert.source.as_ref()?;
    if source.with.is_some() || source.order_by.is_some() || source.limit_clause.is_some() {
        return None;
    }
    let SetExpr::Values(values) = source.body.as_ref() else {
        return None;
    };
    let mut rows = Vec::with_capacity(values.rows.len());
    for row in &values.rows {
        let mut cells = Vec::with_capacity(row.len());
        for expr in &row.content {
            let Expr::Value(v) = expr else { return None };
            let sql::Value::Placeholder(p) = &v.value else {
                return None;
            };
            let n: usize = p.strip_prefix('$')?.parse().ok()?;
            cells.push(n.checked_sub(1)?);
        }
        rows.push(cells);
    }
    let mut columns = None;
    if !insert.columns.is_empty() {
        let mut names = Vec::with_capacity(insert.columns.len());
        for column in &insert.columns {
            let [part] = column.0.as_slice() else {
                return None;
            };
            names.push(normalize_ident(part.as_ident()?));
        }
        columns = Some(names);
    }
    Some(InsertShape {
        table,
        columns,
        rows,
    })
}

/// One bound parameter, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer of any width.
    Int(i64),
    /// A float of either width.
    Float(f64),
    /// A string (text, varchar, or a parameter of unknown type).
    Text(String),
    /// A pgvector `vector`, or a `real[]` / `float8[]` without NULLs.
    Vector(Vec<f32>),
}

/// Decodes a parameter; `Ok(None)` for a type this path does not take (the general path
/// will).
pub fn decode(
    ty: &Type,
    format: FieldFormat,
    bytes: Option<&[u8]>,
) -> Result<Option<Value>, ParamError> {
    let Some(b) = bytes else {
        return Ok(Some(Value::Null));
    };
    let bad = ParamError::binary_format;
    let fixed = |n: usize| -> Result<&[u8], ParamError> {
        (b.len() == n).then_some(b).ok_or_else(|| {
            bad(format!(
                "a binary {} parameter has {} bytes, expected {n}",
                ty.name(),
                b.len()
            ))
        })
    };
    let text = || {
        std::str::from_utf8(b).map_err(|_| ParamError {
            sqlstate: "22021",
            message: "a parameter is not valid UTF-8".into(),
        })
    };
    Ok(Some(match (format, ty) {
        (FieldFormat::Binary, &Type::BOOL) => Value::Bool(fixed(1)?[0] != 0),
        (FieldFormat::Binary, &Type::INT2) => {
            Value::Int(i16::from_be_bytes(fixed(2)?.try_into().unwrap()).into())
        }
        (FieldFormat::Binary, &Type::INT4) => {
            Value::Int(i32::from_be_bytes(fixed(4)?.try_into().unwrap()).into())
        }
        (FieldFormat::Binary, &Type::INT8) => {
            Value::Int(i64::from_be_bytes(fixed(8)?.try_into().unwrap()))
        }
        (FieldFormat::Binary, &Type::FLOAT4) => {
            Value::Float(f32::from_be_bytes(fixed(4)?.try_into().unwrap()).into())
        }
        (FieldFormat::Binary, &Type::FLOAT8) => {
            Value::Float(f64::from_be_bytes(fixed(8)?.try_into().unwrap()))
        }
        (FieldFormat::Binary, &Type::FLOAT4_ARRAY | &Type::FLOAT8_ARRAY) => {
            match decode_float_array_binary(b).map_err(bad)? {
                Some(v) => Value::Vector(v.into_iter().map(|x| x as f32).collect()),
                None => return Ok(None),
            }
        }
        (FieldFormat::Binary, t) if is_vector(t) => {
            Value::Vector(decode_vector_binary(b).map_err(bad)?)
        }
        (FieldFormat::Binary, &Type::TEXT | &Type::VARCHAR | &Type::UNKNOWN) => {
            Value::Text(text()?.to_string())
        }
        (FieldFormat::Text, t) if is_vector(t) => {
            match crate::sql::vector_syntax::parse_vector_text(text()?.trim()) {
                Some(v) => Value::Vector(v.into_iter().map(|x| x as f32).collect()),
                None => return Ok(None),
            }
        }
        (FieldFormat::Text, &Type::TEXT | &Type::VARCHAR | &Type::UNKNOWN) => {
            Value::Text(text()?.to_string())
        }
        (FieldFormat::Text, &Type::INT2 | &Type::INT4 | &Type::INT8) => {
            match text()?.trim().parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => return Ok(None), // the general path words the error
            }
        }
        (FieldFormat::Text, &Type::FLOAT4 | &Type::FLOAT8) => match text()?.trim().parse::<f64>() {
            Ok(f) => Value::Float(f),
            Err(_) => return Ok(None),
        },
        (FieldFormat::Text, &Type::BOOL) => match text()?.trim().to_ascii_lowercase().as_str() {
            "t" | "true" | "y" | "yes" | "on" | "1" => Value::Bool(true),
            "f" | "false" | "n" | "no" | "off" | "0" => Value::Bool(false),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

/// The rows of `shape` with `values` as a batch of the table's `schema`; `Ok(None)` when this
/// path does not take them (see the module docs). `defaults`: columns with a DEFAULT.
pub fn batch(
    shape: &InsertShape,
    schema: &SchemaRef,
    defaults: &[String],
    values: &[Value],
) -> Result<Option<RecordBatch>, String> {
    let names: Vec<String> = match &shape.columns {
        Some(c) => c.clone(),
        None => schema.fields().iter().map(|f| f.name().clone()).collect(),
    };
    if shape.rows.iter().any(|r| r.len() != names.len()) {
        return Ok(None); // the general path says what is wrong
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let Some(at) = names.iter().position(|n| n == field.name()) else {
            if !field.is_nullable() || defaults.contains(field.name()) {
                return Ok(None);
            }
            columns.push(new_null_array(field.data_type(), shape.rows.len()));
            continue;
        };
        let cells: Vec<&Value> = shape.rows.iter().map(|r| &values[r[at]]).collect();
        // Typed NULLs, so that NOT NULL sees them (an untyped NullArray counts none).
        if cells.iter().all(|c| matches!(c, Value::Null)) {
            columns.push(new_null_array(field.data_type(), cells.len()));
            continue;
        }
        let column = match vector_dim(field.data_type()) {
            Some(dim) => vector_column(field.name(), field.data_type(), dim as usize, &cells)?,
            None => scalar_column(&cells),
        };
        match column {
            Some(c) => columns.push(c),
            None => return Ok(None),
        }
    }
    if names.iter().any(|n| schema.index_of(n).is_err()) {
        return Ok(None);
    }
    // Columns are still of the values' types; the write casts them to the table's
    // (`format::conform`), refusing values that do not fit.
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, c)| {
            datafusion::arrow::datatypes::Field::new(f.name(), c.data_type().clone(), true)
        })
        .collect();
    let loose = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
    RecordBatch::try_new(loose, columns)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn vector_column(
    name: &str,
    ty: &DataType,
    dim: usize,
    cells: &[&Value],
) -> Result<Option<ArrayRef>, String> {
    let DataType::FixedSizeList(item, _) = ty else {
        return Ok(None);
    };
    if item.data_type() != &DataType::Float32 {
        return Ok(None);
    }
    let mut values = Vec::with_capacity(cells.len() * dim);
    let mut valid = Vec::with_capacity(cells.len());
    for (row, cell) in cells.iter().enumerate() {
        match cell {
            Value::Null => {
                values.extend(std::iter::repeat_n(0.0, dim));
                valid.push(false);
            }
            Value::Vector(v) => {
                if v.len() != dim {
                    return Err(format!(
                        "row {}: column '{name}' is VECTOR({dim}), the value has {} elements",
                        row + 1,
                        v.len()
                    ));
                }
                if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                    return Err(format!(
                        "row {}: column '{name}': vectors hold finite numbers, not {x}",
                        row + 1
                    ));
                }
                values.extend_from_slice(v);
                valid.push(true);
            }
            _ => return Ok(None),
        }
    }
    let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid));
    Ok(Some(Arc::new(
        FixedSizeListArray::try_new(
            item.clone(),
            dim as i32,
            Arc::new(Float32Array::from(values)),
            nulls,
        )
        .map_err(|e| e.to_string())?,
    )))
}

/// A column of one kind of scalar, NULLs among them; `None` for mixed kinds, vectors, or
/// NULLs alone (typed by the caller).
fn scalar_column(cells: &[&Value]) -> Option<ArrayRef> {
    let kind = cells.iter().find(|c| !matches!(c, Value::Null))?;
    Some(match kind {
        Value::Bool(_) => Arc::new(
            cells
                .iter()
                .map(|c| match c {
                    Value::Bool(b) => Some(Some(*b)),
                    Value::Null => Some(None),
                    _ => None,
                })
                .collect::<Option<BooleanArray>>()?,
        ),
        Value::Int(_) => Arc::new(
            cells
                .iter()
                .map(|c| match c {
                    Value::Int(i) => Some(Some(*i)),
                    Value::Null => Some(None),
                    _ => None,
                })
                .collect::<Option<Int64Array>>()?,
        ),
        Value::Float(_) => Arc::new(
            cells
                .iter()
                .map(|c| match c {
                    Value::Float(f) => Some(Some(*f)),
                    Value::Null => Some(None),
                    _ => None,
                })
                .collect::<Option<Float64Array>>()?,
        ),
        Value::Text(_) => Arc::new(
            cells
                .iter()
                .map(|c| match c {
                    Value::Text(t) => Some(Some(t.as_str())),
                    Value::Null => Some(None),
                    _ => None,
                })
                .collect::<Option<StringArray>>()?,
        ),
        Value::Vector(_) | Value::Null => return None,
    })
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    #[test]
    fn only_plain_parameter_inserts_have_a_shape() {
        assert_eq!(
            shape("INSERT INTO Items (id, EMB) VALUES ($1, $2), ($3, $4)"),
            Some(InsertShape {
                table: "items".into(),
                columns: Some(vec!["id".into(), "emb".into()]),
                rows: vec![vec![0, 1], vec![2, 3]],
            })
        );
        assert_eq!(
            shape("insert into t values ($2, $1)").unwrap().rows,
            [[1, 0]]
        );
        for other in [
            "INSERT INTO t VALUES ($1, 2)",
            "INSERT INTO t VALUES ($1, $2 + 1)",
            "INSERT INTO t SELECT $1",
            "INSERT INTO t VALUES ($1) RETURNING id",
            "INSERT INTO t VALUES ($1) ON CONFLICT DO NOTHING",
            "INSERT INTO s.t VALUES ($1)",
            "INSERT INTO t VALUES ($0)",
            "INSERT INTO t VALUES ($1); DELETE FROM t",
            "SELECT $1",
            "INSERT INTO t VALUES (?)",
        ] {
            assert_eq!(shape(other), None, "{other}");
        }
    }

    fn schema() -> SchemaRef {
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
            Field::new("emb", DataType::FixedSizeList(item, 2), true),
        ]))
    }

    #[test]
    fn rows_become_columns_and_strangers_fall_back() {
        let s = shape("INSERT INTO t (emb, id) VALUES ($1, $2), ($3, $4)").unwrap();
        let values = [
            Value::Vector(vec![1.0, 2.0]),
            Value::Int(7),
            Value::Null,
            Value::Int(8),
        ];
        let b = batch(&s, &schema(), &[], &values).unwrap().unwrap();
        assert_eq!(b.num_rows(), 2);
        assert_eq!(b.column(1).data_type(), &DataType::Utf8, "typed NULLs");
        assert_eq!(b.column(1).null_count(), 2, "note left out: NULL");
        assert_eq!(b.column(2).null_count(), 1);
        // A column with a DEFAULT left out, a NOT NULL one left out, a text vector: the
        // general path.
        assert!(
            batch(&s, &schema(), &["note".into()], &values)
                .unwrap()
                .is_none()
        );
        let only_emb = shape("INSERT INTO t (emb) VALUES ($1)").unwrap();
        assert!(batch(&only_emb, &schema(), &[], &values).unwrap().is_none());
        let texts = [
            Value::Text("[1,2]".into()),
            Value::Int(1),
            Value::Null,
            Value::Int(2),
        ];
        assert!(batch(&s, &schema(), &[], &texts).unwrap().is_none());
        // Mixed kinds in one column.
        let mixed = [Value::Null, Value::Int(1), Value::Null, Value::Float(2.5)];
        assert!(batch(&s, &schema(), &[], &mixed).unwrap().is_none());
    }

    #[test]
    fn wrong_dimensions_and_non_finite_elements_are_errors() {
        let s = shape("INSERT INTO t (id, emb) VALUES ($1, $2)").unwrap();
        let e = batch(
            &s,
            &schema(),
            &[],
            &[Value::Int(1), Value::Vector(vec![1.0])],
        )
        .unwrap_err();
        assert!(e.contains("VECTOR(2)") && e.contains("1 elements"), "{e}");
        let e = batch(
            &s,
            &schema(),
            &[],
            &[Value::Int(1), Value::Vector(vec![1.0, f32::NAN])],
        )
        .unwrap_err();
        assert!(e.contains("finite"), "{e}");
    }

    #[test]
    fn parameters_decode_in_both_formats() {
        let d = |ty: &Type, f, b: &[u8]| decode(ty, f, Some(b)).unwrap();
        assert_eq!(
            d(&Type::INT8, FieldFormat::Binary, &7i64.to_be_bytes()),
            Some(Value::Int(7))
        );
        assert_eq!(
            d(&Type::INT2, FieldFormat::Binary, &(-3i16).to_be_bytes()),
            Some(Value::Int(-3))
        );
        assert_eq!(
            d(&Type::FLOAT8, FieldFormat::Binary, &2.5f64.to_be_bytes()),
            Some(Value::Float(2.5))
        );
        assert_eq!(
            d(&Type::TEXT, FieldFormat::Text, b"x"),
            Some(Value::Text("x".into()))
        );
        assert_eq!(
            d(&Type::INT8, FieldFormat::Text, b" 7"),
            Some(Value::Int(7))
        );
        assert_eq!(
            d(&Type::INT8, FieldFormat::Text, b"7x"),
            None,
            "the general path words it"
        );
        assert_eq!(
            d(&Type::NUMERIC, FieldFormat::Text, b"7"),
            None,
            "numeric: general path"
        );
        assert_eq!(
            decode(&Type::INT8, FieldFormat::Binary, None).unwrap(),
            Some(Value::Null)
        );
        assert!(decode(&Type::INT8, FieldFormat::Binary, Some(b"12")).is_err());
    }
}

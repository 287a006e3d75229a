//! `COPY t [(columns)] FROM STDIN [WITH (...)]`: the bulk load pgvector's documentation
//! recommends (psycopg's `cursor.copy()` with `set_types(['vector'])`, asyncpg's
//! `copy_records_to_table`, psql's `\copy`), in text, CSV and binary format.
//!
//! The rows stream into the table as they arrive: the data's pieces are decoded
//! ([`super::copy_format`]), gathered into Arrow batches of a few MiB and handed to one
//! writer task that writes fragments as they fill; the whole COPY is one append commit when
//! the client says CopyDone, so a COPY either adds all its rows or none (a bad row, a
//! CopyFail or a dropped connection commits nothing; the fragments already written are never
//! referenced, and VACUUM removes them). As in PostgreSQL, an error is reported when the
//! client ends the data; what it sends until then is discarded.
//!
//! Values take the column's type: text and CSV cells are cast as INSERT casts a string
//! (`'42'` into BIGINT), vectors are pgvector's text `[1,2,3]`; binary cells are the type's
//! binary form, integers and floats of any width, vectors as pgvector's binary form or a
//! `real[]` / `float8[]` array. Columns the COPY leaves out take their DEFAULT, or NULL.

use datafusion::arrow::array::RecordBatch;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::DataFusionError;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use pgwire::error::ErrorInfo;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::bound_insert::{self, InsertShape, Value};
use super::copy_format::{Cell, CopyError, CopyFormat, RowDecoder};
use super::copy_statement::{CopyStatement, copy_error};
use super::sqlstate::{code, df_error, error_info};
use super::types::{decode_float_array_binary, decode_vector_binary};
use crate::FragvecSession;
use crate::engine::statements::dml::ColumnDefaults;
use crate::format::types::vector_dim;

/// Rows of one batch: at most this many bytes of cells...
const BATCH_BYTES: usize = 8 << 20;
/// ... and at most this many rows.
const BATCH_ROWS: usize = 8192;
/// The data of one CopyData message is decoded in slices of this many bytes.
const DECODE_BYTES: usize = 1 << 20;

/// What the writer task reads.
enum Piece {
    Batch(RecordBatch),
    /// The data ended well: commit.
    Done,
}

/// A COPY in progress on one connection.
pub struct CopyIn {
    statement: CopyStatement,
    decoder: RowDecoder,
    /// The table's columns and which of them the COPY's columns are.
    schema: SchemaRef,
    names: Vec<String>,
    /// The DEFAULTs of the columns the COPY leaves out.
    defaults: ColumnDefaults,
    rows: Vec<Vec<Cell>>,
    batch_rows: usize,
    to_writer: mpsc::Sender<Piece>,
    writer: JoinHandle<datafusion::common::Result<u64>>,
    /// The first error: later data is discarded, and CopyDone reports it.
    failed: Option<ErrorInfo>,
}

impl std::fmt::Debug for CopyIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyIn")
            .field("statement", &self.statement)
            .field("rows", &self.decoder.rows())
            .finish()
    }
}

impl CopyIn {
    /// Checks the target and starts its writer.
    pub async fn start(
        session: &FragvecSession,
        statement: CopyStatement,
    ) -> Result<CopyIn, ErrorInfo> {
        let df = |e: DataFusionError| df_error(&e);
        let Some(target) = session.append_target(&statement.table).await.map_err(df)? else {
            return Err(error_info(
                code::UNDEFINED_TABLE,
                format!("relation \"{}\" does not exist", statement.table),
            ));
        };
        let schema = target.schema().clone();
        let names: Vec<String> = match &statement.columns {
            Some(c) => c.clone(),
            None => schema.fields().iter().map(|f| f.name().clone()).collect(),
        };
        for (i, name) in names.iter().enumerate() {
            if schema.index_of(name).is_err() {
                return Err(error_info(
                    code::UNDEFINED_COLUMN,
                    format!(
                        "column \"{name}\" of relation \"{}\" does not exist",
                        statement.table
                    ),
                ));
            }
            if names[..i].contains(name) {
                return Err(error_info(
                    code::DUPLICATE_COLUMN,
                    format!("column \"{name}\" specified more than once"),
                ));
            }
        }
        let defaults = target.defaults();
        for field in schema.fields() {
            if names.contains(field.name()) || defaults.contains(field.name()) {
                continue;
            }
            if !field.is_nullable() {
                return Err(error_info(
                    code::NOT_NULL_VIOLATION,
                    format!(
                        "null value in column \"{}\" violates not-null constraint: COPY must \
                         list it",
                        field.name()
                    ),
                ));
            }
        }
        let defaults = session.column_defaults(&target).map_err(df)?;
        let row_bytes: usize = names
            .iter()
            .map(|n| {
                let ty = schema.field_with_name(n).map(|f| f.data_type().clone());
                ty.ok()
                    .and_then(|t| vector_dim(&t))
                    .map_or(16, |d| d as usize * 4)
            })
            .sum::<usize>()
            .max(1);
        let batch_rows = (BATCH_BYTES / row_bytes).clamp(1, BATCH_ROWS);

        let (to_writer, from_copy) = mpsc::channel::<Piece>(2);
        let pieces = futures::stream::unfold(Some(from_copy), |from_copy| async move {
            let mut from_copy = from_copy?;
            match from_copy.recv().await {
                Some(Piece::Batch(b)) => Some((Ok(b), Some(from_copy))),
                Some(Piece::Done) => None,
                // Dropped without Done: the COPY failed or the client went away. An error
                // ends the write without a commit.
                None => Some((
                    Err(DataFusionError::Execution(
                        "the COPY ended without its data".into(),
                    )),
                    None,
                )),
            }
        });
        let stream = Box::pin(RecordBatchStreamAdapter::new(schema.clone(), pieces));
        let writer_session = session.clone();
        let writer =
            tokio::spawn(async move { writer_session.append_stream(&target, stream).await });
        let columns = names.len();
        // The columns left out come NULL from the cells, then take their DEFAULTs
        // ([`with_defaults`]): NOT NULL is the write's to check, on the filled values.
        let loose: Vec<_> = schema
            .fields()
            .iter()
            .map(|f| match names.contains(f.name()) {
                true => f.clone(),
                false => Arc::new(f.as_ref().clone().with_nullable(true)),
            })
            .collect();
        let schema = Arc::new(Schema::new(loose));
        Ok(CopyIn {
            decoder: RowDecoder::new(statement.format.clone(), columns),
            statement,
            schema,
            names,
            defaults,
            rows: Vec::new(),
            batch_rows,
            to_writer,
            writer,
            failed: None,
        })
    }

    /// The statement, as a transaction block lists it.
    pub fn sql(&self) -> String {
        let s = &self.statement;
        match &s.columns {
            Some(c) => format!("COPY {} ({}) FROM STDIN", s.table, c.join(", ")),
            None => format!("COPY {} FROM STDIN", s.table),
        }
    }

    /// The format code and column count of the CopyInResponse.
    pub fn response_shape(&self) -> (i8, usize) {
        (self.statement.format.code(), self.names.len())
    }

    /// One CopyData message's bytes.
    pub async fn data(&mut self, bytes: &[u8]) {
        // A client may send all its rows in one message: decoded a slice at a time, they
        // are never all held as cells at once.
        for piece in bytes.chunks(DECODE_BYTES) {
            if self.failed.is_some() {
                return;
            }
            let outcome = match self.decoder.feed(piece, &mut self.rows) {
                Ok(()) => self.send_full_batches(false).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = outcome {
                self.fail(e);
            }
        }
    }

    /// CopyDone: the last rows, then the commit. Gives the number of rows copied.
    pub async fn done(mut self) -> Result<u64, ErrorInfo> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if let Err(e) = self.decoder.finish(&mut self.rows) {
            return Err(e.into());
        }
        self.send_full_batches(true).await?;
        if self.to_writer.send(Piece::Done).await.is_err() {
            return Err(self.writer_error().await);
        }
        match (&mut self.writer).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(df_error(&e)),
            Err(e) => Err(error_info(code::INTERNAL_ERROR, e.to_string())),
        }
    }

    /// Records the first error; the writer stops without a commit.
    fn fail(&mut self, e: ErrorInfo) {
        self.rows.clear();
        self.writer.abort();
        self.failed.get_or_insert(e);
    }

    /// Sends the gathered rows as batches: every full batch, and with `all` the rest.
    async fn send_full_batches(&mut self, all: bool) -> Result<(), ErrorInfo> {
        while self.rows.len() >= self.batch_rows || (all && !self.rows.is_empty()) {
            let take = self.rows.len().min(self.batch_rows);
            let rows: Vec<Vec<Cell>> = self.rows.drain(..take).collect();
            let first_row = self.decoder.rows() - (self.rows.len() + rows.len()) as u64 + 1;
            let batch = to_batch(&self.statement, &self.schema, &self.names, rows, first_row)?;
            let batch = with_defaults(batch, &self.names, &self.defaults)?;
            if self.to_writer.send(Piece::Batch(batch)).await.is_err() {
                return Err(self.writer_error().await);
            }
        }
        Ok(())
    }

    /// Why the writer stopped taking batches.
    async fn writer_error(&mut self) -> ErrorInfo {
        match (&mut self.writer).await {
            Ok(Err(e)) => df_error(&e),
            Ok(Ok(_)) => error_info(code::INTERNAL_ERROR, "the COPY's writer stopped early"),
            Err(e) => error_info(code::INTERNAL_ERROR, e.to_string()),
        }
    }
}

impl Drop for CopyIn {
    fn drop(&mut self) {
        // A COPY dropped before done() (CopyFail, a closed connection) commits nothing: the
        // writer sees its channel close without Done, and is stopped besides.
        if !self.writer.is_finished() {
            self.writer.abort();
        }
    }
}

/// Decoded rows as a batch of the table's columns (the ones the COPY leaves out NULL), of
/// the cells' own types: the write casts them to the table's.
fn to_batch(
    statement: &CopyStatement,
    schema: &SchemaRef,
    names: &[String],
    rows: Vec<Vec<Cell>>,
    first_row: u64,
) -> Result<RecordBatch, CopyError> {
    let binary = matches!(statement.format, CopyFormat::Binary);
    let types: Vec<DataType> = names
        .iter()
        .map(|n| {
            schema
                .field_with_name(n)
                .map(|f| f.data_type().clone())
                .unwrap_or(DataType::Null)
        })
        .collect();
    let width = names.len();
    let mut values = Vec::with_capacity(rows.len() * width);
    for (r, row) in rows.into_iter().enumerate() {
        for (c, cell) in row.into_iter().enumerate() {
            let value = cell_value(cell, &types[c], binary).map_err(|(state, m)| {
                let row = first_row + r as u64;
                copy_error(state, format!("row {row}, column \"{}\": {m}", names[c]))
            })?;
            values.push(value);
        }
    }
    let count = values.len() / width.max(1);
    let shape = InsertShape {
        table: statement.table.clone(),
        columns: Some(names.to_vec()),
        rows: (0..count)
            .map(|r| (r * width..(r + 1) * width).collect())
            .collect(),
    };
    match bound_insert::batch(&shape, schema, &[], &values) {
        Ok(Some(batch)) => Ok(batch),
        Ok(None) => Err(copy_error(
            code::DATA_EXCEPTION,
            "the COPY's values do not fit the table's columns",
        )),
        Err(m) => Err(copy_error(code::INVALID_TEXT_REPRESENTATION, m)),
    }
}

/// `batch` with the columns the COPY leaves out (NULL so far) filled by their DEFAULTs.
fn with_defaults(
    batch: RecordBatch,
    names: &[String],
    defaults: &ColumnDefaults,
) -> Result<RecordBatch, CopyError> {
    let schema = batch.schema();
    let mut fields = schema.fields().to_vec();
    let mut columns = batch.columns().to_vec();
    let mut filled = false;
    for (i, field) in schema.fields().iter().enumerate() {
        if names.contains(field.name()) {
            continue;
        }
        let values = defaults
            .values(field.name(), batch.num_rows())
            .map_err(|e| {
                let column = field.name();
                copy_error(
                    code::DATA_EXCEPTION,
                    format!("DEFAULT of column \"{column}\": {e}"),
                )
            })?;
        if let Some(values) = values {
            fields[i] = Arc::new(Field::new(field.name(), values.data_type().clone(), true));
            columns[i] = values;
            filled = true;
        }
    }
    if !filled {
        return Ok(batch);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| copy_error(code::INTERNAL_ERROR, e.to_string()))
}

/// One cell as a value for a column of type `ty`; an error with its SQLSTATE.
fn cell_value(cell: Cell, ty: &DataType, binary: bool) -> Result<Value, (&'static str, String)> {
    let Some(bytes) = cell else {
        return Ok(Value::Null);
    };
    if let Some(dim) = vector_dim(ty) {
        let v = vector_value(bytes, binary).map_err(|m| (code::INVALID_TEXT_REPRESENTATION, m))?;
        if v.len() != dim as usize {
            // pgvector's SQLSTATE for "expected 3 dimensions, not 2"
            let m = format!("the vector has {} dimensions, the column {dim}", v.len());
            return Err((code::DATA_EXCEPTION, m));
        }
        return Ok(Value::Vector(v));
    }
    scalar_value(bytes, ty, binary).map_err(|m| (code::INVALID_TEXT_REPRESENTATION, m))
}

/// A vector cell's elements.
fn vector_value(bytes: Vec<u8>, binary: bool) -> Result<Vec<f32>, String> {
    if binary {
        return vector_binary(&bytes);
    }
    let t = String::from_utf8(bytes).map_err(|_| "not valid UTF-8".to_string())?;
    match crate::sql::vector_syntax::parse_vector_text(t.trim()) {
        Some(v) => Ok(v.into_iter().map(|x| x as f32).collect()),
        None => Err(format!(
            "\"{t}\" is not a vector of finite numbers like [1,2,3]"
        )),
    }
}

/// A cell of a column that is not a vector.
fn scalar_value(bytes: Vec<u8>, ty: &DataType, binary: bool) -> Result<Value, String> {
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|_| "not valid UTF-8".to_string());
    if !binary {
        return text(bytes).map(Value::Text);
    }
    let n = bytes.len();
    let int = || -> Result<i64, String> {
        Ok(match n {
            2 => i16::from_be_bytes([bytes[0], bytes[1]]).into(),
            4 => i32::from_be_bytes(bytes[..4].try_into().unwrap()).into(),
            8 => i64::from_be_bytes(bytes[..8].try_into().unwrap()),
            _ => return Err(format!("a binary integer of {n} bytes")),
        })
    };
    Ok(match ty {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => Value::Int(int()?),
        DataType::Float32 | DataType::Float64 => Value::Float(match n {
            4 => f32::from_be_bytes(bytes[..4].try_into().unwrap()).into(),
            8 => f64::from_be_bytes(bytes[..8].try_into().unwrap()),
            _ => return Err(format!("a binary float of {n} bytes")),
        }),
        DataType::Boolean if n == 1 => Value::Bool(bytes[0] != 0),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Value::Text(text(bytes)?),
        other => {
            return Err(format!(
                "binary COPY into a column of type {other} is not supported: use FORMAT csv \
                 or text"
            ));
        }
    })
}

/// A binary vector: pgvector's form (16-bit dimensions, 16 unused bits, the floats), or a
/// one-dimensional `real[]` / `float8[]` array.
fn vector_binary(b: &[u8]) -> Result<Vec<f32>, String> {
    if b.len() >= 4 {
        let dim = u16::from_be_bytes([b[0], b[1]]) as usize;
        if b.len() == 4 + 4 * dim {
            return decode_vector_binary(b);
        }
    }
    match decode_float_array_binary(b)? {
        Some(v) => Ok(v.into_iter().map(|x| x as f32).collect()),
        None => Err("not a binary vector or float array".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pgvector_binary(v: &[f32]) -> Vec<u8> {
        let mut b = (v.len() as u16).to_be_bytes().to_vec();
        b.extend_from_slice(&[0, 0]);
        for x in v {
            b.extend_from_slice(&x.to_be_bytes());
        }
        b
    }

    fn float4_array_binary(v: &[f32]) -> Vec<u8> {
        let mut b = Vec::new();
        for word in [1i32, 0, 700, v.len() as i32, 1] {
            b.extend_from_slice(&word.to_be_bytes());
        }
        for x in v {
            b.extend_from_slice(&4i32.to_be_bytes());
            b.extend_from_slice(&x.to_be_bytes());
        }
        b
    }

    #[test]
    fn cells_take_their_column_types() {
        let vec3 = DataType::new_fixed_size_list(DataType::Float32, 3, true);
        let v = [1.0f32, -2.5, 3.0];
        for bytes in [pgvector_binary(&v), float4_array_binary(&v)] {
            assert_eq!(
                cell_value(Some(bytes), &vec3, true).unwrap(),
                Value::Vector(v.to_vec())
            );
        }
        assert_eq!(
            cell_value(Some(b"[1,-2.5,3]".to_vec()), &vec3, false).unwrap(),
            Value::Vector(v.to_vec())
        );
        let (state, m) = cell_value(Some(b"[1,2]".to_vec()), &vec3, false).unwrap_err();
        assert_eq!(state, "22000", "{m}");
        let (state, _) = cell_value(Some(b"[1,x,2]".to_vec()), &vec3, false).unwrap_err();
        assert_eq!(state, "22P02");
        assert_eq!(cell_value(None, &vec3, true).unwrap(), Value::Null);
        // integers and floats of any width the client chose
        for bytes in [
            7i16.to_be_bytes().to_vec(),
            7i32.to_be_bytes().to_vec(),
            7i64.to_be_bytes().to_vec(),
        ] {
            assert_eq!(
                cell_value(Some(bytes), &DataType::Int64, true).unwrap(),
                Value::Int(7)
            );
        }
        assert_eq!(
            cell_value(
                Some(0.5f32.to_be_bytes().to_vec()),
                &DataType::Float64,
                true
            )
            .unwrap(),
            Value::Float(0.5)
        );
        assert!(cell_value(Some(vec![0; 3]), &DataType::Int64, true).is_err());
        // text is cast by the write, as INSERT casts a string
        assert_eq!(
            cell_value(Some(b"42".to_vec()), &DataType::Int64, false).unwrap(),
            Value::Text("42".into())
        );
        assert!(cell_value(Some(vec![1, 2]), &DataType::Date32, true).is_err());
    }
}

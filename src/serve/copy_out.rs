//! `COPY t [(columns)] TO STDOUT` and `COPY (query) TO STDOUT` [`WITH (...)`]: the export
//! psql's `\copy t TO 'file'`, psycopg's `cursor.copy("COPY ... TO STDOUT")` and asyncpg's
//! `copy_from_table` / `copy_from_query` run, in text, CSV and binary format.
//!
//! The query streams ([`FragvecSession::execute_streaming`]): each batch is encoded as the
//! result rows of a query are (the same text and binary forms, `vector` as pgvector's), each
//! row leaves as one CopyData message ([`super::copy_encode`]), and the socket sends them as
//! they fill its buffer, so an export of any size holds one batch at a time. The messages
//! are sent here rather than by pgwire, which counts a header or an empty export's
//! signature as a row in the `COPY n` it reports.

use std::fmt::Debug;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use futures::{Sink, SinkExt, StreamExt};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyOutResponse};

use super::copy_encode::{self, CellRef};
use super::copy_format::CopyFormat;
use super::copy_statement::CopyOutStatement;
use super::sqlstate::{code, df_error, error_info};
use super::{types, values};
use crate::FragvecSession;
use crate::engine::statements::stream::Streamed;

/// A `COPY ... TO STDOUT` whose query has started: its rows are produced as they are sent.
pub struct CopyOut {
    format: CopyFormat,
    schema: SchemaRef,
    rows: Streamed,
}

impl Debug for CopyOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyOut")
            .field("format", &self.format)
            .field("schema", &self.schema)
            .finish()
    }
}

impl CopyOut {
    /// Starts the COPY's query; an error if it cannot run (no such table, a bad query) or
    /// if a column cannot be written in the COPY's format.
    pub async fn start(
        session: &FragvecSession,
        statement: CopyOutStatement,
    ) -> Result<CopyOut, ErrorInfo> {
        let df = |e: datafusion::common::DataFusionError| df_error(&e);
        let mut parsed = session.parse(&statement.query).map_err(df)?;
        let query = match (parsed.pop(), parsed.is_empty()) {
            (Some(q), true) if crate::engine::statements::stream::is_plain_query(&q) => q,
            _ => {
                return Err(error_info(
                    code::SYNTAX_ERROR,
                    "COPY (query) TO STDOUT takes one SELECT, VALUES or WITH query",
                ));
            }
        };
        let rows = session.execute_streaming(query).await.map_err(df)?;
        let schema = match &rows {
            Streamed::Rows(stream) => stream.schema(),
            Streamed::Done(result) => result.schema.clone(),
        };
        Ok(CopyOut {
            format: statement.format,
            schema,
            rows,
        })
    }

    /// Sends CopyOutResponse, the rows and CopyDone to `client`. Gives the number of rows
    /// sent, or the error that stopped the query (the caller reports it, after the rows
    /// already sent, as PostgreSQL does).
    pub async fn send<C>(self, client: &mut C) -> PgWireResult<Result<u64, ErrorInfo>>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let binary = matches!(self.format, CopyFormat::Binary);
        let columns = self.schema.fields().len();
        let formats = vec![i16::from(binary); columns];
        client
            .feed(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
                self.format.code(),
                columns as i16,
                formats,
            )))
            .await?;
        let names: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let mut writer = RowWriter {
            format: &self.format,
            fields: types::fields(&self.schema, |_| binary),
            pending: copy_encode::header(&self.format, &names),
            rows: 0,
        };
        // The binary header goes with the first row (or the trailer); a text header line is
        // a message of its own.
        if !binary {
            writer.flush(client).await?;
        }
        let outcome = match self.rows {
            Streamed::Done(result) => {
                let mut outcome = Ok(());
                for batch in &result.batches {
                    outcome = writer.batch(batch, client).await?;
                    if outcome.is_err() {
                        break;
                    }
                }
                outcome
            }
            Streamed::Rows(mut stream) => {
                let mut outcome = Ok(());
                while let Some(batch) = stream.next().await {
                    outcome = match batch {
                        Ok(batch) => writer.batch(&batch, client).await?,
                        Err(e) => Err(df_error(&e)),
                    };
                    if outcome.is_err() {
                        break;
                    }
                }
                outcome
            }
        };
        if let Err(e) = outcome {
            return Ok(Err(e));
        }
        writer
            .pending
            .extend_from_slice(&copy_encode::trailer(&self.format));
        writer.flush(client).await?;
        client
            .feed(PgWireBackendMessage::CopyDone(CopyDone::new()))
            .await?;
        Ok(Ok(writer.rows))
    }
}

/// Encodes rows and feeds them, one CopyData message per row.
struct RowWriter<'a> {
    format: &'a CopyFormat,
    fields: Vec<pgwire::api::results::FieldInfo>,
    /// Bytes for the next message (the binary header waits for the first row).
    pending: Vec<u8>,
    rows: u64,
}

impl RowWriter<'_> {
    /// Feeds the rows of `batch`; an error if a value cannot be encoded.
    async fn batch<C>(
        &mut self,
        batch: &RecordBatch,
        client: &mut C,
    ) -> PgWireResult<Result<(), ErrorInfo>>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let encoded = match values::encode_rows(batch, &self.fields) {
            Ok(rows) => rows,
            Err(e) => return Ok(Err(error_info(code::DATA_EXCEPTION, e))),
        };
        let mut cells: Vec<CellRef> = Vec::with_capacity(self.fields.len());
        for row in &encoded {
            cells.clear();
            if let Err(e) = split_cells(&row.data, &mut cells) {
                return Ok(Err(error_info(code::INTERNAL_ERROR, e)));
            }
            copy_encode::row(self.format, &cells, &mut self.pending);
            self.flush(client).await?;
            self.rows += 1;
        }
        Ok(Ok(()))
    }

    /// Sends what is pending as one CopyData message (nothing when nothing is).
    async fn flush<C>(&mut self, client: &mut C) -> PgWireResult<()>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.pending.is_empty() {
            return Ok(());
        }
        let data = Bytes::from(std::mem::take(&mut self.pending));
        client
            .feed(PgWireBackendMessage::CopyData(CopyData::new(data)))
            .await?;
        Ok(())
    }
}

/// The cells of a DataRow's body (per field a 32-bit length, -1 for NULL, and its bytes).
fn split_cells<'a>(mut data: &'a [u8], cells: &mut Vec<CellRef<'a>>) -> Result<(), String> {
    while !data.is_empty() {
        let Some((len, rest)) = data.split_first_chunk::<4>() else {
            return Err("a result row ends inside a field length".into());
        };
        let len = i32::from_be_bytes(*len);
        if len < 0 {
            cells.push(None);
            data = rest;
            continue;
        }
        let Some((value, rest)) = rest.split_at_checked(len as usize) else {
            return Err("a result row ends inside a field".into());
        };
        cells.push(Some(value));
        data = rest;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_of_a_data_row() {
        let mut data = Vec::new();
        data.extend_from_slice(&3i32.to_be_bytes());
        data.extend_from_slice(b"abc");
        data.extend_from_slice(&(-1i32).to_be_bytes());
        data.extend_from_slice(&0i32.to_be_bytes());
        let mut cells = Vec::new();
        split_cells(&data, &mut cells).unwrap();
        assert_eq!(cells, vec![Some(&b"abc"[..]), None, Some(&b""[..])]);
        let mut cells = Vec::new();
        assert!(split_cells(&data[..5], &mut cells).is_err());
        assert!(split_cells(&data[..2], &mut cells).is_err());
    }
}

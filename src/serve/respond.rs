//! What the client receives for one statement's [`Output`]: pgwire's `Response` for rows
//! already collected and for command tags, and — sent here, because they need the client —
//! the rows of a query that streams and the data of a `COPY ... TO STDOUT`.
//!
//! A streamed query's rows are encoded a batch at a time and fed to the socket, which sends
//! them as its buffer fills: a `SELECT` of any size holds one batch on the server, and a
//! client that stops reading stops the query (the socket stops taking rows). Sending runs
//! under the statement timeout; an error while the rows stream (the query fails, the timeout
//! fires) follows the rows already sent, as in PostgreSQL, and fails the transaction block.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Sink, SinkExt, StreamExt, stream};
use pgwire::api::ConnectionHandle;
use pgwire::api::results::{CopyResponse, FieldInfo, QueryResponse, Response, Tag};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::data::{DataRow, RowDescription};
use pgwire::messages::response::NoticeResponse;

use super::copy_in::CopyIn;
use super::run::{CancelSignal, FailBlockIfDropped, Output, QueryRows, df_error, error_info};
use super::sqlstate::code;
use super::transaction::Block;
use super::{types, values};

/// Where a connection's outputs go besides the client: the COPY FROM waiting for its data,
/// the transaction block a failure marks.
pub struct Destination<'a> {
    /// Where a COPY FROM STDIN waits for its CopyData.
    pub copy_in: &'a Mutex<Option<Box<CopyIn>>>,
    /// The connection's transaction block.
    pub block: &'a Mutex<Block>,
    /// The session's `statement_timeout`, for the rows still to send.
    pub timeout: Option<Duration>,
}

/// The client's answer to `out`: rows that stream and COPY TO's data are sent here (the
/// simple protocol's RowDescription first when `describe`), the rest is left to pgwire.
pub async fn respond<C>(
    client: &mut C,
    out: Result<Output, ErrorInfo>,
    binary: &(dyn Fn(usize) -> bool + Sync),
    describe: bool,
    to: &Destination<'_>,
) -> PgWireResult<Response>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let sending = match out {
        Ok(Output::CopyOut(copy)) => Sending::Copy(copy),
        Ok(Output::Stream(rows)) => Sending::Rows(rows),
        out => return Ok(response(out, binary, to.copy_in)),
    };
    // Rows still to send belong to the statement: a cancel that drops this future fails the
    // transaction block, as an error would.
    let mut unfinished = FailBlockIfDropped {
        block: to.block,
        armed: true,
    };
    let send = async {
        Ok::<_, PgWireError>(match sending {
            Sending::Copy(copy) => {
                let sent = copy.send(client).await?;
                sent.map(|rows| Tag::new("COPY").with_rows(rows as usize))
            }
            Sending::Rows(rows) => {
                let sent = send_rows(client, rows, binary, describe).await?;
                sent.map(|rows| Tag::new("SELECT").with_rows(rows))
            }
        })
    };
    let sent = match to.timeout {
        Some(limit) => match tokio::time::timeout(limit, send).await {
            Ok(sent) => sent?,
            Err(_) => Err(error_info(
                code::QUERY_CANCELED,
                "canceling statement due to statement timeout",
            )),
        },
        None => send.await?,
    };
    unfinished.armed = false;
    Ok(match sent {
        Ok(tag) => Response::Execution(tag),
        Err(e) => {
            to.block.lock().expect("lock").failed();
            Response::Error(Box::new(e))
        }
    })
}

/// Outputs whose rows are sent here.
enum Sending {
    Copy(Box<super::copy_out::CopyOut>),
    Rows(QueryRows),
}

/// Sends a streamed query's rows as DataRows; gives their number, or the error that
/// stopped the query.
async fn send_rows<C>(
    client: &mut C,
    rows: QueryRows,
    binary: &(dyn Fn(usize) -> bool + Sync),
    describe: bool,
) -> PgWireResult<Result<usize, ErrorInfo>>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let QueryRows(mut stream) = rows;
    let fields = types::fields(&stream.schema(), binary);
    if describe {
        client
            .feed(PgWireBackendMessage::RowDescription(description(&fields)))
            .await?;
    }
    let mut sent = 0;
    while let Some(batch) = stream.next().await {
        let encoded = match encode_batch(batch, &fields) {
            Ok(rows) => rows,
            Err(e) => return Ok(Err(*e)),
        };
        sent += encoded.len();
        for row in encoded {
            client.feed(PgWireBackendMessage::DataRow(row)).await?;
        }
    }
    Ok(Ok(sent))
}

/// One batch of a query's stream as DataRows, or the error the client is told.
fn encode_batch(
    batch: datafusion::common::Result<RecordBatch>,
    fields: &[FieldInfo],
) -> Result<Vec<DataRow>, Box<ErrorInfo>> {
    encode(&batch.map_err(|e| Box::new(df_error(&e)))?, fields)
}

/// `batch`'s rows as DataRows of `fields`.
fn encode(batch: &RecordBatch, fields: &[FieldInfo]) -> Result<Vec<DataRow>, Box<ErrorInfo>> {
    values::encode_rows(batch, fields).map_err(|e| Box::new(error_info(code::DATA_EXCEPTION, e)))
}

/// A streamed query's rows for pgwire to keep in a portal and send a part at a time (an
/// Execute with a row limit): produced only as the client asks for them. An error while
/// they are produced, the statement timeout (from now) or a cancel request through `cancel`
/// fails the transaction block.
pub fn portal_rows(
    rows: QueryRows,
    binary: &(dyn Fn(usize) -> bool + Sync),
    block: Arc<Mutex<Block>>,
    timeout: Option<Duration>,
    cancel: Option<Arc<ConnectionHandle>>,
) -> QueryResponse {
    let QueryRows(stream) = rows;
    let fields = Arc::new(types::fields(&stream.schema(), binary));
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let encode_fields = fields.clone();
    let rows = watched(stream, deadline, cancel)
        .map(move |batch| {
            let rows: Vec<PgWireResult<DataRow>> =
                match batch.and_then(|b| encode(&b, &encode_fields)) {
                    Ok(rows) => rows.into_iter().map(Ok).collect(),
                    Err(e) => {
                        block.lock().expect("lock").failed();
                        vec![Err(PgWireError::UserError(e))]
                    }
                };
            stream::iter(rows)
        })
        .flatten();
    QueryResponse::new(fields, rows)
}

/// `batches` until `deadline` passes or the connection's cancel request comes (then one
/// error, 57014, and no more). pgwire pulls a portal's rows after its Execute returns, where
/// it no longer watches for a cancel request; each batch is waited for here, so a slow one
/// (an aggregate's only one) is cut short as the simple protocol's would be.
fn watched(
    batches: SendableRecordBatchStream,
    deadline: Option<tokio::time::Instant>,
    cancel: Option<Arc<ConnectionHandle>>,
) -> impl futures::Stream<Item = Result<RecordBatch, Box<ErrorInfo>>> + Send {
    struct Watch {
        batches: SendableRecordBatchStream,
        deadline: Option<tokio::time::Instant>,
        cancel: Option<Arc<ConnectionHandle>>,
        signal: Option<CancelSignal>,
        stopped: bool,
    }
    let watch = Watch {
        batches,
        deadline,
        cancel,
        signal: None,
        stopped: false,
    };
    stream::unfold(watch, |mut w| async move {
        if w.stopped {
            return None;
        }
        // Asked for at the first pull, after pgwire's Execute has let go of its own.
        let signal = match &mut w.signal {
            Some(signal) => signal,
            None => w.signal.insert(match &w.cancel {
                Some(handle) => CancelSignal::new(handle.start_query().await),
                None => CancelSignal::never(),
            }),
        };
        let batches = &mut w.batches;
        let next = async {
            match w.deadline {
                Some(d) => tokio::time::timeout_at(d, batches.next()).await.ok(),
                None => Some(batches.next().await),
            }
        };
        let item = tokio::select! {
            next = next => match next {
                Some(Some(batch)) => batch.map_err(|e| Box::new(df_error(&e))),
                Some(None) => return None,
                None => Err(Box::new(error_info(
                    code::QUERY_CANCELED,
                    "canceling statement due to statement timeout",
                ))),
            },
            _ = signal.fired() => Err(Box::new(error_info(
                code::QUERY_CANCELED,
                "canceling statement due to user request",
            ))),
        };
        w.stopped = item.is_err();
        Some((item, w))
    })
}

/// The RowDescription of `fields`.
fn description(fields: &[FieldInfo]) -> RowDescription {
    RowDescription::new(fields.iter().map(Into::into).collect())
}

/// The number of rows a streamed query gives, without sending them (a portal described as
/// returning none).
pub async fn count_rows(rows: QueryRows) -> Result<usize, ErrorInfo> {
    let QueryRows(mut stream) = rows;
    let mut n = 0;
    while let Some(batch) = stream.next().await {
        n += batch.map_err(|e| df_error(&e))?.num_rows();
    }
    Ok(n)
}

/// pgwire's response for one statement's output, its rows in the formats `binary(i)` asks.
/// A COPY FROM STDIN goes to `copy_in`, to take the data that follows.
fn response(
    out: Result<Output, ErrorInfo>,
    binary: &dyn Fn(usize) -> bool,
    copy_in: &Mutex<Option<Box<CopyIn>>>,
) -> Response {
    match out {
        Err(e) => Response::Error(Box::new(e)),
        Ok(Output::CopyIn(copy)) => {
            let (format, columns) = copy.response_shape();
            *copy_in.lock().expect("lock") = Some(copy);
            Response::CopyIn(CopyResponse::new(format, columns, stream::empty()))
        }
        // Sent by `respond`, which has the client.
        Ok(Output::CopyOut(_) | Output::Stream(_)) => Response::Error(Box::new(error_info(
            code::INTERNAL_ERROR,
            "rows that stream reached the wrong sender",
        ))),
        Ok(Output::Command(tag)) => Response::Execution(Tag::new(&tag)),
        Ok(Output::Control { tag, opened, .. }) => match opened {
            Some(true) => Response::TransactionStart(Tag::new(tag)),
            Some(false) => Response::TransactionEnd(Tag::new(tag)),
            None => Response::Execution(Tag::new(tag)),
        },
        Ok(Output::Rows(result)) => {
            let fields = Arc::new(types::fields(&result.schema, binary));
            let mut rows = Vec::with_capacity(result.num_rows());
            for batch in &result.batches {
                match values::encode_rows(batch, &fields) {
                    Ok(r) => rows.extend(r.into_iter().map(Ok)),
                    Err(e) => {
                        return Response::Error(Box::new(error_info(code::DATA_EXCEPTION, e)));
                    }
                }
            }
            let mut q = QueryResponse::new(fields, stream::iter(rows));
            if result.schema.fields().len() == 1 && result.schema.field(0).name() == "plan" {
                q.set_command_tag("EXPLAIN");
            }
            Response::Query(q)
        }
    }
}

/// Sends the warnings of control statements before their responses.
pub async fn send_warnings<C>(
    client: &mut C,
    outputs: &mut [Result<Output, ErrorInfo>],
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    for out in outputs.iter_mut() {
        if let Ok(Output::Control { warning, .. }) = out
            && let Some(w) = warning.take()
        {
            client
                .feed(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                    w,
                )))
                .await?;
        }
    }
    Ok(())
}

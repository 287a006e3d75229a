//! arrow-flight's `FlightSqlService` over fragvec sessions: protocol code only. Statements
//! run through the same session front end as the CLI and the Postgres endpoint
//! ([`FragvecSession::execute_streaming`](crate::FragvecSession::execute_streaming)), parameters are spliced as the Postgres endpoint
//! splices them ([`super::bind`]), errors keep their SQLSTATE's class ([`super::status`]).
//!
//! A statement runs at GetFlightInfo — to the end for anything that writes, up to its
//! first batch for a query if that comes soon (`started`: an error at a query's start
//! then answers the execute, as PostgreSQL's Execute does) — and its output waits under a
//! random handle (the ticket) for the DoGet, which streams the query's other batches as
//! they are produced.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any,
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetSqlInfo,
    CommandGetTableTypes, CommandGetTables, CommandGetXdbcTypeInfo, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    Action, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightDescriptor,
    FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, Ticket,
};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use super::sessions::{FlightSession, Pending, Sessions};
use super::{bind, catalog, ingest, status};
use crate::engine::{StatementResult, Streamed};
use crate::serve::files::AllowedFiles;
use crate::serve::sqlstate::code;
use crate::serve::{describe, params};

type DoGetStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send>>;

/// The Flight SQL service of one server.
pub struct FlightSql {
    pub(super) sessions: Arc<Sessions>,
    pub(super) allow_files: AllowedFiles,
    /// The default limit of a statement's run (0: none).
    pub(super) statement_timeout: Duration,
}

impl FlightSql {
    async fn session<T>(&self, request: &Request<T>) -> Result<Arc<FlightSession>, Status> {
        self.sessions.of(request.metadata()).await
    }

    /// Runs every statement of `sql` in `session`; the last one's output is the answer (a
    /// query's rows as a stream).
    async fn run(&self, session: &FlightSession, sql: &str) -> Result<Streamed, Status> {
        let work = async {
            let s = &session.session;
            let df = |e: datafusion::common::DataFusionError| status::of(&e);
            // A repeated KNN text (a prepared statement with another vector): its kept plan
            // answers without a parse.
            if let Some(out) = s.run_known_shape_streaming(sql).await.map_err(df)? {
                return Ok(out);
            }
            let mut statements = s.parse(sql).map_err(df)?;
            let Some(last) = statements.pop() else {
                return Ok(Streamed::Done(StatementResult::empty()));
            };
            let alone = statements.is_empty();
            for statement in statements {
                self.allowed(&statement)?;
                s.execute(statement).await.map_err(df)?;
            }
            self.allowed(&last)?;
            if alone {
                s.execute_text_streaming(sql, last).await.map_err(df)
            } else {
                s.execute_streaming(last).await.map_err(df)
            }
        };
        let work = async { started(work.await?).await };
        if self.statement_timeout.is_zero() {
            return work.await;
        }
        tokio::time::timeout(self.statement_timeout, work)
            .await
            .unwrap_or_else(|_| Err(timed_out()))
    }

    fn allowed(&self, statement: &crate::sql::FragvecStatement) -> Result<(), Status> {
        self.allow_files
            .check(statement)
            .map_err(|m| status::with_sqlstate(code::INSUFFICIENT_PRIVILEGE, m))
    }

    /// Runs `sql` and keeps its output for the DoGet the returned FlightInfo's ticket asks.
    async fn run_for_ticket(
        &self,
        session: &FlightSession,
        sql: &str,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let deadline = (!self.statement_timeout.is_zero())
            .then(|| tokio::time::Instant::now() + self.statement_timeout);
        let output = self.run(session, sql).await?;
        let schema = catalog::mark_vectors(&output_schema(&output));
        let (rows, bytes) = match &output {
            // ADBC reports total_records as a statement's row count.
            Streamed::Done(r) => (
                r.rows_affected.map_or(r.num_rows() as i64, |n| n as i64),
                r.batches
                    .iter()
                    .map(|b| b.get_array_memory_size() as i64)
                    .sum(),
            ),
            Streamed::Rows(_) => (-1, -1),
        };
        let handle = self.sessions.keep(session, output, deadline);
        let ticket = TicketStatementQuery {
            statement_handle: handle.into(),
        };
        let info = FlightInfo::new()
            .try_with_schema(&schema)
            .map_err(status::invalid_input)?
            .with_endpoint(
                FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec())),
            )
            .with_descriptor(descriptor)
            .with_total_records(rows)
            .with_total_bytes(bytes)
            .with_ordered(true);
        Ok(with_token(session, Response::new(info)))
    }

    /// A FlightInfo whose ticket is the command itself (metadata, answered at DoGet).
    fn info_for_command(
        command: impl ProstMessageExt,
        schema: &Schema,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let ticket = Ticket::new(command.as_any().encode_to_vec());
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(status::invalid_input)?
            .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// The rows of one prepared statement's parameters (a DoPut's batches, concatenated).
    /// A message with no IPC header carries only the descriptor: arrow-flight's own client
    /// sends one alone to run a prepared update whose parameters it bound before.
    async fn parameters(upload: PeekableFlightDataStream) -> Result<Option<RecordBatch>, Status> {
        let messages = upload
            .try_filter(|d| std::future::ready(!d.data_header.is_empty()))
            .map_err(|e| FlightError::Tonic(Box::new(e)));
        let batches: Vec<RecordBatch> =
            arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(messages)
                .try_collect()
                .await
                .map_err(|e| Status::invalid_argument(format!("the parameters: {e}")))?;
        let Some(first) = batches.first() else {
            return Ok(None);
        };
        datafusion::arrow::compute::concat_batches(&first.schema(), &batches)
            .map(Some)
            .map_err(status::invalid_input)
    }
}

/// How long a query's GetFlightInfo waits for its first batch. Long enough for what fails
/// at a query's start (a query vector of the wrong dimension, a bad cast of the first rows),
/// short enough that a long query — an aggregate whose one batch comes at its end — answers
/// its FlightInfo at once and can be cancelled through it (CancelFlightInfo needs the info).
const FIRST_BATCH_WAIT: Duration = Duration::from_millis(100);

/// `output`, with a query's first batch produced (and kept in front of the others) if it
/// comes within [`FIRST_BATCH_WAIT`]: an error the query meets at its start is then the
/// answer of the call that ran it, as PostgreSQL's Execute answers it.
async fn started(output: Streamed) -> Result<Streamed, Status> {
    let Streamed::Rows(mut rows) = output else {
        return Ok(output);
    };
    // `next()` is cancel-safe: a wait that times out leaves the stream where it was, and
    // the DoGet polls it on.
    let first = match tokio::time::timeout(FIRST_BATCH_WAIT, rows.next()).await {
        Err(_) => return Ok(Streamed::Rows(rows)),
        Ok(Some(Err(e))) => return Err(status::of(&e)),
        Ok(first) => first,
    };
    let schema = rows.schema();
    Ok(Streamed::Rows(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        stream::iter(first).chain(rows),
    ))))
}

fn timed_out() -> Status {
    status::with_sqlstate(
        code::QUERY_CANCELED,
        "canceling statement due to statement timeout",
    )
}

fn output_schema(output: &Streamed) -> SchemaRef {
    match output {
        Streamed::Rows(s) => s.schema(),
        Streamed::Done(r) => r.schema.clone(),
    }
}

/// The DoGet stream of a kept output: a query's batches as they are produced, until the
/// end, a CancelFlightInfo, or the statement's deadline.
fn stream_output(pending: Pending) -> DoGetStream {
    let schema = catalog::mark_vectors(&output_schema(&pending.output));
    let batches: Pin<Box<dyn Stream<Item = Result<RecordBatch, FlightError>> + Send>> =
        match pending.output {
            Streamed::Rows(s) => {
                Box::pin(s.map_err(|e| FlightError::Tonic(Box::new(status::of(&e)))))
            }
            Streamed::Done(r) => Box::pin(stream::iter(r.batches.into_iter().map(Ok))),
        };
    let marked = schema.clone();
    let batches = batches
        .map(move |b| b.and_then(|b| b.with_schema(marked.clone()).map_err(FlightError::Arrow)));
    let cancel = pending.cancel.clone();
    let stopped = async move {
        let deadline = async {
            match pending.deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.fired() => status::with_sqlstate(code::QUERY_CANCELED, "canceling statement due to user request"),
            _ = deadline => timed_out(),
        }
    };
    let stopped = futures::FutureExt::shared(Box::pin(stopped));
    // Ends the batches with the stop's status when it comes first.
    let guarded = stream::unfold(
        (Box::pin(batches), stopped, false),
        |(mut batches, stopped, done)| async move {
            if done {
                return None;
            }
            tokio::select! {
                biased;
                status = stopped.clone() => Some((Err(FlightError::Tonic(Box::new(status))), (batches, stopped, true))),
                next = batches.next() => next.map(|b| (b, (batches, stopped, false))),
            }
        },
    );
    Box::pin(
        FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(guarded)
            .map_err(Status::from),
    )
}

/// `response`, carrying the session's token when the session was made for this call (see
/// [`super::sessions`]).
fn with_token<T>(session: &FlightSession, mut response: Response<T>) -> Response<T> {
    if let Some(token) = session.issued_token()
        && let Ok(value) = MetadataValue::try_from(format!("Bearer {token}"))
    {
        response.metadata_mut().insert("authorization", value);
    }
    response
}

/// A DoGet stream of one metadata batch.
fn one_batch(batch: RecordBatch) -> Response<DoGetStream> {
    let schema = batch.schema();
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(stream::once(async { Ok(batch) }))
        .map_err(Status::from);
    Response::new(Box::pin(stream))
}

/// Reads the handle a query's ticket names, whichever message the client cancels with.
fn handle_of_info(info: &FlightInfo) -> Option<Vec<u8>> {
    let ticket = info.endpoint.first()?.ticket.as_ref()?;
    let any = Any::decode(ticket.ticket.clone()).ok()?;
    let query: TicketStatementQuery = any.unpack().ok()??;
    Some(query.statement_handle.to_vec())
}

#[tonic::async_trait]
impl FlightSqlService for FlightSql {
    type FlightService = FlightSql;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        let token = self.sessions.handshake(request.metadata()).await?;
        let answer = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into(),
        };
        let mut response: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(stream::iter([Ok(answer)])));
        let header = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::internal("token is not a header value"))?;
        response.metadata_mut().insert("authorization", header);
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if query.transaction_id.is_some() {
            return Err(no_transactions());
        }
        let session = self.session(&request).await?;
        self.run_for_ticket(&session, &query.query, request.into_inner())
            .await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let prepared = self
            .sessions
            .prepared(&session, &query.prepared_statement_handle)?;
        let parameters = prepared.parameters.lock().expect("lock").clone();
        if parameters.as_ref().is_some_and(|p| p.num_rows() > 1) {
            return Err(Status::invalid_argument(
                "a query takes one row of parameters (run it once per row)",
            ));
        }
        let sql = bind::bind(&prepared.sql, parameters.as_ref(), 0)
            .map_err(|m| status::with_sqlstate(code::PROTOCOL_VIOLATION, m))?;
        self.run_for_ticket(&session, &sql, request.into_inner())
            .await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let pending = self.sessions.take(&session, &ticket.statement_handle)?;
        Ok(with_token(&session, Response::new(stream_output(pending))))
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        if command.transaction_id.is_some() {
            return Err(no_transactions());
        }
        let session = self.session(&request).await?;
        let output = self.run(&session, &command.query).await?;
        Ok(affected(output))
    }

    async fn do_put_statement_ingest(
        &self,
        command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request).await?;
        ingest::ingest(&session.session, command, request.into_inner()).await
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let session = self.session(&request).await?;
        let prepared = self
            .sessions
            .prepared(&session, &query.prepared_statement_handle)?;
        let parameters = Self::parameters(request.into_inner()).await?;
        *prepared.parameters.lock().expect("lock") = parameters;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(query.prepared_statement_handle),
        })
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request).await?;
        let prepared = self
            .sessions
            .prepared(&session, &query.prepared_statement_handle)?;
        let uploaded = Self::parameters(request.into_inner()).await?;
        let parameters = uploaded.or_else(|| prepared.parameters.lock().expect("lock").clone());
        // One run per row of parameters (executemany), each its own commit.
        let rows = parameters.as_ref().map_or(1, |p| p.num_rows().max(1));
        let mut total = 0i64;
        for row in 0..rows {
            let sql = bind::bind(&prepared.sql, parameters.as_ref(), row)
                .map_err(|m| status::with_sqlstate(code::PROTOCOL_VIOLATION, m))?;
            let n = affected(self.run(&session, &sql).await?);
            total = if n < 0 || total < 0 { -1 } else { total + n };
        }
        Ok(total)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        if query.transaction_id.is_some() {
            return Err(no_transactions());
        }
        let session = self.session(&request).await?;
        // Described now, as a server that plans at prepare would: a statement that does not
        // parse, or names a missing table or column, fails here rather than at its first
        // execution; a query tells its result schema, and each parameter its type where the
        // statement settles it (`Null` where the value will).
        let unbound = describe::describe_unbound(
            &session.session,
            &params::numbered_placeholders(&query.query),
            describe::Endpoint::FlightSql,
        )
        .await
        .map_err(|e| status::of(&e))?;
        let dataset_schema = match &unbound.schema {
            Some(schema) => ipc_schema(&catalog::mark_vectors(schema))?,
            None => Default::default(),
        };
        let parameter_schema = match parameter_schema(&unbound.parameters) {
            Some(schema) => ipc_schema(&schema)?,
            None => Default::default(),
        };
        let handle = self.sessions.prepare(&session, query.query);
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema,
            parameter_schema,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = self.session(&request).await?;
        self.sessions
            .close_prepared(&session, &query.prepared_statement_handle)
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let session = self.session(&request).await?;
        let info = FlightInfo::decode(query.info)
            .map_err(|e| Status::invalid_argument(format!("CancelQuery: {e}")))?;
        let cancelled = handle_of_info(&info).is_some_and(|h| self.sessions.cancel(&session, &h));
        Ok(ActionCancelQueryResult {
            result: if cancelled { 1 } else { 3 }, // CANCELLED, NOT_CANCELLABLE
        })
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        if request.get_ref().r#type == "CloseSession" {
            let session = self.session(&request).await?;
            self.sessions.close(&session);
            // CloseSessionResult { status: CLOSED }: field 1, varint 1 (arrow-flight 59 has
            // no type for the session actions).
            let body = arrow_flight::Result::new(vec![0x08u8, 0x01]);
            return Ok(Response::new(Box::pin(stream::iter([Ok(body)]))));
        }
        if request.get_ref().r#type != "CancelFlightInfo" {
            return Err(Status::invalid_argument(format!(
                "unknown action {:?}",
                request.get_ref().r#type
            )));
        }
        let session = self.session(&request).await?;
        let cancel = CancelFlightInfoRequest::decode(request.get_ref().body.clone())
            .map_err(|e| Status::invalid_argument(format!("CancelFlightInfo: {e}")))?;
        let handle = cancel.info.as_ref().and_then(handle_of_info);
        let cancelled = handle.is_some_and(|h| self.sessions.cancel(&session, &h));
        if !cancelled {
            return Err(Status::not_found(
                "no such running statement (it finished, or was never started)",
            ));
        }
        let result = CancelFlightInfoResult {
            status: CancelStatus::Cancelled as i32,
        };
        let body = arrow_flight::Result::new(result.encode_to_vec());
        Ok(Response::new(Box::pin(stream::iter([Ok(body)]))))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let schema = query.into_builder().schema();
        Self::info_for_command(query, &schema, request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_catalogs(
        &self,
        _query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        Ok(with_token(&session, one_batch(catalog::catalogs()?)))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let schema = catalog::db_schemas_schema(query.clone());
        Self::info_for_command(query, &schema, request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        Ok(with_token(&session, one_batch(catalog::db_schemas(query)?)))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let schema = query.clone().into_builder().schema();
        Self::info_for_command(query, &schema, request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        Ok(with_token(
            &session,
            one_batch(catalog::tables_batch(&session.session, query).await?),
        ))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let schema = catalog::table_types()?.schema();
        Self::info_for_command(query, &schema, request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_table_types(
        &self,
        _query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        Ok(with_token(&session, one_batch(catalog::table_types()?)))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let schema = query.clone().into_builder(&catalog::SQL_INFO).schema();
        Self::info_for_command(query, &schema, request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let batch = query
            .into_builder(&catalog::SQL_INFO)
            .build()
            .map_err(Status::from)?;
        Ok(with_token(&session, one_batch(batch)))
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        Self::info_for_command(query, &catalog::primary_keys_schema(), request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        Ok(with_token(
            &session,
            one_batch(catalog::primary_keys(&session.session, query).await?),
        ))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let schema = query.into_builder(&catalog::XDBC_TYPES).schema();
        Self::info_for_command(query, &schema, request.into_inner())
            .map(|r| with_token(&session, r))
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let batch = query
            .into_builder(&catalog::XDBC_TYPES)
            .build()
            .map_err(Status::from)?;
        Ok(with_token(&session, one_batch(batch)))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// The schema a prepared statement's parameters are bound in: `$1`, `$2`, ... of the types
/// the statement settles (a query vector: `list<float>`, though any list of numbers binds);
/// `None` for a statement without parameters.
fn parameter_schema(parameters: &[describe::ParameterType]) -> Option<Schema> {
    if parameters.is_empty() {
        return None;
    }
    let fields = parameters.iter().enumerate().map(|(i, p)| {
        let dt = match p {
            describe::ParameterType::Unknown => DataType::Null,
            describe::ParameterType::Vector => {
                DataType::List(Arc::new(Field::new_list_field(DataType::Float32, false)))
            }
            describe::ParameterType::Arrow(dt) => dt.clone(),
        };
        Field::new(format!("${}", i + 1), dt, true)
    });
    Some(Schema::new(fields.collect::<Vec<_>>()))
}

/// `schema` as the IPC message a Flight SQL answer carries.
fn ipc_schema(schema: &Schema) -> Result<prost::bytes::Bytes, Status> {
    let message = arrow_flight::IpcMessage::try_from(arrow_flight::SchemaAsIpc::new(
        schema,
        &datafusion::arrow::ipc::writer::IpcWriteOptions::default(),
    ))
    .map_err(status::invalid_input)?;
    Ok(message.0)
}

fn no_transactions() -> Status {
    Status::unimplemented("fragvec has no transactions: each statement commits by itself")
}

/// The row count of a statement's output (-1: it does not count rows).
fn affected(output: Streamed) -> i64 {
    match output {
        Streamed::Done(r) => r.rows_affected.map_or(-1, |n| n as i64),
        Streamed::Rows(_) => -1,
    }
}

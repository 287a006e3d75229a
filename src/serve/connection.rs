//! One client connection: its fragvec session (opened at its first statement), its
//! transaction block and PostgreSQL settings, and pgwire's simple and extended query
//! handlers over them.
//!
//! Extended protocol: Parse keeps the text and the parameter types the client gave; Bind
//! (pgwire's) keeps the values; Describe of a portal runs the statement (its parameters are
//! bound, so this is the statement Execute would run) and keeps the result for Execute, so
//! the RowDescription is exactly the result's and the statement runs once. Describe of a
//! statement, before any values, plans it with placeholders to find its parameter and result
//! types.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::Schema;

use futures::{Sink, SinkExt};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeResponse, DescribeStatementResponse, FieldFormat, FieldInfo,
    Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionHandle, DEFAULT_NAME, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::data::{NoData, ParameterDescription, RowDescription};
use pgwire::messages::extendedquery::{
    Bind, BindComplete, Describe, Parse, ParseComplete, TARGET_TYPE_BYTE_PORTAL,
    TARGET_TYPE_BYTE_STATEMENT,
};
use tokio::sync::OnceCell;

use super::bound_insert;
use super::copy_in::CopyIn;
use super::describe::{self, ParameterType};
use super::params;
use super::pg_catalog;
use super::portal::{Prepared, bound_shape, bound_sql, bound_values, portal_key};
use super::respond;
use super::run::{CancelSignal, Output, Runner, df_error, error_info};
use super::settings::Settings;
use super::sqlstate::{code, user_error};
use super::transaction::Block;
use super::types::{self, type_of_oid};
use crate::FragvecSession;

/// What the server shares with every connection.
pub struct Shared {
    /// The session new connections' sessions are made from (same database, one index cache).
    pub root: FragvecSession,
    /// The database's name as clients see it (`current_database()`, `\l`).
    pub database_name: String,
    /// The default `statement_timeout` in milliseconds (0: none).
    pub statement_timeout_ms: u64,
    /// Where clients may read and write files.
    pub allow_files: super::files::AllowedFiles,
}

/// The connection's handler.
pub struct Connection {
    shared: Arc<Shared>,
    session: OnceCell<FragvecSession>,
    /// Shared with the rows of a suspended portal, which fail it if they fail.
    block: Arc<Mutex<Block>>,
    settings: Mutex<Settings>,
    /// Results of statements run at Describe of a portal, by portal identity, for Execute.
    described: Mutex<HashMap<usize, Vec<Result<Output, ErrorInfo>>>>,
    /// The `COPY ... FROM STDIN` taking this connection's CopyData messages.
    copy_in: Mutex<Option<Box<CopyIn>>>,
}

impl Connection {
    /// A new connection's state over the server's `shared` handles.
    pub fn new(shared: Arc<Shared>) -> Self {
        let settings = Settings::new(shared.statement_timeout_ms, "fragvec");
        Self {
            shared,
            session: OnceCell::new(),
            block: Arc::default(),
            settings: Mutex::new(settings),
            described: Mutex::default(),
            copy_in: Mutex::default(),
        }
    }

    /// The connection's session, opened at first use.
    async fn session(&self) -> PgWireResult<&FragvecSession> {
        self.session
            .get_or_try_init(|| async {
                let session = self.shared.root.new_sharing().await?;
                let settings: Vec<(String, String)> = self
                    .settings
                    .lock()
                    .expect("lock")
                    .all()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                pg_catalog::install(&session, &self.shared.database_name, &settings)?;
                Ok::<_, datafusion::common::DataFusionError>(session)
            })
            .await
            .map_err(|e| user_error(df_error(&e)))
    }

    /// Runs a portal: a plain INSERT of parameters on its decoded values
    /// ([`super::bound_insert`]), anything else as its SQL with the values spliced in.
    async fn run_portal(
        &self,
        portal: &Portal<Prepared>,
        cancel: CancelSignal,
    ) -> PgWireResult<Vec<Result<Output, ErrorInfo>>> {
        let prepared = &portal.statement.statement;
        let shape = prepared
            .insert
            .get_or_init(|| bound_insert::shape(&prepared.sql));
        if let Some(shape) = shape
            && let Some(values) = bound_values(portal)?
        {
            let runner = self.runner(cancel).await?;
            if let Some(out) = runner.bound_insert(&prepared.sql, shape, &values).await {
                return Ok(vec![out]);
            }
            return Ok(runner.run(&bound_sql(portal)?).await);
        }
        // A KNN query with its vector bound: its kept plan answers from the decoded values,
        // without writing them into the text and reading them back.
        if let Some(shape) = bound_shape(portal) {
            let runner = self.runner(cancel).await?;
            if let Some(out) = runner.known_shape_of(&shape).await {
                return Ok(vec![out]);
            }
            return Ok(runner.run(&bound_sql(portal)?).await);
        }
        self.run(&bound_sql(portal)?, cancel).await
    }

    /// Runs `sql`; `cancel` stops the statement running when it fires.
    async fn run(
        &self,
        sql: &str,
        cancel: CancelSignal,
    ) -> PgWireResult<Vec<Result<Output, ErrorInfo>>> {
        Ok(self.runner(cancel).await?.run(sql).await)
    }

    /// Where outputs go besides the client.
    fn destination(&self) -> respond::Destination<'_> {
        respond::Destination {
            copy_in: &self.copy_in,
            block: &self.block,
            timeout: self.settings.lock().expect("lock").statement_timeout(),
        }
    }

    /// The connection's state for running statements.
    async fn runner(&self, cancel: CancelSignal) -> PgWireResult<Runner<'_>> {
        Ok(Runner {
            session: self.session().await?,
            block: &self.block,
            settings: &self.settings,
            allow_files: &self.shared.allow_files,
            cancel: tokio::sync::Mutex::new(cancel),
        })
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // pgwire races Query against the connection's cancel request itself.
        let mut outputs = self.run(query, CancelSignal::never()).await?;
        respond::send_warnings(client, &mut outputs).await?;
        let mut responses = Vec::with_capacity(outputs.len());
        for out in outputs {
            let to = self.destination();
            responses.push(respond::respond(client, out, &|_| false, true, &to).await?);
        }
        Ok(responses)
    }
}

/// A COPY's data: decoded and written as it arrives, committed at CopyDone
/// ([`super::copy_in`]). The connection loop ([`super::socket`]) answers CopyDone's
/// ReadyForQuery itself, with the transaction block's status.
#[async_trait]
impl CopyHandler for Connection {
    async fn on_copy_data<C>(&self, _client: &mut C, data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // Out of the lock while it awaits the writer (this connection's messages come one
        // at a time, so nothing else wants it meanwhile).
        let copy = self.copy_in.lock().expect("lock").take();
        if let Some(mut copy) = copy {
            copy.data(&data.data).await;
            *self.copy_in.lock().expect("lock") = Some(copy);
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let copy = self.copy_in.lock().expect("lock").take();
        let Some(copy) = copy else {
            return Err(user_error(error_info(
                code::PROTOCOL_VIOLATION,
                "CopyDone without a COPY FROM STDIN",
            )));
        };
        let sql = copy.sql();
        match copy.done().await {
            Ok(rows) => {
                {
                    let mut block = self.block.lock().expect("lock");
                    if block.is_open() {
                        block.ran(&sql, true);
                    }
                }
                client
                    .feed(PgWireBackendMessage::CommandComplete(
                        Tag::new("COPY").with_rows(rows as usize).into(),
                    ))
                    .await?;
                Ok(())
            }
            Err(e) => {
                self.block.lock().expect("lock").failed();
                Err(user_error(e))
            }
        }
    }

    async fn on_copy_fail<C>(&self, _client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // Dropping the COPY stops its writer before any commit.
        drop(self.copy_in.lock().expect("lock").take());
        self.block.lock().expect("lock").failed();
        user_error(error_info(
            code::QUERY_CANCELED,
            format!("COPY from stdin failed: {}", fail.message),
        ))
    }
}

/// Never used: [`Connection`] handles Parse itself (it keeps the client's raw type OIDs,
/// which pgwire's parser interface turns into `Option<Type>` and loses for `vector`).
pub struct NoParser;

#[async_trait]
impl QueryParser for NoParser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Prepared>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        Ok(Prepared::new(sql))
    }

    fn get_parameter_types(&self, _stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(vec![])
    }

    fn get_result_schema(
        &self,
        _stmt: &Prepared,
        _format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(vec![])
    }
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = Prepared;
    type QueryParser = NoParser;

    fn query_parser(&self) -> Arc<NoParser> {
        Arc::new(NoParser)
    }

    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let count = params::parameter_count(&message.query);
        if count > u16::MAX as usize {
            return Err(user_error(error_info(
                code::PROTOCOL_VIOLATION,
                "too many parameters",
            )));
        }
        let mut parameter_types: Vec<Option<Type>> = message
            .type_oids
            .iter()
            .map(|oid| type_of_oid(*oid))
            .collect();
        parameter_types.resize(parameter_types.len().max(count), None);
        let name = message
            .name
            .clone()
            .unwrap_or_else(|| DEFAULT_NAME.to_owned());
        let statement = StoredStatement::new(name, Prepared::new(&message.query), parameter_types);
        client.portal_store().put_statement(Arc::new(statement));
        client
            .feed(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    // Bind and Describe answer with `feed`, not pgwire's default `send`: the answers of a
    // Parse / Bind / Describe / Execute / Sync batch then leave in the one write Sync
    // flushes, instead of one `sendto` (and one client wake-up) per message.
    async fn on_bind<C>(&self, client: &mut C, message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
        let Some(statement) = client.portal_store().get_statement(name) else {
            return Err(PgWireError::StatementNotFound(name.to_owned()));
        };
        let portal = Portal::try_new(&message, statement)?;
        client.portal_store().put_portal(Arc::new(portal));
        client
            .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
            .await?;
        Ok(())
    }

    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        match message.target_type {
            TARGET_TYPE_BYTE_STATEMENT => {
                let Some(statement) = client.portal_store().get_statement(name) else {
                    return Err(PgWireError::StatementNotFound(name.to_owned()));
                };
                let described = self.do_describe_statement(client, &statement).await?;
                feed_described(client, &described).await
            }
            TARGET_TYPE_BYTE_PORTAL => {
                let Some(portal) = client.portal_store().get_portal(name) else {
                    return Err(PgWireError::PortalNotFound(name.to_owned()));
                };
                let described = self.do_describe_portal(client, &portal).await?;
                feed_described(client, &described).await
            }
            other => Err(PgWireError::InvalidTargetType(other)),
        }
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<Prepared>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.session().await?;
        let (inferred, schema) = describe_unbound(session, &target.statement.sql)
            .await
            .map_err(user_error)?;
        let types: Vec<Type> = target
            .parameter_types
            .iter()
            .enumerate()
            .map(|(i, given)| {
                given
                    .clone()
                    .filter(|t| *t != Type::UNKNOWN)
                    .or_else(|| inferred.get(i).cloned().flatten())
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        *target.statement.described.lock().expect("lock") = types.clone();
        let no_rows = schema.as_ref().is_none_or(|s| s.fields().is_empty());
        target
            .statement
            .described_no_rows
            .store(no_rows, std::sync::atomic::Ordering::Relaxed);
        Ok(match schema {
            Some(s) if !s.fields().is_empty() => {
                DescribeStatementResponse::new(types, types::fields(&s, |_| false))
            }
            _ => {
                let mut r = DescribeStatementResponse::no_data();
                r.parameters = types;
                r
            }
        })
    }

    async fn do_describe_portal<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // The statement runs here, where pgwire does not watch for a cancel request: this
        // does (Execute, which pgwire watches, then only sends what ran).
        let cancel = match client.session_extensions().get::<Arc<ConnectionHandle>>() {
            Some(handle) => CancelSignal::new(handle.start_query().await),
            None => CancelSignal::never(),
        };
        let mut outputs = self.run_portal(portal, cancel).await?;
        let described = match outputs.first() {
            Some(Ok(Output::Rows(r))) => {
                let binary = |i| portal.result_column_format.format_for(i) == FieldFormat::Binary;
                DescribePortalResponse::new(types::fields(&r.schema, binary))
            }
            Some(Ok(Output::Stream(rows))) => {
                let binary = |i| portal.result_column_format.format_for(i) == FieldFormat::Binary;
                DescribePortalResponse::new(types::fields(&rows.0.schema(), binary))
            }
            Some(Err(_)) => {
                let Err(e) = outputs.remove(0) else {
                    unreachable!()
                };
                return Err(user_error(e));
            }
            _ => DescribePortalResponse::no_data(),
        };
        self.described
            .lock()
            .expect("lock")
            .insert(portal_key(portal), outputs);
        Ok(described)
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let kept = self
            .described
            .lock()
            .expect("lock")
            .remove(&portal_key(portal));
        let mut outputs = match kept {
            Some(o) => o,
            None => {
                // pgwire races Execute against the connection's cancel request itself.
                let mut outputs = self.run_portal(portal, CancelSignal::never()).await?;
                if portal
                    .statement
                    .statement
                    .described_no_rows
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    for out in &mut outputs {
                        let n = match std::mem::replace(out, Ok(Output::Command(String::new()))) {
                            Ok(Output::Rows(r)) => Ok(r.num_rows()),
                            Ok(Output::Stream(rows)) => respond::count_rows(rows).await,
                            other => {
                                *out = other;
                                continue;
                            }
                        };
                        *out = n.map(|n| Output::Command(format!("SELECT {n}")));
                    }
                }
                outputs
            }
        };
        if outputs.len() > 1 {
            return Err(user_error(error_info(
                code::SYNTAX_ERROR,
                "cannot insert multiple commands into a prepared statement",
            )));
        }
        respond::send_warnings(client, &mut outputs).await?;
        let binary = |i| portal.result_column_format.format_for(i) == FieldFormat::Binary;
        match outputs.pop() {
            Some(Err(e)) => Err(user_error(e)),
            // Execute with a row limit (asyncpg's cursors, JDBC's fetch size): pgwire keeps
            // the rows in the portal and sends `max_rows` per Execute, then PortalSuspended.
            Some(Ok(Output::Stream(rows))) if max_rows > 0 => {
                let to = self.destination();
                let cancel = client
                    .session_extensions()
                    .get::<Arc<ConnectionHandle>>()
                    .map(|h| (*h).clone());
                Ok(Response::Query(respond::portal_rows(
                    rows,
                    &binary,
                    self.block.clone(),
                    to.timeout,
                    cancel,
                )))
            }
            Some(out) => respond::respond(client, out, &binary, false, &self.destination()).await,
            None => Ok(Response::EmptyQuery),
        }
    }
}

/// pgwire's `send_describe_response`, fed rather than flushed (see `on_bind`).
async fn feed_described<C, D>(client: &mut C, described: &D) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    D: DescribeResponse,
{
    if let Some(parameters) = described.parameters() {
        let oids = parameters.iter().map(|t| t.oid()).collect();
        client
            .feed(PgWireBackendMessage::ParameterDescription(
                ParameterDescription::new(oids),
            ))
            .await?;
    }
    let message = if described.is_no_data() {
        PgWireBackendMessage::NoData(NoData::new())
    } else {
        let fields = described.fields().iter().map(Into::into).collect();
        PgWireBackendMessage::RowDescription(RowDescription::new(fields))
    };
    client.feed(message).await?;
    Ok(())
}

/// The parameter types (where the statement tells them) and the result schema (for a query
/// that plans with its parameters open) of a statement before any values are bound.
async fn describe_unbound(
    session: &FragvecSession,
    sql: &str,
) -> Result<(Vec<Option<Type>>, Option<Arc<Schema>>), ErrorInfo> {
    // A PostgreSQL setting's SHOW answers one text column named after it (`Runner::special`).
    if let Some(super::settings::SettingStatement::Show(name)) = super::settings::parse(sql)
        && name != "all"
    {
        return Ok((vec![], Some(super::settings::show_schema(&name))));
    }
    let unbound = describe::describe_unbound(session, sql, describe::Endpoint::Postgres)
        .await
        .map_err(|e| df_error(&e))?;
    let types = unbound
        .parameters
        .iter()
        .map(|p| match p {
            ParameterType::Unknown => None,
            ParameterType::Vector => Some(types::vector_type()),
            ParameterType::Arrow(dt) => Some(types::pg_type(dt)),
        })
        .collect();
    Ok((types, unbound.schema))
}

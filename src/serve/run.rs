//! Running SQL text for one connection: what the simple query protocol's Query and the
//! extended protocol's Execute both come down to, once parameters are spliced in.
//!
//! Each statement goes through the connection's own [`FragvecSession`] (fragvec's front end,
//! as in the CLI), except what only a PostgreSQL server has: transaction control
//! ([`super::transaction`]) and PostgreSQL's session settings ([`super::settings`]). Catalog
//! queries are rewritten first ([`super::pg_catalog`]).

use std::time::Duration;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ObjectType, Statement};
use futures::channel::oneshot;
use pgwire::error::ErrorInfo;

use super::bound_insert::{InsertShape, Value as InsertValue};
use super::copy_in::CopyIn;
use super::copy_out::CopyOut;
use super::copy_statement::{self, Copy};
use super::files::AllowedFiles;
use super::pg_catalog;
use super::settings::{self, SettingStatement, Settings};
use super::sqlstate::code;
use super::transaction::{Block, Control};
use crate::FragvecSession;
use crate::engine::Streamed;
use crate::engine::session::StatementResult;
use crate::sql::FragvecStatement;
use datafusion::execution::SendableRecordBatchStream;

/// What one statement gave the client.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per statement, moved a few times: not worth a box
pub enum Output {
    /// Rows (a query, EXPLAIN, SHOW, or a fragvec statement's one-row report).
    Rows(StatementResult),
    /// A query's rows, produced as the connection sends them.
    Stream(QueryRows),
    /// A statement without rows, with its command tag (`INSERT 0 3`, `CREATE TABLE`).
    Command(String),
    /// A `COPY ... FROM STDIN` waiting for its data (the connection keeps it until CopyDone).
    CopyIn(Box<CopyIn>),
    /// A `COPY ... TO STDOUT` whose query has started: the connection sends its rows.
    CopyOut(Box<CopyOut>),
    /// A transaction-control statement: its tag, whether it opened or closed a block, and a
    /// warning to send before it.
    Control {
        /// `BEGIN`, `COMMIT`, ...
        tag: &'static str,
        /// `Some(true)` when it opened a block, `Some(false)` when it closed one.
        opened: Option<bool>,
        /// A warning (BEGIN in a block, COMMIT outside one).
        warning: Option<ErrorInfo>,
    },
}

pub use super::sqlstate::{df_error, error_info};

/// A query's rows as they are produced: polled only as fast as the client takes them, and
/// dropping it stops the query.
pub struct QueryRows(pub SendableRecordBatchStream);

impl std::fmt::Debug for QueryRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("QueryRows").field(&self.0.schema()).finish()
    }
}

/// The connection state statements run against.
pub struct Runner<'a> {
    /// The connection's session.
    pub session: &'a FragvecSession,
    /// The connection's transaction block.
    pub block: &'a std::sync::Mutex<Block>,
    /// The connection's PostgreSQL settings (`statement_timeout`, ...).
    pub settings: &'a std::sync::Mutex<Settings>,
    /// Where the statements may read and write files.
    pub allow_files: &'a AllowedFiles,
    /// Fires when the client's cancel request arrives (held across the statement's await).
    pub cancel: tokio::sync::Mutex<CancelSignal>,
}

/// The cancel request of one Query or Execute: pgwire's connection handle fires it when a
/// CancelRequest with the connection's pid and secret key arrives.
pub struct CancelSignal {
    receiver: Option<oneshot::Receiver<()>>,
    fired: bool,
}

impl CancelSignal {
    /// The signal `receiver` gets when the cancel request arrives.
    pub fn new(receiver: oneshot::Receiver<()>) -> Self {
        Self {
            receiver: Some(receiver),
            fired: false,
        }
    }

    /// A signal that never fires (a connection nobody can cancel).
    pub fn never() -> Self {
        Self {
            receiver: None,
            fired: false,
        }
    }

    /// Resolves when the cancel request has arrived (at once, once it has); never, if none
    /// will.
    pub async fn fired(&mut self) {
        if self.fired {
            return;
        }
        if let Some(receiver) = self.receiver.as_mut() {
            // An error means the sender was dropped without a request: nothing will come.
            if receiver.await.is_ok() {
                self.fired = true;
                return;
            }
            self.receiver = None;
        }
        std::future::pending::<()>().await
    }
}

impl Runner<'_> {
    /// Runs every statement of `sql`, in order, stopping at the first error (which ends the
    /// list).
    pub async fn run(&self, sql: &str) -> Vec<Result<Output, ErrorInfo>> {
        // Control and PostgreSQL settings first: some never parse as DataFusion SQL
        // (`SET TIME ZONE LOCAL`, `DISCARD ALL`), and they need no session.
        match copy_statement::parse(sql) {
            Some(Ok(Copy::FromStdin(copy))) => return vec![self.start_copy(Ok(copy)).await],
            Some(Ok(Copy::ToStdout(copy))) => return vec![self.start_copy_out(copy).await],
            // Refused, after the block's own refusal if it has one.
            Some(Err(e)) => return vec![self.start_copy(Err(e)).await],
            None => {}
        }
        if let Some(out) = self.special(sql) {
            return vec![out];
        }
        // A KNN text whose shape ran before: its kept plan answers without a parse.
        if let Some(out) = self.known_shape(sql).await {
            return vec![out];
        }
        let statements = match self.session.parse(sql) {
            Ok(s) => s,
            Err(e) => {
                self.block.lock().expect("lock").failed();
                return vec![Err(df_error(&e))];
            }
        };
        // One statement was checked whole above; several are checked one by one.
        let several = statements.len() > 1;
        let mut outputs = Vec::with_capacity(statements.len());
        for statement in statements {
            let out = match &statement {
                FragvecStatement::DataFusion(s) if several => match self.special(&s.to_string()) {
                    Some(out) => out,
                    None => self.execute(sql, statement, false).await,
                },
                _ => self.execute(sql, statement, !several).await,
            };
            let failed = out.is_err();
            outputs.push(out);
            if failed {
                break;
            }
        }
        outputs
    }

    /// A transaction-control statement or a PostgreSQL setting, if `sql` is one.
    fn special(&self, sql: &str) -> Option<Result<Output, ErrorInfo>> {
        if let Some(control) = Control::of(sql) {
            let mut block = self.block.lock().expect("lock");
            let was_open = block.is_open();
            let result = block.apply(&control);
            let now_open = block.is_open();
            return Some(match result {
                Ok(done) => Ok(Output::Control {
                    tag: done.tag,
                    opened: (was_open != now_open).then_some(now_open),
                    warning: done
                        .warning
                        .map(|(state, m)| ErrorInfo::new("WARNING".into(), state.into(), m)),
                }),
                Err(refused) => Err(error_info(refused.sqlstate, refused.message)),
            });
        }
        let lower = sql.trim_start().to_ascii_lowercase();
        if lower.starts_with("copy") && (lower.contains("stdin") || lower.contains("stdout")) {
            return Some(Err(error_info(
                code::FEATURE_NOT_SUPPORTED,
                "fragvec serve runs COPY FROM STDIN and COPY TO STDOUT alone in their query \
                 string",
            )));
        }
        let setting = settings::parse(sql)?;
        if let Err(e) = self.block.lock().expect("lock").admit()
            && !matches!(setting, SettingStatement::Deallocate(_))
        {
            return Some(Err(error_info(e.sqlstate, e.message)));
        }
        let mut settings = self.settings.lock().expect("lock");
        Some(match setting {
            SettingStatement::Set(name, value) => settings
                .set(&name, value)
                .map(|()| Output::Command("SET".into()))
                .map_err(|m| error_info(code::INVALID_PARAMETER_VALUE, m)),
            SettingStatement::Show(name) => settings
                .show(&name)
                .map(Output::Rows)
                .map_err(|m| error_info(code::UNDEFINED_OBJECT, m)),
            SettingStatement::Discard => {
                settings.reset_all();
                Ok(Output::Command("DISCARD ALL".into()))
            }
            SettingStatement::Deallocate(tag) => Ok(Output::Command(tag.into())),
        })
    }

    /// Runs one statement through the session, under the statement timeout. `alone`: the
    /// statement is all of `sql`.
    async fn execute(
        &self,
        sql: &str,
        mut statement: FragvecStatement,
        alone: bool,
    ) -> Result<Output, ErrorInfo> {
        if let Err(e) = self.block.lock().expect("lock").admit() {
            return Err(error_info(e.sqlstate, e.message));
        }
        if let Err(e) = self.allow_files.check(&statement) {
            self.block.lock().expect("lock").failed();
            return Err(error_info(code::INSUFFICIENT_PRIVILEGE, e));
        }
        let kind = Kind::of(&statement);
        // What a refused ROLLBACK will list: only a write inside a block needs it.
        let text = (kind.writes() && self.block.lock().expect("lock").is_open())
            .then(|| describe(&statement));
        // A query alone in its text streams its rows to the client; one of several is
        // collected, so that the next statement runs after it has finished.
        // Each path's future is large (the whole planner's state machine): boxed, so that
        // one statement does not need them all on the task's stack at once.
        let outcome = async {
            let session = self.session;
            if pg_catalog::prepare(session, sql, &mut statement).await? {
                match alone {
                    true => Box::pin(session.execute_streaming(statement))
                        .await
                        .map(Some),
                    false => done(Box::pin(session.execute(statement)).await),
                }
            } else if !alone {
                done(Box::pin(session.execute(statement)).await)
            } else {
                // The text is the statement: its shape may answer the next text like it.
                let streamed = Box::pin(session.execute_text_streaming(sql, statement)).await;
                streamed.map(Some)
            }
        };
        self.guarded(kind, text, outcome)
            .await
            .expect("a statement always answers")
    }

    /// Starts a `COPY ... FROM STDIN`: a write, admitted as one into a transaction block.
    async fn start_copy(
        &self,
        copy: Result<copy_statement::CopyStatement, super::copy_format::CopyError>,
    ) -> Result<Output, ErrorInfo> {
        if let Err(e) = self.block.lock().expect("lock").admit() {
            return Err(error_info(e.sqlstate, e.message));
        }
        let started = match copy {
            Ok(statement) => CopyIn::start(self.session, statement).await,
            Err(e) => Err(e.into()),
        };
        match started {
            Ok(copy) => Ok(Output::CopyIn(Box::new(copy))),
            Err(e) => {
                self.block.lock().expect("lock").failed();
                Err(e)
            }
        }
    }

    /// Starts a `COPY ... TO STDOUT`: a read, whose query starts here and whose rows the
    /// connection sends.
    async fn start_copy_out(
        &self,
        copy: copy_statement::CopyOutStatement,
    ) -> Result<Output, ErrorInfo> {
        if let Err(e) = self.block.lock().expect("lock").admit() {
            return Err(error_info(e.sqlstate, e.message));
        }
        match CopyOut::start(self.session, copy).await {
            Ok(copy) => Ok(Output::CopyOut(Box::new(copy))),
            Err(e) => {
                self.block.lock().expect("lock").failed();
                Err(e)
            }
        }
    }

    /// A prepared INSERT of bound values appended without SQL text
    /// ([`super::bound_insert`]); `None` when it must take the general path (which then
    /// gives what the spliced statement gives, errors included).
    pub async fn bound_insert(
        &self,
        sql: &str,
        shape: &InsertShape,
        values: &[InsertValue],
    ) -> Option<Result<Output, ErrorInfo>> {
        if self.block.lock().expect("lock").admit().is_err() {
            return None; // the full path reports it
        }
        let Ok(Some(target)) = self.session.append_target(&shape.table).await else {
            return None;
        };
        let defaults = target.defaults();
        let batch = match super::bound_insert::batch(shape, target.schema(), &defaults, values) {
            Ok(Some(batch)) => batch,
            Ok(None) => return None,
            Err(message) => {
                self.block.lock().expect("lock").failed();
                return Some(Err(error_info(code::DATA_EXCEPTION, message)));
            }
        };
        let text = self
            .block
            .lock()
            .expect("lock")
            .is_open()
            .then(|| sql.to_string());
        let session = self.session;
        let append = async move {
            let appended = session.append_batch(&target, batch).await;
            appended.map(|r| Some(Streamed::Done(r)))
        };
        self.guarded(Kind::Insert, text, append).await
    }

    /// `sql` answered by the kept plan of its shape (a repeated KNN query with another
    /// vector), without parsing it; `None` when it must take the full path.
    async fn known_shape(&self, sql: &str) -> Option<Result<Output, ErrorInfo>> {
        if self.block.lock().expect("lock").admit().is_err() {
            return None; // the full path reports it
        }
        self.guarded(
            Kind::Query,
            None,
            self.session.run_known_shape_streaming(sql),
        )
        .await
    }

    /// `Self::known_shape` for a statement already in its shape (a prepared KNN query
    /// with its vector decoded, [`super::params::bound_shape`]).
    pub async fn known_shape_of(
        &self,
        shape: &crate::sql::vector_shape::Shape,
    ) -> Option<Result<Output, ErrorInfo>> {
        if self.block.lock().expect("lock").admit().is_err() {
            return None; // the full path reports it
        }
        let answered = Box::pin(self.session.run_shape_streaming(shape));
        self.guarded(Kind::Query, None, answered).await
    }

    /// Runs `outcome` under the statement timeout and the cancel request, and keeps the
    /// transaction block's account. `None` (only from `outcome`) means not answered.
    async fn guarded(
        &self,
        kind: Kind,
        text: Option<String>,
        outcome: impl Future<Output = datafusion::common::Result<Option<Streamed>>>,
    ) -> Option<Result<Output, ErrorInfo>> {
        // A statement stopped by dropping this future (pgwire's cancel of a Query or
        // Execute) fails the block as an error would.
        let mut unfinished = FailBlockIfDropped {
            block: self.block,
            armed: true,
        };
        let timeout = self.settings.lock().expect("lock").statement_timeout();
        let limited = async {
            match timeout {
                Some(limit) if limit > Duration::ZERO => {
                    match tokio::time::timeout(limit, outcome).await {
                        Ok(r) => r.map_err(|e| df_error(&e)),
                        Err(_) => Err(error_info(
                            code::QUERY_CANCELED,
                            "canceling statement due to statement timeout",
                        )),
                    }
                }
                _ => outcome.await.map_err(|e| df_error(&e)),
            }
        };
        // Dropping the statement's future on cancel drops its streams, which stops its work.
        let mut cancel = self.cancel.lock().await;
        let result = tokio::select! {
            r = limited => r,
            _ = cancel.fired() => Err(error_info(
                code::QUERY_CANCELED,
                "canceling statement due to user request",
            )),
        };
        drop(cancel);
        unfinished.armed = false;
        let mut block = self.block.lock().expect("lock");
        match result {
            Ok(None) => None,
            Ok(Some(result)) => {
                if let Some(text) = text {
                    block.ran(&text, true);
                }
                Some(Ok(match result {
                    Streamed::Done(result) => kind.output(result),
                    Streamed::Rows(rows) => Output::Stream(QueryRows(rows)),
                }))
            }
            Err(e) => {
                block.failed();
                Some(Err(e))
            }
        }
    }
}

/// A statement run to its end, as [`Runner::guarded`] takes it.
fn done(
    result: datafusion::common::Result<StatementResult>,
) -> datafusion::common::Result<Option<Streamed>> {
    result.map(|r| Some(Streamed::Done(r)))
}

/// Marks the transaction block failed when dropped armed: a statement whose future was
/// dropped before it finished.
pub struct FailBlockIfDropped<'a> {
    /// The block to fail.
    pub block: &'a std::sync::Mutex<Block>,
    /// Whether the statement is still unfinished (disarm it when it finishes).
    pub armed: bool,
}

impl Drop for FailBlockIfDropped<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Ok(mut block) = self.block.lock()
        {
            block.failed();
        }
    }
}

/// A statement's text for the list a refused ROLLBACK gives.
fn describe(statement: &FragvecStatement) -> String {
    match statement {
        FragvecStatement::DataFusion(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}

/// What kind of statement ran: its command tag, and whether it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A query: its rows go to the client.
    Query,
    /// `INSERT 0 n`.
    Insert,
    /// `UPDATE n`.
    Update,
    /// `DELETE n`.
    Delete,
    /// `MERGE n`.
    Merge,
    /// `CREATE TABLE ... AS`: `SELECT n`.
    CreateTableAs,
    /// A statement whose command tag is fixed (`CREATE TABLE`, `SET`, ...), and whether it
    /// writes.
    Other(String, bool),
}

impl Kind {
    /// The kind of `statement`.
    pub fn of(statement: &FragvecStatement) -> Kind {
        let s = match statement {
            FragvecStatement::DataFusion(s) => s.as_ref(),
            FragvecStatement::CreateVectorIndex { .. } => {
                return Kind::Other("CREATE INDEX".into(), true);
            }
            FragvecStatement::DropIndex { .. } => return Kind::Other("DROP INDEX".into(), true),
            FragvecStatement::OptimizeIndex { .. } => {
                return Kind::Other("OPTIMIZE INDEX".into(), true);
            }
            FragvecStatement::Compact { .. } => return Kind::Other("COMPACT".into(), true),
            FragvecStatement::Recluster { .. } => return Kind::Other("RECLUSTER".into(), true),
            FragvecStatement::Vacuum { .. } => return Kind::Other("VACUUM".into(), true),
            FragvecStatement::AlterTableProperties { .. } => {
                return Kind::Other("ALTER TABLE".into(), true);
            }
            FragvecStatement::Maintain { .. } => return Kind::Other("MAINTAIN".into(), true),
        };
        let statement = match s {
            DFStatement::Statement(s) => s.as_ref(),
            DFStatement::Explain(_) => return Kind::Query,
            DFStatement::CreateExternalTable(_) => return Kind::Other("CREATE TABLE".into(), true),
            DFStatement::CopyTo(_) => return Kind::Other("COPY".into(), true),
            _ => return Kind::Other(first_words(&s.to_string(), 1), true),
        };
        match statement {
            Statement::Query(_) => Kind::Query,
            Statement::Insert(_) => Kind::Insert,
            Statement::Update(_) => Kind::Update,
            Statement::Delete(_) => Kind::Delete,
            Statement::Merge(_) => Kind::Merge,
            Statement::CreateTable(c) if c.query.is_some() => Kind::CreateTableAs,
            Statement::CreateTable(_) => Kind::Other("CREATE TABLE".into(), true),
            Statement::CreateView(_) => Kind::Other("CREATE VIEW".into(), true),
            Statement::Drop { object_type, .. } => Kind::Other(
                match object_type {
                    ObjectType::View => "DROP VIEW",
                    ObjectType::Index => "DROP INDEX",
                    ObjectType::Schema => "DROP SCHEMA",
                    _ => "DROP TABLE",
                }
                .into(),
                true,
            ),
            Statement::AlterTable(_) => Kind::Other("ALTER TABLE".into(), true),
            Statement::Set(_) => Kind::Other("SET".into(), false),
            Statement::ShowVariable { .. }
            | Statement::ShowTables { .. }
            | Statement::ShowColumns { .. } => Kind::Query,
            other => Kind::Other(first_words(&other.to_string(), 2), true),
        }
    }

    fn writes(&self) -> bool {
        match self {
            Kind::Query => false,
            Kind::Other(_, writes) => *writes,
            _ => true,
        }
    }

    /// The client's view of `result`: rows, or a command tag with its row count.
    fn output(&self, result: StatementResult) -> Output {
        let n = result.rows_affected;
        let tag = |t: &str| match n {
            Some(n) => format!("{t} {n}"),
            None => t.to_string(),
        };
        match self {
            Kind::Insert => Output::Command(format!("INSERT 0 {}", n.unwrap_or(0))),
            Kind::Update => Output::Command(tag("UPDATE")),
            Kind::Delete => Output::Command(tag("DELETE")),
            Kind::Merge => Output::Command(tag("MERGE")),
            Kind::CreateTableAs => Output::Command(tag("SELECT")),
            Kind::Query => Output::Rows(result),
            Kind::Other(t, _) => {
                if result.schema.fields().is_empty() {
                    Output::Command(tag(t))
                } else {
                    Output::Rows(result)
                }
            }
        }
    }
}

/// The first `n` words of `text`, upper-cased (a command tag).
fn first_words(text: &str, n: usize) -> String {
    text.split_whitespace()
        .take(n)
        .collect::<Vec<_>>()
        .join(" ")
        .to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::params;
    use crate::serve::types;
    use pgwire::api::results::FieldFormat;

    /// A KNN query whose vector is bound as a parameter runs on the kept plan of its shape
    /// from the second execution on (no parse), with the right answers.
    #[tokio::test]
    async fn a_bound_vector_reuses_the_statement_shape() {
        let session = FragvecSession::open("memory://serve-run-shapes")
            .await
            .unwrap();
        session
            .sql(
                "CREATE TABLE items (id BIGINT, emb VECTOR(8)); \
                  INSERT INTO items VALUES (1, [1,0,0,0,0,0,0,0]), (2, [0,1,0,0,0,0,0,0]), \
                  (3, [0,0,1,0,0,0,0,0]), (4, [0.5,0.5,0,0,0,0,0,0]); \
                  CREATE VECTOR INDEX ix ON items (emb) USING IVF_FLAT WITH (num_partitions = 2)",
            )
            .await
            .unwrap();
        let block = std::sync::Mutex::new(Block::default());
        let settings = std::sync::Mutex::new(Settings::new(0, "test"));
        let allow = AllowedFiles::none();
        let runner = Runner {
            session: &session,
            block: &block,
            settings: &settings,
            allow_files: &allow,
            cancel: tokio::sync::Mutex::new(CancelSignal::never()),
        };
        let sql = "SELECT id FROM items ORDER BY emb <-> $1 LIMIT 2";
        let mut answers = Vec::new();
        for (i, q) in [
            "[0.9,0.1,0,0,0,0,0,0]",
            "[0,0.2,0.9,0,0,0,0,0]",
            "[0.4,0.6,0,0,0,0,0,0]",
        ]
        .into_iter()
        .enumerate()
        {
            let lit = params::literal(&types::vector_type(), FieldFormat::Text, Some(q.as_bytes()))
                .unwrap();
            let bound = params::substitute(sql, &[lit]).unwrap();
            // The last vector comes decoded, as a prepared statement's parameter does: its
            // shape answers without a text.
            let out = if i == 2 {
                let v = crate::sql::vector_syntax::parse_vector_text(q).unwrap();
                let v = params::Bound::Vector(v.into_iter().map(|x| x as f32).collect());
                let shape = params::bound_shape(sql, &[v]).unwrap();
                runner
                    .known_shape_of(&shape)
                    .await
                    .expect("the kept plan answers")
            } else {
                runner.run(&bound).await.remove(0)
            };
            let Ok(Output::Stream(rows)) = out else {
                panic!("no rows for {bound}");
            };
            let batches = datafusion::physical_plan::common::collect(rows.0)
                .await
                .unwrap();
            let ids = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string();
            answers.push(ids);
        }
        assert_eq!(session.shapes_reused(), 2, "{answers:?}");
        for (answer, want) in answers.iter().zip([["1", "4"], ["3", "4"], ["4", "2"]]) {
            let got: Vec<&str> = answer
                .lines()
                .filter_map(|l| l.strip_prefix("| "))
                .map(|l| l.trim_end_matches(" |").trim())
                .filter(|l| *l != "id")
                .collect();
            assert_eq!(got, want, "{answer}");
        }
    }
}

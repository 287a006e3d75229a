//! Queries whose rows stream to the caller instead of being collected: what a server that
//! sends a 10M-row result needs (Flight SQL's DoGet), with no second query path.
//!
//! A query runs down the same routing as [`FragvecSession::execute`]; at the one point where
//! its physical plan would be collected (`query::collect_physical` and the query branch of
//! `query::execute_plan`), the plan is executed instead and its stream handed over through a
//! slot this module sets for the duration of the statement (a task-local, so the routing
//! between keeps its signatures). Only a plain query (`SELECT`, `WITH`, `VALUES`, and the
//! known-shape path of a repeated KNN text) is streamed: anything that writes must finish
//! before the statement reports, so it is collected as before.

use std::sync::Mutex;

use datafusion::common::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement;

use crate::engine::session::{FragvecSession, StatementResult};
use crate::sql::FragvecStatement;

/// What a statement run by [`FragvecSession::execute_streaming`] gives.
pub enum Streamed {
    /// A query's rows, produced as the stream is polled (dropping it stops the query).
    Rows(SendableRecordBatchStream),
    /// Any other statement, run to its end.
    Done(StatementResult),
}

tokio::task_local! {
    /// Set while a streamed statement runs: where its query stream goes.
    static SLOT: Mutex<Option<SendableRecordBatchStream>>;
}

/// Whether the running statement wants its rows as a stream (and no stream was handed over
/// yet): the collecting functions ask this before they collect.
pub(super) fn wanted() -> bool {
    SLOT.try_with(|slot| slot.lock().expect("lock").is_none())
        .unwrap_or(false)
}

/// Hands `stream` over to the streamed statement. Only after [`wanted`] said yes.
pub(super) fn hand_over(stream: SendableRecordBatchStream) {
    let _ = SLOT.try_with(|slot| *slot.lock().expect("lock") = Some(stream));
}

/// Whether `statement` is a plain query, whose rows may stream.
pub fn is_plain_query(statement: &FragvecStatement) -> bool {
    matches!(statement, FragvecStatement::DataFusion(s)
        if matches!(s.as_ref(), DFStatement::Statement(q) if matches!(q.as_ref(), Statement::Query(_))))
}

impl FragvecSession {
    /// Runs one statement like [`Self::execute`]; a plain query's rows come as a stream,
    /// produced while the caller reads them, never collected whole.
    pub async fn execute_streaming(&self, statement: FragvecStatement) -> Result<Streamed> {
        if !is_plain_query(&statement) {
            return self.execute(statement).await.map(Streamed::Done);
        }
        let (result, stream) = with_slot(self.execute(statement)).await?;
        Ok(streamed(result, stream))
    }

    /// [`Self::execute_text`], streaming a plain query's rows.
    pub async fn execute_text_streaming(
        &self,
        sql: &str,
        statement: FragvecStatement,
    ) -> Result<Streamed> {
        if !is_plain_query(&statement) {
            return self.execute_text(sql, statement).await.map(Streamed::Done);
        }
        let (result, stream) = with_slot(self.execute_text(sql, statement)).await?;
        Ok(streamed(result, stream))
    }

    /// [`Self::run_known_shape`], streaming the rows of the query it answers; `None` when
    /// `sql` is not a known shape (nothing ran).
    pub async fn run_known_shape_streaming(&self, sql: &str) -> Result<Option<Streamed>> {
        let (result, stream) = with_slot(self.run_known_shape(sql)).await?;
        Ok(result.map(|r| streamed(r, stream)))
    }

    /// [`Self::run_known_shape_streaming`] for a text already masked into its shape (a
    /// statement with its vector parameters, see [`crate::sql::vector_shape::shape_with_lists`]).
    pub async fn run_shape_streaming(
        &self,
        shape: &crate::sql::vector_shape::Shape,
    ) -> Result<Option<Streamed>> {
        let (result, stream) = with_slot(self.run_shape(shape)).await?;
        Ok(result.map(|r| streamed(r, stream)))
    }
}

fn streamed(result: StatementResult, stream: Option<SendableRecordBatchStream>) -> Streamed {
    match stream {
        Some(stream) => Streamed::Rows(stream),
        None => Streamed::Done(result),
    }
}

/// Runs `run` with the stream slot set; gives its result and the stream it handed over.
async fn with_slot<T>(
    run: impl Future<Output = Result<T>>,
) -> Result<(T, Option<SendableRecordBatchStream>)> {
    SLOT.scope(Mutex::new(None), async {
        let result = run.await?;
        let stream = SLOT.with(|slot| slot.lock().expect("lock").take());
        Ok((result, stream))
    })
    .await
}

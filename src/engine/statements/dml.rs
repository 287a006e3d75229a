//! DELETE, UPDATE and MERGE on fragvec tables, run as finder queries.
//!
//! A statement becomes a query (its *finder*, see [`crate::sql::finder`]) over the target
//! table pinned at its latest version, with virtual columns; its rows say which target rows
//! change and how. [`collect_changes`] gathers them and the format layer commits one transaction. When a
//! concurrent writer made the commit impossible, the whole statement runs again from a fresh
//! snapshot (at most `fragvec.commit_retries` times). Statements whose target is a session
//! table are left to DataFusion (`None`).

use datafusion::common::{Result, not_impl_err};
use datafusion::dataframe::DataFrame;
use datafusion::sql::sqlparser::ast::{Delete, Merge, Statement, Update};

use super::query;
use crate::engine::catalog::RelationName;
use crate::engine::dml::collect_changes;
use crate::engine::session::{FragvecSession, StatementResult};
use crate::format::types;
use crate::format::{Operation, Snapshot};
use crate::sql::finder::{self, DmlTarget, Finder, TargetColumn};
use crate::sql::pin;

/// A DML statement, matched once.
#[derive(Debug, Clone, Copy)]
pub enum Dml<'a> {
    /// `DELETE`.
    Delete(&'a Delete),
    /// `UPDATE`.
    Update(&'a Update),
    /// `MERGE`.
    Merge(&'a Merge),
}

impl<'a> Dml<'a> {
    /// The DML statement `statement` is, if it is one.
    pub fn of(statement: &'a Statement) -> Option<Self> {
        match statement {
            Statement::Delete(d) => Some(Dml::Delete(d)),
            Statement::Update(u) => Some(Dml::Update(u)),
            Statement::Merge(m) => Some(Dml::Merge(m)),
            _ => None,
        }
    }

    fn target(self) -> Result<DmlTarget> {
        match self {
            Dml::Delete(d) => finder::delete_target(d),
            Dml::Update(u) => finder::update_target(u),
            Dml::Merge(m) => finder::merge_target(m),
        }
    }
}

/// Runs DELETE / UPDATE / MERGE on a fragvec table, retrying from a fresh snapshot when a
/// concurrent writer made the commit impossible. `None` when the target is a session table.
pub async fn run(session: &FragvecSession, dml: Dml<'_>) -> Result<Option<StatementResult>> {
    let mode = session.options().update_mode;
    session
        .retrying(|| async move {
            let Some((finder, snapshot, op)) = finder_of(session, dml).await? else {
                return Ok(None);
            };
            let query = finder_frame(session, &finder.sql).await?;
            let changes = collect_changes(
                query.execute_stream().await?,
                &snapshot.schema,
                finder.default_action,
            )
            .await?;
            let n = changes
                .commit(&snapshot, op, mode, &finder.assigned_columns)
                .await?;
            Ok(Some(StatementResult::count(n)?))
        })
        .await
}

/// `EXPLAIN` of a DML statement on a fragvec table: the plan of its finder query. `None`
/// when the target is a session table. `EXPLAIN ANALYZE` is refused: it would run the
/// statement.
pub async fn explain(
    session: &FragvecSession,
    dml: Dml<'_>,
    analyze: bool,
) -> Result<Option<StatementResult>> {
    if analyze {
        return not_impl_err!("EXPLAIN ANALYZE would run the DML statement; run it directly");
    }
    match finder_of(session, dml).await? {
        Some((finder, _, _)) => Ok(Some(
            query::run_sql(session, &format!("EXPLAIN {}", finder.sql)).await?,
        )),
        None => Ok(None),
    }
}

/// Resolves a DML statement's target and builds its finder at the latest version.
/// `None` when the target is not a fragvec table (DataFusion handles it).
async fn finder_of(
    session: &FragvecSession,
    dml: Dml<'_>,
) -> Result<Option<(Finder, Snapshot, Operation)>> {
    let target = dml.target()?;
    if session.schema.is_session_table(&target.table) {
        return Ok(None);
    }
    let snapshot = session.latest_snapshot(&target.table).await?;
    let relation = RelationName {
        table: target.table.clone(),
        version: Some(snapshot.version()),
        virtual_columns: true,
    }
    .encode();
    let columns: Vec<TargetColumn> = snapshot
        .schema
        .fields()
        .iter()
        .map(|f| TargetColumn {
            name: f.name().clone(),
            vector_dim: types::vector_dim(f.data_type()),
        })
        .collect();
    let (finder, op) = match dml {
        Dml::Delete(d) => (
            finder::delete_finder(d, &target, &relation)?,
            Operation::Delete,
        ),
        Dml::Update(u) => (
            finder::update_finder(u, &target, &relation, &columns)?,
            Operation::Update,
        ),
        Dml::Merge(m) => (
            finder::merge_finder(m, &target, &relation, &columns)?,
            Operation::Merge,
        ),
    };
    Ok(Some((finder, snapshot, op)))
}

/// The finder query, pinned and planned, ready to stream.
async fn finder_frame(session: &FragvecSession, sql: &str) -> Result<DataFrame> {
    let statement = query::pin(
        session,
        query::parse_query(sql)?,
        pin::mentions_virtual_columns(sql),
        query::VersionCheck::Always,
    )
    .await?;
    // The finder runs in this process, like the commit it feeds.
    let state = session.coordinator_state();
    let plan = state.statement_to_plan(statement).await?;
    Ok(DataFrame::new(state, plan))
}

/// A fragvec table's latest version, ready to take rows ([`FragvecSession::append_batch`]).
pub struct AppendTarget(Snapshot);

impl AppendTarget {
    /// The table's columns.
    pub fn schema(&self) -> &datafusion::arrow::datatypes::SchemaRef {
        &self.0.schema
    }

    /// The columns with a `DEFAULT`.
    pub fn defaults(&self) -> Vec<String> {
        let defaults = &self.0.manifest.properties.column_defaults;
        defaults.iter().map(|(c, _)| c.clone()).collect()
    }
}

/// The `DEFAULT` expressions of a table's columns, planned once for a load that leaves those
/// columns out (COPY), then evaluated for each batch of rows: a constant or `now()` gives the
/// same value to every row (`now()` is the load's start), `random()` one per row.
pub struct ColumnDefaults {
    exprs: Vec<(
        String,
        std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
    )>,
}

impl ColumnDefaults {
    /// The value of column `column`'s DEFAULT for `rows` rows; `None` when it has none.
    pub fn values(
        &self,
        column: &str,
        rows: usize,
    ) -> Result<Option<datafusion::arrow::array::ArrayRef>> {
        use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
        let Some((_, expr)) = self.exprs.iter().find(|(c, _)| c == column) else {
            return Ok(None);
        };
        // No columns, `rows` rows: what a DEFAULT (which names no column) evaluates over.
        let batch = RecordBatch::try_new_with_options(
            std::sync::Arc::new(datafusion::arrow::datatypes::Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        Ok(Some(expr.evaluate(&batch)?.into_array(rows)?))
    }
}

impl FragvecSession {
    /// The DEFAULT expressions of `target`'s columns, planned in this session as INSERT
    /// plans them.
    pub fn column_defaults(&self, target: &AppendTarget) -> Result<ColumnDefaults> {
        let mut state = self.coordinator_state();
        state.mark_start_execution();
        let none = datafusion::common::DFSchema::empty();
        let recorded = &target.0.manifest.properties.column_defaults;
        let exprs = recorded
            .iter()
            .map(|(column, sql)| {
                let planned = state
                    .create_logical_expr(sql, &none)
                    .and_then(|e| state.create_physical_expr(e, &none));
                match planned {
                    Ok(e) => Ok((column.clone(), e)),
                    Err(e) => {
                        datafusion::common::plan_err!("DEFAULT of column '{column}' ({sql}): {e}")
                    }
                }
            })
            .collect::<Result<_>>()?;
        Ok(ColumnDefaults { exprs })
    }
}

impl FragvecSession {
    /// Fragvec table `table` to append rows to; `None` when no fragvec table has that name
    /// (it may be a session table).
    pub async fn append_target(&self, table: &str) -> Result<Option<AppendTarget>> {
        let dir = std::sync::Arc::new(self.database().table(table)?);
        match dir.latest().await {
            Ok(s) => Ok(Some(AppendTarget(s))),
            Err(crate::format::FormatError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Appends `batch` — the target's columns in order, cast to their types as INSERT casts
    /// (a value that does not fit is an error; NOT NULL and vector rules hold) — as one
    /// commit, rebased over whatever committed since the target was read. Returns INSERT's
    /// result: the count of rows appended.
    pub async fn append_batch(
        &self,
        target: &AppendTarget,
        batch: datafusion::arrow::array::RecordBatch,
    ) -> Result<StatementResult> {
        use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
        let snapshot = &target.0;
        if batch.num_columns() != snapshot.schema.fields().len() {
            return datafusion::common::plan_err!(
                "table '{}' has {} columns, the rows {}",
                snapshot.name(),
                snapshot.schema.fields().len(),
                batch.num_columns()
            );
        }
        let schema = batch.schema();
        let stream = Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter([Ok(batch)]),
        ));
        StatementResult::count(self.append_stream(target, stream).await?)
    }

    /// Appends the batches of `stream` (each as [`Self::append_batch`] takes one) as one
    /// commit when it ends; an error from the stream ends the append without a commit.
    /// Fragments are written as the rows arrive, so the stream is never held whole. Returns
    /// the number of rows appended.
    pub async fn append_stream(
        &self,
        target: &AppendTarget,
        stream: datafusion::execution::SendableRecordBatchStream,
    ) -> Result<u64> {
        self.plans.clear();
        crate::engine::write::append_streams(&target.0, vec![stream], &self.progress()).await
    }
}

//! Statements DataFusion plans: queries, INSERT, EXPLAIN, SET, views, session tables.
//!
//! Before planning, every fragvec table a statement reads is pinned to one version (its
//! latest, or the one `VERSION AS OF` names) and `knn(...)` calls become top-k queries
//! ([`pin`](mod@crate::sql::pin)). Vector literals of distance calls become parameters bound after planning,
//! which is far cheaper to plan and lets a KNN query's physical plan be kept in the
//! session's [`PlanCache`](crate::engine::plan_cache::PlanCache) and reused for the next
//! query vector while the table state is unchanged.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ListArray, UInt64Array};
use datafusion::arrow::datatypes::Float64Type;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue, internal_err};
use datafusion::dataframe::DataFrame;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility, WriteOp};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Statement, TableObject};
use object_store::ObjectMeta;

use super::stream;
use crate::engine::ivf_bind;
use crate::engine::plan_cache::{self, CachedPlan, ShapeNote};
use crate::engine::session::{FragvecSession, StatementResult};
use crate::sql::{FragvecStatement, knn_call, parse_statements, pin, vector_params};

/// Plans and runs a statement fragvec does not intercept.
pub async fn run(
    session: &FragvecSession,
    mut statement: DFStatement,
    note: Option<&ShapeNote>,
) -> Result<StatementResult> {
    // Vector literals of distance calls become parameters (bound after planning): far
    // cheaper to plan, and the statement's text below stays short.
    let vectors = match &mut statement {
        DFStatement::Statement(s) => vector_params::extract_vector_literals(s),
        DFStatement::Explain(e) => match e.statement.as_mut() {
            DFStatement::Statement(s) => vector_params::extract_vector_literals(s),
            _ => vec![],
        },
        _ => vec![],
    };
    let text = statement.to_string().to_ascii_lowercase();
    if text.contains("information_schema") {
        session.schema.refresh().await?;
    }
    // Queries and INSERTs cannot change the set of tables; anything else (CREATE
    // EXTERNAL TABLE, DROP, views) may, so the list SHOW TABLES uses is refreshed after.
    let changes_tables = !matches!(&statement, DFStatement::Statement(s)
        if matches!(s.as_ref(), Statement::Query(_) | Statement::Insert(_)));
    // A query may read the newest versions known within `fragvec.version_check_ms`; a
    // statement that writes reads what the store holds now.
    let check = if is_query(&statement) {
        VersionCheck::WithinInterval
    } else {
        VersionCheck::Always
    };
    if let Some(target) = insert_target(&statement) {
        vector_text_into_vector_columns(session, &target, &mut statement).await;
    }
    if let Some(target) = insert_target(&statement)
        && let Ok(dir) = session.database().table(&target)
    {
        // The catalog resolves INSERT's target unpinned: confirm its newest version now, so
        // the lookup finds it fresh (appends would be rebased anyway, at the cost of a retry).
        dir.latest_version().await?;
    }
    let mut versions = Vec::new();
    let statement = pin_noting(
        session,
        statement,
        pin::mentions_virtual_columns(&text),
        check,
        &mut versions,
    )
    .await?;
    let binds_partitions = text.contains("ivf_partition");
    // What this run may teach about its statement's shape (see `shapes`): only a plain
    // query, which changes nothing the next text of the shape would see.
    let note = note.filter(|_| {
        !changes_tables
            && check == VersionCheck::WithinInterval
            && !text.contains("information_schema")
    });
    let result = if is_insert(&statement) {
        // Round-robin repartitioning would shuffle the rows of a single-partition source;
        // INSERT keeps its source's order so the logical order is the order given.
        let state = session.order_preserving_state();
        let plan = plan_statement(session, &state, statement, binds_partitions).await?;
        execute_plan(session, Some(state), plan).await
    } else if !vectors.is_empty() && matches!(&statement, DFStatement::Statement(_)) {
        let learning = note.map(|note| (note, versions));
        run_vector_query(session, statement, vectors, binds_partitions, learning).await
    } else {
        let state = session.ctx.state();
        let mut plan = plan_statement(session, &state, statement, binds_partitions).await?;
        if !vectors.is_empty() {
            plan = plan.with_param_values(vector_params_values(vectors))?;
        }
        execute_plan(session, None, plan).await
    };
    if result.is_ok() && changes_tables {
        session.schema.refresh().await?;
    }
    result
}

/// Plans a pinned statement; `binds_partitions`: it may call `ivf_partition(col)`, which is
/// then bound to the index on `col` ([`ivf_bind`]).
async fn plan_statement(
    session: &FragvecSession,
    state: &SessionState,
    statement: DFStatement,
    binds_partitions: bool,
) -> Result<LogicalPlan> {
    let plan = state.statement_to_plan(statement).await?;
    if !binds_partitions {
        return Ok(plan);
    }
    ivf_bind::bind_ivf_partitions(plan, session.schema.index_cache()).await
}

/// Runs SQL fragvec generated itself (a finder's EXPLAIN), pinned like any query, in this
/// process (see `FragvecSession::coordinator_state`).
pub async fn run_sql(session: &FragvecSession, sql: &str) -> Result<StatementResult> {
    let statement = pin(
        session,
        parse_query(sql)?,
        pin::mentions_virtual_columns(sql),
        VersionCheck::Always,
    )
    .await?;
    let state = session.coordinator_state();
    let plan = state.statement_to_plan(statement).await?;
    execute_plan(session, Some(state), plan).await
}

/// Parses SQL fragvec generated itself (a finder or an EXPLAIN), which DataFusion parses.
pub fn parse_query(sql: &str) -> Result<DFStatement> {
    match parse_statements(sql)?.pop() {
        Some(FragvecStatement::DataFusion(s)) => Ok(*s),
        _ => internal_err!("not a query: {sql}"),
    }
}

/// How [`pin`](fn@pin) finds a table's newest version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionCheck {
    /// Asks the store (statements that write, and the queries that find their rows).
    Always,
    /// Reuses the newest version known within `fragvec.version_check_ms` (read-only
    /// queries; see [`crate::format::latest`]).
    WithinInterval,
}

/// Pins every fragvec table the statement reads to its latest (or named) version.
/// `virtual_columns`: whether the statement names `_rowaddr` / `_rowid`.
pub async fn pin(
    session: &FragvecSession,
    statement: DFStatement,
    virtual_columns: bool,
    check: VersionCheck,
) -> Result<DFStatement> {
    pin_noting(session, statement, virtual_columns, check, &mut Vec::new()).await
}

/// [`pin`], noting in `versions` each table pinned to its newest version and that version.
async fn pin_noting(
    session: &FragvecSession,
    mut statement: DFStatement,
    virtual_columns: bool,
    check: VersionCheck,
    versions: &mut Vec<(String, u64)>,
) -> Result<DFStatement> {
    let target: &mut Statement = match &mut statement {
        DFStatement::Statement(s) => s.as_mut(),
        DFStatement::Explain(e) => match e.statement.as_mut() {
            DFStatement::Statement(s) => s.as_mut(),
            _ => return Ok(statement),
        },
        _ => return Ok(statement),
    };
    if matches!(target, Statement::CreateView(_)) {
        return Ok(statement); // a view reads the latest version each time it is used
    }
    // knn(...) calls become top-k queries over their table, using its index's metric.
    let calls = knn_call::knn_calls(target)?;
    if !calls.is_empty() {
        let mut metrics = HashMap::new();
        for call in calls {
            let dir = session.database().table(&call.table).map(Arc::new);
            let snapshot = match (&dir, check) {
                (Ok(dir), VersionCheck::Always) => dir.latest().await,
                (Ok(dir), VersionCheck::WithinInterval) => dir.latest_for_query().await,
                (Err(_), _) => continue,
            };
            if let Ok(snapshot) = snapshot
                && let Some(index) = snapshot
                    .manifest
                    .indexes
                    .iter()
                    .find(|i| i.column == call.column)
            {
                metrics.insert((call.table, call.column), index.metric);
            }
        }
        knn_call::rewrite_knn_calls(target, &metrics)?;
    }
    let mut latest = HashMap::new();
    let unpinned = pin::unpinned_tables(target);
    for table in pin::referenced_tables(target) {
        if session.schema.is_session_table(&table) {
            continue;
        }
        if !unpinned.contains(&table) {
            // Every reference names its version: nothing to look up (the placeholder is
            // never read, a named version wins), but the relations are still encoded.
            if session.database().table(&table).is_ok() {
                latest.insert(table, 0);
            }
            continue;
        }
        let Ok(dir) = session.database().table(&table) else {
            continue;
        };
        let version = match check {
            VersionCheck::Always => dir.latest_version().await?,
            VersionCheck::WithinInterval => dir.latest_version_for_query().await?,
        };
        if let Some(v) = version {
            versions.push((table.clone(), v));
            latest.insert(table, v);
        }
    }
    pin::pin_relations(target, &latest, virtual_columns);
    Ok(statement)
}

/// A query whose vector literals were taken out as parameters: its physical plan is
/// reused when the same pinned statement (same shape, same table versions, same options)
/// runs again with other vectors.
async fn run_vector_query(
    session: &FragvecSession,
    statement: DFStatement,
    vectors: Vec<Vec<f64>>,
    binds_partitions: bool,
    learning: Option<(&ShapeNote, Vec<(String, u64)>)>,
) -> Result<StatementResult> {
    let options = session.options().fingerprint();
    let key = format!("{options:?}|{statement}");
    let is_query = matches!(&statement, DFStatement::Statement(s) if matches!(s.as_ref(), Statement::Query(_)));
    let learnt = |plan: &CachedPlan| {
        if let Some((note, versions)) = learning.as_ref().filter(|_| is_query) {
            note.learnt(plan, options, versions, &vectors);
        }
    };
    if let Some(cached) = session.plans.get(&key)
        && same_table_state(session, &cached.plan, &[]).await?
        && let Some(plan) = plan_cache::rebind(
            &cached.plan,
            &cached.params,
            &vectors,
            session.plans.foreign(),
        )?
    {
        session.plans.note_reuse();
        learnt(&cached);
        return collect_physical(session, plan).await;
    }
    let referenced = match &statement {
        DFStatement::Statement(s) => Some(pin::referenced_tables(s.as_ref())),
        _ => None,
    };
    let state = session.ctx.state();
    let plan = plan_statement(session, &state, statement, binds_partitions).await?;
    // `now()`, `current_date`, `random()`, ... are folded into constants when a plan is made:
    // such a plan answers for the moment it was planned, so it is never kept.
    // A view is planned afresh at each use (its tables' latest versions), which a plan keyed
    // by the pinned statement text could not notice: plans reading a view are not kept.
    // A bound `ivf_partition` holds one version's partitions: simpler never to keep it.
    let keep = !calls_non_immutable_functions(&plan)?
        && !reads_a_view(session, referenced)
        && !binds_partitions;
    let plan = plan.with_param_values(vector_params_values(vectors.clone()))?;
    let physical = session
        .ctx
        .execute_logical_plan(plan)
        .await?
        .create_physical_plan()
        .await?;
    if keep && plan_cache::reusable(&physical, &vectors, session.plans.foreign())? {
        // The kept plan is a copy with its vectors as parameters, never run itself: each
        // run gets a fresh copy of it.
        if let Some(kept) =
            plan_cache::rebind(&physical, &vectors, &vectors, session.plans.foreign())?
        {
            let kept = CachedPlan {
                plan: kept,
                params: vectors.clone(),
            };
            if session.plans.put(key, kept.clone()) {
                learnt(&kept);
            }
        }
    }
    collect_physical(session, physical).await
}

/// Whether any of the relations a statement names (resolved by now) is a stored view;
/// `None` (not a plain statement) counts as reading one.
fn reads_a_view(
    session: &FragvecSession,
    referenced: Option<std::collections::BTreeSet<String>>,
) -> bool {
    referenced.is_none_or(|names| names.iter().any(|t| session.schema.is_view(t)))
}

/// Whether a logical plan (subqueries included) calls a function whose result may change
/// between runs of the same statement (volatility other than immutable).
fn calls_non_immutable_functions(plan: &LogicalPlan) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::ScalarFunction(f) = e
                    && f.func.signature().volatility != Volatility::Immutable
                {
                    found = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(found)
}

/// Whether the table a kept plan's KNN reads is still as it was planned: the same manifest
/// (a table dropped and made again reaches the same version numbers). `checked` holds the
/// tables whose newest version the caller just asked for, with their manifest's metadata:
/// the plan's table among them needs no second request.
pub(super) async fn same_table_state(
    session: &FragvecSession,
    plan: &Arc<dyn ExecutionPlan>,
    checked: &[(&str, u64, Option<ObjectMeta>)],
) -> Result<bool> {
    let Some(planned) = plan_cache::searched_snapshot(plan, session.plans.foreign()) else {
        return Ok(false);
    };
    let meta = checked
        .iter()
        .find(|(table, version, _)| *table == planned.name() && *version == planned.version())
        .and_then(|(_, _, meta)| meta.clone());
    let dir = session.database().table(planned.name())?;
    match dir.cached_manifest(planned.version(), meta).await {
        Ok(now) => Ok(Arc::ptr_eq(&now, &planned.manifest)),
        Err(_) => Ok(false),
    }
}

pub(super) async fn collect_physical(
    session: &FragvecSession,
    plan: Arc<dyn ExecutionPlan>,
) -> Result<StatementResult> {
    let schema = plan.schema();
    let task = session.plans.task_ctx(|| session.ctx.task_ctx());
    if stream::wanted() {
        stream::hand_over(datafusion::physical_plan::execute_stream(plan, task)?);
        return Ok(StatementResult::rows(schema, vec![]));
    }
    let batches = datafusion::physical_plan::collect(plan, task).await?;
    Ok(StatementResult::rows(schema, batches))
}

/// Runs a plan in the session (which applies `SET`s), or in a one-off `state`.
async fn execute_plan(
    session: &FragvecSession,
    state: Option<SessionState>,
    plan: LogicalPlan,
) -> Result<StatementResult> {
    let is_insert = matches!(&plan, LogicalPlan::Dml(d) if matches!(d.op, WriteOp::Insert(_)));
    let df = match state {
        Some(state) => DataFrame::new(state, plan),
        None => session.ctx.execute_logical_plan(plan).await?,
    };
    // The physical plan's schema, as DataFusion reports it: the logical one can still say
    // `Null` or the first input's type where type coercion settled on another (`SELECT NULL
    // ... UNION ALL SELECT 11`, a UNION of Int64 and Utf8 columns).
    let task_ctx = Arc::new(df.task_ctx());
    let physical = df.create_physical_plan().await?;
    let schema = physical.schema();
    if !is_insert && stream::wanted() {
        stream::hand_over(datafusion::physical_plan::execute_stream(
            physical, task_ctx,
        )?);
        return Ok(StatementResult::rows(schema, vec![]));
    }
    let batches = datafusion::physical_plan::collect(physical, task_ctx).await?;
    let mut result = StatementResult::rows(schema, batches);
    if is_insert {
        result.rows_affected = Some(count_of(&result));
    }
    Ok(result)
}

fn is_insert(statement: &DFStatement) -> bool {
    matches!(statement, DFStatement::Statement(s) if matches!(s.as_ref(), Statement::Insert(_)))
}

/// A read-only query, or the EXPLAIN of one.
fn is_query(statement: &DFStatement) -> bool {
    match statement {
        DFStatement::Statement(s) => matches!(s.as_ref(), Statement::Query(_)),
        DFStatement::Explain(e) => is_query(&e.statement),
        _ => false,
    }
}

/// pgvector's `INSERT INTO t VALUES ('[1,2,3]')`: the text literals going into the target's
/// vector columns become array literals (DataFusion has no cast from text to a vector).
async fn vector_text_into_vector_columns(
    session: &FragvecSession,
    target: &str,
    statement: &mut DFStatement,
) {
    let DFStatement::Statement(s) = statement else {
        return;
    };
    let Statement::Insert(insert) = s.as_mut() else {
        return;
    };
    let Ok(table) = session.ctx.table_provider(target).await else {
        return;
    };
    let schema = table.schema();
    let is_vector_field = |name: &str| {
        schema
            .field_with_name(name)
            .is_ok_and(|f| crate::format::types::vector_dim(f.data_type()).is_some())
    };
    let targets: Vec<bool> = if insert.columns.is_empty() {
        schema
            .fields()
            .iter()
            .map(|f| crate::format::types::vector_dim(f.data_type()).is_some())
            .collect()
    } else {
        insert
            .columns
            .iter()
            .map(|c| {
                c.0.last()
                    .and_then(|p| p.as_ident())
                    .is_some_and(|i| is_vector_field(&pin::normalize_ident(i)))
            })
            .collect()
    };
    if targets.iter().any(|v| *v) {
        crate::sql::vector_syntax::vector_text_in_values(insert, |i| {
            targets.get(i).copied().unwrap_or(false)
        });
    }
}

/// The table an INSERT writes to, as named.
fn insert_target(statement: &DFStatement) -> Option<String> {
    let DFStatement::Statement(s) = statement else {
        return None;
    };
    let Statement::Insert(insert) = s.as_ref() else {
        return None;
    };
    match &insert.table {
        TableObject::TableName(name) => pin::relation_of(name).map(|r| r.table),
        _ => None,
    }
}

fn count_of(result: &StatementResult) -> u64 {
    result
        .batches
        .first()
        .and_then(|b| b.column_by_name("count"))
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
        .map_or(0, |c| c.value(0))
}

/// The values of extracted vector literals, as DataFusion plans `[x, y, ...]`: lists.
fn vector_params_values(vectors: Vec<Vec<f64>>) -> Vec<ScalarValue> {
    vectors
        .into_iter()
        .map(|v| {
            let list = ListArray::from_iter_primitive::<Float64Type, _, _>([Some(
                v.into_iter().map(Some),
            )]);
            ScalarValue::List(Arc::new(list))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;

    use crate::FragvecSession;

    /// A result's schema is the executed plan's, after type coercion (the logical plan of
    /// a UNION still has its first input's types: `Null`, `Int64`).
    #[tokio::test]
    async fn result_schema_is_the_executed_plans() {
        let s = FragvecSession::open("memory://result-schema-test")
            .await
            .unwrap();
        let r = s
            .sql_one("SELECT NULL AS a UNION ALL SELECT 11")
            .await
            .unwrap();
        assert_eq!(r.schema.field(0).data_type(), &DataType::Int64);
        s.sql_one("CREATE TABLE u_int AS VALUES (1)").await.unwrap();
        s.sql_one("CREATE TABLE u_str AS VALUES ('x')")
            .await
            .unwrap();
        let r = s
            .sql_one("SELECT column1 FROM u_int UNION ALL SELECT column1 FROM u_str")
            .await
            .unwrap();
        assert!(matches!(
            r.schema.field(0).data_type(),
            DataType::Utf8 | DataType::Utf8View
        ));
        assert!(r.batches.iter().all(|b| b.schema() == r.schema));
    }
}

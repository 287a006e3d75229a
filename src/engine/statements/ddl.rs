//! CREATE TABLE, DROP TABLE and ALTER TABLE on fragvec tables.
//!
//! * CREATE TABLE creates a fragvec table: `VECTOR(n)` columns become `FLOAT[n]` before
//!   DataFusion plans the statement, `WITH (...)` sets the [`TableProperties`], `CLUSTER BY`
//!   stores the clustering key, and `AS SELECT` loads the query's rows as the first append.
//! * DROP TABLE drops fragvec tables (session tables are left to DataFusion).
//! * ALTER TABLE sets or drops the clustering key, retried on a commit conflict.

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::catalog::SchemaProvider;
use datafusion::common::{Result, not_impl_err, plan_err};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    AlterTable, AlterTableOperation, CreateTable, CreateTableOptions, Expr as SqlExpr, ObjectName,
    ObjectNamePart, Statement, WrappedCollection,
};

use crate::engine::recluster;
use crate::engine::session::{FragvecSession, StatementResult};
use crate::engine::write::append_streams;
use crate::format::FormatError;
use crate::format::types;
use crate::sql::ddl::{rewrite_vector_type, table_properties};
use crate::sql::pin;

/// `CREATE [IF NOT EXISTS] TABLE t (...) [WITH (...)] [CLUSTER BY (...)] [AS SELECT ...]`
pub async fn create_table(
    session: &FragvecSession,
    mut create: CreateTable,
) -> Result<StatementResult> {
    let options = match std::mem::take(&mut create.table_options) {
        CreateTableOptions::None => vec![],
        CreateTableOptions::With(o) => o,
        other => return plan_err!("unsupported table options: {other}"),
    };
    let mut properties = table_properties(&options)?;
    if let Some(keys) = create.cluster_by.take() {
        let (WrappedCollection::NoWrapping(exprs) | WrappedCollection::Parentheses(exprs)) = keys;
        // `CLUSTER BY (a, b)` parses as one tuple.
        for e in exprs {
            match e {
                SqlExpr::Tuple(items) => {
                    properties
                        .cluster_by
                        .extend(items.iter().map(|i| i.to_string()));
                }
                SqlExpr::Nested(inner) => properties.cluster_by.push(inner.to_string()),
                other => properties.cluster_by.push(other.to_string()),
            }
        }
    }
    for column in create.columns.iter_mut() {
        rewrite_vector_type(column)?;
    }
    let plan = session
        .ctx
        .state()
        .statement_to_plan(DFStatement::Statement(Box::new(Statement::CreateTable(
            create,
        ))))
        .await?;
    let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) = plan else {
        return not_impl_err!("this form of CREATE TABLE is not supported: {plan}");
    };
    if cmd.or_replace {
        return not_impl_err!("CREATE OR REPLACE TABLE is not supported");
    }
    if !cmd.column_defaults.is_empty() {
        return not_impl_err!("column DEFAULT values are not supported");
    }
    if !cmd.constraints.is_empty() {
        return not_impl_err!("table constraints (PRIMARY KEY, UNIQUE) are not supported");
    }
    let name = cmd.name.table().to_string();
    if session.schema.is_session_table(&name) {
        return plan_err!("table '{name}' already exists");
    }
    let fields: Vec<Field> = cmd
        .input
        .schema()
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), types::normalize(f.data_type()), f.is_nullable()))
        .collect();
    let schema = Schema::new(fields);
    let snapshot = match session
        .database()
        .create_table(&name, &schema, properties)
        .await
    {
        Ok(s) => s,
        Err(FormatError::AlreadyExists(_)) if cmd.if_not_exists => {
            return Ok(StatementResult::empty());
        }
        Err(e) => return Err(e.into()),
    };
    session.schema.refresh().await?;
    if matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(_)) {
        return Ok(StatementResult::empty());
    }
    // CREATE TABLE ... AS SELECT: load the query's rows as the first append, in order.
    let state = session.order_preserving_state();
    let df = DataFrame::new(state, cmd.input.as_ref().clone());
    let streams = df.execute_stream_partitioned().await?;
    let rows = append_streams(&snapshot, streams, &session.progress()).await?;
    StatementResult::count(rows)
}

/// `DROP TABLE [IF EXISTS] names`: drops fragvec tables; returns `None` to let DataFusion
/// drop a session table.
pub async fn drop_tables(
    session: &FragvecSession,
    names: &[ObjectName],
    if_exists: bool,
) -> Result<Option<StatementResult>> {
    for name in names {
        let Some(ObjectNamePart::Identifier(ident)) = name.0.last() else {
            continue;
        };
        let table = pin::normalize_ident(ident);
        if session.schema.is_session_table(&table) {
            if names.len() == 1 {
                return Ok(None);
            }
            session.schema.deregister_table(&table)?;
            continue;
        }
        match session.database().drop_table(&table).await {
            Ok(()) => {}
            Err(FormatError::NotFound(_)) if if_exists => {}
            Err(FormatError::NotFound(t)) => return plan_err!("table '{t}' does not exist"),
            Err(e) => return Err(e.into()),
        }
    }
    session.schema.refresh().await?;
    Ok(Some(StatementResult::empty()))
}

/// `ALTER TABLE t CLUSTER BY (...)` / `ALTER TABLE t DROP CLUSTERING KEY` on a fragvec
/// table, on its latest version and retried on a commit conflict; `None` for anything else
/// (DataFusion reports it as unsupported).
pub async fn alter_table(
    session: &FragvecSession,
    alter: &AlterTable,
) -> Result<Option<StatementResult>> {
    let keys: Vec<String> = match alter.operations.as_slice() {
        [AlterTableOperation::ClusterBy { exprs }] => exprs.iter().map(|e| e.to_string()).collect(),
        [AlterTableOperation::DropClusteringKey] => vec![],
        _ => return Ok(None),
    };
    let Some(ObjectNamePart::Identifier(ident)) = alter.name.0.last() else {
        return Ok(None);
    };
    let table = pin::normalize_ident(ident);
    let (table, keys) = (&table, &keys);
    session
        .retrying(|| async move {
            let snapshot = session.latest_snapshot(table).await?;
            recluster::set_cluster_key(
                &session.ctx.state(),
                &snapshot,
                keys.clone(),
                session.schema.index_cache(),
            )
            .await
        })
        .await?;
    Ok(Some(StatementResult::empty()))
}

//! CREATE TABLE, DROP TABLE and ALTER TABLE on fragvec tables.
//!
//! * CREATE TABLE creates a fragvec table: `VECTOR(n)` columns become `FLOAT[n]` before
//!   DataFusion plans the statement, `WITH (...)` sets the [`TableProperties`](crate::format::TableProperties), `CLUSTER BY`
//!   stores the clustering key, constraints and `DEFAULT`s are recorded, and `AS SELECT`
//!   loads the query's rows as the first append (or leaves no table if it fails).
//! * DROP TABLE drops fragvec tables (session tables are left to DataFusion).
//! * ALTER TABLE sets or drops the clustering key, retried on a commit conflict.

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::catalog::SchemaProvider;
use datafusion::common::{
    Constraint, Constraints, DataFusionError, Result, SchemaError, exec_err, not_impl_err,
    plan_err, schema_err,
};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    AlterTable, AlterTableOperation, ColumnDef, ColumnOption, CreateTable, CreateTableOptions,
    Expr as SqlExpr, ObjectName, ObjectNamePart, Statement, WrappedCollection,
};

use crate::engine::recluster;
use crate::engine::session::{FragvecSession, StatementResult};
use crate::engine::write::append_streams;
use crate::format::FormatError;
use crate::format::manifest::KeyConstraint;
use crate::format::types;
use crate::sql::ddl::{rewrite_vector_type, table_properties};
use crate::sql::pin;

/// `CREATE [OR REPLACE] [IF NOT EXISTS] TABLE t (...) [WITH (...)] [CLUSTER BY (...)]
/// [AS SELECT ...]`. Like DataFusion's: `PRIMARY KEY` / `UNIQUE` are recorded as constraints
/// (not enforced), `DEFAULT` values are used by INSERTs that leave a column out, `OR REPLACE`
/// drops an existing table first, and the statement returns no rows. A `CREATE TABLE ... AS`
/// whose query or write fails leaves no table behind.
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
    properties.column_defaults = column_defaults(&create.columns);
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
    if cmd.temporary {
        return not_impl_err!("Temporary tables not supported");
    }
    let input_schema = cmd.input.schema().clone();
    properties.constraints = key_constraints(&cmd.constraints, input_schema.as_arrow());
    let name = cmd.name.table().to_string();
    if session.schema.is_session_table(&name) {
        return plan_err!("table '{name}' already exists");
    }
    let exists = session
        .database()
        .table(&name)?
        .latest_version()
        .await?
        .is_some();
    match (cmd.if_not_exists, cmd.or_replace, exists) {
        (true, false, true) => return Ok(StatementResult::empty()),
        (true, true, true) => {
            return exec_err!("'IF NOT EXISTS' cannot coexist with 'REPLACE'");
        }
        (false, false, true) => return exec_err!("Table '{name}' already exists"),
        _ => {}
    }
    ensure_unique_column_names(input_schema.as_arrow())?;
    if exists {
        // OR REPLACE: as DataFusion, the old table goes first.
        session.database().drop_table(&name).await?;
    }
    let fields: Vec<Field> = input_schema
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
    let mut loaded_rows = None;
    if !matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(_)) {
        // CREATE TABLE ... AS SELECT: load the query's rows as the first append, in order.
        // If that fails the table goes again: it exists only when fully written.
        let state = session.order_preserving_state();
        let df = DataFrame::new(state, cmd.input.as_ref().clone());
        let loaded = match df.execute_stream_partitioned().await {
            Ok(streams) => append_streams(&snapshot, streams, &session.progress()).await,
            Err(e) => Err(e),
        };
        match loaded {
            Ok(rows) => loaded_rows = Some(rows),
            Err(e) => {
                if let Err(cleanup) = session.database().drop_table(&name).await {
                    return Err(DataFusionError::Context(
                        format!("the table '{name}' it created could not be removed: {cleanup}"),
                        Box::new(e),
                    ));
                }
                session.schema.refresh().await?;
                return Err(e);
            }
        }
    }
    session.schema.refresh().await?;
    // No rows, as DataFusion's CREATE TABLE AS; the count of rows written rides along for
    // the Postgres endpoint's `SELECT n` tag and Flight SQL's row count.
    Ok(StatementResult {
        rows_affected: loaded_rows,
        ..StatementResult::empty()
    })
}

/// `DEFAULT` expressions of the columns, as SQL text by (normalized) column name.
fn column_defaults(columns: &[ColumnDef]) -> Vec<(String, String)> {
    columns
        .iter()
        .filter_map(|c| {
            c.options.iter().find_map(|o| match &o.option {
                ColumnOption::Default(e) => Some((pin::normalize_ident(&c.name), e.to_string())),
                _ => None,
            })
        })
        .collect()
}

/// The planned constraints, by column name.
fn key_constraints(constraints: &Constraints, schema: &Schema) -> Vec<KeyConstraint> {
    constraints
        .iter()
        .map(|c| {
            let (primary_key, indices) = match c {
                Constraint::PrimaryKey(i) => (true, i),
                Constraint::Unique(i) => (false, i),
            };
            KeyConstraint {
                primary_key,
                columns: indices
                    .iter()
                    .map(|&i| schema.field(i).name().clone())
                    .collect(),
            }
        })
        .collect()
}

/// A table stores unqualified names only, so a query's `a.x` and `b.x` cannot both become
/// columns (DataFusion's error).
fn ensure_unique_column_names(schema: &Schema) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for field in schema.fields() {
        if !seen.insert(field.name().as_str()) {
            return schema_err!(SchemaError::DuplicateUnqualifiedField {
                name: field.name().to_string(),
            });
        }
    }
    Ok(())
}

/// `DROP TABLE [IF EXISTS] names`: drops fragvec tables; returns `None` to let DataFusion
/// drop a session table.
pub async fn drop_tables(
    session: &FragvecSession,
    names: &[ObjectName],
    if_exists: bool,
) -> Result<Option<StatementResult>> {
    let normalize = session
        .ctx
        .state_ref()
        .read()
        .config_options()
        .sql_parser
        .enable_ident_normalization;
    for name in names {
        let Some(ObjectNamePart::Identifier(ident)) = name.0.last() else {
            continue;
        };
        // As DataFusion: unquoted names are lower-cased unless
        // `datafusion.sql_parser.enable_ident_normalization` is off.
        let table = if normalize {
            pin::normalize_ident(ident)
        } else {
            ident.value.clone()
        };
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
            // DataFusion's words, which its users match on.
            Err(FormatError::NotFound(t)) => return exec_err!("Table '{t}' doesn't exist."),
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

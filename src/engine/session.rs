//! `FragvecSession`: a DataFusion `SessionContext` with fragvec's catalog, options and table
//! functions, and the statement front end that runs SQL against it.
//!
//! Statements DataFusion can run are planned by DataFusion after fragvec pins every table they
//! read to one version. Statements on fragvec tables that DataFusion would run differently are
//! intercepted here: `CREATE TABLE` (creates a fragvec table, `VECTOR(n)` columns, `WITH`
//! options), `DROP TABLE`, and DELETE / UPDATE / MERGE (run as finder queries, see
//! [`crate::sql::finder`]). All work happens when a statement is executed.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::SchemaProvider;
use datafusion::common::{DataFusionError, Result};
use datafusion::dataframe::DataFrame;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    ColumnDef, CreateTableOptions, DataType as SqlType, Expr as SqlExpr, ObjectType, SqlOption,
    Statement, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use super::catalog::{FragvecSchema, RelationName};
use super::dml::RowChanges;
pub use super::error::is_retryable;
use super::functions;
use super::index_ops;
use super::knn_rule::KnnRule;
use super::maintenance;
use super::options::FragvecOptions;
use super::plan_cache::{self, CachedPlan, PlanCache};
use super::recluster;
use super::types;
use super::udf;
use super::write::{append_streams, count_schema};
use crate::format::{self, Database, FormatError, Operation, Snapshot, TableProperties};
use crate::sql::finder::{self, DmlTarget, Finder, TargetColumn};
use crate::sql::vector_params;
use crate::sql::{FragvecStatement, knn_call, parse_statements, pin};
use datafusion::common::ScalarValue;
use datafusion::physical_plan::ExecutionPlan;

/// What one statement produced.
#[derive(Debug, Clone)]
pub struct StatementResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// `Some(n)` for statements that change rows (their result is one `count` row).
    pub rows_affected: Option<u64>,
}

impl StatementResult {
    fn rows(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            schema,
            batches,
            rows_affected: None,
        }
    }

    fn count(n: u64) -> Result<Self> {
        Ok(Self {
            schema: count_schema(),
            batches: vec![super::write::count_batch(n)?],
            rows_affected: Some(n),
        })
    }

    fn empty() -> Self {
        Self::rows(Arc::new(Schema::empty()), vec![])
    }

    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

/// A SQL session over one fragvec database.
#[derive(Clone)]
pub struct FragvecSession {
    ctx: SessionContext,
    schema: Arc<FragvecSchema>,
    /// Physical plans of KNN queries, reused for the next query vector.
    plans: Arc<PlanCache>,
}

impl std::fmt::Debug for FragvecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FragvecSession")
            .field("database", &self.schema.database().location())
            .finish()
    }
}

/// Makes `ctx` a fragvec session over the database at `location` (a path, `file://`,
/// `memory://`, or `s3://` with the `s3` feature). The database's tables become the default
/// schema; tables already registered there stay available.
pub async fn register(ctx: &SessionContext, location: &str) -> Result<FragvecSession> {
    let db = Database::open(location).await?;
    FragvecSession::with_context(ctx.clone(), db).await
}

impl FragvecSession {
    /// Opens a session on the database at `location`.
    pub async fn open(location: &str) -> Result<Self> {
        let config = SessionConfig::new().with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        register(&ctx, location).await
    }

    pub async fn with_context(ctx: SessionContext, db: Database) -> Result<Self> {
        {
            let state = ctx.state_ref();
            let mut state = state.write();
            let options = state.config_mut().options_mut();
            if options.extensions.get::<FragvecOptions>().is_none() {
                options.extensions.insert(FragvecOptions::default());
            }
        }
        let schema = Arc::new(FragvecSchema::open(db.clone()).await?);
        let catalog_name = ctx.state().config_options().catalog.default_catalog.clone();
        let schema_name = ctx.state().config_options().catalog.default_schema.clone();
        let catalog = ctx.catalog(&catalog_name).ok_or_else(|| {
            DataFusionError::Plan(format!("default catalog '{catalog_name}' is missing"))
        })?;
        if let Some(existing) = catalog.schema(&schema_name) {
            for name in existing.table_names() {
                if let Some(table) = existing.table(&name).await? {
                    schema.register_table(name, table)?;
                }
            }
        }
        catalog.register_schema(&schema_name, schema.clone())?;
        functions::register(&ctx, &db);
        {
            // The KNN rule runs after DataFusion's own physical optimizations.
            let state = ctx.state_ref();
            let mut state = state.write();
            if !state
                .physical_optimizers()
                .iter()
                .any(|r| r.name() == "fragvec_knn")
            {
                let rebuilt = SessionStateBuilder::new_from_existing(state.clone())
                    .with_physical_optimizer_rule(Arc::new(KnnRule))
                    .build();
                *state = rebuilt;
            }
        }
        // After the rebuild above: rebuilding re-registers every function in arbitrary order,
        // which could let DataFusion's `inner_product` (alias `dot_product`) win again.
        udf::register(&ctx);
        super::cluster_udf::register(&ctx);
        Ok(Self {
            ctx,
            schema,
            plans: Arc::default(),
        })
    }

    /// How many queries ran on a reused physical plan (see [`super::plan_cache`]).
    pub fn plans_reused(&self) -> u64 {
        self.plans.reused()
    }

    /// The DataFusion context, for registering more functions or tables.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    pub fn database(&self) -> &Database {
        self.schema.database()
    }

    /// Runs every statement in `sql`, in order, and returns their results. Stops at the first
    /// error, which names the statement's position when there are several.
    pub async fn sql(&self, sql: &str) -> Result<Vec<StatementResult>> {
        let statements = parse_statements(sql)?;
        let many = statements.len() > 1;
        let mut results = Vec::with_capacity(statements.len());
        for (i, statement) in statements.into_iter().enumerate() {
            match self.execute(statement).await {
                Ok(r) => results.push(r),
                Err(e) if many => {
                    return Err(DataFusionError::Context(
                        format!("statement {}", i + 1),
                        Box::new(e),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(results)
    }

    /// Runs one statement of `sql` and returns its result.
    pub async fn sql_one(&self, sql: &str) -> Result<StatementResult> {
        let mut statements = parse_statements(sql)?;
        if statements.len() != 1 {
            return Err(DataFusionError::Plan(format!(
                "expected one statement, found {}",
                statements.len()
            )));
        }
        self.execute(statements.remove(0)).await
    }

    pub async fn execute(&self, statement: FragvecStatement) -> Result<StatementResult> {
        let reads_only = matches!(&statement, FragvecStatement::DataFusion(s)
            if matches!(s.as_ref(), DFStatement::Explain(_))
                || matches!(s.as_ref(), DFStatement::Statement(q) if matches!(q.as_ref(), Statement::Query(_))));
        if !reads_only {
            // Anything else may change a table or how queries plan.
            self.plans.clear();
        }
        if let FragvecStatement::DataFusion(s) = statement {
            return self.execute_datafusion(*s).await;
        }
        // Index statements read the latest version and retry, like DML, when a concurrent
        // commit made theirs impossible.
        let retries = self.options().commit_retries;
        let mut attempt = 0;
        loop {
            match self.own_statement(&statement).await {
                Ok(result) => return Ok(result),
                Err(e) if is_retryable(&e) && attempt < retries => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs one of fragvec's own statements once, on the latest version.
    async fn latest_snapshot(&self, table: &str) -> Result<Snapshot> {
        index_ops::latest(self.database(), table).await
    }

    async fn own_statement(&self, statement: &FragvecStatement) -> Result<StatementResult> {
        let one_row = |batch: RecordBatch| StatementResult::rows(batch.schema(), vec![batch]);
        let cache = self.schema.index_cache();
        match statement {
            FragvecStatement::DataFusion(_) => unreachable!("handled by execute"),
            FragvecStatement::CreateVectorIndex {
                name,
                table,
                column,
                kind,
                options,
            } => StatementResult::count(
                index_ops::create(
                    self.latest_snapshot(table).await?,
                    name,
                    column,
                    kind,
                    options,
                )
                .await?,
            ),
            FragvecStatement::DropIndex {
                name,
                table,
                if_exists,
            } => StatementResult::count(
                index_ops::drop(self.latest_snapshot(table).await?, name, *if_exists).await?,
            ),
            FragvecStatement::OptimizeIndex {
                name,
                table,
                action,
            } => StatementResult::count(
                index_ops::optimize(self.latest_snapshot(table).await?, name, *action, cache)
                    .await?,
            ),
            FragvecStatement::Compact { table, options } => Ok(one_row(
                maintenance::run_compact(&self.latest_snapshot(table).await?, options).await?,
            )),
            FragvecStatement::Vacuum {
                table,
                retain_versions,
            } => {
                let grace = std::time::Duration::from_secs(self.options().vacuum_grace_seconds);
                Ok(one_row(
                    maintenance::run_vacuum(
                        &self.latest_snapshot(table).await?,
                        *retain_versions,
                        grace,
                    )
                    .await?,
                ))
            }
            FragvecStatement::Recluster {
                table,
                keys,
                options,
                filter,
            } => Ok(one_row(
                recluster::run_recluster(
                    &self.ctx.state(),
                    &self.latest_snapshot(table).await?,
                    keys,
                    options,
                    filter.as_deref(),
                    cache,
                )
                .await?,
            )),
        }
    }

    async fn execute_datafusion(&self, statement: DFStatement) -> Result<StatementResult> {
        if let DFStatement::Statement(s) = &statement {
            match s.as_ref() {
                Statement::CreateTable(_) => {
                    let DFStatement::Statement(s) = statement else {
                        unreachable!()
                    };
                    return self.create_table(*s).await;
                }
                Statement::Drop {
                    object_type: ObjectType::Table,
                    ..
                } => {
                    if let Some(r) = self.drop_tables(s).await? {
                        return Ok(r);
                    }
                }
                Statement::Delete(_) | Statement::Update(_) | Statement::Merge(_) => {
                    if let Some(r) = self.run_dml(s).await? {
                        return Ok(r);
                    }
                }
                Statement::ShowTables { .. } => self.schema.refresh().await?,
                Statement::AlterTable(alter) => {
                    if let Some(r) = self.alter_table(alter).await? {
                        return Ok(r);
                    }
                }
                _ => {}
            }
        }
        if let DFStatement::Explain(explain) = &statement
            && let DFStatement::Statement(inner) = explain.statement.as_ref()
            && matches!(
                inner.as_ref(),
                Statement::Delete(_) | Statement::Update(_) | Statement::Merge(_)
            )
        {
            if explain.options.analyze {
                return Err(DataFusionError::NotImplemented(
                    "EXPLAIN ANALYZE would run the DML statement; run it directly".into(),
                ));
            }
            if let Some((finder, _, _)) = self.dml_finder(inner).await? {
                return self.run_query(&format!("EXPLAIN {}", finder.sql)).await;
            }
        }
        // Vector literals of distance calls become parameters (bound after planning): far
        // cheaper to plan, and the statement's text below stays short.
        let mut statement = statement;
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
            self.schema.refresh().await?;
        }
        // Queries and INSERTs cannot change the set of tables; anything else (CREATE
        // EXTERNAL TABLE, DROP, views) may, so the list SHOW TABLES uses is refreshed after.
        let changes_tables = !matches!(&statement, DFStatement::Statement(s)
            if matches!(s.as_ref(), Statement::Query(_) | Statement::Insert(_)));
        let statement = self
            .pin(statement, pin::mentions_virtual_columns(&text))
            .await?;
        let result = if is_insert(&statement) {
            // Round-robin repartitioning would shuffle the rows of a single-partition source;
            // INSERT keeps its source's order so the logical order is the order given.
            let mut state = self.ctx.state();
            state
                .config_mut()
                .options_mut()
                .optimizer
                .enable_round_robin_repartition = false;
            let plan = state.statement_to_plan(statement).await?;
            self.execute_plan(Some(state), plan).await
        } else if !vectors.is_empty() && matches!(&statement, DFStatement::Statement(_)) {
            self.run_vector_query(statement, vectors).await
        } else {
            let mut plan = self.ctx.state().statement_to_plan(statement).await?;
            if !vectors.is_empty() {
                plan = plan.with_param_values(vector_params_values(vectors))?;
            }
            self.execute_plan(None, plan).await
        };
        if result.is_ok() && changes_tables {
            self.schema.refresh().await?;
        }
        result
    }

    /// A query whose vector literals were taken out as parameters: its physical plan is
    /// reused when the same pinned statement (same shape, same table versions, same options)
    /// runs again with other vectors.
    async fn run_vector_query(
        &self,
        statement: DFStatement,
        vectors: Vec<Vec<f64>>,
    ) -> Result<StatementResult> {
        let key = format!("{:?}|{statement}", self.options());
        if let Some(cached) = self.plans.get(&key)
            && self.same_table_state(&cached.plan).await?
            && let Some(plan) = plan_cache::rebind(&cached.plan, &cached.params, &vectors)?
        {
            self.plans.note_reuse();
            return self.collect_physical(plan).await;
        }
        let plan = self.ctx.state().statement_to_plan(statement).await?;
        let plan = plan.with_param_values(vector_params_values(vectors.clone()))?;
        let physical = self
            .ctx
            .execute_logical_plan(plan)
            .await?
            .create_physical_plan()
            .await?;
        if plan_cache::reusable(&physical, &vectors)? {
            // The kept plan is never run itself: each run gets a fresh copy.
            if let Some(fresh) = plan_cache::rebind(&physical, &vectors, &vectors)? {
                self.plans.put(
                    key,
                    CachedPlan {
                        plan: physical,
                        params: vectors,
                    },
                );
                return self.collect_physical(fresh).await;
            }
        }
        self.collect_physical(physical).await
    }

    /// Whether the table a cached plan reads is still the one it was planned for (a table
    /// dropped and created again reaches the same version numbers).
    async fn same_table_state(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<bool> {
        let Some(knn) = plan_cache::knn_of(plan) else {
            return Ok(false);
        };
        let planned = &knn.scan_spec().snapshot;
        let dir = Arc::new(self.database().table(planned.name())?);
        match dir.snapshot(planned.version()).await {
            Ok(now) => Ok(Arc::ptr_eq(&now.manifest, &planned.manifest)),
            Err(_) => Ok(false),
        }
    }

    async fn collect_physical(&self, plan: Arc<dyn ExecutionPlan>) -> Result<StatementResult> {
        let schema = plan.schema();
        let batches = datafusion::physical_plan::collect(plan, self.ctx.task_ctx()).await?;
        Ok(StatementResult::rows(schema, batches))
    }

    /// Runs a plan in the session (which applies `SET`s), or in a one-off `state`.
    async fn execute_plan(
        &self,
        state: Option<SessionState>,
        plan: LogicalPlan,
    ) -> Result<StatementResult> {
        let is_insert = matches!(&plan, LogicalPlan::Dml(d) if matches!(d.op, datafusion::logical_expr::WriteOp::Insert(_)));
        let df = match state {
            Some(state) => DataFrame::new(state, plan),
            None => self.ctx.execute_logical_plan(plan).await?,
        };
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        let mut result = StatementResult::rows(schema, batches);
        if is_insert {
            result.rows_affected = Some(count_of(&result));
        }
        Ok(result)
    }

    async fn run_query(&self, sql: &str) -> Result<StatementResult> {
        let statement = self
            .pin(parse_query(sql)?, pin::mentions_virtual_columns(sql))
            .await?;
        let plan = self.ctx.state().statement_to_plan(statement).await?;
        self.execute_plan(None, plan).await
    }

    /// Pins every fragvec table the statement reads to its latest (or named) version.
    /// `virtual_columns`: whether the statement names `_rowaddr` / `_rowid`.
    async fn pin(&self, mut statement: DFStatement, virtual_columns: bool) -> Result<DFStatement> {
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
                if let Ok(dir) = self.database().table(&call.table)
                    && let Ok(snapshot) = Arc::new(dir).latest().await
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
        for table in pin::referenced_tables(target) {
            if self.schema.is_session_table(&table) {
                continue;
            }
            if let Ok(dir) = self.database().table(&table)
                && let Some(v) = dir.latest_version().await?
            {
                latest.insert(table, v);
            }
        }
        pin::pin_relations(target, &latest, virtual_columns);
        Ok(statement)
    }

    /// `ALTER TABLE t CLUSTER BY (...)` / `ALTER TABLE t DROP CLUSTERING KEY` on a fragvec
    /// table; `None` for anything else (DataFusion reports it as unsupported).
    async fn alter_table(
        &self,
        alter: &datafusion::sql::sqlparser::ast::AlterTable,
    ) -> Result<Option<StatementResult>> {
        use datafusion::sql::sqlparser::ast::{AlterTableOperation, ObjectNamePart};
        let keys = match alter.operations.as_slice() {
            [AlterTableOperation::ClusterBy { exprs }] => {
                exprs.iter().map(|e| e.to_string()).collect()
            }
            [AlterTableOperation::DropClusteringKey] => vec![],
            _ => return Ok(None),
        };
        let Some(ObjectNamePart::Identifier(ident)) = alter.name.0.last() else {
            return Ok(None);
        };
        let table = pin::normalize_ident(ident);
        let retries = self.options().commit_retries;
        let mut attempt = 0;
        loop {
            let snapshot = self.latest_snapshot(&table).await?;
            match recluster::set_cluster_key(
                &self.ctx.state(),
                &snapshot,
                keys.clone(),
                self.schema.index_cache(),
            )
            .await
            {
                Ok(()) => return Ok(Some(StatementResult::empty())),
                Err(e) if is_retryable(&e) && attempt < retries => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    async fn create_table(&self, statement: Statement) -> Result<StatementResult> {
        let Statement::CreateTable(mut create) = statement else {
            unreachable!()
        };
        let options = match std::mem::take(&mut create.table_options) {
            CreateTableOptions::None => vec![],
            CreateTableOptions::With(o) => o,
            other => {
                return Err(DataFusionError::Plan(format!(
                    "unsupported table options: {other}"
                )));
            }
        };
        let mut properties = table_properties(&options)?;
        if let Some(keys) = create.cluster_by.take() {
            use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, WrappedCollection};
            let (WrappedCollection::NoWrapping(exprs) | WrappedCollection::Parentheses(exprs)) =
                keys;
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
        let plan = self
            .ctx
            .state()
            .statement_to_plan(DFStatement::Statement(Box::new(Statement::CreateTable(
                create,
            ))))
            .await?;
        let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) = plan else {
            return Err(DataFusionError::NotImplemented(format!(
                "this form of CREATE TABLE is not supported: {plan}"
            )));
        };
        if cmd.or_replace {
            return Err(DataFusionError::NotImplemented(
                "CREATE OR REPLACE TABLE is not supported".into(),
            ));
        }
        if !cmd.column_defaults.is_empty() {
            return Err(DataFusionError::NotImplemented(
                "column DEFAULT values are not supported".into(),
            ));
        }
        if !cmd.constraints.is_empty() {
            return Err(DataFusionError::NotImplemented(
                "table constraints (PRIMARY KEY, UNIQUE) are not supported".into(),
            ));
        }
        let name = cmd.name.table().to_string();
        if self.schema.is_session_table(&name) {
            return Err(DataFusionError::Plan(format!(
                "table '{name}' already exists"
            )));
        }
        let fields: Vec<Field> = cmd
            .input
            .schema()
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), types::normalize(f.data_type()), f.is_nullable()))
            .collect();
        let schema = Schema::new(fields);
        let snapshot = match self
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
        self.schema.refresh().await?;
        if matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(_)) {
            return Ok(StatementResult::empty());
        }
        // CREATE TABLE ... AS SELECT: load the query's rows as the first append, in order.
        let mut state = self.ctx.state();
        state
            .config_mut()
            .options_mut()
            .optimizer
            .enable_round_robin_repartition = false;
        let df = DataFrame::new(state, cmd.input.as_ref().clone());
        let streams = df.execute_stream_partitioned().await?;
        let rows = append_streams(&snapshot, streams).await?;
        StatementResult::count(rows)
    }

    /// Drops fragvec tables; returns `None` to let DataFusion drop a session table.
    async fn drop_tables(&self, statement: &Statement) -> Result<Option<StatementResult>> {
        let Statement::Drop {
            names, if_exists, ..
        } = statement
        else {
            unreachable!()
        };
        for name in names {
            let Some(datafusion::sql::sqlparser::ast::ObjectNamePart::Identifier(ident)) =
                name.0.last()
            else {
                continue;
            };
            let table = pin::normalize_ident(ident);
            if self.schema.is_session_table(&table) {
                if names.len() == 1 {
                    return Ok(None);
                }
                self.schema.deregister_table(&table)?;
                continue;
            }
            match self.database().drop_table(&table).await {
                Ok(()) => {}
                Err(FormatError::NotFound(_)) if *if_exists => {}
                Err(FormatError::NotFound(t)) => {
                    return Err(DataFusionError::Plan(format!("table '{t}' does not exist")));
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.schema.refresh().await?;
        Ok(Some(StatementResult::empty()))
    }

    /// Resolves a DML statement's target and builds its finder at the latest version.
    /// `None` when the target is not a fragvec table (DataFusion handles it).
    async fn dml_finder(
        &self,
        statement: &Statement,
    ) -> Result<Option<(Finder, format::Snapshot, Operation)>> {
        let target: DmlTarget = match statement {
            Statement::Delete(d) => finder::delete_target(d)?,
            Statement::Update(u) => finder::update_target(u)?,
            Statement::Merge(m) => finder::merge_target(m)?,
            _ => return Ok(None),
        };
        if self.schema.is_session_table(&target.table) {
            return Ok(None);
        }
        let snapshot = self.latest_snapshot(&target.table).await?;
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
        let (finder, op) = match statement {
            Statement::Delete(d) => (
                finder::delete_finder(d, &target, &relation)?,
                Operation::Delete,
            ),
            Statement::Update(u) => (
                finder::update_finder(u, &target, &relation, &columns)?,
                Operation::Update,
            ),
            Statement::Merge(m) => (
                finder::merge_finder(m, &target, &relation, &columns)?,
                Operation::Merge,
            ),
            _ => unreachable!(),
        };
        Ok(Some((finder, snapshot, op)))
    }

    /// Runs DELETE / UPDATE / MERGE on a fragvec table, retrying from a fresh snapshot when a
    /// concurrent writer made the commit impossible.
    async fn run_dml(&self, statement: &Statement) -> Result<Option<StatementResult>> {
        let options = self.options();
        let mode = options.update_mode;
        let mut attempt = 0;
        loop {
            let Some((finder, snapshot, op)) = self.dml_finder(statement).await? else {
                return Ok(None);
            };
            let query = self.finder_frame(&finder.sql).await?;
            let changes = RowChanges::collect(
                query.execute_stream().await?,
                &snapshot.schema,
                finder.default_action,
            )
            .await?;
            match changes
                .commit(&snapshot, op, mode, &finder.assigned_columns)
                .await
            {
                Ok(n) => return Ok(Some(StatementResult::count(n)?)),
                Err(e) if is_retryable(&e) && attempt < options.commit_retries => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    async fn finder_frame(&self, sql: &str) -> Result<DataFrame> {
        let statement = self
            .pin(parse_query(sql)?, pin::mentions_virtual_columns(sql))
            .await?;
        let plan = self.ctx.state().statement_to_plan(statement).await?;
        self.ctx.execute_logical_plan(plan).await
    }

    fn options(&self) -> FragvecOptions {
        self.ctx
            .state()
            .config_options()
            .extensions
            .get::<FragvecOptions>()
            .cloned()
            .unwrap_or_default()
    }
}

/// Parses SQL fragvec generated itself (a finder or an EXPLAIN), which DataFusion parses.
fn parse_query(sql: &str) -> Result<DFStatement> {
    match parse_statements(sql)?.pop() {
        Some(FragvecStatement::DataFusion(s)) => Ok(*s),
        _ => Err(DataFusionError::Internal(format!("not a query: {sql}"))),
    }
}

fn is_insert(statement: &DFStatement) -> bool {
    matches!(statement, DFStatement::Statement(s) if matches!(s.as_ref(), Statement::Insert(_)))
}

fn count_of(result: &StatementResult) -> u64 {
    result
        .batches
        .first()
        .and_then(|b| b.column_by_name("count"))
        .and_then(|c| {
            c.as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
        })
        .map_or(0, |c| c.value(0))
}

/// `VECTOR(n)` → `FLOAT[n]`, which DataFusion plans as `FixedSizeList<Float32>[n]`.
fn rewrite_vector_type(column: &mut ColumnDef) -> Result<()> {
    if let SqlType::Custom(name, modifiers) = &column.data_type
        && name.to_string().eq_ignore_ascii_case("vector")
    {
        let dim: i32 = match modifiers.as_slice() {
            [n] => n.parse().ok().filter(|d| *d > 0).ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "VECTOR dimension must be a positive integer, not {n}"
                ))
            })?,
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "column '{}': VECTOR needs a dimension, e.g. VECTOR(128)",
                    column.name
                )));
            }
        };
        column.data_type = Parser::new(&GenericDialect {})
            .try_with_sql(&format!("FLOAT[{dim}]"))
            .and_then(|mut p| p.parse_data_type())
            .map_err(|e| DataFusionError::Internal(e.to_string()))?;
    }
    Ok(())
}

/// Table options of `CREATE TABLE ... WITH (...)`.
fn table_properties(options: &[SqlOption]) -> Result<TableProperties> {
    let mut props = TableProperties::default();
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(DataFusionError::Plan(format!(
                "unsupported table option {option}"
            )));
        };
        let key = key.value.to_ascii_lowercase();
        let text = match value {
            SqlExpr::Value(v) => match &v.value {
                Value::Number(n, _) => n.clone(),
                Value::SingleQuotedString(s) => s.clone(),
                Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            SqlExpr::Identifier(i) => i.value.clone(),
            other => other.to_string(),
        };
        match key.as_str() {
            "stable_row_ids" => {
                props.stable_row_ids = text.parse().map_err(|_| {
                    DataFusionError::Plan(format!(
                        "stable_row_ids must be true or false, not {text}"
                    ))
                })?;
            }
            "max_rows_per_fragment" => {
                props.max_rows_per_fragment = text
                    .parse()
                    .ok()
                    .filter(|n| *n > 0 && *n <= format::manifest::MAX_FRAGMENT_ID)
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!(
                            "max_rows_per_fragment must be a positive integer below 2^32, not {text}"
                        ))
                    })?;
            }
            other => {
                return Err(DataFusionError::Plan(format!(
                    "unknown table option '{other}' (known: stable_row_ids, max_rows_per_fragment)"
                )));
            }
        }
    }
    Ok(props)
}

/// The values of extracted vector literals, as DataFusion plans `[x, y, ...]`: lists.
fn vector_params_values(vectors: Vec<Vec<f64>>) -> Vec<ScalarValue> {
    vectors
        .into_iter()
        .map(|v| {
            let list = datafusion::arrow::array::ListArray::from_iter_primitive::<
                datafusion::arrow::datatypes::Float64Type,
                _,
                _,
            >([Some(v.into_iter().map(Some))]);
            ScalarValue::List(Arc::new(list))
        })
        .collect()
}

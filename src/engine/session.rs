//! `FragvecSession`: a DataFusion `SessionContext` with fragvec's catalog, options and table
//! functions, and the statement front end that runs SQL against it.
//!
//! This file owns the session and the routing of statements, nothing more: [`FragvecSession::execute`]
//! matches a parsed statement once and hands its parts to the statement family that runs it,
//! in [`super::statements`]:
//! * fragvec's own statements: index statements ([`super::statements::index`]) and
//!   COMPACT / RECLUSTER / VACUUM ([`super::statements::rewrite`]), each run on the latest
//!   version and retried when a concurrent commit won;
//! * statements on fragvec tables that DataFusion would run differently: CREATE / DROP /
//!   ALTER TABLE ([`super::statements::ddl`]) and DELETE / UPDATE / MERGE, run as finder
//!   queries ([`super::statements::dml`], [`crate::sql::finder`]);
//! * everything else is planned by DataFusion after fragvec pins every table it reads to one
//!   version ([`super::statements::query`]).
//!
//! All work happens when a statement is executed.

use std::future::Future;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::SchemaProvider;
use datafusion::common::{DataFusionError, Result, plan_datafusion_err, plan_err};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ObjectType, Statement};

use super::catalog::FragvecSchema;
use super::functions;
use super::index_ops;
use super::knn_rule::KnnRule;
use super::options::FragvecOptions;
use super::plan_cache::PlanCache;
use super::statements::{ddl, dml, index, query, rewrite};
use super::udf;
use super::write::count_schema;
use crate::format::commit::retry::with_retries;
use crate::format::{Database, Snapshot};
use crate::sql::{FragvecStatement, parse_statements};

pub use super::error::is_retryable;

/// What one statement produced.
#[derive(Debug, Clone)]
pub struct StatementResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// `Some(n)` for statements that change rows (their result is one `count` row).
    pub rows_affected: Option<u64>,
}

impl StatementResult {
    pub(super) fn rows(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            schema,
            batches,
            rows_affected: None,
        }
    }

    /// The result of a statement that returns one row of its own (COMPACT, VACUUM, ...).
    pub(super) fn one_row(batch: RecordBatch) -> Self {
        Self::rows(batch.schema(), vec![batch])
    }

    pub(super) fn count(n: u64) -> Result<Self> {
        Ok(Self {
            schema: count_schema(),
            batches: vec![super::write::count_batch(n)?],
            rows_affected: Some(n),
        })
    }

    pub(super) fn empty() -> Self {
        Self::rows(Arc::new(Schema::empty()), vec![])
    }

    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

/// A SQL session over one fragvec database.
#[derive(Clone)]
pub struct FragvecSession {
    pub(super) ctx: SessionContext,
    pub(super) schema: Arc<FragvecSchema>,
    /// Physical plans of KNN queries, reused for the next query vector.
    pub(super) plans: Arc<PlanCache>,
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
        let catalog = ctx
            .catalog(&catalog_name)
            .ok_or_else(|| plan_datafusion_err!("default catalog '{catalog_name}' is missing"))?;
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
            return plan_err!("expected one statement, found {}", statements.len());
        }
        self.execute(statements.remove(0)).await
    }

    /// Runs one statement. fragvec's own statements (index, COMPACT, RECLUSTER, VACUUM) read
    /// the latest version and run again, like DML, when a concurrent commit made theirs
    /// impossible.
    pub async fn execute(&self, statement: FragvecStatement) -> Result<StatementResult> {
        if !reads_only(&statement) {
            // Anything else may change a table or how queries plan.
            self.plans.clear();
        }
        match statement {
            FragvecStatement::DataFusion(s) => self.execute_datafusion(*s).await,
            FragvecStatement::CreateVectorIndex {
                name,
                table,
                column,
                kind,
                options,
            } => {
                self.retrying(|| index::create(self, &name, &table, &column, &kind, &options))
                    .await
            }
            FragvecStatement::DropIndex {
                name,
                table,
                if_exists,
            } => {
                self.retrying(|| index::drop(self, &name, &table, if_exists))
                    .await
            }
            FragvecStatement::OptimizeIndex {
                name,
                table,
                action,
            } => {
                self.retrying(|| index::optimize(self, &name, &table, action))
                    .await
            }
            FragvecStatement::Compact { table, options } => {
                self.retrying(|| rewrite::compact(self, &table, &options))
                    .await
            }
            FragvecStatement::Recluster {
                table,
                keys,
                options,
                filter,
            } => {
                self.retrying(|| {
                    rewrite::recluster(self, &table, &keys, &options, filter.as_deref())
                })
                .await
            }
            FragvecStatement::Vacuum {
                table,
                retain_versions,
            } => {
                self.retrying(|| rewrite::vacuum(self, &table, retain_versions))
                    .await
            }
        }
    }

    /// Routes a statement DataFusion parsed: fragvec runs those it intercepts on its own
    /// tables; DataFusion plans the rest (and those on session tables).
    async fn execute_datafusion(&self, statement: DFStatement) -> Result<StatementResult> {
        let statement = match statement {
            DFStatement::Statement(s) => match *s {
                Statement::CreateTable(create) => return ddl::create_table(self, create).await,
                Statement::Drop {
                    object_type: ObjectType::Table,
                    ref names,
                    if_exists,
                    ..
                } => {
                    if let Some(r) = ddl::drop_tables(self, names, if_exists).await? {
                        return Ok(r);
                    }
                    DFStatement::Statement(s)
                }
                Statement::AlterTable(ref alter) => {
                    if let Some(r) = ddl::alter_table(self, alter).await? {
                        return Ok(r);
                    }
                    DFStatement::Statement(s)
                }
                Statement::ShowTables { .. } => {
                    self.schema.refresh().await?;
                    DFStatement::Statement(s)
                }
                ref other => {
                    if let Some(dml) = dml::Dml::of(other)
                        && let Some(r) = dml::run(self, dml).await?
                    {
                        return Ok(r);
                    }
                    DFStatement::Statement(s)
                }
            },
            DFStatement::Explain(explain) => {
                if let DFStatement::Statement(inner) = explain.statement.as_ref()
                    && let Some(dml) = dml::Dml::of(inner)
                    && let Some(r) = dml::explain(self, dml, explain.options.analyze).await?
                {
                    return Ok(r);
                }
                DFStatement::Explain(explain)
            }
            other => other,
        };
        query::run(self, statement).await
    }

    /// Runs `attempt` until it succeeds, fails with an error that is not a retryable commit
    /// conflict, or has been retried `fragvec.commit_retries` times.
    pub(super) async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        with_retries(self.options().commit_retries, |_| attempt()).await
    }

    /// The latest version of a fragvec table, which fragvec's own statements work on.
    pub(super) async fn latest_snapshot(&self, table: &str) -> Result<Snapshot> {
        index_ops::latest(self.database(), table).await
    }

    pub(super) fn options(&self) -> FragvecOptions {
        self.ctx
            .state()
            .config_options()
            .extensions
            .get::<FragvecOptions>()
            .cloned()
            .unwrap_or_default()
    }
}

/// Whether a statement only reads (a query or an EXPLAIN), so cached plans stay valid.
fn reads_only(statement: &FragvecStatement) -> bool {
    matches!(statement, FragvecStatement::DataFusion(s)
        if matches!(s.as_ref(), DFStatement::Explain(_))
            || matches!(s.as_ref(), DFStatement::Statement(q) if matches!(q.as_ref(), Statement::Query(_))))
}

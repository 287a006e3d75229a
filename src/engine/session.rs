//! `FragvecSession`: a DataFusion `SessionContext` with fragvec's catalog, options and table
//! functions, and the statement front end that runs SQL against it.
//!
//! This file owns the session (its context, catalog, plan cache) and the helpers every
//! statement uses (the retry loop, the latest snapshot, options). Running SQL —
//! `FragvecSession::sql` / `sql_one` / `execute` — is in [`super::statements`], which matches a
//! parsed statement once and hands its parts to the statement family that runs it:
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
use datafusion::common::{Result, plan_datafusion_err};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::catalog::FragvecSchema;
use super::functions;
use super::index_ops;
use super::knn_rule::KnnRule;
use super::options::FragvecOptions;
use super::plan_cache::PlanCache;
use super::udf;
use super::vector_ops::VectorOperatorPlanner;
use super::write::count_schema;
use crate::format::commit::retry::with_retries;
use crate::format::progress::{Progress, ProgressSink};
use crate::format::{Database, Snapshot};

pub use super::error::is_retryable;

/// Marks a session state whose plans run in this process only: the statements that write
/// (INSERT, CREATE TABLE AS, the finder queries of DELETE / UPDATE / MERGE). A query planner
/// that spreads queries over workers (`crate::distributed`) plans these locally; DataFusion's
/// own planner ignores the mark.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoordinatorOnly;

pub use super::options::progress_of;

/// What one statement produced.
#[derive(Debug, Clone)]
pub struct StatementResult {
    /// The columns of its rows.
    pub schema: SchemaRef,
    /// Its rows, as batches of `schema`.
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

    /// No columns, no rows: what DDL answers.
    pub fn empty() -> Self {
        Self::rows(Arc::new(Schema::empty()), vec![])
    }

    /// How many rows it has.
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

/// Plans pgvector's `<=>` by operand type (once per context).
fn register_vector_operators(ctx: &SessionContext) -> Result<()> {
    use datafusion::execution::FunctionRegistry;
    let state = ctx.state_ref();
    let mut state = state.write();
    let name = format!("{VectorOperatorPlanner:?}");
    if !state
        .expr_planners()
        .iter()
        .any(|p| format!("{p:?}") == name)
    {
        state.register_expr_planner(Arc::new(VectorOperatorPlanner))?;
    }
    Ok(())
}

impl FragvecSession {
    /// Opens a session on the database at `location`.
    pub async fn open(location: &str) -> Result<Self> {
        let config = SessionConfig::new().with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        register(&ctx, location).await
    }

    /// Makes `ctx` a fragvec session over `db` (an index cache of its own).
    pub async fn with_context(ctx: SessionContext, db: Database) -> Result<Self> {
        let schema = Arc::new(FragvecSchema::open(db).await?);
        Self::with_schema(ctx, schema).await
    }

    /// A new session on the same database sharing this session's index cache (one byte
    /// budget for both), with state of its own: its `SET` values, session tables and kept
    /// plans. A server opens one per connection.
    pub async fn new_sharing(&self) -> Result<Self> {
        let config = SessionConfig::new().with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        let db = self.database().clone();
        let schema =
            Arc::new(FragvecSchema::open_sharing(db, self.schema.index_cache().clone()).await?);
        Self::with_schema(ctx, schema).await
    }

    async fn with_schema(ctx: SessionContext, schema: Arc<FragvecSchema>) -> Result<Self> {
        let db = schema.database().clone();
        {
            let state = ctx.state_ref();
            let mut state = state.write();
            let options = state.config_mut().options_mut();
            if options.extensions.get::<FragvecOptions>().is_none() {
                options.extensions.insert(FragvecOptions::default());
            }
        }
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
        // Views are planned with the session's state as it is when a query uses them.
        let state = ctx.state_weak_ref();
        schema.set_state(move || state.upgrade().map(|s| s.read().clone()));
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
        register_vector_operators(&ctx)?;
        Ok(Self {
            ctx,
            schema,
            plans: Arc::default(),
        })
    }

    /// Lets this session keep the plans of repeated KNN queries that hold `nodes`, made by a
    /// planner above the engine (see [`super::plan_cache::ForeignNodes`]).
    pub fn keep_plans_holding(&self, nodes: Arc<dyn super::plan_cache::ForeignNodes>) {
        self.plans.set_foreign(nodes);
    }

    /// How many queries ran on a reused physical plan (see [`super::plan_cache`]).
    pub fn plans_reused(&self) -> u64 {
        self.plans.reused()
    }

    /// How many queries were answered on a kept plan without being parsed: a text of the
    /// same shape as an earlier one (only its vector literals differ), see
    /// `engine::statements::shapes`.
    pub fn shapes_reused(&self) -> u64 {
        self.plans.shapes_reused()
    }

    /// The DataFusion context, for registering more functions or tables.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The database it runs over.
    pub fn database(&self) -> &Database {
        self.schema.database()
    }

    /// The index cache this session's queries use (shared with the sessions it shares a
    /// database handle with): its budget and the bytes it holds.
    pub fn index_cache(&self) -> &Arc<crate::index::cache::IndexCache> {
        self.schema.index_cache()
    }

    /// Lists the database's tables again (tables other processes created or dropped), for
    /// front ends that show the list (a Flight SQL server's GetTables).
    pub async fn refresh_tables(&self) -> Result<()> {
        self.schema.refresh().await
    }

    /// Reports the progress of long statements (CREATE VECTOR INDEX, OPTIMIZE INDEX, COMPACT,
    /// RECLUSTER, INSERT / CREATE TABLE AS, VACUUM) run by this session and its clones to
    /// `sink`, phase by phase (see [`crate::format::progress`]).
    pub fn set_progress(&self, sink: Arc<dyn ProgressSink>) {
        self.set_progress_handle(Progress::to(sink));
    }

    /// Stops reporting progress.
    pub fn clear_progress(&self) {
        self.set_progress_handle(Progress::none());
    }

    /// Kept as an extension of the session's configuration, so plans executing with the
    /// session's task context (INSERT) find it as well as fragvec's own statements.
    fn set_progress_handle(&self, progress: Progress) {
        let state = self.ctx.state_ref();
        state.write().config_mut().set_extension(Arc::new(progress));
    }

    /// Where this session's statements report progress.
    pub fn progress(&self) -> Progress {
        progress_of(self.ctx.state_ref().read().config())
    }

    /// Runs `attempt` until it succeeds, fails with an error that is not a retryable commit
    /// conflict, or has been retried `fragvec.commit_retries` times (its error then says so).
    pub(super) async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let retries = self.options().commit_retries;
        with_retries(retries, |_| attempt())
            .await
            .map_err(|e| super::error::after_retries(e, retries))
    }

    /// The latest version of a fragvec table, which fragvec's own statements work on.
    pub(super) async fn latest_snapshot(&self, table: &str) -> Result<Snapshot> {
        index_ops::latest(self.database(), table).await
    }

    /// The session state with round-robin repartitioning off: it would shuffle the rows of a
    /// single-partition source, and INSERT / CREATE TABLE AS keep their source's order (the
    /// logical order is the order given).
    pub(super) fn order_preserving_state(&self) -> datafusion::execution::SessionState {
        let mut state = self.coordinator_state();
        state
            .config_mut()
            .options_mut()
            .optimizer
            .enable_round_robin_repartition = false;
        state
    }

    /// The session state marked [`CoordinatorOnly`]: its plans run in this process.
    pub(super) fn coordinator_state(&self) -> datafusion::execution::SessionState {
        let mut state = self.ctx.state();
        state.config_mut().set_extension(Arc::new(CoordinatorOnly));
        state
    }

    /// Gives the database the session's `fragvec.version_check_ms` (it may have changed with
    /// a `SET` since the last statement).
    pub(super) fn apply_version_check(&self) {
        let ms = self
            .ctx
            .state_ref()
            .read()
            .config_options()
            .extensions
            .get::<FragvecOptions>()
            .and_then(|o| o.version_check_ms);
        self.schema
            .database()
            .set_version_check(ms.map(std::time::Duration::from_millis));
    }

    pub(super) fn options(&self) -> FragvecOptions {
        // Read under the state's lock: `ctx.state()` would copy the whole session state.
        self.ctx
            .state_ref()
            .read()
            .config_options()
            .extensions
            .get::<FragvecOptions>()
            .cloned()
            .unwrap_or_default()
    }
}

//! Running SQL: `FragvecSession::sql`, `sql_one` and `execute` route each parsed statement
//! once, passing the parts they already matched to one file per statement family; every
//! function there runs one statement (or one attempt of it, for those the session retries)
//! and returns its [`StatementResult`]. The session itself ([`super::session`]) knows nothing
//! of the families, so the arrows point one way: routing → families → session.
//!
//! * [`ddl`]: CREATE TABLE (with `VECTOR(n)` columns, `WITH` properties, `CLUSTER BY`),
//!   DROP TABLE, ALTER TABLE ... CLUSTER BY / DROP CLUSTERING KEY;
//! * [`dml`]: DELETE / UPDATE / MERGE as finder queries, their EXPLAIN, and their retry;
//! * [`query`]: everything DataFusion plans: pinning to table versions, `knn(...)` calls,
//!   vector literals as parameters, and reuse of cached KNN plans;
//! * [`shapes`]: a repeated KNN text answered on its kept plan without parsing;
//! * [`stream`]: a query's rows handed to the caller as a stream instead of collected;
//! * [`index`]: CREATE VECTOR INDEX / DROP INDEX / OPTIMIZE INDEX, thin calls into
//!   [`super::index_ops`];
//! * [`views`]: CREATE VIEW / DROP VIEW, views stored in the database;
//! * [`rewrite`]: COMPACT / RECLUSTER / VACUUM, thin calls into [`super::maintenance`] and
//!   [`super::recluster`].

pub mod ddl;
pub mod dml;
pub mod index;
pub mod query;
pub mod rewrite;
pub mod shapes;
pub mod stream;
pub mod views;

use datafusion::catalog::SchemaProvider;
use datafusion::common::{DataFusionError, Result, plan_datafusion_err, plan_err};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ObjectType, Statement};
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use super::session::{FragvecSession, StatementResult};
use crate::sql::{FragvecStatement, parse_statements_in};

impl FragvecSession {
    /// Runs every statement in `sql`, in order, and returns their results. Stops at the first
    /// error, which names the statement's position when there are several.
    pub async fn sql(&self, sql: &str) -> Result<Vec<StatementResult>> {
        let shape = shapes::of(sql);
        if let Some(r) = shapes::run_known(self, shape.as_ref()).await? {
            return Ok(vec![r]);
        }
        let mut statements = self.parse(sql)?;
        if statements.len() == 1 {
            return Ok(vec![self.run_learning(shape, statements.remove(0)).await?]);
        }
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
        let shape = shapes::of(sql);
        if let Some(r) = shapes::run_known(self, shape.as_ref()).await? {
            return Ok(r);
        }
        let mut statements = self.parse(sql)?;
        if statements.len() != 1 {
            return plan_err!("expected one statement, found {}", statements.len());
        }
        self.run_learning(shape, statements.remove(0)).await
    }

    /// For a front end that parses statement texts itself (`fragvec serve`): the result of
    /// the one statement of `sql` when the kept plan of its shape answers it, without parsing
    /// it (see [`shapes`]); `None` when it must be parsed and run with
    /// [`Self::execute_text`].
    pub async fn run_known_shape(&self, sql: &str) -> Result<Option<StatementResult>> {
        shapes::run_known(self, shapes::of(sql).as_ref()).await
    }

    /// [`Self::run_known_shape`] for a text already in its shape (see
    /// [`crate::sql::vector_shape::shape_with_lists`]).
    pub async fn run_shape(
        &self,
        shape: &crate::sql::vector_shape::Shape,
    ) -> Result<Option<StatementResult>> {
        shapes::run_known(self, Some(shape)).await
    }

    /// Runs `statement`, the only statement of `sql`, remembering the shape of `sql` when it
    /// ran on a kept plan, so that [`Self::run_known_shape`] answers the next text of it.
    pub async fn execute_text(
        &self,
        sql: &str,
        statement: FragvecStatement,
    ) -> Result<StatementResult> {
        self.run_learning(shapes::of(sql), statement).await
    }

    /// Runs the one statement of a text of `shape`, remembering the shape when the statement
    /// ran on a kept plan (see [`shapes`]).
    async fn run_learning(
        &self,
        shape: Option<crate::sql::vector_shape::Shape>,
        statement: FragvecStatement,
    ) -> Result<StatementResult> {
        let note = crate::engine::plan_cache::ShapeNote::default();
        let result = self.execute_noting(statement, Some(&note)).await?;
        shapes::remember(self, shape, note);
        Ok(result)
    }

    /// Parses `sql` in the session's dialect (`SET datafusion.sql_parser.dialect = ...`), as
    /// DataFusion's own `SessionContext::sql` does.
    pub fn parse(&self, sql: &str) -> Result<Vec<FragvecStatement>> {
        let options = self
            .ctx
            .state_ref()
            .read()
            .config_options()
            .sql_parser
            .clone();
        let dialect = dialect_from_str(options.dialect).ok_or_else(|| {
            plan_datafusion_err!(
                "Unsupported SQL dialect: {}. Available dialects: {}.",
                options.dialect,
                datafusion::config::Dialect::available()
            )
        })?;
        parse_statements_in(sql, dialect.as_ref(), options.recursion_limit.get())
    }

    /// Runs one statement. fragvec's own statements (index, COMPACT, RECLUSTER, VACUUM) read
    /// the latest version and run again, like DML, when a concurrent commit made theirs
    /// impossible.
    pub async fn execute(&self, statement: FragvecStatement) -> Result<StatementResult> {
        self.execute_noting(statement, None).await
    }

    /// [`Self::execute`], letting a query note what its shape may reuse. An error naming a
    /// table that does not exist suggests the closest table name.
    async fn execute_noting(
        &self,
        statement: FragvecStatement,
        note: Option<&crate::engine::plan_cache::ShapeNote>,
    ) -> Result<StatementResult> {
        self.execute_statement(statement, note).await.map_err(|e| {
            crate::engine::catalog::with_closest_table(e, || self.schema.table_names())
        })
    }

    async fn execute_statement(
        &self,
        statement: FragvecStatement,
        note: Option<&crate::engine::plan_cache::ShapeNote>,
    ) -> Result<StatementResult> {
        self.apply_version_check();
        if !reads_only(&statement) {
            // Anything else may change a table or how queries plan.
            self.plans.clear();
        }
        match statement {
            FragvecStatement::DataFusion(s) => self.execute_datafusion(*s, note).await,
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
            // Boxed: a round's future is large, and inlined it would grow every statement's.
            FragvecStatement::AlterTableProperties { table, changes } => {
                Box::pin(crate::engine::maintain::alter_properties(
                    self, &table, &changes,
                ))
                .await
            }
            FragvecStatement::Maintain { table, options } => {
                Box::pin(crate::engine::maintain::maintain_statement(
                    self, &table, &options,
                ))
                .await
            }
        }
    }

    /// Routes a statement DataFusion parsed: fragvec runs those it intercepts on its own
    /// tables; DataFusion plans the rest (and those on session tables).
    async fn execute_datafusion(
        &self,
        statement: DFStatement,
        note: Option<&crate::engine::plan_cache::ShapeNote>,
    ) -> Result<StatementResult> {
        let statement = match statement {
            DFStatement::Statement(s) => match *s {
                Statement::CreateTable(create) => return ddl::create_table(self, create).await,
                Statement::CreateView(ref view) => {
                    if let Some(r) = views::create_view(self, view).await? {
                        return Ok(r);
                    }
                    DFStatement::Statement(s)
                }
                Statement::Drop {
                    object_type: ObjectType::View,
                    ref names,
                    if_exists,
                    ..
                } => {
                    if let Some(r) = views::drop_views(self, names, if_exists).await? {
                        return Ok(r);
                    }
                    DFStatement::Statement(s)
                }
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
        query::run(self, statement, note).await
    }
}

/// The columns fragvec's own statement `statement` answers with, known before it runs (no
/// columns: a status only); `None` for a statement DataFusion parsed (plan it to know). What
/// the Postgres endpoint describes a prepared statement with.
pub fn result_schema(
    statement: &FragvecStatement,
) -> Option<datafusion::arrow::datatypes::SchemaRef> {
    use crate::engine::maintenance::{COMPACT_COLUMNS, VACUUM_COLUMNS, u64_schema};
    Some(match statement {
        FragvecStatement::DataFusion(_) => return None,
        FragvecStatement::CreateVectorIndex { .. }
        | FragvecStatement::DropIndex { .. }
        | FragvecStatement::OptimizeIndex { .. } => crate::engine::write::count_schema(),
        FragvecStatement::Compact { .. } => u64_schema(&COMPACT_COLUMNS),
        FragvecStatement::Recluster { .. } => {
            u64_schema(&crate::engine::recluster::RECLUSTER_COLUMNS)
        }
        FragvecStatement::Vacuum { .. } => u64_schema(&VACUUM_COLUMNS),
        FragvecStatement::AlterTableProperties { .. } => StatementResult::empty().schema,
        FragvecStatement::Maintain { .. } => crate::maintain::journal::journal_schema(),
    })
}

/// Whether a statement only reads (a query or an EXPLAIN), so cached plans stay valid.
fn reads_only(statement: &FragvecStatement) -> bool {
    matches!(statement, FragvecStatement::DataFusion(s)
        if matches!(s.as_ref(), DFStatement::Explain(_))
            || matches!(s.as_ref(), DFStatement::Statement(q) if matches!(q.as_ref(), Statement::Query(_))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of fragvec's own statements answers exactly the columns [`result_schema`] says
    /// before it runs (what a client that describes a prepared statement is told).
    #[tokio::test]
    async fn result_schemas_are_what_statements_answer() {
        let session = FragvecSession::open("memory://result-schemas")
            .await
            .unwrap();
        session
            .sql(
                "CREATE TABLE t (id BIGINT, emb VECTOR(2)); \
                 INSERT INTO t VALUES (1, [0, 1]), (2, [1, 0]); \
                 INSERT INTO t VALUES (3, [1, 1]), (4, [2, 0]);",
            )
            .await
            .unwrap();
        for sql in [
            "CREATE VECTOR INDEX ix ON t (emb) USING IVF_FLAT WITH (num_partitions = 1)",
            "INSERT INTO t VALUES (5, [3, 3])",
            "OPTIMIZE INDEX ix ON t APPEND",
            "COMPACT t",
            "RECLUSTER t BY (id)",
            "VACUUM t RETAIN 2 VERSIONS",
            "ALTER TABLE t SET (auto_compact = off)",
            "MAINTAIN t",
            "DROP INDEX ix ON t",
        ] {
            let statement = session.parse(sql).unwrap().remove(0);
            let expected = result_schema(&statement);
            let answered = session.execute(statement).await.unwrap();
            if sql.starts_with("INSERT") {
                assert!(expected.is_none(), "{sql}");
                continue;
            }
            assert_eq!(expected.as_deref(), Some(answered.schema.as_ref()), "{sql}");
        }
    }
}

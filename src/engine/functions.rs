//! Introspection table functions: `fragvec_fragments('t')`, `fragvec_versions('t')`,
//! `fragvec_indexes('t')`, `fragvec_segments('t')` and `fragvec_ledger('t')`.
//!
//! Table functions are called synchronously while a query is planned, so they return a
//! provider with a fixed schema and do their reading when the query is executed. The batches
//! themselves come from `format::introspect` and `index::introspect`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;

use super::computed::{ComputedBatch, ComputedTable};
use crate::format::Database;
use crate::format::introspect::TableView;
use crate::index::introspect::{indexes_batch, indexes_schema};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Table(TableView),
    Indexes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Table(TableView::Fragments) => "fragvec_fragments",
            Kind::Table(TableView::Versions) => "fragvec_versions",
            Kind::Indexes => "fragvec_indexes",
            Kind::Table(TableView::Segments) => "fragvec_segments",
            Kind::Table(TableView::Ledger) => "fragvec_ledger",
        }
    }

    fn schema(self) -> SchemaRef {
        match self {
            Kind::Table(view) => view.schema(),
            Kind::Indexes => indexes_schema(),
        }
    }
}

pub fn register(ctx: &SessionContext, db: &Database) {
    ctx.register_udtf(
        "recluster_information",
        Arc::new(super::recluster::ReclusterInformation { db: db.clone() }),
    );
    for kind in [
        Kind::Table(TableView::Fragments),
        Kind::Table(TableView::Versions),
        Kind::Indexes,
        Kind::Table(TableView::Segments),
        Kind::Table(TableView::Ledger),
    ] {
        ctx.register_udtf(
            kind.name(),
            Arc::new(Introspect {
                db: db.clone(),
                kind,
            }),
        );
    }
}

#[derive(Debug)]
struct Introspect {
    db: Database,
    kind: Kind,
}

impl TableFunctionImpl for Introspect {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let table = match args.exprs() {
            [Expr::Literal(ScalarValue::Utf8(Some(t)) | ScalarValue::Utf8View(Some(t)), _)] => {
                t.clone()
            }
            _ => {
                return plan_err!(
                    "{}('table') takes one string argument: the table name",
                    self.kind.name()
                );
            }
        };
        self.db.table(&table)?;
        Ok(Arc::new(ComputedTable(IntrospectTable {
            db: self.db.clone(),
            kind: self.kind,
            table,
        })))
    }
}

#[derive(Debug)]
struct IntrospectTable {
    db: Database,
    kind: Kind,
    table: String,
}

impl IntrospectTable {
    async fn batch(&self) -> Result<RecordBatch> {
        let dir = Arc::new(self.db.table(&self.table)?);
        Ok(match self.kind {
            Kind::Table(view) => view.batch(&dir).await?,
            Kind::Indexes => indexes_batch(&dir.latest().await?).await?,
        })
    }
}

#[async_trait]
impl ComputedBatch for IntrospectTable {
    fn schema(&self) -> SchemaRef {
        self.kind.schema()
    }

    async fn compute(&self) -> Result<RecordBatch> {
        self.batch().await
    }
}

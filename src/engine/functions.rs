//! Introspection table functions: `fragvec_fragments('t')`, `fragvec_versions('t')`,
//! `fragvec_indexes('t')`, `fragvec_segments('t')`, `fragvec_ledger('t')`,
//! `fragvec_properties('t')` and `fragvec_maintenance('t')`.
//!
//! Table functions are called synchronously while a query is planned, so they return a
//! provider with a fixed schema and do their reading when the query is executed. The batches
//! themselves come from `format::introspect` and `index::introspect`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;

use super::computed::{ComputedBatch, ComputedTable};
use crate::format::Database;
use crate::format::introspect::TableView;
use crate::format::manifest::{Manifest, TableProperties};
use crate::index::introspect::{indexes_batch, indexes_schema};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Table(TableView),
    Indexes,
    /// The table's properties, maintenance policy included.
    Properties,
    /// The maintenance journal: past and running tasks.
    Maintenance,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Table(TableView::Fragments) => "fragvec_fragments",
            Kind::Table(TableView::Versions) => "fragvec_versions",
            Kind::Indexes => "fragvec_indexes",
            Kind::Table(TableView::Segments) => "fragvec_segments",
            Kind::Table(TableView::Ledger) => "fragvec_ledger",
            Kind::Properties => "fragvec_properties",
            Kind::Maintenance => "fragvec_maintenance",
        }
    }

    fn schema(self) -> SchemaRef {
        match self {
            Kind::Table(view) => view.schema(),
            Kind::Indexes => indexes_schema(),
            Kind::Properties => properties_schema(),
            Kind::Maintenance => crate::maintain::journal::journal_schema(),
        }
    }
}

/// Registers fragvec's table functions (`recluster_information`, `fragvec_maintenance`, ...)
/// over `db` in `ctx`.
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
        Kind::Properties,
        Kind::Maintenance,
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
            Kind::Properties => properties_batch(&dir.latest().await?.manifest)?,
            Kind::Maintenance => {
                // Only a table that exists has a journal worth reading.
                dir.latest().await?;
                crate::maintain::journal::journal_batch(
                    &crate::maintain::journal::read(&dir).await?,
                )?
            }
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

fn properties_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
        Field::new("is_default", DataType::Boolean, false),
    ]))
}

/// Every table property with its value and whether it is the default.
pub fn properties(m: &Manifest) -> Vec<(String, String, bool)> {
    let p = &m.properties;
    let d = TableProperties::default();
    let mut out = vec![
        (
            "stable_row_ids".to_string(),
            p.stable_row_ids.to_string(),
            p.stable_row_ids == d.stable_row_ids,
        ),
        (
            "max_rows_per_fragment".to_string(),
            p.max_rows_per_fragment.to_string(),
            p.max_rows_per_fragment == d.max_rows_per_fragment,
        ),
        (
            "cluster_by".to_string(),
            p.cluster_by.join(", "),
            p.cluster_by.is_empty(),
        ),
    ];
    let defaults = d.maintenance.entries();
    for ((name, value), (_, default)) in p.maintenance.entries().into_iter().zip(defaults) {
        let is_default = value == default;
        out.push((name.to_string(), value, is_default));
    }
    out
}

fn properties_batch(m: &Manifest) -> Result<RecordBatch> {
    let rows = properties(m);
    Ok(RecordBatch::try_new(
        properties_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.1.as_str()),
            )),
            Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.2)))),
        ],
    )?)
}

//! `FragvecTable`: a `TableProvider` over one table snapshot.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{
    Column, Constraint, Constraints, DFSchema, DataFusionError, Result, not_impl_datafusion_err,
    not_impl_err, plan_err,
};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;

use super::scan::{FragmentScanExec, ROW_ADDR, ROW_ID, ScanSpec, VirtualColumns};
use super::write::InsertExec;
use crate::format::Snapshot;
use crate::format::manifest::KeyConstraint;
use crate::index::cache::IndexCache;

/// A fragvec table at one version, as DataFusion's `TableProvider`: scans, inserts and
/// the KNN rule's target.
#[derive(Debug)]
pub struct FragvecTable {
    snapshot: Snapshot,
    virtual_columns: VirtualColumns,
    /// Table columns followed by the virtual columns this provider exposes.
    schema: SchemaRef,
    index_cache: Arc<IndexCache>,
    /// The table's `PRIMARY KEY` / `UNIQUE` constraints, for the planner.
    constraints: Constraints,
    /// `DEFAULT` expressions by column, planned by the catalog (see [`Self::with_column_defaults`]).
    column_defaults: HashMap<String, Expr>,
}

impl FragvecTable {
    /// The table at `snapshot`, with `virtual_columns` added to its schema, searching through
    /// `index_cache`.
    pub fn new(
        snapshot: Snapshot,
        virtual_columns: VirtualColumns,
        index_cache: Arc<IndexCache>,
    ) -> Self {
        let mut fields: Vec<Field> = snapshot
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if virtual_columns.row_addr {
            fields.push(Field::new(ROW_ADDR, DataType::UInt64, false));
        }
        if virtual_columns.row_id {
            fields.push(Field::new(ROW_ID, DataType::UInt64, false));
        }
        let schema = Arc::new(Schema::new(fields));
        let constraints = table_constraints(&snapshot.manifest.properties.constraints, &schema);
        Self {
            snapshot,
            virtual_columns,
            schema,
            index_cache,
            constraints,
            column_defaults: HashMap::new(),
        }
    }

    /// The planned `DEFAULT` expressions of the table's columns.
    pub fn with_column_defaults(mut self, defaults: HashMap<String, Expr>) -> Self {
        self.column_defaults = defaults;
        self
    }

    /// The version it reads.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The virtual columns this provider exposes.
    pub fn virtual_columns(&self) -> VirtualColumns {
        self.virtual_columns
    }

    /// Builds the scan plan for a projection (indices into [`Self::schema`]), filters and limit.
    pub fn scan_spec(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<ScanSpec> {
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let projection = projection.unwrap_or(&all);
        let filters: Vec<Expr> = filters
            .iter()
            .map(|f| unqualify(f.clone()))
            .collect::<Result<_>>()?;
        let mut needed: Vec<bool> = vec![false; self.schema.fields().len()];
        for &i in projection {
            needed[i] = true;
        }
        for f in &filters {
            for c in f.column_refs() {
                let i = self.schema.index_of(&c.name)?;
                needed[i] = true;
            }
        }
        let table_cols = self.snapshot.schema.fields().len();
        let read_indices: Vec<usize> = (0..table_cols).filter(|&i| needed[i]).collect();
        let read_schema = Arc::new(self.snapshot.schema.project(&read_indices)?);
        let wants = |name: &str| self.schema.index_of(name).is_ok_and(|i| needed[i]);
        let virtual_columns = VirtualColumns {
            row_addr: wants(ROW_ADDR),
            row_id: wants(ROW_ID),
        };
        let mut work_fields: Vec<Field> = read_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if virtual_columns.row_addr {
            work_fields.push(Field::new(ROW_ADDR, DataType::UInt64, false));
        }
        if virtual_columns.row_id {
            work_fields.push(Field::new(ROW_ID, DataType::UInt64, false));
        }
        let work_schema = Arc::new(Schema::new(work_fields));
        let output_indices = projection
            .iter()
            .map(|&i| work_schema.index_of(self.schema.field(i).name()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let predicate = match conjunction(filters) {
            Some(expr) => {
                let df_schema = DFSchema::try_from(work_schema.as_ref().clone())?;
                Some(state.create_physical_expr(expr, &df_schema)?)
            }
            None => None,
        };
        Ok(ScanSpec {
            snapshot: self.snapshot.clone(),
            read_schema,
            work_schema,
            virtual_columns,
            predicate,
            output_indices,
            limit,
        })
    }
}

/// Strips table qualifiers from column references (the scan schema is unqualified).
fn unqualify(expr: Expr) -> Result<Expr> {
    expr.transform(|e| match e {
        Expr::Column(c) if c.relation.is_some() => Ok(Transformed::yes(Expr::Column(
            Column::new_unqualified(c.name),
        ))),
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

#[async_trait]
impl TableProvider for FragvecTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.constraints)
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.column_defaults.get(column)
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // The scan evaluates every deterministic filter completely, so they are exact.
        Ok(filters
            .iter()
            .map(|f| {
                if f.is_volatile() {
                    TableProviderFilterPushDown::Unsupported
                } else {
                    TableProviderFilterPushDown::Exact
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let spec = self.scan_spec(state, projection, filters, limit)?;
        Ok(Arc::new(
            FragmentScanExec::new(spec)?.with_index_cache(self.index_cache.clone()),
        ))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return not_impl_err!(
                "{insert_op} is not supported by fragvec tables; use DELETE then INSERT"
            );
        }
        if self.virtual_columns != VirtualColumns::default() {
            return plan_err!("cannot insert into virtual columns");
        }
        Ok(Arc::new(InsertExec::new(self.snapshot.clone(), input)))
    }

    async fn delete_from(
        &self,
        _state: &dyn Session,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(dml_through_front_end("DELETE"))
    }

    async fn update(
        &self,
        _state: &dyn Session,
        _assignments: Vec<(String, Expr)>,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(dml_through_front_end("UPDATE"))
    }
}

/// The recorded constraints as DataFusion's, by column index (a constraint naming a column
/// the table no longer has is dropped rather than misapplied).
fn table_constraints(recorded: &[KeyConstraint], schema: &Schema) -> Constraints {
    let constraints = recorded
        .iter()
        .filter_map(|c| {
            let indices = c
                .columns
                .iter()
                .map(|name| schema.index_of(name).ok())
                .collect::<Option<Vec<usize>>>()?;
            Some(if c.primary_key {
                Constraint::PrimaryKey(indices)
            } else {
                Constraint::Unique(indices)
            })
        })
        .collect();
    Constraints::new_unverified(constraints)
}

/// DataFusion 55 hands `delete_from`/`update` an empty filter list (meaning "all rows") for
/// predicates with subqueries. Rather than risk deleting everything, fragvec runs DML only
/// through its own front end, which evaluates the full predicate.
fn dml_through_front_end(op: &str) -> DataFusionError {
    not_impl_datafusion_err!(
        "{op} on a fragvec table must go through fragvec's SQL front end \
         (FragvecSession::sql), which evaluates subqueries in the predicate exactly"
    )
}

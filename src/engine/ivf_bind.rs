//! `ivf_partition(col)` in ordinary queries: `SELECT id, ivf_partition(emb) FROM t`,
//! `... GROUP BY ivf_partition(emb)`, `WHERE ivf_partition(emb) = 3`, `ORDER BY ...`.
//!
//! The session's `ivf_partition` is unbound (it knows no index). Once a query is planned, each
//! call on a column of a fragvec table is bound to the vector index on that column, as of the
//! version the query reads: rows the index holds get the partition it assigned them (from
//! its segments' address lists, [`crate::index::assigned`]), the others (new rows, rows
//! rewritten in place) their nearest centroid. That needs each row's address, so the table's
//! scan also reads `_rowaddr` and every node between it and the call passes it on; the
//! query's output columns do not change (a bound call keeps the name the call had).
//!
//! Supported where a call can see its table's rows: SELECT lists, WHERE, GROUP BY, HAVING,
//! ORDER BY, join conditions and subqueries, on a column read from the table under the
//! table's name (or alias): not through a view or an aliased derived table, not above an
//! aggregation of the table, not in window functions.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result, TableReference, plan_err};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Expr, LogicalPlan, Projection, ScalarUDF, TableScan, TableScanBuilder,
};

use super::provider::FragvecTable;
use super::recluster::bound_ivf_partition;
use super::scan::{ROW_ADDR, VirtualColumns};
use crate::index::cache::IndexCache;

const NAME: &str = "ivf_partition";

/// The column of an unbound `ivf_partition(col)` call.
fn unbound_call(e: &Expr) -> Option<&Expr> {
    match e {
        Expr::ScalarFunction(f) if f.func.name() == NAME && f.args.len() == 1 => f.args.first(),
        _ => None,
    }
}

/// The `(qualifier, column)` of every unbound call in `exprs`.
fn calls_in<'a>(
    exprs: impl IntoIterator<Item = &'a Expr>,
) -> Result<BTreeSet<(TableReference, String)>> {
    let mut out = BTreeSet::new();
    for expr in exprs {
        expr.apply(|e| {
            if let Some(arg) = unbound_call(e) {
                match arg {
                    Expr::Column(Column {
                        relation: Some(q),
                        name,
                        ..
                    }) => {
                        out.insert((q.clone(), name.clone()));
                    }
                    other => {
                        return plan_err!(
                            "ivf_partition takes a vector column of a fragvec table, not {other}"
                        );
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    Ok(out)
}

/// Binds every `ivf_partition(col)` call of `plan` (see the module docs). Plans without one
/// are returned as they are.
pub async fn bind_ivf_partitions(
    plan: LogicalPlan,
    cache: &Arc<IndexCache>,
) -> Result<LogicalPlan> {
    let mut calls = BTreeSet::new();
    plan.apply_with_subqueries(|node| {
        calls.extend(calls_in(node.expressions().iter())?);
        Ok(TreeNodeRecursion::Continue)
    })?;
    if calls.is_empty() {
        return Ok(plan);
    }
    // The scan behind each qualifier, and a function bound to its index for each column.
    let mut bound: HashMap<(TableReference, String), Arc<ScalarUDF>> = HashMap::new();
    for (qualifier, column) in &calls {
        let Some(table) = fragvec_table_named(&plan, qualifier)? else {
            return plan_err!(
                "ivf_partition(col) needs col to be a vector column of a fragvec table with a \
                 vector index, read by the same query block (not through a view or a derived \
                 table); {qualifier} is not such a table"
            );
        };
        let Some(table) = table.downcast_ref::<FragvecTable>() else {
            return plan_err!("ivf_partition: {qualifier} is not a fragvec table");
        };
        let udf = bound_ivf_partition(table.snapshot(), column, cache).await?;
        bound.insert((qualifier.clone(), column.clone()), udf);
    }
    let binder = Binder { bound, cache };
    let output = plan.schema().clone();
    let threaded = binder.thread(plan, &BTreeSet::new())?;
    if threaded.schema().fields().len() == output.fields().len() {
        return Ok(threaded);
    }
    // A root that passes its input through (no projection on top) shows the columns it had.
    let columns = output.columns().into_iter().map(Expr::Column).collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        columns,
        Arc::new(threaded),
    )?))
}

/// The fragvec table scanned under `qualifier`: a scan of that name, or the scan a
/// `SubqueryAlias` of that name (which pinning adds) wraps.
fn fragvec_table_named(
    plan: &LogicalPlan,
    qualifier: &TableReference,
) -> Result<Option<Arc<dyn datafusion::catalog::TableProvider>>> {
    let mut found = None;
    plan.apply_with_subqueries(|node| {
        let scan = match node {
            LogicalPlan::TableScan(s) if &s.table_name == qualifier => Some(s),
            LogicalPlan::SubqueryAlias(a) if &a.alias == qualifier => match a.input.as_ref() {
                LogicalPlan::TableScan(s) => Some(s),
                _ => None,
            },
            _ => None,
        };
        if let Some(scan) = scan {
            let provider = source_as_provider(&scan.source)?;
            if provider.downcast_ref::<FragvecTable>().is_some() {
                found = Some(provider);
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

struct Binder<'a> {
    bound: HashMap<(TableReference, String), Arc<ScalarUDF>>,
    cache: &'a Arc<IndexCache>,
}

impl Binder<'_> {
    /// Rewrites `plan` so that its output carries `<q>._rowaddr` for every `q` in `needs`
    /// (qualifiers its ancestors call `ivf_partition` on), and its own calls are bound.
    fn thread(&self, plan: LogicalPlan, needs: &BTreeSet<TableReference>) -> Result<LogicalPlan> {
        let own: BTreeSet<TableReference> = calls_in(plan.expressions().iter())?
            .into_iter()
            .map(|(q, _)| q)
            .collect();
        let below: BTreeSet<TableReference> = needs.union(&own).cloned().collect();
        match &plan {
            LogicalPlan::Aggregate(_) if !needs.is_empty() => {
                return plan_err!(
                    "ivf_partition over an aggregation of its table: call it in the GROUP BY"
                );
            }
            LogicalPlan::Window(_) if !own.is_empty() => {
                return plan_err!("ivf_partition is not supported in window functions");
            }
            _ => {}
        }
        // Every child and subquery is visited: calls may sit anywhere below.
        let plan = plan
            .map_subqueries(|sub| self.thread(sub, &BTreeSet::new()).map(Transformed::yes))?
            .data;
        let plan = match plan {
            LogicalPlan::TableScan(scan) if below.contains(&scan.table_name) => {
                return self.scan_with_row_addr(scan);
            }
            LogicalPlan::SubqueryAlias(alias) => {
                let inner = if below.contains(&alias.alias) {
                    qualifiers(alias.input.as_ref())
                } else {
                    BTreeSet::new()
                };
                let input = self.thread(Arc::unwrap_or_clone(alias.input), &inner)?;
                LogicalPlan::SubqueryAlias(datafusion::logical_expr::SubqueryAlias::try_new(
                    Arc::new(input),
                    alias.alias,
                )?)
            }
            other => {
                other
                    .map_children(|child| {
                        let has = qualifiers(&child);
                        let wanted: BTreeSet<TableReference> =
                            below.intersection(&has).cloned().collect();
                        self.thread(child, &wanted).map(Transformed::yes)
                    })?
                    .data
            }
        };
        let named = matches!(plan, LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_));
        let plan = if own.is_empty() {
            plan
        } else {
            plan.map_expressions(|e| {
                let name = e.schema_name().to_string();
                let bound = e.transform_up(|e| self.bind(e))?;
                if !bound.transformed || !named {
                    return Ok(bound);
                }
                // Projected and grouped expressions keep their names: parents refer to them.
                Ok(Transformed::yes(bound.data.alias_if_changed(name)?))
            })?
            .data
        };
        let plan = match plan {
            LogicalPlan::Projection(p) => {
                let mut exprs = p.expr;
                for q in needs {
                    let addr = Expr::Column(Column::new(Some(q.clone()), ROW_ADDR));
                    if !exprs.contains(&addr) {
                        exprs.push(addr);
                    }
                }
                LogicalPlan::Projection(Projection::try_new(exprs, p.input)?)
            }
            other => other.recompute_schema()?,
        };
        Ok(plan)
    }

    /// `ivf_partition(q.col)` → the function bound to `q`'s index on `col`, with `q._rowaddr`.
    fn bind(&self, e: Expr) -> Result<Transformed<Expr>> {
        let Some(Expr::Column(c)) = unbound_call(&e) else {
            return Ok(Transformed::no(e));
        };
        let Some(q) = &c.relation else {
            return Ok(Transformed::no(e));
        };
        let Some(udf) = self.bound.get(&(q.clone(), c.name.clone())) else {
            return Ok(Transformed::no(e));
        };
        let addr = Expr::Column(Column::new(Some(q.clone()), ROW_ADDR));
        Ok(Transformed::yes(Expr::ScalarFunction(
            ScalarFunction::new_udf(udf.clone(), vec![Expr::Column(c.clone()), addr]),
        )))
    }

    /// The same scan, also reading `_rowaddr`.
    fn scan_with_row_addr(&self, scan: TableScan) -> Result<LogicalPlan> {
        let provider = source_as_provider(&scan.source)?;
        let Some(table) = provider.downcast_ref::<FragvecTable>() else {
            return plan_err!("ivf_partition: {} is not a fragvec table", scan.table_name);
        };
        let source = if provider.schema().index_of(ROW_ADDR).is_ok() {
            scan.source.clone()
        } else {
            let columns = VirtualColumns {
                row_addr: true,
                ..table.virtual_columns()
            };
            provider_as_source(Arc::new(FragvecTable::new(
                table.snapshot().clone(),
                columns,
                self.cache.clone(),
            )))
        };
        let addr = source.schema().index_of(ROW_ADDR)?;
        let mut projection = scan
            .projection
            .clone()
            .unwrap_or_else(|| (0..provider.schema().fields().len()).collect());
        if !projection.contains(&addr) {
            projection.push(addr);
        }
        let scan = TableScanBuilder::new(scan.table_name, source)
            .with_projection(Some(projection))
            .with_filters(scan.filters)
            .with_fetch(scan.fetch)
            .build()?;
        Ok(LogicalPlan::TableScan(scan))
    }
}

/// The table qualifiers of a plan's output columns.
fn qualifiers(plan: &LogicalPlan) -> BTreeSet<TableReference> {
    plan.schema()
        .iter()
        .filter_map(|(q, _)| q.cloned())
        .collect()
}

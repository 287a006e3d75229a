//! What a statement takes and answers before any values are bound: the type of each `$n`
//! (where the statement tells it) and, for a query that plans with its parameters open, its
//! result schema. Both endpoints ask it when a client prepares a statement — the Postgres
//! one for ParameterDescription / RowDescription, Flight SQL for a prepared statement's
//! `parameter_schema` / `dataset_schema` — and each maps the answer to its own types.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DataFusionError;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Statement, Value, Visit, Visitor,
};

use super::pg_catalog;
use super::sqlstate::{self, code};
use crate::FragvecSession;
use crate::sql::FragvecStatement;

/// The type one parameter takes.
#[derive(Debug, Clone, PartialEq)]
pub enum ParameterType {
    /// Nothing in the statement settles it: the value decides.
    Unknown,
    /// A query vector (the parameter is an argument of a distance function or operator).
    Vector,
    /// The type planning inferred (a compared column's, an inserted column's).
    Arrow(DataType),
}

/// A statement's parameters and result, before values are bound.
#[derive(Debug, Clone)]
pub struct Unbound {
    /// One entry per placeholder number (`$1` first).
    pub parameters: Vec<ParameterType>,
    /// The rows a query (or EXPLAIN, SHOW, fragvec's own statements) answers; `None` when it
    /// answers none or cannot tell without its values.
    pub schema: Option<SchemaRef>,
}

/// Where the statement comes from: the Postgres endpoint also answers `pg_catalog` queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// The PostgreSQL endpoint: `pg_catalog` queries are rewritten before they plan.
    Postgres,
    /// The Flight SQL endpoint.
    FlightSql,
}

/// Describes `sql` (placeholders `$n`). An error is what PostgreSQL reports at Parse: a
/// statement that does not parse, or names a missing table, column or function.
pub async fn describe_unbound(
    session: &FragvecSession,
    sql: &str,
    endpoint: Endpoint,
) -> Result<Unbound, DataFusionError> {
    let mut statements = session.parse(sql)?;
    let mut parameters = vec![ParameterType::Unknown; super::params::parameter_count(sql)];
    if statements.len() != 1 {
        return Ok(Unbound {
            parameters,
            schema: None,
        });
    }
    let mut statement = statements.remove(0);
    for n in vector_parameters(&statement) {
        if let Some(t) = n.checked_sub(1).and_then(|i| parameters.get_mut(i)) {
            *t = ParameterType::Vector;
        }
    }
    let unbound = |parameters, schema| Ok(Unbound { parameters, schema });
    if endpoint == Endpoint::Postgres
        && pg_catalog::prepare(session, sql, &mut statement)
            .await
            .is_err()
    {
        return unbound(parameters, None);
    }
    // fragvec's own statements (COMPACT, VACUUM, MAINTAIN, ...) say what they answer.
    if let Some(schema) = crate::engine::statements::result_schema(&statement) {
        return unbound(parameters, Some(schema));
    }
    let FragvecStatement::DataFusion(s) = statement else {
        return unbound(parameters, None);
    };
    // Queries, EXPLAIN and SHOW (their rows) and INSERT / UPDATE / DELETE (the types of the
    // values they take) plan without running; other statements are not planned here.
    let is_explain = matches!(s.as_ref(), DFStatement::Explain(_));
    let is_query = is_explain
        || matches!(s.as_ref(), DFStatement::Statement(q) if matches!(q.as_ref(),
            Statement::Query(_)
                | Statement::ShowVariable { .. }
                | Statement::ShowTables { .. }
                | Statement::ShowColumns { .. }));
    let is_write = matches!(s.as_ref(), DFStatement::Statement(q)
        if matches!(q.as_ref(), Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_)));
    if !is_query && !is_write {
        return unbound(parameters, None);
    }
    let plan = match session.context().state().statement_to_plan(*s).await {
        Ok(plan) => plan,
        Err(e)
            if matches!(
                sqlstate::of(&e),
                code::UNDEFINED_TABLE
                    | code::UNDEFINED_COLUMN
                    | code::UNDEFINED_FUNCTION
                    | code::SYNTAX_ERROR
            ) =>
        {
            return Err(e);
        }
        // An EXPLAIN answers DataFusion's two columns whatever it explains (fragvec's own
        // EXPLAIN of UPDATE / DELETE too), so a plan that waits for its values still has them.
        Err(_) if is_explain => {
            let schema = datafusion::logical_expr::LogicalPlan::explain_schema();
            return unbound(parameters, Some(schema));
        }
        // Anything else (a parameter whose type planning cannot settle) waits for the values.
        Err(_) => return unbound(parameters, None),
    };
    if let Ok(found) = plan.get_parameter_types() {
        for (name, dt) in found {
            let Some(n) = name.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) else {
                continue;
            };
            if let (Some(slot), Some(dt)) =
                (n.checked_sub(1).and_then(|i| parameters.get_mut(i)), dt)
                && *slot == ParameterType::Unknown
            {
                *slot = ParameterType::Arrow(dt);
            }
        }
    }
    let schema = is_query.then(|| Arc::new(plan.schema().as_arrow().clone()) as SchemaRef);
    unbound(parameters, schema)
}

/// The numbers of the placeholders a statement passes to a distance function (vectors).
fn vector_parameters(statement: &FragvecStatement) -> Vec<usize> {
    struct Find(Vec<usize>);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> std::ops::ControlFlow<()> {
            if let Expr::Function(f) = expr
                && crate::sql::vector_syntax::is_distance_function(&f.name.to_string())
                && let FunctionArguments::List(list) = &f.args
            {
                for arg in &list.args {
                    let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = arg else {
                        continue;
                    };
                    let e = match e {
                        Expr::Cast { expr, .. } => expr.as_ref(),
                        e => e,
                    };
                    if let Expr::Value(v) = e
                        && let Value::Placeholder(p) = &v.value
                        && let Some(n) = p.strip_prefix('$').and_then(|n| n.parse().ok())
                    {
                        self.0.push(n);
                    }
                }
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let mut find = Find(vec![]);
    if let FragvecStatement::DataFusion(s) = statement
        && let DFStatement::Statement(inner) = s.as_ref()
    {
        let _ = inner.visit(&mut find);
    }
    find.0
}

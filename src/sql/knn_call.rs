//! The `knn('table', 'column', <vector>, k [, <filter>])` table function.
//!
//! It is a relation rewrite, not a DataFusion table function: the call becomes the derived
//! table `(SELECT *, <distance>(column, <vector>) AS _distance FROM table [WHERE <filter>]
//! ORDER BY _distance LIMIT k)`, where the distance is the one of the column's vector index
//! (`l2_distance` when it has none). That query is exactly what the KNN rule serves, so
//! `knn(...)` uses the index. The optional filter (fifth argument, or named `filter => ...`)
//! is a WHERE condition on the table's columns, written as an expression (`cat = 'odd'`) or as
//! a string of one (`'cat = ''odd'''`); it filters **before** the top-k, so the call returns k
//! rows whenever k rows qualify. A WHERE in the *outer* query filters the k rows returned (a
//! post-filter).

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::common::{DataFusionError, Result, internal_err, plan_datafusion_err};
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, Ident, ObjectNamePart, Query, Statement, TableAlias,
    TableFactor, Value, Visit, VisitMut, Visitor, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use super::finder::quote;
use super::parser::parse_expr;
use super::vector_syntax::desugar;
use crate::index::distance::Metric;

/// One `knn(...)` call of a statement.
#[derive(Debug, Clone, PartialEq)]
pub struct KnnCall {
    /// The table searched.
    pub table: String,
    /// Its vector column.
    pub column: String,
    /// The query vector, as SQL text.
    pub vector: String,
    /// How many nearest rows the call returns.
    pub k: u64,
    /// The prefilter, a condition on the table's columns.
    pub filter: Option<Expr>,
}

fn is_knn(tf: &TableFactor) -> bool {
    matches!(tf, TableFactor::Table { name, args: Some(_), .. }
        if matches!(name.0.as_slice(), [ObjectNamePart::Identifier(i)] if i.value.eq_ignore_ascii_case("knn")))
}

fn parse_call(tf: &TableFactor) -> Result<KnnCall> {
    let usage = || plan_datafusion_err!("usage: knn('table', 'column', [vector], k [, filter])");
    let TableFactor::Table {
        args: Some(args), ..
    } = tf
    else {
        return Err(usage());
    };
    let mut exprs: Vec<&Expr> = Vec::with_capacity(5);
    let mut named_filter = None;
    for arg in &args.args {
        match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) if named_filter.is_none() => {
                exprs.push(e)
            }
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(e),
                ..
            } if name.value.eq_ignore_ascii_case("filter") && named_filter.is_none() => {
                named_filter = Some(e)
            }
            _ => return Err(usage()),
        }
    }
    let (table, column, vector, k, filter) = match (exprs.as_slice(), named_filter) {
        ([table, column, vector, k], filter) => (*table, *column, *vector, *k, filter),
        ([table, column, vector, k, filter], None) => (*table, *column, *vector, *k, Some(*filter)),
        _ => return Err(usage()),
    };
    let text = |e: &Expr| match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Ok(s.clone()),
            _ => Err(usage()),
        },
        _ => Err(usage()),
    };
    let k = match k {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse::<u64>().ok().filter(|k| *k > 0),
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| plan_datafusion_err!("knn(...): k must be a positive integer literal"))?;
    let filter = match filter {
        None => None,
        // A condition given as text is parsed like any SQL expression.
        Some(Expr::Value(v)) if matches!(v.value, Value::SingleQuotedString(_)) => {
            let Value::SingleQuotedString(s) = &v.value else {
                unreachable!("matched above")
            };
            Some(parse_expr(s).map_err(|e| {
                plan_datafusion_err!("knn(...): the filter '{s}' is not a condition: {e}")
            })?)
        }
        Some(e) => Some(e.clone()),
    };
    Ok(KnnCall {
        table: text(table)?,
        column: text(column)?,
        vector: vector.to_string(),
        k,
        filter,
    })
}

/// The `knn(...)` calls of a statement.
pub fn knn_calls<V: Visit>(statement: &V) -> Result<Vec<KnnCall>> {
    struct Collect(Vec<Result<KnnCall>>);
    impl Visitor for Collect {
        type Break = ();
        fn pre_visit_table_factor(&mut self, tf: &TableFactor) -> ControlFlow<()> {
            if is_knn(tf) {
                self.0.push(parse_call(tf));
            }
            ControlFlow::Continue(())
        }
    }
    let mut c = Collect(vec![]);
    let _ = statement.visit(&mut c);
    c.0.into_iter().collect()
}

/// The derived query a call becomes.
pub fn knn_query(call: &KnnCall, metric: Metric) -> Result<Query> {
    let function = match metric {
        Metric::L2 => "l2_distance",
        Metric::Cosine => "cosine_distance",
        Metric::Dot => "negative_inner_product",
    };
    let filter = call
        .filter
        .as_ref()
        .map(|f| format!(" WHERE {f}"))
        .unwrap_or_default();
    let sql = format!(
        "SELECT *, {function}({}, {}) AS _distance FROM {}{filter} ORDER BY _distance LIMIT {}",
        quote(&call.column),
        call.vector,
        quote(&call.table),
        call.k
    );
    let mut statements = Parser::parse_sql(&GenericDialect {}, &sql)
        .map_err(|e| DataFusionError::SQL(Box::new(e), None))?;
    match statements.pop() {
        Some(Statement::Query(mut q)) => {
            // A pgvector text literal as the query vector becomes an array.
            desugar(q.as_mut());
            Ok(*q)
        }
        _ => internal_err!("knn rewrite produced {sql}"),
    }
}

/// Replaces every `knn(...)` call by its derived query. `metrics` gives the metric of the
/// index on each (table, column); absent means L2.
pub fn rewrite_knn_calls<V: VisitMut>(
    statement: &mut V,
    metrics: &HashMap<(String, String), Metric>,
) -> Result<()> {
    struct Rewrite<'a> {
        metrics: &'a HashMap<(String, String), Metric>,
        error: Option<DataFusionError>,
    }
    impl VisitorMut for Rewrite<'_> {
        type Break = ();
        fn pre_visit_table_factor(&mut self, tf: &mut TableFactor) -> ControlFlow<()> {
            if !is_knn(tf) {
                return ControlFlow::Continue(());
            }
            let result = parse_call(tf).and_then(|call| {
                let metric = self
                    .metrics
                    .get(&(call.table.clone(), call.column.clone()))
                    .copied()
                    .unwrap_or(Metric::L2);
                Ok((knn_query(&call, metric)?, call))
            });
            match result {
                Ok((query, call)) => {
                    let alias = match tf {
                        TableFactor::Table { alias: Some(a), .. } => a.clone(),
                        _ => TableAlias {
                            explicit: true,
                            name: Ident::new(call.table.clone()),
                            columns: vec![],
                            at: None,
                        },
                    };
                    *tf = TableFactor::Derived {
                        lateral: false,
                        subquery: Box::new(query),
                        alias: Some(alias),
                        sample: None,
                    };
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    self.error = Some(e);
                    ControlFlow::Break(())
                }
            }
        }
    }
    let mut r = Rewrite {
        metrics,
        error: None,
    };
    let _ = statement.visit(&mut r);
    match r.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_become_top_k_queries_with_the_index_metric() {
        let mut stmt = Parser::parse_sql(
            &GenericDialect {},
            "SELECT id, _distance FROM knn('docs', 'emb', [1, 2], 3) WHERE id > 1",
        )
        .unwrap()
        .remove(0);
        let calls = knn_calls(&stmt).unwrap();
        assert_eq!(
            calls,
            vec![KnnCall {
                table: "docs".into(),
                column: "emb".into(),
                vector: "[1, 2]".into(),
                k: 3,
                filter: None,
            }]
        );
        let metrics = HashMap::from([(("docs".to_string(), "emb".to_string()), Metric::Cosine)]);
        rewrite_knn_calls(&mut stmt, &metrics).unwrap();
        assert_eq!(
            stmt.to_string(),
            "SELECT id, _distance FROM (SELECT *, cosine_distance(\"emb\", [1, 2]) AS _distance FROM \"docs\" \
             ORDER BY _distance LIMIT 3) AS docs WHERE id > 1"
        );
        assert!(
            knn_query(&calls[0], Metric::L2)
                .unwrap()
                .to_string()
                .starts_with("SELECT *, l2_distance")
        );
    }

    #[test]
    fn filters_come_before_the_top_k() {
        for sql in [
            "SELECT * FROM knn('docs', 'emb', [1, 2], 3, cat = 'a' AND id > 1)",
            "SELECT * FROM knn('docs', 'emb', [1, 2], 3, 'cat = ''a'' AND id > 1')",
            "SELECT * FROM knn('docs', 'emb', [1, 2], 3, filter => cat = 'a' AND id > 1)",
            "SELECT * FROM knn('docs', 'emb', '[1, 2]', 3, filter => 'cat = ''a'' AND id > 1')",
        ] {
            let mut stmt = Parser::parse_sql(&GenericDialect {}, sql)
                .unwrap()
                .remove(0);
            rewrite_knn_calls(&mut stmt, &HashMap::new()).unwrap();
            assert_eq!(
                stmt.to_string(),
                "SELECT * FROM (SELECT *, l2_distance(\"emb\", [1, 2]) AS _distance FROM \"docs\" \
                 WHERE cat = 'a' AND id > 1 ORDER BY _distance LIMIT 3) AS docs",
                "{sql}"
            );
        }
    }

    #[test]
    fn bad_calls_are_explained() {
        for sql in [
            "SELECT * FROM knn('t', 'emb', [1])",
            "SELECT * FROM knn('t', 'emb', [1], 0)",
            "SELECT * FROM knn(t, 'emb', [1], 2)",
            "SELECT * FROM knn('t', 'emb', [1], 2, 'a >')",
            "SELECT * FROM knn('t', 'emb', [1], 2, a > 1, filter => b > 1)",
            "SELECT * FROM knn('t', 'emb', [1], 2, other => b > 1)",
            "SELECT * FROM knn('t', 'emb', [1], 2, a > 1, b > 1)",
        ] {
            let stmt = Parser::parse_sql(&GenericDialect {}, sql)
                .unwrap()
                .remove(0);
            assert!(knn_calls(&stmt).is_err(), "{sql}");
        }
    }
}

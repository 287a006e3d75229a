//! Vector literals as query parameters.
//!
//! A KNN query carries its query vector as an array literal of, say, 128 numbers. Planned as
//! written, DataFusion turns it into a 128-argument `make_array` call and names, coerces and
//! simplifies that expression in every planning pass, which costs far more than running the
//! query. Here each numeric array literal passed to a distance function is replaced by a
//! positional placeholder (`$1`, ...) and its value is kept aside; the engine binds the values
//! into the logical plan once it is built, where they become plain literals. Queries whose
//! output names would show the literal (an unaliased projected distance) and statements that
//! already use placeholders are left alone, so results and column names do not change.

use std::ops::ControlFlow;

use super::vector_syntax::is_distance_function;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, SelectItem, SetExpr,
    Statement, UnaryOperator, Value, VisitMut, VisitorMut, visit_expressions,
};

/// Arrays shorter than this are cheap to plan as written.
const MIN_ELEMENTS: usize = 8;

fn number(e: &Expr) -> Option<f64> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => number(expr).map(|x| -x),
        Expr::UnaryOp {
            op: UnaryOperator::Plus,
            expr,
        } => number(expr),
        _ => None,
    }
}

fn numeric_array(e: &Expr) -> Option<Vec<f64>> {
    match e {
        Expr::Array(a) if a.elem.len() >= MIN_ELEMENTS => a.elem.iter().map(number).collect(),
        _ => None,
    }
}

/// The array literal a distance argument holds: the argument itself, or the value of a cast
/// (`CAST([...] AS FLOAT[n])`, which is how `::VECTOR(n)` arrives).
fn literal_slot(e: &mut Expr) -> &mut Expr {
    if matches!(e, Expr::Cast { expr, .. } if matches!(expr.as_ref(), Expr::Array(_))) {
        let Expr::Cast { expr, .. } = e else {
            unreachable!("matched above")
        };
        return expr.as_mut();
    }
    e
}

fn has_placeholder(statement: &Statement) -> bool {
    visit_expressions(statement, |e| match e {
        Expr::Value(v) if matches!(v.value, Value::Placeholder(_)) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// An unaliased projection whose name would show a vector literal.
fn projects_literal_unaliased(statement: &Statement) -> bool {
    let Statement::Query(q) = statement else {
        return true;
    };
    let SetExpr::Select(select) = q.body.as_ref() else {
        return true;
    };
    select.projection.iter().any(|item| match item {
        SelectItem::UnnamedExpr(e) => visit_expressions(e, |x| match numeric_array(x) {
            Some(_) => ControlFlow::Break(()),
            None => ControlFlow::Continue(()),
        })
        .is_break(),
        _ => false,
    })
}

struct Extract {
    values: Vec<Vec<f64>>,
}

fn is_column(e: &Expr) -> bool {
    matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
}

impl VisitorMut for Extract {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        // A distance call, or `<=>` (pgvector's cosine distance when the column is a vector,
        // else IS NOT DISTINCT FROM: a parameter of the literal's value means the same).
        let (a, b) = match expr {
            Expr::Function(f) if is_distance_function(&f.name.to_string()) => {
                let FunctionArguments::List(list) = &mut f.args else {
                    return ControlFlow::Continue(());
                };
                let [
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(a)),
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(b)),
                ] = list.args.as_mut_slice()
                else {
                    return ControlFlow::Continue(());
                };
                (a, b)
            }
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Spaceship,
                right,
            } => (left.as_mut(), right.as_mut()),
            _ => return ControlFlow::Continue(()),
        };
        // Only `distance(column, [literal])` (either order): a call of two literals would be
        // folded into a constant that no longer shows its parameters.
        let e = if is_column(a) {
            literal_slot(b)
        } else if is_column(b) {
            literal_slot(a)
        } else {
            return ControlFlow::Continue(());
        };
        if let Some(values) = numeric_array(e) {
            // The same vector twice (projected and ordered by) is one parameter.
            let n = match self.values.iter().position(|v| *v == values) {
                Some(i) => i + 1,
                None => {
                    self.values.push(values);
                    self.values.len()
                }
            };
            *e = Expr::value(Value::Placeholder(format!("${n}")));
        }
        ControlFlow::Continue(())
    }
}

/// Replaces the vector literals of distance calls in a plain query by placeholders and
/// returns their values in placeholder order (empty: the statement was left as it was).
pub fn extract_vector_literals(statement: &mut Statement) -> Vec<Vec<f64>> {
    if !is_plain_select(statement)
        || has_placeholder(statement)
        || projects_literal_unaliased(statement)
    {
        return vec![];
    }
    let mut changed = statement.clone();
    let mut extract = Extract { values: vec![] };
    let _ = changed.visit(&mut extract);
    // Every long vector literal must have become a parameter; otherwise plan as written (a
    // literal left in place could be mistaken for a parameter of equal value).
    let residual = visit_expressions(&changed, |e| match numeric_array(e) {
        Some(_) => ControlFlow::Break(()),
        None => ControlFlow::Continue(()),
    })
    .is_break();
    if residual || extract.values.is_empty() {
        return vec![];
    }
    *statement = changed;
    extract.values
}

/// `SELECT ... FROM <tables> ...` without CTEs, set operations or derived tables.
fn is_plain_select(statement: &Statement) -> bool {
    use datafusion::sql::sqlparser::ast::TableFactor;
    let Statement::Query(q) = statement else {
        return false;
    };
    let SetExpr::Select(select) = q.body.as_ref() else {
        return false;
    };
    q.with.is_none()
        && select.from.iter().all(|t| {
            t.joins.is_empty() && matches!(t.relation, TableFactor::Table { args: None, .. })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{FragvecStatement, parse_statements};

    fn statement(sql: &str) -> Statement {
        match parse_statements(sql).unwrap().remove(0) {
            FragvecStatement::DataFusion(s) => match *s {
                datafusion::sql::parser::Statement::Statement(s) => *s,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn distance_literals_become_placeholders() {
        let v = "[1, -2.5, 3, 4, 5, 6, 7, 8]";
        let mut s = statement(&format!(
            "SELECT id, l2_distance(emb, {v}) AS d FROM t WHERE id > 3 ORDER BY l2_distance(emb, {v}) LIMIT 3"
        ));
        // The same vector twice is one parameter.
        let values = extract_vector_literals(&mut s);
        assert_eq!(values, vec![vec![1.0, -2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]);
        let text = s.to_string();
        assert!(
            text.contains("l2_distance(emb, $1) AS d") && text.contains("BY l2_distance(emb, $1)"),
            "{text}"
        );
    }

    #[test]
    fn operator_and_cast_spellings_become_placeholders() {
        let v = "[1, 2, 3, 4, 5, 6, 7, 8]";
        for (sql, expected) in [
            (
                format!("SELECT id FROM t ORDER BY emb <-> {v} LIMIT 3"),
                "ORDER BY l2_distance(emb, $1) LIMIT 3",
            ),
            (
                format!("SELECT id FROM t ORDER BY emb <=> {v} LIMIT 3"),
                "ORDER BY emb <=> $1 LIMIT 3",
            ),
            (
                format!("SELECT id FROM t ORDER BY {v}::VECTOR(8) <#> emb LIMIT 3"),
                "ORDER BY negative_inner_product($1::FLOAT[8], emb) LIMIT 3",
            ),
            (
                format!("SELECT id FROM t ORDER BY array_distance(emb, '{v}') LIMIT 3"),
                "ORDER BY array_distance(emb, $1) LIMIT 3",
            ),
        ] {
            let mut s = statement(&sql);
            assert_eq!(extract_vector_literals(&mut s).len(), 1, "{sql}");
            let text = s.to_string();
            assert!(text.ends_with(expected), "{text}");
        }
    }

    #[test]
    fn names_placeholders_and_short_or_non_numeric_arrays_stay() {
        let v = "[1, 2, 3, 4, 5, 6, 7, 8]";
        for sql in [
            format!("SELECT l2_distance(emb, {v}) FROM t"),
            format!("SELECT id FROM t WHERE id = $1 ORDER BY l2_distance(emb, {v}) LIMIT 3"),
            "SELECT id FROM t ORDER BY l2_distance(emb, [1, 2]) LIMIT 3".to_string(),
            "SELECT id FROM t ORDER BY l2_distance(emb, [1, 2, 3, 4, 5, 6, 7, x]) LIMIT 3"
                .to_string(),
            format!("SELECT array_length({v}) AS n"),
            format!("SELECT l2_distance({v}, {v}) AS d"),
            format!("SELECT id FROM (SELECT * FROM t) ORDER BY l2_distance(emb, {v}) LIMIT 3"),
            format!(
                "SELECT id FROM t WHERE array_length({v}) > 0 ORDER BY l2_distance(emb, {v}) LIMIT 3"
            ),
        ] {
            let mut s = statement(&sql);
            let before = s.to_string();
            assert!(extract_vector_literals(&mut s).is_empty(), "{sql}");
            assert_eq!(s.to_string(), before);
        }
    }
}

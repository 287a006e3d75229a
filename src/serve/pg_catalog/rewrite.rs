//! Rewrites of what DataFusion does not plan: `'name'::regtype` / `::regclass` (to OIDs),
//! `oid::regtype::text` (to the type's name), `OPERATOR(pg_catalog.~)`, `COLLATE ...`, and
//! function names qualified with `pg_catalog.`.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, CastKind, DataType as SqlType, Expr, FunctionArg, FunctionArgExpr,
    FunctionArguments, GroupByExpr, JoinOperator, Query, Select, SelectItem, SetExpr, SetOperator,
    Statement, TableFactor, TableWithJoins, Value, Visit, Visitor, VisitorMut,
};

use crate::sql::vector_syntax::call;

/// The catalog rewrites (see the module documentation).
pub(super) struct Rewrite;

fn is_call(e: &Expr, name: &str) -> bool {
    matches!(e, Expr::Function(f) if f.name.to_string() == name)
}

/// The last part of a custom type's name, lower-cased (`pg_catalog.regtype` → `regtype`).
fn custom_type(dt: &SqlType) -> Option<String> {
    match dt {
        SqlType::Custom(name, _) => name
            .0
            .last()
            .map(|p| p.to_string().trim_matches('"').to_ascii_lowercase()),
        SqlType::Regclass => Some("regclass".into()),
        _ => None,
    }
}

fn is_text_type(dt: &SqlType) -> bool {
    matches!(dt, SqlType::Text | SqlType::Varchar(_) | SqlType::String(_))
        || custom_type(dt).is_some_and(|n| n == "text" || n == "name")
}

impl VisitorMut for Rewrite {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } => {
                let inner_expr = std::mem::replace(inner.as_mut(), Expr::Value(Value::Null.into()));
                let is_literal = matches!(&inner_expr, Expr::Value(v) if matches!(v.value, Value::SingleQuotedString(_)));
                let custom = custom_type(data_type);
                *expr = match custom.as_deref() {
                    Some("regtype") if is_literal => call("fv_regtype", vec![inner_expr]),
                    Some("regclass") if is_literal => call("fv_regclass", vec![inner_expr]),
                    Some(
                        "regtype" | "regclass" | "oid" | "regproc" | "regnamespace" | "regrole",
                    ) => bigint(inner_expr),
                    Some("name" | "char" | "bpchar") => text(inner_expr),
                    _ if is_text_type(data_type) && is_call(&inner_expr, "fv_regtype") => {
                        call("fv_type_name", vec![inner_expr])
                    }
                    _ if is_text_type(data_type) && is_call(&inner_expr, "fv_oid") => {
                        // `oid::regtype::text`
                        let Expr::Function(f) = &inner_expr else {
                            unreachable!()
                        };
                        let FunctionArguments::List(l) = &f.args else {
                            unreachable!()
                        };
                        let FunctionArg::Unnamed(FunctionArgExpr::Expr(arg)) = &l.args[0] else {
                            unreachable!()
                        };
                        call("fv_type_name", vec![arg.clone()])
                    }
                    _ => {
                        *inner.as_mut() = inner_expr;
                        return ControlFlow::Continue(());
                    }
                };
            }
            Expr::BinaryOp { op, .. } => {
                if let BinaryOperator::PGCustomBinaryOperator(parts) = op
                    && let Some(last) = parts.last()
                {
                    let mapped = match last.as_str() {
                        "~" => Some(BinaryOperator::PGRegexMatch),
                        "~*" => Some(BinaryOperator::PGRegexIMatch),
                        "!~" => Some(BinaryOperator::PGRegexNotMatch),
                        "!~*" => Some(BinaryOperator::PGRegexNotIMatch),
                        "=" => Some(BinaryOperator::Eq),
                        "<>" => Some(BinaryOperator::NotEq),
                        _ => None,
                    };
                    if let Some(m) = mapped {
                        *op = m;
                    }
                }
            }
            Expr::Collate { expr: inner, .. } => {
                *expr = std::mem::replace(inner.as_mut(), Expr::Value(Value::Null.into()));
            }
            Expr::Subquery(q) => one_row_of_catalog(q),
            Expr::Function(f)
                if f.name.0.len() == 2
                    && f.name.0[0].to_string().eq_ignore_ascii_case("pg_catalog") =>
            {
                f.name.0.remove(0);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// A scalar subquery over catalog tables (`(SELECT c.collname FROM pg_collation c, pg_type t
/// WHERE c.oid = a.attcollation AND ...)` in psql's `\d TABLE`) made plannable: DataFusion
/// decorrelates a correlated scalar subquery only when it aggregates, and a catalog lookup
/// by OID finds at most one row, so `max(x)` is the row's value (NULL for none).
fn one_row_of_catalog(q: &mut Query) {
    let SetExpr::Select(select) = q.body.as_mut() else {
        return;
    };
    let reads_catalog_only = !select.from.is_empty()
        && select.from.iter().all(|t| {
            t.joins.is_empty()
                && matches!(&t.relation, TableFactor::Table { name, .. }
                if name.0.last().is_some_and(|p| {
                    let p = p.to_string().to_ascii_lowercase();
                    super::TABLES.contains(&p.trim_matches('"'))
                }))
        });
    if !reads_catalog_only || select.group_by != GroupByExpr::Expressions(vec![], vec![]) {
        return;
    }
    if let [SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }] =
        select.projection.as_mut_slice()
        && !has_aggregate(e)
    {
        let inner = std::mem::replace(e, Expr::Value(Value::Null.into()));
        *e = call("max", vec![inner]);
    }
}

/// `CAST(e AS BIGINT)`, marked so an outer `::text` can tell it was an OID cast.
fn bigint(e: Expr) -> Expr {
    call("fv_oid", vec![e])
}

fn text(e: Expr) -> Expr {
    Expr::Cast {
        kind: CastKind::Cast,
        expr: Box::new(e),
        data_type: SqlType::Text,
        array: false,
        format: None,
    }
}

/// Catalog relations a fragvec database has no rows in: it has no row-level policies,
/// extended statistics, publications, table inheritance, column defaults, collations,
/// triggers, rules, foreign or partitioned tables.
const EMPTY_RELATIONS: &[&str] = &[
    "pg_collation",
    "pg_policy",
    "pg_statistic_ext",
    "pg_publication",
    "pg_publication_rel",
    "pg_publication_namespace",
    "pg_inherits",
    "pg_attrdef",
    "pg_trigger",
    "pg_rewrite",
    "pg_foreign_table",
    "pg_partitioned_table",
    "pg_event_trigger",
];

/// Answers what must come from an empty relation without planning it: a query whose rows
/// all come through an inner join with one of [`EMPTY_RELATIONS`] has no rows, whatever its
/// filters and expressions say, so it becomes `SELECT NULL AS <each column> WHERE false`
/// (same column names); a scalar subquery of one is NULL, `EXISTS` false, `IN` false.
///
/// psql's `\d TABLE` asks these relations with PostgreSQL-only constructs (`ARRAY(SELECT
/// ...)`, `= any(array)`, `::regnamespace`, `pg_get_statisticsobjdef_columns`) that
/// DataFusion cannot plan; the answer is known without them. A query that aggregates (one
/// row even from no rows) or selects `*` is left alone.
pub(super) struct EmptyRelations;

impl VisitorMut for EmptyRelations {
    type Break = ();

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if !is_marked_empty(&query.body)
            && body_is_empty(&query.body)
            && let Some(empty) = empty_like(&query.body)
        {
            *query = empty;
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let replacement = match expr {
            Expr::Subquery(q) if body_is_empty(&q.body) => Value::Null,
            Expr::Exists { subquery, negated } if body_is_empty(&subquery.body) => {
                Value::Boolean(*negated)
            }
            Expr::InSubquery {
                subquery, negated, ..
            } if body_is_empty(&subquery.body) => Value::Boolean(*negated),
            _ => return ControlFlow::Continue(()),
        };
        *expr = Expr::Value(replacement.into());
        ControlFlow::Continue(())
    }
}

/// Whether `body` has no rows by construction.
fn body_is_empty(body: &SetExpr) -> bool {
    match body {
        SetExpr::Select(s) => select_is_empty(s),
        SetExpr::Query(q) => body_is_empty(&q.body),
        SetExpr::SetOperation {
            op, left, right, ..
        } => match op {
            SetOperator::Union => body_is_empty(left) && body_is_empty(right),
            SetOperator::Intersect => body_is_empty(left) || body_is_empty(right),
            SetOperator::Except | SetOperator::Minus => body_is_empty(left),
        },
        _ => false,
    }
}

/// `SELECT ... WHERE false` with no FROM: what [`empty_like`] makes.
fn is_marked_empty(body: &SetExpr) -> bool {
    matches!(body, SetExpr::Select(s) if select_is_marked_empty(s))
}

fn select_is_marked_empty(s: &Select) -> bool {
    s.from.is_empty()
        && matches!(&s.selection, Some(Expr::Value(v)) if v.value == Value::Boolean(false))
}

fn select_is_empty(s: &Select) -> bool {
    if select_is_marked_empty(s) {
        return true;
    }
    // An aggregate makes one row out of none.
    let aggregates = s.having.is_some()
        || s.projection.iter().any(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                has_aggregate(e)
            }
            _ => false,
        });
    !aggregates && s.from.iter().any(joined_is_empty)
}

/// Whether `e` aggregates (not counting what its subqueries do).
fn has_aggregate(e: &Expr) -> bool {
    struct Find(bool, usize);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.1 += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.1 -= 1;
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if let Expr::Function(f) = e
                && self.1 == 0
            {
                let name = f.name.0.last().map(|p| p.to_string().to_ascii_lowercase());
                if matches!(
                    name.as_deref(),
                    Some(
                        "count"
                            | "sum"
                            | "min"
                            | "max"
                            | "avg"
                            | "string_agg"
                            | "array_agg"
                            | "bool_and"
                            | "bool_or"
                            | "every"
                            | "json_agg"
                            | "jsonb_agg"
                    )
                ) {
                    self.0 = true;
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find(false, 0);
    let _ = e.visit(&mut find);
    find.0
}

/// Whether a FROM item (a relation and its joins) has no rows.
fn joined_is_empty(t: &TableWithJoins) -> bool {
    let mut empty = factor_is_empty(&t.relation);
    for join in &t.joins {
        let right = factor_is_empty(&join.relation);
        empty = match &join.join_operator {
            JoinOperator::Join(_)
            | JoinOperator::Inner(_)
            | JoinOperator::CrossJoin(_)
            | JoinOperator::Semi(_)
            | JoinOperator::LeftSemi(_)
            | JoinOperator::StraightJoin(_) => empty || right,
            JoinOperator::RightSemi(_) => empty || right,
            JoinOperator::Right(_) | JoinOperator::RightOuter(_) => right,
            JoinOperator::FullOuter(_) => empty && right,
            // Left outer and anti joins keep the left side's rows.
            _ => empty,
        };
    }
    empty
}

fn factor_is_empty(f: &TableFactor) -> bool {
    match f {
        TableFactor::Table { name, .. } => {
            let parts: Vec<String> = name
                .0
                .iter()
                .map(|p| p.to_string().trim_matches('"').to_ascii_lowercase())
                .collect();
            let bare = match parts.as_slice() {
                [table] => table,
                [schema, table] if schema == "pg_catalog" => table,
                _ => return false,
            };
            EMPTY_RELATIONS.contains(&bare.as_str())
        }
        TableFactor::Derived { subquery, .. } => body_is_empty(&subquery.body),
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => joined_is_empty(table_with_joins),
        _ => false,
    }
}

/// A query with no rows and the column names of `body`'s first SELECT; None when they are
/// not known (`*`).
fn empty_like(body: &SetExpr) -> Option<Query> {
    let mut first = body;
    let select = loop {
        match first {
            SetExpr::Select(s) => break s,
            SetExpr::Query(q) => first = &q.body,
            SetExpr::SetOperation { left, .. } => first = left,
            _ => return None,
        }
    };
    let mut columns = Vec::with_capacity(select.projection.len());
    let mut seen = std::collections::HashSet::new();
    for item in &select.projection {
        let mut name = match item {
            SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
            SelectItem::UnnamedExpr(e) => output_name(e),
            _ => return None,
        };
        // DataFusion wants distinct names where PostgreSQL allows repeats: `name_2`, ...
        let base = name.clone();
        let mut n = 1;
        while !seen.insert(name.clone()) {
            n += 1;
            name = format!("{base}_{n}");
        }
        columns.push(format!(
            "CAST(NULL AS TEXT) AS \"{}\"",
            name.replace('"', "\"\"")
        ));
    }
    let sql = format!("SELECT {} WHERE false", columns.join(", "));
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    match datafusion::sql::sqlparser::parser::Parser::parse_sql(&dialect, &sql)
        .ok()?
        .pop()?
    {
        Statement::Query(q) => Some(*q),
        _ => None,
    }
}

/// The name PostgreSQL gives an unnamed output column.
fn output_name(e: &Expr) -> String {
    match e {
        Expr::Identifier(i) => i.value.clone(),
        Expr::CompoundIdentifier(parts) => {
            parts.last().map(|p| p.value.clone()).unwrap_or_default()
        }
        Expr::Function(f) => f
            .name
            .0
            .last()
            .map(|p| p.to_string().trim_matches('"').to_string())
            .unwrap_or_default(),
        Expr::Cast { expr, .. } | Expr::Nested(expr) => output_name(expr),
        _ => "?column?".into(),
    }
}

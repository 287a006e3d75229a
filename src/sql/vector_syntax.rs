//! pgvector and DuckDB spellings of vector search, turned into fragvec's distance functions
//! before anything is planned.
//!
//! * `a <-> b` becomes `l2_distance(a, b)` and `a <#> b` becomes `negative_inner_product(a, b)`.
//!   sqlparser's generic dialect has neither token: `<->` arrives as `<` `->` and `<#>` as `<`
//!   `#>`, always adjacent. [`join_vector_operators`] turns each adjacent pair into Postgres'
//!   explicit operator syntax `OPERATOR(<->)`, which the generic dialect parses as one binary
//!   operator, and [`desugar`] turns those into function calls (so everything after parsing —
//!   vector parameters, views, the KNN rule, EXPLAIN — sees ordinary calls).
//! * `a <=> b` is left alone: DataFusion reads it as `IS NOT DISTINCT FROM`, and whether it is
//!   pgvector's cosine distance instead depends on the operands' types, which only planning
//!   knows (the engine's `VectorOperatorPlanner` decides: a `VECTOR(n)` operand makes it
//!   `cosine_distance`).
//! * `CAST(x AS VECTOR(n))` / `x::VECTOR(n)` become casts to `FLOAT[n]` (`x::VECTOR` without a
//!   dimension to `FLOAT[]`), and a pgvector text literal `'[1, 2, 3]'` given to a distance
//!   function, a vector operator or a vector cast becomes the array literal `[1, 2, 3]`.
//!
//! **Precedence.** All three operators bind like comparisons (`=`, `<`, `BETWEEN`): tighter
//! than `NOT`, `AND`, `OR` and `IS`, looser than arithmetic, left to right among themselves and
//! other comparisons. So `emb <-> q < 1.0` is `(emb <-> q) < 1.0` and `emb <-> q + d` is
//! `emb <-> (q + d)`; `1.0 > emb <-> q` reads as `(1.0 > emb) <-> q` (an error, a boolean is
//! not a vector): write the distance first or parenthesize it. (pgvector's operators bind a
//! little tighter, between arithmetic and comparisons; the two agree whenever the distance is
//! written first.)

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Array, ArrayElemTypeDef, BinaryOperator, DataType as SqlType, Expr, Function, FunctionArg,
    FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident, Insert, ObjectName, SetExpr,
    UnaryOperator, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Word};

/// Every name of a vector distance function: fragvec's own, their DuckDB aliases, and
/// DataFusion's `array_distance` / `list_distance`. Their vector arguments may be pgvector text
/// literals and become query parameters ([`super::vector_params`]).
pub const DISTANCE_FUNCTIONS: &[&str] = &[
    "l2_distance",
    "array_distance",
    "list_distance",
    "cosine_distance",
    "array_cosine_distance",
    "list_cosine_distance",
    "inner_product",
    "dot_product",
    "array_inner_product",
    "array_dot_product",
    "list_inner_product",
    "list_dot_product",
    "negative_inner_product",
    "array_negative_inner_product",
    "array_negative_dot_product",
    "list_negative_inner_product",
    "list_negative_dot_product",
];

/// The pgvector operators and the function each one means.
const OPERATORS: &[(&str, &str)] = &[
    ("<->", "l2_distance"),
    ("<#>", "negative_inner_product"),
    ("<=>", "cosine_distance"),
];

/// The function an operator spelled `op` (`<->`, `<#>`, `<=>`) means.
pub fn operator_function(op: &str) -> Option<&'static str> {
    OPERATORS.iter().find(|(o, _)| *o == op).map(|(_, f)| *f)
}

/// Whether `name` (any case) is one of fragvec's distance functions.
pub fn is_distance_function(name: &str) -> bool {
    DISTANCE_FUNCTIONS.contains(&name.to_ascii_lowercase().as_str())
}

/// The numbers of a pgvector text literal `[x, y, ...]` (at least one, all finite).
pub fn parse_vector_text(text: &str) -> Option<Vec<f64>> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
    inner
        .split(',')
        .map(|x| x.trim().parse::<f64>().ok().filter(|v| v.is_finite()))
        .collect()
}

/// Joins the adjacent token pairs `<` `->` and `<` `#>` into `OPERATOR(<->)` /
/// `OPERATOR(<#>)` (just the operator when it already stands inside `OPERATOR(...)`).
pub fn join_vector_operators(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        // (operator, tokens it spans): dialects with geometric types (PostgreSQL) read
        // `<->` as one token.
        let op = match (&tokens[i].token, tokens.get(i + 1).map(|t| &t.token)) {
            (Token::Lt, Some(Token::Arrow)) => Some(("<->", 2)),
            (Token::Lt, Some(Token::HashArrow)) => Some(("<#>", 2)),
            (Token::TwoWayArrow, _) => Some(("<->", 1)),
            _ => None,
        };
        let Some((op, width)) = op else {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        };
        let span = tokens[i].span;
        let token = |token: Token| TokenWithSpan { token, span };
        let operator = token(Token::CustomBinaryOperator(op.to_string()));
        if inside_operator_syntax(&out) {
            out.push(operator);
        } else {
            out.push(token(Token::Word(Word {
                value: "OPERATOR".to_string(),
                quote_style: None,
                keyword: Keyword::OPERATOR,
            })));
            out.push(token(Token::LParen));
            out.push(operator);
            out.push(token(Token::RParen));
        }
        i += width;
    }
    out
}

/// Whether the tokens so far end in `OPERATOR (` or `OPERATOR ( schema .`.
fn inside_operator_syntax(tokens: &[TokenWithSpan]) -> bool {
    let solid: Vec<&Token> = tokens
        .iter()
        .rev()
        .map(|t| &t.token)
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .take(4)
        .collect();
    let is_operator = |t: &&Token| matches!(t, Token::Word(w) if w.keyword == Keyword::OPERATOR);
    match solid.as_slice() {
        [Token::LParen, op, ..] => is_operator(op),
        [Token::Period, Token::Word(_), Token::LParen, op] => is_operator(op),
        _ => false,
    }
}

/// Rewrites the pgvector and DuckDB spellings in everything `node` holds (see the module
/// docs).
pub fn desugar<V: VisitMut>(node: &mut V) {
    let _ = node.visit(&mut Desugar);
}

struct Desugar;

impl VisitorMut for Desugar {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::BinaryOp {
                left,
                op: BinaryOperator::PGCustomBinaryOperator(parts),
                right,
            } => {
                if let Some(function) = parts.last().and_then(|op| operator_function(op)) {
                    let args = vec![vector_literal(left), vector_literal(right)];
                    *expr = call(function, args);
                }
            }
            Expr::Function(f) if is_distance_function(&f.name.to_string()) => {
                if let FunctionArguments::List(list) = &mut f.args {
                    for arg in &mut list.args {
                        if let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = arg {
                            *e = vector_literal(e);
                        }
                    }
                }
            }
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } => {
                if let Some(target) = vector_cast_type(data_type) {
                    *data_type = target;
                }
                if is_float_array(data_type) {
                    **inner = vector_literal(inner);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// `VECTOR(n)` → `FLOAT[n]`, `VECTOR` → `FLOAT[]`; `None` for any other type.
fn vector_cast_type(data_type: &SqlType) -> Option<SqlType> {
    let SqlType::Custom(name, modifiers) = data_type else {
        return None;
    };
    if !name.to_string().eq_ignore_ascii_case("vector") {
        return None;
    }
    let dim = match modifiers.as_slice() {
        [] => None,
        [n] => Some(n.parse::<u64>().ok().filter(|n| *n > 0)?),
        _ => return None,
    };
    Some(SqlType::Array(ArrayElemTypeDef::SquareBracket(
        Box::new(SqlType::Float(
            datafusion::sql::sqlparser::ast::ExactNumberInfo::None,
        )),
        dim,
    )))
}

/// `FLOAT[n]`, `REAL[]`, `DOUBLE[n]`, ...: an array of floating-point numbers.
fn is_float_array(data_type: &SqlType) -> bool {
    let SqlType::Array(ArrayElemTypeDef::SquareBracket(item, _)) = data_type else {
        return false;
    };
    matches!(
        item.as_ref(),
        SqlType::Float(_)
            | SqlType::Float4
            | SqlType::Float8
            | SqlType::Float32
            | SqlType::Float64
            | SqlType::Real
            | SqlType::Double(_)
            | SqlType::DoublePrecision
    )
}

/// Turns pgvector text literals (`'[1, 2, 3]'`) in the VALUES rows of an INSERT into array
/// literals where they go into a vector column (`is_vector(i)`: whether the `i`-th value of a
/// row goes into one), as pgvector accepts `INSERT ... VALUES ('[1,2,3]')`. Other columns keep
/// their strings: a TEXT column may hold `'[1,2]'` as text.
pub fn vector_text_in_values(insert: &mut Insert, is_vector: impl Fn(usize) -> bool) {
    let Some(source) = insert.source.as_mut() else {
        return;
    };
    let SetExpr::Values(values) = source.body.as_mut() else {
        return;
    };
    for row in &mut values.rows {
        for (i, e) in row.iter_mut().enumerate() {
            if is_vector(i) {
                *e = vector_literal(e);
            }
        }
    }
}

/// `e`, or the array literal a pgvector text literal `'[1, 2]'` spells.
fn vector_literal(e: &Expr) -> Expr {
    let Expr::Value(v) = e else {
        return e.clone();
    };
    let Value::SingleQuotedString(text) = &v.value else {
        return e.clone();
    };
    let Some(numbers) = parse_vector_text(text) else {
        return e.clone();
    };
    let elem = numbers
        .iter()
        .map(|x| {
            let magnitude = Expr::value(Value::Number(format!("{}", x.abs()), false));
            if x.is_sign_negative() {
                Expr::UnaryOp {
                    op: UnaryOperator::Minus,
                    expr: Box::new(magnitude),
                }
            } else {
                magnitude
            }
        })
        .collect();
    Expr::Array(Array { elem, named: false })
}

/// A call of function `name` with `args` (the AST fragvec's rewrites build).
pub fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|e| FunctionArg::Unnamed(FunctionArgExpr::Expr(e)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{FragvecStatement, parse_statements};

    fn parsed(sql: &str) -> String {
        match parse_statements(sql).unwrap().remove(0) {
            FragvecStatement::DataFusion(s) => s.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn operators_become_distance_calls() {
        assert_eq!(
            parsed("SELECT emb <-> [1, 2] AS d, emb<#>q FROM t ORDER BY emb <-> [1, 2] LIMIT 3"),
            "SELECT l2_distance(emb, [1, 2]) AS d, negative_inner_product(emb, q) FROM t \
             ORDER BY l2_distance(emb, [1, 2]) LIMIT 3"
        );
        assert_eq!(
            parsed("EXPLAIN SELECT id FROM v ORDER BY emb <-> [0, 0] LIMIT 3"),
            "EXPLAIN SELECT id FROM v ORDER BY l2_distance(emb, [0, 0]) LIMIT 3"
        );
        // `<=>` is left for planning, which knows the operand types.
        assert_eq!(parsed("SELECT emb <=> q FROM t"), "SELECT emb <=> q FROM t");
        // Postgres' explicit operator syntax means the same.
        assert_eq!(
            parsed("SELECT a OPERATOR(<->) b, a OPERATOR(pg_catalog.<#>) b, a OPERATOR(<=>) b"),
            "SELECT l2_distance(a, b), negative_inner_product(a, b), cosine_distance(a, b)"
        );
    }

    #[test]
    fn operators_bind_like_comparisons() {
        for (sql, expected) in [
            ("SELECT a <-> b < 1.0", "SELECT l2_distance(a, b) < 1.0"),
            ("SELECT a <-> b + c", "SELECT l2_distance(a, b + c)"),
            (
                "SELECT a <-> b BETWEEN 0 AND 1",
                "SELECT l2_distance(a, b) BETWEEN 0 AND 1",
            ),
            (
                "SELECT a <-> b IS NULL AND c <#> d > 2",
                "SELECT l2_distance(a, b) IS NULL AND negative_inner_product(c, d) > 2",
            ),
            ("SELECT NOT a <-> b < 1", "SELECT NOT l2_distance(a, b) < 1"),
            (
                "SELECT a <-> b <-> c",
                "SELECT l2_distance(l2_distance(a, b), c)",
            ),
            ("SELECT a <=> b < 1", "SELECT a <=> b < 1"),
        ] {
            assert_eq!(parsed(sql), expected, "{sql}");
        }
    }

    #[test]
    fn separated_or_other_tokens_stay() {
        // `<` then a negative number, `<` then `- >`: not the operator.
        assert_eq!(parsed("SELECT a<-1"), "SELECT a < -1");
        assert!(parse_statements("SELECT a < -> b").is_err());
        // Inside strings and comments nothing changes.
        assert_eq!(
            parsed("SELECT '<->' /* a <-> b */ FROM t"),
            "SELECT '<->' FROM t"
        );
    }

    #[test]
    fn vector_casts_and_text_literals() {
        assert_eq!(
            parsed("SELECT [1, 2]::VECTOR(2), CAST(x AS vector), '[3, -4.5]'::vector(2)"),
            "SELECT [1, 2]::FLOAT[2], CAST(x AS FLOAT[]), [3, -4.5]::FLOAT[2]"
        );
        assert_eq!(
            parsed("SELECT emb <-> '[1,2e1]', cosine_distance(emb, ' [0.5] '), '[1]'::FLOAT[1]"),
            "SELECT l2_distance(emb, [1, 20]), cosine_distance(emb, [0.5]), [1]::FLOAT[1]"
        );
        // Strings that are not vectors, or passed to other functions, stay strings.
        assert_eq!(
            parsed("SELECT l2_distance(emb, '[1, x]'), upper('[1]')"),
            "SELECT l2_distance(emb, '[1, x]'), upper('[1]')"
        );
        // A dimension that is not positive stays unknown to DataFusion, which says so.
        assert_eq!(parsed("SELECT x::VECTOR(0)"), "SELECT x::VECTOR(0)");
    }

    #[test]
    fn vector_text_parses_numbers_only() {
        assert_eq!(
            parse_vector_text("[1, -2.5,3e2]"),
            Some(vec![1.0, -2.5, 300.0])
        );
        for bad in ["", "[]", "1, 2", "[1,,2]", "[1, inf]", "[nan]", "{1,2}"] {
            assert_eq!(parse_vector_text(bad), None, "{bad}");
        }
    }
}

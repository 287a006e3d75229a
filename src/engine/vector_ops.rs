//! Planning pgvector's operators: `VectorOperatorPlanner`, an `ExprPlanner`.
//!
//! The front end turns `<->` and `<#>` into function calls while parsing
//! ([`crate::sql::vector_syntax`]); `<=>` it cannot, because DataFusion already gives it a
//! meaning (`IS NOT DISTINCT FROM`) and only the operand types tell the two apart. Here they
//! are known: when either operand is a vector (`VECTOR(n)`, i.e. a `FixedSizeList` of
//! numbers, such as a vector column or a `::VECTOR(n)` cast), `a <=> b` is
//! `cosine_distance(a, b)` and a pgvector text literal `'[1, 2]'` on the other side is read as
//! a vector; otherwise it stays DataFusion's `IS NOT DISTINCT FROM` (so `NULL <=> NULL` is
//! true and `[1, 2] <=> [1, 2]`, two lists, compares them). The explicit operator syntax
//! `a OPERATOR(<->) b` reaching DataFusion's own parser (say through `SessionContext::sql`)
//! is planned here too.

use std::sync::Arc;

use datafusion::arrow::array::ListArray;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{Expr, ExprSchemable, ScalarUDF};
use datafusion::sql::sqlparser::ast::BinaryOperator;

use super::udf::{DistanceKind, DistanceUdf};
use crate::sql::vector_syntax::{operator_function, parse_vector_text};

/// Plans pgvector's operators (`<->`, `<=>`, `<#>`) as fragvec's distance functions, by
/// operand type.
#[derive(Debug, Default)]
pub struct VectorOperatorPlanner;

/// A `VECTOR(n)`-like type: a fixed-size list of numbers.
fn is_vector_type(t: &DataType) -> bool {
    matches!(t, DataType::FixedSizeList(item, _) if item.data_type().is_numeric())
}

fn is_vector(e: &Expr, schema: &DFSchema) -> bool {
    e.get_type(schema).is_ok_and(|t| is_vector_type(&t))
}

/// A string literal spelling a vector, as a list literal.
fn vector_from_text(e: Expr) -> Expr {
    let text = match &e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => s,
        _ => return e,
    };
    match parse_vector_text(text) {
        Some(values) => {
            let list = ListArray::from_iter_primitive::<Float64Type, _, _>([Some(
                values.into_iter().map(Some),
            )]);
            Expr::Literal(ScalarValue::List(Arc::new(list)), None)
        }
        None => e,
    }
}

impl ExprPlanner for VectorOperatorPlanner {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let function = match &expr.op {
            BinaryOperator::Spaceship
                if is_vector(&expr.left, schema) || is_vector(&expr.right, schema) =>
            {
                "cosine_distance"
            }
            BinaryOperator::PGCustomBinaryOperator(parts) => {
                match parts.last().and_then(|op| operator_function(op)) {
                    Some(f) => f,
                    None => return Ok(PlannerResult::Original(expr)),
                }
            }
            _ => return Ok(PlannerResult::Original(expr)),
        };
        let Some(kind) = DistanceKind::from_name(function) else {
            return Ok(PlannerResult::Original(expr));
        };
        let udf = Arc::new(ScalarUDF::new_from_impl(DistanceUdf::new(kind)));
        let args = vec![vector_from_text(expr.left), vector_from_text(expr.right)];
        Ok(PlannerResult::Planned(Expr::ScalarFunction(
            ScalarFunction::new_udf(udf, args),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::common::Column;
    use datafusion::logical_expr::lit;

    fn schema() -> DFSchema {
        let item = Arc::new(Field::new_list_field(DataType::Float32, true));
        DFSchema::try_from(Schema::new(vec![
            Field::new("emb", DataType::FixedSizeList(item.clone(), 2), true),
            Field::new("tags", DataType::List(item), true),
            Field::new("x", DataType::Int64, true),
        ]))
        .unwrap()
    }

    fn plan(op: BinaryOperator, left: Expr, right: Expr) -> String {
        match VectorOperatorPlanner
            .plan_binary_op(RawBinaryExpr { op, left, right }, &schema())
            .unwrap()
        {
            PlannerResult::Planned(e) => e.to_string(),
            PlannerResult::Original(_) => "original".to_string(),
        }
    }

    fn col(name: &str) -> Expr {
        Expr::Column(Column::from_name(name))
    }

    #[test]
    fn spaceship_is_cosine_distance_only_for_vectors() {
        let s = BinaryOperator::Spaceship;
        assert_eq!(
            plan(s.clone(), col("emb"), lit("[1, 0]")),
            "cosine_distance(emb, List([1.0, 0.0]))"
        );
        assert_eq!(
            plan(s.clone(), lit("[1, 0]"), col("emb")),
            "cosine_distance(List([1.0, 0.0]), emb)"
        );
        assert_eq!(
            plan(s.clone(), col("emb"), lit(ScalarValue::Null)),
            "cosine_distance(emb, NULL)"
        );
        // Lists, numbers, strings and NULLs keep IS NOT DISTINCT FROM.
        for (a, b) in [
            (col("tags"), col("tags")),
            (col("x"), lit(1)),
            (lit("[1]"), lit("[1]")),
            (lit(ScalarValue::Null), lit(ScalarValue::Null)),
        ] {
            assert_eq!(plan(s.clone(), a, b), "original");
        }
        assert_eq!(plan(BinaryOperator::Eq, col("emb"), col("emb")), "original");
    }

    #[test]
    fn explicit_operator_syntax_is_planned() {
        let op = |o: &str| BinaryOperator::PGCustomBinaryOperator(vec![o.to_string()]);
        assert_eq!(
            plan(op("<->"), col("emb"), col("emb")),
            "l2_distance(emb, emb)"
        );
        assert_eq!(
            plan(op("<#>"), col("emb"), col("emb")),
            "negative_inner_product(emb, emb)"
        );
        assert_eq!(plan(op("@@"), col("emb"), col("emb")), "original");
    }
}

//! Reusing physical plans of repeated KNN queries.
//!
//! Applications send the same query shape again and again with another query vector. With
//! the vector literals planned as parameters ([`crate::sql::vector_params`]) the pinned
//! statement text (which names the table versions read) identifies the shape, so its physical
//! plan is kept and, for the next vector, rebuilt with the new values: the KNN operator gets
//! the new query vector, and the projection / sort / filter expressions that held the old
//! literals get the new ones. A plan with any other node holding a vector literal, or whose
//! parameters cannot be told apart, is not reused. Planning a 128-d KNN query costs far more
//! than running it, so this is what makes repeated queries cheap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::sorts::sort::SortExec;

use super::knn::KnnExec;

/// Plans kept per session.
const MAX_PLANS: usize = 64;

/// A physical plan and the parameter values it was built with.
#[derive(Debug, Clone)]
pub struct CachedPlan {
    pub plan: Arc<dyn ExecutionPlan>,
    pub params: Vec<Vec<f64>>,
}

#[derive(Debug, Default)]
pub struct PlanCache {
    plans: Mutex<HashMap<String, CachedPlan>>,
}

impl PlanCache {
    pub fn get(&self, key: &str) -> Option<CachedPlan> {
        self.plans.lock().expect("plan cache").get(key).cloned()
    }

    /// Keeps a plan if its parameters can be told apart (distinct values).
    pub fn put(&self, key: String, plan: CachedPlan) {
        for (i, a) in plan.params.iter().enumerate() {
            if plan.params[..i].contains(a) {
                return;
            }
        }
        let mut plans = self.plans.lock().expect("plan cache");
        if plans.len() >= MAX_PLANS {
            plans.clear();
        }
        plans.insert(key, plan);
    }

    pub fn clear(&self) {
        self.plans.lock().expect("plan cache").clear();
    }
}

/// The numbers of a list literal, if it is one.
fn list_values(value: &ScalarValue) -> Option<Vec<f64>> {
    let array = match value {
        ScalarValue::List(a) if a.len() == 1 && !a.is_null(0) => a.value(0),
        ScalarValue::FixedSizeList(a) if a.len() == 1 && !a.is_null(0) => a.value(0),
        _ => return None,
    };
    let values = cast(&array, &DataType::Float64).ok()?;
    let values = values.as_primitive::<Float64Type>();
    (values.null_count() == 0).then(|| values.values().to_vec())
}

/// `new` in the shape of the literal `old` (same list type and element type).
fn literal_like(old: &ScalarValue, new: &[f64]) -> Option<ScalarValue> {
    let list =
        datafusion::arrow::array::ListArray::from_iter_primitive::<Float64Type, _, _>([Some(
            new.iter().copied().map(Some),
        )]);
    let array = cast(&list, &old.data_type()).ok()?;
    ScalarValue::try_from_array(&array, 0).ok()
}

/// Which old parameter a list of values is (compared in `f32`, as vectors are used).
fn param_of(values: &[f64], params: &[Vec<f64>]) -> Option<usize> {
    params.iter().position(|p| {
        p.len() == values.len() && p.iter().zip(values).all(|(a, b)| *a as f32 == *b as f32)
    })
}

/// `expr` with every literal of an old parameter replaced by the new value; `None` if a list
/// literal matches no parameter.
fn rebind_expr(
    expr: &Arc<dyn PhysicalExpr>,
    old: &[Vec<f64>],
    new: &[Vec<f64>],
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let mut unknown = false;
    let out = expr.clone().transform_up(|e| {
        let Some(lit) = e.downcast_ref::<Literal>() else {
            return Ok(Transformed::no(e));
        };
        let Some(values) = list_values(lit.value()) else {
            return Ok(Transformed::no(e));
        };
        match param_of(&values, old).and_then(|i| literal_like(lit.value(), &new[i])) {
            Some(v) => Ok(Transformed::yes(
                Arc::new(Literal::new(v)) as Arc<dyn PhysicalExpr>
            )),
            None => {
                unknown = true;
                Ok(Transformed::no(e))
            }
        }
    })?;
    Ok((!unknown).then_some(out.data))
}

fn holds_list_literal(plan: &Arc<dyn ExecutionPlan>) -> Result<bool> {
    let mut found = false;
    plan.apply_expressions(&mut |e| {
        e.apply(|x| {
            if x.downcast_ref::<Literal>()
                .is_some_and(|l| list_values(l.value()).is_some())
            {
                found = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    Ok(found)
}

/// `plan` for new parameter values, or `None` when it cannot be rebuilt safely.
pub fn rebind(
    plan: &Arc<dyn ExecutionPlan>,
    old: &[Vec<f64>],
    new: &[Vec<f64>],
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if old.len() != new.len() {
        return Ok(None);
    }
    if let Some(knn) = plan.downcast_ref::<KnnExec>() {
        let current: Vec<f64> = knn.query_vector().iter().map(|x| *x as f64).collect();
        let Some(i) = param_of(&current, old) else {
            return Ok(None);
        };
        let vector = new[i].iter().map(|x| *x as f32).collect();
        return Ok(Some(Arc::new(knn.with_vector(vector)?)));
    }
    let mut children = Vec::new();
    for child in plan.children() {
        match rebind(child, old, new)? {
            Some(c) => children.push(c),
            None => return Ok(None),
        }
    }
    let map = |e: &Arc<dyn PhysicalExpr>| rebind_expr(e, old, new);
    if !holds_list_literal(plan)? {
        return Ok(Some(if children.is_empty() {
            plan.clone()
        } else {
            datafusion::physical_plan::execution_plan::replace_children_if_necessary(
                plan.clone(),
                children,
            )?
        }));
    }
    let [child] = children.as_slice() else {
        return Ok(None);
    };
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let mut exprs = Vec::with_capacity(p.expr().len());
        for e in p.expr() {
            let Some(expr) = map(&e.expr)? else {
                return Ok(None);
            };
            exprs.push(ProjectionExpr {
                expr,
                alias: e.alias.clone(),
            });
        }
        return Ok(Some(Arc::new(ProjectionExec::try_new(
            exprs,
            child.clone(),
        )?)));
    }
    if let Some(s) = plan.downcast_ref::<SortExec>() {
        let mut exprs = Vec::with_capacity(s.expr().len());
        for e in s.expr().iter() {
            let Some(expr) = map(&e.expr)? else {
                return Ok(None);
            };
            exprs.push(PhysicalSortExpr::new(expr, e.options));
        }
        let Some(ordering) = LexOrdering::new(exprs) else {
            return Ok(None);
        };
        let sort = SortExec::new(ordering, child.clone())
            .with_preserve_partitioning(s.preserve_partitioning())
            .with_fetch(s.fetch());
        return Ok(Some(Arc::new(sort)));
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>()
        && f.projection().is_none()
    {
        let Some(predicate) = map(f.predicate())? else {
            return Ok(None);
        };
        return Ok(Some(Arc::new(FilterExec::try_new(
            predicate,
            child.clone(),
        )?)));
    }
    Ok(None)
}

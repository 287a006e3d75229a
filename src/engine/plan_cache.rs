//! Reusing physical plans of repeated KNN queries.
//!
//! Applications send the same query shape again and again with another query vector. With
//! the vector literals planned as parameters ([`crate::sql::vector_params`]) the pinned
//! statement text (which names the table versions read) identifies the shape, so its physical
//! plan is kept and, for the next vector, rebuilt with the new values: the KNN operator gets
//! the new query vector, and the projection / sort / filter expressions that held the old
//! literals get the new ones. Only plans made of a projection, a top-k sort and one KNN
//! operator (the shape of `SELECT ... ORDER BY <distance> LIMIT k`) are kept, and every node is
//! rebuilt fresh for each use, so no run-time state (such as the sort's dynamic filter) is
//! shared between runs. A plan is not kept when a parameter cannot be found in it (folded into
//! a constant), when parameters cannot be told apart, or when the pushed-down filter holds a
//! vector. Planning a 128-d KNN query costs far more than running it, so this is what makes
//! repeated queries cheap.
//!
//! In a kept plan the vector literals are [`VectorParam`]s: a re-bind then swaps values by
//! parameter number, and the sort built over the new value derives its properties without
//! comparing and hashing a list literal element by element.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};

use super::knn::KnnExec;
use super::options::OptionsFingerprint;
use crate::format::store::Snapshot;

mod foreign;
mod knn_order;
mod vector_param;
pub use foreign::{ForeignInputs, ForeignNodes, NoForeignNodes};
pub use knn_order::KnnOrderExec;
pub use vector_param::VectorParam;

/// Plans kept per session.
const MAX_PLANS: usize = 64;

/// A physical plan and the parameter values it was built with.
#[derive(Debug, Clone)]
pub struct CachedPlan {
    /// The physical plan, run again for a statement with the same key (its vector
    /// parameters re-bound).
    pub plan: Arc<dyn ExecutionPlan>,
    /// The vector parameters it was built with (what a re-bind replaces).
    pub params: Vec<Vec<f64>>,
}

/// What running one statement text taught about every text of its shape (the same text
/// outside its vector literals, see [`crate::sql::vector_shape`]): the cached plan that
/// answers it while the conditions it was planned under still hold.
#[derive(Debug, Clone)]
pub struct KnownShape {
    /// The parser dialect the text was parsed in.
    pub dialect: datafusion::config::Dialect,
    /// `fragvec.*` options the plan was made under.
    pub options: OptionsFingerprint,
    /// Tables pinned to their newest version, with that version.
    pub versions: Vec<(String, u64)>,
    /// The kept plan that answers it (held here, not looked up by its [`PlanCache`] key:
    /// a plan moved on to a newer version, see [`retarget`], no longer answers its key's
    /// pinned statement).
    pub plan: CachedPlan,
    /// Length of each vector literal, in text order.
    pub lengths: Vec<usize>,
    /// The parameter each vector literal is, in text order.
    pub bindings: Vec<usize>,
}

/// What one full run of a statement learnt about its plan (filled by the query path when the
/// run used or kept a cached plan; read by `engine::statements::shapes`).
#[derive(Debug, Default)]
pub struct ShapeNote(Mutex<Option<Learnt>>);

/// See [`ShapeNote::learnt`].
#[derive(Debug)]
pub struct Learnt {
    /// The kept plan it ran on.
    pub plan: CachedPlan,
    /// The `fragvec.*` options it was planned under.
    pub options: OptionsFingerprint,
    /// Each table it read, at its version.
    pub versions: Vec<(String, u64)>,
    /// The vector parameters of the statement that ran.
    pub params: Vec<Vec<f64>>,
}

impl ShapeNote {
    /// The run used the kept `plan`, made under `options`, reading the `versions` its
    /// tables were pinned to, with vector parameters `params`.
    pub fn learnt(
        &self,
        plan: &CachedPlan,
        options: OptionsFingerprint,
        versions: &[(String, u64)],
        params: &[Vec<f64>],
    ) {
        *self.0.lock().expect("shape note") = Some(Learnt {
            plan: plan.clone(),
            options,
            versions: versions.to_vec(),
            params: params.to_vec(),
        });
    }

    /// What the run learnt, if it used or kept a plan.
    pub fn into_learnt(self) -> Option<Learnt> {
        self.0.into_inner().ok().flatten()
    }
}

/// A session's kept KNN plans by statement key, and the statement shapes that reuse them.
#[derive(Debug, Default)]
pub struct PlanCache {
    plans: Mutex<HashMap<String, CachedPlan>>,
    shapes: Mutex<HashMap<String, Arc<KnownShape>>>,
    /// The task context queries run in, made once: building one copies the session's
    /// configuration and function registries, which costs a repeated KNN query more than
    /// its plan does. Dropped with the plans, by any statement but a query (a `SET` among
    /// them).
    task: Mutex<Option<Arc<TaskContext>>>,
    reused: std::sync::atomic::AtomicU64,
    shapes_reused: std::sync::atomic::AtomicU64,
    /// The nodes a planner above the engine puts into this session's plans.
    foreign: OnceLock<Arc<dyn ForeignNodes>>,
}

impl PlanCache {
    /// Lets kept plans hold the foreign `nodes` (set once, when the session is made).
    pub fn set_foreign(&self, nodes: Arc<dyn ForeignNodes>) {
        let _ = self.foreign.set(nodes);
    }

    /// The foreign nodes this session's plans may hold.
    pub fn foreign(&self) -> &dyn ForeignNodes {
        self.foreign.get().map_or(&NoForeignNodes, |n| n.as_ref())
    }

    /// What is known of the statement texts of shape `text`.
    pub fn shape(&self, text: &str) -> Option<Arc<KnownShape>> {
        self.shapes.lock().expect("shape cache").get(text).cloned()
    }

    /// Remembers a shape (bounded like the plans: past the bound the map starts over).
    pub fn learn_shape(&self, text: String, shape: KnownShape) {
        let mut shapes = self.shapes.lock().expect("shape cache");
        if shapes.len() >= MAX_PLANS && !shapes.contains_key(&text) {
            shapes.clear();
        }
        shapes.insert(text, Arc::new(shape));
    }

    /// The plan kept under `key`.
    pub fn get(&self, key: &str) -> Option<CachedPlan> {
        self.plans.lock().expect("plan cache").get(key).cloned()
    }

    /// Counts a plan reused (for tests and diagnostics).
    pub fn note_reuse(&self) {
        self.reused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts a query answered from its shape, without parsing.
    pub fn note_shape_reuse(&self) {
        self.shapes_reused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many queries were answered from their shape, without parsing.
    pub fn shapes_reused(&self) -> u64 {
        self.shapes_reused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many queries ran on a reused plan.
    pub fn reused(&self) -> u64 {
        self.reused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keeps a plan if its parameters can be told apart (distinct values); whether it did.
    pub fn put(&self, key: String, plan: CachedPlan) -> bool {
        for (i, a) in plan.params.iter().enumerate() {
            let a: Vec<f64> = a.iter().map(|x| *x as f32 as f64).collect();
            if param_of(&a, &plan.params[..i]).is_some() {
                return false;
            }
        }
        let mut plans = self.plans.lock().expect("plan cache");
        if plans.len() >= MAX_PLANS {
            plans.clear();
        }
        plans.insert(key, plan);
        true
    }

    /// Forgets every plan and shape (after DDL, say).
    pub fn clear(&self) {
        self.plans.lock().expect("plan cache").clear();
        self.shapes.lock().expect("shape cache").clear();
        *self.task.lock().expect("task context") = None;
    }

    /// The kept task context, made with `make` when there is none.
    pub fn task_ctx(&self, make: impl FnOnce() -> Arc<TaskContext>) -> Arc<TaskContext> {
        self.task
            .lock()
            .expect("task context")
            .get_or_insert_with(make)
            .clone()
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

/// `expr` with every vector parameter (a [`VectorParam`], or a list literal equal to an old
/// parameter's value) replaced by a [`VectorParam`] of the new value (by a list literal when
/// `literals`: in a plan that is sent elsewhere to run); `None` if a list literal matches no
/// parameter.
fn rebind_expr(
    expr: &Arc<dyn PhysicalExpr>,
    old: &[Vec<f64>],
    new: &[Vec<f64>],
    literals: bool,
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let mut unknown = false;
    let out = expr.clone().transform_up(|e| {
        let bound = if let Some(p) = e.downcast_ref::<VectorParam>() {
            new.get(p.index())
                .and_then(|v| literal_like(p.value(), v))
                .map(|v| (p.index(), v))
        } else if let Some(lit) = e.downcast_ref::<Literal>() {
            let Some(values) = list_values(lit.value()) else {
                return Ok(Transformed::no(e));
            };
            param_of(&values, old).and_then(|i| literal_like(lit.value(), &new[i]).map(|v| (i, v)))
        } else {
            return Ok(Transformed::no(e));
        };
        match bound {
            Some((_, v)) if literals => Ok(Transformed::yes(
                Arc::new(Literal::new(v)) as Arc<dyn PhysicalExpr>
            )),
            Some((i, v)) => Ok(Transformed::yes(
                Arc::new(VectorParam::new(i, v)) as Arc<dyn PhysicalExpr>
            )),
            None => {
                unknown = true;
                Ok(Transformed::no(e))
            }
        }
    })?;
    if unknown {
        return Ok(None);
    }
    // Unchanged: the same expression, so callers can tell nothing moved (`Arc::ptr_eq`).
    Ok(Some(if out.transformed {
        out.data
    } else {
        expr.clone()
    }))
}

/// `plan` over `child` when its own expressions are unchanged: the child's properties are
/// the old child's but for the query vector's value, so the node's computed properties are
/// kept rather than derived again (an equivalence analysis that costs more than a small
/// KNN search), and its run-time state (a top-k sort's dynamic filter, metrics) is fresh.
fn same_node(
    plan: &Arc<dyn ExecutionPlan>,
    child: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    Arc::clone(plan)
        .replace_children(
            vec![child],
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep),
        )?
        .reset_state()
}

/// The re-bound sort of `ordering` keeping `fetch` rows over `child`, as a [`KnnOrderExec`]
/// with the kept sort's `props` (see its module): when `child` is a [`KnnExec`] (under a
/// `CooperativeExec`; one partition either way) that returns no more rows than the sort
/// keeps. `None` otherwise.
fn knn_order(
    ordering: &LexOrdering,
    fetch: Option<usize>,
    child: &Arc<dyn ExecutionPlan>,
    props: &Arc<datafusion::physical_plan::PlanProperties>,
) -> Option<Arc<dyn ExecutionPlan>> {
    let mut node = child;
    while node.downcast_ref::<CooperativeExec>().is_some() {
        let [below] = node.children()[..] else {
            return None;
        };
        node = below;
    }
    let knn = node.downcast_ref::<KnnExec>()?;
    let bounded = fetch.is_some_and(|f| knn.query().k <= f);
    bounded.then(|| -> Arc<dyn ExecutionPlan> {
        Arc::new(KnnOrderExec::new(
            ordering.clone(),
            fetch,
            child.clone(),
            props.clone(),
        ))
    })
}

/// A sort order with every vector parameter replaced (see [`rebind_expr`]).
fn rebind_ordering(
    ordering: &LexOrdering,
    old: &[Vec<f64>],
    new: &[Vec<f64>],
    literals: bool,
) -> Result<Option<LexOrdering>> {
    let mut exprs = Vec::with_capacity(ordering.len());
    for e in ordering.iter() {
        let Some(expr) = rebind_expr(&e.expr, old, new, literals)? else {
            return Ok(None);
        };
        exprs.push(PhysicalSortExpr::new(expr, e.options));
    }
    Ok(LexOrdering::new(exprs))
}

/// The snapshot the KNN operator of a [`reusable`] plan searches (the operator as
/// planned, under per-task variants).
pub fn searched_snapshot(
    plan: &Arc<dyn ExecutionPlan>,
    foreign: &dyn ForeignNodes,
) -> Option<Snapshot> {
    let mut node = plan.clone();
    loop {
        if let Some(knn) = node.downcast_ref::<KnnExec>() {
            return Some(knn.scan_spec().snapshot.clone());
        }
        node = match foreign.inputs(&node) {
            Some(ForeignInputs::Through(input) | ForeignInputs::Shipped(input)) => input,
            Some(ForeignInputs::Variants(variants)) => variants.into_iter().next()?,
            None => {
                let children = node.children();
                let [child] = children.as_slice() else {
                    return None;
                };
                Arc::clone(child)
            }
        };
    }
}

/// Whether `plan` has the shape a reused plan may have (projection / top-k sort /
/// cooperative wrapper above exactly one KNN operator whose filter holds no vector, or the
/// foreign nodes of `foreign` around them, a leaf's variants counting as one operator), and
/// every parameter appears in it.
pub fn reusable(
    plan: &Arc<dyn ExecutionPlan>,
    params: &[Vec<f64>],
    foreign: &dyn ForeignNodes,
) -> Result<bool> {
    let mut seen = vec![false; params.len()];
    let mut ok = true;
    let knns = knns_under(plan, params, foreign, &mut seen, &mut ok)?;
    Ok(ok && knns == Some(1) && seen.iter().all(|s| *s))
}

/// The KNN operators under `node` when every node there may be in a kept plan (`None`
/// otherwise); marks the parameters found in `seen`, and clears `ok` for a vector that is
/// no parameter or a filter that holds one.
fn knns_under(
    node: &Arc<dyn ExecutionPlan>,
    params: &[Vec<f64>],
    foreign: &dyn ForeignNodes,
    seen: &mut [bool],
    ok: &mut bool,
) -> Result<Option<usize>> {
    if let Some(knn) = node.downcast_ref::<KnnExec>() {
        let v: Vec<f64> = knn.query_vector().iter().map(|x| *x as f64).collect();
        match param_of(&v, params) {
            Some(i) => seen[i] = true,
            None => *ok = false,
        }
        if let Some(p) = &knn.scan_spec().predicate
            && holds_list(p)
        {
            *ok = false;
        }
        return Ok(Some(1));
    }
    match foreign.inputs(node) {
        Some(ForeignInputs::Through(input) | ForeignInputs::Shipped(input)) => {
            return knns_under(&input, params, foreign, seen, ok);
        }
        Some(ForeignInputs::Variants(variants)) => {
            for v in &variants {
                if knns_under(v, params, foreign, seen, ok)? != Some(1) {
                    return Ok(None);
                }
            }
            return Ok(Some(1));
        }
        None => {}
    }
    let allowed = node.downcast_ref::<ProjectionExec>().is_some()
        || node
            .downcast_ref::<SortExec>()
            .is_some_and(|s| s.fetch().is_some())
        || node.downcast_ref::<SortPreservingMergeExec>().is_some()
        || node.downcast_ref::<CoalescePartitionsExec>().is_some()
        || node.downcast_ref::<RepartitionExec>().is_some_and(|r| {
            !r.preserve_order() && matches!(r.partitioning(), Partitioning::RoundRobinBatch(_))
        })
        || node.downcast_ref::<CooperativeExec>().is_some();
    let children = node.children();
    let [child] = children.as_slice() else {
        return Ok(None);
    };
    if !allowed {
        return Ok(None);
    }
    node.apply_expressions(&mut |e| {
        e.apply(|x| {
            if let Some(l) = x.downcast_ref::<Literal>()
                && let Some(values) = list_values(l.value())
            {
                match param_of(&values, params) {
                    Some(i) => seen[i] = true,
                    None => *ok = false,
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    knns_under(child, params, foreign, seen, ok)
}

fn holds_list(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let mut found = false;
    let _ = expr.apply(|x| {
        if x.downcast_ref::<Literal>()
            .is_some_and(|l| list_values(l.value()).is_some())
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// A fresh copy of a [`reusable`] plan for new parameter values (every node rebuilt, so
/// nothing of an earlier run is shared, its vector literals as [`VectorParam`]s; foreign
/// nodes rebuilt by `foreign`), or `None` when it cannot be rebuilt.
pub fn rebind(
    plan: &Arc<dyn ExecutionPlan>,
    old: &[Vec<f64>],
    new: &[Vec<f64>],
    foreign: &dyn ForeignNodes,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if old.len() != new.len() || old.iter().zip(new).any(|(a, b)| a.len() != b.len()) {
        return Ok(None);
    }
    rebind_nodes(plan, old, new, foreign, false)
}

/// [`rebind`] of `plan`, its vectors as list literals when `literals` (see [`rebind_expr`]).
fn rebind_nodes(
    plan: &Arc<dyn ExecutionPlan>,
    old: &[Vec<f64>],
    new: &[Vec<f64>],
    foreign: &dyn ForeignNodes,
    literals: bool,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(knn) = plan.downcast_ref::<KnnExec>() {
        let current: Vec<f64> = knn.query_vector().iter().map(|x| *x as f64).collect();
        let Some(i) = param_of(&current, old) else {
            return Ok(None);
        };
        let vector = new[i].iter().map(|x| *x as f32).collect();
        return Ok(Some(Arc::new(knn.with_vector(vector)?)));
    }
    if let Some(inputs) = foreign.inputs(plan) {
        let (inputs, literals) = match inputs {
            ForeignInputs::Through(input) => (vec![input], literals),
            ForeignInputs::Shipped(input) => (vec![input], true),
            ForeignInputs::Variants(variants) => (variants, literals),
        };
        let mut rebound = Vec::with_capacity(inputs.len());
        for input in &inputs {
            let Some(input) = rebind_nodes(input, old, new, foreign, literals)? else {
                return Ok(None);
            };
            rebound.push(input);
        }
        return foreign.rebuild(plan, rebound).map(Some);
    }
    let children = plan.children();
    let [child] = children.as_slice() else {
        return Ok(None);
    };
    let Some(child) = rebind_nodes(child, old, new, foreign, literals)? else {
        return Ok(None);
    };
    let map = |e: &Arc<dyn PhysicalExpr>| rebind_expr(e, old, new, literals);
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let mut exprs = Vec::with_capacity(p.expr().len());
        let mut same = true;
        for e in p.expr() {
            let Some(expr) = map(&e.expr)? else {
                return Ok(None);
            };
            same &= Arc::ptr_eq(&expr, &e.expr);
            exprs.push(ProjectionExpr {
                expr,
                alias: e.alias.clone(),
            });
        }
        if same {
            return Ok(Some(same_node(plan, child)?));
        }
        return Ok(Some(Arc::new(ProjectionExec::try_new(exprs, child)?)));
    }
    if let Some(s) = plan.downcast_ref::<SortExec>() {
        let Some(ordering) = rebind_ordering(s.expr(), old, new, literals)? else {
            return Ok(None);
        };
        if ordering
            .iter()
            .zip(s.expr().iter())
            .all(|(a, b)| Arc::ptr_eq(&a.expr, &b.expr))
        {
            return Ok(Some(same_node(plan, child)?));
        }
        if let Some(order) = knn_order(&ordering, s.fetch(), &child, s.properties()) {
            return Ok(Some(order));
        }
        let sort = SortExec::new(ordering, child)
            .with_preserve_partitioning(s.preserve_partitioning())
            .with_fetch(s.fetch());
        return Ok(Some(Arc::new(sort)));
    }
    if let Some(o) = plan.downcast_ref::<KnnOrderExec>() {
        let Some(ordering) = rebind_ordering(o.expr(), old, new, literals)? else {
            return Ok(None);
        };
        return Ok(knn_order(&ordering, o.fetch(), &child, o.properties()));
    }
    if let Some(m) = plan.downcast_ref::<SortPreservingMergeExec>() {
        let Some(ordering) = rebind_ordering(m.expr(), old, new, literals)? else {
            return Ok(None);
        };
        let merge = SortPreservingMergeExec::new(ordering, child).with_fetch(m.fetch());
        return Ok(Some(Arc::new(merge)));
    }
    if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
        return Ok(Some(Arc::new(
            CoalescePartitionsExec::new(child).with_fetch(c.fetch()),
        )));
    }
    if let Some(r) = plan.downcast_ref::<RepartitionExec>() {
        return Ok(Some(Arc::new(RepartitionExec::try_new(
            child,
            r.partitioning().clone(),
        )?)));
    }
    if plan.downcast_ref::<CooperativeExec>().is_some() {
        return Ok(Some(same_node(plan, child)?));
    }
    Ok(None)
}

/// The kept [`reusable`] plan reading `snapshot` instead of the version it was planned on,
/// when planning the query over `snapshot` would give the same plan
/// ([`KnnExec::at_snapshot`]); `None` otherwise. Nodes above the search keep their
/// properties: they depend on the schema, which is the same.
pub fn retarget(
    plan: &Arc<dyn ExecutionPlan>,
    snapshot: Snapshot,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(knn) = plan.downcast_ref::<KnnExec>() {
        let moved = knn.at_snapshot(snapshot)?;
        return Ok(moved.map(|k| Arc::new(k) as Arc<dyn ExecutionPlan>));
    }
    let children = plan.children();
    let [child] = children.as_slice() else {
        return Ok(None);
    };
    match retarget(child, snapshot)? {
        Some(child) => Ok(Some(same_node(plan, child)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::logical_expr::ColumnarValue;

    fn list_f32(values: &[f64]) -> ScalarValue {
        let list = datafusion::arrow::array::ListArray::from_iter_primitive::<
            datafusion::arrow::datatypes::Float32Type,
            _,
            _,
        >([Some(values.iter().map(|v| Some(*v as f32)))]);
        ScalarValue::try_from_array(&list, 0).unwrap()
    }

    fn value_of(expr: &Arc<dyn PhysicalExpr>) -> ScalarValue {
        let batch = RecordBatch::new_empty(Arc::new(Schema::empty()));
        match expr.evaluate(&batch).unwrap() {
            ColumnarValue::Scalar(v) => v,
            ColumnarValue::Array(_) => panic!("a parameter evaluates to a scalar"),
        }
    }

    #[test]
    fn a_literal_becomes_a_parameter_and_parameters_rebind_by_number() {
        let a = vec![1.0, 2.0];
        let b = vec![3.0, 4.5];
        let c = vec![-1.0, 0.25];
        let literal: Arc<dyn PhysicalExpr> = Arc::new(Literal::new(list_f32(&a)));
        // Two parameters of the same length: the literal is the second.
        let old = vec![vec![9.0, 9.0], a.clone()];
        let kept = rebind_expr(&literal, &old, &[vec![0.0, 0.0], b.clone()], false)
            .unwrap()
            .expect("the literal is a parameter");
        let param = kept.downcast_ref::<VectorParam>().expect("a parameter");
        assert_eq!(param.index(), 1);
        assert_eq!(value_of(&kept), list_f32(&b));
        assert_eq!(
            kept.data_type(&Schema::empty()).unwrap(),
            list_f32(&a).data_type()
        );
        // A kept parameter rebinds by its number, whatever the old values say.
        let again = rebind_expr(&kept, &[], &[vec![7.0, 7.0], c.clone()], false)
            .unwrap()
            .unwrap();
        assert_eq!(value_of(&again), list_f32(&c));
        assert_eq!(format!("{again}"), format!("{}", list_f32(&c)));
        // A list literal of no parameter: not rebindable.
        assert!(
            rebind_expr(&literal, &[b], std::slice::from_ref(&c), false)
                .unwrap()
                .is_none()
        );
        // A parameter number the new values do not have: not rebindable.
        assert!(
            rebind_expr(&kept, &[], std::slice::from_ref(&c), false)
                .unwrap()
                .is_none()
        );
        // In a plan sent elsewhere to run, a parameter is re-bound as the literal it stands for.
        let shipped = rebind_expr(&kept, &[], &[vec![7.0, 7.0], c.clone()], true)
            .unwrap()
            .unwrap();
        let literal = shipped.downcast_ref::<Literal>().expect("a literal");
        assert_eq!(literal.value(), &list_f32(&c));
    }
}

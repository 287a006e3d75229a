//! The physical optimizer rule that answers `ORDER BY <distance>(col, <constant>) LIMIT k`
//! with a [`KnnExec`].
//!
//! It looks for `SortExec(fetch = k)` on one sort key whose input reaches a
//! [`FragmentScanExec`] through projections, repartitions and batch coalescing only, resolves
//! the key through the projections (so an aliased, projected distance works), and requires:
//! one of fragvec's distance functions over a vector column and a constant vector, the
//! direction that means "nearest first" (ASC for `l2_distance`, `cosine_distance`,
//! `negative_inner_product`; DESC NULLS LAST for `inner_product`), and an index on the column
//! with that metric. It then replaces only the scan: the sort stays and orders the k rows by
//! their exact distances. Anything else (OFFSET keeps a larger fetch and works; no LIMIT, other
//! functions, non-constant queries, `DESC NULLS FIRST`) is left to DataFusion's exact TopK.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float32Type, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::expressions::{CastExpr, Column, TryCastExpr};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};

use super::knn::{KnnExec, KnnQuery};
use super::options::FragvecOptions;
use super::scan::FragmentScanExec;
use super::udf::DistanceKind;
use crate::format::types::vector_dim;
use crate::index::distance::Metric;

/// The physical optimizer rule that replaces a top-k sort by a vector distance over a fragvec
/// table (with its filter) by a [`KnnExec`].
#[derive(Debug, Default)]
pub struct KnnRule;

impl PhysicalOptimizerRule for KnnRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let nprobes = config
            .extensions
            .get::<FragvecOptions>()
            .map_or(FragvecOptions::default().nprobes, |o| o.nprobes);
        plan.transform_down(|node| {
            let Some(sort) = node.downcast_ref::<SortExec>() else {
                return Ok(Transformed::no(node));
            };
            match rewrite_sort(sort, nprobes)? {
                Some(input) => Ok(Transformed::yes(node.clone().replace_children(
                    vec![input],
                    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
                )?)),
                None => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "fragvec_knn"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The sort's input with its scan replaced by a KNN search, if the sort is a KNN query.
fn rewrite_sort(sort: &SortExec, nprobes: usize) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(k) = sort.fetch() else {
        return Ok(None);
    };
    let [key] = sort.expr().as_ref() else {
        return Ok(None);
    };
    let mut expr = key.expr.clone();
    let mut node = sort.input().clone();
    // Walk down to the scan, rewriting the sort key in terms of each input.
    let scan = loop {
        if let Some(scan) = node.downcast_ref::<FragmentScanExec>() {
            break scan;
        }
        if let Some(p) = node.downcast_ref::<ProjectionExec>() {
            let exprs: Vec<Arc<dyn PhysicalExpr>> =
                p.expr().iter().map(|e| e.expr.clone()).collect();
            // Bottom-up, so a substituted expression is not itself rewritten again.
            expr = expr
                .transform_up(|e| match e.downcast_ref::<Column>() {
                    Some(c) => Ok(Transformed::yes(exprs[c.index()].clone())),
                    None => Ok(Transformed::no(e)),
                })?
                .data;
            node = p.input().clone();
            continue;
        }
        if matches!(
            node.name(),
            "RepartitionExec" | "CoalesceBatchesExec" | "CooperativeExec"
        ) && node.children().len() == 1
        {
            node = node.children()[0].clone();
            continue;
        }
        return Ok(None);
    };
    let Some(function) = expr.downcast_ref::<ScalarFunctionExpr>() else {
        return Ok(None);
    };
    let Some((metric, descending)) = nearest_first(function.name()) else {
        return Ok(None);
    };
    if key.options.descending != descending {
        return Ok(None);
    }
    let nulls_first = key.options.nulls_first;
    if nulls_first && metric == Metric::Cosine {
        return Ok(None);
    }
    let [a, b] = function.args() else {
        return Ok(None);
    };
    let (column, constant) = match (vector_column(a), vector_column(b)) {
        (Some(c), None) => (c, b),
        (None, Some(c)) => (c, a),
        _ => return Ok(None),
    };
    let Some(vector) = constant_vector(constant)? else {
        return Ok(None);
    };
    let spec = scan.spec();
    let column_name = spec
        .work_schema
        .field(spec.output_indices[column.index()])
        .name()
        .clone();
    let Ok(field) = spec.snapshot.schema.field_with_name(&column_name) else {
        return Ok(None);
    };
    if vector_dim(field.data_type()) != Some(vector.len() as i32) {
        return Ok(None); // the distance function reports the mismatch when it runs
    }
    let manifest = &spec.snapshot.manifest;
    let Some(index) = manifest
        .indexes
        .iter()
        .find(|i| i.column == column_name && i.metric == metric)
    else {
        return Ok(None);
    };
    let Some(cache) = scan.index_cache() else {
        return Ok(None);
    };
    let query = KnnQuery {
        column: column_name,
        vector,
        metric,
        k,
        nprobes,
        nulls_first,
    };
    let knn: Arc<dyn ExecutionPlan> = Arc::new(KnnExec::new(
        spec.clone(),
        query,
        Some(index.clone()),
        cache.clone(),
    )?);
    let input = sort
        .input()
        .clone()
        .transform_up(|n| {
            if n.downcast_ref::<FragmentScanExec>().is_some() {
                Ok(Transformed::yes(knn.clone()))
            } else {
                Ok(Transformed::no(n))
            }
        })?
        .data;
    Ok(Some(input))
}

/// The metric a distance function measures, and whether nearest first is descending
/// (similarities). DataFusion's `array_distance` (alias `list_distance`) is L2.
pub fn nearest_first(function: &str) -> Option<(Metric, bool)> {
    if function == "array_distance" {
        return Some((Metric::L2, false));
    }
    Some(match DistanceKind::from_name(function)? {
        DistanceKind::L2 => (Metric::L2, false),
        DistanceKind::Cosine => (Metric::Cosine, false),
        DistanceKind::NegativeInnerProduct => (Metric::Dot, false),
        DistanceKind::InnerProduct => (Metric::Dot, true),
    })
}

/// A column, or a cast of it to a list of floats (which keeps every value: vector columns are
/// `Float32`). DataFusion's `array_distance` casts its arguments to `List<Float64>`.
fn vector_column(expr: &Arc<dyn PhysicalExpr>) -> Option<&Column> {
    if let Some(c) = expr.downcast_ref::<Column>() {
        return Some(c);
    }
    let (inner, target) = if let Some(cast) = expr.downcast_ref::<CastExpr>() {
        (cast.expr(), cast.cast_type())
    } else if let Some(cast) = expr.downcast_ref::<TryCastExpr>() {
        (cast.expr(), cast.cast_type())
    } else {
        return None;
    };
    let item = match target {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => f,
        _ => return None,
    };
    if !matches!(item.data_type(), DataType::Float32 | DataType::Float64) {
        return None;
    }
    inner.downcast_ref::<Column>()
}

/// Evaluates an expression without column references to a vector of `f32` (a list, or a
/// pgvector text literal).
fn constant_vector(expr: &Arc<dyn PhysicalExpr>) -> Result<Option<Vec<f32>>> {
    let mut has_columns = false;
    expr.apply(|e| {
        has_columns |= e.downcast_ref::<Column>().is_some();
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    if has_columns {
        return Ok(None);
    }
    let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
    let value = match expr.evaluate(&empty) {
        Ok(ColumnarValue::Scalar(s)) => s,
        _ => return Ok(None),
    };
    if let Some(text) = value.try_as_str() {
        // A pgvector text literal (through `SessionContext::sql`); text that is not a
        // vector is the distance function's error to report, when it runs.
        return Ok(text.and_then(super::udf::f32_vector_of_text));
    }
    let array = match value {
        ScalarValue::List(a) if !a.is_null(0) => a.value(0),
        ScalarValue::LargeList(a) if !a.is_null(0) => a.value(0),
        ScalarValue::FixedSizeList(a) if !a.is_null(0) => a.value(0),
        _ => return Ok(None),
    };
    let array = datafusion::arrow::compute::cast(&array, &DataType::Float32)?;
    if array.null_count() > 0 {
        return Ok(None);
    }
    Ok(Some(array.as_primitive::<Float32Type>().values().to_vec()))
}

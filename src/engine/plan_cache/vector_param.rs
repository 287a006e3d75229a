//! A kept plan's vector parameter: the value a list literal had, and which parameter it is.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;

/// A vector parameter's value inside a kept plan's expressions, evaluated as the list
/// literal it replaces.
///
/// Why not DataFusion's `Literal`: every plan node built over an expression derives its
/// properties, and for a literal that means an interval of two copies of its value, checked
/// by comparing them element by element, and a hash of every element: for a 128-d vector
/// that cost more than the KNN search it sorts (`perf` of `fragvec serve` under four
/// clients, docs/benchmarks.md). A parameter reports unknown properties (the plan was
/// optimized before it was kept) and hashes by its number; two are equal when their number
/// and value are.
#[derive(Debug, Clone)]
pub struct VectorParam {
    index: usize,
    value: ScalarValue,
    field: FieldRef,
}

impl VectorParam {
    /// Parameter number `index` (in the statement's order of vector literals) with `value`.
    pub fn new(index: usize, value: ScalarValue) -> Self {
        let field = Arc::new(Field::new("lit", value.data_type(), value.is_null()));
        Self {
            index,
            value,
            field,
        }
    }

    /// Which vector parameter of the statement this is.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The value it evaluates to.
    pub fn value(&self) -> &ScalarValue {
        &self.value
    }
}

impl PartialEq for VectorParam {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index && self.value == other.value
    }
}

impl Eq for VectorParam {}

impl Hash for VectorParam {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equal parameters have equal numbers; the value is not hashed element by element.
        self.index.hash(state);
    }
}

impl fmt::Display for VectorParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value)
    }
}

impl PhysicalExpr for VectorParam {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(self.value.data_type())
    }

    fn nullable(&self, _input_schema: &Schema) -> Result<bool> {
        Ok(self.value.is_null())
    }

    fn return_field(&self, _input_schema: &Schema) -> Result<FieldRef> {
        Ok(Arc::clone(&self.field))
    }

    fn evaluate(&self, _batch: &RecordBatch) -> Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(self.value.clone()))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(self)
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

//! Scalar functions for clustering keys: `zorder(a, b, ...)` and `ivf_partition(col)`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use crate::index::ivf::IvfModel;
use crate::rewrite::zorder::interleave;

/// Most arguments `zorder` interleaves (each gets `64 / n` bits).
pub const ZORDER_MAX_ARGS: usize = 8;

/// Registers `zorder` and the unbound `ivf_partition` (which RECLUSTER and
/// `recluster_information` bind to an index).
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::new_from_impl(Zorder::default()));
    ctx.register_udf(ScalarUDF::new_from_impl(IvfPartition::unbound()));
}

/// `zorder(x1, ..., xn)`: a Morton code of numeric values, so sorting by it keeps rows close
/// in every argument close together. Values are compared through their floating-point bit
/// patterns (order-preserving and scale-free: nearby magnitudes share high bits). NULL in
/// any argument gives NULL.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Zorder {
    signature: Signature,
}

impl Default for Zorder {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Zorder {
    fn name(&self) -> &str {
        "zorder"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt64)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.is_empty() || arg_types.len() > ZORDER_MAX_ARGS {
            return plan_err!(
                "zorder takes 1 to {ZORDER_MAX_ARGS} numeric arguments, got {}",
                arg_types.len()
            );
        }
        arg_types
            .iter()
            .map(|t| {
                if t.is_numeric() || t.is_null() {
                    Ok(DataType::Float64)
                } else {
                    plan_err!("zorder takes numeric arguments, got {t}")
                }
            })
            .collect()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays: Vec<ArrayRef> = args
            .args
            .iter()
            .map(|a| a.to_array(n))
            .collect::<Result<_>>()?;
        let columns: Vec<_> = arrays
            .iter()
            .map(|a| a.as_primitive::<Float64Type>())
            .collect();
        let mut row = vec![0.0; columns.len()];
        let out: UInt64Array = (0..n)
            .map(|i| {
                for (slot, c) in row.iter_mut().zip(&columns) {
                    if c.is_null(i) {
                        return None;
                    }
                    *slot = c.value(i);
                }
                Some(interleave(&row))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `ivf_partition(col)`: the partition (nearest centroid) of a vector under the vector index
/// on `col`. Only meaningful bound to an index, which RECLUSTER BY, `recluster_information`
/// and queries reading `col` from a fragvec table do ([`super::ivf_bind`]); elsewhere (a
/// view, a derived table, a plain `SessionContext`) it is an error saying so.
#[derive(Debug)]
pub struct IvfPartition {
    signature: Signature,
    model: Option<Arc<IvfModel>>,
    /// Partitions the index already assigned, by fragment and offset (`u32::MAX`: unknown).
    /// With it the function takes the row address as a second argument and computes only
    /// the rows the index does not hold.
    known: Option<Arc<KnownPartitions>>,
}

/// Partition of each row the index holds, per current fragment.
pub type KnownPartitions = crate::index::assigned::AssignedPartitions;

impl PartialEq for IvfPartition {
    fn eq(&self, other: &Self) -> bool {
        match (&self.model, &other.model) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for IvfPartition {}

impl std::hash::Hash for IvfPartition {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.model.as_ref().map(Arc::as_ptr).hash(state);
    }
}

impl IvfPartition {
    /// `ivf_partition(col)` before planning binds it to an index's model.
    pub fn unbound() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
            model: None,
            known: None,
        }
    }

    /// Bound to an index's model; with `known`, called as `ivf_partition(col, _rowaddr)`.
    pub fn bound(model: Arc<IvfModel>, known: Option<Arc<KnownPartitions>>) -> Self {
        Self {
            signature: Signature::any(if known.is_some() { 2 } else { 1 }, Volatility::Immutable),
            model: Some(model),
            known,
        }
    }
}

impl ScalarUDFImpl for IvfPartition {
    fn name(&self) -> &str {
        "ivf_partition"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let Some(model) = &self.model else {
            return plan_err!(
                "ivf_partition(col) needs col to be a vector column of a fragvec table with a \
                 vector index, read by the same query block (not through a view or a derived \
                 table)"
            );
        };
        let array = args.args[0].to_array(args.number_rows)?;
        let DataType::FixedSizeList(item, dim) = array.data_type() else {
            return plan_err!(
                "ivf_partition takes a vector column, got {}",
                array.data_type()
            );
        };
        if *dim as usize != model.dim || item.data_type() != &DataType::Float32 {
            return plan_err!(
                "ivf_partition: the index has {}-d vectors, the argument is {}",
                model.dim,
                array.data_type()
            );
        }
        let list = array.as_fixed_size_list();
        let values = list.values().as_primitive::<Float32Type>().values();
        let d = model.dim;
        let mut out = vec![None; list.len()];
        // Rows the index holds take the partition it assigned them.
        if let (Some(known), Some(addrs)) = (&self.known, args.args.get(1)) {
            let addrs = addrs.to_array(args.number_rows)?;
            let addrs = addrs.as_primitive::<datafusion::arrow::datatypes::UInt64Type>();
            for (i, slot) in out.iter_mut().enumerate() {
                let (f, o) = crate::ledger::ids::split_row_address(addrs.value(i));
                if let Some(&p) = known.get(&f).and_then(|v| v.get(o as usize))
                    && p != u32::MAX
                    && !list.is_null(i)
                {
                    *slot = Some(p);
                }
            }
        }
        // The others: (prepared) vectors side by side, assigned to centroids in one parallel
        // pass.
        let mut rows = Vec::with_capacity(list.len());
        let mut data = Vec::with_capacity(list.len() * d);
        for (i, known) in out.iter().enumerate() {
            if list.is_null(i) || known.is_some() {
                continue;
            }
            let offset = list.value_offset(i) as usize;
            if let Some(p) = model.prepare(&values[offset..offset + d]) {
                rows.push(i);
                data.extend_from_slice(&p);
            }
        }
        let assigned = crate::index::kmeans::assign(&data, d, &model.centroids);
        for (i, (p, _)) in rows.into_iter().zip(assigned) {
            out[i] = Some(p);
        }
        let out = UInt32Array::from(out);
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

//! Vector distance functions: `l2_distance`, `cosine_distance`, `inner_product`,
//! `negative_inner_product`.
//!
//! They take `VECTOR(n)` columns as they are and coerce only the other argument (an array
//! literal `[0.1, ...]` arrives as `List<Float64>` and becomes `List<Float32>` once, at plan
//! time), so no column is cast per row. pgvector's text form `'[0.1, ...]'` is read as a vector
//! too: the front end turns it into an array literal, and through plain `SessionContext::sql`
//! it reaches the function as text, parsed once per batch (one string is far cheaper for
//! DataFusion to plan than hundreds of numeric literals). NULL in gives NULL out, and so does
//! a zero vector under `cosine_distance` (its angle is undefined). Vectors of different dimensions are an
//! error naming both. Results are `Float32`.
//!
//! `cosine_distance` and `inner_product` (and their aliases) are also DataFusion built-ins over
//! lists. When no argument is a `VECTOR(n)` (`FixedSizeList`), as in
//! `cosine_distance([1.0, 2.0], [3.0, 4.0])` or over `List` columns, they are DataFusion's
//! functions exactly: `Float64`, DataFusion's NULL rules and errors. fragvec's kernels
//! (above) serve calls with a vector argument, which is what the KNN rule and indexes use.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, GenericListArray, OffsetSizeTrait,
};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type};
use datafusion::common::{Result, ScalarValue, exec_err, internal_err, plan_err};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use crate::format::types::has_null_element;
use crate::index::distance::{cosine_distance, dot, l2_squared};

/// fragvec's distance functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DistanceKind {
    /// `l2_distance`: Euclidean distance (pgvector's `<->`).
    L2,
    /// `cosine_distance`: 1 − cosine similarity (`<=>`).
    Cosine,
    /// `inner_product`: the dot product.
    InnerProduct,
    /// `negative_inner_product`: minus the dot product (`<#>`).
    NegativeInnerProduct,
}

impl DistanceKind {
    /// Every kind; [`register`] registers one function for each.
    pub const ALL: [DistanceKind; 4] = [
        DistanceKind::L2,
        DistanceKind::Cosine,
        DistanceKind::InnerProduct,
        DistanceKind::NegativeInnerProduct,
    ];

    /// The function's SQL name; [`Self::aliases`] lists its other names.
    pub fn name(self) -> &'static str {
        match self {
            DistanceKind::L2 => "l2_distance",
            DistanceKind::Cosine => "cosine_distance",
            DistanceKind::InnerProduct => "inner_product",
            DistanceKind::NegativeInnerProduct => "negative_inner_product",
        }
    }

    /// Other names of the same function: DuckDB's `array_*` / `list_*` spellings, and
    /// `dot_product` (DataFusion's alias of its own `inner_product`, taken over too).
    /// DataFusion's `array_distance` / `list_distance` are not here: they stay DataFusion's
    /// (Float64) functions, which the KNN rule serves as L2 all the same.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            DistanceKind::L2 => &[],
            DistanceKind::Cosine => &["array_cosine_distance", "list_cosine_distance"],
            DistanceKind::InnerProduct => &[
                "dot_product",
                "array_inner_product",
                "array_dot_product",
                "list_inner_product",
                "list_dot_product",
            ],
            DistanceKind::NegativeInnerProduct => &[
                "array_negative_inner_product",
                "array_negative_dot_product",
                "list_negative_inner_product",
                "list_negative_dot_product",
            ],
        }
    }

    /// The kind named `name` (its SQL name, not an alias).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    #[inline]
    fn eval(self, a: &[f32], b: &[f32]) -> Option<f32> {
        match self {
            DistanceKind::L2 => Some(l2_squared(a, b).sqrt()),
            DistanceKind::Cosine => cosine_distance(a, b),
            DistanceKind::InnerProduct => Some(dot(a, b)),
            DistanceKind::NegativeInnerProduct => Some(-dot(a, b)),
        }
    }
}

/// A distance function over vectors (`VECTOR(n)`, lists, arrays), one per [`DistanceKind`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DistanceUdf {
    kind: DistanceKind,
    signature: Signature,
    aliases: Vec<String>,
}

impl DistanceUdf {
    /// The function of `kind`, with its aliases.
    pub fn new(kind: DistanceKind) -> Self {
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
            aliases: kind.aliases().iter().map(|a| a.to_string()).collect(),
        }
    }

    /// DataFusion's built-in of the same name, which calls without a `VECTOR(n)` argument get.
    fn builtin(&self) -> Option<Arc<ScalarUDF>> {
        use datafusion::functions_nested::{cosine_distance, inner_product};
        match self.kind {
            DistanceKind::Cosine => Some(cosine_distance::cosine_distance_udf()),
            DistanceKind::InnerProduct => Some(inner_product::inner_product_udf()),
            DistanceKind::L2 | DistanceKind::NegativeInnerProduct => None,
        }
    }

    /// The built-in, when the call's arguments are DataFusion's (no fixed-size vector).
    fn builtin_for(&self, arg_types: &[DataType]) -> Option<Arc<ScalarUDF>> {
        if arg_types.iter().any(|t| fixed_dim(t).is_some()) {
            return None;
        }
        self.builtin()
    }
}

/// Registers the distance functions (replacing DataFusion's `cosine_distance` and
/// `inner_product`, which cast vector columns to `List<Float64>` row by row).
pub fn register(ctx: &SessionContext) {
    for kind in DistanceKind::ALL {
        ctx.register_udf(ScalarUDF::new_from_impl(DistanceUdf::new(kind)));
    }
}

fn f32_item() -> Arc<Field> {
    Arc::new(Field::new_list_field(DataType::Float32, true))
}

/// The vector dimension of a type, if it has a fixed one.
fn fixed_dim(dt: &DataType) -> Option<i32> {
    match dt {
        DataType::FixedSizeList(f, n) if f.data_type().is_numeric() => Some(*n),
        _ => None,
    }
}

fn is_text(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// The `f32` vector a pgvector text literal spells: parsed as `f64`, then rounded, as an array
/// literal `[...]` is (`List<Float64>` cast to `Float32`), so both spellings give the same bits.
pub fn f32_vector_of_text(text: &str) -> Option<Vec<f32>> {
    crate::sql::vector_syntax::parse_vector_text(text)
        .map(|values| values.into_iter().map(|v| v as f32).collect())
}

fn is_list(dt: &DataType) -> bool {
    matches!(dt, DataType::List(f) | DataType::LargeList(f) if f.data_type().is_numeric() || f.data_type().is_null())
}

impl ScalarUDFImpl for DistanceUdf {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if let Some(builtin) = self.builtin_for(arg_types) {
            return builtin.return_type(arg_types);
        }
        Ok(DataType::Float32)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if let Some(builtin) = self.builtin_for(arg_types) {
            return builtin.coerce_types(arg_types);
        }
        let [a, b] = arg_types else {
            return plan_err!(
                "{} takes two vectors, got {} arguments",
                self.name(),
                arg_types.len()
            );
        };
        let coerce = |t: &DataType| -> Result<DataType> {
            if let Some(n) = fixed_dim(t) {
                Ok(DataType::FixedSizeList(f32_item(), n))
            } else if is_list(t) || t.is_null() {
                Ok(DataType::List(f32_item()))
            } else if is_text(t) {
                Ok(t.clone())
            } else {
                plan_err!(
                    "{} takes vectors (VECTOR(n) or numeric arrays), got {t}",
                    self.name()
                )
            }
        };
        Ok(vec![coerce(a)?, coerce(b)?])
    }

    /// Text literals are checked here, at plan time, so a query with one that is not a vector
    /// fails before it reads anything; they stay text (a string is cheaper for DataFusion to
    /// carry through planning than a list of hundreds of numbers) and are parsed when run.
    fn simplify(&self, args: Vec<Expr>, _info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        for arg in &args {
            if let Expr::Literal(value, _) = arg
                && let Some(Some(text)) = value.try_as_str()
                && f32_vector_of_text(text).is_none()
            {
                return plan_err!("{}", not_a_vector(text, self.name()));
            }
        }
        Ok(ExprSimplifyResult::Original(args))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let types: Vec<DataType> = args.args.iter().map(|a| a.data_type()).collect();
        if let Some(builtin) = self.builtin_for(&types) {
            return builtin.invoke_with_args(args);
        }
        let [a, b] = args.args.as_slice() else {
            return internal_err!("{}: two arguments expected", self.name());
        };
        let rows = args.number_rows;
        let a = VectorArg::try_new(a, self.name())?;
        let b = VectorArg::try_new(b, self.name())?;
        let mut out: Vec<Option<f32>> = Vec::with_capacity(rows);
        for i in 0..rows {
            let (Some(x), Some(y)) = (a.get(i), b.get(i)) else {
                out.push(None);
                continue;
            };
            if x.len() != y.len() {
                return exec_err!(
                    "{}: vector dimensions differ ({} vs {})",
                    self.name(),
                    x.len(),
                    y.len()
                );
            }
            out.push(self.kind.eval(x, y));
        }
        let array: ArrayRef = Arc::new(Float32Array::from(out));
        if matches!((&a, &b), (VectorArg::Scalar(_), VectorArg::Scalar(_))) {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &array, 0,
            )?));
        }
        Ok(ColumnarValue::Array(array))
    }
}

/// One argument: a column of vectors or one vector for every row.
enum VectorArg {
    Scalar(Option<Vec<f32>>),
    /// Text parsed row by row (`None`: a NULL).
    Text(Vec<Option<Vec<f32>>>),
    Fixed(FixedSizeListArray),
    List(GenericListArray<i32>),
    LargeList(GenericListArray<i64>),
}

impl VectorArg {
    fn try_new(value: &ColumnarValue, name: &str) -> Result<Self> {
        match value {
            ColumnarValue::Scalar(s) => {
                if s.is_null() {
                    return Ok(VectorArg::Scalar(None));
                }
                if let Some(text) = s.try_as_str().flatten() {
                    return Ok(VectorArg::Scalar(Some(parse_text(text, name)?)));
                }
                let array = s.to_array()?;
                let arg = Self::from_array(&array, name)?;
                Ok(VectorArg::Scalar(arg.get(0).map(|v| v.to_vec())))
            }
            ColumnarValue::Array(a) => Self::from_array(a, name),
        }
    }

    fn from_array(array: &ArrayRef, name: &str) -> Result<Self> {
        if is_text(array.data_type()) {
            let text = datafusion::arrow::compute::cast(array, &DataType::Utf8)?;
            return text
                .as_string::<i32>()
                .iter()
                .map(|t| t.map(|t| parse_text(t, name)).transpose())
                .collect::<Result<_>>()
                .map(VectorArg::Text);
        }
        let f32_values = |values: &ArrayRef| values.data_type() == &DataType::Float32;
        match array.data_type() {
            DataType::FixedSizeList(..) if f32_values(array.as_fixed_size_list().values()) => {
                Ok(VectorArg::Fixed(array.as_fixed_size_list().clone()))
            }
            DataType::List(_) if f32_values(array.as_list::<i32>().values()) => {
                Ok(VectorArg::List(array.as_list::<i32>().clone()))
            }
            DataType::LargeList(_) if f32_values(array.as_list::<i64>().values()) => {
                Ok(VectorArg::LargeList(array.as_list::<i64>().clone()))
            }
            other => internal_err!("{name}: unexpected argument type {other}"),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> Option<&[f32]> {
        match self {
            VectorArg::Scalar(v) => v.as_deref(),
            VectorArg::Text(rows) => rows[i].as_deref(),
            VectorArg::Fixed(a) => {
                if a.is_null(i) {
                    return None;
                }
                let n = a.value_length() as usize;
                let start = i * n; // a FixedSizeListArray slices its values, so its offset is 0
                if has_null_element(a.values().as_ref(), start, n) {
                    return None;
                }
                let values = a.values().as_primitive::<Float32Type>().values();
                Some(&values[start..start + n])
            }
            VectorArg::List(a) => list_slice(a, i),
            VectorArg::LargeList(a) => list_slice(a, i),
        }
    }
}

/// A text argument as a vector, or an error quoting (the start of) the text.
fn parse_text(text: &str, name: &str) -> Result<Vec<f32>> {
    f32_vector_of_text(text)
        .ok_or_else(|| datafusion::common::exec_datafusion_err!("{}", not_a_vector(text, name)))
}

/// Why `text` is refused, quoting its start.
fn not_a_vector(text: &str, name: &str) -> String {
    let shown: String = text.chars().take(40).collect();
    let more = if shown.len() < text.len() { "..." } else { "" };
    format!(
        "{name}: '{shown}{more}' is not a vector (pgvector's text form is '[x, y, ...]', finite \
         numbers)"
    )
}

#[inline]
fn list_slice<O: OffsetSizeTrait>(a: &GenericListArray<O>, i: usize) -> Option<&[f32]> {
    if a.is_null(i) {
        return None;
    }
    let offsets = a.value_offsets();
    let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
    if has_null_element(a.values().as_ref(), start, end - start) {
        return None;
    }
    let values = a.values().as_primitive::<Float32Type>().values();
    Some(&values[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::vector_syntax::DISTANCE_FUNCTIONS;

    /// The front end must know every name of a distance function (its vector literals become
    /// parameters, its text literals vectors); a name it did not know would silently plan
    /// slowly and reject `'[1, 2]'`.
    #[test]
    fn front_end_knows_every_distance_name() {
        let mut names: Vec<&str> = vec!["array_distance", "list_distance"];
        for kind in DistanceKind::ALL {
            names.push(kind.name());
            names.extend(kind.aliases());
        }
        names.sort_unstable();
        let mut known = DISTANCE_FUNCTIONS.to_vec();
        known.sort_unstable();
        assert_eq!(names, known);
    }
}

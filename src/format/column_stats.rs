//! Each data file's value range per scalar column, kept in the manifest so a scan can skip
//! the fragments a filter cannot match without opening them (`WHERE id = 42` reads one
//! fragment of a thousand). The arithmetic only: [`StatsAccumulator`] sees every batch a
//! writer writes and gives the file's [`ColumnStats`].
//!
//! The ranges are bounds, never guesses: `min` is at most, and `max` at least, every non-NULL
//! value of the column in the file (deleted rows included: a deletion never narrows a range,
//! and a stale range only costs a read). A column gets no range — "unknown", never skipped —
//! when its type has none here, when a float column holds a NaN or an infinity, or when a
//! string bound is longer than [`MAX_STRING_BYTES`]. Files written before ranges existed
//! have none.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, StringArray, UInt64Array,
};
use datafusion::arrow::compute::{
    cast, max, max_boolean, max_string, min, min_boolean, min_string,
};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef, UInt64Type};
use serde::{Deserialize, Serialize};

/// String bounds longer than this are not kept (the manifest holds every file's ranges).
pub const MAX_STRING_BYTES: usize = 64;

/// One bound, in the widest type of its kind (the column's type says how to read it back).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatValue {
    /// Signed integers, dates (days) and timestamps (the column's unit).
    Int(i64),
    /// Unsigned integers of any width, widened to `u64`.
    UInt(u64),
    /// Floats of any width, widened to `f64`; never NaN or infinite.
    Float(f64),
    /// Strings, at most [`MAX_STRING_BYTES`] bytes long.
    Text(String),
    /// Booleans.
    Bool(bool),
}

// A float bound is never NaN (a NaN leaves its column without a range), so equality is
// an equivalence.
impl Eq for StatValue {}

/// A column's range in one data file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// The column's name, as in the table schema.
    pub column: String,
    /// At most every non-NULL value of the column in the file; `None` when every value is
    /// NULL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<StatValue>,
    /// At least every non-NULL value of the column in the file; `None` when every value is
    /// NULL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<StatValue>,
    /// NULL values of the column in the file, deleted rows included.
    pub nulls: u64,
}

/// How a column's values are compared, if they have a range here.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Int,
    UInt,
    Float,
    Text,
    Bool,
}

fn kind_of(data_type: &DataType) -> Option<Kind> {
    use DataType::*;
    Some(match data_type {
        Int8 | Int16 | Int32 | Int64 | Date32 | Date64 | Timestamp(_, _) => Kind::Int,
        UInt8 | UInt16 | UInt32 | UInt64 => Kind::UInt,
        Float16 | Float32 | Float64 => Kind::Float,
        Utf8 | LargeUtf8 | Utf8View => Kind::Text,
        Boolean => Kind::Bool,
        _ => return None,
    })
}

/// One column's running range.
#[derive(Clone, Debug)]
struct Running {
    column: String,
    kind: Kind,
    min: Option<StatValue>,
    max: Option<StatValue>,
    nulls: u64,
    /// A value made the range unusable (a NaN, a long string, a failed cast).
    poisoned: bool,
}

/// The ranges of the batches written to one file.
#[derive(Clone, Debug)]
pub struct StatsAccumulator {
    /// Per column of the schema: its running range, if its type has one.
    columns: Vec<Option<Running>>,
}

impl StatsAccumulator {
    /// Ranges for the columns of `schema` (the table's declared types).
    pub fn new(schema: &SchemaRef) -> Self {
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                kind_of(f.data_type()).map(|kind| Running {
                    column: f.name().clone(),
                    kind,
                    min: None,
                    max: None,
                    nulls: 0,
                    poisoned: false,
                })
            })
            .collect();
        Self { columns }
    }

    /// Widens the ranges by `columns` (one array per schema column, in order).
    pub fn update(&mut self, columns: &[ArrayRef]) {
        for (running, array) in self.columns.iter_mut().zip(columns) {
            if let Some(r) = running {
                r.update(array);
            }
        }
    }

    /// The file's ranges: one per column that has a usable one.
    pub fn finish(self) -> Vec<ColumnStats> {
        self.columns
            .into_iter()
            .flatten()
            .filter(|r| !r.poisoned)
            .map(|r| ColumnStats {
                column: r.column,
                min: r.min,
                max: r.max,
                nulls: r.nulls,
            })
            .collect()
    }
}

impl Running {
    fn update(&mut self, array: &ArrayRef) {
        if self.poisoned {
            return;
        }
        self.nulls += array.null_count() as u64;
        match self.bounds(array) {
            Ok(Some((lo, hi))) => {
                self.widen(lo, hi);
            }
            Ok(None) => {} // all NULL (or empty): nothing to widen
            Err(()) => self.poisoned = true,
        }
    }

    /// The batch's own bounds; `Err` when the column cannot have a range.
    fn bounds(&self, array: &ArrayRef) -> Result<Option<(StatValue, StatValue)>, ()> {
        if array.len() == array.null_count() {
            return Ok(None);
        }
        Ok(match self.kind {
            Kind::Int => {
                let a = cast(array, &DataType::Int64).map_err(|_| ())?;
                let a: &Int64Array = a.as_primitive::<Int64Type>();
                min(a)
                    .zip(max(a))
                    .map(|(l, h)| (StatValue::Int(l), StatValue::Int(h)))
            }
            Kind::UInt => {
                let a = cast(array, &DataType::UInt64).map_err(|_| ())?;
                let a: &UInt64Array = a.as_primitive::<UInt64Type>();
                min(a)
                    .zip(max(a))
                    .map(|(l, h)| (StatValue::UInt(l), StatValue::UInt(h)))
            }
            Kind::Float => {
                let a = cast(array, &DataType::Float64).map_err(|_| ())?;
                let a: &Float64Array = a.as_primitive::<Float64Type>();
                // JSON has no NaN or infinity (serde_json would write null, which no manifest
                // reader takes back as a number): such a column goes without a range.
                if a.iter().flatten().any(|x| !x.is_finite()) {
                    return Err(());
                }
                min(a)
                    .zip(max(a))
                    .map(|(l, h)| (StatValue::Float(l), StatValue::Float(h)))
            }
            Kind::Text => {
                let a = cast(array, &DataType::Utf8).map_err(|_| ())?;
                let a: &StringArray = a.as_string::<i32>();
                match min_string(a).zip(max_string(a)) {
                    Some((l, h)) if l.len() <= MAX_STRING_BYTES && h.len() <= MAX_STRING_BYTES => {
                        Some((StatValue::Text(l.into()), StatValue::Text(h.into())))
                    }
                    Some(_) => return Err(()),
                    None => None,
                }
            }
            Kind::Bool => {
                let a: &BooleanArray = array.as_boolean_opt().ok_or(())?;
                min_boolean(a)
                    .zip(max_boolean(a))
                    .map(|(l, h)| (StatValue::Bool(l), StatValue::Bool(h)))
            }
        })
    }

    fn widen(&mut self, lo: StatValue, hi: StatValue) {
        let lower = match self.min.take() {
            Some(m) if !less(&lo, &m) => m,
            _ => lo,
        };
        let upper = match self.max.take() {
            Some(m) if !less(&m, &hi) => m,
            _ => hi,
        };
        self.min = Some(lower);
        self.max = Some(upper);
    }
}

/// `a < b` for two bounds of one column (of one kind).
fn less(a: &StatValue, b: &StatValue) -> bool {
    match (a, b) {
        (StatValue::Int(x), StatValue::Int(y)) => x < y,
        (StatValue::UInt(x), StatValue::UInt(y)) => x < y,
        (StatValue::Float(x), StatValue::Float(y)) => x < y,
        (StatValue::Text(x), StatValue::Text(y)) => x < y,
        (StatValue::Bool(x), StatValue::Bool(y)) => !x & y,
        _ => false,
    }
}

/// A bound as an Arrow array of one value of `data_type` (the column's type), for a
/// planner's statistics; `None` when it does not convert.
pub fn bound_array(value: &StatValue, data_type: &DataType) -> Option<ArrayRef> {
    let one: ArrayRef = match value {
        StatValue::Int(v) => Arc::new(Int64Array::from(vec![*v])),
        StatValue::UInt(v) => Arc::new(UInt64Array::from(vec![*v])),
        StatValue::Float(v) => Arc::new(Float64Array::from(vec![*v])),
        StatValue::Text(v) => Arc::new(StringArray::from(vec![v.as_str()])),
        StatValue::Bool(v) => Arc::new(BooleanArray::from(vec![*v])),
    };
    if one.data_type() == data_type {
        return Some(one);
    }
    // Only types this module keeps ranges of, back to themselves: a range of another type
    // (a column whose type changed) is not trusted.
    kind_of(data_type)?;
    let cast = cast(&one, data_type).ok()?;
    (cast.null_count() == 0).then_some(cast)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float32Array, Int32Array, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};
    use proptest::prelude::*;

    fn schema(fields: Vec<(&str, DataType)>) -> SchemaRef {
        Arc::new(Schema::new(
            fields
                .into_iter()
                .map(|(n, t)| Field::new(n, t, true))
                .collect::<Vec<_>>(),
        ))
    }

    #[test]
    fn ranges_of_each_kind_over_several_batches() {
        let s = schema(vec![
            ("i", DataType::Int32),
            ("f", DataType::Float32),
            ("t", DataType::Utf8),
            ("b", DataType::Boolean),
            ("ts", DataType::Timestamp(TimeUnit::Microsecond, None)),
            (
                "v",
                DataType::new_fixed_size_list(DataType::Float32, 2, true),
            ),
        ]);
        let mut acc = StatsAccumulator::new(&s);
        let v: ArrayRef = Arc::new(datafusion::arrow::array::FixedSizeListArray::new_null(
            Arc::new(Field::new("item", DataType::Float32, true)),
            2,
            2,
        ));
        acc.update(&[
            Arc::new(Int32Array::from(vec![Some(5), None])),
            Arc::new(Float32Array::from(vec![1.5, -2.0])),
            Arc::new(StringArray::from(vec!["m", "c"])),
            Arc::new(BooleanArray::from(vec![true, true])),
            Arc::new(TimestampMicrosecondArray::from(vec![10, 20])),
            v.clone(),
        ]);
        acc.update(&[
            Arc::new(Int32Array::from(vec![Some(-3), Some(9)])),
            Arc::new(Float32Array::from(vec![0.0, 7.25])),
            Arc::new(StringArray::from(vec![None, Some("z")])),
            Arc::new(BooleanArray::from(vec![None, Some(false)])),
            Arc::new(TimestampMicrosecondArray::from(vec![None, None])),
            v,
        ]);
        let stats = acc.finish();
        let by = |c: &str| stats.iter().find(|s| s.column == c).cloned();
        let range = |c: &str| {
            let s = by(c).unwrap();
            (s.min.unwrap(), s.max.unwrap(), s.nulls)
        };
        assert_eq!(range("i"), (StatValue::Int(-3), StatValue::Int(9), 1));
        assert_eq!(
            range("f"),
            (StatValue::Float(-2.0), StatValue::Float(7.25), 0)
        );
        assert_eq!(
            range("t"),
            (StatValue::Text("c".into()), StatValue::Text("z".into()), 1)
        );
        assert_eq!(
            range("b"),
            (StatValue::Bool(false), StatValue::Bool(true), 1)
        );
        assert_eq!(range("ts"), (StatValue::Int(10), StatValue::Int(20), 2));
        assert!(by("v").is_none(), "vectors have no range");
    }

    #[test]
    fn unusable_ranges_are_left_out() {
        let s = schema(vec![
            ("f", DataType::Float64),
            ("t", DataType::Utf8),
            ("n", DataType::Int64),
        ]);
        let mut acc = StatsAccumulator::new(&s);
        let long = "x".repeat(MAX_STRING_BYTES + 1);
        let mut inf = StatsAccumulator::new(&schema(vec![("f", DataType::Float32)]));
        inf.update(&[Arc::new(Float32Array::from(vec![1.0, f32::INFINITY])) as ArrayRef]);
        assert!(
            inf.finish().is_empty(),
            "JSON cannot hold an infinite bound"
        );
        acc.update(&[
            Arc::new(Float64Array::from(vec![1.0, f64::NAN])),
            Arc::new(StringArray::from(vec!["a", long.as_str()])),
            Arc::new(Int64Array::from(vec![None, None])),
        ]);
        let stats = acc.finish();
        assert_eq!(stats.len(), 1, "{stats:?}");
        // an all-NULL column: a range with no bounds, and its NULL count
        assert_eq!(
            stats[0],
            ColumnStats {
                column: "n".into(),
                min: None,
                max: None,
                nulls: 2
            }
        );
    }

    #[test]
    fn bounds_convert_back_to_their_column_types() {
        let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        let a = bound_array(&StatValue::Int(1_000), &ts).unwrap();
        assert_eq!(a.data_type(), &ts);
        assert_eq!(
            bound_array(&StatValue::Int(7), &DataType::Int16)
                .unwrap()
                .as_primitive::<datafusion::arrow::datatypes::Int16Type>()
                .value(0),
            7
        );
        // a bound that does not fit the column's type now is not trusted
        assert!(bound_array(&StatValue::Int(70_000), &DataType::Int16).is_none());
        assert!(bound_array(&StatValue::Text("a".into()), &DataType::Int64).is_none());
        let json = serde_json::to_string(&ColumnStats {
            column: "id".into(),
            min: Some(StatValue::Int(1)),
            max: Some(StatValue::Int(9)),
            nulls: 0,
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"column":"id","min":{"int":1},"max":{"int":9},"nulls":0}"#
        );
    }

    proptest! {
        /// Over any batches, the range holds every value and is attained (a naive min/max).
        #[test]
        fn a_range_is_the_naive_min_and_max(
            batches in proptest::collection::vec(
                proptest::collection::vec(proptest::option::of(-1000i64..1000), 0..20), 1..5),
        ) {
            let s = schema(vec![("x", DataType::Int64)]);
            let mut acc = StatsAccumulator::new(&s);
            for b in &batches {
                acc.update(&[Arc::new(Int64Array::from(b.clone())) as ArrayRef]);
            }
            let all: Vec<i64> = batches.iter().flatten().flatten().copied().collect();
            let nulls = batches.iter().flatten().filter(|v| v.is_none()).count() as u64;
            let stats = acc.finish();
            prop_assert_eq!(stats.len(), 1);
            prop_assert_eq!(stats[0].nulls, nulls);
            prop_assert_eq!(stats[0].min.clone(), all.iter().min().map(|v| StatValue::Int(*v)));
            prop_assert_eq!(stats[0].max.clone(), all.iter().max().map(|v| StatValue::Int(*v)));
        }
    }
}

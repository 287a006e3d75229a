//! Skipping the fragments a scan's filter cannot match, by their data files' column ranges
//! ([`crate::format::column_stats`]), with DataFusion's own `PruningPredicate` doing the
//! reasoning (`=`, `<`, `BETWEEN`, `IN`, `IS NULL`, `AND` / `OR`, casts, ...).
//!
//! Two levels: a fragment is skipped by the ranges the manifest keeps for its files (no IO);
//! inside a fragment that is read, its row groups (64K rows each) are skipped by their
//! Parquet statistics (the footer, which the read opens anyway). Either is skipped only when
//! its ranges prove no row can match; one without a range for a column the filter needs
//! (written before ranges existed, a column added after it, a type without ranges, a column
//! stored as another type) is read. The scan still evaluates the filter on every row it
//! reads, so pruning changes what is read, never what is answered.

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, UInt64Array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::Operator;
use datafusion::parquet::arrow::arrow_reader::ArrowReaderMetadata;
use datafusion::parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, InListExpr, Literal};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};

use crate::format::column_stats::{ColumnStats, StatValue, bound_array};
use crate::format::fragment_io::data_file_footer;
use crate::format::manifest::{ROW_ADDR, ROW_ID};
use crate::format::{Fragment, TableDir};

/// `IN` lists up to this long are tested value by value against each fragment's range (a
/// `DELETE ... WHERE id IN (...)` of a batch of ids, say); DataFusion's default stops at 20.
const MAX_IN_LIST_VALUES: usize = 1024;

/// `predicate` with each longer `col IN (constants)` replaced, for pruning only, by
/// `col >= min AND col <= max` of its constants: a range every row the list keeps is in, so
/// a fragment outside it still cannot match (the scan evaluates the real list).
fn bound_long_in_lists(predicate: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
    let bounded = predicate.clone().transform_up(|e| {
        let Some(in_list) = e.downcast_ref::<InListExpr>() else {
            return Ok(Transformed::no(e));
        };
        if in_list.negated() || in_list.list().len() <= MAX_IN_LIST_VALUES {
            return Ok(Transformed::no(e));
        }
        let mut values = Vec::with_capacity(in_list.list().len());
        for item in in_list.list() {
            match item.downcast_ref::<Literal>() {
                Some(l) if !l.value().is_null() => values.push(l.value().clone()),
                _ => return Ok(Transformed::no(e)),
            }
        }
        let min = values.iter().try_fold(values[0].clone(), |m, v| {
            Some(if v.partial_cmp(&m)?.is_lt() {
                v.clone()
            } else {
                m
            })
        });
        let max = values.iter().try_fold(values[0].clone(), |m, v| {
            Some(if v.partial_cmp(&m)?.is_gt() {
                v.clone()
            } else {
                m
            })
        });
        let (Some(min), Some(max)) = (min, max) else {
            return Ok(Transformed::no(e)); // constants that do not compare
        };
        let column = in_list.expr().clone();
        let at_least = Arc::new(BinaryExpr::new(
            column.clone(),
            Operator::GtEq,
            Arc::new(Literal::new(min)),
        ));
        let at_most = Arc::new(BinaryExpr::new(
            column,
            Operator::LtEq,
            Arc::new(Literal::new(max)),
        ));
        Ok(Transformed::yes(
            Arc::new(BinaryExpr::new(at_least, Operator::And, at_most)) as Arc<dyn PhysicalExpr>,
        ))
    });
    bounded.map(|t| t.data).unwrap_or(predicate)
}

/// A scan filter's test of fragments.
#[derive(Debug)]
pub struct FragmentPruner {
    predicate: PruningPredicate,
    schema: SchemaRef,
    /// The table columns the filter names (its virtual columns have no ranges).
    columns: Vec<String>,
}

impl FragmentPruner {
    /// The pruner of `predicate` (bound to `schema`); `None` when no range could rule a
    /// fragment out (the filter names no column with ranges, say).
    pub fn new(predicate: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Option<Self> {
        let built = PruningPredicateBuilder::new()
            .with_file_schema(schema.clone())
            .with_max_in_list_size(MAX_IN_LIST_VALUES)
            .try_build(bound_long_in_lists(predicate.clone()))
            .ok()?;
        let mut columns: Vec<String> = collect_columns(predicate)
            .into_iter()
            .map(|c| c.name().to_string())
            .filter(|c| c != ROW_ADDR && c != ROW_ID)
            .collect();
        columns.sort();
        (!built.always_true()).then(|| Self {
            predicate: built,
            schema: schema.clone(),
            columns,
        })
    }

    /// For each of `fragments`, whether it may hold a row the filter keeps.
    pub fn may_match(&self, fragments: &[&Fragment]) -> Vec<bool> {
        let stats = FragmentRanges {
            fragments,
            schema: &self.schema,
        };
        // An error in the reasoning reads everything: pruning is only ever a saving.
        self.predicate
            .prune(&stats)
            .unwrap_or_else(|_| vec![true; fragments.len()])
    }
}

impl FragmentPruner {
    /// The offset ranges of `fragment`'s row groups that may hold a row the filter keeps
    /// (empty: none may); `None` when every row group is to be read — all may match, the
    /// fragment has one row group, or their statistics cannot tell (the filter's columns in
    /// several files, or stored as another type).
    pub async fn row_ranges(
        &self,
        dir: &Arc<TableDir>,
        fragment: &Fragment,
    ) -> crate::format::Result<Option<Vec<Range<u64>>>> {
        let mut files = self.columns.iter().map(|c| fragment.file_for_column(c));
        let Some(Some(file)) = files.next() else {
            return Ok(None);
        };
        if files.any(|f| f.is_none_or(|f| f.path != file.path)) {
            return Ok(None);
        }
        let footer = data_file_footer(dir, file).await?;
        let groups = footer.metadata().row_groups();
        if groups.len() < 2 {
            return Ok(None);
        }
        let stats = RowGroupRanges {
            footer: &footer,
            schema: &self.schema,
        };
        let Ok(may_match) = self.predicate.prune(&stats) else {
            return Ok(None);
        };
        if may_match.iter().all(|m| *m) {
            return Ok(None);
        }
        let rows: Vec<u64> = groups.iter().map(|g| g.num_rows() as u64).collect();
        if rows.iter().sum::<u64>() != fragment.physical_rows {
            return Ok(None); // the read says what is wrong with the file
        }
        Ok(Some(kept_ranges(&rows, &may_match)))
    }
}

/// The offset ranges of the kept groups (of `rows` rows each, in order), adjacent ones
/// merged.
fn kept_ranges(rows: &[u64], keep: &[bool]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut start = 0;
    for (n, k) in rows.iter().zip(keep) {
        if *k && *n > 0 {
            match out.last_mut() {
                Some(last) if last.end == start => last.end = start + n,
                _ => out.push(start..start + n),
            }
        }
        start += n;
    }
    out
}

/// Where the rows of the batches read from `ranges` (in order) lie in their fragment:
/// a batch of selected rows may span several ranges.
#[derive(Debug)]
pub struct RangeCursor {
    ranges: std::vec::IntoIter<Range<u64>>,
    current: Option<Range<u64>>,
}

impl RangeCursor {
    /// A cursor at the start of `ranges` (offset ranges of one fragment, in order).
    pub fn new(ranges: Vec<Range<u64>>) -> Self {
        let mut ranges = ranges.into_iter();
        let current = ranges.next();
        Self { ranges, current }
    }

    /// The next `n` rows as pieces `(start in the batch, length, fragment offset)`; an error
    /// when the ranges hold fewer rows.
    pub fn advance(&mut self, mut n: usize) -> Result<Vec<(usize, usize, u64)>, String> {
        let mut pieces = Vec::new();
        let mut at = 0;
        while n > 0 {
            let Some(range) = self.current.as_mut() else {
                return Err(format!("{n} rows more than the ranges read"));
            };
            let take = (range.end - range.start).min(n as u64) as usize;
            pieces.push((at, take, range.start));
            range.start += take as u64;
            at += take;
            n -= take;
            if range.start == range.end {
                self.current = self.ranges.next();
            }
        }
        Ok(pieces)
    }

    /// Whether every row of the ranges was read.
    pub fn done(&self) -> bool {
        self.current.is_none()
    }
}

/// A data file's row groups, one container per group, from their Parquet statistics.
struct RowGroupRanges<'a> {
    footer: &'a ArrowReaderMetadata,
    schema: &'a SchemaRef,
}

impl RowGroupRanges<'_> {
    /// The converter of `column`'s statistics, when it is stored as its declared type.
    fn converter(&self, column: &Column) -> Option<StatisticsConverter<'_>> {
        let declared = self.schema.field_with_name(&column.name).ok()?;
        let stored = self.footer.schema().field_with_name(&column.name).ok()?;
        if stored.data_type() != declared.data_type() {
            return None;
        }
        StatisticsConverter::try_new(
            &column.name,
            self.footer.schema(),
            self.footer.parquet_schema(),
        )
        .ok()
    }
}

impl PruningStatistics for RowGroupRanges<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        let groups = self.footer.metadata().row_groups();
        self.converter(column)?.row_group_mins(groups.iter()).ok()
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        let groups = self.footer.metadata().row_groups();
        self.converter(column)?.row_group_maxes(groups.iter()).ok()
    }

    fn num_containers(&self) -> usize {
        self.footer.metadata().num_row_groups()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let groups = self.footer.metadata().row_groups();
        let counts = self
            .converter(column)?
            .row_group_null_counts(groups.iter())
            .ok()?;
        Some(Arc::new(counts))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        let groups = self.footer.metadata().row_groups();
        let rows: UInt64Array = groups.iter().map(|g| Some(g.num_rows() as u64)).collect();
        Some(Arc::new(rows))
    }

    fn contained(
        &self,
        _column: &Column,
        _values: &std::collections::HashSet<ScalarValue>,
    ) -> Option<BooleanArray> {
        None
    }
}

/// The fragments' ranges, one container per fragment.
struct FragmentRanges<'a> {
    fragments: &'a [&'a Fragment],
    schema: &'a SchemaRef,
}

impl FragmentRanges<'_> {
    /// The range of `column` in each fragment's file holding it.
    fn ranges(&self, column: &Column) -> Vec<Option<&ColumnStats>> {
        self.fragments
            .iter()
            .map(|f| {
                f.file_for_column(&column.name)?
                    .stats
                    .iter()
                    .find(|s| s.column == column.name)
            })
            .collect()
    }

    fn bounds(
        &self,
        column: &Column,
        pick: impl Fn(&ColumnStats) -> Option<&StatValue>,
    ) -> Option<ArrayRef> {
        let data_type = self.schema.field_with_name(&column.name).ok()?.data_type();
        let unknown = ScalarValue::try_from(data_type).ok()?;
        let mut known = false;
        let values: Vec<ScalarValue> = self
            .ranges(column)
            .into_iter()
            .map(|r| {
                r.and_then(&pick)
                    .and_then(|v| bound_array(v, data_type))
                    .and_then(|a| ScalarValue::try_from_array(&a, 0).ok())
                    .inspect(|_| known = true)
                    .unwrap_or_else(|| unknown.clone())
            })
            .collect();
        if !known {
            return None;
        }
        ScalarValue::iter_to_array(values).ok()
    }
}

impl PruningStatistics for FragmentRanges<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bounds(column, |s| s.min.as_ref())
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bounds(column, |s| s.max.as_ref())
    }

    fn num_containers(&self) -> usize {
        self.fragments.len()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let counts: UInt64Array = self
            .ranges(column)
            .into_iter()
            .map(|r| r.map(|s| s.nulls))
            .collect();
        (counts.null_count() < counts.len()).then(|| Arc::new(counts) as ArrayRef)
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        // Physical rows, deleted ones included: the ranges and NULL counts count them too.
        let rows: UInt64Array = self
            .fragments
            .iter()
            .map(|f| Some(f.physical_rows))
            .collect();
        Some(Arc::new(rows))
    }

    fn contained(
        &self,
        _column: &Column,
        _values: &std::collections::HashSet<ScalarValue>,
    ) -> Option<BooleanArray> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kept_groups_become_merged_offset_ranges() {
        let rows = [10, 10, 5, 10];
        assert_eq!(
            kept_ranges(&rows, &[true, true, false, true]),
            vec![0..20, 25..35]
        );
        assert_eq!(
            kept_ranges(&rows, &[false, true, true, false]),
            vec![10..25]
        );
        assert_eq!(kept_ranges(&rows, &[false; 4]), Vec::<Range<u64>>::new());
    }

    proptest! {
        /// However the selected rows are cut into batches, each row gets its own offset.
        #[test]
        fn a_cursor_gives_every_selected_row_its_offset(
            lens in proptest::collection::vec((0u64..5, 1u64..6), 1..6),
            cuts in proptest::collection::vec(1usize..7, 0..20),
        ) {
            let mut ranges = Vec::new();
            let mut at = 0;
            for (gap, len) in lens {
                ranges.push(at + gap..at + gap + len);
                at += gap + len;
            }
            let want: Vec<u64> = ranges.iter().flat_map(|r| r.clone()).collect();
            let mut cursor = RangeCursor::new(ranges);
            let mut got = Vec::new();
            let mut left = want.len();
            for c in cuts.into_iter().chain(std::iter::repeat(3)) {
                if left == 0 {
                    break;
                }
                let n = c.min(left);
                let mut seen = 0;
                for (start, len, offset) in cursor.advance(n).unwrap() {
                    prop_assert_eq!(start, seen);
                    seen += len;
                    got.extend(offset..offset + len as u64);
                }
                prop_assert_eq!(seen, n);
                left -= n;
            }
            prop_assert!(cursor.done());
            prop_assert_eq!(got, want);
            prop_assert!(cursor.advance(1).is_err());
        }
    }
}

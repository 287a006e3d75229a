//! `FragmentScanExec`: reads one table snapshot in logical order.
//!
//! One output partition. Fragments are read concurrently (up to `target_partitions`, and at
//! least 8, at a time, each by its own task) but emitted strictly in manifest order and, inside a fragment, in
//! offset order, so a plain `SELECT * FROM t` returns rows in the table's logical order.
//! Deletion vectors and pushed-down filters are applied here; virtual columns (`_rowaddr`,
//! `_rowid`) are computed from fragment ids, offsets and row-id sequences.
//!
//! A scan may read only some fragments of its snapshot ([`FragmentScanExec::with_fragments`]):
//! a query split across machines gives each task its own run of fragments.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, BooleanArray, BooleanBufferBuilder, RecordBatch, RecordBatchOptions, UInt64Array,
};
use datafusion::arrow::compute::{and, filter_record_batch, prep_null_mask_filter};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, Statistics, internal_datafusion_err, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::{RecordBatchReceiverStream, RecordBatchStreamAdapter};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream, StatisticsArgs,
    apply_expression_roots,
};
use futures::{StreamExt, stream};
use roaring::RoaringBitmap;
use tokio::sync::mpsc::Sender;

use super::prune::{FragmentPruner, RangeCursor};
use crate::format::fragment_io::read_fragment_ranges;
use crate::format::{Fragment, Snapshot, read_fragment};
use crate::index::cache::IndexCache;
use crate::ledger::ids::row_address;

/// Which virtual columns a scan produces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VirtualColumns {
    /// `_rowaddr`: the row's address (fragment id and offset).
    pub row_addr: bool,
    /// `_rowid`: the row's stable id.
    pub row_id: bool,
}

pub use crate::format::manifest::{ROW_ADDR, ROW_ID};

/// What a scan needs to know to read one snapshot.
#[derive(Debug, Clone)]
pub struct ScanSpec {
    /// The table version read.
    pub snapshot: Snapshot,
    /// Table columns read from data files, in table order.
    pub read_schema: SchemaRef,
    /// `read_schema` plus the virtual columns needed; filters are evaluated on this.
    pub work_schema: SchemaRef,
    /// The virtual columns produced.
    pub virtual_columns: VirtualColumns,
    /// Conjunction of the pushed-down filters, bound to `work_schema`.
    pub predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Columns of `work_schema` that form the output.
    pub output_indices: Vec<usize>,
    /// At most this many rows.
    pub limit: Option<usize>,
}

/// Reads a snapshot's live rows fragment by fragment: deletion vectors applied, the filter
/// evaluated, fragments and row groups it cannot match skipped.
#[derive(Debug)]
pub struct FragmentScanExec {
    spec: ScanSpec,
    /// The fragments (ids) read, still in manifest order; `None`: all of them.
    fragments: Option<Arc<BTreeSet<u64>>>,
    /// The session's index cache, for the KNN rule to hand to the search it substitutes.
    index_cache: Option<Arc<IndexCache>>,
    /// Rules fragments out by their column ranges, when the filter allows it.
    pruner: Option<Arc<FragmentPruner>>,
    /// Per covered fragment, whether the filter may match it: decided once per plan (the
    /// snapshot is fixed), for both the row estimate and the read.
    may_match: OnceLock<Vec<bool>>,
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl FragmentScanExec {
    /// A scan of every fragment of `spec`'s snapshot.
    pub fn new(spec: ScanSpec) -> Result<Self> {
        let schema = Arc::new(spec.work_schema.project(&spec.output_indices)?);
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let pruner = spec
            .predicate
            .as_ref()
            .and_then(|p| FragmentPruner::new(p, &spec.work_schema))
            .map(Arc::new);
        Ok(Self {
            spec,
            fragments: None,
            index_cache: None,
            pruner,
            may_match: OnceLock::new(),
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    /// What it reads.
    pub fn spec(&self) -> &ScanSpec {
        &self.spec
    }

    /// The same scan, carrying `cache` for the KNN rule to search through.
    pub fn with_index_cache(mut self, cache: Arc<IndexCache>) -> Self {
        self.index_cache = Some(cache);
        self
    }

    /// The index cache it carries, if any.
    pub fn index_cache(&self) -> Option<&Arc<IndexCache>> {
        self.index_cache.as_ref()
    }

    /// The same scan reading only the fragments `ids` (in manifest order).
    pub fn with_fragments(mut self, ids: BTreeSet<u64>) -> Self {
        self.fragments = Some(Arc::new(ids));
        self.may_match = OnceLock::new();
        self
    }

    /// The fragments this scan reads, if not all of its snapshot's.
    pub fn fragment_subset(&self) -> Option<&BTreeSet<u64>> {
        self.fragments.as_deref()
    }

    /// The fragments this scan covers, in manifest order.
    fn fragments_covered(&self) -> impl Iterator<Item = &Fragment> {
        self.spec.snapshot.manifest.fragments.iter().filter(|f| {
            self.fragments
                .as_ref()
                .is_none_or(|ids| ids.contains(&f.id))
        })
    }

    /// The fragments read: those covered that the filter may match (by their column
    /// ranges), in manifest order.
    fn fragments_read(&self) -> impl Iterator<Item = &Fragment> {
        let may_match = self.may_match.get_or_init(|| match &self.pruner {
            Some(p) => p.may_match(&self.fragments_covered().collect::<Vec<_>>()),
            None => vec![true; self.fragments_covered().count()],
        });
        self.fragments_covered()
            .zip(may_match)
            .filter_map(|(f, m)| m.then_some(f))
    }
}

impl DisplayAs for FragmentScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let s = &self.spec;
        let cols: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                let total = s.snapshot.manifest.fragments.len();
                let fragments = match &self.fragments {
                    None => total.to_string(),
                    Some(_) => format!("{} of {total}", self.fragments_covered().count()),
                };
                write!(
                    f,
                    "FragmentScanExec: table={}, version={}, fragments={fragments}, projection=[{}]",
                    s.snapshot.name(),
                    s.snapshot.version(),
                    cols.join(", ")
                )?;
                if let Some(p) = &s.predicate {
                    write!(f, ", predicate={p}")?;
                }
                if let Some(l) = s.limit {
                    write!(f, ", limit={l}")?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => write!(f, "table={}", s.snapshot.name()),
        }
    }
}

impl ExecutionPlan for FragmentScanExec {
    fn name(&self) -> &str {
        "FragmentScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.spec.predicate.iter(), f)
    }

    fn replace_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // Fragments the filter's ranges rule out hold none of its rows.
        let live = self.fragments_read().map(Fragment::live_rows).sum::<u64>() as usize;
        // Deletion vectors are counted exactly, so without filters or limit the count is exact.
        let rows = match (&self.spec.predicate, self.spec.limit) {
            (None, None) => Precision::Exact(live),
            (None, Some(l)) => Precision::Exact(live.min(l)),
            (Some(_), _) => Precision::Inexact(live),
        };
        Ok(Arc::new(
            Statistics::new_unknown(&self.schema).with_num_rows(rows),
        ))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        /// Fragments read at once, whatever the core count (memory: two batches each).
        const FRAGMENTS_AHEAD: usize = 8;
        if partition != 0 {
            return internal_err!("FragmentScanExec has one partition, asked for {partition}");
        }
        let batch_size = context.session_config().batch_size();
        // At least FRAGMENTS_AHEAD: on object storage each fragment's first read waits a
        // round trip, so more fragments in flight than cores overlap those waits.
        let parallelism = context
            .session_config()
            .target_partitions()
            .max(FRAGMENTS_AHEAD);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let counters = ScanCounters {
            fragments: MetricBuilder::new(&self.metrics).counter("fragments_scanned", partition),
            deleted: MetricBuilder::new(&self.metrics).counter("deleted_rows_skipped", partition),
            rows_pruned: MetricBuilder::new(&self.metrics).counter("rows_pruned", partition),
        };
        let spec = Arc::new(self.spec.clone());
        let schema = self.schema.clone();
        let fragments: Vec<Fragment> = self.fragments_read().cloned().collect();
        MetricBuilder::new(&self.metrics)
            .counter("fragments_pruned", partition)
            .add(self.fragments_covered().count() - fragments.len());
        let pruner = self.pruner.clone();
        let per_fragment = {
            let spec = spec.clone();
            let schema = schema.clone();
            stream::iter(fragments).map(move |fragment| {
                let mut builder = RecordBatchReceiverStream::builder(schema.clone(), 2);
                let tx = builder.tx();
                let spec = spec.clone();
                let counters = counters.clone();
                let pruner = pruner.clone();
                builder.spawn(async move {
                    let pruner = pruner.as_deref();
                    scan_fragment(&spec, &fragment, pruner, batch_size, &counters, tx).await
                });
                futures::future::ready(builder.build())
            })
        };
        // `buffered` keeps up to `parallelism` fragment tasks running ahead while `flatten`
        // drains them one after another, in list order.
        let mut remaining = spec.limit;
        let ordered = per_fragment
            .buffered(parallelism)
            .flatten()
            .map(move |batch| {
                let batch = batch?;
                baseline.record_output(batch.num_rows());
                Ok(batch)
            })
            .scan((), move |_, batch: Result<RecordBatch>| {
                let out = match (batch, remaining.as_mut()) {
                    (Err(e), _) => Some(Err(e)),
                    (Ok(b), None) => Some(Ok(b)),
                    (Ok(_), Some(0)) => None,
                    (Ok(b), Some(left)) => {
                        let take = (*left).min(b.num_rows());
                        *left -= take;
                        Some(Ok(b.slice(0, take)))
                    }
                };
                futures::future::ready(out)
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, ordered)))
    }
}

#[derive(Clone)]
struct ScanCounters {
    fragments: Count,
    deleted: Count,
    /// Rows of the fragments read that their row groups' statistics ruled out.
    rows_pruned: Count,
}

async fn scan_fragment(
    spec: &ScanSpec,
    fragment: &Fragment,
    pruner: Option<&FragmentPruner>,
    batch_size: usize,
    counters: &ScanCounters,
    tx: Sender<Result<RecordBatch>>,
) -> Result<()> {
    counters.fragments.add(1);
    let dir = spec.snapshot.dir.clone();
    let deleted = dir.shared_deletions(fragment).await?;
    counters.deleted.add(deleted.len() as usize);
    if deleted.len() == fragment.physical_rows {
        return Ok(());
    }
    let ranges = match pruner {
        Some(p) => p.row_ranges(&dir, fragment).await?,
        None => None,
    };
    if let Some(ranges) = ranges {
        let kept: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        counters
            .rows_pruned
            .add((fragment.physical_rows - kept) as usize);
        return scan_ranges(spec, fragment, &deleted, ranges, batch_size, tx).await;
    }
    let mut batches = read_fragment(dir, fragment, spec.read_schema.clone(), batch_size);
    let mut offset = 0u64;
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        let n = batch.num_rows();
        let out = filter_fragment_rows(spec, fragment, &deleted, offset, batch)?;
        offset += n as u64;
        if out.num_rows() > 0 && tx.send(Ok(out)).await.is_err() {
            return Ok(()); // the consumer went away (limit reached or query cancelled)
        }
    }
    if offset != fragment.physical_rows {
        return Err(crate::format::FormatError::corrupt(
            format!("fragment {}", fragment.id),
            format!(
                "read {offset} rows, manifest says {}",
                fragment.physical_rows
            ),
        )
        .into());
    }
    Ok(())
}

/// [`scan_fragment`] of the rows in `ranges` only (the row groups the filter may match).
async fn scan_ranges(
    spec: &ScanSpec,
    fragment: &Fragment,
    deleted: &RoaringBitmap,
    ranges: Vec<std::ops::Range<u64>>,
    batch_size: usize,
    tx: Sender<Result<RecordBatch>>,
) -> Result<()> {
    let dir = spec.snapshot.dir.clone();
    let schema = spec.read_schema.clone();
    let mut batches = read_fragment_ranges(dir, fragment, schema, &ranges, batch_size);
    let mut cursor = RangeCursor::new(ranges);
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        let pieces = cursor.advance(batch.num_rows()).map_err(|e| {
            crate::format::FormatError::corrupt(format!("fragment {}", fragment.id), e)
        })?;
        for (start, len, offset) in pieces {
            let piece = batch.slice(start, len);
            let out = filter_fragment_rows(spec, fragment, deleted, offset, piece)?;
            if out.num_rows() > 0 && tx.send(Ok(out)).await.is_err() {
                return Ok(());
            }
        }
    }
    if !cursor.done() {
        return Err(crate::format::FormatError::corrupt(
            format!("fragment {}", fragment.id),
            "read fewer rows than its row groups hold",
        )
        .into());
    }
    Ok(())
}

/// Which of the rows `offsets` are not in `deleted`, as a filter; `None` when none is.
///
/// Set bits cleared per deleted row, not a bitmap lookup per row: a single-row UPDATE on a
/// live table reads a whole row group of a fragment with deletions, and looking up each of
/// its rows was 4% of a server's CPU under `perf`.
fn live_rows_mask(deleted: &RoaringBitmap, offsets: std::ops::Range<u32>) -> Option<BooleanArray> {
    let mut gone = deleted.range(offsets.clone()).peekable();
    gone.peek()?;
    let mut live = BooleanBufferBuilder::new(offsets.len());
    live.append_n(offsets.len(), true);
    for o in gone {
        live.set_bit((o - offsets.start) as usize, false);
    }
    Some(BooleanArray::new(live.finish(), None))
}

/// Adds virtual columns, drops deleted rows and rows failing the predicate, and projects:
/// `batch` holds `spec.read_schema`'s columns of the fragment's rows from `offset` on.
pub(crate) fn filter_fragment_rows(
    spec: &ScanSpec,
    fragment: &Fragment,
    deleted: &RoaringBitmap,
    offset: u64,
    batch: RecordBatch,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let mut columns = batch.columns().to_vec();
    if spec.virtual_columns.row_addr {
        let addrs: UInt64Array = (offset..offset + n as u64)
            .map(|o| row_address(fragment.id, o))
            .collect();
        columns.push(Arc::new(addrs));
    }
    if spec.virtual_columns.row_id {
        let ids: UInt64Array = match &fragment.row_ids {
            Some(seq) => {
                let mut ids = Vec::with_capacity(n);
                seq.extend_slice(offset, n as u64, &mut ids);
                UInt64Array::from(ids)
            }
            None => (offset..offset + n as u64)
                .map(|o| row_address(fragment.id, o))
                .collect(),
        };
        columns.push(Arc::new(ids));
    }
    let work = RecordBatch::try_new_with_options(
        spec.work_schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(n)),
    )?;
    let first = offset as u32;
    let last = (offset + n as u64) as u32; // exclusive
    let mut mask = live_rows_mask(deleted, first..last);
    if let Some(predicate) = &spec.predicate {
        let value = predicate.evaluate(&work)?.into_array(n)?;
        let value = value
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| internal_datafusion_err!("filter returned {}", value.data_type()))?;
        let value = if value.null_count() > 0 {
            prep_null_mask_filter(value)
        } else {
            value.clone()
        };
        mask = Some(match mask {
            Some(m) => and(&m, &value)?,
            None => value,
        });
    }
    let kept = match mask {
        Some(m) => filter_record_batch(&work, &m)?,
        None => work,
    };
    Ok(kept.project(&spec.output_indices)?)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The mask keeps exactly the rows a lookup per row keeps, and is `None` exactly
        /// when no row of the range is deleted (deletions in and past a bitmap container).
        #[test]
        fn live_rows_mask_equals_a_lookup_per_row(
            deleted in prop::collection::btree_set(
                prop_oneof![0u32..300, 65_500u32..65_600], 0..60),
            start in prop_oneof![0u32..300, 65_450u32..65_600],
            len in 0u32..200,
        ) {
            let deleted: RoaringBitmap = deleted.into_iter().collect();
            let offsets = start..start + len;
            let naive: Vec<bool> = offsets.clone().map(|o| !deleted.contains(o)).collect();
            match live_rows_mask(&deleted, offsets) {
                None => prop_assert!(naive.iter().all(|live| *live)),
                Some(mask) => {
                    prop_assert_eq!(mask.null_count(), 0);
                    prop_assert_eq!(mask.iter().map(Option::unwrap).collect::<Vec<_>>(), naive.clone());
                    prop_assert!(naive.iter().any(|live| !live));
                }
            }
        }
    }
}

//! `KnnExec`: the k rows nearest a query vector, read through a vector index.
//!
//! It replaces the table scan under DataFusion's `SortExec(fetch = k)` (see
//! [`super::knn_rule`]) and emits at most k candidate rows with the scan's columns (2k under
//! NULLS FIRST: up to k rows with a NULL vector, and the nearest of the others); the sort
//! above recomputes the distances from the rows' current vectors and orders them, so the
//! answer is ordered exactly like `ORDER BY <distance> LIMIT k`.
//!
//! A thin operator: it evaluates the pushed-down WHERE filter into a row mask (over the
//! filter's columns as the index cache keeps them decoded when they are small fixed-width
//! ones, else with a [`FragmentScanExec`] over Parquet), calls the index layer's one search entry point
//! ([`crate::index::knn::search`], which owns the ownership / deletion / mask rules, probing,
//! re-ranking and brute force), reads the answer's rows, and reports the search's counters
//! as metrics. One output partition; emission is final (all k rows at once).
//!
//! A KNN search split across machines gives each task a *share* of it
//! ([`KnnExec::with_share`]: some segments plus the unowned rows of some fragments, see
//! [`crate::index::knn::share`]); the task returns the local top-k of its share's rows and
//! evaluates the WHERE filter only over the fragments those rows are in.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, internal_datafusion_err, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal,
    NegativeExpr, NotExpr, TryCastExpr,
};
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream, apply_expression_roots,
};
use futures::StreamExt;
use roaring::{RoaringBitmap, RoaringTreemap};

use super::options::FragvecOptions;
use super::prune::FragmentPruner;
use super::scan::{
    FragmentScanExec, ROW_ADDR, ROW_ID, ScanSpec, VirtualColumns, filter_fragment_rows,
};
use crate::format::index_meta::{IndexDef, IndexKind};
use crate::format::store::Snapshot;
use crate::index::cache::IndexCache;
use crate::index::distance::Metric;
use crate::index::error::IndexError;
use crate::index::knn::{self, KnnRequest, KnnShare, KnnStats, rows::RowReader};

/// What the query asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct KnnQuery {
    /// The vector column (a table column name).
    pub column: String,
    /// The query vector.
    pub vector: Vec<f32>,
    /// The distance the rows are ranked by.
    pub metric: Metric,
    /// How many nearest rows to return.
    pub k: usize,
    /// IVF partitions to probe per segment (`fragvec.nprobes` when the query was planned).
    pub nprobes: usize,
    /// `NULLS FIRST`: rows without a distance (NULL vectors) come before the nearest rows, so
    /// up to k of them are returned too.
    pub nulls_first: bool,
}

/// The nearest rows of a table to a query vector, through its IVF index and brute force over
/// unindexed fragments, with the WHERE filter applied before each segment's top-k.
#[derive(Debug)]
pub struct KnnExec {
    scan: ScanSpec,
    query: KnnQuery,
    /// The index to search; `None` scores every row exactly.
    index: Option<IndexDef>,
    /// The part of the search this operator answers for; `None`: all of it.
    share: Option<KnnShare>,
    cache: Arc<IndexCache>,
    /// Per fragment of the snapshot (manifest order), whether the filter may match it by
    /// its column ranges (`None`: no range can rule one out): decided once per plan and kept
    /// by the plan's copies for other vectors and shares, not at every query.
    may_match: Arc<OnceLock<Option<Vec<bool>>>>,
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    props: Arc<PlanProperties>,
}

impl KnnExec {
    /// A search for `query` over the scan's snapshot, through `index` (`None`: exact) and `cache`.
    pub fn new(
        scan: ScanSpec,
        query: KnnQuery,
        index: Option<IndexDef>,
        cache: Arc<IndexCache>,
    ) -> Result<Self> {
        let schema = Arc::new(scan.work_schema.project(&scan.output_indices)?);
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            scan,
            query,
            index,
            share: None,
            cache,
            may_match: Arc::default(),
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
            props,
        })
    }
}

impl KnnExec {
    /// The same search for another query vector (a cached plan reused, see
    /// [`super::plan_cache`]).
    pub fn with_vector(&self, vector: Vec<f32>) -> Result<Self> {
        let mut knn = Self::new(
            self.scan.clone(),
            KnnQuery {
                vector,
                ..self.query.clone()
            },
            self.index.clone(),
            self.cache.clone(),
        )?;
        knn.share = self.share.clone();
        knn.may_match = self.may_match.clone();
        Ok(knn)
    }

    /// The same search answering only for `share` (one task of a split search).
    pub fn with_share(&self, share: KnnShare) -> Result<Self> {
        let mut knn = Self::new(
            self.scan.clone(),
            self.query.clone(),
            self.index.clone(),
            self.cache.clone(),
        )?;
        knn.share = Some(share);
        knn.may_match = self.may_match.clone();
        Ok(knn)
    }

    /// The same search over another version of its table, when this plan is what planning
    /// the query over that version gives: the plan depends on a version only through the
    /// table's schema (columns, the vector's dimension, the filter's binding) and its index
    /// definitions (which index, if any, the search goes through); segments, fragments and
    /// deletions are read from the snapshot when the search runs. `None` when either
    /// differs, or for a share of a split search.
    pub fn at_snapshot(&self, snapshot: Snapshot) -> Result<Option<Self>> {
        let planned = &self.scan.snapshot;
        if self.share.is_some()
            || snapshot.name() != planned.name()
            || snapshot.schema != planned.schema
            || snapshot.manifest.indexes != planned.manifest.indexes
        {
            return Ok(None);
        }
        let scan = ScanSpec {
            snapshot,
            ..self.scan.clone()
        };
        // `may_match` is per fragment of a snapshot: a new one for the new snapshot.
        let knn = Self::new(
            scan,
            self.query.clone(),
            self.index.clone(),
            self.cache.clone(),
        )?;
        Ok(Some(knn))
    }

    /// What it searches for.
    pub fn query(&self) -> &KnnQuery {
        &self.query
    }

    /// The index searched (`None`: every row is scored exactly).
    pub fn index(&self) -> Option<&IndexDef> {
        self.index.as_ref()
    }

    /// The part of the search it answers for (on a worker); `None`: all of it.
    pub fn share(&self) -> Option<&KnnShare> {
        self.share.as_ref()
    }

    /// The index cache it reads through.
    pub fn cache(&self) -> &Arc<IndexCache> {
        &self.cache
    }

    /// The query vector (what a kept plan re-binds).
    pub fn query_vector(&self) -> &[f32] {
        &self.query.vector
    }

    /// The table version searched and the pushed-down filter.
    pub fn scan_spec(&self) -> &ScanSpec {
        &self.scan
    }
}

impl DisplayAs for KnnExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let index = self.index.as_ref().map_or("none (exact)".to_string(), |i| {
            format!("{} ({})", i.name, i.kind.name())
        });
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "KnnExec: table={}, version={}, column={}, index={index}, metric={}, k={}, nprobes={}",
                    self.scan.snapshot.name(),
                    self.scan.snapshot.version(),
                    self.query.column,
                    self.query.metric.as_str(),
                    self.query.k,
                    self.query.nprobes
                )?;
                if self.query.nulls_first {
                    write!(f, ", nulls_first")?;
                }
                if let Some(p) = &self.scan.predicate {
                    write!(f, ", filter={p}")?;
                }
                if let Some(share) = &self.share {
                    let segments: Vec<String> =
                        share.segments.iter().map(|s| s.to_string()).collect();
                    match share.slice {
                        Some(slice) => write!(
                            f,
                            ", share=partitions p % {} = {} of segments [{}], unowned rows o % {} = {}",
                            slice.of,
                            slice.index,
                            segments.join(", "),
                            slice.of,
                            slice.index
                        )?,
                        None => write!(
                            f,
                            ", share=segments [{}] + {} fragments",
                            segments.join(", "),
                            share.fragments.len()
                        )?,
                    }
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => write!(f, "k={}", self.query.k),
        }
    }
}

impl ExecutionPlan for KnnExec {
    fn name(&self) -> &str {
        "KnnExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.scan.predicate.iter(), f)
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

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("KnnExec has one partition, asked for {partition}");
        }
        let options = context
            .session_config()
            .options()
            .extensions
            .get::<FragvecOptions>()
            .cloned()
            .unwrap_or_default();
        self.cache.set_budget(options.index_cache_bytes);
        let (index, query) = exact_plan(self.index.as_ref(), &self.query, options.exact);
        let run = KnnRun {
            scan: self.scan.clone(),
            query,
            exact_over_index: options.exact && index.is_some(),
            index,
            share: self.share.clone(),
            refine_factor: options.refine_factor,
            cache: self.cache.clone(),
            may_match: self.may_match.clone(),
            ctx: context,
            metrics: KnnMetrics::new(&self.metrics, partition),
            output_schema: self.schema.clone(),
        };
        let stream = futures::stream::once(run.run());
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

/// The index an execution searches under `fragvec.exact = exact`. An exact search over an
/// IVF_FLAT index still reads its segments, probing every partition: they hold each indexed
/// row's vector as raw floats, read by range without decoding Parquet, and every owned row is
/// scored exactly by the same kernels; only rows no segment owns are read from the data
/// files. IVF_PQ segments hold codes, not vectors: an exact search there scores the data
/// files. (The distributed planner splits a search by the same answer.)
pub fn searched_index(index: Option<&IndexDef>, exact: bool) -> Option<&IndexDef> {
    index.filter(|i| !exact || i.kind == IndexKind::IvfFlat)
}

/// The index and query an execution uses: [`searched_index`], and under `exact` every
/// partition of it probed.
fn exact_plan(
    index: Option<&IndexDef>,
    query: &KnnQuery,
    exact: bool,
) -> (Option<IndexDef>, KnnQuery) {
    let index = searched_index(index, exact);
    let mut query = query.clone();
    if let Some(index) = index.filter(|_| exact) {
        query.nprobes = (index.num_partitions as usize).max(1);
    }
    (index.cloned(), query)
}

/// The counters `EXPLAIN ANALYZE` shows, filled from the search's [`KnnStats`].
struct KnnMetrics {
    segments_searched: Count,
    partitions_probed: Count,
    rows_scored: Count,
    dropped_ownership: Count,
    dropped_deleted: Count,
    dropped_filter: Count,
    skipped_by_bound: Count,
    counted_for_slices: Count,
    seen_for_slice_bound: Count,
    unindexed_rows: Count,
    exact_fallbacks: Count,
    /// Data fragments whose rows were read from Parquet (scoring or fetching results).
    fragments_read: Count,
    /// Fragments the WHERE filter's mask skipped by their column ranges.
    fragments_pruned: Count,
    /// Queries whose WHERE filter's rows were found kept for their table version.
    filter_masks_reused: Count,
}

impl KnnMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let counter = |name: &'static str| MetricBuilder::new(set).counter(name, partition);
        Self {
            segments_searched: counter("segments_searched"),
            partitions_probed: counter("partitions_probed"),
            rows_scored: counter("rows_scored"),
            dropped_ownership: counter("rows_dropped_by_ownership"),
            dropped_deleted: counter("rows_dropped_by_deletions"),
            dropped_filter: counter("rows_dropped_by_filter"),
            skipped_by_bound: counter("rows_skipped_by_bound"),
            counted_for_slices: counter("rows_counted_for_other_slices"),
            seen_for_slice_bound: counter("rows_seen_for_slice_bound"),
            unindexed_rows: counter("rows_from_unindexed_fragments"),
            exact_fallbacks: counter("exact_fallbacks"),
            fragments_read: counter("fragments_read"),
            fragments_pruned: counter("fragments_pruned"),
            filter_masks_reused: counter("filter_masks_reused"),
        }
    }

    fn record(&self, s: &KnnStats) {
        self.segments_searched.add(s.segments_searched);
        self.partitions_probed.add(s.partitions_probed);
        self.rows_scored.add(s.rows_scored);
        self.dropped_ownership.add(s.dropped_ownership);
        self.dropped_deleted.add(s.dropped_deleted);
        self.dropped_filter.add(s.dropped_filter);
        self.skipped_by_bound.add(s.skipped_by_bound);
        self.counted_for_slices.add(s.counted_for_slices);
        self.seen_for_slice_bound.add(s.seen_for_slice_bound);
        self.unindexed_rows.add(s.unindexed_rows);
        self.exact_fallbacks.add(s.exact_fallbacks);
        self.fragments_read.add(s.fragments_read);
    }
}

/// One execution: evaluates the WHERE filter into a row mask (DataFusion's job), asks the
/// index layer for the nearest rows, and reads them.
struct KnnRun {
    scan: ScanSpec,
    query: KnnQuery,
    /// An exact search reading an IVF_FLAT index's segments (see [`searched_index`]).
    exact_over_index: bool,
    index: Option<IndexDef>,
    share: Option<KnnShare>,
    refine_factor: usize,
    cache: Arc<IndexCache>,
    /// The plan's decision of which fragments the filter may match ([`KnnExec`]'s).
    may_match: Arc<OnceLock<Option<Vec<bool>>>>,
    ctx: Arc<TaskContext>,
    metrics: KnnMetrics,
    output_schema: SchemaRef,
}

impl KnnRun {
    async fn run(self) -> Result<RecordBatch> {
        let mask = match &self.scan.predicate {
            Some(predicate) => Some(self.kept_row_mask(predicate).await?),
            None => None,
        };
        let snapshot = &self.scan.snapshot;
        let request = KnnRequest {
            snapshot,
            column: &self.query.column,
            vector: &self.query.vector,
            metric: self.query.metric,
            k: self.query.k,
            index: self.index.as_ref(),
            nprobes: self.query.nprobes,
            refine_factor: self.refine_factor,
            mask: mask.as_deref(),
            undefined_first: self.query.nulls_first,
        };
        let mut answer = match &self.share {
            Some(share) => knn::search_share(request, share, &self.cache).await?,
            None => match knn::search(request, &self.cache).await {
                // For an exact search the index only saves reading the data files: when it
                // cannot be read (a damaged or missing model, segment or ledger file), the
                // data files answer, counted as an exact fallback. `SET fragvec.exact = true`
                // stays the way to query a table whose index is damaged. (A share of a
                // distributed search reports the error: its rows were split by segment.)
                Err(e)
                    if self.exact_over_index
                        && !matches!(e, IndexError::DimensionMismatch { .. }) =>
                {
                    let from_data_files = KnnRequest {
                        index: None,
                        ..request
                    };
                    let mut answer = knn::search(from_data_files, &self.cache).await?;
                    answer.stats.exact_fallbacks += 1;
                    answer
                }
                searched => searched?,
            },
        };
        let fetched = AtomicUsize::new(0);
        let reader = RowReader {
            snapshot,
            cache: &self.cache,
            fragments_read: &fetched,
        };
        let batch = reader
            .fetch(&answer, &self.query.column, &self.output_schema)
            .await?;
        answer.stats.fragments_read += fetched.into_inner();
        self.metrics.record(&answer.stats);
        Ok(batch)
    }

    /// [`Self::row_mask`], kept in the index cache for the table version when the filter
    /// has an identity ([`filter_identity`]): the same filter on the same version (a
    /// prepared query run with the same category, another connection's query) passes the
    /// same rows, so only the first query pays for a pass over the table's filter columns.
    /// A share's mask covers only its fragments and is not kept.
    async fn kept_row_mask(
        &self,
        predicate: &Arc<dyn PhysicalExpr>,
    ) -> Result<Arc<RoaringTreemap>> {
        let identity = self
            .share
            .is_none()
            .then(|| filter_identity(predicate))
            .flatten();
        let Some(identity) = identity else {
            return Ok(Arc::new(self.row_mask().await?));
        };
        let snapshot = &self.scan.snapshot;
        if let Some(kept) = self
            .cache
            .filter_mask(&snapshot.dir, &snapshot.manifest, &identity)
        {
            self.metrics.filter_masks_reused.add(1);
            return Ok(kept);
        }
        let mask = Arc::new(self.row_mask().await?);
        self.cache
            .keep_filter_mask(&snapshot.dir, &snapshot.manifest, identity, mask.clone());
        Ok(mask)
    }

    /// Addresses of the rows passing the WHERE filter (deleted rows left out).
    async fn row_mask(&self) -> Result<RoaringTreemap> {
        let spec = self.filter_spec()?;
        // Only the fragments holding a share's rows can hold its qualifying rows.
        let mut fragments = match &self.share {
            Some(share) => Some(
                knn::share_fragments(&self.scan.snapshot, self.index.as_ref(), share, &self.cache)
                    .await?,
            ),
            None => None,
        };
        // ... and only those whose column ranges the filter may match: the others' filter
        // columns are neither loaded nor evaluated.
        let all = &spec.snapshot.manifest.fragments;
        let decided = self.may_match.get_or_init(|| {
            let pruner = FragmentPruner::new(spec.predicate.as_ref()?, &spec.work_schema)?;
            Some(pruner.may_match(&all.iter().collect::<Vec<_>>()))
        });
        if let Some(may_match) = decided {
            let mut pruned = 0;
            let mut kept = BTreeSet::new();
            for (f, may) in all.iter().zip(may_match) {
                if fragments.as_ref().is_some_and(|ids| !ids.contains(&f.id)) {
                    continue;
                }
                if *may {
                    kept.insert(f.id);
                } else {
                    pruned += 1;
                }
            }
            self.metrics.fragments_pruned.add(pruned);
            if pruned > 0 {
                fragments = Some(kept);
            }
        }
        if let Some(mask) = self.row_mask_from_cache(&spec, fragments.as_ref()).await? {
            return Ok(mask);
        }
        let mut scan = FragmentScanExec::new(spec)?;
        if let Some(fragments) = fragments {
            scan = scan.with_fragments(fragments);
        }
        let mut stream = scan.execute(0, self.ctx.clone())?;
        let mut allowed = RoaringTreemap::new();
        while let Some(batch) = stream.next().await {
            extend_mask(&mut allowed, &batch?);
        }
        Ok(allowed)
    }

    /// [`Self::row_mask`] evaluated over whole columns the index cache keeps decoded (once per
    /// session) instead of over Parquet pages: a filter on small fixed-width columns costs one
    /// pass over arrays in memory per query. `None` when a filter column is not cacheable.
    async fn row_mask_from_cache(
        &self,
        spec: &ScanSpec,
        only: Option<&BTreeSet<u64>>,
    ) -> Result<Option<RoaringTreemap>> {
        let fetched = AtomicUsize::new(0);
        let reader = RowReader {
            snapshot: &spec.snapshot,
            cache: &self.cache,
            fragments_read: &fetched,
        };
        let fragments: Vec<_> = spec
            .snapshot
            .manifest
            .fragments
            .iter()
            .filter(|f| only.is_none_or(|ids| ids.contains(&f.id)))
            .collect();
        // Decided before any column is loaded, so a fragment that is not cacheable does not
        // make the others' columns decoded here and then read again by the scan.
        if !fragments
            .iter()
            .all(|f| reader.columns_cacheable(f, &spec.read_schema))
        {
            return Ok(None);
        }
        // A predicate on table columns alone is evaluated on them directly (the virtual
        // columns come after them in `work_schema`, so its column indices hold) and its
        // passing rows become one bitmap per fragment; one naming `_rowaddr` / `_rowid` goes
        // through the scan's own row filter.
        let table_columns_only = spec
            .predicate
            .iter()
            .flat_map(collect_columns)
            .all(|c| c.index() < spec.read_schema.fields().len());
        let mut allowed = RoaringTreemap::new();
        let mut bitmaps = Vec::new();
        for fragment in fragments {
            let Some(columns) = reader.cached_columns(fragment, &spec.read_schema).await? else {
                return Ok(None);
            };
            let deleted = spec.snapshot.dir.shared_deletions(fragment).await?;
            match (&spec.predicate, table_columns_only) {
                (Some(predicate), true) => {
                    let Ok(high) = u32::try_from(fragment.id) else {
                        return Ok(None);
                    };
                    bitmaps.push((high, passing_rows(predicate, &columns, &deleted)?));
                }
                _ => extend_mask(
                    &mut allowed,
                    &filter_fragment_rows(spec, fragment, &deleted, 0, columns)?,
                ),
            }
        }
        allowed |= RoaringTreemap::from_bitmaps(bitmaps);
        Ok(Some(allowed))
    }

    /// A scan of the snapshot reading only the filter's columns, producing `_rowaddr` of the
    /// rows that pass it (never the vector column the query sorts by).
    fn filter_spec(&self) -> Result<ScanSpec> {
        let snapshot = self.scan.snapshot.clone();
        let table = &snapshot.schema;
        let wanted: BTreeSet<usize> = self
            .scan
            .predicate
            .iter()
            .flat_map(collect_columns)
            .filter_map(|c| table.index_of(c.name()).ok())
            .collect();
        let read_schema = Arc::new(table.project(&wanted.into_iter().collect::<Vec<_>>())?);
        let virtual_columns = VirtualColumns {
            row_addr: true,
            row_id: self.scan.virtual_columns.row_id,
        };
        let mut fields: Vec<Field> = read_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(ROW_ADDR, DataType::UInt64, false));
        if virtual_columns.row_id {
            fields.push(Field::new(ROW_ID, DataType::UInt64, false));
        }
        let work_schema = Arc::new(Schema::new(fields));
        let predicate = match &self.scan.predicate {
            Some(p) => Some(reassign_expr_columns(p.clone(), &work_schema)?),
            None => None,
        };
        let output_indices = vec![work_schema.index_of(ROW_ADDR)?];
        Ok(ScanSpec {
            snapshot,
            read_schema,
            work_schema,
            virtual_columns,
            predicate,
            output_indices,
            limit: None,
        })
    }
}

/// A text that identifies what a WHERE filter computes, for keeping the rows it passes in a
/// table version ([`KnnRun::kept_row_mask`]); `None` for a filter that must be evaluated
/// every time. Only filters built of columns, literals and deterministic operators have one:
/// functions may be volatile (`random()`) or user-defined, and DataFusion's dynamic filters
/// change under the same node. Their `Debug` text spells every column's name and position
/// and every literal with its type, strings quoted, so two filters with one text compute
/// the same rows of the same table version.
fn filter_identity(predicate: &Arc<dyn PhysicalExpr>) -> Option<String> {
    let mut plain = true;
    predicate
        .apply(|e| {
            let e = e.as_ref() as &dyn std::any::Any;
            plain = e.is::<Column>()
                || e.is::<Literal>()
                || e.is::<BinaryExpr>()
                || e.is::<InListExpr>()
                || e.is::<NotExpr>()
                || e.is::<IsNullExpr>()
                || e.is::<IsNotNullExpr>()
                || e.is::<CastExpr>()
                || e.is::<TryCastExpr>()
                || e.is::<LikeExpr>()
                || e.is::<NegativeExpr>();
            Ok(if plain {
                TreeNodeRecursion::Continue
            } else {
                TreeNodeRecursion::Stop
            })
        })
        .ok()?;
    plain.then(|| format!("{predicate:?}"))
}

/// Adds the `_rowaddr` column of a mask scan's batch to `allowed`.
fn extend_mask(allowed: &mut RoaringTreemap, batch: &RecordBatch) {
    allowed.extend(
        batch
            .column(0)
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .copied(),
    );
}

/// Offsets of the rows of one fragment (`columns`: its table columns, every physical row)
/// that pass `predicate` (a NULL is a no), deleted rows left out: the low halves of their row
/// addresses.
fn passing_rows(
    predicate: &Arc<dyn PhysicalExpr>,
    columns: &RecordBatch,
    deleted: &RoaringBitmap,
) -> Result<RoaringBitmap> {
    let value = predicate
        .evaluate(columns)?
        .into_array(columns.num_rows())?;
    let Some(passed) = value.as_boolean_opt() else {
        return internal_err!("the filter returned {}", value.data_type());
    };
    let rows = passed
        .values()
        .set_indices()
        .filter(|i| passed.is_valid(*i))
        .map(|i| i as u32);
    let mut rows = RoaringBitmap::from_sorted_iter(rows)
        .map_err(|e| internal_datafusion_err!("filter rows out of order: {e}"))?;
    rows -= deleted;
    Ok(rows)
}

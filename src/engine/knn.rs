//! `KnnExec`: the k rows nearest a query vector, read through a vector index.
//!
//! It replaces the table scan under DataFusion's `SortExec(fetch = k)` (see
//! [`super::knn_rule`]) and emits at most k candidate rows with the scan's columns; the sort
//! above recomputes the distances from the rows' current vectors and orders them, so the
//! answer is ordered exactly like `ORDER BY <distance> LIMIT k`.
//!
//! For each segment of the index, the rows it may answer for (ownership ∩ fragments still in
//! the table), deletion vectors and the WHERE filter (as an allow-list of row addresses) are
//! applied to every row **before** it can enter that segment's top-k. A segment with nothing
//! invalidated, all fragments present and none with deletions, under a query without WHERE,
//! takes the unfiltered path. Fragments no segment owns are scored by brute force. When the
//! filter admits few rows they are scored exactly; when probing `nprobes` partitions finds
//! fewer than k rows, more partitions are probed; and if the index still cannot produce k rows
//! (rows with NULL vectors are not indexed), the query is answered by an exact scan.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch, RecordBatchOptions,
    UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
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
use super::scan::{FragmentScanExec, ROW_ADDR, ROW_ID, ScanSpec, VirtualColumns};
use crate::format::fragment_io::read_fragment_rows;
use crate::format::index_meta::IndexDef;
use crate::format::read_fragment;
use crate::format::{Fragment, Snapshot};
use crate::index::distance::{Metric, metric_key};
use crate::index::search::{Candidate, RowMask, SearchStats, TopK, score_flat, score_pq};
use crate::index::segment::{ColumnVectors, PartitionCache, Translation};
use crate::ledger::Coverage;
use crate::ledger::ids::{row_address, split_row_address};

/// Fragments with at least this many rows are scored exactly on every core.
const PARALLEL_SCORING_ROWS: u64 = 32 * 1024;

/// Filters admitting at most this many rows are answered by scoring exactly those rows.
const EXACT_FILTER_ROWS: u64 = 4096;

/// Decodes the vector column of a fragment (all physical rows).
async fn load_vectors(
    dir: Arc<crate::format::TableDir>,
    fragment: Fragment,
    schema: SchemaRef,
) -> crate::format::Result<ColumnVectors> {
    let mut out = ColumnVectors::default();
    let mut stream = read_fragment(dir, &fragment, schema, 8192);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let list = batch.column(0).as_fixed_size_list();
        out.dim = list.value_length() as usize;
        out.values
            .extend_from_slice(list.values().as_primitive::<Float32Type>().values());
        out.valid.extend((0..list.len()).map(|i| list.is_valid(i)));
    }
    if out.valid.len() as u64 != fragment.physical_rows {
        return Err(crate::format::FormatError::corrupt(
            format!("fragment {}", fragment.id),
            "vector column row count differs from the fragment's",
        ));
    }
    Ok(out)
}

/// What the query asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct KnnQuery {
    /// The vector column (a table column name).
    pub column: String,
    pub vector: Vec<f32>,
    pub metric: Metric,
    pub k: usize,
    /// IVF partitions to probe per segment (`fragvec.nprobes` when the query was planned).
    pub nprobes: usize,
}

#[derive(Debug)]
pub struct KnnExec {
    scan: ScanSpec,
    query: KnnQuery,
    /// The index to search; `None` scores every row exactly.
    index: Option<IndexDef>,
    cache: Arc<PartitionCache>,
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    props: Arc<PlanProperties>,
}

impl KnnExec {
    pub fn new(
        scan: ScanSpec,
        query: KnnQuery,
        index: Option<IndexDef>,
        cache: Arc<PartitionCache>,
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
            cache,
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
        Self::new(
            self.scan.clone(),
            KnnQuery {
                vector,
                ..self.query.clone()
            },
            self.index.clone(),
            self.cache.clone(),
        )
    }

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
                if let Some(p) = &self.scan.predicate {
                    write!(f, ", filter={p}")?;
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
            return Err(DataFusionError::Internal(format!(
                "KnnExec has one partition, asked for {partition}"
            )));
        }
        let options = context
            .session_config()
            .options()
            .extensions
            .get::<FragvecOptions>()
            .cloned()
            .unwrap_or_default();
        self.cache.set_budget(options.index_cache_bytes);
        let counter =
            |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let search = Search {
            scan: self.scan.clone(),
            query: self.query.clone(),
            index: if options.exact {
                None
            } else {
                self.index.clone()
            },
            cache: self.cache.clone(),
            nprobes: self.query.nprobes.max(1),
            refine_factor: options.refine_factor.max(1),
            ctx: context,
            counters: Counters {
                segments_searched: counter("segments_searched"),
                partitions_probed: counter("partitions_probed"),
                rows_scored: counter("rows_scored"),
                dropped_ownership: counter("rows_dropped_by_ownership"),
                dropped_deleted: counter("rows_dropped_by_deletions"),
                dropped_filter: counter("rows_dropped_by_filter"),
                unindexed_rows: counter("rows_from_unindexed_fragments"),
                exact_fallbacks: counter("exact_fallbacks"),
                fragments_read: counter("fragments_read"),
            },
            output_schema: self.schema.clone(),
            allowed: None,
            deletions: HashMap::new(),
        };
        let stream = futures::stream::once(async move { search.run().await });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

#[derive(Clone)]
struct Counters {
    segments_searched: Count,
    partitions_probed: Count,
    rows_scored: Count,
    dropped_ownership: Count,
    dropped_deleted: Count,
    dropped_filter: Count,
    unindexed_rows: Count,
    exact_fallbacks: Count,
    /// Data fragments whose rows were read from Parquet (scoring or fetching results).
    fragments_read: Count,
}

impl Counters {
    fn record(&self, s: &SearchStats) {
        self.partitions_probed.add(s.partitions_probed);
        self.rows_scored.add(s.rows_scored);
        self.dropped_ownership.add(s.dropped_ownership);
        self.dropped_deleted.add(s.dropped_deleted);
        self.dropped_filter.add(s.dropped_filter);
    }
}

struct Search {
    scan: ScanSpec,
    query: KnnQuery,
    index: Option<IndexDef>,
    cache: Arc<PartitionCache>,
    nprobes: usize,
    refine_factor: usize,
    ctx: Arc<TaskContext>,
    counters: Counters,
    output_schema: SchemaRef,
    /// Addresses of the rows passing the WHERE filter (`None`: no filter).
    allowed: Option<RoaringTreemap>,
    /// Deletion vectors of the snapshot's fragments that have one, read once per query.
    deletions: HashMap<u64, RoaringBitmap>,
}

impl Search {
    fn snapshot(&self) -> &Snapshot {
        &self.scan.snapshot
    }

    async fn run(mut self) -> Result<RecordBatch> {
        let k = self.query.k;
        let snapshot = self.snapshot().clone();
        for f in snapshot
            .manifest
            .fragments
            .iter()
            .filter(|f| f.deletion.is_some())
        {
            self.deletions
                .insert(f.id, snapshot.dir.read_deletions(f).await?);
        }
        if self.scan.predicate.is_some() {
            self.allowed = Some(self.allow_list().await?);
        }
        let qualifying = match &self.allowed {
            Some(a) => a.len(),
            None => self.snapshot().manifest.live_rows(),
        };
        let mut vectors = HashMap::new();
        let candidates = match &self.index {
            _ if self.allowed.is_some() && qualifying <= EXACT_FILTER_ROWS.max(k as u64) => {
                // Few qualifying rows: score exactly them.
                let addrs: Vec<u64> = self.allowed.iter().flat_map(|a| a.iter()).collect();
                let mut top = TopK::new(k);
                for c in self.score_addresses(&addrs).await? {
                    top.push(c);
                }
                top.into_sorted()
            }
            None => {
                self.brute_force(&self.snapshot().manifest.fragments, &HashMap::new())
                    .await?
            }
            Some(index) => {
                let (found, found_vectors) = self.indexed(index).await?;
                vectors = found_vectors;
                if found.len() < k && (found.len() as u64) < qualifying {
                    // Rows the index cannot return (NULL vectors) would be in the exact answer.
                    self.counters.exact_fallbacks.add(1);
                    self.brute_force(&self.snapshot().manifest.fragments, &HashMap::new())
                        .await?
                } else {
                    found
                }
            }
        };
        self.fetch_rows(&candidates, &vectors).await
    }

    /// Addresses of the rows passing the WHERE filter.
    async fn allow_list(&self) -> Result<RoaringTreemap> {
        let spec = self.derived_spec(self.snapshot().clone(), &[], &[ROW_ADDR])?;
        let mut stream = FragmentScanExec::new(spec)?.execute(0, self.ctx.clone())?;
        let mut allowed = RoaringTreemap::new();
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            allowed.extend(
                batch
                    .column(0)
                    .as_primitive::<UInt64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
        Ok(allowed)
    }

    /// A scan over `snapshot` reading the original scan's columns plus `extra` table
    /// columns, with its filter, producing `output` (column names).
    fn derived_spec(
        &self,
        snapshot: Snapshot,
        extra: &[&str],
        output: &[&str],
    ) -> Result<ScanSpec> {
        let table = &snapshot.schema;
        // Only the filter's columns and the ones asked for: never the whole scan's columns
        // (which include the vector column the query sorts by).
        let filter_columns: Vec<String> = self
            .scan
            .predicate
            .iter()
            .flat_map(collect_columns)
            .map(|c| c.name().to_string())
            .filter(|n| table.index_of(n).is_ok())
            .collect();
        let wanted: BTreeSet<usize> = filter_columns
            .iter()
            .map(|n| n.as_str())
            .chain(extra.iter().copied())
            .map(|n| table.index_of(n))
            .collect::<std::result::Result<_, _>>()?;
        let read_schema = Arc::new(table.project(&wanted.into_iter().collect::<Vec<_>>())?);
        let virtual_columns = VirtualColumns {
            row_addr: true,
            row_id: self.scan.virtual_columns.row_id || output.contains(&ROW_ID),
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
        let output_indices = output
            .iter()
            .map(|n| work_schema.index_of(n))
            .collect::<std::result::Result<_, _>>()?;
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

    /// Exact top-k over `fragments`, with deletions and the filter. Each fragment's vector
    /// column is decoded once and kept in the session's cache (within its byte budget), so
    /// repeated exact queries score from memory.
    /// `skip`: rows some segment already answers for (of fragments segments own in part).
    async fn brute_force(
        &self,
        fragments: &[Fragment],
        skip: &HashMap<u64, RoaringBitmap>,
    ) -> Result<Vec<Candidate>> {
        let q = &self.query.vector;
        let mut top = TopK::new(self.query.k);
        let mut rows = 0usize;
        for fragment in fragments {
            let vectors = self.fragment_vectors(fragment).await?;
            let deleted = self.deletions.get(&fragment.id);
            let skipped = skip.get(&fragment.id);
            let allowed = self.allowed.as_ref();
            let metric = self.query.metric;
            let k = self.query.k;
            let id = fragment.id;
            // Scores rows `range` of this fragment into a local top-k.
            let score = |range: std::ops::Range<u64>| {
                let mut top = TopK::new(k);
                let mut rows = 0usize;
                let dim = vectors.dim;
                for offset in range {
                    let addr = row_address(id, offset);
                    if deleted.is_some_and(|d| d.contains(offset as u32))
                        || skipped.is_some_and(|d| d.contains(offset as u32))
                        || allowed.is_some_and(|a| !a.contains(addr))
                    {
                        continue;
                    }
                    rows += 1;
                    let i = offset as usize;
                    let key = if vectors.valid[i] && dim == q.len() {
                        metric_key(metric, q, &vectors.values[i * dim..(i + 1) * dim])
                            .unwrap_or(f32::INFINITY)
                    } else {
                        f32::INFINITY
                    };
                    top.push(Candidate { key, addr });
                }
                (top, rows)
            };
            // Large fragments are scored on every core.
            let n = fragment.physical_rows;
            let threads = if n >= PARALLEL_SCORING_ROWS {
                std::thread::available_parallelism().map_or(1, |p| p.get())
            } else {
                1
            };
            let chunk = n.div_ceil(threads as u64).max(1);
            let parts: Vec<(TopK, usize)> = if threads > 1 {
                std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..n)
                        .step_by(chunk as usize)
                        .map(|start| {
                            let score = &score;
                            scope.spawn(move || score(start..(start + chunk).min(n)))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("scoring thread"))
                        .collect()
                })
            } else {
                vec![score(0..n)]
            };
            for (part, scored) in parts {
                rows += scored;
                for c in part.into_sorted() {
                    top.push(c);
                }
            }
        }
        self.counters.rows_scored.add(rows);
        Ok(top.into_sorted())
    }

    fn score_column(&self, vectors: &ArrayRef, addrs: &[u64], sink: &mut dyn FnMut(Candidate)) {
        let list = vectors.as_fixed_size_list();
        let dim = list.value_length() as usize;
        let values = list.values().as_primitive::<Float32Type>().values();
        for (i, addr) in addrs.iter().enumerate() {
            let key = if list.is_null(i) || dim != self.query.vector.len() {
                f32::INFINITY
            } else {
                metric_key(
                    self.query.metric,
                    &self.query.vector,
                    &values[i * dim..(i + 1) * dim],
                )
                .unwrap_or(f32::INFINITY)
            };
            sink(Candidate { key, addr: *addr });
        }
    }

    /// The whole vector column of a fragment, decoded once per session (the cache's budget
    /// decides whether it stays).
    async fn fragment_vectors(&self, fragment: &Fragment) -> Result<Arc<ColumnVectors>> {
        let dir = &self.snapshot().dir;
        let column = self.query.column.as_str();
        let field = self.snapshot().schema.field_with_name(column)?.clone();
        let schema = Arc::new(Schema::new(vec![field]));
        let file = fragment.file_for_column(column).ok_or_else(|| {
            DataFusionError::Internal(format!("fragment {} has no file for {column}", fragment.id))
        })?;
        let key = format!("{}/{}:{column}", dir.name(), file.path);
        Ok(self
            .cache
            .vectors(&key, || {
                load_vectors(dir.clone(), fragment.clone(), schema.clone())
            })
            .await?)
    }

    /// Exact keys of the given rows: from the fragment's cached vector column when it is
    /// small enough to keep, else by reading only those rows' vectors.
    async fn score_addresses(&self, addrs: &[u64]) -> Result<Vec<Candidate>> {
        let q = &self.query.vector;
        let worth_caching = |f: &Fragment| {
            (f.physical_rows as usize).saturating_mul(q.len() * 4) <= self.cache.budget() / 4
        };
        if self
            .by_fragment(addrs)?
            .iter()
            .all(|(f, _)| worth_caching(f))
        {
            let mut out = Vec::with_capacity(addrs.len());
            for (fragment, offsets) in self.by_fragment(addrs)? {
                let vectors = self.fragment_vectors(fragment).await?;
                let dim = vectors.dim;
                for o in offsets {
                    let i = o as usize;
                    if i >= vectors.valid.len() {
                        return Err(DataFusionError::Execution(format!(
                            "row {o} is past the end of fragment {}: a corrupt index?",
                            fragment.id
                        )));
                    }
                    let key = if vectors.valid[i] && dim == q.len() {
                        metric_key(
                            self.query.metric,
                            q,
                            &vectors.values[i * dim..(i + 1) * dim],
                        )
                        .unwrap_or(f32::INFINITY)
                    } else {
                        f32::INFINITY
                    };
                    out.push(Candidate {
                        key,
                        addr: row_address(fragment.id, o),
                    });
                }
            }
            self.counters.rows_scored.add(out.len());
            return Ok(out);
        }
        let field = self
            .snapshot()
            .schema
            .field_with_name(&self.query.column)?
            .clone();
        let schema = Arc::new(Schema::new(vec![field]));
        let mut out = Vec::with_capacity(addrs.len());
        for (fragment, offsets, batch) in self.read_rows(addrs, schema).await? {
            let addrs: Vec<u64> = offsets
                .iter()
                .map(|o| row_address(fragment.id, *o))
                .collect();
            self.score_column(batch.column(0), &addrs, &mut |c| out.push(c));
        }
        self.counters.rows_scored.add(out.len());
        Ok(out)
    }

    /// Reads `schema`'s columns of the rows at `addrs`: (fragment, offsets, batch) triples,
    /// the offsets being those of the batch's rows.
    async fn read_rows(
        &self,
        addrs: &[u64],
        schema: SchemaRef,
    ) -> Result<Vec<(&Fragment, Vec<u64>, RecordBatch)>> {
        let mut out = Vec::new();
        for (fragment, offsets) in self.by_fragment(addrs)? {
            self.counters.fragments_read.add(1);
            // Small fixed-width columns come from whole decoded columns kept in the session's
            // cache; the others are read page by page.
            let cached: Vec<bool> = schema
                .fields()
                .iter()
                .map(|f| self.column_is_cacheable(f.data_type(), fragment.physical_rows))
                .collect();
            let direct = Arc::new(Schema::new(
                schema
                    .fields()
                    .iter()
                    .zip(&cached)
                    .filter(|(_, c)| !**c)
                    .map(|(f, _)| f.as_ref().clone())
                    .collect::<Vec<_>>(),
            ));
            let mut direct_columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); direct.fields().len()];
            if !direct.fields().is_empty() {
                let dir = self.snapshot().dir.clone();
                let mut stream = read_fragment_rows(dir, fragment, direct.clone(), &offsets);
                while let Some(batch) = stream.next().await {
                    let batch = batch.map_err(DataFusionError::from)?;
                    for (i, c) in batch.columns().iter().enumerate() {
                        direct_columns[i].push(c.clone());
                    }
                }
            }
            if let Some(bad) = offsets.iter().find(|o| **o >= fragment.physical_rows) {
                return Err(DataFusionError::Execution(format!(
                    "row {bad} is past the end of fragment {} ({} rows): a corrupt index?",
                    fragment.id, fragment.physical_rows
                )));
            }
            let indices = UInt64Array::from(offsets.clone());
            let mut columns = Vec::with_capacity(schema.fields().len());
            let mut next_direct = 0;
            for (field, cached) in schema.fields().iter().zip(&cached) {
                if *cached {
                    let whole = self.whole_column(fragment, field).await?;
                    columns.push(datafusion::arrow::compute::take(&whole, &indices, None)?);
                } else {
                    let parts: Vec<&dyn Array> = direct_columns[next_direct]
                        .iter()
                        .map(|a| a.as_ref())
                        .collect();
                    columns.push(datafusion::arrow::compute::concat(&parts)?);
                    next_direct += 1;
                }
            }
            let batch = RecordBatch::try_new_with_options(
                schema.clone(),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(offsets.len())),
            )?;
            out.push((fragment, offsets, batch));
        }
        Ok(out)
    }

    /// Fixed-width columns whose decoded size is a small share of the cache budget.
    fn column_is_cacheable(&self, data_type: &DataType, rows: u64) -> bool {
        data_type
            .primitive_width()
            .is_some_and(|w| (w as u64).saturating_mul(rows) <= (self.cache.budget() / 16) as u64)
    }

    /// Every physical row of one column of a fragment, decoded once per session.
    async fn whole_column(&self, fragment: &Fragment, field: &Field) -> Result<ArrayRef> {
        let dir = self.snapshot().dir.clone();
        let file = fragment.file_for_column(field.name()).ok_or_else(|| {
            DataFusionError::Internal(format!(
                "fragment {} has no file for {}",
                fragment.id,
                field.name()
            ))
        })?;
        let key = format!("{}/{}:{}", dir.name(), file.path, field.name());
        let schema = Arc::new(Schema::new(vec![field.clone()]));
        let fragment = fragment.clone();
        Ok(self
            .cache
            .column(&key, || async move {
                let mut parts = Vec::new();
                let mut stream = read_fragment(dir, &fragment, schema.clone(), 65536);
                while let Some(batch) = stream.next().await {
                    parts.push(batch?.column(0).clone());
                }
                let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                let whole = if refs.is_empty() {
                    datafusion::arrow::array::new_empty_array(schema.field(0).data_type())
                } else {
                    datafusion::arrow::compute::concat(&refs)?
                };
                if whole.len() as u64 != fragment.physical_rows {
                    return Err(crate::format::FormatError::corrupt(
                        format!("fragment {}", fragment.id),
                        "column row count differs from the fragment's",
                    ));
                }
                Ok(whole)
            })
            .await?)
    }

    /// Groups addresses by fragment (in manifest order), offsets sorted.
    fn by_fragment<'a>(&'a self, addrs: &[u64]) -> Result<Vec<(&'a Fragment, Vec<u64>)>> {
        let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for a in addrs {
            let (frag, offset) = split_row_address(*a);
            groups.entry(frag).or_default().push(offset);
        }
        let mut out = Vec::with_capacity(groups.len());
        for fragment in &self.snapshot().manifest.fragments {
            if let Some(mut offsets) = groups.remove(&fragment.id) {
                offsets.sort_unstable();
                offsets.dedup();
                out.push((fragment, offsets));
            }
        }
        if let Some(id) = groups.keys().next() {
            return Err(DataFusionError::Internal(format!(
                "KNN candidate in fragment {id}, not in the table"
            )));
        }
        Ok(out)
    }

    /// Index search plus brute force over fragments no segment owns.
    /// Returns the candidates and, for IVF_FLAT, the vectors of those found in segments.
    async fn indexed(&self, index: &IndexDef) -> Result<(Vec<Candidate>, HashMap<u64, Vec<f32>>)> {
        let allowed = self.allowed.as_ref();
        let snapshot = self.snapshot();
        let manifest = &snapshot.manifest;
        let dir = &snapshot.dir;
        let k = self.query.k;
        let model = self.cache.model(dir, index).await?;
        if model.dim != self.query.vector.len() {
            return Err(DataFusionError::Execution(format!(
                "query vector has {} dimensions, column '{}' has {}",
                self.query.vector.len(),
                self.query.column,
                model.dim
            )));
        }
        let Some(prepared) = model.prepare(&self.query.vector) else {
            // A zero query vector under cosine has no nearest rows; every distance is NULL.
            return Ok((
                self.brute_force(&manifest.fragments, &HashMap::new())
                    .await?,
                HashMap::new(),
            ));
        };
        let current: HashSet<u64> = manifest.fragments.iter().map(|f| f.id).collect();
        let deletions = &self.deletions;
        let pq_width = model.pq.as_ref().map(|pq| pq.sub_vectors);
        let table = model
            .pq
            .as_ref()
            .map(|pq| pq.distance_table(&prepared, self.query.metric));
        let keep = if pq_width.is_some() {
            k * self.refine_factor
        } else {
            k
        };
        let probe_order = model.probe_order(&prepared);
        let mut global = TopK::new(keep);
        // Ownership in current fragment ids: rewrites recorded in the ledger moved rows of
        // the segments' fragments, and ownership follows them.
        let view = self.cache.ledger(dir, manifest).await?;
        let owners = self
            .cache
            .ownerships(dir, manifest, &view, &index.name)
            .await?;
        let mut owned_anywhere: HashSet<u64> = HashSet::new();
        let mut covered_rows: HashMap<u64, RoaringBitmap> = HashMap::new();
        let mut vectors: HashMap<u64, Vec<f32>> = HashMap::new();
        for segment in manifest.segments_of(&index.name) {
            self.counters.segments_searched.add(1);
            let ownership = &owners[&segment.id];
            for (f, coverage) in &ownership.fragments {
                match coverage {
                    Coverage::Whole => {
                        owned_anywhere.insert(*f);
                    }
                    Coverage::Rows(rows) => *covered_rows.entry(*f).or_default() |= rows,
                }
            }
            // Translated partitions hold only rows the segment owns, at current addresses.
            let translated = segment.fragment_bitmap.iter().any(|f| view.consumes(*f));
            let fast = allowed.is_none()
                && ownership
                    .fragments
                    .keys()
                    .all(|f| !deletions.contains_key(f))
                && (translated
                    || (segment.invalidated_fragments.is_empty()
                        && segment.fragment_bitmap.iter().all(|f| current.contains(f))));
            let mask = (!fast).then(|| RowMask {
                owned: ownership.fragments.keys().copied().collect(),
                deletions: Some(deletions),
                allowed,
            });
            if ownership.fragments.is_empty() {
                continue;
            }
            let footer = self.cache.segment_footer(dir, segment, &model).await?;
            let mut top = TopK::new(keep);
            let mut stats = SearchStats::default();
            let mut probed_parts = Vec::new();
            for (probed, &p) in probe_order.iter().enumerate() {
                if probed >= self.nprobes && top.is_full() {
                    break;
                }
                let part = if translated {
                    self.cache
                        .translated_partition(
                            dir,
                            segment,
                            &footer,
                            p,
                            pq_width.is_some(),
                            Translation {
                                view: &view,
                                ownership,
                            },
                        )
                        .await?
                } else {
                    self.cache
                        .partition(dir, &segment.file, &footer, p, pq_width.is_some())
                        .await?
                };
                probed_parts.push(part.clone());
                match (&table, pq_width) {
                    (Some(t), Some(w)) => {
                        score_pq(&part, w, t, mask.as_ref(), &mut top, &mut stats)
                    }
                    _ => score_flat(
                        &part,
                        model.dim,
                        &self.query.vector,
                        self.query.metric,
                        mask.as_ref(),
                        &mut top,
                        &mut stats,
                    ),
                }
            }
            self.counters.record(&stats);
            let local = top.into_sorted();
            if pq_width.is_none() {
                // These rows passed this segment's mask, so its vectors are their current
                // values: keep them, and the rows need not be read from Parquet again.
                let wanted: HashSet<u64> = local.iter().map(|c| c.addr).collect();
                for part in &probed_parts {
                    for (i, addr) in part.addrs.iter().enumerate() {
                        if wanted.contains(addr) {
                            let v = &part.vectors[i * model.dim..(i + 1) * model.dim];
                            vectors.insert(*addr, v.to_vec());
                        }
                    }
                }
            }
            for c in local {
                global.push(c);
            }
        }
        let mut candidates = global.into_sorted();
        if pq_width.is_some() {
            // Re-rank the PQ candidates with exact distances of their current vectors.
            let addrs: Vec<u64> = candidates.iter().map(|c| c.addr).collect();
            let mut top = TopK::new(k);
            for c in self.score_addresses(&addrs).await? {
                top.push(c);
            }
            candidates = top.into_sorted();
        }
        let unindexed: Vec<Fragment> = manifest
            .fragments
            .iter()
            .filter(|f| !owned_anywhere.contains(&f.id))
            .cloned()
            .collect();
        if !unindexed.is_empty() {
            self.counters.unindexed_rows.add(
                unindexed
                    .iter()
                    .map(|f| {
                        let covered = covered_rows.get(&f.id).map_or(0, |r| r.len());
                        f.live_rows().saturating_sub(covered) as usize
                    })
                    .sum(),
            );
            let mut top = TopK::new(k);
            for c in candidates
                .into_iter()
                .chain(self.brute_force(&unindexed, &covered_rows).await?)
            {
                top.push(c);
            }
            candidates = top.into_sorted();
        }
        // Rows whose distance is undefined (zero vectors under cosine) rank after all others;
        // only keep them if there is room, exactly like `NULLS LAST`.
        candidates.truncate(k);
        Ok((candidates, vectors))
    }

    /// Reads the output columns of the chosen rows.
    /// `vectors` holds the current vectors of candidates found in IVF_FLAT segments; when it
    /// has every candidate, the vector column is not read from Parquet.
    async fn fetch_rows(
        &self,
        candidates: &[Candidate],
        vectors: &HashMap<u64, Vec<f32>>,
    ) -> Result<RecordBatch> {
        let addrs: Vec<u64> = candidates.iter().map(|c| c.addr).collect();
        let column = self.query.column.as_str();
        let from_index = addrs.iter().all(|a| vectors.contains_key(a));
        let table_fields: Vec<Field> = self
            .output_schema
            .fields()
            .iter()
            .filter(|f| f.name() != ROW_ADDR && f.name() != ROW_ID)
            .filter(|f| !(from_index && f.name() == column))
            .map(|f| f.as_ref().clone())
            .collect();
        let read_schema = Arc::new(Schema::new(table_fields));
        let mut batches = Vec::new();
        for (fragment, offs, batch) in self.read_rows(&addrs, read_schema).await? {
            let n = batch.num_rows();
            let mut columns = Vec::with_capacity(self.output_schema.fields().len());
            for field in self.output_schema.fields() {
                let column: ArrayRef = match field.name().as_str() {
                    ROW_ADDR => Arc::new(UInt64Array::from_iter_values(
                        offs.iter().map(|o| row_address(fragment.id, *o)),
                    )),
                    ROW_ID => Arc::new(UInt64Array::from_iter_values(offs.iter().map(|o| {
                        match &fragment.row_ids {
                            Some(seq) => {
                                let mut id = Vec::with_capacity(1);
                                seq.extend_slice(*o, 1, &mut id);
                                id[0]
                            }
                            None => row_address(fragment.id, *o),
                        }
                    }))),
                    name if from_index && name == column => {
                        let DataType::FixedSizeList(item, dim) = field.data_type() else {
                            return Err(DataFusionError::Internal(format!(
                                "{name} is not a vector column"
                            )));
                        };
                        let values: Vec<f32> = offs
                            .iter()
                            .flat_map(|o| vectors[&row_address(fragment.id, *o)].iter().copied())
                            .collect();
                        Arc::new(FixedSizeListArray::try_new(
                            item.clone(),
                            *dim,
                            Arc::new(Float32Array::from(values)),
                            None,
                        )?)
                    }
                    name => batch.column_by_name(name).cloned().ok_or_else(|| {
                        DataFusionError::Internal(format!("KNN fetch lacks column {name}"))
                    })?,
                };
                columns.push(column);
            }
            batches.push(RecordBatch::try_new_with_options(
                self.output_schema.clone(),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(n)),
            )?);
        }
        if batches.is_empty() {
            return Ok(RecordBatch::new_empty(self.output_schema.clone()));
        }
        Ok(datafusion::arrow::compute::concat_batches(
            &self.output_schema,
            &batches,
        )?)
    }
}

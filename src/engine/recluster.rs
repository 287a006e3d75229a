//! `RECLUSTER`, `ALTER TABLE ... CLUSTER BY`, and `recluster_information('t' [, 'key'])`.
//!
//! Key expressions are SQL text (stored in the table properties for `CLUSTER BY`), compiled
//! here by DataFusion against the table schema; `ivf_partition(col)` is bound to the model of
//! the vector index on `col`. The rewrite itself lives in [`crate::rewrite::recluster`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result, ScalarValue, plan_datafusion_err, plan_err};
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, ScalarUDF};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;

use super::cluster_udf::IvfPartition;
use super::computed::{ComputedBatch, ComputedTable};
use super::index_ops;
use crate::format::manifest::ROW_ADDR;
use crate::format::{Database, Operation, Snapshot, Transaction, commit};
use crate::index::assigned::assigned_partitions;
use crate::index::cache::IndexCache;
use crate::rewrite::clustering::{self, ClusteringInfo};
use crate::rewrite::recluster::{ReclusterSpec, RowColumns, recluster};

/// Key expressions compiled against the columns they use.
#[derive(Debug, Clone)]
pub struct CompiledExprs {
    /// The expressions, bound to `schema`.
    pub exprs: Vec<Arc<dyn PhysicalExpr>>,
    /// The table columns the expressions read, in table order.
    pub schema: SchemaRef,
}

/// The key is evaluated here, in the engine: the rewrite layer sees only the arrays.
impl RowColumns for CompiledExprs {
    fn input_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn evaluate(
        &self,
        batch: &RecordBatch,
    ) -> std::result::Result<Vec<ArrayRef>, Box<dyn std::error::Error + Send + Sync>> {
        self.exprs
            .iter()
            .map(|e| {
                e.evaluate(batch)
                    .and_then(|v| v.into_array(batch.num_rows()))
                    .map_err(|err| format!("evaluating {e}: {err}").into())
            })
            .collect()
    }
}

/// Compiles SQL expressions over the rows of `snapshot`'s table.
pub async fn compile(
    state: &SessionState,
    snapshot: &Snapshot,
    texts: &[String],
    cache: &IndexCache,
) -> Result<CompiledExprs> {
    let full = DFSchema::try_from(snapshot.schema.as_ref().clone())?;
    let mut exprs = texts
        .iter()
        .map(|t| state.create_logical_expr(t, &full))
        .collect::<Result<Vec<Expr>>>()?;
    // ivf_partition(col) needs the model of the index on col.
    let mut wanted = BTreeSet::new();
    for e in &exprs {
        e.apply(|node| {
            if let Expr::ScalarFunction(f) = node
                && f.func.name() == "ivf_partition"
            {
                match f.args.as_slice() {
                    [Expr::Column(c)] => {
                        wanted.insert(c.name.clone());
                    }
                    _ => {
                        return plan_err!("ivf_partition takes one vector column");
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    let mut models = HashMap::new();
    for column in wanted {
        let udf = bound_ivf_partition(snapshot, &column, cache).await?;
        models.insert(column, udf);
    }
    if !models.is_empty() {
        exprs = exprs
            .into_iter()
            .map(|e| {
                e.transform(|node| match &node {
                    Expr::ScalarFunction(f) if f.func.name() == "ivf_partition" => {
                        let Expr::Column(c) = &f.args[0] else {
                            return Ok(Transformed::no(node));
                        };
                        let udf = models[&c.name].clone();
                        let addr = Expr::Column(datafusion::common::Column::from_name(ROW_ADDR));
                        Ok(Transformed::yes(Expr::ScalarFunction(
                            ScalarFunction::new_udf(udf, vec![f.args[0].clone(), addr]),
                        )))
                    }
                    _ => Ok(Transformed::no(node)),
                })
                .map(|t| t.data)
            })
            .collect::<Result<_>>()?;
    }
    let used: BTreeSet<String> = exprs
        .iter()
        .flat_map(|e| e.column_refs().into_iter().map(|c| c.name.clone()))
        .collect();
    let mut fields: Vec<Field> = snapshot
        .schema
        .fields()
        .iter()
        .filter(|f| used.contains(f.name()))
        .map(|f| f.as_ref().clone())
        .collect();
    if used.contains(ROW_ADDR) {
        fields.push(Field::new(ROW_ADDR, DataType::UInt64, false));
    }
    let schema = Arc::new(Schema::new(fields));
    let projected = DFSchema::try_from(schema.as_ref().clone())?;
    let exprs = exprs
        .into_iter()
        .map(|e| state.create_physical_expr(e, &projected))
        .collect::<Result<_>>()?;
    Ok(CompiledExprs { exprs, schema })
}

/// `ivf_partition` bound to the vector index on `column` of `snapshot`, called as
/// `ivf_partition(column, _rowaddr)`: rows the index holds get the partition it assigned them.
pub async fn bound_ivf_partition(
    snapshot: &Snapshot,
    column: &str,
    cache: &IndexCache,
) -> Result<Arc<ScalarUDF>> {
    let Some(def) = snapshot
        .manifest
        .indexes
        .iter()
        .find(|i| i.column == column)
    else {
        return plan_err!(
            "ivf_partition({column}): table '{}' has no vector index on {column}",
            snapshot.name()
        );
    };
    let model = cache.model(&snapshot.dir, def).await?;
    let known = Arc::new(assigned_partitions(snapshot, def, &model, cache).await?);
    Ok(Arc::new(ScalarUDF::new_from_impl(IvfPartition::bound(
        model,
        Some(known),
    ))))
}

/// The key a RECLUSTER uses: the one given, else the table's CLUSTER BY key.
fn key_of(snapshot: &Snapshot, given: &[String]) -> Result<Vec<String>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let stored = &snapshot.manifest.properties.cluster_by;
    if stored.is_empty() {
        return plan_err!(
            "RECLUSTER {} needs BY (...) or a key stored with ALTER TABLE {} CLUSTER BY (...)",
            snapshot.name(),
            snapshot.name()
        );
    }
    Ok(stored.clone())
}

/// Runs one RECLUSTER on the latest version; the caller retries on conflicts.
pub async fn run_recluster(
    state: &SessionState,
    snapshot: &Snapshot,
    keys: &[String],
    options: &[(String, String)],
    filter: Option<&str>,
    cache: &IndexCache,
) -> Result<RecordBatch> {
    let keys = key_of(snapshot, keys)?;
    let compiled = compile(state, snapshot, &keys, cache).await?;
    let filter = match filter {
        None => None,
        Some(text) => Some(
            Arc::new(compile(state, snapshot, &[text.to_string()], cache).await?)
                as Arc<dyn RowColumns>,
        ),
    };
    let mut spec = ReclusterSpec {
        keys: Arc::new(compiled),
        filter,
        destinations: None,
        target_rows_per_fragment: snapshot.manifest.properties.max_rows_per_fragment,
    };
    for (key, value) in options {
        let n: u64 = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
            plan_datafusion_err!("RECLUSTER option {key} must be a positive integer, got '{value}'")
        })?;
        match key.as_str() {
            "target_rows_per_fragment" => spec.target_rows_per_fragment = n,
            "destinations" => spec.destinations = Some(n as usize),
            other => {
                return plan_err!(
                    "unknown RECLUSTER option '{other}' (expected target_rows_per_fragment or \
                     destinations)"
                );
            }
        }
    }
    let progress = super::options::progress_of(state.config());
    let (_, m) = recluster(snapshot, &spec, &progress).await?;
    super::maintenance::u64_row(
        &RECLUSTER_COLUMNS,
        &[
            m.rows_rewritten,
            m.destinations,
            m.row_map_bytes,
            m.fragments_removed,
            m.version,
        ],
    )
}

/// The columns of `RECLUSTER`'s one-row report.
pub const RECLUSTER_COLUMNS: [&str; 5] = [
    "rows_rewritten",
    "destinations",
    "row_map_bytes",
    "fragments_removed",
    "version",
];

/// `ALTER TABLE t CLUSTER BY (...)` (`keys` empty: drop the key). Checks the key compiles.
pub async fn set_cluster_key(
    state: &SessionState,
    snapshot: &Snapshot,
    keys: Vec<String>,
    cache: &IndexCache,
) -> Result<()> {
    if !keys.is_empty() {
        compile(state, snapshot, &keys, cache).await?;
    }
    let mut txn = Transaction::new(Operation::AlterTable, snapshot.version());
    txn.cluster_by = Some(keys);
    commit(&snapshot.dir, &snapshot.manifest, &txn).await?;
    Ok(())
}

/// How well `snapshot` is clustered by `keys` (SQL expressions), see
/// [`crate::rewrite::clustering`].
pub async fn clustering_info(
    state: &SessionState,
    snapshot: &Snapshot,
    keys: &[String],
    cache: &IndexCache,
) -> Result<ClusteringInfo> {
    let compiled = compile(state, snapshot, keys, cache).await?;
    Ok(clustering::clustering_info(snapshot, &compiled).await?)
}

/// The `recluster_information('t' [, 'key, ...'])` table function.
#[derive(Debug)]
pub struct ReclusterInformation {
    /// The database whose tables it reports on.
    pub db: Database,
}

impl TableFunctionImpl for ReclusterInformation {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let text = |e: &Expr| match e {
            Expr::Literal(ScalarValue::Utf8(Some(t)) | ScalarValue::Utf8View(Some(t)), _) => {
                Some(t.clone())
            }
            _ => None,
        };
        let (table, key) = match args.exprs() {
            [t] => (text(t), None),
            [t, k] => (text(t), Some(text(k))),
            _ => (None, None),
        };
        let (Some(table), key) = (table, key) else {
            return plan_err!(
                "recluster_information('table' [, 'key expression, ...']) takes strings"
            );
        };
        let Some(key) = key.map_or(Some(None), |k| k.map(Some)) else {
            return plan_err!("recluster_information: the key must be a string");
        };
        self.db.table(&table)?;
        Ok(Arc::new(ComputedTable(InfoTable {
            db: self.db.clone(),
            table,
            key,
        })))
    }
}

#[derive(Debug)]
struct InfoTable {
    db: Database,
    table: String,
    key: Option<String>,
}

fn info_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("fragments", DataType::UInt64, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("key", DataType::Utf8, false),
        Field::new("average_overlaps", DataType::Float64, false),
        Field::new("average_depth", DataType::Float64, false),
        Field::new("max_depth", DataType::UInt64, false),
    ]))
}

#[async_trait]
impl ComputedBatch for InfoTable {
    fn schema(&self) -> SchemaRef {
        info_schema()
    }

    async fn compute(&self) -> Result<RecordBatch> {
        let snapshot = index_ops::latest(&self.db, &self.table).await?;
        let keys = match &self.key {
            Some(k) => vec![k.clone()],
            None => key_of(&snapshot, &[])?,
        };
        // A private context with fragvec's functions compiles the key.
        let ctx = SessionContext::new();
        super::udf::register(&ctx);
        super::cluster_udf::register(&ctx);
        let cache = IndexCache::new(0);
        let info = clustering_info(&ctx.state(), &snapshot, &keys, &cache).await?;
        Ok(RecordBatch::try_new(
            info_schema(),
            vec![
                Arc::new(UInt64Array::from(vec![info.fragments])),
                Arc::new(UInt64Array::from(vec![info.rows])),
                Arc::new(StringArray::from(vec![keys.join(", ")])),
                Arc::new(Float64Array::from(vec![info.average_overlaps])),
                Arc::new(Float64Array::from(vec![info.average_depth])),
                Arc::new(UInt64Array::from(vec![info.max_depth])),
            ],
        )?)
    }
}

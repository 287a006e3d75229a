//! Introspection table functions: `fragvec_fragments('t')`, `fragvec_versions('t')`,
//! `fragvec_indexes('t')`, `fragvec_segments('t')` and `fragvec_ledger('t')`.
//!
//! Table functions are called synchronously while a query is planned, so they return a
//! provider with a fixed schema and do their reading when the query is executed.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;

use super::computed::{ComputedBatch, ComputedTable};
use crate::format::{Database, FormatError, Manifest};
use crate::index::cache::IndexCache;
use crate::index::ivf::is_oversized;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fragments,
    Versions,
    Indexes,
    Segments,
    Ledger,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fragments => "fragvec_fragments",
            Kind::Versions => "fragvec_versions",
            Kind::Indexes => "fragvec_indexes",
            Kind::Segments => "fragvec_segments",
            Kind::Ledger => "fragvec_ledger",
        }
    }

    fn schema(self) -> SchemaRef {
        let u64 = |n: &str| Field::new(n, DataType::UInt64, false);
        Arc::new(Schema::new(match self {
            Kind::Fragments => vec![
                u64("position"),
                u64("id"),
                u64("physical_rows"),
                u64("deleted_rows"),
                Field::new("files", DataType::Utf8, false),
                Field::new("deletion_file", DataType::Utf8, true),
            ],
            Kind::Versions => vec![
                u64("version"),
                Field::new("operation", DataType::Utf8, false),
                Field::new(
                    "timestamp",
                    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                    false,
                ),
                u64("read_version"),
                u64("fragments"),
                u64("rows"),
            ],
            Kind::Indexes => vec![
                Field::new("name", DataType::Utf8, false),
                Field::new("column", DataType::Utf8, false),
                Field::new("type", DataType::Utf8, false),
                Field::new("metric", DataType::Utf8, false),
                u64("num_partitions"),
                u64("segments"),
                u64("rows"),
                u64("unindexed_fragments"),
                u64("created_at_version"),
                u64("largest_partition_rows"),
                Field::new("needs_split", DataType::Boolean, false),
            ],
            Kind::Ledger => vec![
                u64("transition_id"),
                Field::new("kind", DataType::Utf8, false),
                Field::new("sources", DataType::Utf8, false),
                Field::new("destinations", DataType::Utf8, false),
                u64("rows_moved"),
                u64("source_version"),
                u64("committed_version"),
            ],
            Kind::Segments => vec![
                Field::new("index", DataType::Utf8, false),
                u64("segment_id"),
                Field::new("metric", DataType::Utf8, false),
                u64("rows"),
                Field::new("fragment_bitmap", DataType::Utf8, false),
                Field::new("invalidated_fragments", DataType::Utf8, false),
                u64("built_at_version"),
                u64("size_bytes"),
            ],
        }))
    }
}

pub fn register(ctx: &SessionContext, db: &Database) {
    ctx.register_udtf(
        "recluster_information",
        Arc::new(super::recluster::ReclusterInformation { db: db.clone() }),
    );
    for kind in [
        Kind::Fragments,
        Kind::Versions,
        Kind::Indexes,
        Kind::Segments,
        Kind::Ledger,
    ] {
        ctx.register_udtf(
            kind.name(),
            Arc::new(Introspect {
                db: db.clone(),
                kind,
            }),
        );
    }
}

#[derive(Debug)]
struct Introspect {
    db: Database,
    kind: Kind,
}

impl TableFunctionImpl for Introspect {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let table = match args.exprs() {
            [Expr::Literal(ScalarValue::Utf8(Some(t)) | ScalarValue::Utf8View(Some(t)), _)] => {
                t.clone()
            }
            _ => {
                return plan_err!(
                    "{}('table') takes one string argument: the table name",
                    self.kind.name()
                );
            }
        };
        self.db.table(&table)?;
        Ok(Arc::new(ComputedTable(IntrospectTable {
            db: self.db.clone(),
            kind: self.kind,
            table,
        })))
    }
}

#[derive(Debug)]
struct IntrospectTable {
    db: Database,
    kind: Kind,
    table: String,
}

impl IntrospectTable {
    async fn batch(&self) -> Result<RecordBatch> {
        let dir = Arc::new(self.db.table(&self.table)?);
        let columns: Vec<ArrayRef> = match self.kind {
            Kind::Fragments => {
                let m = dir.latest().await?.manifest;
                let f = &m.fragments;
                vec![
                    Arc::new(UInt64Array::from_iter_values(0..f.len() as u64)),
                    Arc::new(UInt64Array::from_iter_values(f.iter().map(|f| f.id))),
                    Arc::new(UInt64Array::from_iter_values(
                        f.iter().map(|f| f.physical_rows),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        f.iter().map(|f| f.deleted_rows()),
                    )),
                    Arc::new(StringArray::from_iter_values(f.iter().map(|f| {
                        f.files
                            .iter()
                            .map(|d| d.path.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    }))),
                    Arc::new(StringArray::from_iter(
                        f.iter()
                            .map(|f| f.deletion.as_ref().map(|d| d.path.clone())),
                    )),
                ]
            }
            Kind::Indexes => {
                let snapshot = dir.latest().await?;
                let m = &snapshot.manifest;
                let i = &m.indexes;
                let segments = |name: &str| m.segments_of(name).count() as u64;
                let rows = |name: &str| m.segments_of(name).map(|s| s.rows).sum::<u64>();
                // Rows per partition across all segments: a partition far above its share
                // makes probes slower and recall worse until a full MERGE splits it.
                let footers = IndexCache::new(0);
                let mut largest = Vec::new();
                let mut split = Vec::new();
                for def in i.iter() {
                    let mut per_partition = vec![0u64; def.num_partitions as usize];
                    for seg in m.segments_of(&def.name) {
                        let footer = footers.footer(&dir, &seg.file, seg.size_bytes).await?;
                        for (p, (_, rows)) in footer.partitions.iter().enumerate() {
                            if let Some(slot) = per_partition.get_mut(p) {
                                *slot += rows;
                            }
                        }
                    }
                    let max = per_partition.iter().copied().max().unwrap_or(0);
                    let total: u64 = per_partition.iter().sum();
                    largest.push(max);
                    split.push(is_oversized(
                        max as usize,
                        total as usize,
                        per_partition.len(),
                    ));
                }
                let mut unowned = std::collections::HashMap::new();
                for d in i {
                    let (_, owners) =
                        crate::index::optimize::ownerships(&snapshot, &d.name, &footers).await?;
                    let n = crate::index::ownership::unowned_fragments(m, &owners).len();
                    unowned.insert(d.name.clone(), n as u64);
                }
                let unindexed = |name: &str| unowned[name];
                vec![
                    Arc::new(StringArray::from_iter_values(
                        i.iter().map(|d| d.name.as_str()),
                    )),
                    Arc::new(StringArray::from_iter_values(
                        i.iter().map(|d| d.column.as_str()),
                    )),
                    Arc::new(StringArray::from_iter_values(
                        i.iter().map(|d| d.kind.name()),
                    )),
                    Arc::new(StringArray::from_iter_values(
                        i.iter().map(|d| d.metric.as_str()),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        i.iter().map(|d| d.num_partitions as u64),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        i.iter().map(|d| segments(&d.name)),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        i.iter().map(|d| rows(&d.name)),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        i.iter().map(|d| unindexed(&d.name)),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        i.iter().map(|d| d.created_at_version),
                    )),
                    Arc::new(UInt64Array::from(largest)),
                    Arc::new(BooleanArray::from(split)),
                ]
            }
            Kind::Segments => {
                let m = dir.latest().await?.manifest;
                let s = &m.index_segments;
                let metric = |name: &str| m.index(name).map_or("", |d| d.metric.as_str());
                let list = |set: &std::collections::BTreeSet<u64>| {
                    set.iter()
                        .map(|f| f.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                vec![
                    Arc::new(StringArray::from_iter_values(
                        s.iter().map(|x| x.index.as_str()),
                    )),
                    Arc::new(UInt64Array::from_iter_values(s.iter().map(|x| x.id))),
                    Arc::new(StringArray::from_iter_values(
                        s.iter().map(|x| metric(&x.index)),
                    )),
                    Arc::new(UInt64Array::from_iter_values(s.iter().map(|x| x.rows))),
                    Arc::new(StringArray::from_iter_values(
                        s.iter().map(|x| list(&x.fragment_bitmap)),
                    )),
                    Arc::new(StringArray::from_iter_values(
                        s.iter().map(|x| list(&x.invalidated_fragments)),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        s.iter().map(|x| x.built_at_version),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        s.iter().map(|x| x.size_bytes),
                    )),
                ]
            }
            Kind::Ledger => {
                let m = dir.latest().await?.manifest;
                let l = &m.reuse_ledger;
                let ids = |d: &[crate::ledger::FragmentDigest]| {
                    d.iter()
                        .map(|f| f.id.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                vec![
                    Arc::new(UInt64Array::from_iter_values(l.iter().map(|t| t.id))),
                    Arc::new(StringArray::from_iter_values(
                        l.iter().map(|t| t.mapping.kind()),
                    )),
                    Arc::new(StringArray::from_iter_values(
                        l.iter().map(|t| ids(&t.sources)),
                    )),
                    Arc::new(StringArray::from_iter_values(
                        l.iter().map(|t| ids(&t.destinations)),
                    )),
                    Arc::new(UInt64Array::from_iter_values(l.iter().map(|t| {
                        t.destinations.iter().map(|d| d.physical_rows).sum::<u64>()
                    }))),
                    Arc::new(UInt64Array::from_iter_values(
                        l.iter().map(|t| t.source_version),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        l.iter().map(|t| t.committed_version),
                    )),
                ]
            }
            Kind::Versions => {
                let versions = dir.versions().await?;
                if versions.is_empty() {
                    return Err(FormatError::NotFound(self.table.clone()).into());
                }
                let mut manifests: Vec<Manifest> = Vec::with_capacity(versions.len());
                for v in versions {
                    manifests.push(dir.load_manifest(v).await?);
                }
                let m = &manifests;
                vec![
                    Arc::new(UInt64Array::from_iter_values(m.iter().map(|m| m.version))),
                    Arc::new(StringArray::from_iter_values(
                        m.iter().map(|m| m.transaction.operation.as_str()),
                    )),
                    Arc::new(
                        TimestampMillisecondArray::from_iter_values(
                            m.iter().map(|m| m.transaction.timestamp_ms),
                        )
                        .with_timezone("UTC"),
                    ),
                    Arc::new(UInt64Array::from_iter_values(
                        m.iter().map(|m| m.transaction.read_version),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        m.iter().map(|m| m.fragments.len() as u64),
                    )),
                    Arc::new(UInt64Array::from_iter_values(
                        m.iter().map(|m| m.live_rows()),
                    )),
                ]
            }
        };
        Ok(RecordBatch::try_new(self.kind.schema(), columns)?)
    }
}

#[async_trait]
impl ComputedBatch for IntrospectTable {
    fn schema(&self) -> SchemaRef {
        self.kind.schema()
    }

    async fn compute(&self) -> Result<RecordBatch> {
        Ok(self.batch().await?)
    }
}

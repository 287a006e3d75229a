//! Introspection of a table's state as Arrow batches: its fragments in logical order, its
//! versions, its index segments and its reuse ledger (what `fragvec_fragments('t')`,
//! `fragvec_versions('t')`, `fragvec_segments('t')` and `fragvec_ledger('t')` return). Index
//! figures that need the index files are in `index::introspect`.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::error::{FormatError, Result};
use super::manifest::Manifest;
use super::store::TableDir;

/// A view of a table's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableView {
    /// `fragvec_fragments('t')`: one row per fragment of the latest version, in logical
    /// (scan) order.
    Fragments,
    /// `fragvec_versions('t')`: one row per version whose manifest is still stored.
    Versions,
    /// `fragvec_segments('t')`: one row per index segment of the latest version.
    Segments,
    /// `fragvec_ledger('t')`: one row per transition of the latest version's reuse ledger.
    Ledger,
}

fn u64_field(n: &str) -> Field {
    Field::new(n, DataType::UInt64, false)
}

impl TableView {
    /// The view's columns.
    pub fn schema(self) -> SchemaRef {
        let u64 = u64_field;
        Arc::new(Schema::new(match self {
            TableView::Fragments => vec![
                u64("position"),
                u64("id"),
                u64("physical_rows"),
                u64("deleted_rows"),
                Field::new("files", DataType::Utf8, false),
                Field::new("deletion_file", DataType::Utf8, true),
            ],
            TableView::Versions => vec![
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
            TableView::Ledger => vec![
                u64("transition_id"),
                Field::new("kind", DataType::Utf8, false),
                Field::new("sources", DataType::Utf8, false),
                Field::new("destinations", DataType::Utf8, false),
                u64("rows_moved"),
                u64("source_version"),
                u64("committed_version"),
            ],
            TableView::Segments => vec![
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

    /// The view of the table in `dir` (its latest version; every version for `Versions`).
    pub async fn batch(self, dir: &Arc<TableDir>) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = match self {
            TableView::Fragments => {
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
            TableView::Segments => {
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
            TableView::Ledger => {
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
            TableView::Versions => {
                let versions = dir.versions().await?;
                if versions.is_empty() {
                    return Err(FormatError::NotFound(dir.name().to_string()));
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
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }
}

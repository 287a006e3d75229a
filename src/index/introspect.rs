//! `fragvec_indexes('t')`: each index of a table with its figures (segments, rows,
//! unindexed fragments and rows, largest partition, imbalance and whether a full MERGE would
//! split it), read from
//! the manifest, the segment footers and the segments' ownership.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::cache::IndexCache;
use super::error::Result;
use super::ivf::is_oversized;
use super::optimize::ownerships;
use super::ownership::unowned_fragments;
use crate::format::Snapshot;

/// The columns of `fragvec_indexes`.
pub fn indexes_schema() -> SchemaRef {
    let u64 = |n: &str| Field::new(n, DataType::UInt64, false);
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("column", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, false),
        Field::new("metric", DataType::Utf8, false),
        u64("num_partitions"),
        u64("segments"),
        u64("rows"),
        u64("unindexed_fragments"),
        u64("unindexed_rows"),
        u64("created_at_version"),
        u64("largest_partition_rows"),
        Field::new("partition_imbalance", DataType::Float64, false),
        Field::new("needs_split", DataType::Boolean, false),
    ]))
}

/// What `fragvec_indexes` and the maintenance planner know about one index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexFigures {
    /// The index's name.
    pub name: String,
    /// How many segments it has.
    pub segments: u64,
    /// Rows its segments hold.
    pub rows: u64,
    /// Ids of the fragments no segment owns.
    pub unindexed_fragments: Vec<u64>,
    /// Live rows of those fragments (what brute force scores).
    pub unindexed_rows: u64,
    /// Rows of its largest partition.
    pub largest_partition_rows: u64,
    /// Whether a full MERGE would split the largest partition.
    pub needs_split: bool,
    /// Largest partition's rows × partitions ÷ rows (1 = even); `None` for an empty index.
    pub imbalance: Option<f64>,
}

/// The figures of every index of `snapshot`'s table, reading segment footers through
/// `cache`.
pub async fn index_figures(snapshot: &Snapshot, cache: &IndexCache) -> Result<Vec<IndexFigures>> {
    let dir = &snapshot.dir;
    let m = &snapshot.manifest;
    let mut out = Vec::new();
    for def in &m.indexes {
        // Rows per partition across all segments: a partition far above its share
        // makes probes slower and recall worse until a full MERGE splits it.
        let mut per_partition = vec![0u64; def.num_partitions as usize];
        for seg in m.segments_of(&def.name) {
            let footer = cache.footer(dir, &seg.file, seg.size_bytes).await?;
            for (p, (_, rows)) in footer.partitions.iter().enumerate() {
                if let Some(slot) = per_partition.get_mut(p) {
                    *slot += rows;
                }
            }
        }
        let max = per_partition.iter().copied().max().unwrap_or(0);
        let total: u64 = per_partition.iter().sum();
        let (_, owners) = ownerships(snapshot, &def.name, cache).await?;
        let unindexed: Vec<u64> = unowned_fragments(m, &owners).into_iter().collect();
        let unindexed_rows = m
            .fragments
            .iter()
            .filter(|f| unindexed.contains(&f.id))
            .map(|f| f.physical_rows.saturating_sub(f.deleted_rows()))
            .sum();
        out.push(IndexFigures {
            name: def.name.clone(),
            segments: m.segments_of(&def.name).count() as u64,
            rows: m.segments_of(&def.name).map(|s| s.rows).sum(),
            unindexed_fragments: unindexed,
            unindexed_rows,
            largest_partition_rows: max,
            needs_split: is_oversized(max as usize, total as usize, per_partition.len()),
            imbalance: (total > 0).then(|| max as f64 * per_partition.len() as f64 / total as f64),
        });
    }
    Ok(out)
}

/// One row per index of `snapshot`'s table.
pub async fn indexes_batch(snapshot: &Snapshot) -> Result<RecordBatch> {
    let i = &snapshot.manifest.indexes;
    let figures = index_figures(snapshot, &IndexCache::new(0)).await?;
    let u64s = |f: &dyn Fn(&IndexFigures) -> u64| {
        Arc::new(UInt64Array::from_iter_values(figures.iter().map(f))) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
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
        u64s(&|f| f.segments),
        u64s(&|f| f.rows),
        u64s(&|f| f.unindexed_fragments.len() as u64),
        u64s(&|f| f.unindexed_rows),
        Arc::new(UInt64Array::from_iter_values(
            i.iter().map(|d| d.created_at_version),
        )),
        u64s(&|f| f.largest_partition_rows),
        Arc::new(Float64Array::from_iter_values(
            figures.iter().map(|f| f.imbalance.unwrap_or(0.0)),
        )),
        Arc::new(BooleanArray::from_iter(
            figures.iter().map(|f| Some(f.needs_split)),
        )),
    ];
    Ok(RecordBatch::try_new(indexes_schema(), columns)?)
}

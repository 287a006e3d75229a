//! `fragvec_indexes('t')`: each index of a table with its figures (segments, rows,
//! unindexed fragments, largest partition and whether a full MERGE would split it), read from
//! the manifest, the segment footers and the segments' ownership.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
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
        u64("created_at_version"),
        u64("largest_partition_rows"),
        Field::new("needs_split", DataType::Boolean, false),
    ]))
}

/// One row per index of `snapshot`'s table.
pub async fn indexes_batch(snapshot: &Snapshot) -> Result<RecordBatch> {
    let dir = &snapshot.dir;
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
            let footer = footers.footer(dir, &seg.file, seg.size_bytes).await?;
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
    let mut unowned = HashMap::new();
    for d in i {
        let (_, owners) = ownerships(snapshot, &d.name, &footers).await?;
        let n = unowned_fragments(m, &owners).len();
        unowned.insert(d.name.clone(), n as u64);
    }
    let unindexed = |name: &str| unowned[name];
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
    ];
    Ok(RecordBatch::try_new(indexes_schema(), columns)?)
}

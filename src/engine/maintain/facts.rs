//! What a maintenance round knows about a table ([`TableFacts`]), read from its latest
//! version: fragments with their index coverage, each index's segments, unindexed rows and
//! partition imbalance, the number of versions, and how long the oldest unindexed rows
//! have waited (the last-modified time of their data file: one HEAD request per index).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use datafusion::common::Result;
use object_store::ObjectStoreExt;

use crate::format::Snapshot;
use crate::format::manifest::now_ms;
use crate::index::cache::IndexCache;
use crate::index::introspect::index_figures;
use crate::maintain::plan::{FragmentFacts, IndexFacts, SegmentFacts, TableFacts};
use crate::rewrite::compact::coverage_keys;

/// When this process last vacuumed each table (by [`TableDir::identity`]: two databases in
/// one process may both have a table `t`): a vacuum lists every file, so the planner runs
/// it at most once every 30 s.
///
/// [`TableDir::identity`]: crate::format::store::TableDir::identity
fn last_vacuums() -> &'static Mutex<HashMap<String, i64>> {
    static LAST: OnceLock<Mutex<HashMap<String, i64>>> = OnceLock::new();
    LAST.get_or_init(Default::default)
}

pub fn vacuumed_now(snapshot: &Snapshot) {
    let key = snapshot.dir.identity();
    last_vacuums()
        .lock()
        .expect("the vacuum clock is never poisoned")
        .insert(key, now_ms());
}

/// Reads the facts of `snapshot`'s table; the versions (a listing) only when `versions`
/// (only the vacuum rule reads them).
pub async fn gather(snapshot: &Snapshot, cache: &IndexCache, versions: bool) -> Result<TableFacts> {
    let m = &snapshot.manifest;
    let coverage = coverage_keys(snapshot).await?;
    let fragments: Vec<FragmentFacts> = m
        .fragments
        .iter()
        .map(|f| FragmentFacts {
            id: f.id,
            physical_rows: f.physical_rows,
            deleted_rows: f.deleted_rows(),
            coverage: coverage[&f.id],
        })
        .collect();
    let physical: u64 = m.fragments.iter().map(|f| f.physical_rows).sum();
    let stored: u64 = m
        .fragments
        .iter()
        .flat_map(|f| f.files.iter().map(|d| d.size_bytes))
        .sum();
    let bytes_per_row = stored.checked_div(physical).unwrap_or(0).max(1);
    let mut indexes = Vec::new();
    for figures in index_figures(snapshot, cache).await? {
        let segments: Vec<SegmentFacts> = m
            .segments_of(&figures.name)
            .map(|s| SegmentFacts {
                id: s.id,
                rows: s.rows,
            })
            .collect();
        let seg_bytes: u64 = m.segments_of(&figures.name).map(|s| s.size_bytes).sum();
        let index_bytes_per_row = seg_bytes
            .checked_div(figures.rows)
            .unwrap_or(bytes_per_row)
            .max(1);
        let oldest = oldest_age_ms(snapshot, &figures.unindexed_fragments).await?;
        indexes.push(IndexFacts {
            name: figures.name,
            segments,
            unindexed_rows: figures.unindexed_rows,
            unindexed_fragments: figures.unindexed_fragments,
            oldest_unindexed_age_ms: oldest,
            imbalance: figures.imbalance,
            bytes_per_row: index_bytes_per_row,
        });
    }
    let key = snapshot.dir.identity();
    let since_last_vacuum_ms = last_vacuums()
        .lock()
        .expect("the vacuum clock is never poisoned")
        .get(&key)
        .map(|t| (now_ms() - t).max(0) as u64);
    Ok(TableFacts {
        fragments,
        indexes,
        versions: if versions {
            snapshot.dir.versions().await?.len() as u64
        } else {
            0
        },
        max_rows_per_fragment: m.properties.max_rows_per_fragment,
        bytes_per_row,
        since_last_vacuum_ms,
    })
}

/// Age of the oldest of `fragments` (the lowest id: ids grow with time), from its first
/// data file's last-modified time; `None` without fragments.
async fn oldest_age_ms(snapshot: &Snapshot, fragments: &[u64]) -> Result<Option<u64>> {
    let Some(first) = fragments.iter().min() else {
        return Ok(None);
    };
    let Some(file) = snapshot
        .manifest
        .fragments
        .iter()
        .find(|f| f.id == *first)
        .and_then(|f| f.files.first())
    else {
        return Ok(None);
    };
    let path = snapshot.dir.path(&file.path);
    let meta = snapshot
        .dir
        .store()
        .head(&path)
        .await
        .map_err(|e| crate::format::FormatError::store(&path, e))?;
    Ok(Some(
        (now_ms() - meta.last_modified.timestamp_millis()).max(0) as u64,
    ))
}

//! Row-map files on object storage: the stable-partition mapping of the reuse ledger.
//!
//! A thin layer over the codec in [`crate::ledger::row_map`]: open reads the tail (one
//! range read, two when the footer is larger than the first guess), validates the footer
//! completely and checks it against the transition that references the file; lookups read
//! the blocks they touch with one coalesced range request and keep them decoded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::error::{FormatError, Result};
use super::store::TableDir;
use crate::ledger::row_map::{BlockLabels, RowMapFooter, block_runs, translate_sorted};
use crate::ledger::{LedgerError, PartitionMap, Transition};

/// Decoded blocks one open row map keeps (about 8 MiB).
const MAX_DECODED_BLOCKS: usize = 64;

/// An opened row-map file: its footer in memory, blocks read on demand.
#[derive(Debug)]
pub struct RowMapFile {
    store: Arc<dyn ObjectStore>,
    path: Path,
    footer: RowMapFooter,
    blocks: Mutex<HashMap<usize, Arc<BlockLabels>>>,
}

impl RowMapFile {
    /// Opens and validates `relative` (of `size` bytes) as the row map of transition `t`.
    pub async fn open(dir: &TableDir, relative: &str, size: u64, t: &Transition) -> Result<Self> {
        let path = dir.path(relative);
        let corrupt = |reason: String| FormatError::corrupt(&path, reason);
        let store = dir.store().clone();
        let get = |range: std::ops::Range<u64>| {
            let (store, path) = (store.clone(), path.clone());
            async move {
                store
                    .get_range(&path, range)
                    .await
                    .map_err(|e| FormatError::store(&path, e))
            }
        };
        let first = RowMapFooter::tail_len_hint().min(size);
        let mut tail = get(size - first..size).await?;
        let needed =
            RowMapFooter::required_tail_len(&tail, size).map_err(|e| corrupt(e.to_string()))?;
        if needed > tail.len() as u64 {
            tail = get(size - needed..size).await?;
        }
        let footer = RowMapFooter::decode(&tail, size).map_err(|e| corrupt(e.to_string()))?;
        let physical: u64 = t.sources.iter().map(|s| s.physical_rows).sum();
        if footer.total_rows() != physical {
            return Err(corrupt(format!(
                "row map has {} source rows, transition {} has {physical}",
                footer.total_rows(),
                t.id
            )));
        }
        if footer.num_destinations() != t.destinations.len() {
            return Err(corrupt(format!(
                "row map has {} destinations, transition {} has {}",
                footer.num_destinations(),
                t.id,
                t.destinations.len()
            )));
        }
        for (d, (total, dest)) in footer.totals().iter().zip(&t.destinations).enumerate() {
            if *total as u64 != dest.physical_rows {
                return Err(corrupt(format!(
                    "row map sends {total} rows to destination {d}, fragment {} has {}",
                    dest.id, dest.physical_rows
                )));
            }
        }
        Ok(Self {
            store: dir.store().clone(),
            path,
            footer,
            blocks: Mutex::new(HashMap::new()),
        })
    }

    /// Drops the decoded blocks held in memory (the next lookups read their blocks again).
    pub fn clear_blocks(&self) {
        self.blocks.lock().expect("row map lock").clear();
    }

    /// The decoded blocks `wanted`: from memory, or read (one coalesced request) and decoded.
    async fn load_blocks(
        &self,
        wanted: &[usize],
    ) -> crate::ledger::Result<HashMap<usize, Arc<BlockLabels>>> {
        let mut found = HashMap::with_capacity(wanted.len());
        let mut missing = Vec::new();
        {
            let blocks = self.blocks.lock().expect("row map lock");
            for b in wanted {
                match blocks.get(b) {
                    Some(block) => {
                        found.insert(*b, block.clone());
                    }
                    None => missing.push(*b),
                }
            }
        }
        if missing.is_empty() {
            return Ok(found);
        }
        let ranges: Vec<_> = missing
            .iter()
            .map(|b| self.footer.block_range(*b))
            .collect();
        let bytes = self
            .store
            .get_ranges(&self.path, &ranges)
            .await
            .map_err(|e| LedgerError::Invalid(format!("reading row map {}: {e}", self.path)))?;
        for (b, data) in missing.iter().zip(bytes) {
            let block =
                self.footer
                    .decode_block(*b, &data)
                    .map_err(|source| LedgerError::RowMapFile {
                        path: self.path.to_string(),
                        source,
                    })?;
            found.insert(*b, Arc::new(block));
        }
        let mut blocks = self.blocks.lock().expect("row map lock");
        // Decoded blocks are ~130 KiB each: keep a bounded working set.
        if blocks.len() + missing.len() > MAX_DECODED_BLOCKS {
            blocks.clear();
        }
        for b in missing {
            blocks.insert(b, found[&b].clone());
        }
        Ok(found)
    }
}

#[async_trait]
impl PartitionMap for RowMapFile {
    async fn lookup(&self, positions: &[u64]) -> crate::ledger::Result<Vec<Option<(u16, u32)>>> {
        let runs = block_runs(self.footer.counts(), positions)?;
        let mut out = Vec::with_capacity(positions.len());
        // In groups of blocks that fit the working set, each group read with one request.
        for group in runs.chunks(MAX_DECODED_BLOCKS) {
            let wanted: Vec<usize> = group.iter().map(|r| r.block).collect();
            let blocks = self.load_blocks(&wanted).await?;
            let (from, to) = (group[0].range.start, group[group.len() - 1].range.end);
            out.extend(translate_sorted(
                self.footer.counts(),
                &positions[from..to],
                |b| blocks.get(&b).map(|x| x.as_ref()),
            )?);
        }
        Ok(out)
    }
}

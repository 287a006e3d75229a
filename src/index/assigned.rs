//! The partition an index assigned to each row it holds: what `ivf_partition(col)` returns
//! for those rows without a nearest-centroid search.
//!
//! Read from the segments' address lists only (8 bytes per row, one coalesced range read per
//! segment; the vectors are not read), translated through the reuse ledger, and limited to
//! rows the segment still owns. Rows no segment owns keep [`UNASSIGNED`].

use bytes::Bytes;
use std::collections::HashMap;

use super::cache::IndexCache;
use super::error::{IndexError, Result};
use super::ivf::IvfModel;
use super::optimize::ownerships;
use super::segment::decode_addrs;
use crate::format::index_meta::IndexDef;
use crate::format::{FormatError, Snapshot};
use crate::ledger::ids::split_row_address;

/// Marks a row the index does not hold (or no longer owns).
pub const UNASSIGNED: u32 = u32::MAX;

/// Per current fragment id, one partition per physical row ([`UNASSIGNED`] where unknown).
pub type AssignedPartitions = HashMap<u64, Vec<u32>>;

/// The partitions index `def` assigned to the rows its segments own in `snapshot`.
pub async fn assigned_partitions(
    snapshot: &Snapshot,
    def: &IndexDef,
    model: &IvfModel,
    cache: &IndexCache,
) -> Result<AssignedPartitions> {
    let (view, owners) = ownerships(snapshot, &def.name, cache).await?;
    let mut known: AssignedPartitions = snapshot
        .manifest
        .fragments
        .iter()
        .map(|f| (f.id, vec![UNASSIGNED; f.physical_rows as usize]))
        .collect();
    for segment in snapshot.manifest.segments_of(&def.name) {
        let footer = cache.segment_footer(&snapshot.dir, segment, model).await?;
        let ranges: Vec<_> = (0..footer.partitions.len())
            .map(|p| footer.addrs_range(p))
            .collect();
        let path = snapshot.dir.path(&segment.file);
        // Empty partitions are not requested: some stores (object_store's InMemory) refuse
        // an empty range.
        let wanted: Vec<_> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        let mut fetched = snapshot
            .dir
            .store()
            .get_ranges(&path, &wanted)
            .await
            .map_err(|e| FormatError::store(&path, e))?
            .into_iter();
        let bytes: Vec<Bytes> = ranges
            .iter()
            .map(|r| match r.is_empty() {
                true => Bytes::new(),
                false => fetched.next().unwrap_or_default(),
            })
            .collect();
        let ownership = &owners[&segment.id];
        for (p, b) in bytes.iter().enumerate() {
            footer
                .verify_addrs(p, b)
                .map_err(|e| FormatError::corrupt(&path, e))?;
            let addrs = decode_addrs(b);
            let moved = view
                .translate(&addrs)
                .await
                .map_err(|e| IndexError::ledger(snapshot.name(), e))?;
            for addr in moved.into_iter().flatten() {
                if !ownership.covers(addr) {
                    continue;
                }
                let (f, o) = split_row_address(addr);
                if let Some(slot) = known.get_mut(&f).and_then(|v| v.get_mut(o as usize)) {
                    *slot = p as u32;
                }
            }
        }
    }
    Ok(known)
}

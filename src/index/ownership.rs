//! Which current rows each segment of an index may answer for.
//!
//! A segment *covers* the fragments its file holds (`fragment_bitmap`, in the fragment ids
//! it was written with) and *owns* `fragment_bitmap − invalidated_fragments`, carried through
//! the reuse ledger's transitions into current fragment ids (wholly, or as row bitmaps
//! through a stable partition; see [`crate::ledger::ownership`]) and limited to fragments
//! still in the table. Only ownership may be used to answer a query, and it is applied to
//! every row before a segment's local top-k. Ownerships of one index's segments never
//! overlap; fragments no segment owns any row of are *unowned* and scored by brute force.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::error::{IndexError, Result};
use crate::format::{Manifest, TableDir};
use crate::ledger::{LedgerView, SegmentOwnership};

/// Each segment (by id) of `index`, with its ownership in the manifest's current fragment ids.
pub async fn segment_ownerships(
    dir: &TableDir,
    manifest: &Manifest,
    view: &LedgerView,
    index: &str,
) -> Result<BTreeMap<u64, SegmentOwnership>> {
    let current: HashSet<u64> = manifest.fragments.iter().map(|f| f.id).collect();
    let mut out = BTreeMap::new();
    for segment in manifest.segments_of(index) {
        let owned = segment.ownership();
        let ownership = view
            .ownership(&owned, &segment.invalidated_fragments, &current)
            .await
            .map_err(|e| IndexError::ledger(dir.name(), e))?;
        out.insert(segment.id, ownership);
    }
    Ok(out)
}

/// Fragments of the table (in manifest order) that no segment owns any row of.
pub fn unowned_fragments(
    manifest: &Manifest,
    owners: &BTreeMap<u64, SegmentOwnership>,
) -> BTreeSet<u64> {
    manifest
        .fragments
        .iter()
        .map(|f| f.id)
        .filter(|f| !owners.values().any(|o| o.owns_fragment(*f)))
        .collect()
}

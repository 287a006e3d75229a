//! Loading the reuse ledger: the files its mappings reference, read and checked.

use std::sync::Arc;

use super::deletion;
use super::error::{FormatError, Result};
use super::integrity;
use super::manifest::Manifest;
use super::store::TableDir;
use crate::ledger::{LedgerView, LoadedMapping, LoadedTransition, Mapping, OrderedRemap};

/// Identifies a ledger by content (transitions with their digests and file names, which are
/// random): equal keys, equal translations, even across a table dropped and created again.
pub fn ledger_key(manifest: &Manifest) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    manifest.reuse_ledger.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Reads what the ledger's mappings need and validates it as a whole.
pub async fn load_ledger(dir: &TableDir, manifest: &Manifest) -> Result<LedgerView> {
    let mut loaded = Vec::with_capacity(manifest.reuse_ledger.len());
    for t in &manifest.reuse_ledger {
        let mapping = match &t.mapping {
            Mapping::OrderedCompaction {
                removed,
                removed_crc32c,
            } => {
                let mut bitmaps = Vec::with_capacity(removed.len());
                for (i, (source, file)) in t.sources.iter().zip(removed).enumerate() {
                    bitmaps.push(match file {
                        None => roaring::RoaringBitmap::new(),
                        Some(path) => {
                            let bytes = dir.read(path).await?;
                            if let Some(Some(crc)) = removed_crc32c.get(i) {
                                integrity::check(dir.path(path), "deletion file", &bytes, *crc)?;
                            }
                            deletion::decode(
                                &bytes,
                                dir.path(path).as_ref(),
                                source.id,
                                source.physical_rows,
                                source.deleted_rows,
                            )?
                        }
                    });
                }
                LoadedMapping::Ordered(
                    OrderedRemap::new(t, bitmaps)
                        .map_err(|e| FormatError::ledger(dir.name(), e))?,
                )
            }
            Mapping::StablePartition {
                row_map,
                size_bytes,
            } => LoadedMapping::Partition(Arc::new(
                super::row_map_file::RowMapFile::open(dir, row_map, *size_bytes, t).await?,
            )),
        };
        loaded.push(LoadedTransition {
            transition: t.clone(),
            mapping,
        });
    }
    LedgerView::new(loaded).map_err(|e| FormatError::ledger(dir.name(), e))
}

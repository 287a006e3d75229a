//! VACUUM: removing files no retained version references.
//!
//! The retained versions are the newest `retain` ones (all of them by default) plus every
//! version committed within a grace period (a writer in progress may have read it and still
//! need its files, e.g. the deletion vectors it merges with). A file is removed when no
//! retained manifest references it (data files, deletion files, index models and segments,
//! and the files ledger transitions need: removed-row deletion vectors and row maps) and it is
//! older than the grace period (a writer may have written it and not committed yet), so the
//! grace period must exceed the longest write. Manifests of dropped versions go too (time
//! travel to them ends). The latest version is always kept, and ledger entries no segment
//! needs were already dropped at commit time.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;

use super::error::{FormatError, Result};
use super::manifest::Manifest;
use super::store::TableDir;

/// Default grace period: files and versions younger than this may matter to a commit in
/// progress (session option `fragvec.vacuum_grace_seconds`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(15 * 60);

/// What VACUUM removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VacuumMetrics {
    pub versions_removed: u64,
    pub files_removed: u64,
    pub bytes_removed: u64,
}

/// Every file a manifest needs, as paths relative to the table root.
pub fn referenced_files(m: &Manifest) -> HashSet<String> {
    let mut files = HashSet::new();
    for f in &m.fragments {
        files.extend(f.files.iter().map(|d| d.path.clone()));
        files.extend(f.deletion.iter().map(|d| d.path.clone()));
    }
    files.extend(m.indexes.iter().map(|i| i.model_file.clone()));
    files.extend(m.index_segments.iter().map(|s| s.file.clone()));
    for t in &m.reuse_ledger {
        files.extend(t.mapping.files().into_iter().map(str::to_string));
    }
    files
}

/// Removes what the newest `retain` versions do not need (`None`: keep every version).
/// `grace`: unreferenced files younger than this are kept.
pub async fn vacuum(dir: &TableDir, retain: Option<u64>, grace: Duration) -> Result<VacuumMetrics> {
    let versions = dir.versions().await?;
    if versions.is_empty() {
        return Err(FormatError::NotFound(dir.name().to_string()));
    }
    let mut keep_from = match retain {
        Some(n) => versions.len().saturating_sub(n.max(1) as usize),
        None => 0,
    };
    let cutoff_ms = super::manifest::now_ms() - grace.as_millis() as i64;
    // Versions committed within the grace period stay, whatever `retain` says.
    while keep_from > 0 {
        match dir.load_manifest(versions[keep_from - 1]).await {
            Ok(m) if m.transaction.timestamp_ms >= cutoff_ms => keep_from -= 1,
            _ => break,
        }
    }
    let mut keep = HashSet::new();
    for v in &versions[keep_from..] {
        keep.extend(referenced_files(&dir.load_manifest(*v).await?));
    }
    let mut metrics = VacuumMetrics::default();
    let root = dir.path("");
    let objects: Vec<_> = dir
        .store()
        .list(Some(&root))
        .try_collect()
        .await
        .map_err(|e| FormatError::store(&root, e))?;
    for object in objects {
        let full = object.location.as_ref();
        let Some(relative) = full
            .strip_prefix(root.as_ref())
            .map(|r| r.trim_start_matches('/'))
        else {
            continue;
        };
        if relative.starts_with(super::store::VERSIONS_DIR) || keep.contains(relative) {
            continue;
        }
        if object.last_modified.timestamp_millis() > cutoff_ms {
            continue;
        }
        dir.store()
            .delete(&object.location)
            .await
            .map_err(|e| FormatError::store(&object.location, e))?;
        metrics.files_removed += 1;
        metrics.bytes_removed += object.size;
    }
    // Manifests last: until here every dropped version still read.
    for v in &versions[..keep_from] {
        dir.delete_manifest(*v).await?;
        metrics.versions_removed += 1;
    }
    Ok(metrics)
}

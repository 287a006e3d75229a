//! VACUUM: removing files no retained version references.
//!
//! The retained versions are the newest `retain` ones (all of them by default) plus every
//! version that was still the latest within a grace period, i.e. whose successor committed
//! within it (a writer in progress may have read it and still need its files, e.g. the data
//! files it scans or the deletion vectors it merges with, however old the version is). A file is removed when no
//! retained manifest references it (data files, deletion files, index models and segments,
//! and the files ledger transitions need: removed-row deletion vectors and row maps) and it is
//! older than the grace period (a writer may have written it and not committed yet), so the
//! grace period must exceed the longest write. Manifests of dropped versions go too (time
//! travel to them ends). The latest version is always kept, and ledger entries no segment
//! needs were already dropped at commit time.
//!
//! On a local directory, a write killed mid-upload leaves a temporary file beside its target
//! (`data/x.parquet#1`, `_deletions/y.del#1`, `_versions/…manifest#1`). object_store's listing
//! hides those, so VACUUM walks the table's folder itself and removes every temporary file
//! older than the grace period, in every folder (`_versions/` included).

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;

use super::error::{FormatError, Result};
use super::manifest::Manifest;
use super::progress::Progress;
use super::store::TableDir;

/// Default grace period: files and versions younger than this may matter to a commit in
/// progress (session option `fragvec.vacuum_grace_seconds`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(15 * 60);

/// What VACUUM removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VacuumMetrics {
    /// Versions whose manifests were deleted.
    pub versions_removed: u64,
    /// Unreferenced files deleted (data, deletion, index and row-map files, and leftover
    /// temporary uploads of a local directory); manifests are not counted here.
    pub files_removed: u64,
    /// Total size in bytes of the files counted in `files_removed`.
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
/// `grace`: unreferenced files younger than this are kept. Reports the phases "reading
/// manifests", "examining files", "removing files" and "removing versions" to `progress`.
pub async fn vacuum(
    dir: &TableDir,
    retain: Option<u64>,
    grace: Duration,
    progress: &Progress,
) -> Result<VacuumMetrics> {
    let versions = dir.versions().await?;
    if versions.is_empty() {
        return Err(FormatError::NotFound(dir.name().to_string()));
    }
    let mut keep_from = match retain {
        Some(n) => versions.len().saturating_sub(n.max(1) as usize),
        None => 0,
    };
    let cutoff_ms = super::manifest::now_ms() - grace.as_millis() as i64;
    // A version may be in use until its successor commits: a writer may have read it as the
    // latest and still scan its files or merge with its deletion vectors. So every version
    // whose successor committed within the grace period stays, whatever `retain` says.
    while keep_from > 0 {
        match dir.load_manifest(versions[keep_from]).await {
            Ok(m) if m.transaction.timestamp_ms >= cutoff_ms => keep_from -= 1,
            _ => break,
        }
    }
    let mut keep = HashSet::new();
    let reading = progress.phase(
        "reading manifests",
        Some((versions.len() - keep_from) as u64),
    );
    for v in &versions[keep_from..] {
        keep.extend(referenced_files(&dir.load_manifest(*v).await?));
        reading.advance(1);
    }
    reading.finish();
    let mut metrics = VacuumMetrics::default();
    let root = dir.path("");
    let objects: Vec<_> = dir
        .store()
        .list(Some(&root))
        .try_collect()
        .await
        .map_err(|e| FormatError::store(&root, e))?;
    let examining = progress.phase("examining files", Some(objects.len() as u64));
    let mut doomed = Vec::new();
    for object in objects {
        examining.advance(1);
        let full = object.location.as_ref();
        let Some(relative) = full
            .strip_prefix(root.as_ref())
            .map(|r| r.trim_start_matches('/'))
        else {
            continue;
        };
        // Maintenance leases and journal records are not table data (they tidy themselves).
        if relative.starts_with(super::store::VERSIONS_DIR)
            || relative.starts_with("_maintenance/")
            || keep.contains(relative)
        {
            continue;
        }
        if object.last_modified.timestamp_millis() > cutoff_ms {
            continue;
        }
        doomed.push(object);
    }
    examining.finish();
    let removing = progress.phase("removing files", Some(doomed.len() as u64));
    for object in doomed {
        dir.store()
            .delete(&object.location)
            .await
            .map_err(|e| FormatError::store(&object.location, e))?;
        metrics.files_removed += 1;
        metrics.bytes_removed += object.size;
        removing.advance(1);
    }
    removing.finish();
    if let Some(local) = dir.local_dir() {
        let (files, bytes) = remove_temporary_files(local, grace).await?;
        metrics.files_removed += files;
        metrics.bytes_removed += bytes;
    }
    // Manifests last: until here every dropped version still read.
    let dropping = progress.phase("removing versions", Some(keep_from as u64));
    for v in &versions[..keep_from] {
        dir.delete_manifest(*v).await?;
        metrics.versions_removed += 1;
        dropping.advance(1);
    }
    Ok(metrics)
}

/// Whether a file name is a temporary upload of object_store's local file system: the target
/// name, `#`, and a number.
fn is_temporary(name: &str) -> bool {
    name.rsplit_once('#').is_some_and(|(target, n)| {
        !target.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Removes temporary files under `root` (recursively) last modified longer than `grace` ago.
/// Returns (files, bytes) removed.
async fn remove_temporary_files(root: &std::path::Path, grace: Duration) -> Result<(u64, u64)> {
    let shown = root.display().to_string();
    let root = root.to_path_buf();
    let walk = move || -> std::io::Result<(u64, u64)> {
        let mut removed = (0u64, 0u64);
        let mut folders = vec![root];
        while let Some(folder) = folders.pop() {
            let entries = match std::fs::read_dir(&folder) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for entry in entries {
                let entry = entry?;
                let meta = entry.metadata()?;
                if meta.is_dir() {
                    folders.push(entry.path());
                    continue;
                }
                let name = entry.file_name();
                let old_enough = meta
                    .modified()
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age >= grace);
                if is_temporary(&name.to_string_lossy()) && old_enough {
                    match std::fs::remove_file(entry.path()) {
                        Ok(()) => {
                            removed.0 += 1;
                            removed.1 += meta.len();
                        }
                        // Another VACUUM (or the writer's own cleanup) got there first.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(removed)
    };
    let io = |source| FormatError::Io {
        path: shown.clone(),
        source,
    };
    tokio::task::spawn_blocking(walk)
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_are_target_hash_number() {
        assert!(is_temporary("x.parquet#1"));
        assert!(is_temporary("00000000000000000003.manifest#12"));
        assert!(!is_temporary("x.parquet"));
        assert!(!is_temporary("x#"));
        assert!(!is_temporary("#1"));
        assert!(!is_temporary("x#1a"));
    }
}

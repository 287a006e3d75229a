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

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

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
    note_referenced_files(m, &mut files);
    files
}

/// Adds the files `m` needs to `files`, copying only the names not there yet (consecutive
/// versions share almost all their files).
fn note_referenced_files(m: &Manifest, files: &mut HashSet<String>) {
    let mut note = |path: &str| {
        if !files.contains(path) {
            files.insert(path.to_string());
        }
    };
    for f in &m.fragments {
        f.files.iter().for_each(|d| note(&d.path));
        f.deletion.iter().for_each(|d| note(&d.path));
    }
    m.indexes.iter().for_each(|i| note(&i.model_file));
    m.index_segments.iter().for_each(|s| note(&s.file));
    for t in &m.reuse_ledger {
        t.mapping.files().into_iter().for_each(&mut note);
    }
}

/// Manifests VACUUM reads at once: decoding is CPU, reading is a round trip on S3.
const CONCURRENT_READS: usize = 8;

/// The index in `committed` (the versions' commit times, ascending by version) of the oldest
/// version to keep. Kept are the newest `retain` versions (all: `None`) and every version
/// whose successor committed at or after `cutoff_ms` (a writer may have read it as the latest
/// and still scan its files or merge with its deletion vectors, however old the version is),
/// and every version after one of those: only the oldest versions go. The latest version
/// is always kept.
fn oldest_kept(committed: &[i64], retain: Option<u64>, cutoff_ms: i64) -> usize {
    let by_count = match retain {
        Some(n) => committed
            .len()
            .saturating_sub(usize::try_from(n.max(1)).unwrap_or(usize::MAX)),
        None => 0,
    };
    // Commit times come from writers' clocks and the store's: not always in version order,
    // so the first recent one decides, not a walk back from `by_count`.
    let by_grace = committed
        .iter()
        .position(|&t| t >= cutoff_ms)
        .map_or(by_count, |first_recent| first_recent.saturating_sub(1));
    by_count.min(by_grace)
}

/// Removes what the newest `retain` versions do not need (`None`: keep every version).
/// `grace`: unreferenced files younger than this are kept. Reports the phases "reading
/// manifests", "examining files", "removing files" and "removing versions" to `progress`.
///
/// Which versions stay is decided from the manifests' listing (their commit times), so only
/// the retained manifests are read: several at a time, from the decoded-manifest cache when
/// there (without filling it). Files and manifests are removed through the store's bulk
/// delete. On a table that commits many times a second a 60 s grace period retains
/// thousands of versions, and one read or delete after another made VACUUM hold up the
/// maintainer's other tasks for seconds.
pub async fn vacuum(
    dir: &TableDir,
    retain: Option<u64>,
    grace: Duration,
    progress: &Progress,
) -> Result<VacuumMetrics> {
    let listed = dir.listed_versions().await?;
    if listed.is_empty() {
        return Err(FormatError::NotFound(dir.name().to_string()));
    }
    let cutoff_ms = super::manifest::now_ms() - grace.as_millis() as i64;
    // A manifest's time in the listing is when its version committed, by the store's clock
    // (as the files' ages below). S3 lists it to the second: there the grace period may
    // end up to a second early, a margin the grace period (minutes) must have anyway.
    let committed: Vec<i64> = listed
        .iter()
        .map(|(_, meta)| meta.last_modified.timestamp_millis())
        .collect();
    let keep_from = oldest_kept(&committed, retain, cutoff_ms);
    let mut keep = HashSet::new();
    let reading = progress.phase("reading manifests", Some((listed.len() - keep_from) as u64));
    // The futures made first, then streamed: a stream of closures over borrowed listings
    // would not be `Send` in the caller's future.
    let reads: Vec<_> = listed[keep_from..]
        .iter()
        .map(|(v, meta)| dir.peek_manifest(*v, meta))
        .collect();
    let mut manifests = futures::stream::iter(reads).buffered(CONCURRENT_READS);
    while let Some(manifest) = manifests.try_next().await? {
        note_referenced_files(&manifest, &mut keep);
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
    let mut doomed = HashMap::new();
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
        doomed.insert(object.location, object.size);
    }
    examining.finish();
    let removing = progress.phase("removing files", Some(doomed.len() as u64));
    let paths = doomed.keys().cloned().collect();
    dir.delete_all(paths, |path| {
        metrics.files_removed += 1;
        metrics.bytes_removed += doomed.get(path).copied().unwrap_or(0);
        removing.advance(1);
    })
    .await?;
    removing.finish();
    if let Some(local) = dir.local_dir() {
        let (files, bytes) = remove_temporary_files(local, grace).await?;
        metrics.files_removed += files;
        metrics.bytes_removed += bytes;
    }
    // Manifests last: until here every dropped version still read.
    let dropping = progress.phase("removing versions", Some(keep_from as u64));
    let dropped = listed[..keep_from]
        .iter()
        .map(|(v, _)| dir.manifest_path(*v))
        .collect();
    dir.delete_all(dropped, |_| {
        metrics.versions_removed += 1;
        dropping.advance(1);
    })
    .await?;
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
                match visit(&entry?, grace)? {
                    Visited::Folder(path) => folders.push(path),
                    Visited::Removed(bytes) => {
                        removed.0 += 1;
                        removed.1 += bytes;
                    }
                    Visited::Kept => {}
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

/// What the temporary-file walk did with one entry of a folder.
#[derive(Debug, PartialEq, Eq)]
enum Visited {
    /// A folder, to walk next.
    Folder(std::path::PathBuf),
    /// A temporary file older than the grace period, removed (its size).
    Removed(u64),
    /// Anything else, including an entry gone since its folder was read.
    Kept,
}

fn visit(entry: &std::fs::DirEntry, grace: Duration) -> std::io::Result<Visited> {
    // An entry may go between the folder's read and here: a writer renames its temporary
    // file into place, or another VACUUM removes it.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let meta = match entry.metadata() {
        Ok(meta) => meta,
        Err(e) if gone(&e) => return Ok(Visited::Kept),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        return Ok(Visited::Folder(entry.path()));
    }
    let old_enough = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age >= grace);
    if !(is_temporary(&entry.file_name().to_string_lossy()) && old_enough) {
        return Ok(Visited::Kept);
    }
    match std::fs::remove_file(entry.path()) {
        Ok(()) => Ok(Visited::Removed(meta.len())),
        Err(e) if gone(&e) => Ok(Visited::Kept),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_versions_are_the_newest_and_those_read_within_the_grace_period() {
        let cutoff = 100;
        // Retain 2 of 6, nothing recent: the newest two.
        assert_eq!(oldest_kept(&[1, 2, 3, 4, 5, 6], Some(2), cutoff), 4);
        // Version 3 committed within the grace period: version 2 may still be read.
        assert_eq!(oldest_kept(&[1, 2, 3, 100, 101, 102], Some(1), cutoff), 2);
        // The first version committed recently: nothing older exists, keep all.
        assert_eq!(oldest_kept(&[100, 101], Some(1), cutoff), 0);
        // Retain 0 means 1: the latest always stays.
        assert_eq!(oldest_kept(&[1, 2, 3], Some(0), cutoff), 2);
        assert_eq!(oldest_kept(&[1, 2, 3], Some(u64::MAX), cutoff), 0);
        assert_eq!(oldest_kept(&[1, 2, 3], None, cutoff), 0);
        // Times out of version order (writers' clocks differ): version 2 committed
        // recently, so version 1 stays, and so does every version after it.
        assert_eq!(oldest_kept(&[1, 2, 150, 3, 4, 5], Some(1), cutoff), 1);
    }

    #[test]
    fn an_entry_gone_since_its_folder_was_read_is_passed_over() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("x.parquet#1"), b"partial").unwrap();
        std::fs::write(tmp.path().join("y.parquet#2"), b"partial").unwrap();
        let mut entries: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(Result::unwrap)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        // A writer renames its upload into place after the folder was read.
        std::fs::rename(entries[0].path(), tmp.path().join("x.parquet")).unwrap();
        assert_eq!(visit(&entries[0], Duration::ZERO).unwrap(), Visited::Kept);
        assert_eq!(
            visit(&entries[1], Duration::ZERO).unwrap(),
            Visited::Removed(7)
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["x.parquet"]);
    }

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

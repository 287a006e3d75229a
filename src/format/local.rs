//! Reading a local database's files without object_store's thread hand-off.
//!
//! object_store's local file system runs every request on the blocking thread pool, which
//! costs two thread wake-ups. For the stat of a manifest that a query's version check makes,
//! that is most of the time; the stat itself takes microseconds and is made inline here,
//! giving the same metadata the store would.

use object_store::ObjectMeta;
use object_store::path::Path;

/// The metadata object_store's local file system reports for `file` (its `head`), or `None`
/// when there is no such file; `location` is the file's store path.
pub(crate) fn head(
    file: &std::path::Path,
    location: Path,
) -> std::result::Result<Option<ObjectMeta>, object_store::Error> {
    let metadata = match std::fs::metadata(file) {
        Ok(m) if m.is_file() => m,
        Ok(_) => return Ok(None), // a directory: the store holds no object there
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            });
        }
    };
    let modified = metadata
        .modified()
        .map_err(|e| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        })?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0u64;
    let micros = modified
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let size = metadata.len();
    Ok(Some(ObjectMeta {
        location,
        last_modified: modified.into(),
        size,
        // object_store's local e-tag: inode, modification time in microseconds, size.
        e_tag: Some(format!("{inode:x}-{micros:x}-{size:x}")),
        version: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;
    use object_store::{ObjectStoreExt, PutPayload};

    /// The same metadata as object_store's own `head`, and `None` where it finds nothing.
    #[tokio::test]
    async fn head_reports_what_the_local_store_reports() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let store = LocalFileSystem::new_with_prefix(&root).unwrap();
        let location = Path::from("a/b.manifest");
        store
            .put(&location, PutPayload::from_static(b"twelve bytes"))
            .await
            .unwrap();
        let theirs = store.head(&location).await.unwrap();
        let ours = head(&root.join("a/b.manifest"), location.clone()).unwrap();
        assert_eq!(ours, Some(theirs));
        assert_eq!(
            head(&root.join("a/none"), Path::from("a/none")).unwrap(),
            None
        );
        // A directory is not an object.
        assert_eq!(head(&root.join("a"), Path::from("a")).unwrap(), None);
        assert!(store.head(&Path::from("a")).await.is_err());
    }
}

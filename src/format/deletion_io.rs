//! A table's deletion files: read through the database's
//! [`DeletionCache`](super::deletion::DeletionCache), and written with the vector kept
//! there for the next query (the codec is [`super::deletion`]'s).

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use roaring::RoaringBitmap;

use super::deletion::{decode, encode};
use super::error::{FormatError, Result};
use super::integrity;
use super::manifest::{DeletionFile, Fragment};
use super::store::{TableDir, random_tag};

impl TableDir {
    /// Reads a fragment's deletion vector (empty if it has none), checked against the CRC32C
    /// its manifest entry records (entries written before checksums have none). Decoded
    /// vectors are kept per database ([`DeletionCache`](super::deletion::DeletionCache)).
    pub async fn read_deletions(&self, fragment: &Fragment) -> Result<RoaringBitmap> {
        Ok(self.shared_deletions(fragment).await?.as_ref().clone())
    }

    /// [`Self::read_deletions`] without a copy: the cached vector itself. A KNN query takes
    /// the deletion vector of every fragment that has one, and on a live table (deletes in
    /// most of hundreds of fragments) copying each for each query was allocation churn.
    pub async fn shared_deletions(&self, fragment: &Fragment) -> Result<Arc<RoaringBitmap>> {
        let Some(file) = &fragment.deletion else {
            return Ok(Arc::default());
        };
        let path = self.path(&file.path);
        let key = deletion_key(&path, fragment, file);
        if let Some(hit) = self.deletion_cache().get(&key) {
            return Ok(hit);
        }
        let bytes = self.read(&file.path).await?;
        if let Some(crc) = file.crc32c {
            integrity::check(&path, "deletion file", &bytes, crc)?;
        }
        let deleted = decode(
            &bytes,
            path.as_ref(),
            fragment.id,
            fragment.physical_rows,
            file.deleted_rows,
        )?;
        let deleted = Arc::new(deleted);
        self.deletion_cache().insert(key, deleted.clone());
        Ok(deleted)
    }

    /// Writes a new deletion file for a fragment. The manifest that references it is the commit.
    pub async fn write_deletions(
        &self,
        fragment: &Fragment,
        deleted: &RoaringBitmap,
        read_version: u64,
    ) -> Result<DeletionFile> {
        let relative = format!("_deletions/{}-{}.del", fragment.id, random_tag());
        let path = self.path(&relative);
        let bytes = encode(fragment.id, fragment.physical_rows, deleted);
        let crc32c = integrity::crc32c(&bytes);
        self.store()
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| FormatError::store(&path, e))?;
        let file = DeletionFile {
            path: relative,
            deleted_rows: deleted.len(),
            read_version,
            crc32c: Some(crc32c),
        };
        // The next query on the version this file commits finds it decoded: a live table's
        // DELETE or re-embedding made each first query read back the file just written.
        let key = deletion_key(&path, fragment, &file);
        self.deletion_cache().insert(key, Arc::new(deleted.clone()));
        Ok(file)
    }
}

/// The deletion cache's key of a fragment's deletion file: the file and what decoding it
/// checks (the fragment, its rows, the deleted count, the checksum).
fn deletion_key(path: &Path, fragment: &Fragment, file: &DeletionFile) -> String {
    format!(
        "{path}#{}#{}#{}#{:?}",
        fragment.id, fragment.physical_rows, file.deleted_rows, file.crc32c
    )
}

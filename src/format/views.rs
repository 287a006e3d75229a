//! Views stored in the database: `_views/<name>.sql` under the database root holds the view's
//! query text, so a view survives the session that created it and every session of the
//! database sees it. A view is only text: it is planned afresh each time a query uses it, so
//! it reads the tables' latest versions then (never the versions of its creation).
//!
//! Names follow the table rules ([`folder_name`]); a view and a table never share a
//! name (the engine checks before creating either). Creating an existing view is refused
//! unless replacing, with a create-if-absent put, so two sessions racing to create one view
//! cannot both succeed.

use std::collections::BTreeSet;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::error::{FormatError, Result};
use super::store::Database;
use super::table_names::{folder_name, name_of_folder};

const VIEWS_DIR: &str = "_views";
const VIEW_SUFFIX: &str = ".sql";

impl Database {
    fn view_path(&self, name: &str) -> Result<Path> {
        let stem = folder_name(name)?;
        Ok(self
            .root()
            .clone()
            .join(VIEWS_DIR)
            .join(format!("{stem}{VIEW_SUFFIX}")))
    }

    /// Stores view `name` with its query text. Fails with `AlreadyExists` when a view of that
    /// name exists and `replace` is false.
    pub async fn create_view(&self, name: &str, query: &str, replace: bool) -> Result<()> {
        let path = self.view_path(name)?;
        let mode = if replace {
            PutMode::Overwrite
        } else {
            PutMode::Create
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match self
            .store()
            .put_opts(&path, PutPayload::from(query.to_string()), opts)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                Err(FormatError::AlreadyExists(name.to_string()))
            }
            Err(e) => Err(FormatError::store(&path, e)),
        }
    }

    /// Removes view `name` (nothing happens if there is none; callers that must report a
    /// missing view check with [`Database::read_view`] first).
    pub async fn drop_view(&self, name: &str) -> Result<()> {
        let path = self.view_path(name)?;
        match self.store().delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(FormatError::store(&path, e)),
        }
    }

    /// The query text of view `name`, if there is one (one read).
    pub async fn read_view(&self, name: &str) -> Result<Option<String>> {
        let path = self.view_path(name)?;
        let bytes = match self.store().get(&path).await {
            Ok(r) => r.bytes().await.map_err(|e| FormatError::store(&path, e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(FormatError::store(&path, e)),
        };
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| FormatError::corrupt(&path, "view text is not UTF-8"))
    }

    /// The names of every stored view (a listing; the texts are not read).
    pub async fn view_names(&self) -> Result<BTreeSet<String>> {
        let dir = self.root().clone().join(VIEWS_DIR);
        let objects: Vec<_> = self
            .store()
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| FormatError::store(&dir, e))?;
        Ok(objects
            .iter()
            .filter_map(|o| name_of_folder(o.location.filename()?.strip_suffix(VIEW_SUFFIX)?))
            .collect())
    }
}

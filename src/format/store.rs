//! Where tables live: a database is a directory or object-store prefix holding one folder per
//! table. Inside a table folder every path is relative, so a table can be copied elsewhere:
//!
//! ```text
//! <table>/_versions/00000000000000000007.manifest   immutable manifests, one per version
//! <table>/data/<random>.parquet                      data files of fragments
//! <table>/_deletions/<fragment>-<random>.del         deletion vectors
//! ```

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use futures::{StreamExt, TryStreamExt};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::deletion::DeletionCache;
use super::error::{FormatError, Result};
use super::latest::KnownVersions;
use super::manifest::{DataFile, Manifest, TableProperties};
use super::recent_writes::RecentWrites;
use super::table_names::{folder_name, name_of_folder};

pub(crate) const VERSIONS_DIR: &str = "_versions";
const MANIFEST_SUFFIX: &str = ".manifest";

/// In-process `memory://name` stores, so two sessions in one process can share one.
static MEMORY_STORES: LazyLock<Mutex<HashMap<String, Arc<InMemory>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A database: a store and a root prefix under which each table has its own folder.
#[derive(Clone, Debug)]
pub struct Database {
    store: Arc<dyn ObjectStore>,
    root: Path,
    location: String,
    /// The folder of a database on the local file system (object_store's listing hides the
    /// temporary files an interrupted write leaves there; VACUUM looks for them itself).
    local_dir: Option<Arc<std::path::PathBuf>>,
    /// The newest version seen of each table, so finding the newest version costs two small
    /// reads at once instead of a listing of every manifest, and a query within the version
    /// check interval of the last check needs none (see [`super::latest`]).
    known: Arc<KnownVersions>,
    /// The version check interval when the session sets none: zero for a local directory
    /// or `memory://` (a check costs microseconds there), [`REMOTE_VERSION_CHECK`] for object
    /// storage.
    default_version_check: Duration,
    /// Decoded deletion vectors, by file.
    deletions: Arc<DeletionCache>,
    /// The rows of small data files this handle just wrote ([`RecentWrites`]).
    recent: Arc<RecentWrites>,
    /// Decoded manifests, by table, version and the file's identity (size and e-tag or
    /// modification time, so a table dropped and created again is never confused with the
    /// old one). Manifests are immutable, so an entry never goes stale.
    manifests: ManifestCache,
}

type ManifestCache = Arc<Mutex<HashMap<String, Arc<Manifest>>>>;

/// Manifests a database keeps decoded.
const CACHED_MANIFESTS: usize = 256;

/// The default version check interval on object storage (`fragvec.version_check_ms`): a
/// query reuses the newest version of a table confirmed less than a second ago.
pub const REMOTE_VERSION_CHECK: Duration = Duration::from_millis(1000);

impl Database {
    /// Opens a database at a local path, `file://` URL, `memory://[name]`, or (with the `s3`
    /// feature) an `s3://bucket/prefix` URL. A local directory is created if missing.
    pub async fn open(location: &str) -> Result<Self> {
        let mut local_dir = None;
        let mut default_version_check = Duration::ZERO;
        let (store, root): (Arc<dyn ObjectStore>, Path) =
            if let Some(name) = location.strip_prefix("memory://") {
                let mut stores = MEMORY_STORES.lock().expect("memory store registry");
                let store = stores.entry(name.to_string()).or_default().clone();
                (store, Path::default())
            } else if let Some(rest) = location.strip_prefix("s3://") {
                let (store, root) = open_s3(rest)?;
                check_put_if_absent(store.as_ref(), &root, location).await?;
                default_version_check = REMOTE_VERSION_CHECK;
                (store, root)
            } else if location.contains("://") && !location.starts_with("file://") {
                return Err(FormatError::invalid(format!(
                    "unsupported database location '{location}' (use a path, file://, memory://{})",
                    if cfg!(feature = "s3") {
                        " or s3://"
                    } else {
                        ""
                    }
                )));
            } else {
                let dir = location.strip_prefix("file://").unwrap_or(location);
                std::fs::create_dir_all(dir).map_err(|e| {
                    FormatError::invalid(format!("cannot create database directory {dir}: {e}"))
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| FormatError::store(dir, e))?
                    .with_automatic_cleanup(true);
                // The folder the store resolves paths against (it canonicalises its prefix),
                // so a file found here is the file the store reads.
                let canonical = std::fs::canonicalize(dir).map_err(|e| {
                    FormatError::invalid(format!("cannot open database directory {dir}: {e}"))
                })?;
                local_dir = Some(Arc::new(canonical));
                (Arc::new(fs), Path::default())
            };
        Ok(Self {
            store,
            root,
            location: location.to_string(),
            local_dir,
            known: Arc::new(KnownVersions::new(default_version_check)),
            default_version_check,
            deletions: Arc::default(),
            recent: Arc::default(),
            manifests: ManifestCache::default(),
        })
    }

    /// A database over any object store, e.g. one the embedding application configured. Its
    /// default version check interval is that of object storage, [`REMOTE_VERSION_CHECK`].
    pub fn from_store(store: Arc<dyn ObjectStore>, root: Path, location: String) -> Self {
        Self {
            store,
            root,
            location,
            local_dir: None,
            known: Arc::new(KnownVersions::new(REMOTE_VERSION_CHECK)),
            default_version_check: REMOTE_VERSION_CHECK,
            deletions: Arc::default(),
            recent: Arc::default(),
            manifests: ManifestCache::default(),
        }
    }

    /// Sets the version check interval (`None`: this database's default): how long a query
    /// may read the newest version of a table this handle knows without asking the store
    /// (see [`super::latest`] for the consistency it gives). Writers always ask.
    pub fn set_version_check(&self, interval: Option<Duration>) {
        self.known
            .set_interval(interval.unwrap_or(self.default_version_check));
    }

    /// The version check interval in force.
    pub fn version_check(&self) -> Duration {
        self.known.interval()
    }

    /// The database's location as it was opened (a local path or a URL such as
    /// `s3://bucket/prefix`).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The database's root prefix in its store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The object store holding the database's files.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The folder of table `name`, whether or not the table exists; an error for a name
    /// that cannot be a table name.
    pub fn table(&self, name: &str) -> Result<TableDir> {
        let folder = folder_name(name)?;
        Ok(TableDir {
            store: self.store.clone(),
            root: self.root.clone().join(folder.as_str()),
            name: name.to_string(),
            local_dir: self.local_dir.as_ref().map(|d| Arc::new(d.join(&folder))),
            known: self.known.clone(),
            deletions: self.deletions.clone(),
            recent: self.recent.clone(),
            manifests: self.manifests.clone(),
        })
    }

    /// Names of the tables in the database (folders that hold at least one manifest). The
    /// folders are checked concurrently.
    pub async fn list_tables(&self) -> Result<Vec<String>> {
        let listing = self
            .store
            .list_with_delimiter(Some(&self.root))
            .await
            .map_err(|e| FormatError::store(&self.root, e))?;
        let candidates: Vec<TableDir> = listing
            .common_prefixes
            .iter()
            .filter_map(|prefix| prefix.filename().and_then(name_of_folder))
            .map(|name| self.table(&name))
            .collect::<Result<_>>()?;
        let checks: Vec<_> = candidates
            .iter()
            .map(|dir| async move { Ok::<_, FormatError>((dir, dir.latest_version().await?)) })
            .collect();
        let found: Vec<(&TableDir, Option<u64>)> = futures::stream::iter(checks)
            .buffered(super::ranges::CONCURRENT_REQUESTS)
            .try_collect()
            .await?;
        let mut names: Vec<String> = found
            .into_iter()
            .filter(|(_, v)| v.is_some())
            .map(|(dir, _)| dir.name.clone())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Creates a table at version 1. Fails if a table of that name exists.
    pub async fn create_table(
        &self,
        name: &str,
        schema: &Schema,
        properties: TableProperties,
    ) -> Result<Snapshot> {
        let dir = self.table(name)?;
        if dir.latest_version().await?.is_some() {
            return Err(FormatError::AlreadyExists(name.to_string()));
        }
        let manifest = Manifest::new_table(schema, properties, random_tag())?;
        if !dir.put_manifest(&manifest).await? {
            return Err(FormatError::AlreadyExists(name.to_string()));
        }
        Snapshot::new(Arc::new(dir), Arc::new(manifest))
    }

    /// Deletes every file of a table.
    pub async fn drop_table(&self, name: &str) -> Result<()> {
        let dir = self.table(name)?;
        if dir.latest_version().await?.is_none() {
            return Err(FormatError::NotFound(name.to_string()));
        }
        // Manifests go first, so a crash midway leaves no half-table behind a valid manifest.
        let mut manifests: Vec<Path> = self
            .store
            .list(Some(&dir.root.clone().join(VERSIONS_DIR)))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| FormatError::store(&dir.root, e))?;
        manifests.sort();
        for path in manifests.iter().rev() {
            self.store
                .delete(path)
                .await
                .map_err(|e| FormatError::store(path, e))?;
        }
        let rest: Vec<Path> = self
            .store
            .list(Some(&dir.root))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| FormatError::store(&dir.root, e))?;
        for path in rest {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(FormatError::store(&path, e)),
            }
        }
        self.known.forget(name);
        Ok(())
    }
}

/// An S3 bucket and prefix (`bucket/prefix`), configured from the `AWS_*` environment
/// variables `object_store` knows (`AmazonS3Builder::from_env`): credentials
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), `AWS_REGION` /
/// `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`) for S3-compatible servers,
/// `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint. The bucket named in the URL wins over
/// `AWS_BUCKET`.
#[cfg(feature = "s3")]
fn open_s3(rest: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(FormatError::invalid(format!(
            "s3://{rest}: no bucket (use s3://bucket/prefix)"
        )));
    }
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .build()
        .map_err(|e| FormatError::store(format!("s3://{rest}"), e))?;
    Ok((Arc::new(store), Path::from(prefix)))
}

#[cfg(not(feature = "s3"))]
fn open_s3(rest: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
    Err(FormatError::invalid(format!(
        "s3://{rest}: this build of fragvec has no S3 support (enable the `s3` cargo feature)"
    )))
}

/// The object [`check_put_if_absent`] creates under a database's root (its name starts
/// with `_`, so it is never taken for a table).
pub const PUT_IF_ABSENT_PROBE: &str = "_put_if_absent_probe";

/// Checks that `store` refuses a create-if-absent put (`PutMode::Create`) of an object that
/// exists: every commit relies on it, and a store that ignored the condition would let two
/// writers both publish the same version, one of them silently lost. [`Database::open`] runs
/// it for `s3://` locations; an application that builds its own store for
/// [`Database::from_store`] should run it too.
///
/// It puts [`PUT_IF_ABSENT_PROBE`] under `root` with `PutMode::Create`: when that fails as
/// "already exists" the store honours the condition (one request; the object stays for the
/// next open); when it succeeds, a second identical put must fail so. A store without
/// conditional puts (`NotImplemented`, e.g. `AWS_CONDITIONAL_PUT=disabled`) or one that
/// accepts the second put is refused with [`FormatError::NoPutIfAbsent`]. Credentials
/// without write access pass (a reader cannot commit, so it cannot commit unsafely); other
/// store errors (no such bucket, no connection) are returned as they are.
pub async fn check_put_if_absent(
    store: &dyn ObjectStore,
    root: &Path,
    location: &str,
) -> Result<()> {
    let path = root.clone().join(PUT_IF_ABSENT_PROBE);
    let create = || {
        store.put_opts(
            &path,
            PutPayload::from_static(b"fragvec checks that this store refuses a second create\n"),
            PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            },
        )
    };
    let refuse = |reason: String| FormatError::NoPutIfAbsent {
        location: location.to_string(),
        reason,
    };
    let outcome = match create().await {
        Ok(_) => create().await.map(|_| ()),
        Err(e) => Err(e),
    };
    match outcome {
        Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Ok(()) => Err(refuse(format!(
            "a second create-if-absent put of {path} succeeded"
        ))),
        Err(e @ object_store::Error::NotImplemented { .. }) => Err(refuse(e.to_string())),
        Err(
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. },
        ) => Ok(()),
        Err(e) => Err(FormatError::store(&path, e)),
    }
}

/// A random 128-bit hex tag for file names and transactions.
pub fn random_tag() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// One table's folder.
#[derive(Clone, Debug)]
pub struct TableDir {
    store: Arc<dyn ObjectStore>,
    root: Path,
    name: String,
    /// The table's folder, when the database is a local directory.
    local_dir: Option<Arc<std::path::PathBuf>>,
    known: Arc<KnownVersions>,
    deletions: Arc<DeletionCache>,
    recent: Arc<RecentWrites>,
    manifests: ManifestCache,
}

impl TableDir {
    /// The table's name (as given, not its folder name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The object store holding the table's files.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The table's folder on the local file system, if the database is a local directory.
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        self.local_dir.as_deref().map(|p| p.as_path())
    }

    /// A name of the table's folder unique in this process across databases: its local
    /// path, or the store (by identity) and the folder's path in it. Two databases opened in
    /// one process may both hold a table `t` at the store path `t`.
    pub fn identity(&self) -> String {
        match &self.local_dir {
            Some(local) => local.display().to_string(),
            None => format!(
                "{}@{:p}/{}",
                self.store,
                Arc::as_ptr(&self.store),
                self.root
            ),
        }
    }

    /// Absolute store path of a path relative to the table root (`""`: the root itself).
    /// Empty parts are skipped: a trailing `/` would make an S3 listing of the path ask for
    /// the prefix `t//`, which holds nothing (a local directory listing would not notice).
    pub fn path(&self, relative: &str) -> Path {
        let mut p = self.root.clone();
        for part in relative.split('/').filter(|p| !p.is_empty()) {
            p = p.join(part);
        }
        p
    }

    /// The store path of a version's manifest.
    pub(crate) fn manifest_path(&self, version: u64) -> Path {
        self.root
            .clone()
            .join(VERSIONS_DIR)
            .join(format!("{version:020}{MANIFEST_SUFFIX}"))
    }

    /// All committed versions, ascending.
    pub async fn versions(&self) -> Result<Vec<u64>> {
        Ok(self
            .listed_versions()
            .await?
            .into_iter()
            .map(|(v, _)| v)
            .collect())
    }

    /// All committed versions, ascending, with their manifests' metadata (one listing).
    pub(crate) async fn listed_versions(&self) -> Result<Vec<(u64, ObjectMeta)>> {
        let dir = self.root.clone().join(VERSIONS_DIR);
        let metas: Vec<ObjectMeta> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| FormatError::store(&dir, e))?;
        let mut versions: Vec<(u64, ObjectMeta)> = metas
            .into_iter()
            .filter_map(|m| {
                let v = m
                    .location
                    .filename()?
                    .strip_suffix(MANIFEST_SUFFIX)?
                    .parse()
                    .ok()?;
                Some((v, m))
            })
            .collect();
        versions.sort_unstable_by_key(|(v, _)| *v);
        Ok(versions)
    }

    /// The newest committed version, asking the store. From the newest version this handle
    /// knows it probes upwards (versions are consecutive and manifests immutable); without
    /// one, or when that manifest is gone (the table was dropped or vacuumed), it lists the
    /// manifests.
    pub async fn latest_version(&self) -> Result<Option<u64>> {
        Ok(self.latest_head().await?.map(|(v, _)| v))
    }

    /// The newest version as a query may read it: the one this handle knows when the store
    /// confirmed it within the version check interval (no request), else
    /// [`Self::latest_version`]. See [`super::latest`] for the consistency this gives.
    pub async fn latest_version_for_query(&self) -> Result<Option<u64>> {
        Ok(self.latest_head_for_query().await?.map(|(v, _)| v))
    }

    /// [`Self::latest_version_for_query`] with the metadata of that version's manifest when
    /// the check has it, so that [`Self::cached_manifest`] need not ask for it again.
    pub async fn latest_head_for_query(&self) -> Result<Option<(u64, Option<ObjectMeta>)>> {
        match self.known.fresh(&self.name) {
            Some(known) => Ok(Some((known.version, known.meta))),
            None => self.latest_head().await,
        }
    }

    /// The newest version and, when probing found it, its manifest's metadata (so the
    /// snapshot need not ask for it again).
    ///
    /// The HEAD of the known version (is the table still there?) and of the next one (did
    /// another writer commit?) are sent together: one round trip when nothing changed.
    async fn latest_head(&self) -> Result<Option<(u64, Option<ObjectMeta>)>> {
        let started = Instant::now();
        if let Some(known) = self.known.get(&self.name) {
            let v = known.version;
            let (this, next) =
                futures::try_join!(self.manifest_head(v), self.manifest_head(v + 1))?;
            if let Some(mut meta) = this {
                let mut v = v;
                let mut next = next;
                while let Some(found) = next {
                    v += 1;
                    meta = found;
                    next = self.manifest_head(v + 1).await?;
                }
                self.known.probed(&self.name, v, meta.clone(), started);
                return Ok(Some((v, Some(meta))));
            }
        }
        let listed = self.listed_versions().await?.pop();
        self.known.listed(&self.name, listed.clone(), started);
        Ok(listed.map(|(v, meta)| (v, Some(meta))))
    }

    async fn manifest_head(&self, version: u64) -> Result<Option<ObjectMeta>> {
        let path = self.manifest_path(version);
        if let Some(dir) = &self.local_dir {
            // A stat of a local file takes microseconds: made here rather than handed to the
            // blocking pool and back (two thread wake-ups on every query's version check).
            let file = dir
                .join(VERSIONS_DIR)
                .join(format!("{version:020}{MANIFEST_SUFFIX}"));
            return super::local::head(&file, path.clone())
                .map_err(|e| FormatError::store(&path, e));
        }
        match self.store.head(&path).await {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(FormatError::store(&path, e)),
        }
    }

    /// Reads and decodes the manifest of `version` from the store (no cache);
    /// `VersionNotFound` when the table has no such version.
    pub async fn load_manifest(&self, version: u64) -> Result<Manifest> {
        let path = self.manifest_path(version);
        let bytes = match self.store.get(&path).await {
            Ok(r) => r.bytes().await.map_err(|e| FormatError::store(&path, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(FormatError::VersionNotFound {
                    table: self.name.clone(),
                    version,
                });
            }
            Err(e) => return Err(FormatError::store(&path, e)),
        };
        let manifest = Manifest::decode(&bytes, path.as_ref(), &self.name)?;
        if manifest.version != version {
            return Err(FormatError::corrupt(
                &path,
                format!(
                    "file name says version {version}, contents say {}",
                    manifest.version
                ),
            ));
        }
        Ok(manifest)
    }

    /// The table at `version`, its manifest from the database's cache when still valid;
    /// `VersionNotFound` when the table has no such version.
    pub async fn snapshot(self: &Arc<Self>, version: u64) -> Result<Snapshot> {
        Snapshot::new(self.clone(), self.cached_manifest(version, None).await?)
    }

    /// A manifest from the database's cache of decoded manifests, checked against the file's
    /// identity: `meta` when the caller has it, the fresh newest version's known identity,
    /// or one metadata request.
    pub async fn cached_manifest(
        &self,
        version: u64,
        meta: Option<ObjectMeta>,
    ) -> Result<Arc<Manifest>> {
        let meta = match meta.or_else(|| self.known.fresh_meta(&self.name, version)) {
            Some(m) => m,
            None => {
                let m = self.manifest_head(version).await?.ok_or_else(|| {
                    FormatError::VersionNotFound {
                        table: self.name.clone(),
                        version,
                    }
                })?;
                self.known.learned_meta(&self.name, version, &m);
                m
            }
        };
        let key = self.manifest_key(version, &meta);
        if let Some(m) = self.manifests.lock().expect("manifest cache").get(&key) {
            return Ok(m.clone());
        }
        let manifest = Arc::new(self.load_manifest(version).await?);
        self.remember_manifest(key, manifest.clone());
        Ok(manifest)
    }

    /// The decoded-manifest cache's key of a manifest file (its identity).
    fn manifest_key(&self, version: u64, meta: &ObjectMeta) -> String {
        format!(
            "{}/{version}/{}/{}",
            self.root,
            meta.size,
            meta.e_tag
                .clone()
                .unwrap_or_else(|| meta.last_modified.to_rfc3339())
        )
    }

    fn remember_manifest(&self, key: String, manifest: Arc<Manifest>) {
        let mut cache = self.manifests.lock().expect("manifest cache");
        if cache.len() >= CACHED_MANIFESTS {
            cache.clear();
        }
        cache.insert(key, manifest);
    }

    /// The newest version's snapshot, asking the store (for statements that write).
    pub async fn latest(self: &Arc<Self>) -> Result<Snapshot> {
        match self.latest_head().await? {
            Some((v, meta)) => Snapshot::new(self.clone(), self.cached_manifest(v, meta).await?),
            None => Err(FormatError::NotFound(self.name.clone())),
        }
    }

    /// The newest version's snapshot as a query may read it (see
    /// [`Self::latest_version_for_query`]): no request when the version was confirmed within
    /// the version check interval and its manifest is cached.
    pub async fn latest_for_query(self: &Arc<Self>) -> Result<Snapshot> {
        match self.latest_head_for_query().await? {
            Some((v, meta)) => Snapshot::new(self.clone(), self.cached_manifest(v, meta).await?),
            None => Err(FormatError::NotFound(self.name.clone())),
        }
    }

    /// Publishes a manifest if its version is free. `Ok(false)` means another writer won.
    pub async fn put_manifest(&self, manifest: &Manifest) -> Result<bool> {
        let path = self.manifest_path(manifest.version);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let bytes = bytes::Bytes::from(manifest.encode());
        match self
            .store
            .put_opts(&path, PutPayload::from(bytes.clone()), opts)
            .await
        {
            Ok(put) => {
                // This handle's next query reads what it just wrote without asking the store:
                // the manifest's identity is its size and e-tag (the HEAD of an object
                // returns the e-tag its PUT did), and its decoded form is cached.
                let meta = put.e_tag.map(|e_tag| ObjectMeta {
                    location: path.clone(),
                    last_modified: Default::default(),
                    size: bytes.len() as u64,
                    e_tag: Some(e_tag),
                    version: put.version,
                });
                if let Some(meta) = &meta {
                    // What was written, as a reader would decode it (encoding round-trips).
                    let key = self.manifest_key(manifest.version, meta);
                    self.remember_manifest(key, Arc::new(manifest.clone()));
                }
                self.known.committed(&self.name, manifest.version, meta);
                Ok(true)
            }
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(FormatError::store(&path, e)),
        }
    }

    /// A manifest from the decoded-manifest cache when it is there, else read from the store
    /// and not cached: for walks over many old versions (VACUUM) that would otherwise evict
    /// the versions queries use. `meta` is the manifest file's listing.
    pub async fn peek_manifest(&self, version: u64, meta: &ObjectMeta) -> Result<Arc<Manifest>> {
        let key = self.manifest_key(version, meta);
        if let Some(m) = self.manifests.lock().expect("manifest cache").get(&key) {
            return Ok(m.clone());
        }
        Ok(Arc::new(self.load_manifest(version).await?))
    }

    /// Deletes `paths` through the store's bulk delete (a request per thousand keys on S3,
    /// several files at a time on a local directory) and calls `deleted` with each one
    /// removed. A path that is already gone (another VACUUM got there first) is skipped.
    pub async fn delete_all(&self, paths: Vec<Path>, mut deleted: impl FnMut(&Path)) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let mut results = self
            .store
            .delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed());
        while let Some(result) = results.next().await {
            match result {
                Ok(path) => deleted(&path),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(FormatError::store(&self.root, e)),
            }
        }
        Ok(())
    }

    /// Reads a whole file of the table (relative path).
    pub async fn read(&self, relative: &str) -> Result<bytes::Bytes> {
        let path = self.path(relative);
        let object = self
            .store
            .get(&path)
            .await
            .map_err(|e| FormatError::store(&path, e))?;
        object
            .bytes()
            .await
            .map_err(|e| FormatError::store(&path, e))
    }

    /// The database's decoded deletion vectors ([`super::deletion`] reads and writes them).
    pub(super) fn deletion_cache(&self) -> &DeletionCache {
        &self.deletions
    }

    /// Keeps the batches of data file `relative`, written with `columns`, for the reads
    /// that follow its commit ([`RecentWrites`]; small files only).
    pub(crate) fn keep_written(
        &self,
        relative: &str,
        columns: Vec<String>,
        batches: Vec<datafusion::arrow::array::RecordBatch>,
    ) {
        let path = self.path(relative).to_string();
        self.recent.keep(path, columns, batches);
    }

    /// Column `column` of data file `file` as this handle wrote it, batch by batch, if it
    /// still holds the file's rows ([`RecentWrites`]): no read, no decode.
    pub fn written_column(
        &self,
        file: &DataFile,
        column: &str,
    ) -> Option<Vec<datafusion::arrow::array::ArrayRef>> {
        let path = self.path(&file.path);
        self.recent.column(path.as_ref(), &file.columns, column)
    }
}

/// One version of one table: what a query reads from start to end.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The folder of the table the snapshot reads.
    pub dir: Arc<TableDir>,
    /// The manifest of the version read: everything the snapshot sees.
    pub manifest: Arc<Manifest>,
    /// The table's Arrow schema at that version, parsed from the manifest's columns.
    pub schema: SchemaRef,
}

impl Snapshot {
    /// The snapshot of `dir` at `manifest`'s version; an error when the manifest's column
    /// types do not parse.
    pub fn new(dir: Arc<TableDir>, manifest: Arc<Manifest>) -> Result<Self> {
        let schema = manifest.arrow_schema()?;
        Ok(Self {
            dir,
            manifest,
            schema,
        })
    }

    /// The table version the snapshot reads.
    pub fn version(&self) -> u64 {
        self.manifest.version
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        self.dir.name()
    }
}

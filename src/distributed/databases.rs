//! The databases a process serves plans over, by location.
//!
//! A coordinator serves its session's database; a worker opens each database the first time
//! a query over it arrives (the coordinator names it in the request's headers, so the worker
//! opens it before the plan is decoded, which cannot wait for IO), or only the one it was
//! started with (`fragvec worker --db URL`). Each database gets one index cache for the
//! life of the process, so repeated queries reuse its loaded partitions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::common::Result;

use super::error::DistributedError;
use crate::engine::options::FragvecOptions;
use crate::format::{Database, Snapshot, TableDir};
use crate::index::cache::IndexCache;

/// An open database and its index cache.
#[derive(Clone, Debug)]
pub struct Served {
    /// The database, opened once for the life of the process.
    pub database: Database,
    /// The process's index cache for it.
    pub cache: Arc<IndexCache>,
}

/// The databases of one process, by location.
#[derive(Debug, Default)]
pub struct Databases {
    /// When set, the only location served.
    only: Option<String>,
    open: Mutex<HashMap<String, Served>>,
    /// Snapshots decoded from plan nodes, by database, table and version, with the manifest
    /// bytes they were decoded from (see [`Databases::decoded_snapshot`]).
    snapshots: Mutex<HashMap<SnapshotKey, (Vec<u8>, Snapshot)>>,
}

/// A decoded snapshot's database location, table and version.
type SnapshotKey = (String, String, u64);

/// Decoded snapshots a process keeps (all are dropped when more would be kept).
const MAX_SNAPSHOTS: usize = 64;

impl Databases {
    /// Serves any database a query names (`only: None`) or only the one at `only`.
    pub fn new(only: Option<String>) -> Self {
        Self {
            only,
            open: Mutex::default(),
            snapshots: Mutex::default(),
        }
    }

    /// The snapshot of `table` at `version` in the database at `location` that `manifest`
    /// (a plan node's bytes) describes: decoded by `decode` the first time, then reused for
    /// nodes carrying the same bytes. A worker decodes the same manifest for every task of
    /// every query over a version (JSON, then checks): this keeps that to once.
    pub fn decoded_snapshot(
        &self,
        location: &str,
        table: &str,
        version: u64,
        manifest: &[u8],
        decode: impl FnOnce() -> Result<Snapshot>,
    ) -> Result<Snapshot> {
        let key = (location.to_string(), table.to_string(), version);
        if let Some((bytes, snapshot)) = self.snapshots.lock().expect("snapshots lock").get(&key)
            && bytes.as_slice() == manifest
        {
            return Ok(snapshot.clone());
        }
        let snapshot = decode()?;
        let mut kept = self.snapshots.lock().expect("snapshots lock");
        if kept.len() >= MAX_SNAPSHOTS {
            kept.clear();
        }
        kept.insert(key, (manifest.to_vec(), snapshot.clone()));
        Ok(snapshot)
    }

    /// Serves an already open database (a coordinator's own) under its location.
    pub fn serve(&self, database: Database, cache: Arc<IndexCache>) {
        let location = database.location().to_string();
        self.open
            .lock()
            .expect("databases lock")
            .insert(location, Served { database, cache });
    }

    /// Each served database's location with the bytes its index cache holds (reported by
    /// a worker, so an operator can see which share of the index each worker caches).
    pub fn cache_bytes(&self) -> Vec<(String, usize)> {
        let mut held: Vec<(String, usize)> = self
            .open
            .lock()
            .expect("databases lock")
            .iter()
            .map(|(location, served)| (location.clone(), served.cache.bytes_held()))
            .collect();
        held.sort();
        held
    }

    /// The database at `location`, opened now if needed.
    pub async fn open(&self, location: &str) -> Result<Served> {
        if let Some(served) = self.open.lock().expect("databases lock").get(location) {
            return Ok(served.clone());
        }
        if let Some(only) = &self.only
            && only != location
        {
            return Err(DistributedError::DatabaseNotServed {
                location: location.to_string(),
                served: only.clone(),
            }
            .into());
        }
        let served = Served {
            database: Database::open(location).await?,
            cache: Arc::new(IndexCache::new(FragvecOptions::default().index_cache_bytes)),
        };
        Ok(self
            .open
            .lock()
            .expect("databases lock")
            .entry(location.to_string())
            .or_insert(served)
            .clone())
    }

    /// The open database at `location`.
    pub fn get(&self, location: &str) -> Result<Served, DistributedError> {
        self.open
            .lock()
            .expect("databases lock")
            .get(location)
            .cloned()
            .ok_or_else(|| match &self.only {
                Some(only) if only != location => DistributedError::DatabaseNotServed {
                    location: location.to_string(),
                    served: only.clone(),
                },
                _ => DistributedError::UnknownDatabase {
                    location: location.to_string(),
                },
            })
    }

    /// The locations of the open databases, sorted.
    pub fn locations(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .open
            .lock()
            .expect("databases lock")
            .keys()
            .cloned()
            .collect();
        all.sort();
        all
    }

    /// The location of the open database `dir` belongs to.
    pub fn location_of(&self, dir: &TableDir) -> Option<String> {
        let open = self.open.lock().expect("databases lock");
        open.iter()
            .find(|(_, served)| {
                same_store(served.database.store(), dir.store())
                    && served
                        .database
                        .table(dir.name())
                        .is_ok_and(|t| t.path("_versions") == dir.path("_versions"))
            })
            .map(|(location, _)| location.clone())
    }
}

fn same_store<T: ?Sized>(a: &Arc<T>, b: &Arc<T>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

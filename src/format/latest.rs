//! What one database handle knows of its tables' newest versions, and for how long a query
//! may rely on that without asking the store again (`fragvec.version_check_ms`).
//!
//! Finding a table's newest version asks the store twice, at once: a HEAD of the newest
//! version this handle knows (it is gone if the table was dropped) and a HEAD of the next
//! one (present if another writer committed). On a local directory that costs microseconds;
//! on object storage one round trip, 10–50 ms, which would be most of a KNN query whose index
//! partitions are already cached. So a *query* may reuse the newest version it knows when the
//! store confirmed it less than the **version check interval** ago ([`Known::is_fresh`]).
//!
//! Consistency this gives a reader (with interval `t`):
//! * **bounded staleness**: a query sees every commit another process or session made more
//!   than `t` before it started (a commit made within `t` may or may not be seen yet);
//! * **read your writes**: this handle's own commits are recorded as they succeed
//!   ([`KnownVersions::committed`]), so the next query sees them at once;
//! * **monotonic reads**: the version a query reads never goes back, except when a listing
//!   finds the table dropped and created again;
//! * with `t = 0` every query checks the store (the behaviour of a local directory by
//!   default).
//!
//! Writers never use the interval: INSERT, DELETE, UPDATE, MERGE, COMPACT, index statements
//! check the store before reading, and a commit is a create-if-absent put of the next version
//! anyway, so staleness can cost a writer a retry, never a lost update.
//!
//! No IO here: [`super::store::TableDir`] does the checks and reports what they found.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use object_store::ObjectMeta;

/// The newest version of one table, as far as this handle knows.
#[derive(Clone, Debug)]
pub struct Known {
    /// The newest version of the table this handle knows of.
    pub version: u64,
    /// The metadata of that version's manifest when a check returned it (its identity keys
    /// the decoded-manifest cache, so a fresh entry also saves the HEAD that would confirm
    /// it).
    pub meta: Option<ObjectMeta>,
    /// When the check that found it began (or when this handle committed it).
    pub checked: Instant,
}

impl Known {
    /// Whether the entry was confirmed less than `interval` ago (never, when it is zero).
    pub fn is_fresh(&self, interval: Duration) -> bool {
        self.checked.elapsed() < interval
    }
}

/// The newest versions of a database's tables and the version check interval.
#[derive(Debug, Default)]
pub struct KnownVersions {
    tables: Mutex<HashMap<String, Known>>,
    /// The version check interval, in milliseconds.
    interval_ms: AtomicU64,
}

impl KnownVersions {
    /// An empty record whose entries a query trusts for `interval` after each check (zero:
    /// never).
    pub fn new(interval: Duration) -> Self {
        let known = Self::default();
        known.set_interval(interval);
        known
    }

    /// The interval within which a query reuses the known newest version.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// Sets the version check interval; it applies at once, to entries already held too.
    pub fn set_interval(&self, interval: Duration) {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.interval_ms.store(ms, Ordering::Relaxed);
    }

    /// What is known of `table`, however old.
    pub fn get(&self, table: &str) -> Option<Known> {
        self.lock().get(table).cloned()
    }

    /// What is known of `table` if it was confirmed within the interval.
    pub fn fresh(&self, table: &str) -> Option<Known> {
        let interval = self.interval();
        self.get(table).filter(|k| k.is_fresh(interval))
    }

    /// The manifest metadata of `version` of `table`, if that is the fresh newest version and
    /// its metadata is known.
    pub fn fresh_meta(&self, table: &str, version: u64) -> Option<ObjectMeta> {
        self.fresh(table)
            .filter(|k| k.version == version)
            .and_then(|k| k.meta)
    }

    /// A check begun at `started` probed upwards from the known version and found `version`
    /// newest. A newer version recorded meanwhile (this handle committed it) is kept.
    pub fn probed(&self, table: &str, version: u64, meta: ObjectMeta, started: Instant) {
        let mut tables = self.lock();
        match tables.get_mut(table) {
            Some(k) if k.version > version => {}
            Some(k) if k.version == version => {
                k.checked = k.checked.max(started);
                k.meta = Some(meta);
            }
            _ => {
                tables.insert(
                    table.to_string(),
                    Known {
                        version,
                        meta: Some(meta),
                        checked: started,
                    },
                );
            }
        }
    }

    /// A listing begun at `started` found `version` newest, with its manifest's metadata
    /// (`None`: no such table). It may be lower than the known one (the table was dropped and
    /// created again), so it replaces it.
    pub fn listed(&self, table: &str, newest: Option<(u64, ObjectMeta)>, started: Instant) {
        let mut tables = self.lock();
        match newest {
            Some((version, meta)) => {
                tables.insert(
                    table.to_string(),
                    Known {
                        version,
                        meta: Some(meta),
                        checked: started,
                    },
                );
            }
            None => {
                tables.remove(table);
            }
        }
    }

    /// This handle just published `version` (with its manifest's metadata when the store
    /// told it): it is the newest as of now, unless a newer one is already known.
    pub fn committed(&self, table: &str, version: u64, meta: Option<ObjectMeta>) {
        let mut tables = self.lock();
        if tables.get(table).is_some_and(|k| k.version > version) {
            return;
        }
        let meta = meta.or_else(|| {
            tables
                .get(table)
                .filter(|k| k.version == version)
                .and_then(|k| k.meta.clone())
        });
        tables.insert(
            table.to_string(),
            Known {
                version,
                meta,
                checked: Instant::now(),
            },
        );
    }

    /// Records the metadata of `version`'s manifest if it is the known newest version.
    pub fn learned_meta(&self, table: &str, version: u64, meta: &ObjectMeta) {
        if let Some(k) = self.lock().get_mut(table)
            && k.version == version
            && k.meta.is_none()
        {
            k.meta = Some(meta.clone());
        }
    }

    /// Forgets `table` (it was dropped).
    pub fn forget(&self, table: &str) {
        self.lock().remove(table);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.tables.lock().expect("known versions")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(v: u64) -> ObjectMeta {
        ObjectMeta {
            location: format!("t/_versions/{v}").into(),
            last_modified: Default::default(),
            size: v,
            e_tag: Some(format!("e{v}")),
            version: None,
        }
    }

    #[test]
    fn a_zero_interval_is_never_fresh() {
        let known = KnownVersions::new(Duration::ZERO);
        known.committed("t", 3, Some(meta(3)));
        assert_eq!(known.get("t").map(|k| k.version), Some(3));
        assert!(known.fresh("t").is_none());
        assert!(known.fresh_meta("t", 3).is_none());
    }

    #[test]
    fn entries_are_fresh_within_the_interval_only() {
        let known = KnownVersions::new(Duration::from_secs(3600));
        known.probed("t", 5, meta(5), Instant::now());
        assert_eq!(known.fresh("t").map(|k| k.version), Some(5));
        assert_eq!(known.fresh_meta("t", 5), Some(meta(5)));
        assert_eq!(known.fresh_meta("t", 4), None);
        known.set_interval(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(known.fresh("t").is_none());
    }

    #[test]
    fn a_probe_never_lowers_a_version_committed_meanwhile() {
        let known = KnownVersions::new(Duration::from_secs(3600));
        let started = Instant::now();
        known.committed("t", 8, None);
        known.probed("t", 7, meta(7), started);
        assert_eq!(known.get("t").map(|k| k.version), Some(8));
        known.probed("t", 9, meta(9), Instant::now());
        assert_eq!(known.get("t").map(|k| k.version), Some(9));
        // Committing an older version than a known one (a lost race) changes nothing.
        known.committed("t", 9, None);
        assert_eq!(known.get("t").and_then(|k| k.meta), Some(meta(9)));
        known.committed("t", 2, None);
        assert_eq!(known.get("t").map(|k| k.version), Some(9));
    }

    #[test]
    fn a_listing_replaces_and_a_missing_table_is_forgotten() {
        let known = KnownVersions::new(Duration::from_secs(3600));
        known.probed("t", 9, meta(9), Instant::now());
        known.listed("t", Some((2, meta(2))), Instant::now()); // dropped and created again
        assert_eq!(known.get("t").map(|k| k.version), Some(2));
        assert_eq!(known.fresh_meta("t", 2), Some(meta(2)));
        known.committed("t", 3, None);
        known.learned_meta("t", 2, &meta(2));
        assert!(known.get("t").unwrap().meta.is_none());
        known.learned_meta("t", 3, &meta(3));
        assert_eq!(known.fresh_meta("t", 3), Some(meta(3)));
        known.listed("t", None, Instant::now());
        assert!(known.get("t").is_none());
        known.committed("u", 1, None);
        known.forget("u");
        assert!(known.get("u").is_none());
    }
}

//! The maintenance lease of a table: at most one maintainer acts on a table at a time, across
//! processes and machines, and a maintainer that dies loses the lease when it expires.
//!
//! The lease is a sequence of small objects `_maintenance/lease/<n>.json` in the table's
//! folder, each written with create-if-absent (the same conditional put every commit relies
//! on). The object with the highest `n` is the current state: who holds the lease and until
//! when. Acquiring, renewing and releasing all write `n + 1`; of two maintainers racing for
//! the same `n + 1` exactly one succeeds. A holder that finds a higher `n` than its own has
//! lost the lease (it expired and someone took it) and stops before its next task.
//!
//! Expiry compares wall clocks of different machines, so the time to live must exceed the
//! clock skew between them by a wide margin (the default is 60 s; NTP keeps skew to
//! milliseconds). Correctness of the table never depends on the lease: every maintenance
//! task is an ordinary commit checked against concurrent ones. The lease only keeps two
//! maintainers from doing the same work twice.

use std::time::Duration;

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::format::error::{FormatError, Result};
use crate::format::manifest::now_ms;
use crate::format::store::TableDir;

/// Folder of the lease objects, relative to the table root.
pub const LEASE_DIR: &str = "_maintenance/lease";
/// Default time to live of a lease.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// Lease objects kept behind the current one (older ones are deleted by the next holder).
const KEEP: u64 = 4;

/// One lease object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// Who holds it (`host:pid:tag`); empty once released.
    pub holder: String,
    /// Wall-clock milliseconds until which it is held.
    pub expires_ms: i64,
}

impl LeaseState {
    /// Whether a maintainer other than `holder` holds the lease at `now_ms`.
    pub fn held_by_another(&self, holder: &str, now_ms: i64) -> bool {
        self.holder != holder && !self.holder.is_empty() && self.expires_ms > now_ms
    }
}

/// A lease this process holds.
#[derive(Debug)]
pub struct Lease {
    seq: u64,
    holder: String,
    ttl: Duration,
}

/// Why a lease was not acquired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Held by another maintainer until then.
    HeldBy {
        /// The maintainer holding it.
        holder: String,
        /// When its hold lapses unrenewed, in milliseconds since the Unix epoch.
        expires_ms: i64,
    },
    /// Another maintainer took it between our read and our write.
    LostRace,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Busy::HeldBy { holder, expires_ms } => write!(
                f,
                "another maintainer ({holder}) holds the table's lease for {} ms more",
                (expires_ms - now_ms()).max(0)
            ),
            Busy::LostRace => write!(f, "another maintainer took the table's lease just now"),
        }
    }
}

fn object(seq: u64) -> String {
    format!("{LEASE_DIR}/{seq:020}.json")
}

/// The highest lease object's number and state (`None`: never leased).
pub async fn current(dir: &TableDir) -> Result<Option<(u64, LeaseState)>> {
    let mut seqs: Vec<u64> = super::json_names(dir, LEASE_DIR)
        .await?
        .iter()
        .filter_map(|name| name.parse().ok())
        .collect();
    seqs.sort_unstable();
    // The newest readable one: a half-deleted older object may vanish under us.
    for seq in seqs.into_iter().rev() {
        match dir.read(&object(seq)).await {
            Ok(bytes) => {
                let state: LeaseState =
                    serde_json::from_slice(&bytes).map_err(|e| FormatError::Corrupt {
                        path: object(seq),
                        reason: e.to_string(),
                    })?;
                return Ok(Some((seq, state)));
            }
            Err(FormatError::ObjectStore {
                source: object_store::Error::NotFound { .. },
                ..
            }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Writes lease object `seq` if nobody has; `Ok(false)` when someone did.
async fn put(dir: &TableDir, seq: u64, state: &LeaseState) -> Result<bool> {
    let path = dir.path(&object(seq));
    let body = serde_json::to_vec(state).expect("a lease state serializes");
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match dir
        .store()
        .put_opts(&path, PutPayload::from(body), opts)
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(FormatError::store(&path, e)),
    }
}

/// Deletes the objects just behind the [`KEEP`] newest (best effort: a failure leaves a few
/// small files, which a later call may remove).
async fn tidy(dir: &TableDir, seq: u64) {
    for old in seq.saturating_sub(KEEP + 2)..seq.saturating_sub(KEEP) {
        let _ = dir.store().delete(&dir.path(&object(old))).await;
    }
}

impl Lease {
    /// Takes the table's lease for `holder` unless someone else holds an unexpired one.
    pub async fn acquire(
        dir: &TableDir,
        holder: &str,
        ttl: Duration,
    ) -> Result<std::result::Result<Lease, Busy>> {
        let now = now_ms();
        let seq = match current(dir).await? {
            Some((_, s)) if s.held_by_another(holder, now) => {
                return Ok(Err(Busy::HeldBy {
                    holder: s.holder,
                    expires_ms: s.expires_ms,
                }));
            }
            Some((seq, _)) => seq + 1,
            None => 1,
        };
        let state = LeaseState {
            holder: holder.to_string(),
            expires_ms: now + ttl.as_millis() as i64,
        };
        if !put(dir, seq, &state).await? {
            return Ok(Err(Busy::LostRace));
        }
        tidy(dir, seq).await;
        Ok(Ok(Lease {
            seq,
            holder: holder.to_string(),
            ttl,
        }))
    }

    /// Extends the lease by its time to live; `Ok(false)` when it was lost (it expired and
    /// another maintainer took it): the caller must stop maintaining.
    pub async fn renew(&mut self, dir: &TableDir) -> Result<bool> {
        match current(dir).await? {
            Some((seq, _)) if seq == self.seq => {}
            _ => return Ok(false),
        }
        let state = LeaseState {
            holder: self.holder.clone(),
            expires_ms: now_ms() + self.ttl.as_millis() as i64,
        };
        if put(dir, self.seq + 1, &state).await? {
            self.seq += 1;
            tidy(dir, self.seq).await;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Gives the lease up, so the next maintainer need not wait for it to expire.
    pub async fn release(self, dir: &TableDir) -> Result<()> {
        if let Some((seq, _)) = current(dir).await?
            && seq == self.seq
        {
            let released = LeaseState {
                holder: String::new(),
                expires_ms: 0,
            };
            put(dir, self.seq + 1, &released).await?;
        }
        Ok(())
    }

    /// How long the lease lasts unrenewed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// A holder name for this process: `host:pid:tag`.
pub fn holder_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}:{}:{}",
        std::process::id(),
        crate::format::store::random_tag()
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;
    use crate::format::Database;

    fn table() -> TableDir {
        let db = Database::from_store(
            Arc::new(InMemory::new()),
            Path::from("db"),
            "memory://".into(),
        );
        db.table("t").unwrap()
    }

    #[tokio::test]
    async fn one_holder_at_a_time_until_release_or_expiry() {
        let dir = table();
        let ttl = Duration::from_secs(60);
        let mut a = Lease::acquire(&dir, "a", ttl).await.unwrap().unwrap();
        let busy = Lease::acquire(&dir, "b", ttl).await.unwrap().unwrap_err();
        assert!(
            matches!(&busy, Busy::HeldBy { holder, .. } if holder == "a"),
            "{busy}"
        );
        assert!(a.renew(&dir).await.unwrap());
        a.release(&dir).await.unwrap();
        let b = Lease::acquire(&dir, "b", Duration::from_millis(1))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        // b expired without releasing (a crash): c takes over, and b learns it lost.
        let mut b = b;
        let c = Lease::acquire(&dir, "c", ttl).await.unwrap().unwrap();
        assert!(!b.renew(&dir).await.unwrap());
        assert_eq!(current(&dir).await.unwrap().unwrap().1.holder, "c");
        c.release(&dir).await.unwrap();
    }

    #[tokio::test]
    async fn of_many_racing_for_a_free_lease_exactly_one_wins() {
        let dir = table();
        let tries: Vec<_> = (0..8)
            .map(|i| {
                let dir = dir.clone();
                tokio::spawn(async move {
                    Lease::acquire(&dir, &format!("m{i}"), DEFAULT_TTL)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut won = 0;
        for t in tries {
            won += usize::from(t.await.unwrap().is_ok());
        }
        assert_eq!(won, 1);
    }

    #[tokio::test]
    async fn old_lease_objects_are_tidied_away() {
        let dir = table();
        let mut a = Lease::acquire(&dir, "a", DEFAULT_TTL)
            .await
            .unwrap()
            .unwrap();
        for _ in 0..40 {
            assert!(a.renew(&dir).await.unwrap());
        }
        a.release(&dir).await.unwrap();
        let _b = Lease::acquire(&dir, "b", DEFAULT_TTL)
            .await
            .unwrap()
            .unwrap();
        let prefix = dir.path(LEASE_DIR);
        let left: Vec<_> = dir.store().list(Some(&prefix)).try_collect().await.unwrap();
        assert!(
            left.len() <= KEEP as usize + 3,
            "{} lease objects left",
            left.len()
        );
    }
}

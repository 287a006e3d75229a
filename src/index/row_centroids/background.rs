//! Assigning a cached fragment's rows to centroids off the query path.
//!
//! Assigning a row costs one distance per centroid (hundreds), scoring it one: done in the
//! query that first meets a fragment, a 4,096-row fragment against 1,000 centroids would add
//! tens of milliseconds to that query. So the first query only asks ([`request`]) and scores
//! the fragment in full; one low-priority thread per process assigns the rows, and the
//! queries after it skip the rows their bounds rule out. On a live table a fragment is met by
//! thousands of queries before an index append takes it over, so the assignment pays for
//! itself after about as many queries as the model has centroids.
//!
//! The thread holds the columns only weakly: a column the cache evicted before its turn is
//! not assigned. The queue is bounded; a request that does not fit is dropped (the fragment
//! is then asked for again by a later query).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock, Weak};

use super::RowCentroids;
use crate::index::ivf::IvfModel;

/// Requests waiting at most (each a weak reference and a model).
const QUEUE: usize = 4096;

/// Where a cached vector column keeps its rows' centroids: set once, by the background
/// thread. Cloning a column (or comparing two) leaves it out: it is derived data.
#[derive(Default)]
pub struct CentroidSlot {
    assigned: OnceLock<Arc<RowCentroids>>,
    queued: AtomicBool,
}

impl CentroidSlot {
    /// The rows' centroids under `model`, if they have been assigned with it.
    pub fn get(&self, model: &Arc<IvfModel>) -> Option<&RowCentroids> {
        self.assigned
            .get()
            .map(Arc::as_ref)
            .filter(|rows| rows.is_for(model))
    }

    /// Stores assignments made now (tests, and callers that assign in place).
    pub fn set(&self, rows: RowCentroids) {
        let _ = self.assigned.set(Arc::new(rows));
    }

    /// Whether assignments (under any model) are held.
    pub fn is_set(&self) -> bool {
        self.assigned.get().is_some()
    }
}

impl Clone for CentroidSlot {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for CentroidSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for CentroidSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CentroidSlot")
            .field("assigned", &self.assigned.get().map(|r| r.len()))
            .finish()
    }
}

/// What the thread assigns: a cached column's rows, and the slot their centroids go in.
/// (The cache's vector column implements it; this module does not know the cache.)
pub trait AssignableRows: Send + Sync + 'static {
    /// Where the assignments are kept.
    fn slot(&self) -> &CentroidSlot;
    /// The rows' centroids under `model` (see [`RowCentroids::compute`]).
    fn assign(&self, model: &Arc<IvfModel>) -> Option<RowCentroids>;
}

struct Job {
    rows: Weak<dyn AssignableRows>,
    model: Arc<IvfModel>,
}

/// Asks the background thread to assign `rows` under `model`, unless they are assigned
/// (under any model: a column keeps the first model's assignments) or queued.
pub fn request<R: AssignableRows>(rows: &Arc<R>, model: &Arc<IvfModel>) {
    let slot = rows.slot();
    if slot.is_set() || slot.queued.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak: Weak<R> = Arc::downgrade(rows);
    let job = Job {
        rows: weak as Weak<dyn AssignableRows>,
        model: model.clone(),
    };
    match sender().try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            slot.queued.store(false, Ordering::Release);
        }
    }
}

/// The queue of the process's one assigning thread, started on first use.
fn sender() -> &'static SyncSender<Job> {
    static SENDER: OnceLock<SyncSender<Job>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUE);
        let started = std::thread::Builder::new()
            .name("fragvec-row-centroids".into())
            .spawn(move || assign_forever(rx));
        // Without the thread, requests fail once the queue is full and nothing is skipped.
        drop(started);
        tx
    })
}

fn assign_forever(jobs: Receiver<Job>) {
    crate::index::parallel::lower_this_thread_priority();
    while let Ok(job) = jobs.recv() {
        let Some(rows) = job.rows.upgrade() else {
            continue;
        };
        // A model without bounds leaves the slot empty and queued: never asked again.
        if let Some(assigned) = rows.assign(&job.model) {
            rows.slot().set(assigned);
        }
    }
}

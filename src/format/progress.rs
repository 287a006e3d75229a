//! Progress of long statements (CREATE VECTOR INDEX, OPTIMIZE INDEX, COMPACT, RECLUSTER,
//! INSERT ... SELECT, VACUUM), reported to a [`ProgressSink`] an embedder provides: the CLI
//! draws bars with it, a service could export it as metrics.
//!
//! A statement's work is a sequence of named *phases* ("reading vectors", "k-means",
//! "assigning rows", ...). Each phase starts with a total when one is known (rows, files,
//! iterations), advances by the units done, and finishes exactly once, also when the statement
//! fails or stops early (k-means that converged before its last iteration), so `done` may end
//! below `total` but never above it. Every phase has an id of its own, so a sink shared by
//! statements running at the same time can tell their phases apart.
//!
//! The handles are cheap to clone and do nothing when no sink is set, so the code of long
//! operations reports unconditionally. This module lives in the format layer, the lowest one
//! with long operations (VACUUM), so every layer above can report through it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Receives the progress of long operations. Called from the threads doing the work, so
/// implementations must be quick (no blocking IO).
pub trait ProgressSink: Send + Sync {
    /// Phase `id` named `name` begins; `total` units of work when known.
    fn start(&self, id: u64, name: &str, total: Option<u64>);
    /// `n` more units of phase `id` are done.
    fn advance(&self, id: u64, n: u64);
    /// Phase `id` ended (completed, stopped early, or its statement failed). Called once.
    fn finish(&self, id: u64);
}

/// Where a statement reports progress: a sink, or nowhere. Cheap to clone.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<dyn ProgressSink>>,
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field("reporting", &self.sink.is_some())
            .finish()
    }
}

/// Ids of phases, unique in the process.
static NEXT_PHASE: AtomicU64 = AtomicU64::new(1);

impl Progress {
    /// Reports to `sink`.
    pub fn to(sink: Arc<dyn ProgressSink>) -> Self {
        Self { sink: Some(sink) }
    }

    /// Reports nowhere.
    pub fn none() -> Self {
        Self::default()
    }

    /// Starts a phase; it finishes when [`Phase::finish`] is called or its last clone drops.
    pub fn phase(&self, name: &str, total: Option<u64>) -> Phase {
        let Some(sink) = &self.sink else {
            return Phase(None);
        };
        let id = NEXT_PHASE.fetch_add(1, Ordering::Relaxed);
        sink.start(id, name, total);
        Phase(Some(Arc::new(PhaseState {
            sink: sink.clone(),
            id,
            finished: AtomicBool::new(false),
        })))
    }
}

/// One running phase. Clones share it (parallel workers advance the same phase); it finishes
/// once, at [`Phase::finish`] or when the last clone drops.
#[derive(Clone)]
pub struct Phase(Option<Arc<PhaseState>>);

struct PhaseState {
    sink: Arc<dyn ProgressSink>,
    id: u64,
    finished: AtomicBool,
}

impl PhaseState {
    fn finish(&self) {
        if !self.finished.swap(true, Ordering::AcqRel) {
            self.sink.finish(self.id);
        }
    }
}

impl Drop for PhaseState {
    fn drop(&mut self) {
        self.finish();
    }
}

impl fmt::Debug for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Phase")
            .field(&self.0.as_ref().map(|s| s.id))
            .finish()
    }
}

impl Phase {
    /// A phase reporting nowhere.
    pub fn none() -> Self {
        Phase(None)
    }

    /// `n` more units are done.
    pub fn advance(&self, n: u64) {
        if let Some(s) = &self.0
            && n > 0
            && !s.finished.load(Ordering::Acquire)
        {
            s.sink.advance(s.id, n);
        }
    }

    /// Ends the phase now (later advances are ignored).
    pub fn finish(&self) {
        if let Some(s) = &self.0 {
            s.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl ProgressSink for Log {
        fn start(&self, _: u64, name: &str, total: Option<u64>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("start {name} {total:?}"));
        }
        fn advance(&self, _: u64, n: u64) {
            self.0.lock().unwrap().push(format!("advance {n}"));
        }
        fn finish(&self, _: u64) {
            self.0.lock().unwrap().push("finish".into());
        }
    }

    #[test]
    fn a_phase_finishes_once_when_its_last_clone_drops() {
        let log = Arc::new(Log::default());
        let progress = Progress::to(log.clone());
        let phase = progress.phase("rows", Some(3));
        let worker = phase.clone();
        worker.advance(2);
        phase.advance(0);
        drop(phase);
        worker.advance(1);
        drop(worker);
        assert_eq!(
            *log.0.lock().unwrap(),
            ["start rows Some(3)", "advance 2", "advance 1", "finish"]
        );
    }

    #[test]
    fn an_explicit_finish_ends_reports() {
        let log = Arc::new(Log::default());
        let phase = Progress::to(log.clone()).phase("k-means", None);
        phase.finish();
        phase.advance(1);
        phase.finish();
        drop(phase);
        assert_eq!(*log.0.lock().unwrap(), ["start k-means None", "finish"]);
    }

    #[test]
    fn without_a_sink_nothing_happens() {
        let phase = Progress::none().phase("x", Some(1));
        phase.advance(5);
        phase.finish();
        assert!(format!("{phase:?}").contains("None"));
    }
}

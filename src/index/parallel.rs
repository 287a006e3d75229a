//! Splitting one query's scoring over the cores: how many there are, and running shares of
//! work side by side with the calling thread taking one of them.
//!
//! A query runs on one thread of the async runtime; scoring a few megabytes of vectors is
//! the part of it worth spreading. Scoped threads need no `'static` data, and the calling
//! thread works instead of waiting, so two cores give two workers, not one worker and a
//! waiter.

use std::sync::OnceLock;

/// The cores this process may use, read once: `available_parallelism` reads the cgroup's
/// files on every call, which costs more than a small query's scoring.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |p| p.get()))
}

/// Nice 10 for the calling thread (Linux applies nice per thread), so that background work
/// (maintenance, assigning rows to centroids) yields the cores to queries; best effort.
pub fn lower_this_thread_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

tokio::task_local! {
    /// Threads an index build may use in the current task (maintenance caps it with
    /// `fragvec.maintenance_threads`, so that it leaves the other cores to queries).
    static BUILD_THREADS: usize;
}

/// Threads an index build (k-means, assigning rows) uses: the task's cap when it runs under
/// [`with_build_threads`], else every core.
pub fn build_threads() -> usize {
    BUILD_THREADS
        .try_with(|n| *n)
        .unwrap_or_else(|_| std::thread::available_parallelism().map_or(1, |p| p.get()))
        .max(1)
}

/// Runs `work` with index builds inside it capped at `threads` threads.
pub async fn with_build_threads<F: std::future::Future>(threads: usize, work: F) -> F::Output {
    BUILD_THREADS.scope(threads.max(1), work).await
}

/// Runs `work` on every share, the first on the calling thread and each other on a thread
/// of its own; the results come back in share order. A panic in a share is raised again on
/// the calling thread.
pub fn run_shares<S, R, F>(shares: &[S], work: F) -> Vec<R>
where
    S: Sync,
    R: Send,
    F: Fn(&S) -> R + Sync,
{
    let Some((first, rest)) = shares.split_first() else {
        return Vec::new();
    };
    if rest.is_empty() {
        return vec![work(first)];
    }
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = rest
            .iter()
            .map(|share| scope.spawn(move || work(share)))
            .collect();
        let mut out = Vec::with_capacity(shares.len());
        out.push(work(first));
        for h in handles {
            out.push(
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        out
    })
}

/// Queries spreading their scoring over threads right now (see [`claim_each`]).
static SPREADING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Client messages a server is handling right now (see [`handling_a_message`]).
static HANDLING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Held by a server's connection while it handles a client's message (parses, plans, runs
/// and answers a statement), dropped while it waits for the next one.
#[must_use = "the count drops when this is dropped"]
pub struct HandlingAMessage(());

/// Counts a message being handled until the returned guard drops. A query that finds other
/// connections busy does not start threads for its scoring: those connections' work (their
/// own searches, planning, sending rows) keeps the other cores busy, and a query counted
/// only while it scores (`SPREADING`) misses them — at 4 connections on 2 cores threads
/// were still started for most queries, at 6% of the server's time (perf, docs/benchmarks.md).
pub fn handling_a_message() -> HandlingAMessage {
    HANDLING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    HandlingAMessage(())
}

impl Drop for HandlingAMessage {
    fn drop(&mut self) {
        HANDLING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Other work keeping cores busy, as a query about to spread sees it: the queries
/// spreading besides it, or the other connections handling a message (its own is one of
/// `handling`, when it came through a server).
fn others_busy(spreading_others: usize, handling: usize) -> usize {
    spreading_others.max(handling.saturating_sub(1))
}

/// The workers a query may spread over now, of the `wanted`: as many as there are cores no
/// other query is spreading on. Alone, a query uses every core; under load each query is
/// already a unit of parallelism, and starting threads for cores that other queries keep
/// busy only adds thread starts and switches to every query (measured: `fragvec serve` at
/// 4 and 16 connections, docs/benchmarks.md).
fn workers_now(wanted: usize, others: usize) -> usize {
    wanted.min(cores().saturating_sub(others)).max(1)
}

/// Runs `work` on every item with up to `threads` workers (the calling thread is one), each
/// claiming the next unclaimed item and folding it into its own accumulator from `init`;
/// returns the accumulators (the calling thread's first). A worker that starts late, on a
/// busy machine, finds less or nothing left: the calling thread never waits for its share.
pub fn claim_each<T, A, I, F>(items: &[T], threads: usize, init: I, work: F) -> Vec<A>
where
    T: Sync,
    A: Send,
    I: Fn() -> A + Sync,
    F: Fn(&mut A, &T) + Sync,
{
    let next = std::sync::atomic::AtomicUsize::new(0);
    let worker = || {
        let mut acc = init();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return acc;
            };
            work(&mut acc, item);
        }
    };
    use std::sync::atomic::Ordering::Relaxed;
    let others = SPREADING.fetch_add(1, Relaxed);
    // Decremented however this returns (a share's panic is raised again below).
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            SPREADING.fetch_sub(1, Relaxed);
        }
    }
    let _done = Done;
    let threads = workers_now(threads, others_busy(others, HANDLING.load(Relaxed)));
    let helpers = threads.clamp(1, items.len().max(1)) - 1;
    run_shares(&vec![(); helpers + 1], |_| worker())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_run_in_order_and_a_panic_reaches_the_caller() {
        let got = run_shares(&[1, 2, 3, 4], |x| x * 10);
        assert_eq!(got, vec![10, 20, 30, 40]);
        assert!(run_shares(&[] as &[u8], |x| *x).is_empty());
        let caught = std::panic::catch_unwind(|| {
            run_shares(&[1, 2], |x| {
                assert!(*x != 2, "share two fails");
                *x
            })
        });
        assert!(caught.is_err());
    }

    #[test]
    fn a_query_alone_uses_every_core_and_under_load_fewer() {
        let n = cores();
        assert_eq!(workers_now(n, 0), n);
        assert_eq!(workers_now(1, 0), 1);
        assert_eq!(workers_now(n, n - 1), 1);
        assert_eq!(workers_now(n, n + 5), 1);
        assert_eq!(workers_now(0, 0), 1);
        // In process, no server: only spreading queries count.
        assert_eq!(others_busy(0, 0), 0);
        assert_eq!(others_busy(2, 0), 2);
        // Through a server: its own connection is not another.
        assert_eq!(others_busy(0, 1), 0);
        assert_eq!(others_busy(0, 4), 3);
        assert_eq!(others_busy(1, 3), 2);
        let guard = handling_a_message();
        assert!(HANDLING.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        drop(guard);
    }

    #[test]
    fn every_item_is_claimed_once() {
        for threads in 1..5 {
            let items: Vec<u64> = (0..100).collect();
            let sums = claim_each(&items, threads, Vec::new, |acc: &mut Vec<u64>, x| {
                acc.push(*x)
            });
            assert!(sums.len() <= threads);
            let mut all: Vec<u64> = sums.into_iter().flatten().collect();
            all.sort_unstable();
            assert_eq!(all, items);
        }
        assert_eq!(claim_each(&[] as &[u8], 3, || 0, |_, _| {}), vec![0]);
    }
}

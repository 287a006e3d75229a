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

/// Splits `weights` (in order) into at most `shares` contiguous ranges of about equal total
/// weight, none empty; no ranges for no items.
pub fn balanced_ranges(weights: &[usize], shares: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = weights.iter().sum();
    let shares = shares.clamp(1, weights.len().max(1));
    let mut out = Vec::with_capacity(shares);
    let mut start = 0;
    let mut acc = 0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        // Close the share once it holds its part of the total (the last share takes the rest).
        let target = total * (out.len() + 1) / shares;
        if acc >= target && out.len() + 1 < shares && i + 1 < weights.len() {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < weights.len() {
        out.push(start..weights.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    proptest! {
        /// The ranges cover every item once, in order, none empty, at most `shares` of
        /// them, and no share is heavier than its fair part plus one item.
        #[test]
        fn prop_balanced_ranges_partition_the_items(
            weights in proptest::collection::vec(0usize..1000, 0..40),
            shares in 1usize..6,
        ) {
            let ranges = balanced_ranges(&weights, shares);
            let mut next = 0;
            for r in &ranges {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end > r.start);
                next = r.end;
            }
            prop_assert_eq!(next, weights.len());
            prop_assert!(ranges.len() <= shares.max(1));
            let total: usize = weights.iter().sum();
            let heaviest = weights.iter().copied().max().unwrap_or(0);
            // More shares than items: one item per share at most.
            let used = shares.min(weights.len()).max(1);
            for r in &ranges[..ranges.len().saturating_sub(1)] {
                let w: usize = weights[r.clone()].iter().sum();
                prop_assert!(w <= total / used + heaviest + 1);
            }
        }
    }
}

//! Routing rows of a stable partition (RECLUSTER): destination boundaries from key quantiles.
//!
//! Destinations are ordered by key range. The boundaries are keys of the rows themselves,
//! taken at evenly spaced ranks of the sorted keys, so each destination holds about the same
//! number of rows; a row goes to the destination whose range holds its key. Equal keys always
//! land in one destination (a boundary is a key value, and every row with that value goes to
//! its right), so a destination may exceed its share when one key is very frequent. Every
//! destination is non-empty. Pure arithmetic, no IO.

/// Boundaries for at most `min(destinations, distinct keys)` destinations (fewer when a few
/// keys hold most rows) over `keys` (any order): destination
/// `d` holds keys in `[boundaries[d - 1], boundaries[d])`, with open ends. Ascending and
/// distinct; `boundaries.len() + 1` destinations, each non-empty.
pub fn boundaries<T: Ord + Clone>(keys: &[T], destinations: usize) -> Vec<T> {
    if keys.is_empty() || destinations <= 1 {
        return vec![];
    }
    let mut sorted: Vec<&T> = keys.iter().collect();
    sorted.sort_unstable();
    let n = sorted.len();
    let mut out: Vec<T> = Vec::with_capacity(destinations - 1);
    for d in 1..destinations.min(n) {
        let mut candidate = sorted[d * n / destinations];
        // Every destination must get a key of its own: past the previous boundary (or the
        // smallest key, which opens destination 0), take the next larger key instead.
        let floor = out.last().unwrap_or(sorted[0]);
        if candidate <= floor {
            let next = sorted.partition_point(|k| *k <= floor);
            let Some(k) = sorted.get(next) else { break };
            candidate = k;
        }
        out.push(candidate.clone());
    }
    out
}

/// The destination of `key`.
pub fn destination<T: Ord>(boundaries: &[T], key: &T) -> usize {
    boundaries.partition_point(|b| b <= key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn even_split_and_equal_keys_together() {
        let keys: Vec<u32> = (0..100).collect();
        let b = boundaries(&keys, 4);
        assert_eq!(b, vec![25, 50, 75]);
        let skewed = [1, 1, 1, 1, 1, 1, 2, 3];
        let b = boundaries(&skewed, 4);
        assert_eq!(b, vec![2, 3]);
        assert_eq!(destination(&b, &1), 0);
        assert_eq!(destination(&b, &2), 1);
        assert_eq!(destination(&b, &3), 2);
        assert!(boundaries(&[7, 7, 7], 3).is_empty());
        assert!(boundaries::<u8>(&[], 3).is_empty());
    }

    proptest! {
        #[test]
        fn destinations_are_ordered_non_empty_and_keep_equal_keys(
            keys in prop::collection::vec(0u16..50, 0..300),
            m in 1usize..20,
        ) {
            let b = boundaries(&keys, m);
            prop_assert!(b.len() < m.max(1));
            prop_assert!(b.windows(2).all(|w| w[0] < w[1]));
            let mut counts = vec![0usize; b.len() + 1];
            let mut ranges: Vec<Option<(u16, u16)>> = vec![None; b.len() + 1];
            for k in &keys {
                let d = destination(&b, k);
                counts[d] += 1;
                let r = ranges[d].get_or_insert((*k, *k));
                r.0 = r.0.min(*k);
                r.1 = r.1.max(*k);
            }
            if !keys.is_empty() {
                prop_assert!(counts.iter().all(|c| *c > 0));
                let distinct: std::collections::BTreeSet<u16> = keys.iter().copied().collect();
                // Skewed keys may leave fewer destinations than asked, never more, and more
                // than one whenever there are two keys to split.
                prop_assert!(b.len() < m.min(distinct.len()).max(1));
                if m > 1 && distinct.len() > 1 {
                    prop_assert!(!b.is_empty());
                }
            }
            // Key ranges of destinations do not overlap.
            let ranges: Vec<(u16, u16)> = ranges.into_iter().flatten().collect();
            prop_assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}

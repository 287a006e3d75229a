//! The k-means training sample of an index build: a seeded *bottom-k* sample, so a build that
//! holds every vector and a build that streams them train on the same rows.
//!
//! Every row gets a key, a seeded bijective hash of its row address ([`sample_key`]); the
//! sample of size `k` is the `k` rows with the smallest keys, listed in stream order (the order
//! they were offered). It is uniform over the rows, depends only on [`SEED`] and the set of
//! addresses, not on how the rows were batched or on the number of rows, which a streaming
//! build only knows at the end of its pass.
//!
//! Invariants: a [`BottomK`] of capacity `K` keeps the `K` smallest keys offered so far; for
//! any `k ≤ K`, [`BottomK::into_sample`]`(k)` equals the bottom-`k` of the whole stream (the
//! `k` smallest keys are among the `K` smallest). So a streaming build keeps an upper bound of
//! the sample size while it reads and cuts down once it knows the row count.
//!
//! Caller guarantees: addresses are distinct (row addresses are) and every vector has `dim`
//! floats. Memory: `K × (4·dim + 24)` bytes at most; nothing is allocated up front.

use std::collections::BinaryHeap;

/// Seed of every index build's random choices: this sample's keys and the k-means runs
/// (`build::SEED`), so builds are reproducible.
pub const SEED: u64 = 0x5eed_f4a9;

/// The sample key of the row at `addr`: SplitMix64's finaliser of `addr ^ SEED`, a bijection,
/// so distinct rows never tie.
pub fn sample_key(addr: u64) -> u64 {
    let mut z = (addr ^ SEED).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rows with the `capacity` smallest sample keys among those offered.
#[derive(Debug)]
pub struct BottomK {
    dim: usize,
    capacity: usize,
    /// (key, slot), the largest key on top: the row to evict.
    heap: BinaryHeap<(u64, usize)>,
    /// Per slot: the stream position of the row held there.
    positions: Vec<u64>,
    /// Per slot: `dim` floats.
    values: Vec<f32>,
    offered: u64,
}

impl BottomK {
    /// An empty sample keeping at most `capacity` rows of `dim` floats.
    pub fn new(capacity: usize, dim: usize) -> Self {
        Self {
            dim,
            capacity,
            heap: BinaryHeap::new(),
            positions: Vec::new(),
            values: Vec::new(),
            offered: 0,
        }
    }

    /// Offers the next row of the stream.
    pub fn offer(&mut self, addr: u64, vector: &[f32]) {
        let position = self.offered;
        self.offered += 1;
        if self.capacity == 0 || vector.len() != self.dim {
            return;
        }
        let key = sample_key(addr);
        if self.heap.len() < self.capacity {
            let slot = self.positions.len();
            self.positions.push(position);
            self.values.extend_from_slice(vector);
            self.heap.push((key, slot));
            return;
        }
        let Some(mut top) = self.heap.peek_mut() else {
            return;
        };
        if key < top.0 {
            let slot = top.1;
            *top = (key, slot);
            self.positions[slot] = position;
            self.values[slot * self.dim..(slot + 1) * self.dim].copy_from_slice(vector);
        }
    }

    /// Rows offered so far.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Bytes held (vectors, positions, heap entries).
    pub fn bytes(&self) -> usize {
        self.values.capacity() * 4 + self.positions.capacity() * 8 + self.heap.capacity() * 16
    }

    /// The rows with the `k` smallest keys (all rows held, when fewer), as a flat `n × dim`
    /// matrix in stream order.
    pub fn into_sample(self, k: usize) -> Vec<f32> {
        self.sample(k)
    }

    /// [`Self::into_sample`] without giving up the rows: a smaller sample of the same rows
    /// is the first rows of a larger one by key, so one pass can serve both.
    pub fn sample(&self, k: usize) -> Vec<f32> {
        let mut kept: Vec<(u64, usize)> = self.heap.iter().copied().collect();
        kept.sort_unstable();
        kept.truncate(k);
        let mut slots: Vec<usize> = kept.into_iter().map(|(_, slot)| slot).collect();
        slots.sort_unstable_by_key(|&slot| self.positions[slot]);
        let dim = self.dim;
        let mut out = Vec::with_capacity(slots.len() * dim);
        for slot in slots {
            out.extend_from_slice(&self.values[slot * dim..(slot + 1) * dim]);
        }
        out
    }
}

/// The keys of the rows a [`BottomK`] of `capacity` would keep, without their vectors (8
/// bytes a row): which rows a sample of that size holds can then be told in a later pass
/// over the same rows, by [`KeyBound::bound`].
#[derive(Debug)]
pub struct KeyBound {
    capacity: usize,
    heap: BinaryHeap<u64>,
}

impl KeyBound {
    /// An empty bound for a sample of `capacity` rows.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            heap: BinaryHeap::new(),
        }
    }

    /// Offers the row at address `addr`: its [`sample_key`] is kept while among the
    /// `capacity` smallest offered.
    pub fn offer(&mut self, addr: u64) {
        if self.capacity == 0 {
            return;
        }
        let key = sample_key(addr);
        if self.heap.len() < self.capacity {
            self.heap.push(key);
        } else if let Some(mut top) = self.heap.peek_mut()
            && key < *top
        {
            *top = key;
        }
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.heap.capacity() * 8
    }

    /// The largest key among the `k` smallest offered (`u64::MAX` when fewer were offered,
    /// `None` for `k = 0`): a row is among a `k`-row sample exactly when
    /// `sample_key(addr) <= bound`. `k` must not exceed the capacity.
    pub fn bound(&self, k: usize) -> Option<u64> {
        if k == 0 {
            return None;
        }
        let mut keys = self.heap.clone().into_sorted_vec();
        if keys.len() < k {
            return Some(u64::MAX);
        }
        keys.truncate(k);
        keys.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious bottom-k: key every row, sort by key, keep `k`, put back in stream order.
    fn reference(rows: &[(u64, Vec<f32>)], k: usize) -> Vec<f32> {
        let mut keyed: Vec<(u64, usize)> = rows
            .iter()
            .enumerate()
            .map(|(i, (addr, _))| (sample_key(*addr), i))
            .collect();
        keyed.sort();
        keyed.truncate(k);
        let mut picked: Vec<usize> = keyed.into_iter().map(|(_, i)| i).collect();
        picked.sort();
        picked.into_iter().flat_map(|i| rows[i].1.clone()).collect()
    }

    proptest! {
        #[test]
        fn a_key_bound_tells_the_rows_of_a_sample(
            addrs in prop::collection::hash_set(any::<u64>(), 0..200),
            capacity in 0usize..80, k in 0usize..80,
        ) {
            let k = k.min(capacity);
            let addrs: Vec<u64> = addrs.into_iter().collect();
            let mut bound = KeyBound::new(capacity);
            let mut sample = BottomK::new(k, 1);
            for a in &addrs {
                bound.offer(*a);
                sample.offer(*a, &[*a as f32]);
            }
            let kept = sample.into_sample(k);
            let told: Vec<f32> = match bound.bound(k) {
                None => vec![],
                Some(b) => addrs.iter().filter(|a| sample_key(**a) <= b).map(|a| *a as f32).collect(),
            };
            prop_assert_eq!(told, kept);
        }
    }

    #[test]
    fn sample_keeps_the_smallest_keys_in_stream_order() {
        let rows: Vec<(u64, Vec<f32>)> = (0..6u64).map(|a| (a << 32 | 7, vec![a as f32])).collect();
        let mut keys: Vec<(u64, f32)> = rows.iter().map(|(a, v)| (sample_key(*a), v[0])).collect();
        keys.sort_by_key(|k| k.0);
        let mut expected: Vec<f32> = keys[..3].iter().map(|k| k.1).collect();
        expected.sort_by(f32::total_cmp);
        let mut sample = BottomK::new(4, 1);
        for (a, v) in &rows {
            sample.offer(*a, v);
        }
        assert_eq!(sample.offered(), 6);
        assert_eq!(sample.into_sample(3), expected);
    }

    #[test]
    fn fewer_rows_than_the_sample_are_all_kept_in_order() {
        let mut sample = BottomK::new(10, 2);
        for a in [5u64, 1, 9] {
            sample.offer(a, &[a as f32, 0.0]);
        }
        assert_eq!(sample.into_sample(10), vec![5.0, 0.0, 1.0, 0.0, 9.0, 0.0]);
    }

    #[test]
    fn sample_key_is_a_bijection_on_a_stride() {
        let keys: std::collections::HashSet<u64> =
            (0..10_000u64).map(|i| sample_key(i << 32)).collect();
        assert_eq!(keys.len(), 10_000);
    }

    proptest! {
        /// A sample cut down from a larger capacity is the bottom-k of the whole stream: the
        /// streaming build (capacity from an upper bound of the rows) and the in-memory build
        /// (capacity exactly k) train on the same rows. If this fails, the two builds of one
        /// table produce different indexes.
        #[test]
        fn prop_bottom_k_matches_reference_for_any_capacity_at_least_k(
            addrs in prop::collection::hash_set(prop_oneof![0u64..64, any::<u64>()], 0..120),
            k in 0usize..40,
            extra in 0usize..40,
        ) {
            let rows: Vec<(u64, Vec<f32>)> =
                addrs.into_iter().map(|a| (a, vec![a as f32, (a >> 32) as f32])).collect();
            let mut sample = BottomK::new(k + extra, 2);
            for (a, v) in &rows {
                sample.offer(*a, v);
            }
            prop_assert_eq!(sample.offered(), rows.len() as u64);
            prop_assert_eq!(sample.into_sample(k), reference(&rows, k));
        }
    }
}

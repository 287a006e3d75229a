//! Reading several byte ranges of one object: ranges closer than a gap are merged into one
//! request, and the requests are sent concurrently. On object storage a request costs
//! 10–50 ms however small it is, while a few extra KiB cost microseconds; reading more than
//! needed costs transfer time on one connection, so the gap is small ([`COALESCE_GAP`], not
//! `object_store`'s 1 MiB default) and the merged requests overlap instead.
//!
//! [`coalesce`] is the pure part; [`read_ranges`] does the IO.

use std::ops::Range;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

/// Ranges whose gap is at most this many bytes are read with one request.
pub const COALESCE_GAP: u64 = 64 * 1024;

/// Requests [`read_ranges`] keeps in flight at once.
pub const CONCURRENT_REQUESTS: usize = 16;

/// The requests that cover `ranges`: sorted, overlapping or adjacent ranges and those at
/// most `gap` bytes apart merged. Empty ranges ask for nothing.
pub fn coalesce(ranges: &[Range<u64>], gap: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(gap) => {
                last.end = last.end.max(r.end);
            }
            _ => merged.push(r),
        }
    }
    merged
}

/// Reads `ranges` of `path`, each returned in order: close ranges coalesced
/// ([`coalesce`] with [`COALESCE_GAP`]), the requests sent concurrently (at most
/// [`CONCURRENT_REQUESTS`] at a time).
pub async fn read_ranges(
    store: &dyn ObjectStore,
    path: &Path,
    ranges: &[Range<u64>],
) -> object_store::Result<Vec<Bytes>> {
    let requests = coalesce(ranges, COALESCE_GAP);
    let fetched: Vec<(Range<u64>, Bytes)> = futures::stream::iter(requests)
        .map(|r| async move {
            let bytes = store.get_range(path, r.clone()).await?;
            Ok::<_, object_store::Error>((r, bytes))
        })
        .buffered(CONCURRENT_REQUESTS)
        .try_collect()
        .await?;
    ranges
        .iter()
        .map(|r| {
            if r.start >= r.end {
                return Ok(Bytes::new());
            }
            let i = fetched.partition_point(|(f, _)| f.start <= r.start) - 1;
            let (f, bytes) = &fetched[i];
            let start = (r.start - f.start) as usize;
            let end = (r.end - f.start) as usize;
            if end > bytes.len() {
                // The store returned less than asked (the object is shorter).
                return Ok(bytes.slice(start.min(bytes.len())..));
            }
            Ok(bytes.slice(start..end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::metered_store::MeteredStore;
    use object_store::PutPayload;
    use object_store::memory::InMemory;
    use proptest::prelude::*;
    use std::sync::Arc;

    #[test]
    fn close_ranges_merge_and_far_ones_do_not() {
        let r = coalesce(
            &[
                200..300,
                0..100,
                100..150,
                90..120,
                400..401,
                5000..6000,
                7..7,
            ],
            100,
        );
        assert_eq!(r, vec![0..401, 5000..6000]);
        assert!(coalesce(&[], 100).is_empty());
        assert_eq!(coalesce(&[0..10, 11..20], 0), vec![0..10, 11..20]);
    }

    proptest! {
        /// Every requested byte is covered, requests are sorted and more than `gap` apart,
        /// and no request reads a byte farther than `gap` from a requested one.
        #[test]
        fn prop_coalesced_requests_cover_exactly_what_is_needed(
            ranges in proptest::collection::vec((0u64..2000, 0u64..200), 0..20),
            gap in 0u64..300,
        ) {
            let ranges: Vec<Range<u64>> = ranges.into_iter().map(|(s, l)| s..s + l).collect();
            let requests = coalesce(&ranges, gap);
            for r in ranges.iter().filter(|r| r.start < r.end) {
                prop_assert!(requests.iter().any(|q| q.start <= r.start && r.end <= q.end));
            }
            for w in requests.windows(2) {
                prop_assert!(w[0].end + gap < w[1].start);
            }
            for q in &requests {
                prop_assert!(ranges.iter().any(|r| r.start == q.start));
                prop_assert!(ranges.iter().any(|r| r.end == q.end));
            }
        }
    }

    #[tokio::test]
    async fn reads_return_each_range_with_one_request_per_coalesced_run() {
        let inner = Arc::new(InMemory::new());
        let store = MeteredStore::new(inner);
        let path = Path::from("a");
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        store
            .put(&path, PutPayload::from(data.clone()))
            .await
            .unwrap();
        let ranges = [10..20, 500_000..500_100, 30..40, 0..0, 999_990..1_000_000];
        let before = store.round_trips();
        let got = read_ranges(&store, &path, &ranges).await.unwrap();
        for (r, bytes) in ranges.iter().zip(&got) {
            assert_eq!(bytes.as_ref(), &data[r.start as usize..r.end as usize]);
        }
        assert_eq!(store.round_trips().since(&before).range_gets, 3);
    }
}

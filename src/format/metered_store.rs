//! [`MeteredStore`]: an `ObjectStore` wrapper that counts requests by kind and the bytes they
//! move, and can add a fixed latency to every request. On real object storage each request
//! costs 10–50 ms however small it is, so the request count of a statement, not its bytes,
//! decides its latency there; `examples/s3_round_trips.rs` prints these counts per statement.
//!
//! What counts as one request is what an S3 client sends: a GET of a whole object, a GET of
//! one range (counted apart: [`RoundTrips::range_gets`]),
//! a HEAD, a PUT (a whole object, or one part of a multipart upload, plus one request each to
//! start and complete it), a LIST page (1,000 keys), a DELETE, a COPY. Several ranges read
//! with `get_ranges` are the store's default coalescing, each coalesced range one GET, as
//! `object_store`'s S3 client does (the local file system would serve them from one open
//! file, which would hide them).
//!
//! With [`MeteredStore::trace`] on, each request is also written to a log
//! ([`MeteredStore::take_trace`]): its kind, path and range, to see which requests a
//! statement makes.
//!
//! The latency is a sleep before each request is sent (before each page of a listing, each
//! part of an upload), so concurrent requests overlap their latencies as they would on a
//! network. It can be changed while the store is in use.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

/// Keys an S3 LIST request returns per page.
const LIST_PAGE: u64 = 1000;

/// Requests and bytes counted by a [`MeteredStore`] (or the difference of two readings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips {
    /// GETs of whole objects.
    pub gets: u64,
    /// GETs of one byte range.
    pub range_gets: u64,
    /// HEAD requests (metadata only, no body).
    pub heads: u64,
    /// PUT requests: single puts, plus each multipart upload's start, parts and completion.
    pub puts: u64,
    /// LIST requests, one per page of up to 1000 keys as S3 pages them.
    pub lists: u64,
    /// DELETE requests, one per object (an aborted multipart upload counts one).
    pub deletes: u64,
    /// COPY requests.
    pub copies: u64,
    /// Body bytes received by GETs (whole and ranged).
    pub bytes_read: u64,
    /// Payload bytes sent by PUTs and upload parts.
    pub bytes_written: u64,
}

impl RoundTrips {
    /// Every request, of any kind.
    pub fn requests(&self) -> u64 {
        self.gets
            + self.range_gets
            + self.heads
            + self.puts
            + self.lists
            + self.deletes
            + self.copies
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &RoundTrips) -> RoundTrips {
        RoundTrips {
            gets: self.gets - earlier.gets,
            range_gets: self.range_gets - earlier.range_gets,
            heads: self.heads - earlier.heads,
            puts: self.puts - earlier.puts,
            lists: self.lists - earlier.lists,
            deletes: self.deletes - earlier.deletes,
            copies: self.copies - earlier.copies,
            bytes_read: self.bytes_read - earlier.bytes_read,
            bytes_written: self.bytes_written - earlier.bytes_written,
        }
    }
}

impl fmt::Display for RoundTrips {
    /// `12 requests (get 9, head 2, put 1), 31.5 KiB read, 1.2 KiB written`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds = [
            ("get", self.gets),
            ("range get", self.range_gets),
            ("head", self.heads),
            ("put", self.puts),
            ("list", self.lists),
            ("delete", self.deletes),
            ("copy", self.copies),
        ];
        let parts: Vec<String> = kinds
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        write!(f, "{} requests", self.requests())?;
        if !parts.is_empty() {
            write!(f, " ({})", parts.join(", "))?;
        }
        write!(
            f,
            ", {:.1} KiB read, {:.1} KiB written",
            self.bytes_read as f64 / 1024.0,
            self.bytes_written as f64 / 1024.0
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    range_gets: AtomicU64,
    heads: AtomicU64,
    puts: AtomicU64,
    lists: AtomicU64,
    deletes: AtomicU64,
    copies: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// Added latency per request, in microseconds.
    latency_us: AtomicU64,
    /// Requests logged while tracing is on.
    trace: std::sync::Mutex<Option<Vec<String>>>,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn log(&self, request: impl FnOnce() -> String) {
        if let Some(log) = self.trace.lock().expect("trace").as_mut() {
            log.push(request());
        }
    }

    async fn delay(&self) {
        let us = self.latency_us.load(Ordering::Relaxed);
        if us > 0 {
            tokio::time::sleep(Duration::from_micros(us)).await;
        }
    }
}

/// Counts the requests made to `inner` and delays each by a configurable latency.
#[derive(Debug, Clone)]
pub struct MeteredStore {
    inner: Arc<dyn ObjectStore>,
    counters: Arc<Counters>,
}

impl MeteredStore {
    /// A store that forwards every request to `inner` and counts it, with no added latency
    /// at first.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            counters: Arc::default(),
        }
    }

    /// The latency added to every request from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.counters
            .latency_us
            .store(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// Starts (or stops) logging each request.
    pub fn trace(&self, on: bool) {
        *self.counters.trace.lock().expect("trace") = on.then(Vec::new);
    }

    /// The requests logged since tracing started or the last call, one line each
    /// (`GET range 0..16 t/_indexes/i/x.seg`).
    pub fn take_trace(&self) -> Vec<String> {
        self.counters
            .trace
            .lock()
            .expect("trace")
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The counts so far (subtract an earlier reading with [`RoundTrips::since`]).
    pub fn round_trips(&self) -> RoundTrips {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RoundTrips {
            gets: get(&c.gets),
            range_gets: get(&c.range_gets),
            heads: get(&c.heads),
            puts: get(&c.puts),
            lists: get(&c.lists),
            deletes: get(&c.deletes),
            copies: get(&c.copies),
            bytes_read: get(&c.bytes_read),
            bytes_written: get(&c.bytes_written),
        }
    }
}

impl fmt::Display for MeteredStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Metered({})", self.inner)
    }
}

/// Counts listing pages as they are consumed: one request for the first page, one more per
/// further [`LIST_PAGE`] keys.
fn metered_listing(
    counters: Arc<Counters>,
    inner: BoxStream<'static, Result<ObjectMeta>>,
) -> BoxStream<'static, Result<ObjectMeta>> {
    futures::stream::once(async move {
        counters.delay().await;
        Counters::add(&counters.lists, 1);
        let mut seen = 0u64;
        inner.then(move |item| {
            let counters = counters.clone();
            seen += 1;
            let new_page = seen > 1 && (seen - 1).is_multiple_of(LIST_PAGE);
            async move {
                if new_page {
                    counters.delay().await;
                    Counters::add(&counters.lists, 1);
                }
                item
            }
        })
    })
    .flatten()
    .boxed()
}

#[async_trait]
impl ObjectStore for MeteredStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.counters.delay().await;
        Counters::add(&self.counters.puts, 1);
        Counters::add(
            &self.counters.bytes_written,
            payload.content_length() as u64,
        );
        self.counters
            .log(|| format!("PUT {location} ({} bytes)", payload.content_length()));
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.counters.delay().await;
        Counters::add(&self.counters.puts, 1);
        self.counters.log(|| format!("PUT multipart {location}"));
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(MeteredUpload {
            inner,
            counters: self.counters.clone(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.counters.delay().await;
        if options.head {
            Counters::add(&self.counters.heads, 1);
            self.counters.log(|| format!("HEAD {location}"));
        } else if let Some(range) = &options.range {
            Counters::add(&self.counters.range_gets, 1);
            self.counters.log(|| {
                let range = match range {
                    object_store::GetRange::Bounded(r) => format!("{}..{}", r.start, r.end),
                    object_store::GetRange::Offset(o) => format!("{o}.."),
                    object_store::GetRange::Suffix(n) => format!("last {n}"),
                };
                format!("GET range {range} {location}")
            });
        } else {
            Counters::add(&self.counters.gets, 1);
            self.counters.log(|| format!("GET {location}"));
        }
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        if !head {
            Counters::add(
                &self.counters.bytes_read,
                result.range.end - result.range.start,
            );
        }
        Ok(result)
    }

    // `get_ranges` is left to the trait's default: coalesced ranges, each one `get_opts`.

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let counters = self.counters.clone();
        let counted = locations
            .then(move |location| {
                let counters = counters.clone();
                async move {
                    counters.delay().await;
                    Counters::add(&counters.deletes, 1);
                    if let Ok(path) = &location {
                        counters.log(|| format!("DELETE {path}"));
                    }
                    location
                }
            })
            .boxed();
        self.inner.delete_stream(counted)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counters
            .log(|| format!("LIST {}", prefix.map_or("", |p| p.as_ref())));
        metered_listing(self.counters.clone(), self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counters
            .log(|| format!("LIST {} after {offset}", prefix.map_or("", |p| p.as_ref())));
        metered_listing(
            self.counters.clone(),
            self.inner.list_with_offset(prefix, offset),
        )
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.counters.delay().await;
        self.counters
            .log(|| format!("LIST / {}", prefix.map_or("", |p| p.as_ref())));
        let result = self.inner.list_with_delimiter(prefix).await?;
        let keys = (result.objects.len() + result.common_prefixes.len()) as u64;
        Counters::add(&self.counters.lists, keys.div_ceil(LIST_PAGE).max(1));
        Ok(result)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.counters.delay().await;
        self.counters.log(|| format!("COPY {from} {to}"));
        Counters::add(&self.counters.copies, 1);
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload whose parts (and completion) are counted as requests.
#[derive(Debug)]
struct MeteredUpload {
    inner: Box<dyn MultipartUpload>,
    counters: Arc<Counters>,
}

#[async_trait]
impl MultipartUpload for MeteredUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        Counters::add(&self.counters.puts, 1);
        self.counters
            .log(|| format!("PUT part ({} bytes)", data.content_length()));
        Counters::add(&self.counters.bytes_written, data.content_length() as u64);
        let counters = self.counters.clone();
        let part = self.inner.put_part(data);
        async move {
            counters.delay().await;
            part.await
        }
        .boxed()
    }

    async fn complete(&mut self) -> Result<PutResult> {
        self.counters.delay().await;
        Counters::add(&self.counters.puts, 1);
        self.counters.log(|| "PUT complete multipart".to_string());
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        self.counters.delay().await;
        Counters::add(&self.counters.deletes, 1);
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn counts_each_request_kind_and_its_bytes() {
        let store = MeteredStore::new(Arc::new(InMemory::new()));
        let a = Path::from("t/a");
        store
            .put(&a, PutPayload::from(vec![7u8; 100]))
            .await
            .unwrap();
        store.head(&a).await.unwrap();
        let whole = store.get(&a).await.unwrap().bytes().await.unwrap();
        assert_eq!(whole.len(), 100);
        store.get_range(&a, 10..30).await.unwrap();
        let listed: Vec<_> = store
            .list(Some(&Path::from("t")))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        store.list_with_delimiter(None).await.unwrap();
        store.delete(&a).await.unwrap();
        let counted = store.round_trips();
        assert_eq!(
            counted,
            RoundTrips {
                gets: 1,
                range_gets: 1,
                heads: 1,
                puts: 1,
                lists: 2,
                deletes: 1,
                copies: 0,
                bytes_read: 120,
                bytes_written: 100,
            }
        );
        assert_eq!(counted.requests(), 7);
        assert!(store.take_trace().is_empty(), "not tracing");
        store.trace(true);
        store.head(&Path::from("t/b")).await.unwrap_err();
        store.get_range(&Path::from("t/b"), 0..4).await.unwrap_err();
        assert_eq!(
            store.take_trace(),
            vec!["HEAD t/b".to_string(), "GET range 0..4 t/b".to_string()]
        );
        assert!(store.take_trace().is_empty());
        assert_eq!(counted.since(&counted), RoundTrips::default());
    }

    /// Far-apart ranges are separate GETs, as on S3; near ones are coalesced into one.
    #[tokio::test]
    async fn ranges_are_counted_as_the_coalesced_requests() {
        let store = MeteredStore::new(Arc::new(InMemory::new()));
        let a = Path::from("a");
        store
            .put(&a, PutPayload::from(vec![1u8; 4 << 20]))
            .await
            .unwrap();
        let before = store.round_trips();
        let ranges: [std::ops::Range<u64>; 3] = [0..10, 20..30, (3 << 20)..(3 << 20) + 10];
        store.get_ranges(&a, &ranges).await.unwrap();
        assert_eq!(store.round_trips().since(&before).range_gets, 2);
    }

    /// Each page of a listing is a request.
    #[tokio::test]
    async fn a_long_listing_is_one_request_per_page() {
        let store = MeteredStore::new(Arc::new(InMemory::new()));
        for i in 0..2001 {
            store
                .put(&Path::from(format!("p/{i}")), PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        let before = store.round_trips();
        let n = store.list(Some(&Path::from("p"))).count().await;
        assert_eq!(n, 2001);
        assert_eq!(store.round_trips().since(&before).lists, 3);
    }

    #[tokio::test]
    async fn latency_is_added_to_every_request() {
        let store = MeteredStore::new(Arc::new(InMemory::new()));
        store.set_latency(Duration::from_millis(20));
        let t = std::time::Instant::now();
        store
            .put(&Path::from("a"), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        store.head(&Path::from("a")).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(40),
            "{:?}",
            t.elapsed()
        );
    }
}

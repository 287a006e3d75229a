//! A deterministic interleaving of two writers: an object store that holds back one manifest
//! put (the moment a commit publishes a version) until the test lets it go.
//!
//! A statement run on a session over a [`GatedStore`] reads the table, writes its files and
//! builds its manifest; when the gate is armed its first conditional put of a manifest stops
//! there and says so. The test then commits the other writer's statement and releases the
//! gate: the put finds the version taken, and the commit loop re-reads the latest version
//! and rebases or conflicts, as it would after losing a real race. No sleeps, no timing.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use tokio::sync::oneshot;

/// The waiting room of one manifest put.
#[derive(Debug, Default)]
pub struct Gate {
    armed: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

/// The test's side of an armed gate.
pub struct Armed {
    /// Fires when a manifest put has arrived and waits.
    pub arrived: oneshot::Receiver<()>,
    /// Send (or drop) to let the put go on.
    pub release: oneshot::Sender<()>,
}

impl Gate {
    /// Holds back the next manifest put (only that one).
    pub fn arm(&self) -> Armed {
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *self.armed.lock().unwrap() = Some((arrived_tx, release_rx));
        Armed { arrived, release }
    }

    async fn pass(&self) {
        let taken = self.armed.lock().unwrap().take();
        if let Some((arrived, release)) = taken {
            let _ = arrived.send(());
            let _ = release.await;
        }
    }
}

/// An object store that passes everything to `inner`, except that a manifest put waits at
/// the gate when it is armed.
#[derive(Debug)]
pub struct GatedStore {
    pub inner: Arc<dyn ObjectStore>,
    pub gate: Arc<Gate>,
}

impl fmt::Display for GatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gated({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for GatedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        if matches!(opts.mode, PutMode::Create) && location.as_ref().contains("_versions/") {
            self.gate.pass().await;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

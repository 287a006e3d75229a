//! The worker: a datafusion-distributed gRPC worker that runs the tasks of fragvec queries.
//!
//! For each task, the worker builds a session with fragvec's distance and clustering
//! functions, the coordinator's `fragvec.*` options, the codec of fragvec's operators and
//! the coordinator's database (opened on first use and kept, with one index cache, for the
//! life of the process; see [`Databases`]). `fragvec worker --listen ADDR [--db URL]` runs
//! [`serve`]; tests run workers in process with [`spawn`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::prelude::SessionContext;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerSessionBuilder};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use super::codec::FragvecCodec;
use super::coordinator::{CoordinatorDatabase, unescape_header};
use super::databases::Databases;
use super::error::DistributedError;
use crate::engine::options::FragvecOptions;
use crate::engine::{cluster_udf, udf};

/// Builds the session each task of a fragvec query runs in.
#[derive(Clone, Debug)]
pub struct WorkerSessions {
    databases: Arc<Databases>,
}

impl WorkerSessions {
    /// Sessions over the databases this worker opens (`databases`).
    pub fn new(databases: Arc<Databases>) -> Self {
        Self { databases }
    }
}

#[async_trait]
impl WorkerSessionBuilder for WorkerSessions {
    async fn build_session_state(&self, ctx: WorkerQueryContext) -> Result<SessionState> {
        let mut builder = ctx
            .builder
            .with_distributed_option_extension_from_headers::<FragvecOptions>(&ctx.headers)?
            .with_distributed_option_extension_from_headers::<CoordinatorDatabase>(&ctx.headers)?
            .with_distributed_user_codec(FragvecCodec::new(self.databases.clone()));
        let escaped = builder
            .config()
            .as_ref()
            .and_then(|c| c.options().extensions.get::<CoordinatorDatabase>())
            .map(|d| d.location.clone())
            .unwrap_or_default();
        if !escaped.is_empty() {
            let location =
                unescape_header(&escaped).ok_or_else(|| DistributedError::BadPlanNode {
                    node: "the coordinator's database",
                    what: format!("malformed location header '{escaped}'"),
                })?;
            self.databases.open(&location).await?;
        }
        // Rebuilding registers DataFusion's functions again; fragvec's distance functions
        // must win over DataFusion's of the same names, as on the coordinator.
        let ctx = SessionContext::new_with_state(builder.build());
        udf::register(&ctx);
        cluster_udf::register(&ctx);
        Ok(ctx.state())
    }
}

/// A worker server for `databases`.
pub fn worker(databases: Arc<Databases>) -> Worker {
    Worker::from_session_builder(WorkerSessions::new(databases))
}

/// Binds `addr` (port 0: any free port); the bound address tells which.
pub fn bind(addr: SocketAddr) -> Result<(TcpIncoming, SocketAddr)> {
    // Without TCP_NODELAY small replies wait for delayed ACKs: ~90 ms added to every query
    // (a server built on its own listener ignores the builder's nodelay setting).
    let incoming = TcpIncoming::bind(addr)
        .map_err(DataFusionError::IoError)?
        .with_nodelay(Some(true));
    let bound = incoming.local_addr().map_err(DataFusionError::IoError)?;
    Ok((incoming, bound))
}

/// Serves fragvec tasks on `incoming` until `shutdown` completes.
pub async fn serve(
    incoming: TcpIncoming,
    databases: Arc<Databases>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    Server::builder()
        .add_service(worker(databases).into_worker_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))
}

/// A worker running in this process (for tests and embedding); stopped when dropped.
#[derive(Debug)]
pub struct LocalWorker {
    url: String,
    databases: Arc<Databases>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl LocalWorker {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Bytes held by the index cache of each database this worker has served.
    pub fn cache_bytes(&self) -> Vec<(String, usize)> {
        self.databases.cache_bytes()
    }

    /// Stops serving: queries that use this worker fail from now on.
    pub fn kill(&mut self) {
        self.task.abort();
    }
}

impl Drop for LocalWorker {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// Starts a worker on a free port of 127.0.0.1 in this process (on the current tokio
/// runtime), serving any database a query names.
pub async fn spawn() -> Result<LocalWorker> {
    let (incoming, addr) = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let databases = Arc::new(Databases::new(None));
    let task = tokio::spawn(serve(incoming, databases.clone(), async {
        let _ = stopped.await;
    }));
    Ok(LocalWorker {
        url: format!("http://{addr}"),
        databases,
        stop: Some(stop),
        task,
    })
}

//! `fragvec serve --flight ADDR`: an Arrow Flight SQL endpoint over the same database as
//! the Postgres endpoint, for Arrow-native clients (ADBC's Flight SQL driver, pyarrow,
//! JDBC's Flight SQL driver): results stay columnar end to end and stream as they are
//! produced; `adbc_ingest` writes the client's Arrow stream straight into fragments.
//!
//! The files: [`service`] answers the Flight SQL calls, [`sessions`] keeps who is who
//! (bearer tokens, prepared statements, results waiting for their DoGet), [`bind`] splices
//! parameters, [`catalog`] answers the metadata calls, [`ingest`] writes uploads, and
//! [`status`] maps errors to gRPC codes.

pub mod bind;
pub mod catalog;
pub mod ingest;
pub mod service;
pub mod sessions;
pub mod status;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;

use self::service::FlightSql;
use self::sessions::Sessions;
use super::auth::{Authentication, TlsFiles};
use super::files::AllowedFiles;
use crate::FragvecSession;

/// How a Flight SQL endpoint runs.
#[derive(Debug, Clone)]
pub struct FlightServerConfig {
    /// The address to listen on (`--flight`).
    pub listen: SocketAddr,
    /// Who may connect (the same users as the Postgres endpoint).
    pub authentication: Authentication,
    /// TLS, with the Postgres endpoint's files (`--tls-cert`, `--tls-key`).
    pub tls: Option<TlsFiles>,
    /// Where statements may read and write files.
    pub allow_files: AllowedFiles,
    /// The default limit of one statement (0: none).
    pub statement_timeout_ms: u64,
    /// How long a token lives unused.
    pub token_ttl: Duration,
}

impl FlightServerConfig {
    /// An endpoint on `listen` that trusts every client (loopback only).
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            authentication: Authentication::Trust,
            tls: None,
            allow_files: AllowedFiles::none(),
            statement_timeout_ms: 0,
            token_ttl: Duration::from_secs(3600),
        }
    }
}

/// A bound Flight SQL endpoint, ready to serve.
pub struct FlightServer {
    listener: TcpListener,
    service: FlightSql,
    tls: Option<tonic::transport::ServerTlsConfig>,
}

impl FlightServer {
    /// Binds the listening socket. Refuses a non-loopback address without authentication.
    pub async fn bind(root: FragvecSession, config: FlightServerConfig) -> Result<Self, String> {
        if !config.listen.ip().is_loopback()
            && matches!(config.authentication, Authentication::Trust)
        {
            return Err(format!(
                "refusing to serve Flight SQL on {} without authentication: anyone who can \
                 reach it could read and change the database. Give users with --users FILE or \
                 FRAGVEC_PASSWORD, or listen on a loopback address (127.0.0.1)",
                config.listen
            ));
        }
        let tls = match &config.tls {
            Some(files) => {
                let read = |p: &std::path::Path| {
                    std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
                };
                let identity =
                    tonic::transport::Identity::from_pem(read(&files.cert)?, read(&files.key)?);
                Some(tonic::transport::ServerTlsConfig::new().identity(identity))
            }
            None => None,
        };
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let service = FlightSql {
            sessions: Arc::new(Sessions::new(
                root,
                config.authentication.clone(),
                config.token_ttl,
            )),
            allow_files: config.allow_files.clone(),
            statement_timeout: Duration::from_millis(config.statement_timeout_ms),
        };
        Ok(Self {
            listener,
            service,
            tls,
        })
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` turns true, then lets running calls finish.
    pub async fn serve(self, mut shutdown: watch::Receiver<bool>) -> Result<(), String> {
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = self.tls {
            builder = builder.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
        }
        let listener = self.listener;
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(socket, _)| {
                let _ = socket.set_nodelay(true);
                socket
            });
            Some((accepted, listener))
        });
        builder
            .add_service(
                FlightServiceServer::new(self.service)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20),
            )
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            })
            .await
            .map_err(|e| format!("the Flight SQL endpoint stopped: {e}"))
    }
}

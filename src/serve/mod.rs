//! `fragvec serve`: a PostgreSQL-protocol server over one fragvec database, so pgvector's
//! clients (psql, psycopg with `pgvector.psycopg.register_vector`, asyncpg, pools) connect
//! unchanged.
//!
//! One process, many sessions: each connection gets a [`FragvecSession`] of its own (its `SET`
//! values, kept KNN plans, transaction block), made from one root session, so all share the
//! database handle and one index cache under one byte budget. Connections run as tasks of
//! their own on the runtime: a slow statement holds only its connection.
//!
//! Protocol code only: statements run through the same session front end as the CLI
//! ([`run`]); the files here speak the protocol ([`connection`]), read a portal's bound
//! parameters ([`portal`]) and splice them ([`params`]), encode values ([`types`]), answer
//! catalog queries ([`pg_catalog`]), map errors to SQLSTATEs ([`sqlstate`]), and keep
//! transaction blocks honest ([`transaction`]).
//! Authentication and TLS are in [`auth`]; the message loop and its socket, which sends an
//! answer in one write, in [`socket`]. The Arrow Flight SQL endpoint (`--flight`) is
//! [`flight`], over the same root session.

pub mod auth;
pub mod bound_insert;
pub mod connection;
pub mod copy_encode;
pub mod copy_format;
pub mod copy_in;
pub mod copy_out;
pub mod copy_statement;
pub mod describe;
pub mod files;
#[cfg(feature = "flight")]
pub mod flight;
pub mod params;
pub mod pg_catalog;
pub mod portal;
pub mod respond;
pub mod run;
pub mod settings;
pub mod socket;
pub mod sqlstate;
pub mod transaction;
pub mod types;
pub mod values;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::{ConnectionManager, PgWireServerHandlers};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use self::auth::{Authentication, Startup};
use self::connection::{Connection, Shared};
use crate::FragvecSession;

/// How a server runs.
#[derive(Debug, Clone)]
pub struct PgServerConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Connections served at once; more are refused with SQLSTATE 53300.
    pub max_connections: usize,
    /// The default `statement_timeout` in milliseconds (0: none).
    pub statement_timeout_ms: u64,
    /// How long SIGTERM waits for running statements before the server exits.
    pub shutdown_grace: Duration,
    /// Who may connect.
    pub authentication: Authentication,
    /// TLS, if the server offers it.
    pub tls: Option<auth::TlsFiles>,
    /// The database's name as clients see it.
    pub database_name: String,
    /// Where clients may read files (`CREATE EXTERNAL TABLE`) and write them (`COPY TO`).
    pub allow_files: files::AllowedFiles,
}

impl PgServerConfig {
    /// A server on `listen` that trusts every client (loopback only, see [`PgServer::bind`]).
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            max_connections: 100,
            statement_timeout_ms: 0,
            shutdown_grace: Duration::from_secs(30),
            authentication: Authentication::Trust,
            tls: None,
            database_name: "fragvec".into(),
            allow_files: files::AllowedFiles::none(),
        }
    }
}

/// A PostgreSQL-protocol server over one database.
pub struct PgServer {
    listener: TcpListener,
    config: PgServerConfig,
    shared: Arc<Shared>,
    manager: Arc<ConnectionManager>,
    /// Every connection's process id and secret key for cancel requests.
    pids: Arc<pgwire::api::RandomPidSecretKeyGenerator>,
    tls: Option<pgwire::tokio::TlsAcceptor>,
}

impl PgServer {
    /// Binds the listening socket. Refuses a non-loopback address without authentication.
    pub async fn bind(root: FragvecSession, config: PgServerConfig) -> Result<Self, String> {
        if !config.listen.ip().is_loopback()
            && matches!(config.authentication, Authentication::Trust)
        {
            return Err(format!(
                "refusing to listen on {} without authentication: anyone who can reach it could \
                 read and change the database. Give users with --users FILE or FRAGVEC_PASSWORD, \
                 or listen on a loopback address (127.0.0.1)",
                config.listen
            ));
        }
        let tls = match &config.tls {
            Some(files) => Some(auth::tls_acceptor(files)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let shared = Arc::new(Shared {
            root,
            database_name: config.database_name.clone(),
            statement_timeout_ms: config.statement_timeout_ms,
            allow_files: config.allow_files.clone(),
        });
        Ok(Self {
            listener,
            config,
            shared,
            manager: Arc::new(ConnectionManager::new()),
            pids: Arc::new(pgwire::api::RandomPidSecretKeyGenerator::default()),
            tls,
        })
    }

    /// The address the server listens on (the port, when bound to port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` turns true; then stops accepting and waits up to the grace
    /// period for connections to finish their statements.
    pub async fn serve(self, mut shutdown: watch::Receiver<bool>) -> std::io::Result<()> {
        let slots = Arc::new(Semaphore::new(self.config.max_connections));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let (socket, _) = match accepted {
                Ok(a) => a,
                // Out of descriptors and the like: the listener itself is fine.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = socket.set_nodelay(true);
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tasks.spawn(socket::refuse(
                    socket,
                    self.tls.clone(),
                    DefaultCancelHandler::new(self.manager.clone()),
                    sqlstate::code::TOO_MANY_CONNECTIONS,
                    "sorry, too many clients already",
                ));
                continue;
            };
            let handlers = Handlers {
                connection: Arc::new(Connection::new(self.shared.clone())),
                startup: Arc::new(Startup::new(
                    &self.config.authentication,
                    self.manager.clone(),
                    self.pids.clone(),
                )),
                cancel: Arc::new(DefaultCancelHandler::new(self.manager.clone())),
            };
            let tls = self.tls.clone();
            let stopping = shutdown.clone();
            tasks.spawn(async move {
                // Closed at once: a first message no client sends (PostgreSQL limits startup
                // packets to 10,000 bytes), so it is not left waiting for bytes that never
                // come. Checked here, not in the accept loop, so a silent client delays
                // nobody else.
                if !plausible_start(&socket).await {
                    return;
                }
                // A broken or hostile client ends its own connection, nothing else.
                let _ = socket::process_socket(socket, tls, handlers, stopping).await;
                drop(permit);
            });
            // Reap finished connections so the set does not grow with every client.
            while tasks.try_join_next().is_some() {}
        }
        drop(self.listener);
        let _ = tokio::time::timeout(self.config.shutdown_grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        tasks.abort_all();
        Ok(())
    }
}

/// Whether the first bytes of a connection can begin a startup packet, an SSL / GSS request
/// or a cancel request: a length of 8 to 10,000 bytes. Waits at most a few seconds for them.
async fn plausible_start(socket: &TcpStream) -> bool {
    let mut head = [0u8; 4];
    let peeked = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match socket.peek(&mut head).await {
                Ok(n) if n >= 4 => return true,
                Ok(0) | Err(_) => return false,
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await;
    if peeked != Ok(true) {
        return false;
    }
    let len = i32::from_be_bytes(head);
    (8..=10_000).contains(&len)
}

/// The handlers of one connection.
struct Handlers {
    connection: Arc<Connection>,
    startup: Arc<Startup>,
    cancel: Arc<DefaultCancelHandler>,
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        self.connection.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        self.connection.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        self.cancel.clone()
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        self.connection.clone()
    }
}

//! Who may connect: no authentication (loopback only) or SCRAM-SHA-256 passwords from a users
//! file or `FRAGVEC_PASSWORD`; and TLS from a certificate and key in PEM files.
//!
//! The users file has one `name:password` per line (`#` starts a comment). Passwords are held
//! in memory only as SCRAM salted hashes, computed once at start.

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::{ScramAuth, gen_salted_password};
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler,
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata,
};
use pgwire::api::{
    ClientInfo, ConnectionGuard, ConnectionHandle, ConnectionManager, PidSecretKeyGenerator,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

/// SCRAM iterations (PostgreSQL's default).
const ITERATIONS: usize = 4096;

/// How clients prove who they are.
#[derive(Clone)]
pub enum Authentication {
    /// Everyone is let in (only on a loopback address).
    Trust,
    /// SCRAM-SHA-256 against these users.
    Scram(Arc<Users>),
}

impl Debug for Authentication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Authentication::Trust => f.write_str("Trust"),
            Authentication::Scram(u) => write!(f, "Scram({} users)", u.salted.len()),
        }
    }
}

/// Users and their salted passwords.
pub struct Users {
    salted: HashMap<String, (Vec<u8>, Vec<u8>)>,
}

impl Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Users({})", self.salted.len())
    }
}

impl Users {
    /// Users from `name:password` pairs.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        let salted = pairs
            .into_iter()
            .map(|(name, password)| {
                let salt: [u8; 16] = rand::random();
                let hash = gen_salted_password(&password, &salt, ITERATIONS);
                (name, (salt.to_vec(), hash))
            })
            .collect();
        Self { salted }
    }

    /// Whether `password` is `user`'s (the Flight endpoint's basic credentials). Compares
    /// the salted hashes in constant time; an unknown user costs the same hashing.
    pub fn verify(&self, user: &str, password: &str) -> bool {
        let unknown = (vec![0u8; 16], vec![0u8; 32]);
        let (salt, hash) = self.salted.get(user).unwrap_or(&unknown);
        let computed = gen_salted_password(password, salt, ITERATIONS);
        let differ = computed.len() != hash.len()
            || computed
                .iter()
                .zip(hash)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                != 0;
        self.salted.contains_key(user) && !differ
    }

    /// Users from a file of `name:password` lines.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the users file {}: {e}", path.display()))?;
        let mut pairs = vec![];
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, password)) = line.split_once(':') else {
                return Err(format!(
                    "{} line {}: expected name:password",
                    path.display(),
                    n + 1
                ));
            };
            if name.is_empty() || password.is_empty() {
                return Err(format!(
                    "{} line {}: a user needs a name and a password",
                    path.display(),
                    n + 1
                ));
            }
            pairs.push((name.to_string(), password.to_string()));
        }
        if pairs.is_empty() {
            return Err(format!("the users file {} names no user", path.display()));
        }
        Ok(Self::new(pairs))
    }
}

#[async_trait]
impl AuthSource for Users {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let user = login.user().unwrap_or_default();
        match self.salted.get(user) {
            Some((salt, hash)) => Ok(Password::new(Some(salt.clone()), hash.clone())),
            None => Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".into(),
                "28P01".into(),
                format!("password authentication failed for user \"{user}\""),
            )))),
        }
    }
}

/// The parameters a client is told at startup.
fn parameters() -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.server_version = super::settings::SERVER_VERSION.to_string();
    p.is_superuser = false;
    p
}

/// The startup handler of one connection.
pub enum Startup {
    /// No password asked (a loopback listen without users).
    Trust(Arc<ConnectionManager>, Arc<dyn PidSecretKeyGenerator>),
    /// SCRAM-SHA-256 against the server's users.
    Scram(Box<SASLAuthStartupHandler<DefaultServerParameterProvider>>),
}

impl Startup {
    /// The handler `auth` calls for, registering the connection with `manager` under a
    /// process id from `pids` (one generator for the server, so no two connections share
    /// an id).
    pub fn new(
        auth: &Authentication,
        manager: Arc<ConnectionManager>,
        pids: Arc<dyn PidSecretKeyGenerator>,
    ) -> Self {
        match auth {
            Authentication::Trust => Startup::Trust(manager, pids),
            Authentication::Scram(users) => {
                let mut scram = ScramAuth::new(users.clone());
                scram.set_iterations(ITERATIONS);
                let handler = SASLAuthStartupHandler::new(Arc::new(parameters()))
                    .with_scram(scram)
                    .with_connection_manager(manager)
                    .with_pid_secret_key_generator(pids);
                Startup::Scram(Box::new(handler))
            }
        }
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Scram(h) => h.on_startup(client, message).await,
            Startup::Trust(manager, pids) => {
                if let PgWireFrontendMessage::Startup(ref startup) = message {
                    protocol_negotiation(client, startup).await?;
                    save_startup_parameters_to_metadata(client, startup);
                    let (pid, key) = pids.generate(client);
                    client.set_pid_and_secret_key(pid, key.clone());
                    // Cancel requests find the connection's running statement through this.
                    let (handle, guard) = manager.register(pid, key);
                    client
                        .session_extensions()
                        .insert::<Arc<ConnectionHandle>>(handle);
                    client.session_extensions().insert::<ConnectionGuard>(guard);
                    finish_authentication(client, &parameters()).await?;
                }
                Ok(())
            }
        }
    }
}

/// A certificate chain and its private key, in PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain (`--tls-cert`).
    pub cert: PathBuf,
    /// Its private key (`--tls-key`).
    pub key: PathBuf,
}

/// The TLS acceptor of `files`.
pub fn tls_acceptor(files: &TlsFiles) -> Result<pgwire::tokio::TlsAcceptor, String> {
    use pgwire::tokio::tokio_rustls::rustls::ServerConfig;
    use pgwire::tokio::tokio_rustls::rustls::pki_types::pem::PemObject;
    use pgwire::tokio::tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "cannot read the TLS certificate {}: {e}",
                files.cert.display()
            )
        })?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("cannot read the TLS key {}: {e}", files.key.display()))?;
    let config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("the TLS certificate and key do not work together: {e}"))?;
    Ok(pgwire::tokio::TlsAcceptor::from(Arc::new(config)))
}

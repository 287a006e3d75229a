//! Who a Flight SQL request comes from, and what the server keeps for it between requests.
//!
//! Flight SQL is a set of independent gRPC calls: a query is a GetFlightInfo then a DoGet, a
//! prepared statement a CreatePreparedStatement, a DoPut of its parameters, then a
//! GetFlightInfo and a DoGet. What ties them together is a bearer token: the client trades
//! its basic credentials for one at Handshake (ADBC does so when given a username and
//! password) and sends it with every call. A token names a session — a [`FragvecSession`] of
//! its own, with its `SET` values and kept plans — that lives until the token expires
//! unused. Without users (a loopback server), any credentials get a token, and a call
//! without one gets a new session whose token comes back in the response's
//! `authorization` header — which ADBC's driver adopts for the calls that follow, as it
//! would a token from Handshake.
//!
//! Prepared statements and results waiting for their DoGet are kept here too, under random
//! handles that only their own session may use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use datafusion::arrow::array::RecordBatch;
use tokio::sync::Notify;
use tonic::Status;
use tonic::metadata::MetadataMap;

use super::super::auth::Authentication;
use crate::FragvecSession;
use crate::engine::Streamed;

/// How long a result waits for its DoGet before it is dropped (its query stops).
const RESULT_TTL: Duration = Duration::from_secs(300);

/// How long a session made for a call without a token lives if its client never sends the
/// token back.
const UNADOPTED_TTL: Duration = Duration::from_secs(60);

/// One client's session.
pub struct FlightSession {
    /// Who the token was given to (`None`: a call without a token, on a server without
    /// users).
    pub user: Option<String>,
    /// Its own session (its `SET` values), sharing the server's database and cache.
    pub session: FragvecSession,
    token: String,
    /// The token was made for this call (which came without one): the answer carries it.
    issued: bool,
    /// The client has used the token (or got it at Handshake). A token sent back to a
    /// client that never uses it (one that ignores the header) lapses after a minute, so
    /// such clients do not pile up sessions.
    adopted: std::sync::atomic::AtomicBool,
    last_used: Mutex<Instant>,
}

impl FlightSession {
    /// Whether the session is still alive: used within `ttl` (within [`UNADOPTED_TTL`] when
    /// its client never used its token).
    fn alive(&self, ttl: Duration) -> bool {
        let limit = if self.adopted.load(std::sync::atomic::Ordering::Relaxed) {
            ttl
        } else {
            ttl.min(UNADOPTED_TTL)
        };
        self.last_used.lock().expect("lock").elapsed() < limit
    }

    /// Whether a prepared statement or result made by `owner` may be used by this session.
    fn owns(&self, owner: &str) -> bool {
        self.token == owner
    }

    /// The token to send back in the answer's `authorization` header, when this call's
    /// session was made for it.
    pub fn issued_token(&self) -> Option<&str> {
        self.issued.then_some(self.token.as_str())
    }
}

/// A statement prepared with CreatePreparedStatement, and the parameters last bound to it.
pub struct Prepared {
    /// The statement's text, with `$n` or `?` placeholders.
    pub sql: String,
    /// The parameters the client bound last (one row per execution), if any.
    pub parameters: Mutex<Option<RecordBatch>>,
    owner: String,
}

/// A statement that ran (or, for a query, started) at GetFlightInfo, waiting for its DoGet.
pub struct Pending {
    /// The statement's rows (a query's, streaming) or its finished result.
    pub output: Streamed,
    /// Fired by CancelFlightInfo: the DoGet stream ends with `Cancelled`.
    pub cancel: Arc<Cancel>,
    /// When the statement's time is up (`statement_timeout`), if it has a limit.
    pub deadline: Option<tokio::time::Instant>,
    owner: String,
    created: Instant,
}

/// A cancel request for one statement, which its stream watches.
#[derive(Default)]
pub struct Cancel {
    fired: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl Cancel {
    /// Cancels the statement: its stream ends at its next batch.
    pub fn fire(&self) {
        self.fired.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Resolves once [`Self::fire`] was called.
    pub async fn fired(&self) {
        loop {
            let notified = self.notify.notified();
            if self.fired.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// Every session, prepared statement and waiting result of one server.
pub struct Sessions {
    root: FragvecSession,
    authentication: Authentication,
    token_ttl: Duration,
    by_token: Mutex<HashMap<String, Arc<FlightSession>>>,
    prepared: Mutex<HashMap<Vec<u8>, Arc<Prepared>>>,
    pending: Mutex<HashMap<Vec<u8>, Pending>>,
    /// The cancel handles of results handed to a DoGet, by handle, while they stream.
    streaming: Mutex<HashMap<Vec<u8>, std::sync::Weak<Cancel>>>,
}

/// A fresh random handle or token.
fn random_id() -> Vec<u8> {
    let bytes: [u8; 16] = rand::random();
    bytes.to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// No sessions yet: each will share `root`'s database, check clients against
    /// `authentication`, and live until its token goes `token_ttl` unused.
    pub fn new(root: FragvecSession, authentication: Authentication, token_ttl: Duration) -> Self {
        Self {
            root,
            authentication,
            token_ttl,
            by_token: Mutex::default(),
            prepared: Mutex::default(),
            pending: Mutex::default(),
            streaming: Mutex::default(),
        }
    }

    /// Handshake: checks the basic credentials of `metadata` and gives a new session's
    /// bearer token.
    pub async fn handshake(&self, metadata: &MetadataMap) -> Result<String, Status> {
        let (user, password) = basic_credentials(metadata)?;
        if let Authentication::Scram(users) = &self.authentication
            && !users.verify(&user, &password)
        {
            return Err(Status::unauthenticated(format!(
                "password authentication failed for user \"{user}\""
            )));
        }
        let session = self.new_session(Some(user), false).await?;
        Ok(session.token.clone())
    }

    /// A new session under a new token, kept until the token expires unused.
    async fn new_session(
        &self,
        user: Option<String>,
        issued: bool,
    ) -> Result<Arc<FlightSession>, Status> {
        let session = self
            .root
            .new_sharing()
            .await
            .map_err(|e| super::status::of(&e))?;
        let session = Arc::new(FlightSession {
            user,
            session,
            token: hex(&random_id()),
            issued,
            adopted: std::sync::atomic::AtomicBool::new(!issued),
            last_used: Mutex::new(Instant::now()),
        });
        let mut sessions = self.by_token.lock().expect("lock");
        let ttl = self.token_ttl;
        sessions.retain(|_, s| s.alive(ttl));
        sessions.insert(session.token.clone(), session.clone());
        Ok(session)
    }

    /// Ends the session of `session`'s token (CloseSession).
    pub fn close(&self, session: &FlightSession) {
        self.by_token.lock().expect("lock").remove(&session.token);
    }

    /// The session a call belongs to: its bearer token's, or (without authentication) a
    /// fresh one for a call that has none.
    pub async fn of(&self, metadata: &MetadataMap) -> Result<Arc<FlightSession>, Status> {
        match bearer_token(metadata)? {
            Some(token) => {
                let sessions = self.by_token.lock().expect("lock");
                let Some(session) = sessions.get(&token) else {
                    return Err(Status::unauthenticated(
                        "unknown or expired token: authenticate again (Handshake)",
                    ));
                };
                if !session.alive(self.token_ttl) {
                    return Err(Status::unauthenticated(
                        "the token expired: authenticate again (Handshake)",
                    ));
                }
                *session.last_used.lock().expect("lock") = Instant::now();
                session
                    .adopted
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(session.clone())
            }
            None if matches!(self.authentication, Authentication::Trust) => {
                self.new_session(None, true).await
            }
            None => Err(Status::unauthenticated(
                "this server needs a user and password (basic credentials at Handshake)",
            )),
        }
    }

    /// Keeps a prepared statement; gives its handle.
    pub fn prepare(&self, session: &FlightSession, sql: String) -> Vec<u8> {
        let handle = random_id();
        let prepared = Prepared {
            sql,
            parameters: Mutex::new(None),
            owner: session.token.clone(),
        };
        self.prepared
            .lock()
            .expect("lock")
            .insert(handle.clone(), Arc::new(prepared));
        handle
    }

    /// The prepared statement of `handle`, if `session` made it.
    pub fn prepared(
        &self,
        session: &FlightSession,
        handle: &[u8],
    ) -> Result<Arc<Prepared>, Status> {
        match self.prepared.lock().expect("lock").get(handle) {
            Some(p) if session.owns(&p.owner) => Ok(p.clone()),
            _ => Err(Status::not_found(
                "no such prepared statement (never created, or closed)",
            )),
        }
    }

    /// `ClosePreparedStatement`: forgets `handle` (an error if it is not `session`'s).
    pub fn close_prepared(&self, session: &FlightSession, handle: &[u8]) -> Result<(), Status> {
        self.prepared(session, handle)?;
        self.prepared.lock().expect("lock").remove(handle);
        Ok(())
    }

    /// Keeps a statement's output for its DoGet; gives the ticket's handle.
    pub fn keep(
        &self,
        session: &FlightSession,
        output: Streamed,
        deadline: Option<tokio::time::Instant>,
    ) -> Vec<u8> {
        let handle = random_id();
        let mut pending = self.pending.lock().expect("lock");
        // Results nobody fetched: dropping them stops their queries.
        pending.retain(|_, p| p.created.elapsed() < RESULT_TTL);
        pending.insert(
            handle.clone(),
            Pending {
                output,
                cancel: Arc::default(),
                deadline,
                owner: session.token.clone(),
                created: Instant::now(),
            },
        );
        handle
    }

    /// Takes the output kept under `handle` for its one DoGet.
    pub fn take(&self, session: &FlightSession, handle: &[u8]) -> Result<Pending, Status> {
        let mut pending = self.pending.lock().expect("lock");
        match pending.get(handle) {
            Some(p) if session.owns(&p.owner) => {}
            _ => {
                return Err(Status::not_found(
                    "no such result: its ticket was used already, expired, or never issued",
                ));
            }
        }
        let taken = pending.remove(handle).expect("checked");
        let mut streaming = self.streaming.lock().expect("lock");
        streaming.retain(|_, c| c.strong_count() > 0);
        streaming.insert(handle.to_vec(), Arc::downgrade(&taken.cancel));
        Ok(taken)
    }

    /// CancelFlightInfo: stops the statement of `handle`, waiting or streaming. Whether
    /// there was one to stop.
    pub fn cancel(&self, session: &FlightSession, handle: &[u8]) -> bool {
        let mut pending = self.pending.lock().expect("lock");
        if let Some(p) = pending.get(handle)
            && session.owns(&p.owner)
        {
            pending.remove(handle);
            return true;
        }
        drop(pending);
        let streaming = self.streaming.lock().expect("lock");
        match streaming.get(handle).and_then(|c| c.upgrade()) {
            Some(cancel) => {
                cancel.fire();
                true
            }
            None => false,
        }
    }
}

/// `authorization: Basic base64(user:password)`.
fn basic_credentials(metadata: &MetadataMap) -> Result<(String, String), Status> {
    let missing =
        || Status::unauthenticated("Handshake needs basic credentials (user and password)");
    let value = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(missing)?;
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
        .ok_or_else(missing)?;
    // Go's Flight client (ADBC's driver) encodes without padding; others pad.
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let decoded = engine
        .decode(encoded.trim())
        .map_err(|_| Status::unauthenticated("the basic credentials are not valid base64"))?;
    let text = String::from_utf8(decoded)
        .map_err(|_| Status::unauthenticated("the basic credentials are not UTF-8"))?;
    let (user, password) = text
        .split_once(':')
        .ok_or_else(|| Status::unauthenticated("basic credentials are user:password"))?;
    Ok((user.to_string(), password.to_string()))
}

/// The token of `authorization: Bearer TOKEN`, if the call has one.
fn bearer_token(metadata: &MetadataMap) -> Result<Option<String>, Status> {
    let Some(value) = metadata.get("authorization") else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| Status::unauthenticated("the authorization header is not text"))?;
    match value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
    {
        Some(token) => Ok(Some(token.trim().to_string())),
        None => Err(Status::unauthenticated(
            "calls after Handshake carry its token: authorization: Bearer TOKEN",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(header: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", header.parse().unwrap());
        m
    }

    #[test]
    fn credentials_and_tokens_are_read_from_the_header() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("ann:s3:cret");
        let (user, password) = basic_credentials(&metadata(&format!("Basic {encoded}"))).unwrap();
        assert_eq!((user.as_str(), password.as_str()), ("ann", "s3:cret"));
        assert!(basic_credentials(&metadata("Basic !!!")).is_err());
        assert!(basic_credentials(&MetadataMap::new()).is_err());
        assert_eq!(
            bearer_token(&metadata("Bearer abc")).unwrap().as_deref(),
            Some("abc")
        );
        assert_eq!(bearer_token(&MetadataMap::new()).unwrap(), None);
        assert!(bearer_token(&metadata("Token abc")).is_err());
    }

    #[tokio::test]
    async fn a_session_uses_only_its_own_handles_and_passwords_are_checked() {
        let root = FragvecSession::open("memory://flight-sessions")
            .await
            .unwrap();
        let users = Arc::new(super::super::super::auth::Users::new([(
            "ann".to_string(),
            "pw".to_string(),
        )]));
        let sessions = Sessions::new(root, Authentication::Scram(users), Duration::from_secs(60));
        let basic = |p: &str| {
            let e = base64::engine::general_purpose::STANDARD.encode(format!("ann:{p}"));
            metadata(&format!("Basic {e}"))
        };
        let wrong = sessions.handshake(&basic("nope")).await.unwrap_err();
        assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
        let t1 = sessions.handshake(&basic("pw")).await.unwrap();
        let t2 = sessions.handshake(&basic("pw")).await.unwrap();
        let s1 = sessions
            .of(&metadata(&format!("Bearer {t1}")))
            .await
            .unwrap();
        let s2 = sessions
            .of(&metadata(&format!("Bearer {t2}")))
            .await
            .unwrap();
        assert_eq!(s1.user.as_deref(), Some("ann"));
        let handle = sessions.prepare(&s1, "SELECT 1".into());
        assert!(sessions.prepared(&s1, &handle).is_ok());
        assert_eq!(
            sessions.prepared(&s2, &handle).err().unwrap().code(),
            tonic::Code::NotFound
        );
        assert!(sessions.of(&MetadataMap::new()).await.is_err());
        assert!(sessions.of(&metadata("Bearer forged")).await.is_err());
    }

    /// A session made for a token-less call lives a minute unless its client sends the
    /// token back; then it lives as long as any.
    #[tokio::test]
    async fn sessions_of_tokenless_calls_lapse_unless_adopted() {
        let root = FragvecSession::open("memory://flight-adopt").await.unwrap();
        let sessions = Sessions::new(root, Authentication::Trust, Duration::from_secs(3600));
        let ignored = sessions.of(&MetadataMap::new()).await.unwrap();
        let adopted = sessions.of(&MetadataMap::new()).await.unwrap();
        let token = adopted.issued_token().unwrap().to_string();
        sessions
            .of(&metadata(&format!("Bearer {token}")))
            .await
            .unwrap();
        let aged = Instant::now() - UNADOPTED_TTL - Duration::from_secs(1);
        *ignored.last_used.lock().unwrap() = aged;
        *adopted.last_used.lock().unwrap() = aged;
        assert!(!ignored.alive(Duration::from_secs(3600)));
        assert!(adopted.alive(Duration::from_secs(3600)));
        // The next new session sweeps the lapsed one out.
        sessions.of(&MetadataMap::new()).await.unwrap();
        let kept = sessions.by_token.lock().unwrap();
        assert!(!kept.contains_key(&ignored.token) && kept.contains_key(&adopted.token));
    }
}

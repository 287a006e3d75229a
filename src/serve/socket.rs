//! One connection's message loop: pgwire's own, over a socket that sends what the server
//! wrote when the server is about to wait for the client, as PostgreSQL does.
//!
//! pgwire flushes after every message it `send`s: a prepared KNN query (Bind, Describe,
//! Execute, Sync in one packet) was answered in four TCP writes (BindComplete,
//! RowDescription, the rows with CommandComplete, ReadyForQuery), each a system call on the
//! server and a wake-up of the client, which cannot use any of them before the last.
//! [`FlushBeforeRead`] holds written bytes until the server reads again (or holds
//! [`HELD_BYTES`]), so one answer leaves in one write, and the answers to several pipelined
//! queries leave together. The bytes are never held while the server waits for the client:
//! a read sends them first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::SinkExt;
use futures::StreamExt;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::response::ReadyForQuery;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{negotiate_tls, process_error, process_message};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedParts};

/// Written bytes held before a write sends them anyway: PostgreSQL's send buffer is 8 KiB;
/// a KNN answer of ten 768-dimensional vectors is ~31 KiB.
pub const HELD_BYTES: usize = 64 * 1024;

/// How long a client has to finish its startup (pgwire's own limit).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a closing connection waits to send what it still holds.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A stream whose writes are held until the next read (or until [`HELD_BYTES`] are held,
/// or shutdown): `poll_flush` alone does not send them.
pub struct FlushBeforeRead<S> {
    io: S,
    held: Vec<u8>,
    /// Bytes of `held` already sent.
    sent: usize,
}

impl<S> FlushBeforeRead<S> {
    /// Wraps `io`, holding nothing yet.
    pub fn new(io: S) -> Self {
        Self {
            io,
            held: Vec::new(),
            sent: 0,
        }
    }

    /// Bytes written and not yet sent.
    pub fn held(&self) -> usize {
        self.held.len() - self.sent
    }
}

impl<S: AsyncWrite + Unpin> FlushBeforeRead<S> {
    /// Sends what is held; Ready once all of it is sent.
    fn poll_send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.sent = 0;
        // One huge answer does not pin its buffer for the life of the connection.
        if self.held.capacity() > 4 * HELD_BYTES {
            self.held.shrink_to(HELD_BYTES);
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for FlushBeforeRead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Send first. If the client is not reading (it is still writing a long pipeline of
        // its own), read anyway: this task then waits for either, never for both at once.
        if let Poll::Ready(Err(e)) = this.poll_send_held(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FlushBeforeRead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.held() >= HELD_BYTES {
            ready!(this.poll_send_held(cx))?;
        }
        this.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.held() >= HELD_BYTES {
            ready!(this.poll_send_held(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_held(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// Serves one TCP connection: TLS negotiation, startup, then every message until the
/// client leaves. What `pgwire::tokio::process_socket` does, over [`FlushBeforeRead`].
///
/// When `shutdown` turns true, a connection waiting for its client's next message is closed
/// with PostgreSQL's FATAL 57P01 (as its fast shutdown does); one running a statement
/// finishes it first (the server bounds that wait).
pub async fn process_socket<H: PgWireServerHandlers>(
    tcp: TcpStream,
    tls: Option<pgwire::tokio::TlsAcceptor>,
    handlers: H,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> io::Result<()> {
    let startup_deadline = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_deadline);
    let (tcp, peer) = PeerWatch::of(tcp)?;
    let negotiated = tokio::select! {
        _ = &mut startup_deadline => return Ok(()),
        s = negotiate_tls(tcp, tls) => s?,
    };
    // A direct TLS handshake to a server without TLS.
    let Some(socket) = negotiated else {
        return Ok(());
    };
    let old = socket.into_parts();
    let mut parts = FramedParts::new(FlushBeforeRead::new(old.io), old.codec);
    parts.read_buf = old.read_buf;
    parts.write_buf = old.write_buf;
    let mut socket = Framed::from_parts(parts);

    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let on_error = handlers.error_handler();
    let outcome: io::Result<()> = async {
        loop {
            let starting = matches!(
                socket.state(),
                PgWireConnectionState::AwaitingStartup
                    | PgWireConnectionState::AuthenticationInProgress
            );
            let msg = if starting {
                tokio::select! {
                    _ = &mut startup_deadline => None,
                    _ = stopped(&mut shutdown) => None,
                    m = socket.next() => m,
                }
            } else {
                tokio::select! {
                    m = socket.next() => m,
                    _ = stopped(&mut shutdown) => {
                        let fatal = ErrorInfo::new(
                            "FATAL".into(),
                            super::sqlstate::code::ADMIN_SHUTDOWN.into(),
                            "terminating connection due to administrator command".into(),
                        );
                        socket.send(PgWireBackendMessage::ErrorResponse(fatal.into())).await?;
                        return Ok(());
                    }
                }
            };
            let Some(Ok(msg)) = msg else {
                return Ok(());
            };
            // Terminate: the client is leaving, and some (asyncpg) wait for the server to
            // close before they return from close().
            if matches!(msg, PgWireFrontendMessage::Terminate(_)) {
                return Ok(());
            }
            // CopyDone: pgwire's own answer ends a simple-protocol COPY with ReadyForQuery
            // "idle" even inside a transaction block, and leaves an extended-protocol one
            // in copy mode, where the Sync that follows is ignored and the client waits.
            if let PgWireConnectionState::CopyInProgress(in_extended) = socket.state()
                && let PgWireFrontendMessage::CopyDone(done) = msg
            {
                socket.set_state(PgWireConnectionState::ReadyForQuery);
                match copy.on_copy_done(&mut socket, done).await {
                    Ok(()) if in_extended => {}
                    Ok(()) => {
                        let status = socket.transaction_status();
                        socket
                            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                                status,
                            )))
                            .await?;
                    }
                    Err(mut e) => {
                        on_error.on_error(&socket, &mut e);
                        process_error(&mut socket, e, in_extended).await?;
                    }
                }
                continue;
            }
            // Counted while handled, so that queries know the cores are shared.
            let _handling = crate::index::parallel::handling_a_message();
            let in_extended = match socket.state() {
                PgWireConnectionState::CopyInProgress(extended) => extended,
                _ => msg.is_extended_query(),
            };
            let processing = process_message(
                msg,
                &mut socket,
                startup.clone(),
                simple.clone(),
                extended.clone(),
                copy.clone(),
                cancel.clone(),
            );
            // A client that leaves while its statement runs stops it: dropping the
            // statement's future drops its streams and tasks (as a cancel does), instead of
            // computing an answer nobody will read.
            let processed = match &peer {
                Some(peer) => tokio::select! {
                    processed = processing => processed,
                    _ = peer.gone() => return Ok(()),
                },
                None => processing.await,
            };
            if let Err(mut e) = processed {
                on_error.on_error(&socket, &mut e);
                match fatal_error(e) {
                    // PostgreSQL ends the session after a FATAL error with no ReadyForQuery
                    // (pgwire sends one, which asyncpg rejects mid-authentication).
                    Ok(fatal) => {
                        socket
                            .send(PgWireBackendMessage::ErrorResponse(fatal.into()))
                            .await?;
                        return Ok(());
                    }
                    Err(e) => process_error(&mut socket, e, in_extended).await?,
                }
            }
        }
    }
    .await;
    // What is still held (a FATAL error's message, say) is sent before the socket closes.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, socket.close()).await;
    outcome
}

/// The error to end the session with if `error` is FATAL (else `error` back), in
/// PostgreSQL's words for a refused password (`password authentication failed for user
/// "…"`, which clients match).
fn fatal_error(error: PgWireError) -> Result<ErrorInfo, PgWireError> {
    match error {
        PgWireError::InvalidPassword(user) => Ok(ErrorInfo::new(
            "FATAL".into(),
            super::sqlstate::code::INVALID_PASSWORD.into(),
            format!("password authentication failed for user \"{user}\""),
        )),
        PgWireError::UserError(info) if info.is_fatal() => Ok(*info),
        other => Err(other),
    }
}

/// Answers a connection the server will not serve (past `--max-connections`) as
/// PostgreSQL does: after the TLS negotiation and the startup packet, one FATAL error. A
/// cancel request is still served, so that a client can stop a statement of a full server.
pub async fn refuse(
    tcp: TcpStream,
    tls: Option<pgwire::tokio::TlsAcceptor>,
    cancel: impl CancelHandler,
    sqlstate: &str,
    message: &str,
) {
    let _ = tokio::time::timeout(STARTUP_TIMEOUT, async {
        let Ok(Some(mut socket)) = negotiate_tls::<()>(tcp, tls).await else {
            return;
        };
        match socket.next().await {
            Some(Ok(PgWireFrontendMessage::CancelRequest(request))) => {
                cancel.on_cancel_request(request).await;
            }
            Some(Ok(_)) => {
                let fatal = ErrorInfo::new("FATAL".into(), sqlstate.into(), message.into());
                let _ = socket
                    .send(PgWireBackendMessage::ErrorResponse(fatal.into()))
                    .await;
            }
            _ => {}
        }
        let _ = socket.close().await;
    })
    .await;
}

/// Resolves once `shutdown` is true (or its sender is gone), holding no borrow of it after.
async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// A second handle on a connection's TCP socket, watched while the message loop is busy
/// with a statement (and so not reading) to notice the client leaving, as PostgreSQL's
/// `client_connection_check_interval` does (also by `POLLRDHUP`).
struct PeerWatch {
    socket: TcpStream,
}

/// How often a busy connection with unread input looks again whether its client has gone.
const PEER_CHECK_INTERVAL: Duration = Duration::from_millis(50);

impl PeerWatch {
    /// `tcp` back, and a watch on a duplicate of its descriptor (none if the descriptor
    /// cannot be duplicated: the client's leaving is then noticed at the next read).
    fn of(tcp: TcpStream) -> io::Result<(TcpStream, Option<PeerWatch>)> {
        let std = tcp.into_std()?;
        let duplicate = std.try_clone().ok();
        let tcp = TcpStream::from_std(std)?;
        let peer = duplicate
            .and_then(|d| TcpStream::from_std(d).ok())
            .map(|socket| PeerWatch { socket });
        Ok((tcp, peer))
    }

    /// Resolves once the client has closed its side or the connection broke; never while
    /// it is connected. Input waiting to be read (a pipelined message) is left unread.
    async fn gone(&self) {
        loop {
            if self.socket.readable().await.is_err() || hung_up(&self.socket) {
                return;
            }
            // Readable, not hung up: input is waiting, and stays readable until the loop
            // reads it, so look again after a while instead of spinning.
            tokio::time::sleep(PEER_CHECK_INTERVAL).await;
        }
    }
}

/// Whether the peer closed its side, reset, or the socket failed (without reading).
#[cfg(target_os = "linux")]
fn hung_up(socket: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for a descriptor we own, a zero timeout.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Elsewhere the client's leaving is noticed at the next read.
#[cfg(not(target_os = "linux"))]
fn hung_up(_: &TcpStream) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    /// What the peer can read at once, without waiting.
    async fn readable_now(peer: &mut tokio::io::DuplexStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while let Some(n) = peer.read(&mut buf).now_or_never() {
            let n = n.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[tokio::test]
    async fn writes_wait_for_the_next_read() {
        let (ours, mut peer) = duplex(1 << 20);
        let mut socket = FlushBeforeRead::new(ours);
        socket.write_all(b"BindComplete").await.unwrap();
        socket.flush().await.unwrap();
        socket.write_all(b"+ReadyForQuery").await.unwrap();
        socket.flush().await.unwrap();
        assert_eq!(readable_now(&mut peer).await, b"");
        assert_eq!(socket.held(), 26);

        // The server reads: everything it wrote leaves first, in one piece.
        peer.write_all(b"next query").await.unwrap();
        let mut buf = [0u8; 10];
        socket.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"next query");
        assert_eq!(readable_now(&mut peer).await, b"BindComplete+ReadyForQuery");
        assert_eq!(socket.held(), 0);
    }

    #[tokio::test]
    async fn a_read_that_waits_has_sent_everything() {
        let (ours, mut peer) = duplex(1 << 20);
        let mut socket = FlushBeforeRead::new(ours);
        socket.write_all(b"answer").await.unwrap();
        let mut buf = [0u8; 1];
        // Nothing to read yet: the read is pending, and the answer has gone.
        assert!(socket.read(&mut buf).now_or_never().is_none());
        assert_eq!(readable_now(&mut peer).await, b"answer");
    }

    #[tokio::test]
    async fn a_large_answer_is_sent_without_a_read() {
        let (ours, mut peer) = duplex(1 << 20);
        let mut socket = FlushBeforeRead::new(ours);
        let row = vec![7u8; 1000];
        for _ in 0..(HELD_BYTES / 1000 + 2) {
            socket.write_all(&row).await.unwrap();
            socket.flush().await.unwrap();
        }
        let arrived = readable_now(&mut peer).await;
        assert!(
            arrived.len() >= HELD_BYTES,
            "{} bytes arrived",
            arrived.len()
        );
        assert!(socket.held() < HELD_BYTES + 1000);
    }

    #[tokio::test]
    async fn shutdown_sends_what_is_held() {
        let (ours, mut peer) = duplex(1 << 20);
        let mut socket = FlushBeforeRead::new(ours);
        socket.write_all(b"FATAL").await.unwrap();
        socket.shutdown().await.unwrap();
        let mut all = Vec::new();
        peer.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"FATAL");
    }

    #[tokio::test]
    async fn a_full_peer_does_not_stop_the_server_reading() {
        // The peer's buffer holds 16 bytes and it is not reading: the held answer cannot
        // leave, yet the server still reads what the peer sends.
        let (ours, mut peer) = duplex(16);
        let mut socket = FlushBeforeRead::new(ours);
        socket.write_all(&[1u8; 100]).await.unwrap();
        peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        socket.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        assert_eq!(socket.held(), 100 - 16);
    }
}

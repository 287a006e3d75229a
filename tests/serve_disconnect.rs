//! A client that leaves while its statement runs: `fragvec serve` stops the statement (its
//! CPU falls to idle at once, instead of running to the end for nobody) and keeps serving
//! the other clients; at SIGTERM an idle connection is closed with FATAL 57P01 instead of
//! holding the server up. Spoken in the protocol's own bytes, so no client library decides when
//! the socket closes.

#[path = "support/server.rs"]
mod server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use server::ServeProcess;

/// A statement that keeps a core busy for minutes and sends nothing until it ends.
const LONG: &str = "SELECT count(*) FROM generate_series(1, 100000000000) AS s(v) WHERE v % 7 = 3";

fn startup(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut body = Vec::new();
    body.extend_from_slice(&196608u32.to_be_bytes()); // protocol 3.0
    for (k, v) in [("user", "fragvec"), ("database", "fragvec")] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    s.write_all(&msg).unwrap();
    read_until_ready(&mut s);
    s
}

/// Reads messages until ReadyForQuery; returns the tags of those read.
fn read_until_ready(s: &mut TcpStream) -> Vec<u8> {
    let mut tags = Vec::new();
    loop {
        let mut head = [0u8; 5];
        s.read_exact(&mut head).unwrap();
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        s.read_exact(&mut body).unwrap();
        tags.push(head[0]);
        if head[0] == b'Z' {
            return tags;
        }
    }
}

fn query(s: &mut TcpStream, sql: &str) {
    let mut msg = vec![b'Q'];
    msg.extend_from_slice(&((sql.len() + 5) as u32).to_be_bytes());
    msg.extend_from_slice(sql.as_bytes());
    msg.push(0);
    s.write_all(&msg).unwrap();
}

/// CPU seconds the process has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which ends with the last ')').
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// CPU seconds per second the process uses over `window`.
fn cpu_rate(pid: u32, window: Duration) -> f64 {
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(window);
    (cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64()
}

#[test]
#[cfg(target_os = "linux")]
fn a_statement_whose_client_left_stops() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &[], 1);
    let port: u16 = server
        .address("postgresql")
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let pid = server.pid();
    let mut leaving = startup(port);
    query(&mut leaving, LONG);
    std::thread::sleep(Duration::from_millis(300));
    let busy = cpu_rate(pid, Duration::from_secs(1));
    assert!(
        busy > 0.3,
        "the long statement should keep the server busy: {busy:.2} CPU s/s"
    );
    drop(leaving);
    // The server notices at once; give it a moment to drop the statement's work.
    std::thread::sleep(Duration::from_millis(500));
    let after = cpu_rate(pid, Duration::from_millis(1500));
    assert!(
        after < 0.1,
        "the statement went on after its client left: {after:.2} CPU s/s (was {busy:.2})"
    );
    // Other clients are served as before.
    let mut other = startup(port);
    query(&mut other, "SELECT 1");
    let tags = read_until_ready(&mut other);
    assert_eq!(
        tags, b"TDCZ",
        "RowDescription, DataRow, CommandComplete, ReadyForQuery"
    );
    // SIGTERM: an idle connection does not hold the server up for its grace period (30 s);
    // it is told why it is closed, as PostgreSQL tells it.
    let stopping = Instant::now();
    server.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "an idle connection held up SIGTERM for {:?}",
        stopping.elapsed()
    );
    let mut rest = Vec::new();
    other.read_to_end(&mut rest).unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        rest.first() == Some(&b'E') && text.contains("57P01") && text.contains("FATAL"),
        "the idle client got {text:?}"
    );
}

//! A real `fragvec` process driven through its shell: statements go in on stdin, results
//! come back as CSV on stdout, errors as `error: ...` lines on stderr. Both streams share one
//! pipe, so an error line arrives before the output of the statement after it; after each
//! statement a marker query (`SELECT 'FVMARK-n'`) tells where its output ends. A statement
//! that does not finish within its time bound, a panic message, or a process that dies is
//! reported as such: the process is then killed and a new one must be opened.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// How one statement ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Success: the rows it printed (CSV without the header, or JSON objects).
    Rows(Vec<String>),
    /// A clear error (the shell's one-line message, without `error: `).
    Error(String),
    /// A panic message was printed (the process may live on).
    Panicked(String),
    /// The process died (abort, crash): its exit status and last output.
    Died(String),
    /// No answer within the bound; the process was killed.
    TimedOut,
}

impl Outcome {
    /// The rows of a successful query: CSV lines without the header, or JSON lines.
    pub fn rows(&self) -> Option<&[String]> {
        match self {
            Outcome::Rows(lines) => Some(lines),
            _ => None,
        }
    }
}

/// A `fragvec --db <db> --format csv|json` shell process.
pub struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    marks: u64,
    dead: bool,
    json: bool,
}

/// The `fragvec` binary printing CSV, with a scratch HOME (the shell writes its history
/// there) and a terminal type that makes the shell print no prompts.
pub fn fragvec(db: &str) -> Command {
    fragvec_printing(db, "csv")
}

/// The binary under test: this build's, or another (`FRAGVEC_RELIABILITY_BIN`, e.g. an older
/// release, to see what the suite finds there).
fn binary() -> String {
    std::env::var("FRAGVEC_RELIABILITY_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_fragvec").to_string())
}

fn fragvec_printing(db: &str, format: &str) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("--db")
        .arg(db)
        .arg("--format")
        .arg(format)
        .env("HOME", std::env::temp_dir())
        .env("TERM", "xterm")
        .env("RUST_BACKTRACE", "0");
    command
}

impl Shell {
    /// A shell printing CSV (a header line, then one line per row).
    pub fn open(db: &Path) -> Shell {
        Self::spawn(db, false)
    }

    /// A shell printing one JSON object per row and no header (CSV cannot print vectors).
    pub fn open_json(db: &Path) -> Shell {
        Self::spawn(db, true)
    }

    fn spawn(db: &Path, json: bool) -> Shell {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        let format = if json { "json" } else { "csv" };
        let mut child = fragvec_printing(db.to_str().expect("UTF-8 path"), format)
            .stdin(Stdio::piped())
            .stdout(writer.try_clone().expect("a pipe"))
            .stderr(writer)
            .spawn()
            .expect("run fragvec");
        let stdin = child.stdin.take().expect("stdin");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Shell {
            child,
            stdin,
            lines,
            marks: 0,
            dead: false,
            json,
        }
    }

    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Runs one statement (or several separated by `;`, on one line), waiting at most
    /// `bound` for it.
    pub fn run(&mut self, sql: &str, bound: Duration) -> Outcome {
        assert!(!self.dead, "the shell process is gone");
        self.marks += 1;
        let mark = format!("FVMARK-{}", self.marks);
        let statement = sql.replace('\n', " ");
        let statement = statement.trim().trim_end_matches(';');
        let input = format!("{statement};\nSELECT '{mark}' AS fvmark;\n");
        if self.stdin.write_all(input.as_bytes()).is_err() || self.stdin.flush().is_err() {
            return self.died(Vec::new());
        }
        let deadline = Instant::now() + bound;
        let mut lines = Vec::new();
        let json_mark = format!("{{\"fvmark\":\"{mark}\"}}");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == mark || line == json_mark => break,
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    self.kill();
                    return Outcome::TimedOut;
                }
                Err(RecvTimeoutError::Disconnected) => return self.died(lines),
            }
        }
        // The marker query's header.
        if lines.last().is_some_and(|l| l == "fvmark") {
            lines.pop();
        }
        lines.retain(|l| !l.starts_with("fragvec shell on "));
        // The statement's CSV header (a statement without columns prints nothing).
        if !self.json && !lines.is_empty() && !lines.iter().any(|l| l.starts_with("error: ")) {
            lines.remove(0);
        }
        if let Some(p) = lines.iter().find(|l| l.contains("panicked")) {
            return Outcome::Panicked(p.clone());
        }
        if let Some(e) = lines.iter().find_map(|l| l.strip_prefix("error: ")) {
            return Outcome::Error(e.to_string());
        }
        Outcome::Rows(lines)
    }

    fn died(&mut self, lines: Vec<String>) -> Outcome {
        self.dead = true;
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        let rest: Vec<String> = self.lines.try_iter().collect();
        let mut all = lines;
        all.extend(rest);
        // A database that cannot be opened exits at once with a clear error.
        if status.contains("exit status: 1")
            && let Some(e) = all.iter().find_map(|l| l.strip_prefix("error: "))
            && !all.iter().any(|l| l.contains("panicked"))
        {
            return Outcome::Error(e.to_string());
        }
        let tail = all.iter().rev().take(5).rev().cloned().collect::<Vec<_>>();
        Outcome::Died(format!("{status}: {}", tail.join(" | ")))
    }

    fn kill(&mut self) {
        if !self.dead {
            self.dead = true;
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `statements` on a fresh shell, each expected to succeed; panics with the statement
/// otherwise.
pub fn run_all(db: &Path, statements: &[&str]) {
    let mut shell = Shell::open(db);
    for sql in statements {
        match shell.run(sql, Duration::from_secs(120)) {
            Outcome::Rows(_) => {}
            other => panic!("{sql}: {other:?}"),
        }
    }
}

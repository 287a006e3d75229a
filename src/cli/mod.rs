//! The `fragvec` command line: run SQL from `-c` / `-f`, an interactive shell, or the demo.

pub mod demo;
pub mod describe;
pub mod output;
pub mod progress;
pub mod serve;
pub mod shell;
#[cfg(feature = "distributed")]
pub mod worker;

use clap::{Parser, Subcommand, ValueEnum};

/// Default database directory when `--db` is not given.
pub const DEFAULT_DB: &str = "fragvec-db";

#[derive(Parser, Debug)]
#[command(
    name = "fragvec",
    version,
    about = "SQL over versioned vector tables (Apache DataFusion)"
)]
pub struct Cli {
    /// Database location: a directory, file://..., or memory://[name] (default fragvec-db;
    /// for `worker`: the only database it serves, default any the coordinator names).
    #[arg(long, global = true)]
    pub db: Option<String>,
    /// Run queries on these workers (`fragvec worker`): http://host:port,http://host:port
    #[cfg(feature = "distributed")]
    #[arg(long, value_delimiter = ',')]
    pub workers: Vec<String>,
    /// SQL to run (may be given several times; runs in order, before -f).
    #[arg(short = 'c', long = "command")]
    pub commands: Vec<String>,
    /// A file of SQL statements to run.
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    pub format: Format,
    /// Progress bars of long statements on stderr (auto: when stderr is a terminal).
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto, global = true)]
    pub progress: ProgressMode,
    /// Print each statement's wall time on stderr (`\timing` toggles it in the shell).
    #[arg(long, global = true)]
    pub timing: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a demo table with generated vectors and take a short tour of what fragvec does.
    Demo,
    /// Run a worker executing parts of queries for coordinators (`fragvec --workers ...`).
    #[cfg(feature = "distributed")]
    Worker {
        /// Address to listen on (port 0: any free port); the worker prints its URL.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
    /// Serve the database to PostgreSQL clients (psql, psycopg + pgvector, asyncpg, pools)
    /// until SIGTERM or Ctrl-C.
    Serve(serve::ServeArgs),
}

impl Cli {
    /// The database location (`--db`, default [`DEFAULT_DB`]).
    pub fn database(&self) -> &str {
        self.db.as_deref().unwrap_or(DEFAULT_DB)
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned text tables.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON object per row, one row per line.
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// When stderr is a terminal.
    Auto,
    /// Always, also into a file or pipe (as plain lines).
    Always,
    /// Never.
    Never,
}

/// How long a statement took, as `--timing` and `\timing` print it.
pub fn timing_line(elapsed: std::time::Duration) -> String {
    format!("Time: {:.3} ms", elapsed.as_secs_f64() * 1000.0)
}

/// An error message on one line (DataFusion's messages may span several).
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

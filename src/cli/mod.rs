//! The `fragvec` command line: run SQL from `-c` / `-f`, an interactive shell, or the demo.

pub mod demo;
pub mod describe;
pub mod maintain;
pub mod output;
pub mod progress;
pub mod serve;
pub mod shell;
#[cfg(feature = "distributed")]
pub mod worker;

use clap::{Parser, Subcommand, ValueEnum};

/// What `fragvec --help` ends with.
const EXAMPLES: &str = "\
Examples:
  fragvec demo                                   a table of generated vectors and a tour
  fragvec                                        the interactive shell (\\? lists its commands)
  fragvec -c \"CREATE TABLE t (id BIGINT, emb VECTOR(3))\" -c \"INSERT INTO t VALUES (1, [1, 2, 3])\"
  fragvec -f load.sql --format csv --timing      statements from a file, CSV results, timings
  fragvec --db s3://bucket/db -c \"SELECT count(*) FROM t\"
  fragvec serve --pg 127.0.0.1:5433 --flight 127.0.0.1:5434
  fragvec worker --listen 127.0.0.1:50051        (and fragvec --workers http://127.0.0.1:50051 ...)

fragvec help <command> shows a command's options; the docs: docs/README.md";

/// Default database directory when `--db` is not given.
pub const DEFAULT_DB: &str = "fragvec-db";

/// The command line (its help text comes from `about` and the fields' doc comments).
#[derive(Parser, Debug)]
#[command(
    name = "fragvec",
    version,
    about = "SQL over versioned vector tables (Apache DataFusion)",
    long_about = None,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Database location: a directory, file://..., s3://bucket/prefix (credentials from the
    /// AWS_* environment), or memory://NAME (NAME optional; default fragvec-db; for `worker`: the only
    /// database it serves, default any the coordinator names).
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
    /// The subcommand, if any (clap ignores a doc comment on a subcommand field).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `fragvec`'s subcommands (without one, it runs SQL or the shell).
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
    /// and, with --flight, Arrow Flight SQL clients (ADBC, pyarrow) until SIGTERM or Ctrl-C.
    #[command(after_help = serve::EXAMPLES)]
    Serve(serve::ServeArgs),
    /// Maintain the database's tables in the foreground (index, compact, merge, vacuum as
    /// their properties say) until SIGTERM or Ctrl-C; for databases no `serve` maintains.
    #[command(after_help = maintain::EXAMPLES)]
    Maintain(maintain::MaintainArgs),
}

impl Cli {
    /// The database location (`--db`, default [`DEFAULT_DB`]).
    pub fn database(&self) -> &str {
        self.db.as_deref().unwrap_or(DEFAULT_DB)
    }
}

/// How results print (`--format`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned text tables.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON object per row, one row per line.
    Json,
}

/// When progress bars show (`--progress`).
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

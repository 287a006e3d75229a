//! The `fragvec` command line: run SQL from `-c` / `-f`, an interactive shell, or the demo.

pub mod demo;
pub mod output;
pub mod shell;

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
    /// Database location: a directory, file://..., or memory://[name].
    #[arg(long, global = true, default_value = DEFAULT_DB)]
    pub db: String,
    /// SQL to run (may be given several times; runs in order, before -f).
    #[arg(short = 'c', long = "command")]
    pub commands: Vec<String>,
    /// A file of SQL statements to run.
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    pub format: Format,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a demo table with generated vectors and take a short tour of what fragvec does.
    Demo,
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

/// An error message on one line (DataFusion's messages may span several).
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

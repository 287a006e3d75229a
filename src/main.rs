//! The `fragvec` binary. See [`fragvec::cli`] — kept in the library so it is tested with it.

use clap::Parser;
use fragvec::FragvecSession;
use fragvec::cli::{Cli, Command, demo, output, progress, shell, timing_line};

/// mimalloc rather than glibc's malloc: a server's concurrent queries allocate and free many
/// small buffers at once (docs/benchmarks.md, "Serving").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli).await {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("error: {}", fragvec::cli::one_line(&message));
            1
        }
    };
    std::process::exit(code);
}

async fn run(cli: Cli) -> Result<(), String> {
    #[cfg(feature = "distributed")]
    if let Some(Command::Worker { listen }) = &cli.command {
        return fragvec::cli::worker::run(*listen, cli.db.as_deref()).await;
    }
    let session = open(&cli).await.map_err(|e| e.to_string())?;
    if let Some(Command::Serve(args)) = &cli.command {
        return fragvec::cli::serve::run(session, args, cli.database()).await;
    }
    if let Some(Command::Maintain(args)) = &cli.command {
        return fragvec::cli::maintain::run(session, args).await;
    }
    progress::install(&session, cli.progress);
    if let Some(Command::Demo) = cli.command {
        return demo::run(&session, cli.format).await;
    }
    let mut settings = shell::Settings {
        format: cli.format,
        timing: cli.timing,
    };
    let mut scripts: Vec<String> = cli.commands.clone();
    if let Some(path) = &cli.file {
        scripts.push(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        );
    }
    if scripts.is_empty() {
        return shell::run(&session, settings).await;
    }
    let mut out = std::io::stdout();
    let mut number = 0;
    for script in &scripts {
        // A command line of its own may be one of the shell's backslash commands (`-c '\d t'`).
        if script.trim_start().starts_with('\\') {
            number += 1;
            shell::command(&session, script, &mut settings)
                .await
                .map_err(|e| format!("statement {number}: {e}"))?;
            continue;
        }
        let statements = fragvec::sql::parse_statements(script)
            .map_err(|e| format!("statement {}: {e}", number + 1))?;
        for statement in statements {
            number += 1;
            let started = std::time::Instant::now();
            let result = session
                .execute(statement)
                .await
                .map_err(|e| format!("statement {number}: {e}"))?;
            let elapsed = started.elapsed();
            output::print(&result, settings.format, &mut out).map_err(|e| e.to_string())?;
            if settings.timing {
                eprintln!("{}", timing_line(elapsed));
            }
        }
    }
    Ok(())
}

async fn open(cli: &Cli) -> datafusion::common::Result<FragvecSession> {
    #[cfg(feature = "distributed")]
    if !cli.workers.is_empty() {
        return FragvecSession::with_workers(cli.database(), &cli.workers).await;
    }
    FragvecSession::open(cli.database()).await
}

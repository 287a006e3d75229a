//! The interactive shell: multi-line statements ended by `;`, with history, and backslash
//! commands (`\?` lists them): `\d` lists tables, `\d t` describes one, `\timing` toggles
//! printing each statement's wall time, `\q` quits.

use std::time::Instant;

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::output::print;
use super::{Format, describe, timing_line};
use crate::engine::FragvecSession;
use crate::sql::parse_statements;

/// The shell's backslash commands and what they do, as `\?` prints them.
pub const COMMANDS: [(&str, &str); 6] = [
    ("\\?", "list these commands"),
    (
        "\\d",
        "list tables and views (rows, fragments, indexes, version)",
    ),
    (
        "\\d NAME",
        "describe a table: columns, fragments, indexes, clustering key, version",
    ),
    (
        "\\timing [on|off]",
        "toggle printing each statement's wall time (on stderr)",
    ),
    ("\\q", "quit (also quit, exit, end of input)"),
    ("SQL;", "statements end with ';' and may span lines"),
];

/// Settings the shell's commands change.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How results print (`\format`).
    pub format: Format,
    /// Whether each statement's wall time prints (`\timing`).
    pub timing: bool,
}

/// What a backslash command asks of the shell.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Read the next line.
    Continue,
    /// Leave the shell (`\q`).
    Quit,
}

/// Runs the backslash command `line` (starting with `\`); its output goes to stdout.
pub async fn command(
    session: &FragvecSession,
    line: &str,
    settings: &mut Settings,
) -> Result<Outcome, String> {
    let line = line.trim();
    let (name, argument) = match line.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, rest.trim()),
        None => (line, ""),
    };
    match (name, argument) {
        ("\\q", "") => return Ok(Outcome::Quit),
        ("\\?", "") => {
            let width = COMMANDS.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
            for (command, what) in COMMANDS {
                println!("  {command:width$}  {what}");
            }
        }
        ("\\timing", "") => settings.timing = !settings.timing,
        ("\\timing", "on") => settings.timing = true,
        ("\\timing", "off") => settings.timing = false,
        ("\\timing", other) => {
            return Err(format!("\\timing takes on or off, not '{other}'"));
        }
        ("\\d", "") => println!("{}", describe::list(session).await.map_err(one_line)?),
        ("\\d", table) => println!(
            "{}",
            describe::describe(session, table).await.map_err(one_line)?
        ),
        _ => return Err(format!("unknown command {line} (\\? lists the commands)")),
    }
    if name == "\\timing" {
        println!("Timing is {}.", if settings.timing { "on" } else { "off" });
    }
    Ok(Outcome::Continue)
}

fn one_line(e: impl ToString) -> String {
    super::one_line(&e.to_string())
}

/// Runs every statement of `sql` in order, printing each result (and with timing, its wall
/// time on stderr). Stops at the first error, naming the statement when `sql` has several.
pub async fn run_statements(
    session: &FragvecSession,
    sql: &str,
    settings: Settings,
) -> Result<(), String> {
    let statements = parse_statements(sql).map_err(one_line)?;
    let many = statements.len() > 1;
    let mut out = std::io::stdout();
    for (i, statement) in statements.into_iter().enumerate() {
        let started = Instant::now();
        let result = session.execute(statement).await.map_err(|e| {
            if many {
                format!("statement {}: {}", i + 1, one_line(e))
            } else {
                one_line(e)
            }
        })?;
        let elapsed = started.elapsed();
        print(&result, settings.format, &mut out).map_err(one_line)?;
        if settings.timing {
            eprintln!("{}", timing_line(elapsed));
        }
    }
    Ok(())
}

fn history_path() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".fragvec_history"))
}

/// Runs the shell until end of input or `\q`. Errors are printed, never fatal.
pub async fn run(session: &FragvecSession, mut settings: Settings) -> Result<(), String> {
    let mut editor = DefaultEditor::new().map_err(|e| e.to_string())?;
    let history = history_path();
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    println!(
        "fragvec shell on {} — end statements with ';', \\? for help, \\q to quit",
        session.database().location()
    );
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "fragvec> "
        } else {
            "     ... "
        };
        match editor.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() && (trimmed == "quit" || trimmed == "exit") {
                    break;
                }
                if buffer.is_empty() && trimmed.starts_with('\\') {
                    let _ = editor.add_history_entry(trimmed);
                    match command(session, trimmed, &mut settings).await {
                        Ok(Outcome::Quit) => break,
                        Ok(Outcome::Continue) => {}
                        Err(e) => eprintln!("error: {e}"),
                    }
                    continue;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if !trimmed.ends_with(';') {
                    continue;
                }
                let _ = editor.add_history_entry(buffer.trim());
                if let Err(e) = run_statements(session, &buffer, settings).await {
                    eprintln!("error: {e}");
                }
                buffer.clear();
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}

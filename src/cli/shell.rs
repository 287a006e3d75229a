//! The interactive shell: multi-line statements ended by `;`, with history.

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::Format;
use super::output::print;
use crate::engine::FragvecSession;

fn history_path() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".fragvec_history"))
}

/// Runs the shell until end of input or `\q`. Errors are printed, never fatal.
pub async fn run(session: &FragvecSession, format: Format) -> Result<(), String> {
    let mut editor = DefaultEditor::new().map_err(|e| e.to_string())?;
    let history = history_path();
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    println!(
        "fragvec shell on {} — end statements with ';', \\q to quit",
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
                if buffer.is_empty() && (trimmed == "\\q" || trimmed == "quit" || trimmed == "exit")
                {
                    break;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if !trimmed.ends_with(';') {
                    continue;
                }
                let _ = editor.add_history_entry(buffer.trim());
                match session.sql(&buffer).await {
                    Ok(results) => {
                        let mut out = std::io::stdout();
                        for r in &results {
                            if let Err(e) = print(r, format, &mut out) {
                                eprintln!("error: {e}");
                            }
                        }
                    }
                    Err(e) => eprintln!("error: {}", super::one_line(&e.to_string())),
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

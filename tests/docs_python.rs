//! Every Python example of README.md and docs/*.md runs against a real `fragvec serve`, with
//! the clients the page names (psycopg + pgvector, ADBC's Flight SQL driver), so a quick
//! start a newcomer copies cannot rot.
//!
//! The format: a fenced block whose info string is exactly `python` is run, each block by
//! itself against a fresh server and database (both endpoints), after the page's addresses
//! (`port=5433`, `127.0.0.1:5433`, `127.0.0.1:5434`) are replaced by the server's. A block
//! must exit 0; one that shows a fragment of a program is marked `python no-run`.
//!
//! The clients live in the virtualenv `.ci/pg-clients setup` makes (which `.ci/run` calls);
//! without it (`FRAGVEC_PG_PYTHON` unset) the test says so and passes, unless
//! `FRAGVEC_REQUIRE_PG_CLIENTS=1`.

#[path = "support/doc_pages.rs"]
mod doc_pages;
#[path = "support/server.rs"]
mod server;

use std::process::Command;

use server::ServeProcess;

/// The `python` blocks of a page, each with the line its fence opens on.
fn python_blocks(page: &str) -> Vec<(usize, String)> {
    let mut blocks = vec![];
    let mut open: Option<(usize, String, Vec<&str>)> = None;
    for (n, line) in page.lines().enumerate() {
        match open.take() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some((n + 1, info.trim().to_string(), vec![]));
                }
            }
            Some((start, info, body)) if line.starts_with("```") => {
                if info == "python" {
                    blocks.push((start, body.join("\n")));
                }
            }
            Some((start, info, mut body)) => {
                body.push(line);
                open = Some((start, info, body));
            }
        }
    }
    assert!(open.is_none(), "a fence is never closed");
    blocks
}

/// The block with the page's addresses replaced by `server`'s.
fn against(block: &str, server: &ServeProcess) -> String {
    let pg = server.pg_port();
    let flight = server
        .address("grpc")
        .trim_start_matches("grpc://")
        .to_string();
    block
        .replace("port=5433", &format!("port={pg}"))
        .replace("127.0.0.1:5433", &format!("127.0.0.1:{pg}"))
        .replace("127.0.0.1:5434", &flight)
}

#[test]
fn python_examples_of_the_pages_run_against_fragvec_serve() {
    let Some(python) = server::client_python() else {
        return;
    };
    let mut ran = 0;
    for page in doc_pages::pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, block) in python_blocks(&text) {
            let dir = tempfile::tempdir().unwrap();
            let server =
                ServeProcess::start(&dir.path().join("db"), &["--flight", "127.0.0.1:0"], 2);
            let script = dir.path().join("example.py");
            std::fs::write(&script, against(&block, &server)).unwrap();
            let out = Command::new(&python).arg(&script).output().unwrap();
            let name = format!("{}:{line}", page.display());
            assert!(
                out.status.success(),
                "the Python example at {name} failed:\n{block}\n--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            println!("{name}: ran");
            server.stop();
            ran += 1;
        }
    }
    // README's two quick starts, docs/flight-sql.md's and docs/serving.md's at least.
    assert!(ran >= 4, "only {ran} Python examples found");
}

#[test]
fn blocks_are_found_and_marked_ones_left_out() {
    let page = "text\n```python\na = 1\n```\n```python no-run\nb\n```\n```sql\nc\n```\n";
    assert_eq!(python_blocks(page), vec![(2, "a = 1".to_string())]);
}

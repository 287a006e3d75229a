//! Every runnable SQL example in README.md and docs/*.md runs, and prints what the page says.
//!
//! The format (docs/architecture.md, "Examples that cannot rot"): a fenced block whose info
//! string is exactly `sql` is run; the blocks of one page run in order in one session over a
//! fresh database of that page. If the next fenced block is `text` with only blank lines
//! between, it is the output of the block's last statement as the `fragvec` CLI prints it
//! (table format). `sql no-run` blocks are not run (the page says why).

use std::path::Path;

#[path = "support/doc_pages.rs"]
mod doc_pages;

use fragvec::FragvecSession;
use fragvec::cli::Format;
use fragvec::cli::output::print;

/// One fenced block: its info string, its text, and the line it starts on.
struct Block {
    info: String,
    body: String,
    line: usize,
    /// Only blank lines since the previous block's closing fence.
    follows_closely: bool,
}

fn blocks(page: &str) -> Vec<Block> {
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut blank_since_last = true;
    while i < lines.len() {
        let line = lines[i];
        let fence_len = line.chars().take_while(|c| *c == '`' || *c == '~').count();
        if fence_len >= 3 {
            let fence = &line[..fence_len];
            let info = line[fence_len..].trim().to_string();
            let mut j = i + 1;
            while j < lines.len() && !lines[j].starts_with(fence) {
                j += 1;
            }
            out.push(Block {
                info,
                body: lines[i + 1..j.min(lines.len())].join("\n"),
                line: i + 1,
                follows_closely: blank_since_last,
            });
            blank_since_last = true;
            i = j + 1;
            continue;
        }
        if !line.trim().is_empty() {
            blank_since_last = false;
        }
        i += 1;
    }
    out
}

/// Runs one page's examples; returns the mismatches and errors, described.
async fn check_page(path: &Path) -> (usize, Vec<String>) {
    let page = std::fs::read_to_string(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let session = FragvecSession::open(dir.path().join("db").to_str().unwrap())
        .await
        .unwrap();
    let blocks = blocks(&page);
    let mut problems = Vec::new();
    let mut ran = 0;
    for (k, block) in blocks.iter().enumerate() {
        if block.info != "sql" {
            continue;
        }
        ran += 1;
        let statements = match session.parse(&block.body) {
            Ok(s) if !s.is_empty() => s,
            Ok(_) => {
                problems.push(format!("{name}:{}: an empty sql block", block.line));
                continue;
            }
            Err(e) => {
                problems.push(format!("{name}:{}: does not parse: {e}", block.line));
                continue;
            }
        };
        let mut last = Vec::new();
        let mut failed = false;
        for statement in statements {
            match session.execute(statement).await {
                Ok(result) => {
                    last.clear();
                    print(&result, Format::Table, &mut last).unwrap();
                }
                Err(e) => {
                    problems.push(format!("{name}:{}: {e}", block.line));
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            continue;
        }
        if let Some(expected) = blocks.get(k + 1)
            && expected.info == "text"
            && expected.follows_closely
        {
            let got = String::from_utf8(last).unwrap();
            let got = got.trim_end_matches('\n');
            if got != expected.body {
                problems.push(format!(
                    "{name}:{}: the output differs from the page's (line {})\n--- page\n{}\n--- got\n{got}",
                    block.line, expected.line, expected.body
                ));
            }
        }
    }
    (ran, problems)
}

#[tokio::test]
async fn sql_examples_in_the_docs_print_what_they_say() {
    let mut problems = Vec::new();
    let mut total = 0;
    for page in doc_pages::pages() {
        let (ran, p) = check_page(&page).await;
        total += ran;
        problems.extend(p);
    }
    assert!(total >= 20, "only {total} runnable examples found");
    assert!(
        problems.is_empty(),
        "{} of {total} examples failed:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

#[test]
fn the_block_reader_pairs_outputs_only_when_adjacent() {
    let page = "```sql\nSELECT 1;\n```\n\n```text\n1\n```\nprose\n```text\nnot an output\n```\n";
    let b = blocks(page);
    assert_eq!(b.len(), 3);
    assert!(b[1].follows_closely && b[1].info == "text" && b[1].body == "1");
    assert!(!b[2].follows_closely);
}

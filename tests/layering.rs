//! The layers' arrows point one way:
//! `cli → serve → distributed → engine → sql → maintain → rewrite → index → format → ledger`.
//!
//! Reads every file under `src/` and fails when a file of one layer names a higher layer
//! (`crate::engine` in `index`, `crate::format` in `ledger`, ...), when a layer below the
//! engine names DataFusion's planner (only `engine` implements DataFusion traits; lower
//! layers speak Arrow, Parquet and object_store), or when a layer below `distributed` names
//! datafusion-distributed or datafusion-proto. Comments are not code and are skipped, so a
//! doc link upwards is allowed.

use std::path::{Path, PathBuf};

/// Lowest first.
const LAYERS: [&str; 10] = [
    "ledger",
    "format",
    "index",
    "rewrite",
    "maintain",
    "sql",
    "engine",
    "distributed",
    "serve",
    "cli",
];

/// Crates only the `distributed` layer (and the CLI above it) may name.
const DISTRIBUTION: [&str; 2] = ["datafusion_distributed", "datafusion_proto"];

/// DataFusion modules only the engine (and the CLI above it) may name.
const PLANNER: [&str; 8] = [
    "logical_expr",
    "physical_plan",
    "physical_expr",
    "execution",
    "catalog",
    "datasource",
    "optimizer",
    "prelude",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments, doc comments and block comments).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (n, line) in text.lines().enumerate() {
        let mut code = String::new();
        let mut rest = line;
        loop {
            if in_block {
                match rest.find("*/") {
                    Some(end) => {
                        in_block = false;
                        rest = &rest[end + 2..];
                    }
                    None => break,
                }
            } else {
                let line_comment = rest.find("//");
                let block = rest.find("/*");
                match (line_comment, block) {
                    (Some(l), b) if b.is_none_or(|b| l < b) => {
                        code.push_str(&rest[..l]);
                        break;
                    }
                    (_, Some(b)) => {
                        code.push_str(&rest[..b]);
                        in_block = true;
                        rest = &rest[b + 2..];
                    }
                    _ => {
                        code.push_str(rest);
                        break;
                    }
                }
            }
        }
        out.push((n + 1, code));
    }
    out
}

/// Violations of the layering rules in `src/`.
fn violations(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (rank, layer) in LAYERS.iter().enumerate() {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "layer {layer} has no files under src/");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, code) in code_lines(&text) {
                for higher in &LAYERS[rank + 1..] {
                    for path in [format!("crate::{higher}"), format!("fragvec::{higher}")] {
                        if code.contains(&format!("{path}::")) || code.contains(&format!("{path};"))
                        {
                            found.push(format!(
                                "{}:{line}: {layer} names the higher layer {higher}: {}",
                                file.display(),
                                code.trim()
                            ));
                        }
                    }
                }
                if rank < LAYERS.iter().position(|l| *l == "distributed").unwrap() {
                    for krate in DISTRIBUTION {
                        if code.contains(&format!("{krate}::")) {
                            found.push(format!(
                                "{}:{line}: {layer} names {krate}, which only distributed may: {}",
                                file.display(),
                                code.trim()
                            ));
                        }
                    }
                }
                if rank < LAYERS.iter().position(|l| *l == "engine").unwrap() {
                    for module in PLANNER {
                        if code.contains(&format!("datafusion::{module}")) {
                            found.push(format!(
                                "{}:{line}: {layer} names DataFusion's planner ({module}): {}",
                                file.display(),
                                code.trim()
                            ));
                        }
                    }
                }
            }
        }
    }
    found
}

#[test]
fn lower_layers_never_name_higher_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(
        found.is_empty(),
        "layering violations:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_an_upward_import_and_ignores_comments() {
    let tmp = tempfile::tempdir().unwrap();
    for layer in LAYERS {
        std::fs::create_dir_all(tmp.path().join(layer)).unwrap();
        std::fs::write(tmp.path().join(layer).join("mod.rs"), "//! fine\n").unwrap();
    }
    std::fs::write(
        tmp.path().join("ledger/bad.rs"),
        "/// see [`crate::engine::X`]\n/* crate::sql::Y */ use crate::format::Z;\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("index/bad.rs"),
        "use datafusion::physical_plan::ExecutionPlan; // crate::cli::\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("engine/bad.rs"),
        "use crate::distributed::X;\nuse datafusion_distributed::Worker;\n",
    )
    .unwrap();
    let found = violations(tmp.path());
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(found[0].contains("ledger names the higher layer format"));
    assert!(found[1].contains("index names DataFusion's planner (physical_plan)"));
    assert!(found[2].contains("engine names the higher layer distributed"));
    assert!(found[3].contains("engine names datafusion_distributed"));
}

//! The committed list of known regressions (`known_differences.txt`), and how DataFusion's
//! harness compares a record's output (its validator and normalizer, reproduced here).
//!
//! The list has one record per line, `file.slt:line  # reason` (a record of an included file
//! is `part.slt.part:line at file.slt:line`); lines starting with `#` are comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A record DataFusion passes and fragvec fails.
#[derive(Debug, Clone)]
pub struct Regression {
    pub id: String,
    pub sql: String,
    pub error: String,
}

impl Regression {
    pub fn is_explain(&self) -> bool {
        is_explain(&self.sql)
    }

    /// The record, its SQL and fragvec's error, for a report.
    pub fn details(&self) -> String {
        let sql: String = self.sql.chars().take(600).collect();
        let error: Vec<&str> = self.error.lines().take(30).collect();
        format!(
            "--- {}\n{}\n>>> {}\n\n",
            self.id,
            sql.trim(),
            error.join("\n    ")
        )
    }

    /// A first guess at why a new entry fails, for a reviewer to confirm or reword.
    fn guessed_reason(&self) -> String {
        if self.is_explain() {
            return "EXPLAIN text names fragvec's plan (FragvecScan, pinned relations)".into();
        }
        let line = self
            .error
            .lines()
            .find(|l| l.contains("DataFusion error:") || l.contains("error"))
            .unwrap_or_else(|| self.error.lines().next().unwrap_or_default());
        let line: String = line.trim().chars().take(160).collect();
        format!("unreviewed: {line}")
    }
}

/// Whether SQL (after comments and whitespace) starts with EXPLAIN.
pub fn is_explain(sql: &str) -> bool {
    sql.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("--"))
        .is_some_and(|l| l.to_ascii_lowercase().starts_with("explain"))
}

/// The list: comment header, then ids with reasons.
pub struct KnownDifferences {
    header: Vec<String>,
    entries: BTreeMap<String, String>,
}

/// The file a record id belongs to (the top file of an included record).
fn file_of(id: &str) -> &str {
    let top = id.rsplit(" at ").next().unwrap_or(id);
    top.rsplit_once(':').map_or(top, |(file, _)| file)
}

impl KnownDifferences {
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut header = Vec::new();
        let mut entries = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            if trimmed.starts_with('#') {
                if entries.is_empty() {
                    header.push(line.to_string());
                }
                continue;
            }
            let Some((id, reason)) = trimmed.split_once('#') else {
                return Err(format!(
                    "{}:{}: expected `file.slt:line  # reason`, found {trimmed}",
                    path.display(),
                    n + 1
                ));
            };
            let (id, reason) = (id.trim(), reason.trim());
            if reason.is_empty() {
                return Err(format!("{}:{}: {id} has no reason", path.display(), n + 1));
            }
            if entries.insert(id.to_string(), reason.to_string()).is_some() {
                return Err(format!(
                    "{}:{}: {id} is listed twice",
                    path.display(),
                    n + 1
                ));
            }
        }
        Ok(Self { header, entries })
    }

    pub fn contains(&self, id: &str) -> bool {
        self.entries.contains_key(id)
    }

    /// The listed ids of records in these files.
    pub fn ids_of_files<'a>(&self, files: impl Iterator<Item = &'a String>) -> Vec<String> {
        let files: BTreeSet<&str> = files.map(String::as_str).collect();
        self.entries
            .keys()
            .filter(|id| files.contains(file_of(id)))
            .cloned()
            .collect()
    }

    /// The list after a run of `files_ran`: their entries become this run's regressions
    /// (keeping the reasons of those already listed); other files' entries stay.
    pub fn updated(&self, files_ran: &[String], regressions: &[Regression]) -> Self {
        let ran: BTreeSet<&str> = files_ran.iter().map(String::as_str).collect();
        let mut entries: BTreeMap<String, String> = self
            .entries
            .iter()
            .filter(|(id, _)| !ran.contains(file_of(id)))
            .map(|(id, reason)| (id.clone(), reason.clone()))
            .collect();
        for r in regressions {
            let reason = self
                .entries
                .get(&r.id)
                .cloned()
                .unwrap_or_else(|| r.guessed_reason());
            entries.insert(r.id.clone(), reason);
        }
        Self {
            header: self.header.clone(),
            entries,
        }
    }

    pub fn write(&self, path: &Path) -> Result<(), String> {
        let mut text = String::new();
        for line in &self.header {
            text.push_str(line);
            text.push('\n');
        }
        text.push('\n');
        // By file, then by line number (not as text: 9 before 10).
        let mut ids: Vec<&String> = self.entries.keys().collect();
        ids.sort_by_key(|id| sort_key(id));
        for id in ids {
            text.push_str(&format!("{id}  # {}\n", self.entries[id]));
        }
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn sort_key(id: &str) -> (String, Vec<u64>) {
    let mut parts: Vec<&str> = id.split(" at ").collect();
    parts.reverse();
    let numbers = parts
        .into_iter()
        .filter_map(|part| part.rsplit_once(':').and_then(|(_, n)| n.parse().ok()))
        .collect();
    (file_of(id).to_string(), numbers)
}

/// DataFusion's normalizer: trailing whitespace of an expected line is not significant.
#[allow(clippy::ptr_arg)] // the signature sqllogictest's `Normalizer` requires
pub fn value_normalizer(s: &String) -> String {
    s.trim_end().to_string()
}

/// DataFusion's validator: rows joined by single spaces equal the expected lines, or, with
/// `<slt:ignore>` in the expected output, its fragments appear in order.
pub fn df_value_validator(
    normalizer: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    const IGNORE_MARKER: &str = "<slt:ignore>";
    let expected: Vec<String> = expected.iter().map(normalizer).collect();
    let actual: Vec<String> = actual
        .iter()
        .map(|cells| cells.join(" ").trim_end().to_string())
        .collect();
    if expected.iter().any(|l| l.contains(IGNORE_MARKER)) {
        let expected = expected.join("\n");
        let actual = actual.join("\n");
        let mut pos = 0;
        for (i, fragment) in expected.split(IGNORE_MARKER).enumerate() {
            if fragment.is_empty() {
                continue;
            }
            match actual[pos..].find(fragment) {
                Some(idx) if i == 0 && idx != 0 => return false,
                Some(idx) => pos += idx + fragment.len(),
                None => return false,
            }
        }
        return true;
    }
    actual == expected
}

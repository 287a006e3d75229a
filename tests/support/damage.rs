//! A table holding every file kind a query reads, the list of its files by kind, and copying
//! and damaging them: shared by `tests/corruption.rs` (chosen places) and the reliability
//! suite (random places, through `fragvec` processes).

// Each test crate includes this module and uses some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Several fragments (Parquet data files), deletion files, an IVF index (model and segment),
/// a COMPACT (its ledger entry references the deletion files it consumed) and a RECLUSTER
/// (a row map), in table `t`.
pub const SETUP: &[&str] = &[
    "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(4)) WITH (max_rows_per_fragment = 1000)",
    "INSERT INTO t SELECT value, [value * 0.001, value % 97, value % 89, value % 83] \
     FROM generate_series(1, 4000)",
    "CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 4)",
    "DELETE FROM t WHERE id % 10 = 3",
    // Every fragment lost 10% of its rows: all four are compacted, and the ledger keeps
    // their deletion files.
    "COMPACT t WITH (deletion_threshold = 0.05)",
    "INSERT INTO t SELECT value, [value * 0.001, value % 97, value % 89, value % 83] \
     FROM generate_series(4001, 5000)",
    // A stable partition: the ledger gets a row map.
    "RECLUSTER t BY (id % 3)",
    "DELETE FROM t WHERE id % 10 = 7",
];

/// The kinds of files a table's latest version references.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `data/*.parquet`
    Data,
    /// `_deletions/*.del` of a live fragment.
    Deletion,
    /// The reuse ledger: the deletion files of compacted fragments it references (the
    /// manifest's ledger entries themselves are damaged as [`Kind::Manifest`]).
    Ledger,
    /// `_indexes/*/*.seg`
    Segment,
    /// `_indexes/*/*.model`
    Model,
    /// `_rowmaps/*.rmap`
    RowMap,
    /// `_versions/*.manifest` (the latest).
    Manifest,
}

pub const KINDS: [Kind; 7] = [
    Kind::Data,
    Kind::Deletion,
    Kind::Ledger,
    Kind::Segment,
    Kind::Model,
    Kind::RowMap,
    Kind::Manifest,
];

pub fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
    let mut files = Vec::new();
    files_under(from, &mut files);
    for f in files {
        let target = to.join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&f, &target).unwrap();
    }
}

/// The latest manifest of `table` in `db`: its path relative to `db` and its JSON.
pub fn latest_manifest(db: &Path, table: &str) -> (PathBuf, serde_json::Value) {
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(db.join(table).join("_versions"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "manifest"))
        .collect();
    manifests.sort();
    let latest = manifests.last().unwrap().clone();
    let json = serde_json::from_slice(&std::fs::read(&latest).unwrap()).unwrap();
    (latest.strip_prefix(db).unwrap().to_path_buf(), json)
}

/// Every file the latest version of `table` references, by kind, relative to `db`, each
/// once.
pub fn table_files(db: &Path, table: &str) -> Vec<(Kind, PathBuf)> {
    let (manifest, m) = latest_manifest(db, table);
    let rel = |p: &str| PathBuf::from(table).join(p);
    let mut out = vec![(Kind::Manifest, manifest)];
    for f in m["fragments"].as_array().unwrap() {
        for d in f["files"].as_array().unwrap() {
            out.push((Kind::Data, rel(d["path"].as_str().unwrap())));
        }
        if let Some(d) = f.get("deletion") {
            out.push((Kind::Deletion, rel(d["path"].as_str().unwrap())));
        }
    }
    for i in m["indexes"].as_array().into_iter().flatten() {
        if let Some(model) = i["model_file"].as_str() {
            out.push((Kind::Model, rel(model)));
        }
    }
    for s in m["index_segments"].as_array().unwrap() {
        out.push((Kind::Segment, rel(s["file"].as_str().unwrap())));
    }
    for t in m["reuse_ledger"].as_array().unwrap() {
        let mapping = &t["mapping"];
        for r in mapping
            .get("removed")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str())
        {
            out.push((Kind::Ledger, rel(r)));
        }
        if let Some(map) = mapping.get("row_map") {
            out.push((Kind::RowMap, rel(map.as_str().unwrap())));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|(_, f)| seen.insert(f.clone()));
    out
}

/// Whether an error message names the damaged `file` (or, for a manifest, any table file: a
/// damaged manifest can only be noticed through what it names).
pub fn names_the_file(kind: Kind, file: &Path, message: &str) -> bool {
    let name = file.file_name().unwrap().to_str().unwrap();
    let stem = name.split('.').next().unwrap();
    message.contains(stem)
        || (kind == Kind::Manifest
            && [
                "_versions/",
                "data/",
                "_deletions/",
                "_indexes/",
                "_rowmaps/",
            ]
            .iter()
            .any(|d| message.contains(d)))
}

/// One damage to a file.
#[derive(Clone, Debug)]
pub enum Damage {
    Flip { at: u64, bit: u8 },
    Truncate { len: u64 },
}

pub fn apply(path: &Path, damage: &Damage) {
    let mut bytes = std::fs::read(path).unwrap();
    match *damage {
        Damage::Flip { at, bit } => bytes[at as usize] ^= 1 << bit,
        Damage::Truncate { len } => bytes.truncate(len as usize),
    }
    std::fs::write(path, bytes).unwrap();
}

//! Corrupt files give a correct answer or an error naming the file: never a wrong answer,
//! never a panic.
//!
//! One table is built with every file kind a query reads: several fragments (Parquet data
//! files), deletion files, an IVF index (model and segment), a COMPACT (its ledger entry references the
//! deletion files it consumed) and a RECLUSTER (a row map). Then, for each file kind, a
//! fresh copy of the database gets one damage (a flipped bit at a chosen or seeded place, or
//! a truncation) and three queries run on it: `sum(id)`, `count(*)` and a KNN query through
//! the index. Each answer must equal the undamaged one, or be an error whose message names
//! the damaged file (the manifest may also be reported through a file it names).
//!
//! Fresh copies keep process-wide caches (Parquet footers, keyed by store and path) from
//! hiding a damage. Deterministic: the damage is placed by a seeded generator.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
use datafusion::parquet::file::serialized_reader::ReadOptionsBuilder;
use fragvec::FragvecSession;
use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "support/damage.rs"]
mod damage;
use damage::{Damage, Kind, SETUP, apply, copy_dir, names_the_file, table_files};

const QUERIES: &[&str] = &[
    "SELECT sum(id) FROM t",
    "SELECT count(*) FROM t",
    "SELECT id FROM t ORDER BY l2_distance(emb, [2.5, 40, 40, 40]) LIMIT 10",
];

/// Panics anywhere in the process (query tasks included).
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// One damage to one file (`what` says where it was aimed; printed with a bad outcome).
#[derive(Clone, Debug)]
#[allow(dead_code)]
struct Case {
    kind: Kind,
    /// Relative to the database folder.
    file: PathBuf,
    what: String,
    damage: Damage,
    /// The query that certainly reads the damaged bytes, so must report them (a correct
    /// answer there would mean the damage went unnoticed).
    must_fail: Option<usize>,
}

const SUM: usize = 0;
const KNN: usize = 2;

/// A query's answer in a comparable form, or its error message.
type Answer = Result<String, String>;

async fn run_queries(db: &Path) -> Vec<Answer> {
    let session = match FragvecSession::open(db.to_str().unwrap()).await {
        Ok(s) => s,
        Err(e) => return vec![Err(e.to_string()); QUERIES.len()],
    };
    let mut out = Vec::new();
    for sql in QUERIES {
        let run = std::panic::AssertUnwindSafe(session.sql_one(sql)).catch_unwind();
        let answer = match run.await {
            Err(_) => Err("panicked".to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(r)) if sql.contains("ORDER BY") => {
                // The KNN answer as a set of ids (tied distances may come in any order).
                let mut ids: Vec<i64> = r
                    .batches
                    .iter()
                    .flat_map(|b| {
                        let c = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                        (0..c.len()).map(|i| c.value(i)).collect::<Vec<_>>()
                    })
                    .collect();
                ids.sort_unstable();
                Ok(format!("{ids:?}"))
            }
            Ok(Ok(r)) => Ok(pretty_format_batches(&r.batches).unwrap().to_string()),
        };
        out.push(answer);
    }
    out
}

/// The files of the latest version (and of the ledger) by kind, each with the query that
/// reads all of it (when one does).
fn current_files(db: &Path) -> Vec<(Kind, PathBuf, Option<usize>)> {
    table_files(db, "t")
        .into_iter()
        .map(|(kind, file)| {
            let reader = match kind {
                // sum(id) reads every data file's footer.
                Kind::Data | Kind::Segment | Kind::RowMap => None,
                // A flip in a manifest may land in a harmless field (a timestamp, a read
                // version).
                Kind::Manifest => None,
                Kind::Deletion => Some(SUM),
                // The KNN query translates the segment's rows through every transition, and
                // probes the partitions the model's centroids choose.
                Kind::Ledger | Kind::Model => Some(KNN),
            };
            (kind, file, reader)
        })
        .collect()
}

/// Byte ranges of a data file worth aiming at: the first page of each column chunk of
/// row group 0 (the dictionary page when there is one), and the Parquet metadata.
fn data_targets(path: &Path) -> Vec<(String, std::ops::Range<u64>)> {
    let file = std::fs::File::open(path).unwrap();
    let options = ReadOptionsBuilder::new().with_page_index().build();
    let reader = SerializedFileReader::new_with_options(file, options).unwrap();
    let meta = reader.metadata();
    let mut out = Vec::new();
    let offsets = meta.offset_index().unwrap();
    for (c, column) in meta.row_group(0).columns().iter().enumerate() {
        let (start, _) = column.byte_range();
        let first = &offsets[0][c].page_locations()[0];
        let name = column.column_path().string();
        if (first.offset as u64) > start {
            out.push((
                format!("{name} dictionary page"),
                start..first.offset as u64,
            ));
        }
        let page = first.offset as u64..first.offset as u64 + first.compressed_page_size as u64;
        out.push((format!("{name} data page"), page));
    }
    let len = std::fs::metadata(path).unwrap().len();
    let bytes = std::fs::read(path).unwrap();
    let meta_len = u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap());
    out.push((
        "footer metadata".into(),
        len - 8 - u64::from(meta_len)..len - 8,
    ));
    out
}

/// A place in the second half of `range` (past any page header), chosen by `rng`.
fn inside(rng: &mut StdRng, range: &std::ops::Range<u64>) -> u64 {
    let mid = range.start + (range.end - range.start) / 2;
    rng.random_range(mid..range.end.max(mid + 1))
}

fn cases(db: &Path, rng: &mut StdRng) -> Vec<Case> {
    let mut out = Vec::new();
    for (kind, file, reader) in current_files(db) {
        let full = db.join(&file);
        let len = std::fs::metadata(&full).unwrap().len();
        let mut flip = |what: String, at: u64, must_fail: Option<usize>, rng: &mut StdRng| {
            out.push(Case {
                kind,
                file: file.clone(),
                what,
                damage: Damage::Flip {
                    at,
                    bit: rng.random_range(0..8),
                },
                must_fail,
            });
        };
        match kind {
            Kind::Data => {
                for (what, range) in data_targets(&full) {
                    let at = inside(rng, &range);
                    let read_by_sum = !what.starts_with("emb");
                    flip(what, at, read_by_sum.then_some(SUM), rng);
                }
            }
            Kind::Segment => {
                // Partition 0 starts with its addresses; the footer is at the end, and
                // every KNN query reads it.
                flip("addresses".into(), rng.random_range(0..64), None, rng);
                flip("vectors".into(), len / 3, None, rng);
                flip("footer".into(), len - 20, Some(KNN), rng);
            }
            _ => {}
        }
        for _ in 0..2 {
            let at = rng.random_range(0..len);
            flip("anywhere".into(), at, reader, rng);
        }
        let must_fail = match kind {
            Kind::Data => Some(SUM),
            Kind::Segment | Kind::RowMap => Some(KNN),
            _ => reader,
        };
        out.push(Case {
            kind,
            file: file.clone(),
            what: "truncated".into(),
            damage: Damage::Truncate {
                len: rng.random_range(0..len),
            },
            must_fail,
        });
    }
    out
}

fn apply_case(db: &Path, case: &Case) {
    apply(&db.join(&case.file), &case.damage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_files_give_the_right_answer_or_an_error_naming_them() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    let session = FragvecSession::open(pristine.to_str().unwrap())
        .await
        .unwrap();
    for sql in SETUP {
        session.sql(sql).await.unwrap();
    }
    drop(session);
    let expected = run_queries(&pristine).await;
    for (sql, answer) in QUERIES.iter().zip(&expected) {
        assert!(answer.is_ok(), "{sql} on the undamaged table: {answer:?}");
    }

    let mut rng = StdRng::seed_from_u64(0x00C0_FFEE);
    let cases = cases(&pristine, &mut rng);
    for kind in [
        Kind::Data,
        Kind::Deletion,
        Kind::Ledger,
        Kind::Segment,
        Kind::Model,
        Kind::RowMap,
        Kind::Manifest,
    ] {
        assert!(
            cases.iter().any(|c| c.kind == kind),
            "no {kind:?} file to damage"
        );
    }
    let mut wrong = Vec::new();
    let mut caught = 0;
    for (n, case) in cases.iter().enumerate() {
        let copy = root.path().join(format!("case{n}"));
        copy_dir(&pristine, &copy);
        apply_case(&copy, case);
        let answers = run_queries(&copy).await;
        if let Some(q) = case.must_fail
            && answers[q].is_ok()
        {
            wrong.push(format!(
                "{case:?}: {} did not notice the damage",
                QUERIES[q]
            ));
        }
        for ((sql, got), want) in QUERIES.iter().zip(answers).zip(&expected) {
            match got {
                Ok(answer) if Ok(&answer) == want.as_ref() => {}
                Ok(answer) => wrong.push(format!(
                    "{case:?}: {sql} answered\n{answer}\ninstead of\n{}",
                    want.as_ref().unwrap()
                )),
                Err(e) if e.contains("panicked") => {
                    wrong.push(format!("{case:?}: {sql} panicked: {e}"))
                }
                Err(e) if !names_the_file(case.kind, &case.file, &e) => wrong.push(format!(
                    "{case:?}: {sql} failed without naming the file: {e}"
                )),
                Err(_) => caught += 1,
            }
        }
        std::fs::remove_dir_all(&copy).unwrap();
    }
    println!(
        "{} damaged files, {} queries, {caught} clear errors, {} wrong",
        cases.len(),
        cases.len() * QUERIES.len(),
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} bad outcomes:\n{}",
        wrong.len(),
        wrong.join("\n\n")
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a query panicked");
}

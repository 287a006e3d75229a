//! Damage at random places: a copy of a table holding every file kind gets one damage (a
//! bit flipped at a random offset of a random file of one kind, or the file truncated at a
//! random length), then a fresh `fragvec` process runs six queries on it. Each answer must
//! equal the undamaged one, or be an error naming the damaged file; a wrong answer, an error
//! that does not name the file, a panic, an abort or a hang is a failure. (`tests/corruption.rs`
//! aims at chosen places in-process; this goes anywhere, through the binary.)

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::damage::{Damage, KINDS, Kind, SETUP, apply, copy_dir, names_the_file, table_files};
use super::shell::{Outcome, Shell, run_all};

const QUERIES: &[&str] = &[
    "SELECT sum(id) FROM t",
    "SELECT count(*) FROM t",
    "SELECT id, emb FROM t WHERE id = 4321 OR id = 17",
    "SELECT id FROM t ORDER BY l2_distance(emb, [2.5, 40, 40, 40]) LIMIT 10",
    // One probe: the answer depends on which centroid is nearest.
    "SET fragvec.nprobes = 1; SELECT id FROM t ORDER BY l2_distance(emb, [0.5, 10, 60, 20]) LIMIT 10",
    // Exact search reads every vector.
    "SET fragvec.exact = true; SELECT id FROM t ORDER BY l2_distance(emb, [1.5, 20, 30, 40]) LIMIT 10",
];

const BOUND: Duration = Duration::from_secs(60);

#[derive(Default, Debug)]
pub struct Figures {
    /// Damaged copies.
    pub damaged: usize,
    /// ... where at least one query failed naming the file and none was wrong.
    pub caught: usize,
    /// ... where every query still answered correctly.
    pub correct: usize,
    /// ... where some query answered wrongly, failed without naming the file, panicked,
    /// aborted or hung.
    pub wrong: usize,
    pub by_kind: BTreeMap<String, (usize, usize, usize)>,
    pub failures: Vec<String>,
}

/// The answers of a process on `db`: KNN ids sorted (ties may come in any order).
fn answers(db: &Path) -> Vec<Outcome> {
    let mut shell = Shell::open_json(db);
    let mut out: Vec<Outcome> = Vec::new();
    for sql in QUERIES {
        let outcome = match out.last() {
            // The process refused to open the database (a clear error) or died.
            Some(last @ Outcome::Error(_)) if shell.is_dead() => last.clone(),
            Some(_) if shell.is_dead() => {
                Outcome::Died("the process died at an earlier query".into())
            }
            _ => match shell.run(sql, BOUND) {
                Outcome::Rows(mut lines) => {
                    if sql.contains("ORDER BY") {
                        lines.sort();
                    }
                    Outcome::Rows(lines)
                }
                other => other,
            },
        };
        out.push(outcome);
    }
    out
}

/// Damages copies of a table for at least `rounds` rounds (one flip or truncation per
/// kind and round, truncations every fourth round) and until `seconds` have passed.
pub fn run(root: &Path, rounds: usize, seconds: f64, seed: u64) -> Figures {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut figures = Figures::default();
    let pristine = root.join("pristine");
    run_all(&pristine, SETUP);
    let expected = answers(&pristine);
    for (sql, a) in QUERIES.iter().zip(&expected) {
        assert!(
            matches!(a, Outcome::Rows(_)),
            "{sql} on the undamaged table: {a:?}"
        );
    }
    let files = table_files(&pristine, "t");
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut round = 0;
    while round < rounds || Instant::now() < deadline {
        for kind in KINDS {
            let of_kind: Vec<_> = files.iter().filter(|(k, _)| *k == kind).collect();
            let Some((_, file)) = of_kind.choose(&mut rng) else {
                figures
                    .failures
                    .push(format!("the table has no {kind:?} file"));
                continue;
            };
            let len = std::fs::metadata(pristine.join(file)).unwrap().len();
            let damage = if round % 4 == 3 {
                Damage::Truncate {
                    len: rng.random_range(0..len),
                }
            } else {
                Damage::Flip {
                    at: rng.random_range(0..len),
                    bit: rng.random_range(0..8),
                }
            };
            let copy = root.join(format!("case{round}-{kind:?}"));
            copy_dir(&pristine, &copy);
            apply(&copy.join(file), &damage);
            let got = answers(&copy);
            std::fs::remove_dir_all(&copy).unwrap();
            let what = format!("{kind:?} {} {damage:?}", file.display());
            let verdict = judge(kind, file, &what, &got, &expected, &mut figures.failures);
            figures.damaged += 1;
            let entry = figures.by_kind.entry(format!("{kind:?}")).or_default();
            match verdict {
                Verdict::Caught => {
                    figures.caught += 1;
                    entry.0 += 1;
                }
                Verdict::Correct => {
                    figures.correct += 1;
                    entry.1 += 1;
                }
                Verdict::Wrong => {
                    figures.wrong += 1;
                    entry.2 += 1;
                }
            }
        }
        round += 1;
    }
    figures
}

enum Verdict {
    Caught,
    Correct,
    Wrong,
}

fn judge(
    kind: Kind,
    file: &Path,
    what: &str,
    got: &[Outcome],
    expected: &[Outcome],
    failures: &mut Vec<String>,
) -> Verdict {
    let mut caught = false;
    let mut wrong = false;
    for ((sql, got), want) in QUERIES.iter().zip(got).zip(expected) {
        match got {
            Outcome::Rows(_) if got == want => {}
            Outcome::Error(e) if names_the_file(kind, file, e) => caught = true,
            other => {
                wrong = true;
                failures.push(format!("{what}: {sql}: {other:?}, undamaged: {want:?}"));
            }
        }
    }
    match (wrong, caught) {
        (true, _) => Verdict::Wrong,
        (false, true) => Verdict::Caught,
        (false, false) => Verdict::Correct,
    }
}

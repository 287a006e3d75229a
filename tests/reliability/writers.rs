//! Concurrent writer processes on one table, checked against a model of what committed.
//!
//! Each writer is a `fragvec` shell process. Writer `w` owns the ids
//! `(w + 1) × 1,000,000 ..`: it inserts, deletes, updates (in both update modes) and MERGEs
//! only those, so its own log of committed statements, in its own order, says what they
//! must hold. All writers also increment the counters of the shared rows 0..16 (by UPDATE in
//! both modes and by MERGE), which commute, so the expected counters are the number of
//! committed increments whatever order they landed in. A maintenance writer runs COMPACT,
//! RECLUSTER, index appends / merges / retrains and creates and drops a second index, none
//! of which changes what the table holds. Every statement runs with retries off or on
//! (chosen at random), and is logged as committed (it succeeded) or not (a retryable commit
//! conflict); any other error, a panic, a dead process or a hang fails the run.
//!
//! The final table, read by a fresh process, must hold exactly the model: no committed row
//! lost, no deleted row back, no row of a failed statement, no duplicate, no lost increment;
//! and KNN through the index must return the model's nearest rows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::shell::{Outcome, Shell, run_all};
use super::vectors::{check_knn, vector_sql};

const SHARED: i64 = 16;
const OWN_BASE: i64 = 1_000_000;
const BOUND: Duration = Duration::from_secs(120);

#[derive(Default, Debug)]
pub struct Figures {
    pub writers: usize,
    pub statements: usize,
    pub commits: usize,
    pub conflicts: usize,
    pub conflicts_with_retries: usize,
    pub seconds: f64,
    pub lost_rows: usize,
    pub resurrected_rows: usize,
    pub phantom_rows: usize,
    pub duplicate_rows: usize,
    pub wrong_values: usize,
    /// (commits, conflicts) by kind of statement.
    pub by_kind: BTreeMap<String, (usize, usize)>,
    pub failures: Vec<String>,
}

/// What one writer knows it committed.
#[derive(Default)]
struct Log {
    /// Its own live rows: id → val.
    rows: BTreeMap<i64, i64>,
    /// Its own ids deleted by committed statements (and not inserted again).
    deleted: BTreeSet<i64>,
    /// Committed increments per shared row.
    increments: BTreeMap<i64, i64>,
    statements: usize,
    commits: usize,
    conflicts: usize,
    conflicts_with_retries: usize,
    /// (commits, conflicts) by kind of statement.
    by_kind: BTreeMap<String, (usize, usize)>,
    failures: Vec<String>,
}

impl Log {
    /// Runs `sql` (a statement of kind `kind`) and records how it ended; true when it
    /// committed.
    fn run(&mut self, shell: &mut Shell, kind: &str, sql: &str, retries: bool) -> bool {
        self.statements += 1;
        let tally = self.by_kind.entry(kind.to_string()).or_default();
        match shell.run(sql, BOUND) {
            Outcome::Rows(_) => {
                tally.0 += 1;
                self.commits += 1;
                true
            }
            Outcome::Error(e) if e.contains("commit conflict") => {
                tally.1 += 1;
                self.conflicts += 1;
                if retries {
                    self.conflicts_with_retries += 1;
                }
                false
            }
            other => {
                self.failures.push(format!("{sql}: {other:?}"));
                false
            }
        }
    }

    fn set(&mut self, shell: &mut Shell, sql: &str) {
        if let other @ (Outcome::Error(_) | Outcome::Panicked(_) | Outcome::Died(_)) =
            shell.run(sql, BOUND)
        {
            self.failures.push(format!("{sql}: {other:?}"));
        }
    }
}

fn pick_live(rng: &mut StdRng, rows: &BTreeMap<i64, i64>, n: usize) -> Vec<i64> {
    let ids: Vec<i64> = rows.keys().copied().collect();
    ids.choose_multiple(rng, n.min(ids.len()))
        .copied()
        .collect()
}

fn in_list(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One data writer until `until`.
fn data_writer(db: &Path, w: usize, seed: u64, until: Instant) -> Log {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut shell = Shell::open(db);
    let mut log = Log::default();
    let base = (w as i64 + 1) * OWN_BASE;
    let mut next = base;
    let mut stamp = base;
    while Instant::now() < until && log.failures.is_empty() {
        if shell.is_dead() {
            break;
        }
        stamp += 1;
        let retries = rng.random_bool(0.5);
        let mode = if rng.random_bool(0.5) {
            "rewrite_rows"
        } else {
            "rewrite_columns"
        };
        log.set(
            &mut shell,
            &format!(
                "SET fragvec.commit_retries = {}; SET fragvec.update_mode = '{mode}'",
                if retries { 5 } else { 0 }
            ),
        );
        let op = rng.random_range(0..10);
        match op {
            // Append a few new rows of its own.
            0 | 1 => {
                let n = rng.random_range(1..=12);
                let sql = format!(
                    "INSERT INTO t SELECT value, {stamp} AS val, 0 AS cnt, {} FROM generate_series({next}, {})",
                    vector_sql("value"),
                    next + n - 1
                );
                if log.run(&mut shell, "INSERT", &sql, retries) {
                    log.rows.extend((next..next + n).map(|id| (id, stamp)));
                }
                next += n;
            }
            2 if !log.rows.is_empty() => {
                let n = rng.random_range(1..=3);
                let ids = pick_live(&mut rng, &log.rows, n);
                let sql = format!("DELETE FROM t WHERE id IN ({})", in_list(&ids));
                if log.run(&mut shell, "DELETE", &sql, retries) {
                    for id in ids {
                        log.rows.remove(&id);
                        log.deleted.insert(id);
                    }
                }
            }
            3 | 4 if !log.rows.is_empty() => {
                let n = rng.random_range(1..=3);
                let ids = pick_live(&mut rng, &log.rows, n);
                let sql = format!("UPDATE t SET val = {stamp} WHERE id IN ({})", in_list(&ids));
                if log.run(&mut shell, &format!("UPDATE ({mode})"), &sql, retries) {
                    for id in ids {
                        log.rows.insert(id, stamp);
                    }
                }
            }
            // An upsert: one of its rows updated, one new row inserted.
            5 if !log.rows.is_empty() => {
                let old = pick_live(&mut rng, &log.rows, 1)[0];
                let sql = format!(
                    "MERGE INTO t USING (VALUES ({old}, {stamp}), ({next}, {stamp})) AS s (id, val) \
                     ON t.id = s.id WHEN MATCHED THEN UPDATE SET val = s.val \
                     WHEN NOT MATCHED THEN INSERT (id, val, cnt, emb) VALUES (s.id, s.val, 0, {})",
                    vector_sql("s.id")
                );
                if log.run(&mut shell, &format!("MERGE ({mode})"), &sql, retries) {
                    log.rows.insert(old, stamp);
                    log.rows.insert(next, stamp);
                }
                next += 1;
            }
            // Increments of a shared row: they commute.
            6..=8 => {
                let s = rng.random_range(0..SHARED);
                let sql = format!("UPDATE t SET cnt = cnt + 1 WHERE id = {s}");
                if log.run(
                    &mut shell,
                    &format!("shared UPDATE ({mode})"),
                    &sql,
                    retries,
                ) {
                    *log.increments.entry(s).or_default() += 1;
                }
            }
            _ => {
                let s = rng.random_range(0..SHARED);
                let sql = format!(
                    "MERGE INTO t USING (VALUES ({s})) AS s (id) ON t.id = s.id \
                     WHEN MATCHED THEN UPDATE SET cnt = t.cnt + 1"
                );
                if log.run(&mut shell, &format!("shared MERGE ({mode})"), &sql, retries) {
                    *log.increments.entry(s).or_default() += 1;
                }
            }
        }
    }
    log
}

/// The maintenance writer: rewrites and index work, none of which changes the content.
fn maintenance_writer(db: &Path, seed: u64, until: Instant) -> Log {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut shell = Shell::open(db);
    let mut log = Log::default();
    let mut second_index = false;
    while Instant::now() < until && log.failures.is_empty() && !shell.is_dead() {
        let retries = rng.random_bool(0.5);
        log.set(
            &mut shell,
            &format!(
                "SET fragvec.commit_retries = {}",
                if retries { 5 } else { 0 }
            ),
        );
        let (kind, sql) = match rng.random_range(0..8) {
            0 | 1 => (
                "COMPACT",
                "COMPACT t WITH (target_rows_per_fragment = 32)".to_string(),
            ),
            2 => (
                "RECLUSTER",
                format!(
                    "RECLUSTER t BY (id % 3) WITH (destinations = 2) WHERE id % 7 = {}",
                    rng.random_range(0..7)
                ),
            ),
            3 => ("index APPEND", "OPTIMIZE INDEX i ON t APPEND".to_string()),
            4 => ("index MERGE", "OPTIMIZE INDEX i ON t MERGE 2".to_string()),
            5 => ("index RETRAIN", "OPTIMIZE INDEX i ON t RETRAIN".to_string()),
            _ if second_index => ("DROP INDEX", "DROP INDEX j ON t".to_string()),
            _ => (
                "CREATE INDEX",
                "CREATE VECTOR INDEX j ON t (emb) USING IVF_FLAT WITH (num_partitions = 2)"
                    .to_string(),
            ),
        };
        if log.run(&mut shell, kind, &sql, retries) && sql.contains("INDEX j") {
            second_index = !second_index;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..200)));
    }
    log
}

/// Runs `writers` data writers and one maintenance writer for `seconds` on a new table in
/// `db`, then checks the table.
pub fn run(db: &Path, writers: usize, seconds: f64, seed: u64) -> Figures {
    run_all(
        db,
        &[
            "CREATE TABLE t (id BIGINT NOT NULL, val BIGINT, cnt BIGINT, emb VECTOR(4)) \
             WITH (max_rows_per_fragment = 32)",
            &format!(
                "INSERT INTO t SELECT value, 0 AS val, 0 AS cnt, {} FROM generate_series(0, {})",
                vector_sql("value"),
                SHARED - 1
            ),
            "CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 4)",
        ],
    );
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let logs: Vec<Log> = std::thread::scope(|scope| {
        let mut handles: Vec<_> = (0..writers)
            .map(|w| scope.spawn(move || data_writer(db, w, seed + w as u64, until)))
            .collect();
        handles.push(scope.spawn(move || maintenance_writer(db, seed + 1000, until)));
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();

    let mut figures = Figures {
        writers: writers + 1,
        seconds: elapsed,
        ..Default::default()
    };
    let mut expected: BTreeMap<i64, (i64, i64)> = (0..SHARED).map(|id| (id, (0, 0))).collect();
    let mut deleted = BTreeSet::new();
    for log in &logs {
        figures.statements += log.statements;
        figures.commits += log.commits;
        figures.conflicts += log.conflicts;
        figures.conflicts_with_retries += log.conflicts_with_retries;
        figures.failures.extend(log.failures.iter().cloned());
        for (kind, (commits, conflicts)) in &log.by_kind {
            let tally = figures.by_kind.entry(kind.clone()).or_default();
            tally.0 += commits;
            tally.1 += conflicts;
        }
        for (id, val) in &log.rows {
            expected.insert(*id, (*val, 0));
        }
        for (id, n) in &log.increments {
            expected.get_mut(id).expect("a shared row").1 += n;
        }
        deleted.extend(log.deleted.iter().copied());
    }
    check_table(db, &expected, &deleted, &mut figures);
    figures
}

/// Compares the table, read by a fresh process, with the model.
fn check_table(
    db: &Path,
    expected: &BTreeMap<i64, (i64, i64)>,
    deleted: &BTreeSet<i64>,
    figures: &mut Figures,
) {
    let mut shell = Shell::open(db);
    let outcome = shell.run("SELECT id, val, cnt FROM t ORDER BY id", BOUND);
    let Some(lines) = outcome.rows() else {
        figures
            .failures
            .push(format!("reading the table: {outcome:?}"));
        return;
    };
    let mut found: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for line in lines {
        let v: Vec<i64> = line.split(',').map(|x| x.parse().unwrap()).collect();
        found.entry(v[0]).or_default().push((v[1], v[2]));
    }
    for (id, want) in expected {
        match found.get(id).map(Vec::as_slice) {
            None => figures.lost_rows += 1,
            Some([got]) if got == want => {}
            Some([got]) => {
                figures.wrong_values += 1;
                if figures.wrong_values <= 5 {
                    figures.failures.push(format!(
                        "row {id}: (val, cnt) = {got:?}, the committed statements give {want:?}"
                    ));
                }
            }
            Some(more) => figures.duplicate_rows += more.len() - 1,
        }
    }
    for id in found.keys().filter(|id| !expected.contains_key(id)) {
        if deleted.contains(id) {
            figures.resurrected_rows += 1;
        } else {
            figures.phantom_rows += 1;
        }
    }
    let live: Vec<i64> = expected.keys().copied().collect();
    for q in [
        [1.0, 2.0, 3.0, 1.0],
        [12.0, 0.0, 4.0, 2.0],
        [6.5, 3.5, 2.0, 0.0],
    ] {
        if let Err(e) = check_knn(&mut shell, "t", &live, q, 10) {
            figures.failures.push(e);
        }
    }
}

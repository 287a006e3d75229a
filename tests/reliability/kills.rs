//! `kill -9` at random points: a writer process runs one statement and is SIGKILLed after a
//! random delay (often just before its expected end, where the commit is); then a fresh
//! process reopens the database. The table must be at exactly the version before the
//! statement or the one after it (recorded as that statement's operation), hold exactly
//! what the model says for that version, still read the version before, and answer KNN
//! through its index with live rows only. At the end VACUUM removes what the killed writes
//! left behind, and the table still reads the same.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::shell::{Outcome, Shell, fragvec, run_all};
use super::vectors::{check_knn, vector_sql};

const BOUND: Duration = Duration::from_secs(120);

#[derive(Default, Debug)]
pub struct Figures {
    pub runs: usize,
    /// Killed while running, then checked.
    pub kills: usize,
    /// Of those, the killed statement had committed (the version after).
    pub kills_after_commit: usize,
    pub orphan_files_removed: usize,
    pub failures: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert,
    Delete,
    UpdateRows,
    UpdateColumns,
    Merge,
    Compact,
    Recluster,
    IndexAppend,
    IndexMerge,
}

const OPS: [Op; 9] = [
    Op::Insert,
    Op::Delete,
    Op::UpdateRows,
    Op::UpdateColumns,
    Op::Merge,
    Op::Compact,
    Op::Recluster,
    Op::IndexAppend,
    Op::IndexMerge,
];

impl Op {
    /// The operation `fragvec_versions` records for it.
    fn recorded(self) -> &'static str {
        match self {
            Op::Insert => "APPEND",
            Op::Delete => "DELETE",
            Op::UpdateRows | Op::UpdateColumns => "UPDATE",
            Op::Merge => "MERGE",
            Op::Compact => "COMPACT",
            Op::Recluster => "RECLUSTER",
            Op::IndexAppend | Op::IndexMerge => "OPTIMIZE INDEX",
        }
    }
}

type Model = BTreeMap<i64, i64>;

/// When a writer is killed.
enum Kill {
    /// Left alone (its timing is learnt).
    Never,
    /// As soon as its new manifest appears.
    AtCommit,
    /// After this many seconds.
    After(f64),
}

/// The statements of one run of `op` and the model after it.
fn statement(op: Op, rng: &mut StdRng, model: &Model, next: &mut i64) -> (Vec<String>, Model) {
    let mut after = model.clone();
    let stamp = *next;
    let mode = |m: &str| format!("SET fragvec.update_mode = '{m}'");
    let statements = match op {
        Op::Insert => {
            let n = rng.random_range(150..=400);
            let sql = format!(
                "INSERT INTO k SELECT value, {stamp}, {} FROM generate_series({next}, {})",
                vector_sql("value"),
                *next + n - 1
            );
            after.extend((*next..*next + n).map(|id| (id, stamp)));
            *next += n;
            vec![sql]
        }
        Op::Delete => {
            let r = rng.random_range(0..23);
            after.retain(|id, _| id % 23 != r);
            vec![format!("DELETE FROM k WHERE id % 23 = {r}")]
        }
        Op::UpdateRows | Op::UpdateColumns => {
            let r = rng.random_range(0..7);
            for (_, v) in after.iter_mut().filter(|(id, _)| *id % 7 == r) {
                *v += 1;
            }
            let m = if matches!(op, Op::UpdateRows) {
                "rewrite_rows"
            } else {
                "rewrite_columns"
            };
            vec![
                mode(m),
                format!("UPDATE k SET val = val + 1 WHERE id % 7 = {r}"),
            ]
        }
        Op::Merge => {
            // Half existing (or deleted) ids, half new ones.
            let (a, b) = (*next - 60, *next + 59);
            for id in a..=b {
                match after.get_mut(&id) {
                    Some(v) => *v += 100,
                    None => {
                        after.insert(id, stamp);
                    }
                }
            }
            *next = b + 1;
            let m = if rng.random_bool(0.5) {
                "rewrite_rows"
            } else {
                "rewrite_columns"
            };
            vec![
                mode(m),
                format!(
                    "MERGE INTO k USING (SELECT value AS id FROM generate_series({a}, {b})) AS s \
                     ON k.id = s.id WHEN MATCHED THEN UPDATE SET val = k.val + 100 \
                     WHEN NOT MATCHED THEN INSERT (id, val, emb) VALUES (s.id, {stamp}, {})",
                    vector_sql("s.id")
                ),
            ]
        }
        Op::Compact => vec!["COMPACT k WITH (target_rows_per_fragment = 200)".into()],
        Op::Recluster => vec![format!(
            "RECLUSTER k BY (id % 5) WHERE id % 11 = {}",
            rng.random_range(0..11)
        )],
        Op::IndexAppend => vec!["OPTIMIZE INDEX i ON k APPEND".into()],
        Op::IndexMerge => vec!["OPTIMIZE INDEX i ON k MERGE 2".into()],
    };
    (statements, after)
}

fn model_lines(model: &Model) -> Vec<String> {
    model.iter().map(|(id, v)| format!("{id},{v}")).collect()
}

/// The table as a fresh process sees it: (latest version, its operation, rows).
fn read_state(shell: &mut Shell) -> Result<(u64, String, Vec<String>), String> {
    let sql = "SELECT version, operation FROM fragvec_versions('k') ORDER BY version DESC LIMIT 1";
    let outcome = shell.run(sql, BOUND);
    let Some([latest]) = outcome.rows() else {
        return Err(format!("{sql}: {outcome:?}"));
    };
    let (v, op) = latest.split_once(',').ok_or(latest.clone())?;
    let sql = "SELECT id, val FROM k ORDER BY id";
    let outcome = shell.run(sql, BOUND);
    let Some(rows) = outcome.rows() else {
        return Err(format!("{sql}: {outcome:?}"));
    };
    Ok((v.parse().unwrap(), op.to_string(), rows.to_vec()))
}

fn files_named(dir: &Path, out: &mut usize) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_named(&p, out);
        } else {
            *out += 1;
        }
    }
}

/// Kills writers in `db` for `seconds` (at least `min_kills` kills).
pub fn run(db: &Path, seconds: f64, min_kills: usize, seed: u64) -> Figures {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut figures = Figures::default();
    let mut model: Model = (0..400).map(|id| (id, 0)).collect();
    run_all(
        db,
        &[
            "CREATE TABLE k (id BIGINT NOT NULL, val BIGINT, emb VECTOR(4)) \
             WITH (max_rows_per_fragment = 200)",
            &format!(
                "INSERT INTO k SELECT value, 0, {} FROM generate_series(0, 399)",
                vector_sql("value")
            ),
            "CREATE VECTOR INDEX i ON k (emb) USING IVF_FLAT WITH (num_partitions = 4)",
        ],
    );
    let mut version = match read_state(&mut Shell::open(db)) {
        Ok((v, _, _)) => v,
        Err(e) => {
            figures.failures.push(e);
            return figures;
        }
    };
    let mut next = 1000i64;
    // When each operation's process publishes its manifest and when it exits, when left
    // alone (learnt as it goes).
    let mut commit_at = [0.0f64; OPS.len()];
    let mut exit_at = [0.0f64; OPS.len()];
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while (Instant::now() < deadline || figures.kills < min_kills) && figures.failures.is_empty() {
        let which = rng.random_range(0..OPS.len());
        let op = OPS[which];
        let (statements, after) = statement(op, &mut rng, &model, &mut next);
        let mut command = fragvec(db.to_str().unwrap());
        for s in &statements {
            command.arg("-c").arg(s);
        }
        let next_manifest = db
            .join("k/_versions")
            .join(format!("{:020}.manifest", version + 1));
        let started = Instant::now();
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fragvec");
        // Unknown timing: let it run to learn it (and again now and then). Otherwise a
        // quarter of the kills land the moment the new manifest appears (committed, the
        // process still running), a third around the commit's usual time, the rest anywhere.
        let (c, e) = (commit_at[which], exit_at[which]);
        let kill = match rng.random_range(0..20) {
            _ if e == 0.0 => Kill::Never,
            0..3 => Kill::Never,
            3..8 => Kill::AtCommit,
            8..15 if c > 0.0 => Kill::After(c * rng.random_range(0.8..1.02)),
            _ => Kill::After(e * rng.random_range(0.0..1.0)),
        };
        let mut committed_after = None;
        match kill {
            Kill::After(d) => {
                std::thread::sleep(Duration::from_secs_f64(d));
                let _ = child.kill();
            }
            Kill::AtCommit | Kill::Never => {
                while child.try_wait().unwrap().is_none() {
                    if committed_after.is_none() && next_manifest.exists() {
                        committed_after = Some(started.elapsed().as_secs_f64());
                        if matches!(kill, Kill::AtCommit) {
                            let _ = child.kill();
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
        let out = child.wait_with_output().unwrap();
        let killed = out.status.signal() == Some(9);
        figures.runs += 1;
        if !killed && matches!(kill, Kill::Never) {
            let learn = |slot: &mut f64, took: f64| {
                *slot = if *slot == 0.0 {
                    took
                } else {
                    0.7 * *slot + 0.3 * took
                }
            };
            learn(&mut exit_at[which], started.elapsed().as_secs_f64());
            if let Some(took) = committed_after {
                learn(&mut commit_at[which], took);
            }
        }
        if !killed && !out.status.success() {
            figures.failures.push(format!(
                "{statements:?} failed alone: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
            break;
        }
        // Reopen and look.
        let mut shell = Shell::open(db);
        let (now, operation, rows) = match read_state(&mut shell) {
            Ok(state) => state,
            Err(e) => {
                figures
                    .failures
                    .push(format!("after {op:?} (killed {killed}): {e}"));
                break;
            }
        };
        let what = format!("{op:?} {statements:?} (killed: {killed}) from version {version}");
        let committed = match now.checked_sub(version) {
            Some(0) => false,
            Some(1) if operation == op.recorded() => true,
            _ => {
                figures.failures.push(format!(
                    "{what}: the table is at version {now} ({operation})"
                ));
                break;
            }
        };
        let expected = if committed { &after } else { &model };
        if rows != model_lines(expected) {
            figures.failures.push(format!(
                "{what}: at version {now} the table holds {} rows, not the {} of the model \
                 (committed: {committed})",
                rows.len(),
                expected.len()
            ));
            break;
        }
        if !killed && !committed && model != after {
            figures
                .failures
                .push(format!("{what}: succeeded but committed nothing"));
            break;
        }
        let before = shell.run(
            &format!("SELECT count(*) FROM k VERSION AS OF {version}"),
            BOUND,
        );
        if before.rows() != Some(&[model.len().to_string()][..]) {
            figures.failures.push(format!(
                "{what}: version {version} reads {before:?}, {} rows expected",
                model.len()
            ));
            break;
        }
        let live: Vec<i64> = expected.keys().copied().collect();
        let q = [rng.random_range(0.0..13.0), 3.0, 2.0, 1.0];
        if let Err(e) = check_knn(&mut shell, "k", &live, q, 8) {
            figures.failures.push(format!("{what}: {e}"));
            break;
        }
        if killed {
            figures.kills += 1;
            figures.kills_after_commit += usize::from(committed);
        }
        if committed {
            model = after;
        }
        version = now;
    }
    if figures.failures.is_empty() {
        vacuum_and_check(db, &model, &mut figures);
    }
    figures
}

/// VACUUM (no grace period: no writer is running) removes the files the killed writes left,
/// and the table reads the same afterwards.
fn vacuum_and_check(db: &Path, model: &Model, figures: &mut Figures) {
    let mut before = 0;
    files_named(db, &mut before);
    let mut shell = Shell::open(db);
    let sql = "SET fragvec.vacuum_grace_seconds = 0; VACUUM k";
    if let other @ (Outcome::Error(_)
    | Outcome::Panicked(_)
    | Outcome::Died(_)
    | Outcome::TimedOut) = shell.run(sql, BOUND)
    {
        figures.failures.push(format!("{sql}: {other:?}"));
        return;
    }
    let mut after = 0;
    files_named(db, &mut after);
    figures.orphan_files_removed = before.saturating_sub(after);
    match read_state(&mut Shell::open(db)) {
        Ok((_, _, rows)) if rows == model_lines(model) => {}
        Ok((v, _, rows)) => figures.failures.push(format!(
            "after VACUUM version {v} holds {} rows, not {}",
            rows.len(),
            model.len()
        )),
        Err(e) => figures.failures.push(format!("after VACUUM: {e}")),
    }
}

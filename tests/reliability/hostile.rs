//! The hostile statements of `tests/support/hostile_cases.rs`, each sent to a `fragvec`
//! process with a time bound: in process a memory-allocation abort would take the test
//! binary down with it; here it shows as a dead process, and the next statement gets a new
//! one.

use std::path::Path;
use std::time::{Duration, Instant};

use super::hostile_cases::{CASES, SETUP, judge};
use super::shell::{Outcome, Shell, run_all};

const BOUND: Duration = Duration::from_secs(60);

#[derive(Default, Debug)]
pub struct Figures {
    pub statements: usize,
    pub errors: usize,
    pub results: usize,
    /// The slowest statement.
    pub slowest_seconds: f64,
    pub failures: Vec<String>,
}

pub fn run(db: &Path) -> Figures {
    run_all(db, &[SETUP]);
    let mut figures = Figures::default();
    let mut shell = Shell::open_json(db);
    for (sql, expect) in CASES {
        if shell.is_dead() {
            shell = Shell::open_json(db);
        }
        let started = Instant::now();
        let outcome = shell.run(sql, BOUND);
        figures.slowest_seconds = figures.slowest_seconds.max(started.elapsed().as_secs_f64());
        figures.statements += 1;
        let result = match outcome {
            Outcome::Rows(_) => {
                figures.results += 1;
                Ok(outcome.rows().map_or(0, <[String]>::len))
            }
            Outcome::Error(e) => {
                figures.errors += 1;
                Err(e)
            }
            other => {
                figures.failures.push(format!("{sql}: {other:?}"));
                continue;
            }
        };
        figures.failures.extend(judge(sql, *expect, result));
    }
    if shell.is_dead() {
        shell = Shell::open_json(db);
    }
    let outcome = shell.run("SELECT count(*) AS n FROM t", BOUND);
    if outcome.rows() != Some(&["{\"n\":201}".to_string()][..]) {
        figures.failures.push(format!(
            "the table after the hostile statements: {outcome:?}"
        ));
    }
    figures
}

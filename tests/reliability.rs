//! The reliability suite (issue #10): real `fragvec` processes writing concurrently, killed
//! with SIGKILL, reading damaged files and hostile statements, each checked against a model.
//!
//! * [`writers`]: concurrent writer processes (INSERT, DELETE, UPDATE in both modes, MERGE,
//!   COMPACT, RECLUSTER, index create / append / merge / retrain / drop, retries off and on);
//!   the final table must equal the model of the committed statements: no lost, resurrected,
//!   phantom or duplicated row, no lost update.
//! * [`kills`]: a writer SIGKILLed at random points, most just before its commit; the reopened
//!   table is at exactly the version before or after, with the content of that version.
//! * [`corrupt`]: every file kind damaged at random places: a correct answer or an error
//!   naming the file, never a wrong answer, panic, abort or hang.
//! * [`hostile`]: hostile statements, each a clear error or a correct result in bounded time.
//!
//! `cargo test --test reliability -- --nocapture` runs the short mode (well under a minute of
//! writing and killing; what CI runs) and prints one summary line. `FRAGVEC_SOAK_SECS=600`
//! runs the long mode: the writers, the kill loop and the corruption rounds share that many
//! seconds. `FRAGVEC_RELIABILITY_SEED=n` changes the random choices (default: fixed);
//! `FRAGVEC_RELIABILITY_PARTS=writers,kills` runs only some parts, and
//! `FRAGVEC_RELIABILITY_BIN=path` runs them against another `fragvec` binary.

#[path = "support/damage.rs"]
mod damage;
#[path = "support/hostile_cases.rs"]
mod hostile_cases;
#[path = "reliability/shell.rs"]
mod shell;
#[path = "reliability/vectors.rs"]
mod vectors;

#[path = "reliability/corrupt.rs"]
mod corrupt;
#[path = "reliability/hostile.rs"]
mod hostile;
#[path = "reliability/kills.rs"]
mod kills;
#[path = "reliability/writers.rs"]
mod writers;

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok().filter(|v| !v.is_empty())?;
    Some(
        value
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value}: {e}")),
    )
}

#[test]
fn reliability_suite() {
    let soak = env_number("FRAGVEC_SOAK_SECS");
    let seed = env_number("FRAGVEC_RELIABILITY_SEED").unwrap_or(10);
    let parts = std::env::var("FRAGVEC_RELIABILITY_PARTS").unwrap_or_default();
    let runs = |part: &str| parts.is_empty() || parts.split(',').any(|p| p.trim() == part);
    // (writer seconds, kill seconds, corruption seconds)
    let (write_secs, kill_secs, corrupt_secs) = match soak {
        Some(s) => (0.4 * s as f64, 0.35 * s as f64, 0.25 * s as f64),
        None => (25.0, 20.0, 0.0),
    };
    let root = tempfile::tempdir().unwrap();
    let mut summary = vec![match soak {
        Some(s) => format!("reliability (soak, {s} s, seed {seed})"),
        None => format!("reliability (short, seed {seed})"),
    }];
    let mut failures: Vec<String> = Vec::new();

    if runs("writers") {
        let f = writers::run(&root.path().join("writers"), 3, write_secs, seed);
        summary.push(format!(
            "writers: {} processes, {} statements, {} commits in {:.1} s ({:.1} commits/s), \
             {} conflicts ({} with retries on), lost rows {}, resurrected rows {}, \
             phantom rows {}, duplicate rows {}, lost updates {} \
             (commits/conflicts by statement: {})",
            f.writers,
            f.statements,
            f.commits,
            f.seconds,
            f.commits as f64 / f.seconds,
            f.conflicts,
            f.conflicts_with_retries,
            f.lost_rows,
            f.resurrected_rows,
            f.phantom_rows,
            f.duplicate_rows,
            f.wrong_values,
            f.by_kind
                .iter()
                .map(|(k, (c, x))| format!("{k} {c}/{x}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        failures.extend(f.failures.iter().map(|e| format!("writers: {e}")));
        for (what, n) in [
            ("lost rows", f.lost_rows),
            ("resurrected rows", f.resurrected_rows),
            ("phantom rows", f.phantom_rows),
            ("duplicate rows", f.duplicate_rows),
            ("lost updates", f.wrong_values),
        ] {
            if n > 0 {
                failures.push(format!("writers: {n} {what}"));
            }
        }
        if f.commits == 0 {
            failures.push("writers: nothing committed".into());
        }
    }
    if runs("kills") {
        let min_kills = if soak.is_some() { 0 } else { 10 };
        let f = kills::run(&root.path().join("kills"), kill_secs, min_kills, seed);
        summary.push(format!(
            "kill -9: {} kills survived ({} after the commit, {} before) in {} runs, \
             {} orphan files removed by VACUUM",
            f.kills,
            f.kills_after_commit,
            f.kills - f.kills_after_commit,
            f.runs,
            f.orphan_files_removed
        ));
        failures.extend(f.failures.iter().map(|e| format!("kill -9: {e}")));
    }
    if runs("corruption") {
        let rounds = if soak.is_some() { 4 } else { 8 };
        let f = corrupt::run(&root.path().join("corruption"), rounds, corrupt_secs, seed);
        let kinds: Vec<String> = f
            .by_kind
            .iter()
            .map(|(k, (c, ok, w))| format!("{k} {c}/{ok}/{w}"))
            .collect();
        summary.push(format!(
            "corruption: {} damaged copies, {} caught, {} correct, {} wrong \
             (caught/correct/wrong by kind: {})",
            f.damaged,
            f.caught,
            f.correct,
            f.wrong,
            kinds.join(", ")
        ));
        failures.extend(f.failures.iter().map(|e| format!("corruption: {e}")));
    }
    if runs("hostile") {
        let f = hostile::run(&root.path().join("hostile"));
        summary.push(format!(
            "hostile: {} statements, {} clear errors, {} results, slowest {:.2} s, {} bad",
            f.statements,
            f.errors,
            f.results,
            f.slowest_seconds,
            f.failures.len()
        ));
        failures.extend(f.failures.iter().map(|e| format!("hostile: {e}")));
    }
    println!("{}", summary.join(" | "));
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

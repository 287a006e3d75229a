//! Progress of long statements through `FragvecSession::set_progress`: a recording sink checks
//! that each statement reports its phases with sane totals: every phase finishes exactly once,
//! is never advanced after it finished, its count only grows and never passes its total, and
//! phases over a known amount of work (rows read, assigned, rewritten) end at their total.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fragvec::FragvecSession;
use fragvec::format::progress::ProgressSink;

/// One phase as the sink saw it.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    total: Option<u64>,
    done: u64,
    finishes: u32,
    /// A report about the phase that broke the rules (advance after finish, past the total).
    broken: Option<String>,
}

#[derive(Default)]
struct Recorder {
    /// Phases by id (ids grow, so this is start order).
    phases: Mutex<BTreeMap<u64, Seen>>,
}

impl ProgressSink for Recorder {
    fn start(&self, id: u64, name: &str, total: Option<u64>) {
        let old = self.phases.lock().unwrap().insert(
            id,
            Seen {
                name: name.to_string(),
                total,
                done: 0,
                finishes: 0,
                broken: None,
            },
        );
        assert!(old.is_none(), "phase id {id} started twice");
    }

    fn advance(&self, id: u64, n: u64) {
        let mut phases = self.phases.lock().unwrap();
        let p = phases
            .get_mut(&id)
            .expect("advance of a phase never started");
        if n == 0 {
            p.broken = Some("advanced by 0".into());
        }
        if p.finishes > 0 {
            p.broken = Some(format!("advanced by {n} after it finished"));
        }
        p.done += n;
        if p.total.is_some_and(|t| p.done > t) {
            p.broken = Some(format!("done {} passed total {:?}", p.done, p.total));
        }
    }

    fn finish(&self, id: u64) {
        let mut phases = self.phases.lock().unwrap();
        let p = phases
            .get_mut(&id)
            .expect("finish of a phase never started");
        p.finishes += 1;
    }
}

impl Recorder {
    /// The phases recorded since the last call, in start order, after checking the rules.
    fn take(&self) -> Vec<Seen> {
        let phases: Vec<Seen> = std::mem::take(&mut *self.phases.lock().unwrap())
            .into_values()
            .collect();
        for p in &phases {
            assert_eq!(p.finishes, 1, "phase {p:?} must finish exactly once");
            assert!(p.broken.is_none(), "phase {p:?}");
        }
        phases
    }
}

fn names(phases: &[Seen]) -> Vec<&str> {
    phases.iter().map(|p| p.name.as_str()).collect()
}

fn phase<'a>(phases: &'a [Seen], name: &str) -> &'a Seen {
    phases
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no phase {name} in {:?}", names(phases)))
}

/// Asserts that phase `name` did all of its known total, `total`.
fn complete(phases: &[Seen], name: &str, total: u64) {
    let p = phase(phases, name);
    assert_eq!((p.total, p.done), (Some(total), total), "{p:?}");
}

async fn run(session: &FragvecSession, sql: &str) {
    session
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test]
async fn long_statements_report_phases_with_sane_totals() {
    let dir = tempfile::tempdir().unwrap();
    let session = FragvecSession::open(dir.path().join("db").to_str().unwrap())
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    run(
        &session,
        "CREATE TABLE t (id BIGINT, g BIGINT, emb VECTOR(4)) \
         WITH (max_rows_per_fragment = 100)",
    )
    .await;
    session.set_progress(recorder.clone());
    assert!(recorder.take().is_empty(), "CREATE TABLE has no long phase");

    // INSERT ... SELECT: rows written (total unknown in advance).
    run(
        &session,
        "INSERT INTO t SELECT value, value % 7, CASE WHEN value % 50 = 0 THEN NULL \
         ELSE [value % 10, value % 13, value % 17, 1] END FROM generate_series(1, 1000)",
    )
    .await;
    let phases = recorder.take();
    assert_eq!(names(&phases), ["writing rows"]);
    assert_eq!((phases[0].total, phases[0].done), (None, 1000));

    // CREATE VECTOR INDEX: every phase of a build (PQ codebooks only for IVF_PQ).
    run(
        &session,
        "CREATE VECTOR INDEX p ON t (emb) USING IVF_PQ \
         WITH (num_partitions = 8, num_sub_vectors = 2)",
    )
    .await;
    let phases = recorder.take();
    assert_eq!(
        names(&phases),
        [
            "reading vectors",
            "k-means",
            "PQ codebooks",
            "assigning rows",
            "writing index files"
        ]
    );
    complete(&phases, "reading vectors", 1000);
    let kmeans = phase(&phases, "k-means");
    let most = fragvec::index::build::KMEANS_ITERATIONS as u64;
    assert!(
        kmeans.total == Some(most) && (1..=most).contains(&kmeans.done),
        "{kmeans:?}"
    );
    complete(&phases, "PQ codebooks", 2);
    // The vectors that are not NULL.
    complete(&phases, "assigning rows", 980);
    complete(&phases, "writing index files", 2);
    run(&session, "DROP INDEX p ON t").await;
    run(
        &session,
        "CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 8)",
    )
    .await;
    let phases = recorder.take();
    assert_eq!(
        names(&phases),
        [
            "reading vectors",
            "k-means",
            "assigning rows",
            "writing index files"
        ]
    );

    // DML, then OPTIMIZE INDEX: APPEND indexes the new fragment, MERGE rewrites segments.
    run(&session, "DELETE FROM t WHERE id % 3 = 0").await;
    run(
        &session,
        "INSERT INTO t SELECT value, 0, [1, 2, 3, 4] FROM generate_series(1001, 1100)",
    )
    .await;
    recorder.take();
    run(&session, "OPTIMIZE INDEX i ON t APPEND").await;
    let phases = recorder.take();
    assert_eq!(
        names(&phases),
        ["reading vectors", "assigning rows", "writing index files"]
    );
    complete(&phases, "reading vectors", 100);
    complete(&phases, "assigning rows", 100);
    run(&session, "OPTIMIZE INDEX i ON t MERGE 2").await;
    let phases = recorder.take();
    assert_eq!(
        names(&phases),
        [
            "reading segments",
            "reading vectors",
            "assigning rows",
            "writing index files"
        ]
    );
    complete(&phases, "reading segments", 16);
    complete(&phases, "writing index files", 1);
    let assigned = phase(&phases, "assigning rows");
    // The live non-NULL vectors: 1000 minus deletes and NULLs, plus the 100 appended.
    let live = (1..=1000).filter(|v| v % 3 != 0 && v % 50 != 0).count() as u64 + 100;
    assert_eq!((assigned.total, assigned.done), (Some(live), live));
    run(&session, "OPTIMIZE INDEX i ON t RETRAIN").await;
    let phases = recorder.take();
    assert_eq!(phases[0].name, "reading vectors");
    complete(&phases, "reading vectors", 1100);

    // COMPACT: every live row of the rewritten fragments, once.
    let live_rows = (1..=1000).filter(|v| v % 3 != 0).count() as u64 + 100;
    run(
        &session,
        "COMPACT t WITH (target_rows_per_fragment = 500, deletion_threshold = 0.1)",
    )
    .await;
    let phases = recorder.take();
    assert_eq!(names(&phases), ["rewriting fragments"]);
    let rewritten = &phases[0];
    assert!(
        rewritten.total == Some(rewritten.done)
            && rewritten.done > 0
            && rewritten.done <= live_rows,
        "{rewritten:?}"
    );

    // RECLUSTER with a filter: fragments examined, then keys and destinations over live rows.
    run(&session, "RECLUSTER t BY (g) WHERE id > 0").await;
    let phases = recorder.take();
    assert_eq!(
        names(&phases),
        [
            "selecting fragments",
            "evaluating keys",
            "writing destinations"
        ]
    );
    complete(&phases, "evaluating keys", live_rows);
    complete(&phases, "writing destinations", live_rows);
    let selecting = phase(&phases, "selecting fragments");
    assert!(
        selecting.total == Some(selecting.done) && selecting.done > 0,
        "{selecting:?}"
    );

    // VACUUM: manifests read, files examined and removed, versions removed.
    run(&session, "SET fragvec.vacuum_grace_seconds = 0").await;
    recorder.take();
    run(&session, "VACUUM t RETAIN 1 VERSIONS").await;
    let phases = recorder.take();
    assert_eq!(
        names(&phases),
        [
            "reading manifests",
            "examining files",
            "removing files",
            "removing versions"
        ]
    );
    complete(&phases, "reading manifests", 1);
    let examined = phase(&phases, "examining files");
    let removed = phase(&phases, "removing files");
    assert!(
        examined.total == Some(examined.done)
            && removed.total == Some(removed.done)
            && removed.done > 0
            && removed.done < examined.done,
        "{examined:?} {removed:?}"
    );
    let versions = phase(&phases, "removing versions");
    assert!(
        versions.total == Some(versions.done) && versions.done >= 9,
        "{versions:?}"
    );

    // Cleared: nothing is reported any more.
    session.clear_progress();
    run(&session, "INSERT INTO t VALUES (5000, 1, [1, 1, 1, 1])").await;
    run(&session, "COMPACT t").await;
    assert!(recorder.take().is_empty());
}

#[tokio::test]
async fn a_failing_statement_still_finishes_its_phases() {
    let dir = tempfile::tempdir().unwrap();
    let session = FragvecSession::open(dir.path().join("db").to_str().unwrap())
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    session.set_progress(recorder.clone());
    run(&session, "CREATE TABLE t (id BIGINT, emb VECTOR(2))").await;
    // The second partition's row does not fit VECTOR(2): the write fails after it started.
    let err = session
        .sql("INSERT INTO t SELECT value, [value, value] FROM generate_series(1, 10) UNION ALL SELECT 11, [1, 2, 3]")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("3"), "{err}");
    assert_eq!(names(&recorder.take()), ["writing rows"]);
    // Cosine over only zero vectors cannot train: the reading phase finished, no other began.
    run(&session, "INSERT INTO t VALUES (1, [0, 0])").await;
    recorder.take();
    let err = session
        .sql("CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (metric = 'cosine')")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("zero"), "{err}");
    assert_eq!(names(&recorder.take()), ["reading vectors"]);
}

#[tokio::test]
async fn a_build_over_the_memory_budget_streams_through_the_same_phases() {
    let dir = tempfile::tempdir().unwrap();
    let session = FragvecSession::open(dir.path().join("db").to_str().unwrap())
        .await
        .unwrap();
    run(
        &session,
        "CREATE TABLE t (id BIGINT, emb VECTOR(4)) WITH (max_rows_per_fragment = 100)",
    )
    .await;
    run(
        &session,
        "INSERT INTO t SELECT value, CASE WHEN value % 50 = 0 THEN NULL \
         ELSE [value % 10, value % 13, value % 17, 1] END FROM generate_series(1, 1000)",
    )
    .await;
    // 1000 rows of 16-byte vectors do not fit 20 kB twice over: the build streams, and its
    // 980 × 24-byte segment is written in groups of at most 10 kB.
    run(&session, "SET fragvec.index_cache_bytes = 20000").await;
    let recorder = Arc::new(Recorder::default());
    session.set_progress(recorder.clone());
    for sql in [
        "CREATE VECTOR INDEX i ON t (emb) USING IVF_FLAT WITH (num_partitions = 8)",
        "OPTIMIZE INDEX i ON t RETRAIN",
    ] {
        run(&session, sql).await;
        let phases = recorder.take();
        assert_eq!(
            names(&phases),
            [
                "reading vectors",
                "k-means",
                "assigning rows",
                "writing index files"
            ],
            "{sql}"
        );
        complete(&phases, "reading vectors", 1000);
        complete(&phases, "assigning rows", 980);
        // The model, then one unit per group of the segment.
        let writing = phase(&phases, "writing index files");
        assert!(
            writing.total == Some(writing.done) && writing.done >= 4,
            "{sql}: {writing:?}"
        );
    }
    session.clear_progress();
    let result = session
        .sql_one("SELECT id FROM t ORDER BY l2_distance(emb, [1, 2, 3, 1]) LIMIT 5")
        .await
        .unwrap();
    let rows: usize = result.batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 5);
}

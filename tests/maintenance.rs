//! Maintenance that runs itself: table properties (`ALTER TABLE ... SET / RESET`), one round
//! (`MAINTAIN t`), the journal (`fragvec_maintenance`), the lease, and the scheduler
//! ([`Maintainer`]) keeping a table that grows by small appends indexed and compact, with
//! every answer equal to exact search throughout.

use std::time::Duration;

use datafusion::arrow::array::Array;
use datafusion::arrow::datatypes::{Int64Type, UInt64Type};
use datafusion::arrow::util::pretty::pretty_format_batches;

use fragvec::engine::FragvecSession;
use fragvec::engine::maintain::{Maintainer, MaintainerConfig, VacuumIn};
use fragvec::maintain::lease::Lease;

#[macro_use]
mod support;
use support::Location;

async fn text(s: &FragvecSession, sql: &str) -> String {
    let r = s
        .sql_one(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&r.batches).unwrap().to_string()
}

async fn u64s(s: &FragvecSession, sql: &str) -> Vec<u64> {
    support::column::<UInt64Type>(s, sql).await
}

async fn i64s(s: &FragvecSession, sql: &str) -> Vec<i64> {
    support::column::<Int64Type>(s, sql).await
}

async fn err(s: &FragvecSession, sql: &str) -> String {
    match s.sql(sql).await {
        Ok(_) => panic!("{sql} should fail"),
        Err(e) => e.to_string(),
    }
}

/// `n` rows with ids from `first`, on a 2-d spiral (distinct distances to most queries).
fn insert(first: i64, n: i64) -> String {
    format!(
        "INSERT INTO t SELECT value, [value / 10.0 * cos(value), value / 10.0 * sin(value)] \
         FROM generate_series({first}, {}) AS s(value)",
        first + n - 1
    )
}

/// The ids of the 10 nearest rows to a few points, through the index at every partition and
/// exactly; they must agree.
async fn knn_agrees_with_exact(s: &FragvecSession) {
    for q in ["[1.0, 2.0]", "[-30.0, 4.0]", "[12.5, -7.0]"] {
        let sql = format!("SELECT id FROM t ORDER BY emb <-> {q}::VECTOR(2), id LIMIT 10");
        s.sql("SET fragvec.exact = false").await.unwrap();
        s.sql("SET fragvec.nprobes = 64").await.unwrap();
        let indexed = i64s(s, &sql).await;
        s.sql("SET fragvec.exact = true").await.unwrap();
        let exact = i64s(s, &sql).await;
        assert_eq!(indexed, exact, "{q}");
    }
    s.sql("SET fragvec.exact = false").await.unwrap();
}

async fn table_with_index(loc: &str) -> FragvecSession {
    let s = FragvecSession::open(loc).await.unwrap();
    s.sql("CREATE TABLE t (id BIGINT, emb VECTOR(2))")
        .await
        .unwrap();
    s.sql(&insert(0, 400)).await.unwrap();
    s.sql("CREATE VECTOR INDEX t_idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 8)")
        .await
        .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_are_set_shown_reset_and_refused_when_impossible() {
    let db = Location::local();
    let s = table_with_index(db.url()).await;
    s.sql("ALTER TABLE t SET (auto_index = on, auto_index_rows = 1000, auto_recluster = 'ivf_partition(emb)')")
        .await
        .unwrap();
    let shown = text(
        &s,
        "SELECT name, value FROM fragvec_properties('t') WHERE NOT is_default ORDER BY name",
    )
    .await;
    for want in [
        "auto_index      | on",
        "auto_index_rows | 1000",
        "ivf_partition(emb)",
    ] {
        assert!(shown.contains(want), "{shown}");
    }
    s.sql("ALTER TABLE t RESET (auto_index_rows, auto_recluster)")
        .await
        .unwrap();
    let shown = text(
        &s,
        "SELECT name FROM fragvec_properties('t') WHERE NOT is_default",
    )
    .await;
    assert!(
        shown.contains("auto_index") && !shown.contains("auto_index_rows"),
        "{shown}"
    );

    let version = u64s(&s, "SELECT max(version) FROM fragvec_versions('t')").await;
    for (sql, want) in [
        (
            "ALTER TABLE t SET (auto_index_rows = -1)",
            "must be a positive integer, not '-1'",
        ),
        (
            "ALTER TABLE t SET (auto_indx = on)",
            "did you mean auto_index?",
        ),
        (
            "ALTER TABLE t SET (auto_index = maybe)",
            "must be on or off",
        ),
        (
            "ALTER TABLE t SET (auto_merge_segments = 1)",
            "at least 2, or 0 for never",
        ),
        (
            "ALTER TABLE t SET (auto_retrain_imbalance = 0.5)",
            "a number above 1",
        ),
        (
            "ALTER TABLE t SET (auto_recluster = 'ivf_partition(nope)')",
            "does not compile",
        ),
        (
            "ALTER TABLE t SET (auto_recluster = 'ivf_partition(emb')",
            "does not compile",
        ),
        ("ALTER TABLE nope SET (auto_index = on)", "does not exist"),
        (
            "MAINTAIN t WITH (auto_compact = sometimes)",
            "must be on or off",
        ),
    ] {
        let e = err(&s, sql).await;
        assert!(e.contains(want), "{sql}: {e}");
    }
    // A refused ALTER commits nothing.
    assert_eq!(
        u64s(&s, "SELECT max(version) FROM fragvec_versions('t')").await,
        version
    );
}

on_local_and_s3!(a_round_indexes_compacts_merges_and_vacuums_without_changing_answers);
async fn a_round_indexes_compacts_merges_and_vacuums_without_changing_answers(db: Location) {
    let s = table_with_index(db.url()).await;
    // A table that grew by small appends: 24 fragments of 10 rows, unindexed.
    for k in 0..24 {
        s.sql(&insert(1000 + 10 * k, 10)).await.unwrap();
    }
    s.sql("DELETE FROM t WHERE id % 7 = 0").await.unwrap();
    let ids_before = i64s(&s, "SELECT id FROM t ORDER BY id").await;
    knn_agrees_with_exact(&s).await;

    // Nothing switched on: MAINTAIN says so and does nothing.
    let said = text(&s, "MAINTAIN t").await;
    assert!(said.contains("no maintenance is switched on"), "{said}");

    s.sql(
        "ALTER TABLE t SET (auto_index = on, auto_index_rows = 100, auto_compact = on, \
         auto_compact_small_fragments = 4, auto_vacuum_retain = 3, auto_vacuum_grace_seconds = 0)",
    )
    .await
    .unwrap();
    let did = text(&s, "MAINTAIN t").await;
    for kind in ["index_append", "compact", "vacuum"] {
        assert!(did.contains(kind), "{did}");
    }
    assert!(!did.contains("failed"), "{did}");
    assert_eq!(
        u64s(&s, "SELECT unindexed_rows FROM fragvec_indexes('t')").await,
        [0]
    );
    let fragments = u64s(&s, "SELECT count(*) FROM fragvec_fragments('t')").await[0];
    assert!(fragments <= 4, "{fragments} fragments after compaction");
    let versions = u64s(&s, "SELECT count(*) FROM fragvec_versions('t')").await[0];
    assert!(
        versions <= 4,
        "{versions} versions kept with auto_vacuum_retain = 3"
    );
    assert_eq!(i64s(&s, "SELECT id FROM t ORDER BY id").await, ids_before);
    knn_agrees_with_exact(&s).await;

    // Many appends, each indexed as a segment of its own: merging brings them back down.
    s.sql("ALTER TABLE t SET (auto_index_rows = 1, auto_merge_segments = 4, auto_compact = off)")
        .await
        .unwrap();
    for k in 0..6 {
        s.sql(&insert(5000 + 10 * k, 10)).await.unwrap();
        s.sql("OPTIMIZE INDEX t_idx ON t APPEND").await.unwrap();
    }
    assert!(u64s(&s, "SELECT segments FROM fragvec_indexes('t')").await[0] > 4);
    let did = text(&s, "MAINTAIN t").await;
    assert!(did.contains("index_merge"), "{did}");
    assert!(u64s(&s, "SELECT segments FROM fragvec_indexes('t')").await[0] <= 4);
    knn_agrees_with_exact(&s).await;

    // The journal has every task, and says which did what.
    let journal = text(
        &s,
        "SELECT kind, count(*) AS n FROM fragvec_maintenance('t') WHERE outcome = 'done' GROUP BY kind ORDER BY kind",
    )
    .await;
    for kind in ["compact", "index_append", "index_merge", "vacuum"] {
        assert!(journal.contains(kind), "{journal}");
    }
}

/// Switches indexing on for `t` (`auto_index_rows`), and takes its lease as another
/// maintainer (`elsewhere:1:x`) would.
async fn indexing_on_with_lease_held_elsewhere(
    s: &FragvecSession,
    auto_index_rows: u64,
) -> (fragvec::format::TableDir, Lease) {
    s.sql(&format!(
        "ALTER TABLE t SET (auto_index = on, auto_index_rows = {auto_index_rows})"
    ))
    .await
    .unwrap();
    let dir = s.database().table("t").unwrap();
    let lease = Lease::acquire(&dir, "elsewhere:1:x", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    (dir, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_gives_way_to_a_maintainer_holding_the_lease() {
    let db = Location::local();
    let s = table_with_index(db.url()).await;
    s.sql(&insert(1000, 50)).await.unwrap();
    let (dir, other) = indexing_on_with_lease_held_elsewhere(&s, 1).await;
    let said = text(&s, "MAINTAIN t").await;
    assert!(said.contains("elsewhere:1:x"), "{said}");
    assert_eq!(
        u64s(&s, "SELECT unindexed_rows FROM fragvec_indexes('t')").await,
        [50]
    );
    other.release(&dir).await.unwrap();
    let did = text(&s, "MAINTAIN t").await;
    assert!(did.contains("index_append"), "{did}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_with_nothing_due_takes_no_lease() {
    let db = Location::local();
    let s = table_with_index(db.url()).await;
    let (dir, other) = indexing_on_with_lease_held_elsewhere(&s, 1_000_000).await;
    // Nothing is due, so the round does not ask for the lease another maintainer holds
    // (it would say who holds it), and writes no journal record.
    let said = text(&s, "MAINTAIN t").await;
    assert!(!said.contains("elsewhere:1:x"), "{said}");
    assert_eq!(
        i64s(&s, "SELECT count(*) FROM fragvec_maintenance('t')").await,
        [0]
    );
    other.release(&dir).await.unwrap();
}

/// The maintainer's rounds hand a due VACUUM back instead of running it (it runs beside the
/// following rounds); run on its own it needs no lease and is journaled like the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintainer_round_hands_its_vacuum_back() {
    let db = Location::local();
    let s = table_with_index(db.url()).await;
    for k in 0..12 {
        s.sql(&insert(1000 + 10 * k, 10)).await.unwrap();
    }
    let ids = i64s(&s, "SELECT id FROM t ORDER BY id").await;
    s.sql(
        "ALTER TABLE t SET (auto_index = on, auto_index_rows = 100, auto_vacuum_retain = 3, \
         auto_vacuum_grace_seconds = 0)",
    )
    .await
    .unwrap();
    let versions = "SELECT count(*) FROM fragvec_versions('t')";
    let before = u64s(&s, versions).await[0];
    let ttl = Duration::from_secs(60);
    let report = s
        .maintain_leased("t", &[], ttl, VacuumIn::Caller)
        .await
        .unwrap();
    let kinds: Vec<&str> = report.tasks.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(kinds, ["index_append"], "{report:?}");
    assert!(report.vacuum.is_some(), "{report:?}");
    assert_eq!(u64s(&s, versions).await[0], before + 1);

    // With only the VACUUM due, the next round hands it back without writing a lease.
    let dir = s.database().table("t").unwrap();
    let lease_now = || async { fragvec::maintain::lease::current(&dir).await.unwrap() };
    let lease_before = lease_now().await;
    let report = s
        .maintain_leased("t", &[], ttl, VacuumIn::Caller)
        .await
        .unwrap();
    assert!(report.tasks.is_empty(), "{report:?}");
    let vacuum = report.vacuum.expect("a vacuum is due");
    assert_eq!(lease_now().await, lease_before);

    // Another maintainer holds the lease: a round leaves the VACUUM to it, but one handed
    // back before runs all the same.
    let other = Lease::acquire(&dir, "elsewhere:1:x", ttl)
        .await
        .unwrap()
        .unwrap();
    let report = s
        .maintain_leased("t", &[], ttl, VacuumIn::Caller)
        .await
        .unwrap();
    assert!(report.vacuum.is_none(), "{report:?}");
    assert!(
        report.notes.iter().any(|n| n.contains("elsewhere:1:x")),
        "{report:?}"
    );
    let record = s.run_vacuum("t", vacuum).await.unwrap();
    assert_eq!(
        (record.kind.as_str(), record.outcome.as_str()),
        ("vacuum", "done")
    );
    assert!(u64s(&s, versions).await[0] <= 4);
    let journal = text(&s, "SELECT kind, outcome FROM fragvec_maintenance('t')").await;
    assert!(
        journal.contains("vacuum") && journal.contains("index_append"),
        "{journal}"
    );
    assert_eq!(i64s(&s, "SELECT id FROM t ORDER BY id").await, ids);
    knn_agrees_with_exact(&s).await;
    other.release(&dir).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maintainer_keeps_a_growing_table_indexed_and_compact() {
    let db = Location::local();
    let s = table_with_index(db.url()).await;
    s.sql(
        "ALTER TABLE t SET (auto_index = on, auto_index_rows = 60, auto_compact = on, \
         auto_compact_small_fragments = 4, auto_merge_segments = 4, auto_vacuum_retain = 5, \
         auto_vacuum_grace_seconds = 5)",
    )
    .await
    .unwrap();
    let config = MaintainerConfig {
        interval: Duration::from_millis(100),
        ..Default::default()
    };
    let maintainer = Maintainer::start(&s, config).await.unwrap();
    let mut expected: Vec<i64> = (0..400).collect();
    for k in 0..40 {
        s.sql(&insert(10_000 + 10 * k, 10)).await.unwrap();
        expected.extend(10_000 + 10 * k..10_000 + 10 * k + 10);
        if k % 10 == 9 {
            knn_agrees_with_exact(&s).await;
        }
    }
    // Within a few passes everything is indexed and the small fragments are merged. A run of
    // small fragments is compacted once it has 4, and never across a segment's coverage, so
    // the unindexed rows and each segment may keep up to 3 small fragments for good (which
    // ones depends on how inserts and passes interleave): 41 fragments come down to at most
    // 3 per segment and 3 unindexed, plus the first one.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let unindexed = u64s(&s, "SELECT unindexed_rows FROM fragvec_indexes('t')").await[0];
        let fragments = u64s(&s, "SELECT count(*) FROM fragvec_fragments('t')").await[0];
        let segments = u64s(&s, "SELECT segments FROM fragvec_indexes('t')").await[0];
        if unindexed < 60 && segments <= 4 && fragments <= 3 * (segments + 1) + 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "unindexed {unindexed}, fragments {fragments}, segments {segments} after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    maintainer.stop();
    assert_eq!(i64s(&s, "SELECT id FROM t ORDER BY id").await, expected);
    knn_agrees_with_exact(&s).await;
    let outcomes = text(&s, "SELECT DISTINCT outcome FROM fragvec_maintenance('t')").await;
    assert!(!outcomes.contains("failed"), "{outcomes}");
    // The VACUUMs ran beside the rounds, and stopping waited for a running one (every
    // task has finished, below).
    let kinds = text(&s, "SELECT DISTINCT kind FROM fragvec_maintenance('t')").await;
    assert!(kinds.contains("vacuum"), "{kinds}");
    let finished = s
        .sql_one("SELECT finished FROM fragvec_maintenance('t')")
        .await
        .unwrap();
    assert!(
        finished
            .batches
            .iter()
            .all(|b| b.column(0).null_count() == 0)
    );
}

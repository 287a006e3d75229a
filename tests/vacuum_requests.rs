//! What VACUUM asks the store for, counted with a `MeteredStore`: which versions stay is
//! decided from the manifests' listing, so it reads each retained manifest once and none of
//! the versions it drops, and it removes exactly what it reports.

use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::prelude::SessionContext;
use fragvec::FragvecSession;
use fragvec::engine::StatementResult;
use fragvec::format::Database;
use fragvec::format::metered_store::MeteredStore;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

async fn session_on(store: Arc<dyn ObjectStore>) -> FragvecSession {
    let db = Database::from_store(store, Path::default(), "memory://vacuum-requests".into());
    FragvecSession::with_context(SessionContext::new(), db)
        .await
        .unwrap()
}

fn value(result: &StatementResult, column: &str) -> u64 {
    let batch = &result.batches[0];
    batch
        .column_by_name(column)
        .unwrap_or_else(|| panic!("no column {column}"))
        .as_primitive::<UInt64Type>()
        .value(0)
}

/// GET and DELETE requests of manifests (`_versions/`) and of other files, from a trace.
fn counted(trace: &[String]) -> (usize, usize, usize, usize) {
    let is = |line: &&String, verb: &str, manifest: bool| {
        line.starts_with(verb) && line.contains("/_versions/") == manifest
    };
    (
        trace.iter().filter(|l| is(l, "GET ", true)).count(),
        trace.iter().filter(|l| is(l, "GET ", false)).count(),
        trace.iter().filter(|l| is(l, "DELETE ", true)).count(),
        trace.iter().filter(|l| is(l, "DELETE ", false)).count(),
    )
}

#[tokio::test]
async fn vacuum_reads_the_retained_manifests_once_and_deletes_what_it_reports() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = session_on(store.clone()).await;
    writer
        .sql("CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(2))")
        .await
        .unwrap();
    // 31 more versions: 20 rows in one fragment, 10 one-row inserts, then 20 deletes from
    // the first fragment, each replacing its deletion file (the old ones stay needed only
    // by the versions that saw them).
    let rows: Vec<String> = (0..20).map(|i| format!("({i}, [{i}, 1])")).collect();
    writer
        .sql(&format!("INSERT INTO t VALUES {}", rows.join(", ")))
        .await
        .unwrap();
    for i in 20..30 {
        writer
            .sql(&format!("INSERT INTO t VALUES ({i}, [{i}, 1])"))
            .await
            .unwrap();
    }
    for i in 0..20 {
        writer
            .sql(&format!("DELETE FROM t WHERE id = {i}"))
            .await
            .unwrap();
    }
    let versions = 32u64;

    // A session of another process: its cache of decoded manifests is empty.
    let metered = MeteredStore::new(store);
    let vacuumer = session_on(Arc::new(metered.clone())).await;
    // Every version committed within the hour: all stay, and each is read once (before, a
    // walk back over the commit times read each one a second time).
    vacuumer
        .sql("SET fragvec.vacuum_grace_seconds = 3600")
        .await
        .unwrap();
    metered.trace(true);
    let r = vacuumer
        .sql_one("VACUUM t RETAIN 1 VERSIONS")
        .await
        .unwrap();
    assert_eq!(value(&r, "versions_removed"), 0);
    assert_eq!(value(&r, "files_removed"), 0);
    let trace = metered.take_trace();
    assert_eq!(counted(&trace), (versions as usize, 0, 0, 0), "{trace:#?}");

    // No grace: the newest 5 stay. Only they are read (the one VACUUM's own latest check
    // decoded may come from the cache); the other 26 manifests and every file only they
    // needed are deleted, one DELETE each, as reported.
    vacuumer
        .sql("SET fragvec.vacuum_grace_seconds = 0")
        .await
        .unwrap();
    metered.take_trace();
    let r = vacuumer
        .sql_one("VACUUM t RETAIN 5 VERSIONS")
        .await
        .unwrap();
    let trace = metered.take_trace();
    let (manifest_gets, file_gets, manifest_deletes, file_deletes) = counted(&trace);
    assert!((4..=5).contains(&manifest_gets), "{trace:#?}");
    assert_eq!(file_gets, 0, "{trace:#?}");
    assert_eq!(value(&r, "versions_removed"), versions - 5);
    assert_eq!(manifest_deletes as u64, versions - 5, "{trace:#?}");
    assert_eq!(
        file_deletes as u64,
        value(&r, "files_removed"),
        "{trace:#?}"
    );
    // At least the deletion files that only dropped versions saw (15 of them) go.
    assert!(file_deletes >= 15, "{trace:#?}");

    // Every retained version still reads, and the table is whole.
    for v in versions - 4..=versions {
        vacuumer
            .sql_one(&format!("SELECT count(*) FROM t VERSION AS OF {v}"))
            .await
            .unwrap_or_else(|e| panic!("version {v}: {e}"));
    }
    let r = vacuumer
        .sql_one("SELECT count(*) AS n FROM t")
        .await
        .unwrap();
    let n = r.batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    assert_eq!(n.value(0), 10);
}

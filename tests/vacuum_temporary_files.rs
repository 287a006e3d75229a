//! VACUUM removes the temporary files that writes killed mid-upload leave behind
//! (`data/*.parquet#1`, `_deletions/*.del#1`, `_versions/*.manifest#1`), in every folder of
//! the table, once they are older than the grace period; younger ones stay (a write may be in
//! progress), and the table still reads the same.

use std::time::{Duration, SystemTime};

use datafusion::arrow::array::AsArray;
use fragvec::FragvecSession;
use fragvec::format::progress::Progress;
use fragvec::format::vacuum::vacuum;

fn plant(path: &std::path::Path, bytes: usize, age: Duration) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, vec![7u8; bytes]).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[tokio::test]
async fn vacuum_removes_old_temporary_files_in_every_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let s = FragvecSession::open(tmp.path().to_str().unwrap())
        .await
        .unwrap();
    s.sql("CREATE TABLE t (id BIGINT)").await.unwrap();
    s.sql("INSERT INTO t SELECT value FROM generate_series(1, 100)")
        .await
        .unwrap();
    s.sql("DELETE FROM t WHERE id < 10").await.unwrap();
    let table = tmp.path().join("t");
    let hour = Duration::from_secs(3600);
    let old = [
        table.join("data/abc.parquet#1"),
        table.join("_deletions/abc.del#2"),
        table.join("_versions/00000000000000000009.manifest#1"),
    ];
    for p in &old {
        plant(p, 1000, hour);
    }
    let fresh = table.join("data/writing.parquet#3");
    plant(&fresh, 10, Duration::ZERO);

    let dir = s.database().table("t").unwrap();
    let m = vacuum(&dir, None, Duration::from_secs(60), &Progress::none())
        .await
        .unwrap();
    for p in &old {
        assert!(!p.exists(), "{} survived VACUUM", p.display());
    }
    assert!(
        fresh.exists(),
        "a temporary file inside the grace period was removed"
    );
    assert!(m.files_removed >= 3 && m.bytes_removed >= 3000, "{m:?}");

    let r = s.sql_one("SELECT count(*) AS n FROM t").await.unwrap();
    let n = r.batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0);
    assert_eq!(n, 91);
}

//! Maintainers as real processes (`fragvec maintain`), two of them, racing a writer (inserts,
//! deletes, re-embeddings against a model) and a KNN reader, one maintainer killed with
//! SIGKILL at random moments and started again. The lease of a killed one lapses and the
//! other takes over; afterwards nothing is lost or resurrected, the index answers as exact
//! search does, and after VACUUM no file is left that the table does not reference.
//!
//! Runs for 30 s (`FRAGVEC_SOAK_SECONDS` for longer).

use std::collections::{BTreeMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::Int64Type;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fragvec::engine::FragvecSession;
use fragvec::format::vacuum::referenced_files;

mod support;

fn maintainer(db: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .args([
            "--db",
            db,
            "maintain",
            "--interval",
            "0.2",
            "--lease-seconds",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start fragvec maintain")
}

async fn ids(s: &FragvecSession, sql: &str) -> Vec<i64> {
    support::column::<Int64Type>(s, sql).await
}

fn vector(rng: &mut StdRng) -> String {
    let v: Vec<String> = (0..4)
        .map(|_| format!("{:.3}", rng.random_range(-10.0..10.0)))
        .collect();
    format!("[{}]", v.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_maintainers_lose_nothing_and_leave_nothing_behind() {
    let seconds: u64 = std::env::var("FRAGVEC_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db").to_string_lossy().to_string();
    let s = FragvecSession::open(&db).await.unwrap();
    let mut rng = StdRng::seed_from_u64(28);
    // The model: id → vector text.
    let mut model: BTreeMap<i64, String> = BTreeMap::new();
    s.sql("CREATE TABLE t (id BIGINT, emb VECTOR(4))")
        .await
        .unwrap();
    let mut next_id = 0i64;
    let mut insert = |rng: &mut StdRng, model: &mut BTreeMap<i64, String>, n: usize| {
        let rows: Vec<String> = (0..n)
            .map(|_| {
                let v = vector(rng);
                model.insert(next_id, v.clone());
                next_id += 1;
                format!("({}, {v})", next_id - 1)
            })
            .collect();
        format!("INSERT INTO t VALUES {}", rows.join(", "))
    };
    s.sql(&insert(&mut rng, &mut model, 1000)).await.unwrap();
    s.sql("CREATE VECTOR INDEX t_idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 8)")
        .await
        .unwrap();
    // Vacuum's grace must exceed the longest write (the writer below takes well under 5 s).
    s.sql(
        "ALTER TABLE t SET (auto_index = on, auto_index_rows = 100, auto_index_age_seconds = 1, \
         auto_compact = on, auto_compact_small_fragments = 4, auto_merge_segments = 4, \
         auto_vacuum_retain = 10, auto_vacuum_grace_seconds = 5)",
    )
    .await
    .unwrap();

    let mut maintainers = vec![maintainer(&db), maintainer(&db)];
    let reader = {
        let r = FragvecSession::open(&db).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        tokio::spawn(async move {
            let mut queries = 0;
            while Instant::now() < deadline {
                let got = ids(
                    &r,
                    "SELECT id FROM t ORDER BY emb <-> [1, 2, 3, 4]::VECTOR(4) LIMIT 10",
                )
                .await;
                let unique: HashSet<_> = got.iter().collect();
                assert_eq!(got.len(), 10, "{got:?}");
                assert_eq!(unique.len(), got.len(), "a row answered twice: {got:?}");
                queries += 1;
            }
            queries
        })
    };
    let started = Instant::now();
    let mut next_kill = started + Duration::from_millis(rng.random_range(500..3000));
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        s.sql(&insert(&mut rng, &mut model, 20)).await.unwrap();
        if rng.random_bool(0.3) {
            let live: Vec<i64> = model.keys().copied().collect();
            let gone: Vec<i64> = (0..5)
                .map(|_| live[rng.random_range(0..live.len())])
                .collect();
            for id in &gone {
                model.remove(id);
            }
            let list: Vec<String> = gone.iter().map(i64::to_string).collect();
            s.sql(&format!("DELETE FROM t WHERE id IN ({})", list.join(", ")))
                .await
                .unwrap();
        }
        if rng.random_bool(0.3) {
            let live: Vec<i64> = model.keys().copied().collect();
            let id = live[rng.random_range(0..live.len())];
            let v = vector(&mut rng);
            model.insert(id, v.clone());
            s.sql(&format!("UPDATE t SET emb = {v} WHERE id = {id}"))
                .await
                .unwrap();
        }
        if Instant::now() >= next_kill {
            let k = rng.random_range(0..maintainers.len());
            maintainers[k].kill().unwrap();
            maintainers[k].wait().unwrap();
            maintainers[k] = maintainer(&db);
            kills += 1;
            next_kill = Instant::now() + Duration::from_millis(rng.random_range(500..3000));
        }
    }
    let queries = reader.await.unwrap();
    for mut m in maintainers {
        m.kill().unwrap();
        m.wait().unwrap();
    }
    assert!(
        kills >= 3 && queries > 0,
        "{kills} kills, {queries} queries"
    );

    // The leases of the killed lapse; one more pass finishes the work.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let status = Command::new(env!("CARGO_BIN_EXE_fragvec"))
        .args(["--db", &db, "maintain", "--interval", "0"])
        .status()
        .unwrap();
    assert!(status.success());

    // Nothing lost, nothing resurrected, every vector the last one written.
    let want: Vec<i64> = model.keys().copied().collect();
    assert_eq!(ids(&s, "SELECT id FROM t ORDER BY id").await, want);
    let r = s
        .sql_one("SELECT id, arrow_cast(emb, 'List(Float32)') FROM t ORDER BY id LIMIT 50")
        .await
        .unwrap();
    let shown = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    for (id, v) in model.iter().take(50) {
        let numbers: Vec<f32> = v
            .trim_matches(['[', ']'])
            .split(", ")
            .map(|x| x.parse().unwrap())
            .collect();
        let row = shown
            .lines()
            .find(|l| l.split('|').nth(1).map(str::trim) == Some(&id.to_string()))
            .unwrap_or_else(|| panic!("id {id} missing:\n{shown}"));
        for x in numbers {
            assert!(row.contains(&format!("{x}")), "id {id}: {row} lacks {x}");
        }
    }
    // The index answers as exact search does.
    for q in ["[1, 2, 3, 4]", "[-5, 0, 5, -5]", "[9, 9, -9, 0]"] {
        let sql = format!("SELECT id FROM t ORDER BY emb <-> {q}::VECTOR(4), id LIMIT 10");
        s.sql("SET fragvec.nprobes = 8").await.unwrap();
        let indexed = ids(&s, &sql).await;
        s.sql("SET fragvec.exact = true").await.unwrap();
        let exact = ids(&s, &sql).await;
        s.sql("SET fragvec.exact = false").await.unwrap();
        assert_eq!(indexed, exact, "{q}");
    }
    let journal = ids(
        &s,
        "SELECT CAST(count(*) AS BIGINT) FROM fragvec_maintenance('t') WHERE outcome = 'done'",
    )
    .await;
    assert!(journal[0] > 0, "no maintenance task finished");

    // No orphans: after a VACUUM (nothing is writing now), every file in the table's folder
    // is one the latest version references.
    s.sql("SET fragvec.vacuum_grace_seconds = 0").await.unwrap();
    s.sql("VACUUM t RETAIN 1 VERSIONS").await.unwrap();
    let latest = s.database().table("t").unwrap();
    let latest = std::sync::Arc::new(latest).latest().await.unwrap();
    let referenced = referenced_files(&latest.manifest);
    let root = dir.path().join("db").join("t");
    let mut stack = vec![root.clone()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if relative.starts_with("_versions") || relative.starts_with("_maintenance") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                assert!(referenced.contains(&relative), "orphan file {relative}");
            }
        }
    }
}

#![cfg(feature = "flight")]
//! `fragvec serve --flight` from arrow-flight's own Rust client (`FlightSqlServiceClient`):
//! 16 clients at once, each inserting, deleting and searching its own id range of one shared
//! table while the others do the same, checked against a model of that range: nothing lost,
//! nothing resurrected, every KNN answer exact (all partitions probed).

#[path = "support/server.rs"]
mod server;

use std::collections::BTreeMap;

use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use futures::TryStreamExt;
use server::ServeProcess;
use tonic::transport::Channel;

const CLIENTS: i64 = 16;
const ROUNDS: i64 = 12;
const DIM: usize = 4;

async fn client(uri: &str) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(uri.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FlightSqlServiceClient::new(channel);
    // Any credentials on a server without users: the token names this client's session.
    client.handshake("model", "checker").await.unwrap();
    client
}

async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Vec<RecordBatch> {
    let info = client
        .execute(sql.to_string(), None)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut batches = vec![];
    for endpoint in info.endpoint {
        let stream = client.do_get(endpoint.ticket.unwrap()).await.unwrap();
        batches.extend(stream.try_collect::<Vec<_>>().await.unwrap());
    }
    batches
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// A vector no two rows share a distance to, for the queries below.
fn vector(id: i64) -> [f32; DIM] {
    let x = id as f32;
    [
        x.sin(),
        (x * 0.37).cos(),
        (x * 0.11).sin() * 2.0,
        x / 1000.0,
    ]
}

fn literal(v: &[f32]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
    format!("[{}]", parts.join(","))
}

fn l2(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// One client: its own ids `base..base + ROUNDS * 4`, inserted four a round, every third
/// deleted, the nearest three of its range checked after each round.
async fn work(uri: String, base: i64) {
    let mut c = client(&uri).await;
    query(&mut c, "SET fragvec.nprobes = 1000000").await;
    let mut model: BTreeMap<i64, [f32; DIM]> = BTreeMap::new();
    for round in 0..ROUNDS {
        let new: Vec<i64> = (0..4).map(|i| base + round * 4 + i).collect();
        let values: Vec<String> = new
            .iter()
            .map(|id| format!("({id}, {})", literal(&vector(*id))))
            .collect();
        let sql = format!("INSERT INTO shared VALUES {}", values.join(", "));
        let inserted = c.execute_update(sql, None).await.unwrap();
        assert_eq!(inserted, 4);
        model.extend(new.iter().map(|id| (*id, vector(*id))));
        let gone = base + round * 4 + (round % 4);
        let deleted = c
            .execute_update(format!("DELETE FROM shared WHERE id = {gone}"), None)
            .await
            .unwrap();
        assert_eq!(deleted, 1, "client {base}: DELETE of {gone}");
        model.remove(&gone);

        let q = vector(base + round * 7 + 3);
        let found = ids(&query(
            &mut c,
            &format!(
                "SELECT id FROM shared WHERE id >= {base} AND id < {} ORDER BY emb <-> {} LIMIT 3",
                base + 1000,
                literal(&q)
            ),
        )
        .await);
        let mut expected: Vec<(f32, i64)> = model.iter().map(|(id, v)| (l2(v, &q), *id)).collect();
        expected.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let expected: Vec<i64> = expected.iter().take(3).map(|(_, id)| *id).collect();
        assert_eq!(found, expected, "client {base} round {round}");
    }
    let mine = ids(&query(
        &mut c,
        &format!(
            "SELECT id FROM shared WHERE id >= {base} AND id < {} ORDER BY id",
            base + 1000
        ),
    )
    .await);
    assert_eq!(
        mine,
        model.keys().copied().collect::<Vec<_>>(),
        "client {base}: rows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_clients_against_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &["--flight", "127.0.0.1:0"], 2);
    let uri = server.address("grpc").replacen("grpc://", "http://", 1);
    let mut setup = client(&uri).await;
    let seed: Vec<String> = (1_000_000..1_000_064)
        .map(|id| format!("({id}, {})", literal(&vector(id))))
        .collect();
    setup
        .execute_update(
            format!(
                "CREATE TABLE shared (id BIGINT, emb VECTOR({DIM})); INSERT INTO shared VALUES {}",
                seed.join(", ")
            ),
            None,
        )
        .await
        .unwrap();
    setup
        .execute_update(
            "CREATE VECTOR INDEX shared_ix ON shared (emb) USING IVF_FLAT WITH (num_partitions = 4)"
                .into(),
            None,
        )
        .await
        .unwrap();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(work(uri.clone(), i * 1000)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let total = query(&mut setup, "SELECT count(*) FROM shared").await;
    let count = total[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(count, 64 + CLIENTS * ROUNDS * 3);
    assert!(total[0].column(0).null_count() == 0);
    server.stop();
}

/// The server's resident memory in bytes (Linux).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A big result streams: its first batches arrive while the server has produced a small
/// part of it, and the server, held back by a client that stops reading, does not build
/// the rest in memory (320 MB of rows here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_result_streams_and_is_never_held_whole() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &["--flight", "127.0.0.1:0"], 2);
    let uri = server.address("grpc").replacen("grpc://", "http://", 1);
    let mut c = client(&uri).await;
    let before = rss_bytes(server.pid());
    // 20M rows x two BIGINTs: 320 MB if it were held whole.
    let info = c
        .execute(
            "SELECT value, value * 2 AS twice FROM generate_series(1, 20000000)".into(),
            None,
        )
        .await
        .unwrap();
    let mut stream = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    let first = stream.try_next().await.unwrap().unwrap();
    assert!(first.num_rows() > 0 && first.num_rows() < 1_000_000);
    // Stop reading: the server fills the transport's buffers and waits.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let held = rss_bytes(server.pid()).saturating_sub(before);
    eprintln!("server memory grew by {} MB", held >> 20);
    assert!(
        held < 150 << 20,
        "the server grew by {} MB while the client read one batch",
        held >> 20
    );
    // Then the rest arrives (in no promised order: the plan may run in partitions), each
    // row once.
    let sum = |b: &RecordBatch| -> i128 {
        let values = b.column(0).as_primitive::<Int64Type>();
        values.values().iter().map(|v| *v as i128).sum()
    };
    let mut rows = first.num_rows() as i64;
    let mut total = sum(&first);
    while let Some(batch) = stream.try_next().await.unwrap() {
        rows += batch.num_rows() as i64;
        total += sum(&batch);
    }
    assert_eq!(rows, 20_000_000);
    assert_eq!(total, 20_000_000i128 * 20_000_001 / 2);
    server.stop();
}

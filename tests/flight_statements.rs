#![cfg(feature = "flight")]
//! `fragvec serve --flight` from arrow-flight's own Rust client (`FlightSqlServiceClient`):
//! row counts of updates, prepared statements whose parameters arrive as Arrow batches
//! (a vector as `FixedSizeList<Float32>` or `List<Float64>`, several rows as executemany),
//! KNN with a bound vector answered as the literal query is and planned on the index, the
//! metadata calls tools make (catalogs, schemas, tables with their schemas, table types,
//! primary keys, SQL info, XDBC types), gRPC codes of errors, and authentication: wrong
//! passwords, missing and forged tokens, one session shared by every holder of its token.

#[path = "support/server.rs"]
mod server;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_flight::FlightInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTables, CommandGetXdbcTypeInfo, SqlInfo,
};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array,
    ListArray, RecordBatch, StringArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use datafusion::arrow::ipc::convert::try_schema_from_ipc_buffer;
use futures::TryStreamExt;
use server::ServeProcess;
use tonic::Code;
use tonic::transport::Channel;

const DIM: usize = 4;
const ROWS: i64 = 300;

async fn connect(uri: &str) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(uri.replacen("grpc://", "http://", 1))
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightSqlServiceClient::new(channel)
}

/// A client holding a session's token (any credentials do on a server without users).
async fn session(uri: &str, user: &str, password: &str) -> FlightSqlServiceClient<Channel> {
    let mut c = connect(uri).await;
    c.handshake(user, password)
        .await
        .unwrap_or_else(|e| panic!("handshake as {user}: {e}"));
    c
}

async fn fetch(c: &mut FlightSqlServiceClient<Channel>, info: FlightInfo) -> Vec<RecordBatch> {
    let mut batches = vec![];
    for endpoint in info.endpoint {
        let stream = c.do_get(endpoint.ticket.unwrap()).await.unwrap();
        batches.extend(stream.try_collect::<Vec<_>>().await.unwrap());
    }
    batches
}

async fn query(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Vec<RecordBatch> {
    let info = c
        .execute(sql.to_string(), None)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    fetch(c, info).await
}

async fn update(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> i64 {
    c.execute_update(sql.to_string(), None)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Whether a client error's text names gRPC status `code` (as its name or as tonic's
/// description of it, depending on which call failed).
fn has_code(err: &impl std::fmt::Display, code: Code) -> bool {
    let text = err.to_string();
    text.contains(&format!("{code:?}")) || text.contains(code.description())
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// Every string of column `name`, across the batches.
fn strings(batches: &[RecordBatch], name: &str) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let column = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("no {name}"));
            let column = datafusion::arrow::compute::cast(column, &DataType::Utf8).unwrap();
            column
                .as_string::<i32>()
                .iter()
                .map(|s| s.unwrap_or("").to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A vector no two rows share a distance to.
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

fn category(id: i64) -> String {
    format!("c{}", id % 3)
}

/// The `k` nearest ids of category `cat` to `q` in `model`.
fn nearest(model: &BTreeMap<i64, [f32; DIM]>, q: &[f32], cat: &str, k: usize) -> Vec<i64> {
    let mut hits: Vec<(f32, i64)> = model
        .iter()
        .filter(|(id, _)| category(**id) == cat)
        .map(|(id, v)| (l2(v, q), *id))
        .collect();
    hits.sort_by(|a, b| a.partial_cmp(b).unwrap());
    hits.into_iter().take(k).map(|(_, id)| id).collect()
}

fn fixed_vectors(vectors: &[[f32; DIM]]) -> ArrayRef {
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let values = Float32Array::from_iter_values(vectors.iter().flatten().copied());
    Arc::new(FixedSizeListArray::new(
        item,
        DIM as i32,
        Arc::new(values),
        None,
    ))
}

fn float64_lists(vectors: &[Vec<f64>]) -> ArrayRef {
    let item = Arc::new(Field::new_list_field(DataType::Float64, true));
    let values = Float64Array::from_iter_values(vectors.iter().flatten().copied());
    let offsets = OffsetBuffer::from_lengths(vectors.iter().map(Vec::len));
    Arc::new(ListArray::new(item, offsets, Arc::new(values), None))
}

/// One row of parameters: `$1` a vector, `$2` a category.
fn knn_parameters(q: ArrayRef, cat: &str) -> RecordBatch {
    let schema = Schema::new(vec![
        Field::new("q", q.data_type().clone(), true),
        Field::new("cat", DataType::Utf8, true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![q, Arc::new(StringArray::from(vec![cat]))],
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_parameters_and_metadata_from_the_rust_client() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(&dir.path().join("db"), &["--flight", "127.0.0.1:0"], 2);
    let uri = server.address("grpc").to_string();
    let mut c = session(&uri, "any", "one").await;

    update(
        &mut c,
        "CREATE TABLE items (id BIGINT PRIMARY KEY, cat VARCHAR, emb VECTOR(4))",
    )
    .await;
    update(&mut c, "CREATE TABLE plain (x INT)").await;
    let mut model = BTreeMap::new();
    let values: Vec<String> = (0..ROWS)
        .map(|id| {
            model.insert(id, vector(id));
            format!("({id}, '{}', '{}')", category(id), literal(&vector(id)))
        })
        .collect();
    let sql = format!("INSERT INTO items VALUES {}", values.join(", "));
    assert_eq!(update(&mut c, &sql).await, ROWS, "INSERT's row count");
    assert_eq!(
        update(&mut c, "DELETE FROM items WHERE id % 10 = 0").await,
        ROWS / 10
    );
    model.retain(|id, _| id % 10 != 0);
    update(
        &mut c,
        "CREATE VECTOR INDEX items_ix ON items (emb) USING IVF_FLAT WITH (num_partitions = 4)",
    )
    .await;
    // executemany: three rows of parameters, three inserts, into a fragment the index does
    // not cover (brute force beside the index's segment).
    let mut insert = c
        .prepare("INSERT INTO items VALUES ($1, $2, $3)".into(), None)
        .await
        .unwrap();
    let new: Vec<i64> = (ROWS..ROWS + 3).collect();
    let rows = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("cat", DataType::Utf8, false),
            Field::new(
                "emb",
                fixed_vectors(&[[0.0; DIM]]).data_type().clone(),
                true,
            ),
        ])),
        vec![
            Arc::new(Int64Array::from(new.clone())),
            Arc::new(StringArray::from_iter_values(
                new.iter().map(|i| category(*i)),
            )),
            fixed_vectors(&new.iter().map(|i| vector(*i)).collect::<Vec<_>>()),
        ],
    )
    .unwrap();
    insert.set_parameters(rows).unwrap();
    assert_eq!(
        insert.execute_update().await.unwrap(),
        3,
        "executemany's count"
    );
    insert.close().await.unwrap();
    for id in new {
        model.insert(id, vector(id));
    }

    // The session keeps its SET values: all four partitions probed, so KNN is exact.
    update(&mut c, "SET fragvec.nprobes = 4").await;
    let shown = query(&mut c, "SHOW fragvec.nprobes").await;
    assert!(
        strings(&shown, shown[0].schema().field(1).name()).contains(&"4".to_string()),
        "SHOW after SET: {shown:?}"
    );

    let sql = "SELECT id FROM items WHERE cat = $2 ORDER BY emb <-> $1 LIMIT 5";
    let mut knn = c.prepare(sql.into(), None).await.unwrap();
    for (n, id) in [7i64, 151, 301].into_iter().enumerate() {
        let q = vector(id).map(|x| x + 0.01);
        let cat = category(id + n as i64);
        let want = nearest(&model, &q, &cat, 5);
        let text = format!(
            "SELECT id FROM items WHERE cat = '{cat}' ORDER BY emb <-> '{}' LIMIT 5",
            literal(&q)
        );
        assert_eq!(ids(&query(&mut c, &text).await), want, "literal KNN");
        // The same statement, run again with each row of parameters: as FixedSizeList<Float32>
        // and as List<Float64> (what pyarrow makes of a Python list).
        knn.set_parameters(knn_parameters(fixed_vectors(&[q]), &cat))
            .unwrap();
        let info = knn.execute().await.unwrap();
        assert_eq!(ids(&fetch(&mut c, info).await), want, "FixedSizeList KNN");
        let as_f64 = vec![q.iter().map(|x| *x as f64).collect::<Vec<_>>()];
        knn.set_parameters(knn_parameters(float64_lists(&as_f64), &cat))
            .unwrap();
        let info = knn.execute().await.unwrap();
        assert_eq!(ids(&fetch(&mut c, info).await), want, "List<Float64> KNN");
    }
    // A vector of the wrong length is the client's error, not a panic or an empty answer.
    knn.set_parameters(knn_parameters(float64_lists(&[vec![1.0, 2.0]]), "c0"))
        .unwrap();
    let err = match knn.execute().await {
        Ok(info) => match c.do_get(info.endpoint[0].ticket.clone().unwrap()).await {
            Ok(stream) => stream
                .try_collect::<Vec<_>>()
                .await
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        },
        Err(e) => Some(e.to_string()),
    };
    let err = err.expect("a 2-element vector against VECTOR(4) was accepted");
    assert!(
        has_code(&err, Code::InvalidArgument) && err.contains("dimension"),
        "{err}"
    );
    knn.close().await.unwrap();

    // A bound vector is planned on the index, as a literal is.
    let mut explain = c.prepare(format!("EXPLAIN {sql}"), None).await.unwrap();
    explain
        .set_parameters(knn_parameters(fixed_vectors(&[vector(3)]), "c1"))
        .unwrap();
    let info = explain.execute().await.unwrap();
    let plan = strings(&fetch(&mut c, info).await, "plan").join("\n");
    assert!(plan.contains("KnnExec"), "no KnnExec:\n{plan}");
    explain.close().await.unwrap();

    // gRPC codes: a missing table is NotFound, bad SQL InvalidArgument.
    let err = c
        .execute("SELECT * FROM nowhere".into(), None)
        .await
        .unwrap_err();
    assert!(has_code(&err, Code::NotFound), "{err}");
    let err = c.execute("SELEC 1".into(), None).await.unwrap_err();
    assert!(has_code(&err, Code::InvalidArgument), "{err}");

    // Metadata.
    let info = c.get_catalogs().await.unwrap();
    assert_eq!(
        strings(&fetch(&mut c, info).await, "catalog_name"),
        ["datafusion"]
    );
    let info = c
        .get_db_schemas(CommandGetDbSchemas::default())
        .await
        .unwrap();
    assert!(strings(&fetch(&mut c, info).await, "db_schema_name").contains(&"public".into()));
    let info = c
        .get_tables(CommandGetTables {
            include_schema: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let tables = fetch(&mut c, info).await;
    let names = strings(&tables, "table_name");
    let position = names
        .iter()
        .position(|n| n == "items")
        .expect("items listed");
    assert!(names.contains(&"plain".to_string()), "{names:?}");
    assert_eq!(strings(&tables, "table_type")[position], "TABLE");
    let encoded = tables[0]
        .column_by_name("table_schema")
        .unwrap()
        .as_binary::<i32>()
        .value(position)
        .to_vec();
    let schema = try_schema_from_ipc_buffer(&encoded).unwrap();
    let emb = schema.field_with_name("emb").unwrap();
    assert!(
        matches!(emb.data_type(), DataType::FixedSizeList(item, 4) if item.data_type() == &DataType::Float32),
        "emb is {:?}",
        emb.data_type()
    );
    assert_eq!(
        emb.metadata().get("fragvec.type").map(String::as_str),
        Some("VECTOR(4)")
    );
    let info = c.get_table_types().await.unwrap();
    let types = strings(&fetch(&mut c, info).await, "table_type");
    assert!(types.contains(&"TABLE".to_string()) && types.contains(&"VIEW".to_string()));

    let keys_of = |table: &str| CommandGetPrimaryKeys {
        table: table.into(),
        ..Default::default()
    };
    let info = c.get_primary_keys(keys_of("items")).await.unwrap();
    let keys = fetch(&mut c, info).await;
    assert_eq!(strings(&keys, "column_name"), ["id"]);
    assert_eq!(
        keys[0]
            .column_by_name("key_sequence")
            .unwrap()
            .as_primitive::<Int32Type>()
            .value(0),
        1
    );
    let info = c.get_primary_keys(keys_of("plain")).await.unwrap();
    assert!(strings(&fetch(&mut c, info).await, "column_name").is_empty());

    let info = c
        .get_sql_info(vec![SqlInfo::FlightSqlServerName])
        .await
        .unwrap();
    let infos = fetch(&mut c, info).await;
    let value = infos[0].column_by_name("value").unwrap().as_union();
    let name = value.value(0);
    assert_eq!(name.as_string::<i32>().value(0), "fragvec");
    let info = c
        .get_xdbc_type_info(CommandGetXdbcTypeInfo::default())
        .await
        .unwrap();
    let types = strings(&fetch(&mut c, info).await, "type_name");
    assert!(types.len() > 3, "XDBC types: {types:?}");

    server.stop();
}

/// A Flight server in `dir` whose users file holds `users` (`name:password` lines).
fn with_users(dir: &std::path::Path, users: &str, more: &[&str]) -> ServeProcess {
    let file = dir.join("users");
    std::fs::write(&file, users).unwrap();
    let mut args = vec!["--flight", "127.0.0.1:0", "--users", file.to_str().unwrap()];
    args.extend_from_slice(more);
    ServeProcess::start(&dir.join("db"), &args, 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_shared_sessions_from_the_rust_client() {
    let dir = tempfile::tempdir().unwrap();
    let server = with_users(dir.path(), "ann:secret-pw\nbob:other\n", &[]);
    let uri = server.address("grpc").to_string();

    for (user, password) in [
        ("ann", "wrong"),
        ("nobody", "secret-pw"),
        ("bob", "secret-pw"),
    ] {
        let err = connect(&uri)
            .await
            .handshake(user, password)
            .await
            .expect_err("wrong credentials were accepted");
        assert!(
            has_code(&err, Code::Unauthenticated)
                && err.to_string().contains("password authentication failed"),
            "{user}: {err}"
        );
    }
    // No token, and a token the server never issued.
    let mut anonymous = connect(&uri).await;
    let err = anonymous
        .execute("SELECT 1".into(), None)
        .await
        .unwrap_err();
    assert!(has_code(&err, Code::Unauthenticated), "{err}");
    anonymous.set_token("00112233445566778899aabbccddeeff".into());
    let err = anonymous
        .execute("SELECT 1".into(), None)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown or expired token"),
        "{err}"
    );

    let mut ann = session(&uri, "ann", "secret-pw").await;
    update(&mut ann, "SET fragvec.nprobes = 7").await;
    // A second connection with ann's token is ann's session: it sees her SET.
    let mut again = connect(&uri).await;
    again.set_token(ann.token().unwrap().clone());
    let shown = query(&mut again, "SHOW fragvec.nprobes").await;
    assert!(
        strings(&shown, shown[0].schema().field(1).name()).contains(&"7".to_string()),
        "{shown:?}"
    );
    // Bob's own session does not.
    let mut bob = session(&uri, "bob", "other").await;
    let shown = query(&mut bob, "SHOW fragvec.nprobes").await;
    assert!(
        !strings(&shown, shown[0].schema().field(1).name()).contains(&"7".to_string()),
        "{shown:?}"
    );
    server.stop();
}

/// `--flight-token-ttl`: a token stays valid while it is used, and one left unused longer
/// than the TTL is refused with Unauthenticated until the client authenticates again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_when_left_unused() {
    let dir = tempfile::tempdir().unwrap();
    let server = with_users(dir.path(), "ann:secret-pw\n", &["--flight-token-ttl", "2"]);
    let uri = server.address("grpc").to_string();
    let mut ann = session(&uri, "ann", "secret-pw").await;
    update(&mut ann, "SET fragvec.nprobes = 7").await;
    // Used every second: the TTL counts from the last use, so the session lives on.
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
        let shown = query(&mut ann, "SHOW fragvec.nprobes").await;
        assert!(
            strings(&shown, shown[0].schema().field(1).name()).contains(&"7".to_string()),
            "{shown:?}"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
    let err = ann.execute("SELECT 1".into(), None).await.unwrap_err();
    assert!(
        has_code(&err, Code::Unauthenticated) && err.to_string().contains("expired"),
        "{err}"
    );
    // Authenticating again gives a new session (the expired one's SET is gone).
    let mut again = session(&uri, "ann", "secret-pw").await;
    let shown = query(&mut again, "SHOW fragvec.nprobes").await;
    assert!(
        !strings(&shown, shown[0].schema().field(1).name()).contains(&"7".to_string()),
        "{shown:?}"
    );
    server.stop();
}

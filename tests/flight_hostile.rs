#![cfg(feature = "flight")]
//! `fragvec serve --flight` against input no proper client sends: descriptors and tickets
//! that are not Flight SQL messages, handles that were never issued, and an ingest whose
//! upload breaks off halfway — which must commit nothing and leave no file behind once
//! VACUUM has run. After each, the server goes on serving.

#[path = "support/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    CommandPreparedStatementQuery, CommandStatementIngest, ProstMessageExt, TableDefinitionOptions,
    TableExistsOption, TableNotExistOption, TicketStatementQuery,
};
use arrow_flight::{FlightDescriptor, Ticket};
use datafusion::arrow::array::{
    Array, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::{StreamExt, TryStreamExt, stream};
use prost::Message;
use server::ServeProcess;
use tonic::Code;
use tonic::transport::Channel;

async fn channel(uri: &str) -> Channel {
    Channel::from_shared(uri.replacen("grpc://", "http://", 1))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn sql_client(uri: &str) -> FlightSqlServiceClient<Channel> {
    let mut c = FlightSqlServiceClient::new(channel(uri).await);
    c.handshake("any", "one").await.unwrap();
    c
}

async fn count(c: &mut FlightSqlServiceClient<Channel>, table: &str) -> i64 {
    let info = c
        .execute(format!("SELECT count(*) FROM {table}"), None)
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let batches: Vec<RecordBatch> = c.do_get(ticket).await.unwrap().try_collect().await.unwrap();
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

fn batch(from: i64, rows: usize) -> RecordBatch {
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let values = Float32Array::from_iter_values((0..rows * 4).map(|i| i as f32));
    let emb = FixedSizeListArray::new(item, 4, Arc::new(values), None);
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("emb", emb.data_type().clone(), true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(from..from + rows as i64)),
            Arc::new(emb),
        ],
    )
    .unwrap()
}

fn parquet_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("items/data"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_flight_input_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let server = ServeProcess::start(&db, &["--flight", "127.0.0.1:0"], 2);
    let uri = server.address("grpc").to_string();
    let mut c = sql_client(&uri).await;
    c.execute_update("CREATE TABLE items (id BIGINT, emb VECTOR(4))".into(), None)
        .await
        .unwrap();

    // A descriptor whose command is not a Flight SQL message, and one of garbage bytes.
    let mut raw = FlightServiceClient::new(channel(&uri).await);
    for cmd in [b"\x0a\x03abc".to_vec(), vec![0xff; 64]] {
        let err = raw
            .get_flight_info(FlightDescriptor::new_cmd(cmd))
            .await
            .unwrap_err();
        assert_ne!(err.code(), Code::Ok);
    }
    // Tickets: garbage, and a statement handle that was never issued.
    let err = raw.do_get(Ticket::new(vec![1u8, 2, 3])).await.err();
    assert!(err.is_some());
    let unknown = TicketStatementQuery {
        statement_handle: vec![7u8; 16].into(),
    };
    let err = c
        .do_get(Ticket::new(unknown.as_any().encode_to_vec()))
        .await
        .expect_err("an unknown ticket is refused");
    assert!(err.to_string().contains("no such result"), "{err}");
    // A prepared-statement handle that was never created.
    let never = CommandPreparedStatementQuery {
        prepared_statement_handle: vec![9u8; 16].into(),
    };
    let err = raw
        .get_flight_info(FlightDescriptor::new_cmd(never.as_any().encode_to_vec()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");

    // A prepared query tells its result schema before it runs (vectors marked as such).
    let prepared = c
        .prepare("SELECT id, emb FROM items WHERE id > $1".into(), None)
        .await
        .unwrap();
    let schema = prepared.dataset_schema().unwrap();
    assert_eq!(schema.field(0).name(), "id");
    assert_eq!(
        schema
            .field(1)
            .metadata()
            .get("fragvec.type")
            .map(String::as_str),
        Some("VECTOR(4)"),
        "{schema:?}"
    );
    prepared.close().await.unwrap();

    // An ingest that commits, then one whose upload breaks off after some batches.
    let ingest = |table: &str| CommandStatementIngest {
        table_definition_options: Some(TableDefinitionOptions {
            if_not_exist: TableNotExistOption::Fail as i32,
            if_exists: TableExistsOption::Append as i32,
        }),
        table: table.into(),
        ..Default::default()
    };
    let good = c
        .execute_ingest(
            ingest("items"),
            stream::iter([Ok(batch(0, 1000)), Ok(batch(1000, 1000))]),
        )
        .await
        .unwrap();
    assert_eq!(good, 2000);
    let files_before = parquet_files(&db);
    let descriptor = FlightDescriptor::new_cmd(ingest("items").as_any().encode_to_vec());
    // More than a fragment's 1,048,576 rows, so one fragment is written whole before the
    // break: its file is what VACUUM must remove.
    let batches = stream::iter((0..24).map(|i| Ok(batch(10_000 + i * 50_000, 50_000))));
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(descriptor))
        .build(batches)
        .map(|d| d.unwrap())
        // ... and then nothing more: the client goes away mid-upload.
        .chain(stream::pending());
    let mut uploader = FlightServiceClient::new(channel(&uri).await);
    let upload = tokio::spawn(async move { uploader.do_put(data).await });
    // Broken off once the writer is under way (its first fragment's file exists), a few
    // seconds later, so the first fragment is usually whole: the file being written is
    // removed by the failed write itself, a whole one is left for VACUUM.
    for _ in 0..600 {
        if parquet_files(&db) > files_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    upload.abort();
    let _ = upload.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count(&mut c, "items").await,
        2000,
        "the broken upload committed rows"
    );
    eprintln!(
        "data files: {files_before} before the broken upload, {} after it (before VACUUM)",
        parquet_files(&db)
    );

    // VACUUM (no grace) removes what the broken upload wrote.
    c.execute_update("SET fragvec.vacuum_grace_seconds = 0".into(), None)
        .await
        .unwrap();
    let info = c.execute("VACUUM items".into(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let _: Vec<RecordBatch> = c.do_get(ticket).await.unwrap().try_collect().await.unwrap();
    assert_eq!(parquet_files(&db), files_before, "files left after VACUUM");

    // CancelFlightInfo stops a statement whose rows are streaming: the DoGet ends with
    // CANCELLED, and a second cancel finds nothing to stop.
    let info = c
        .execute(
            "SELECT count(*) FROM generate_series(1, 5000000000) AS g(v) WHERE v % 7 = 3".into(),
            None,
        )
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut reader = c.clone();
    let fetch = tokio::spawn(async move {
        let stream = reader.do_get(ticket).await?;
        stream.try_collect::<Vec<RecordBatch>>().await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancel = arrow_flight::Action::new(
        "CancelFlightInfo",
        arrow_flight::CancelFlightInfoRequest::new(info.clone()).encode_to_vec(),
    );
    let answers: Vec<arrow_flight::Result> = c
        .do_action(cancel.clone())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let result = arrow_flight::CancelFlightInfoResult::decode(answers[0].body.clone()).unwrap();
    assert_eq!(result.status, arrow_flight::CancelStatus::Cancelled as i32);
    let ended = tokio::time::timeout(Duration::from_secs(30), fetch)
        .await
        .expect("the cancelled statement still streams")
        .unwrap();
    let err = ended.expect_err("a cancelled statement gave rows");
    assert!(err.to_string().contains("canceling statement"), "{err}");
    let again = c.do_action(cancel).await;
    assert!(again.is_err(), "a finished statement was cancelled again");

    // Still serving.
    assert_eq!(count(&mut c, "items").await, 2000);
    server.stop();
}

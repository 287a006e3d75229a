//! Unit tests of the distributed layer: every fragvec node through the codec (encode, decode,
//! same properties and same output), damaged nodes refused, writes kept on the coordinator,
//! and queries over in-process workers on 127.0.0.1:0 equal to the single-node answers.
//! The multi-process tests (`fragvec worker` processes) are `tests/distributed.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::{
    ExecutionPlan, StatisticsArgs, StatisticsContext, collect, displayable,
};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};
use prost::Message;

use super::codec::{FragvecCodec, NodeProto, WIRE_VERSION};
use super::databases::Databases;
use crate::engine::FragvecSession;
use crate::engine::knn::KnnExec;
use crate::engine::scan::FragmentScanExec;
use crate::index::cache::IndexCache;
use crate::index::knn::KnnShare;

/// A table `t (id, g, emb VECTOR(4))` of 50-row fragments: 300 indexed rows, 100 rows in a
/// second segment, 100 unindexed rows, some deletions.
async fn populated(location: &str) -> FragvecSession {
    let s = FragvecSession::open(location).await.unwrap();
    let rows = |from: i64, to: i64| {
        format!(
            "INSERT INTO t SELECT value, value % 7, make_array(sin(value), cos(value), \
             sin(value * 0.3), cos(value * 0.7)) FROM generate_series({from}, {to})"
        )
    };
    s.sql(&format!(
        "CREATE TABLE t (id BIGINT NOT NULL, g BIGINT, emb VECTOR(4)) \
         WITH (max_rows_per_fragment = 50); {}; \
         CREATE VECTOR INDEX idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 4); {}; \
         OPTIMIZE INDEX idx ON t APPEND; {}; \
         DELETE FROM t WHERE id % 11 = 0",
        rows(0, 299),
        rows(300, 399),
        rows(400, 499),
    ))
    .await
    .unwrap();
    s
}

fn codec_for(session: &FragvecSession) -> FragvecCodec {
    let databases = Arc::new(Databases::new(None));
    databases.serve(
        session.database().clone(),
        Arc::new(IndexCache::new(1 << 26)),
    );
    FragvecCodec::new(databases)
}

async fn physical(session: &FragvecSession, sql: &str) -> Arc<dyn ExecutionPlan> {
    session
        .context()
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap()
}

fn find<T: ExecutionPlan>(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut found = None;
    plan.apply(|node| {
        if node.downcast_ref::<T>().is_some() {
            found = Some(node.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found.expect("node in plan")
}

async fn run(session: &FragvecSession, plan: Arc<dyn ExecutionPlan>) -> String {
    let batches: Vec<RecordBatch> = collect(plan, session.context().task_ctx()).await.unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

/// Encodes and decodes one node with the codec alone.
fn round_trip_node(
    codec: &FragvecCodec,
    session: &FragvecSession,
    node: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let mut buf = Vec::new();
    codec.try_encode(node, &mut buf, &DefaultPhysicalProtoConverter {})?;
    decode_node(codec, session, &buf)
}

fn decode_node(
    codec: &FragvecCodec,
    session: &FragvecSession,
    buf: &[u8],
) -> Result<Arc<dyn ExecutionPlan>> {
    let ctx = session.context().task_ctx();
    codec.try_decode(buf, &[], &ctx, &DefaultPhysicalProtoConverter {})
}

fn shown(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

#[tokio::test]
async fn scan_plans_round_trip_with_the_same_output() {
    let s = populated("memory://dist-scan-round-trip").await;
    let codec = codec_for(&s);
    for sql in [
        "SELECT * FROM t",
        "SELECT id, emb FROM t WHERE g = 3 AND id > 40",
        "SELECT g, count(*) FROM t WHERE l2_distance(emb, [0, 0, 0, 0]) < 1.2 GROUP BY g ORDER BY g",
        "SELECT id FROM t LIMIT 7",
    ] {
        let plan = physical(&s, sql).await;
        let bytes = physical_plan_to_bytes_with_extension_codec(plan.clone(), &codec).unwrap();
        let back =
            physical_plan_from_bytes_with_extension_codec(&bytes, &s.context().task_ctx(), &codec)
                .unwrap();
        assert_eq!(shown(&back), shown(&plan), "{sql}");
        assert_eq!(back.schema(), plan.schema(), "{sql}");
        assert_eq!(run(&s, back).await, run(&s, plan).await, "{sql}");
    }
}

#[tokio::test]
async fn a_scan_of_some_fragments_round_trips() {
    let s = populated("memory://dist-scan-subset").await;
    let codec = codec_for(&s);
    let plan = physical(&s, "SELECT id, g FROM t WHERE id % 2 = 0").await;
    let scan = find::<FragmentScanExec>(&plan);
    let spec = scan
        .downcast_ref::<FragmentScanExec>()
        .unwrap()
        .spec()
        .clone();
    let ids: BTreeSet<u64> = spec.snapshot.manifest.fragments[2..5]
        .iter()
        .map(|f| f.id)
        .collect();
    let part: Arc<dyn ExecutionPlan> = Arc::new(
        FragmentScanExec::new(spec)
            .unwrap()
            .with_fragments(ids.clone()),
    );
    let back = round_trip_node(&codec, &s, part.clone()).unwrap();
    let decoded = back.downcast_ref::<FragmentScanExec>().unwrap();
    assert_eq!(decoded.fragment_subset(), Some(&ids));
    assert_eq!(shown(&back), shown(&part));
    assert!(shown(&back).contains("fragments=3 of"), "{}", shown(&back));
    let rows = |p: &Arc<dyn ExecutionPlan>| {
        StatisticsContext::new()
            .compute(p.as_ref(), &StatisticsArgs::new())
            .unwrap()
            .num_rows
    };
    assert_eq!(rows(&back), rows(&part));
    let out = run(&s, back).await;
    assert_eq!(out, run(&s, part).await);
    let listed: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let expected = text(
        &s,
        &format!(
            "SELECT count(*) AS n FROM t WHERE id % 2 = 0 AND (_rowaddr >> 32) IN ({})",
            listed.join(", ")
        ),
    )
    .await;
    let n: usize = expected
        .lines()
        .nth(3)
        .unwrap()
        .trim_matches(|c| c == '|' || c == ' ')
        .parse()
        .unwrap();
    assert!(n > 0);
    assert_eq!(out.lines().count(), n + 4, "{out}");
}

#[tokio::test]
async fn knn_plans_and_shares_round_trip_with_the_same_output() {
    let s = populated("memory://dist-knn-round-trip").await;
    let codec = codec_for(&s);
    for sql in [
        "SELECT id, l2_distance(emb, [0.5, 0.1, -0.2, 0.9]) AS d FROM t \
         ORDER BY d LIMIT 10",
        "SELECT id FROM t WHERE g <> 2 ORDER BY l2_distance(emb, [0.5, 0.1, -0.2, 0.9]) LIMIT 10",
    ] {
        let plan = physical(&s, sql).await;
        let knn = find::<KnnExec>(&plan);
        let bytes = physical_plan_to_bytes_with_extension_codec(plan.clone(), &codec).unwrap();
        let back =
            physical_plan_from_bytes_with_extension_codec(&bytes, &s.context().task_ctx(), &codec)
                .unwrap();
        assert_eq!(shown(&back), shown(&plan), "{sql}");
        assert_eq!(run(&s, back).await, run(&s, plan.clone()).await, "{sql}");
        // One share: segment of the first index build plus some fragments.
        let original = knn.downcast_ref::<KnnExec>().unwrap();
        let manifest = &original.scan_spec().snapshot.manifest;
        let share = KnnShare {
            segments: [manifest.index_segments[0].id].into(),
            fragments: manifest.fragments.iter().map(|f| f.id).step_by(2).collect(),
        };
        let part: Arc<dyn ExecutionPlan> = Arc::new(original.with_share(share.clone()).unwrap());
        let back = round_trip_node(&codec, &s, part.clone()).unwrap();
        let decoded = back.downcast_ref::<KnnExec>().unwrap();
        assert_eq!(decoded.share(), Some(&share));
        assert_eq!(decoded.query(), original.query());
        assert_eq!(decoded.index(), original.index());
        assert_eq!(shown(&back), shown(&part));
        assert_eq!(run(&s, back).await, run(&s, part).await, "{sql}");
    }
}

#[tokio::test]
async fn damaged_nodes_are_refused_with_a_clear_error() {
    let s = populated("memory://dist-damaged").await;
    let codec = codec_for(&s);
    let plan = physical(&s, "SELECT id FROM t WHERE g = 1").await;
    let mut buf = Vec::new();
    codec
        .try_encode(
            find::<FragmentScanExec>(&plan),
            &mut buf,
            &DefaultPhysicalProtoConverter {},
        )
        .unwrap();
    let good = NodeProto::decode(buf.as_slice()).unwrap();
    type Damage = Box<dyn Fn(&mut NodeProto)>;
    let damage: Vec<(&str, Damage)> = vec![
        ("wire version 9", Box::new(|n| n.wire_version = 9)),
        (
            "the manifest is version",
            Box::new(|n| n.scan.as_mut().unwrap().version += 1),
        ),
        (
            "fragment 999 is not in version",
            Box::new(|n| {
                n.scan.as_mut().unwrap().fragments = Some(super::codec::IdsProto { ids: vec![999] })
            }),
        ),
        (
            "output column 7 is out of range",
            Box::new(|n| n.scan.as_mut().unwrap().output_indices = vec![7]),
        ),
        (
            "the work schema is not the read schema plus",
            Box::new(|n| n.scan.as_mut().unwrap().row_addr = true),
        ),
        (
            "not a fragvec manifest",
            Box::new(|n| n.scan.as_mut().unwrap().manifest = b"{\"magic\": 1}".to_vec()),
        ),
        (
            "has not opened database 'memory://elsewhere'",
            Box::new(|n| n.scan.as_mut().unwrap().database = "memory://elsewhere".into()),
        ),
        ("exactly one of scan and knn", Box::new(|n| n.scan = None)),
    ];
    for (expected, hurt) in damage {
        let mut node = good.clone();
        hurt(&mut node);
        let err = decode_node(&codec, &s, &node.encode_to_vec()).unwrap_err();
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
    assert!(decode_node(&codec, &s, b"\xff\xff\xff").is_err());
    assert_eq!(good.wire_version, WIRE_VERSION);
}

#[tokio::test]
async fn insert_is_never_sent_to_a_worker() {
    let s = populated("memory://dist-insert-node").await;
    let codec = codec_for(&s);
    let plan = physical(&s, "INSERT INTO t SELECT id + 1000, g, emb FROM t").await;
    let insert = find_named(&plan, "InsertExec");
    let err = round_trip_node(&codec, &s, insert).unwrap_err();
    assert!(
        err.to_string()
            .contains("InsertExec runs on the coordinator only"),
        "{err}"
    );
}

fn find_named(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Arc<dyn ExecutionPlan> {
    let mut found = None;
    plan.apply(|node| {
        if node.name() == name {
            found = Some(node.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found.expect("node in plan")
}

async fn text(s: &FragvecSession, sql: &str) -> String {
    let r = s
        .sql_one(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&r.batches).unwrap().to_string()
}

/// Queries whose answers must not depend on where they run.
const QUERIES: [&str; 6] = [
    "SELECT g, count(*), sum(id), min(id), max(id) FROM t GROUP BY g ORDER BY g",
    "SELECT count(*), sum(g) FROM t WHERE id % 3 = 0",
    "SELECT a.g, count(*) FROM t a JOIN t b ON a.id = b.id + 1 GROUP BY a.g ORDER BY a.g",
    "SELECT id, g, _rowaddr FROM t ORDER BY id",
    "SELECT id, l2_distance(emb, [0.5, 0.1, -0.2, 0.9]) AS d FROM t ORDER BY d LIMIT 10",
    "SELECT id FROM t WHERE g IN (1, 4) ORDER BY cosine_distance(emb, [0.3, -0.6, 0.2, 0.1]) LIMIT 7",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queries_over_in_process_workers_equal_single_node_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let location = tmp.path().to_str().unwrap().to_string();
    let single = populated(&location).await;
    let workers = [super::spawn().await.unwrap(), super::spawn().await.unwrap()];
    let urls: Vec<String> = workers.iter().map(|w| w.url().to_string()).collect();
    let dist = FragvecSession::with_workers(&location, &urls)
        .await
        .unwrap();
    for sql in QUERIES {
        assert_eq!(text(&dist, sql).await, text(&single, sql).await, "{sql}");
    }
    let explain = text(&dist, "EXPLAIN SELECT g, sum(id) FROM t GROUP BY g").await;
    assert!(explain.contains("tasks=2"), "{explain}");
    assert!(explain.contains(" of 10, projection"), "{explain}");
    let explain = text(
        &dist,
        "EXPLAIN SELECT id FROM t ORDER BY l2_distance(emb, [0.5, 0.1, -0.2, 0.9]) LIMIT 10",
    )
    .await;
    assert!(explain.contains("tasks=2"), "{explain}");
    assert!(explain.contains("share=segments"), "{explain}");
    // Options travel with the query: exact search on the workers equals it here.
    for s in [&dist, &single] {
        s.sql_one("SET fragvec.exact = true").await.unwrap();
    }
    assert_eq!(
        text(&dist, QUERIES[4]).await,
        text(&single, QUERIES[4]).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_stay_on_the_coordinator_when_every_worker_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let location = tmp.path().to_str().unwrap().to_string();
    let single = populated(&location).await;
    let workers = [super::spawn().await.unwrap(), super::spawn().await.unwrap()];
    let urls: Vec<String> = workers.iter().map(|w| w.url().to_string()).collect();
    let dist = FragvecSession::with_workers(&location, &urls)
        .await
        .unwrap();
    let explain = text(
        &dist,
        "EXPLAIN INSERT INTO t SELECT id + 1000, g, emb FROM t",
    )
    .await;
    assert!(!explain.contains("Distributed"), "{explain}");
    drop(workers);
    // Every statement below plans a query with repartitions and would fail on a worker.
    for sql in [
        "INSERT INTO t SELECT id + 1000, g, emb FROM t WHERE g = 1 ORDER BY id",
        "DELETE FROM t WHERE id IN (SELECT max(id) FROM t GROUP BY g)",
        "UPDATE t SET g = g + 10 WHERE id IN (SELECT min(id) FROM t GROUP BY g)",
        "CREATE TABLE u AS SELECT g, count(*) AS n FROM t GROUP BY g",
    ] {
        dist.sql_one(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let err = tokio::time::timeout(Duration::from_secs(60), dist.sql_one(QUERIES[0]))
        .await
        .expect("a query over stopped workers fails in bounded time")
        .unwrap_err();
    assert!(err.to_string().contains("worker"), "{err}");
    // 7 groups, and the UPDATE moved one row of each into a group of its own.
    assert_eq!(
        single.sql_one("SELECT * FROM u").await.unwrap().num_rows(),
        14
    );
}

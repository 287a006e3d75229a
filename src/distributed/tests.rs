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
        rows(300, 599),
        rows(600, 699),
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
            slice: None,
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
async fn a_table_of_a_database_not_open_is_refused_by_name() {
    let open = populated("memory://dist-foreign-open").await;
    let other = populated("memory://dist-foreign-other").await;
    let codec = codec_for(&open);
    let scan = find::<FragmentScanExec>(&physical(&other, "SELECT id FROM t").await);
    let mut buf = Vec::new();
    let e = codec
        .try_encode(scan, &mut buf, &DefaultPhysicalProtoConverter {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "table 't' is not in any database this process has open (memory://dist-foreign-open)"
        ),
        "{e}"
    );
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
    assert!(explain.contains(" of 14, projection"), "{explain}");
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

/// A repeated KNN query on workers is planned once and re-bound for each new vector, by
/// segments and sliced by partitions, and answers as one node does: each run goes out under
/// a query id of its own (runs at once under one id mix up their tasks on the workers), and
/// its re-bound sort travels with the vector as a literal. When a worker is
/// lost, the kept plan runs again on the one left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_knn_queries_on_workers_reuse_their_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let location = tmp.path().to_str().unwrap().to_string();
    let single = FragvecSession::open(&location).await.unwrap();
    let rows = |from: i64, to: i64| {
        format!(
            "INSERT INTO t SELECT value, value % 5, make_array(sin(value), cos(value), \
             sin(value * 0.3), cos(value * 0.7), sin(value * 1.1), cos(value * 1.3), \
             sin(value * 1.7), cos(value * 1.9)) FROM generate_series({from}, {to})"
        )
    };
    single
        .sql(&format!(
            "CREATE TABLE t (id BIGINT NOT NULL, g BIGINT, emb VECTOR(8)) \
             WITH (max_rows_per_fragment = 1000); {}; \
             CREATE VECTOR INDEX idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 8); {}; \
             OPTIMIZE INDEX idx ON t APPEND; DELETE FROM t WHERE id % 11 = 0",
            rows(0, 2999),
            rows(3000, 5999)
        ))
        .await
        .unwrap();
    let mut workers = [super::spawn().await.unwrap(), super::spawn().await.unwrap()];
    let urls: Vec<String> = workers.iter().map(|w| w.url().to_string()).collect();
    let dist = FragvecSession::with_workers(&location, &urls)
        .await
        .unwrap();
    let query = |i: usize| {
        let x = i as f64 * 0.37;
        let q: Vec<String> = (0..8)
            .map(|j| format!("{}", (x + j as f64).sin()))
            .collect();
        format!(
            "SELECT id, l2_distance(emb, [{}]) AS d FROM t WHERE g <> 2 ORDER BY d LIMIT 9",
            q.join(", ")
        )
    };
    let same = |i: usize| {
        let (dist, single) = (&dist, &single);
        async move {
            let sql = query(i);
            let got = tokio::time::timeout(Duration::from_secs(60), text(dist, &sql))
                .await
                .unwrap_or_else(|_| panic!("run {i} of a kept plan never finished"));
            assert_eq!(got, text(single, &sql).await, "{sql}");
        }
    };
    let explain = text(&dist, &format!("EXPLAIN {}", query(0))).await;
    assert!(explain.contains("share=segments"), "{explain}");
    for i in 0..6 {
        same(i).await;
    }
    // Runs of the kept plan at once: each under its own query id (under one, the workers
    // would take one run's tasks for another's).
    futures::future::join_all((100..108).map(same)).await;
    let by_segments = dist.plans_reused();
    assert!(
        by_segments >= 13,
        "{by_segments} of 14 runs reused the plan"
    );

    // One segment over the whole table: the search is sliced by partitions.
    single.sql("OPTIMIZE INDEX idx ON t MERGE 2").await.unwrap();
    let explain = text(&dist, &format!("EXPLAIN {}", query(0))).await;
    assert!(explain.contains("share=partitions"), "{explain}");
    for i in 6..12 {
        same(i).await;
    }
    let sliced = dist.plans_reused() - by_segments;
    assert!(sliced >= 5, "{sliced} of 6 sliced runs reused the plan");

    workers[0].kill();
    for i in 12..16 {
        same(i).await;
    }
    assert!(dist.plans_reused() - by_segments - sliced >= 3);
}

/// `plan` with its `KnnExec` replaced by the union of `shares` of it (what a split plan
/// merges on the coordinator, here in one process).
fn split_into(plan: &Arc<dyn ExecutionPlan>, shares: Vec<KnnShare>) -> Arc<dyn ExecutionPlan> {
    use datafusion::common::tree_node::Transformed;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::union::UnionExec;
    plan.clone()
        .transform_up(|node| {
            let Some(knn) = node.downcast_ref::<KnnExec>() else {
                return Ok(Transformed::no(node));
            };
            let parts: Vec<Arc<dyn ExecutionPlan>> = shares
                .iter()
                .map(|s| Ok(Arc::new(knn.with_share(s.clone())?) as Arc<dyn ExecutionPlan>))
                .collect::<Result<_>>()?;
            Ok(Transformed::yes(Arc::new(CoalescePartitionsExec::new(
                UnionExec::try_new(parts)?,
            ))))
        })
        .unwrap()
        .data
}

/// A one-segment index sliced into 2 and 3 shares answers exactly as one search, for masks
/// small and large (the exact-mask path and the indexed path), at nprobes that leave some
/// slice with few or no probed partitions (so it must count the others' rows to decide
/// whether to probe on), and for k beyond the rows the index holds (the exact fallback: NULL
/// vectors are not indexed). (NULLS FIRST over slices: tests/distributed.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliced_shares_merge_to_the_single_search_answer() {
    use crate::index::knn::Slice;
    let s = FragvecSession::open("memory://dist-sliced").await.unwrap();
    let rows = |from: i64, to: i64| {
        format!(
            "INSERT INTO t SELECT value, value % 7, CASE WHEN value % 89 = 3 THEN NULL ELSE \
             make_array(sin(value), cos(value * 1.3), sin(value * 0.3), cos(value * 0.7)) END \
             FROM generate_series({from}, {to})"
        )
    };
    s.sql(&format!(
        "CREATE TABLE t (id BIGINT NOT NULL, g BIGINT, emb VECTOR(4)) \
         WITH (max_rows_per_fragment = 1000); {}; \
         CREATE VECTOR INDEX idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 12); {}; \
         OPTIMIZE INDEX idx ON t MERGE 2; {}; \
         DELETE FROM t WHERE id % 13 = 0",
        rows(0, 5999),
        rows(6000, 8999),
        rows(9000, 9499),
    ))
    .await
    .unwrap();
    let mut checked = 0;
    for (q, nprobes) in [
        "[0.5, 0.1, -0.2, 0.9]",
        "[-0.7, 0.4, 0.3, -0.1]",
        "[0.0, -1.0, 0.5, 0.5]",
    ]
    .into_iter()
    .flat_map(|q| [1, 2, 5, 12].map(|n| (q, n)))
    {
        s.sql_one(&format!("SET fragvec.nprobes = {nprobes}"))
            .await
            .unwrap();
        for filter in ["", "WHERE id % 2 = 0", "WHERE g = 3", "WHERE id % 500 = 7"] {
            for k in [1, 10, 150, 9600] {
                let sql = format!(
                    "SELECT id, l2_distance(emb, {q}) AS d FROM t {filter} ORDER BY d LIMIT {k}"
                );
                let plan = physical(&s, &sql).await;
                // Sorted lines: rows tied at an infinite distance (NULL vectors) come in
                // no particular order.
                let sorted = |text: String| {
                    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
                    lines.sort();
                    lines
                };
                let expected = sorted(run(&s, plan.clone()).await);
                for of in [2u32, 3] {
                    let knn = find::<KnnExec>(&plan);
                    let manifest = &knn
                        .downcast_ref::<KnnExec>()
                        .unwrap()
                        .scan_spec()
                        .snapshot
                        .manifest;
                    assert_eq!(manifest.index_segments.len(), 1);
                    let shares = (0..of)
                        .map(|i| KnnShare {
                            segments: manifest.index_segments.iter().map(|s| s.id).collect(),
                            fragments: manifest.fragments.iter().map(|f| f.id).collect(),
                            slice: Slice::new(i, of),
                        })
                        .collect();
                    // A fresh plan: an executed TopK keeps its dynamic filter.
                    let split = split_into(&physical(&s, &sql).await, shares);
                    let got = sorted(run(&s, split).await);
                    assert_eq!(got, expected, "{of} slices, nprobes {nprobes}: {sql}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 3 * 4 * 4 * 4 * 2);
}

/// Over two workers, a one-segment index searched exactly (every partition) is sliced the
/// same way and each slice goes to the same worker on every query: the workers' caches
/// together hold about what one node's cache holds, not twice that (as they would if the
/// slices went to random workers), and the answers are the single node's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_worker_caches_its_own_slice_from_query_to_query() {
    let tmp = tempfile::tempdir().unwrap();
    let location = tmp.path().to_str().unwrap().to_string();
    let single = FragvecSession::open(&location).await.unwrap();
    single
        .sql(
            "CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(16)) \
             WITH (max_rows_per_fragment = 2000); \
             INSERT INTO t SELECT value, make_array(sin(value), cos(value), sin(value * 0.3), \
             cos(value * 0.7), sin(value * 1.1), cos(value * 1.3), sin(value * 1.7), \
             cos(value * 1.9), sin(value * 2.3), cos(value * 2.9), sin(value * 3.1), \
             cos(value * 3.7), sin(value * 4.1), cos(value * 4.3), sin(value * 4.7), \
             cos(value * 5.3)) FROM generate_series(1, 8000); \
             CREATE VECTOR INDEX idx ON t (emb) USING IVF_FLAT WITH (num_partitions = 16)",
        )
        .await
        .unwrap();
    let workers = [super::spawn().await.unwrap(), super::spawn().await.unwrap()];
    let urls: Vec<String> = workers.iter().map(|w| w.url().to_string()).collect();
    let dist = FragvecSession::with_workers(&location, &urls)
        .await
        .unwrap();
    for s in [&dist, &single] {
        s.sql_one("SET fragvec.exact = true").await.unwrap();
    }
    for i in 0..8 {
        let sql = format!(
            "SELECT id FROM t ORDER BY l2_distance(emb, \
             [{i}, 0.1, -0.2, 0.9, 0.3, -0.4, 0.8, 0.05, 0, 0, 0, 0, 0, 0, 0, {i}]) LIMIT 10"
        );
        assert_eq!(text(&dist, &sql).await, text(&single, &sql).await, "{sql}");
    }
    let held: Vec<usize> = workers
        .iter()
        .map(|w| w.cache_bytes().iter().map(|(_, b)| b).sum())
        .collect();
    let one_node = single.index_cache().bytes_held();
    assert!(
        held.iter().all(|b| *b > one_node / 4),
        "{held:?} vs {one_node}"
    );
    assert!(
        held.iter().sum::<usize>() < one_node * 13 / 10,
        "{held:?} vs {one_node}"
    );
}

/// A worker decodes a version's manifest once: the same bytes give the same snapshot
/// without decoding, other bytes for the same version are decoded (and checked) anew.
#[tokio::test]
async fn decoded_snapshots_are_reused_only_for_the_same_bytes() {
    let s = populated("memory://dist-snapshots").await;
    let plan = physical(&s, "SELECT id FROM t WHERE g = 1").await;
    let scan = find::<FragmentScanExec>(&plan);
    let snapshot = scan
        .downcast_ref::<FragmentScanExec>()
        .unwrap()
        .spec()
        .snapshot
        .clone();
    let databases = Databases::new(None);
    let decodes = std::sync::atomic::AtomicUsize::new(0);
    let decode = || {
        decodes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(snapshot.clone())
    };
    for bytes in [&b"one"[..], b"one", b"two", b"two", b"one"] {
        let got = databases
            .decoded_snapshot("memory://x", "t", 7, bytes, decode)
            .unwrap();
        assert!(Arc::ptr_eq(&got.manifest, &snapshot.manifest));
    }
    assert_eq!(decodes.load(std::sync::atomic::Ordering::Relaxed), 3);
    // A failed decode is not kept.
    let failed = databases.decoded_snapshot("memory://x", "t", 8, b"bad", || {
        Err(datafusion::error::DataFusionError::Plan("damaged".into()))
    });
    assert!(failed.is_err());
}

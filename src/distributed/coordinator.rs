//! The coordinator: a fragvec session whose queries run on workers.
//!
//! [`FragvecSession::with_workers`] opens a session like [`FragvecSession::open`] whose
//! DataFusion state uses datafusion-distributed's planner: a query's plan is cut into stages
//! at its repartitions, and the stages that read fragvec tables run as several tasks on the
//! workers (see [`super::tasks`]). The session's `fragvec.*` options and its database's
//! location travel with every task (distributed option extensions, sent as headers).
//!
//! Plans that write run here and nowhere else: a logical plan that writes (INSERT, COPY, DDL)
//! and every plan made from a state marked [`CoordinatorOnly`] (CREATE TABLE AS, the finder
//! queries of DELETE / UPDATE / MERGE, INSERT) are planned by DataFusion's own planner.
//! `EXPLAIN` of a distributed query shows its stages and their task counts. Sorts over a
//! fragvec leaf (KNN's top-k among them) become per-task sorts merged here (see
//! [`super::sorts`]).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Result, config_err, extensions_options};
use datafusion::config::ConfigExtension;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{ExplainFormat, LogicalPlan, PlanType, StringifiedPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::explain::ExplainExec;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExec, DistributedExt, SessionStateBuilderExt, WorkerResolver, display_plan_ascii,
};
use url::Url;

use super::codec::FragvecCodec;
use super::databases::Databases;
use super::error::DistributedError;
use super::health::WorkerHealth;
use super::kept_plans::DistributedNodes;
use super::on_workers::{OnWorkersExec, Replan};
use super::routing;
use super::sorts::merge_sorts_over_fragvec;
use super::tasks;
use crate::engine::FragvecSession;
use crate::engine::options::FragvecOptions;
use crate::engine::session::CoordinatorOnly;
use crate::format::Database;
use crate::index::cache::IndexCache;

extensions_options! {
    /// The coordinator's database, sent to workers with every task so they open it before
    /// decoding the plan.
    pub struct CoordinatorDatabase {
        /// The database location, escaped for an HTTP header (see [`escape_header`]).
        pub location: String, default = String::new()
    }
}

impl ConfigExtension for CoordinatorDatabase {
    const PREFIX: &'static str = "fragvec_coordinator";
}

impl FragvecSession {
    /// Opens a session on the database at `location` whose queries run on the workers at
    /// `workers` (`http://host:port`, each a `fragvec worker`). Every worker must reach the
    /// database at the same location (a shared directory or an object store); a local path
    /// is made absolute first.
    pub async fn with_workers(location: &str, workers: &[String]) -> Result<Self> {
        let location = absolute_location(location)?;
        let urls = worker_urls(workers)?;
        let health = Arc::new(WorkerHealth::new(urls.clone()));
        let db = Database::open(&location).await?;
        let databases = Arc::new(Databases::new(None));
        databases.serve(
            db.clone(),
            Arc::new(IndexCache::new(FragvecOptions::default().index_cache_bytes)),
        );
        // A plan is cut into stages at its repartitions, and DataFusion plans none for one
        // partition (a one-core coordinator would plan a whole-table aggregate `Single`, and
        // nothing would leave it): at least one partition per worker.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let config = SessionConfig::new()
            .with_target_partitions(cores.max(urls.len()))
            .with_information_schema(true)
            .with_distributed_option_extension(FragvecOptions::default())
            .with_distributed_option_extension(CoordinatorDatabase {
                location: escape_header(&location),
            })
            .with_distributed_worker_resolver(WorkerUrls(health.clone()))
            .with_distributed_user_codec(FragvecCodec::new(databases))
            .with_distributed_desired_task_count_handler(tasks::desired_task_count)
            .with_distributed_scale_up_leaf_node_handler(tasks::scale_up_leaf)
            .with_distributed_route_tasks_handler(routing::route_tasks);
        // The distributed planner distributes what the planner before it made.
        let mut builder = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_query_planner(Arc::new(SortsMergedPlanner))
            .with_distributed_planner();
        let distributed = builder
            .query_planner()
            .take()
            .expect("with_distributed_planner sets a query planner");
        let state = builder
            .with_query_planner(Arc::new(SplitPlanner {
                distributed,
                health,
            }))
            .build();
        // The session reads the database the codec serves (the codec finds a table's
        // location by its store).
        let session =
            FragvecSession::with_context(SessionContext::new_with_state(state), db).await?;
        session.keep_plans_holding(Arc::new(DistributedNodes));
        Ok(session)
    }
}

/// The workers a coordinator was given, less those found unreachable and not yet back
/// (see [`super::on_workers`]): plans and task placement use the rest.
#[derive(Debug, Clone)]
pub struct WorkerUrls(pub Arc<WorkerHealth>);

impl WorkerResolver for WorkerUrls {
    fn get_urls(&self) -> Result<Vec<Url>> {
        Ok(self.0.up())
    }
}

/// Parses worker URLs (`http://host:port`).
pub fn worker_urls(workers: &[String]) -> Result<Vec<Url>> {
    if workers.is_empty() {
        return config_err!("a coordinator needs at least one worker URL");
    }
    workers
        .iter()
        .map(|w| {
            let url = Url::parse(w.trim()).map_err(|e| DistributedError::BadWorkerUrl {
                url: w.clone(),
                what: e.to_string(),
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(DistributedError::BadWorkerUrl {
                    url: w.clone(),
                    what: "expected http://host:port".into(),
                }
                .into());
            }
            Ok(url)
        })
        .collect()
}

/// `location` as workers must see it: a local path made absolute (created if missing, as
/// [`Database::open`] would); URLs unchanged.
pub fn absolute_location(location: &str) -> Result<String> {
    if location.contains("://") && !location.starts_with("file://") {
        return Ok(location.to_string());
    }
    let dir = location.strip_prefix("file://").unwrap_or(location);
    std::fs::create_dir_all(dir)?;
    Ok(std::fs::canonicalize(dir)?.display().to_string())
}

/// Plans queries with datafusion-distributed's planner and everything that writes with
/// DataFusion's own (see the module docs).
#[derive(Debug)]
struct SplitPlanner {
    distributed: Arc<dyn QueryPlanner + Send + Sync>,
    health: Arc<WorkerHealth>,
}

#[async_trait]
impl QueryPlanner for SplitPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let local = DefaultPhysicalPlanner::default();
        if session
            .config()
            .get_extension::<CoordinatorOnly>()
            .is_some()
            || writes(plan)?
        {
            return local.create_physical_plan(plan, session).await;
        }
        if let LogicalPlan::Explain(explain) = plan
            && matches!(explain.explain_format, ExplainFormat::Indent)
        {
            // DataFusion's EXPLAIN shows the plan before distribution: show the stages.
            let shown = local.create_physical_plan(plan, session).await?;
            let distributed = self
                .distributed
                .create_physical_plan(&explain.plan, session)
                .await?;
            if let Some(exec) = shown.downcast_ref::<ExplainExec>()
                && distributed.is::<DistributedExec>()
            {
                let plans = exec
                    .stringified_plans()
                    .iter()
                    .map(|p| match p.plan_type {
                        PlanType::FinalPhysicalPlan => StringifiedPlan::new(
                            PlanType::FinalPhysicalPlan,
                            display_plan_ascii(distributed.as_ref(), false),
                        ),
                        _ => p.clone(),
                    })
                    .collect();
                return Ok(Arc::new(ExplainExec::new(
                    exec.schema(),
                    plans,
                    exec.verbose(),
                )));
            }
            return Ok(shown);
        }
        let plan_logical = plan;
        let plan = self.distributed.create_physical_plan(plan, session).await?;
        if !plan.is::<DistributedExec>() {
            return Ok(plan);
        }
        // A query run again after a worker died is planned again: a new query id (the
        // workers that ran the first attempt may still hold its tasks) and tasks for the
        // workers left.
        let replan = session
            .as_any()
            .downcast_ref::<SessionState>()
            .map(|state| Replan {
                planner: self.distributed.clone(),
                logical: plan_logical.clone(),
                state: state.clone(),
            });
        Ok(Arc::new(OnWorkersExec::new(
            plan,
            self.health.clone(),
            replan.map(Arc::new),
        )))
    }
}

/// DataFusion's planner, then sorts over fragvec leaves split into per-task sorts and a
/// merge ([`merge_sorts_over_fragvec`]).
#[derive(Debug)]
struct SortsMergedPlanner;

#[async_trait]
impl QueryPlanner for SortsMergedPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = DefaultPhysicalPlanner::default()
            .create_physical_plan(plan, session)
            .await?;
        merge_sorts_over_fragvec(plan)
    }
}

/// Whether a logical plan writes (or explains a write): it runs on the coordinator.
fn writes(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|p| {
        Ok(matches!(
            p,
            LogicalPlan::Dml(_) | LogicalPlan::Copy(_) | LogicalPlan::Ddl(_)
        ))
    })
}

/// `s` as an HTTP header value: bytes outside visible ASCII, and `%`, become `%XX`.
pub fn escape_header(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`escape_header`]; `None` for a malformed value.
pub fn unescape_header(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any location survives the header escaping, and the escaped form is a valid header
        /// value (if not, a worker opens the wrong database or the query cannot be sent).
        #[test]
        fn prop_header_escaping_round_trips(s in "\\PC*") {
            let escaped = escape_header(&s);
            prop_assert!(escaped.bytes().all(|b| (0x21..=0x7e).contains(&b)));
            prop_assert_eq!(unescape_header(&escaped), Some(s));
        }
    }

    #[test]
    fn header_escaping_worked_example() {
        assert_eq!(escape_header("/tmp/my db/100%"), "/tmp/my%20db/100%25");
        assert_eq!(unescape_header("%2"), None);
        assert_eq!(unescape_header("%zz"), None);
    }

    #[test]
    fn worker_urls_are_checked() {
        assert!(worker_urls(&[]).is_err());
        assert!(worker_urls(&["localhost:1".into()]).is_err());
        assert!(worker_urls(&["ftp://h:1".into()]).is_err());
        assert_eq!(
            worker_urls(&["http://127.0.0.1:9000".into()]).unwrap()[0].port(),
            Some(9000)
        );
    }
}

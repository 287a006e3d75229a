//! Answering a repeated KNN statement without parsing it.
//!
//! A session keeps the physical plan of a KNN query and rebinds it to the next query vector
//! ([`crate::engine::plan_cache`]); what is left per query is parsing the text (hundreds or
//! thousands of numbers), turning its vector literals into parameters, pinning and printing
//! the statement to find the plan. Two texts equal outside their vector literals (the same
//! [`crate::sql::vector_shape::Shape`]) parse to the same statement up to those
//! values, so when a text ran on a kept plan, its shape is remembered with what that run
//! depended on: the parser dialect, the `fragvec.*` options, and the version each table was
//! pinned to. The next text of the shape runs on the kept plan when all of those still hold
//! (each table's newest version is checked as the full path checks it); anything else takes
//! the full path, which also reports any error the text has.
//!
//! A commit to the table in between (a live table takes many a second) does not send every
//! session back to the full path: the plan depends on a version only through the table's
//! schema and index definitions, so when those are unchanged the kept plan moves on to the
//! new version ([`plan_cache::retarget`]) and the shape remembers it with that version.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;
use object_store::ObjectMeta;

use super::query::{collect_physical, same_table_state};
use crate::engine::plan_cache::{self, CachedPlan, KnownShape, ShapeNote};
use crate::engine::session::{FragvecSession, StatementResult};
use crate::format::store::{Snapshot, TableDir};
use crate::sql::vector_shape::{Shape, shape_of};

/// The parser dialect `sql` is parsed in now.
fn dialect(session: &FragvecSession) -> datafusion::config::Dialect {
    session
        .ctx
        .state_ref()
        .read()
        .config_options()
        .sql_parser
        .dialect
}

fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Remembers the shape of `sql` after a full run that filled `note`: only when every masked
/// list is one of the run's vector parameters (the same vector written twice is one
/// parameter) and every parameter was written as a masked list.
pub fn remember(session: &FragvecSession, shape: Option<Shape>, note: ShapeNote) {
    let Some(learnt) = note.into_learnt() else {
        return;
    };
    let Some(Shape { text, lists }) = shape else {
        return;
    };
    let Some(bindings) = lists
        .iter()
        .map(|l| learnt.params.iter().position(|p| same_bits(p, l)))
        .collect::<Option<Vec<usize>>>()
    else {
        return;
    };
    if (0..learnt.params.len()).any(|p| !bindings.contains(&p)) {
        return;
    }
    session.plans.learn_shape(
        text,
        KnownShape {
            dialect: dialect(session),
            options: learnt.options,
            versions: learnt.versions,
            plan: learnt.plan,
            lengths: lists.iter().map(Vec::len).collect(),
            bindings,
        },
    );
}

/// The parameters a text of a known shape binds: list `i` is parameter `bindings[i]`;
/// `None` when lists bound to one parameter now differ (the full path would make two).
fn parameters(known: &KnownShape, lists: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let count = known.bindings.iter().max().map_or(0, |m| m + 1);
    let mut params: Vec<Option<Vec<f64>>> = vec![None; count];
    for (list, &p) in lists.iter().zip(&known.bindings) {
        match &params[p] {
            Some(seen) if !same_bits(seen, list) => return None,
            Some(_) => {}
            None => params[p] = Some(list.clone()),
        }
    }
    params.into_iter().collect()
}

/// The shape of a statement text (computed once per text: looked up, then remembered).
pub fn of(sql: &str) -> Option<Shape> {
    shape_of(sql)
}

/// Runs a text of `shape` on the kept plan of the shape, or `None` when the full path must
/// run it.
pub async fn run_known(
    session: &FragvecSession,
    shape: Option<&Shape>,
) -> Result<Option<StatementResult>> {
    let Some(Shape { text, lists }) = shape else {
        return Ok(None);
    };
    let Some(known) = session.plans.shape(text) else {
        return Ok(None);
    };
    session.apply_version_check();
    if known.lengths != lists.iter().map(Vec::len).collect::<Vec<_>>()
        || known.dialect != dialect(session)
        || known.options != session.options().fingerprint()
    {
        return Ok(None);
    }
    let Some(params) = parameters(&known, lists) else {
        return Ok(None);
    };
    let mut checked = Vec::with_capacity(known.versions.len());
    let mut newer = None;
    for (table, version) in &known.versions {
        let Ok(dir) = session.database().table(table) else {
            return Ok(None);
        };
        // The check the full path's pinning makes; its errors are the full path's to report.
        match dir.latest_head_for_query().await {
            Ok(Some((v, meta))) if v == *version => checked.push((table.as_str(), v, meta)),
            // Another commit to the one table read: the kept plan may read the new version.
            Ok(Some((v, meta))) if v > *version && known.versions.len() == 1 => {
                newer = Some((Arc::new(dir), v, meta));
            }
            _ => return Ok(None),
        }
    }
    let kept = match newer {
        None if same_table_state(session, &known.plan.plan, &checked).await? => {
            known.plan.plan.clone()
        }
        None => return Ok(None),
        Some((dir, version, meta)) => {
            let Some(moved) = moved_on(session, text, &known, dir, version, meta).await? else {
                return Ok(None);
            };
            moved
        }
    };
    let Some(plan) =
        plan_cache::rebind(&kept, &known.plan.params, &params, session.plans.foreign())?
    else {
        return Ok(None);
    };
    session.plans.note_reuse();
    session.plans.note_shape_reuse();
    collect_physical(session, plan).await.map(Some)
}

/// The kept plan of `known` moved on to `version` of its one table (committed since it was
/// planned), remembered as the shape's plan from now on; `None` when the new version needs
/// another plan (see [`plan_cache::retarget`]) or the plan did not read the newest version.
async fn moved_on(
    session: &FragvecSession,
    text: &str,
    known: &KnownShape,
    dir: Arc<TableDir>,
    version: u64,
    meta: Option<ObjectMeta>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(planned) = plan_cache::searched_snapshot(&known.plan.plan, session.plans.foreign())
    else {
        return Ok(None);
    };
    let read_the_newest = matches!(known.versions.as_slice(),
        [(table, v)] if table == planned.name() && *v == planned.version());
    if !read_the_newest {
        return Ok(None); // the search read a named version, not the newest
    }
    let Ok(manifest) = dir.cached_manifest(version, meta).await else {
        return Ok(None); // the full path reports what is wrong
    };
    let Ok(snapshot) = Snapshot::new(dir, manifest) else {
        return Ok(None);
    };
    let Some(plan) = plan_cache::retarget(&known.plan.plan, snapshot)? else {
        return Ok(None);
    };
    session.plans.learn_shape(
        text.to_string(),
        KnownShape {
            versions: vec![(planned.name().to_string(), version)],
            plan: CachedPlan {
                plan: plan.clone(),
                params: known.plan.params.clone(),
            },
            ..known.clone()
        },
    );
    Ok(Some(plan))
}

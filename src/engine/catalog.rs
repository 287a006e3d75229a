//! The database as a DataFusion schema: every fragvec table of the database, plus tables the
//! session registers itself (external Parquet tables, views).
//!
//! Each lookup resolves a table to one snapshot, so a query sees one version from start to end.
//! A view stored in the database (`format::views`) is planned afresh at each lookup, so it
//! reads the latest versions of its tables when a query uses it, and DataFusion inlines its
//! plan (so a KNN query through a view is served by the index like one on the table).
//! The front end may ask for a pinned version or for virtual columns by encoding them in the
//! relation name (see [`RelationName`]); users write `t VERSION AS OF n` and `_rowaddr`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider, view::ViewTable};
use datafusion::common::{DFSchema, DataFusionError, Result, plan_err};
use datafusion::execution::SessionState;
use datafusion::logical_expr::Expr;

pub use crate::sql::pin::RelationName;

use super::options::FragvecOptions;
use super::provider::FragvecTable;
use super::scan::VirtualColumns;
use crate::format::{Database, FormatError};
use crate::index::cache::IndexCache;

/// The default schema of a fragvec session: the database's tables and views at their
/// latest versions, the session's own tables, and pinned relations (`t@v3`) the front end names.
#[derive(Debug)]
pub struct FragvecSchema {
    db: Database,
    /// Names of the database's tables as of the last refresh (`table_names` must be sync).
    known: RwLock<Vec<String>>,
    /// Tables registered by the session itself, not stored in the database.
    session_tables: RwLock<HashMap<String, Arc<dyn TableProvider>>>,
    /// Index models, footers and partitions, shared by every query of the session.
    index_cache: Arc<IndexCache>,
    /// Names of the database's views as of the last refresh or lookup.
    views: RwLock<std::collections::BTreeSet<String>>,
    /// The session's current state, to plan views with (it holds the state weakly: the
    /// state holds this schema).
    state: RwLock<Option<StateSource>>,
}

/// Where the schema gets the session's current state from.
struct StateSource(Box<dyn Fn() -> Option<SessionState> + Send + Sync>);

impl std::fmt::Debug for StateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateSource")
    }
}

impl FragvecSchema {
    /// The schema of `db`, with an index cache of its own (the default size).
    pub async fn open(db: Database) -> Result<Self> {
        let cache = Arc::new(IndexCache::new(FragvecOptions::default().index_cache_bytes));
        Self::open_sharing(db, cache).await
    }

    /// The schema of `db` whose queries use `index_cache`, shared with other sessions (a
    /// server's connections share one cache under one byte budget).
    pub async fn open_sharing(db: Database, index_cache: Arc<IndexCache>) -> Result<Self> {
        let schema = Self {
            db,
            known: RwLock::new(vec![]),
            session_tables: RwLock::default(),
            index_cache,
            views: RwLock::default(),
            state: RwLock::default(),
        };
        schema.refresh().await?;
        Ok(schema)
    }

    /// The index cache its tables search through.
    pub fn index_cache(&self) -> &Arc<IndexCache> {
        &self.index_cache
    }

    /// The database it lists.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Re-lists the database's tables (other processes may have created or dropped some).
    pub async fn refresh(&self) -> Result<()> {
        let names = self.db.list_tables().await?;
        *self.known.write().expect("lock") = names;
        *self.views.write().expect("lock") = self.db.view_names().await?;
        Ok(())
    }

    /// Gives the schema the session state it plans views with.
    pub fn set_state(&self, state: impl Fn() -> Option<SessionState> + Send + Sync + 'static) {
        *self.state.write().expect("lock") = Some(StateSource(Box::new(state)));
    }

    /// Whether `name` is a view stored in the database (as of the last refresh or lookup).
    pub fn is_view(&self, name: &str) -> bool {
        self.views.read().expect("lock").contains(name)
    }

    /// The session's current state, if the session still exists.
    fn session_state(&self) -> Option<SessionState> {
        self.state
            .read()
            .expect("lock")
            .as_ref()
            .and_then(|s| (s.0)())
    }

    /// Plans view `name` from its stored text, reading the tables' latest versions.
    async fn open_view(&self, name: &str, query: String) -> Result<Arc<dyn TableProvider>> {
        let state = self.session_state();
        let Some(state) = state else {
            return plan_err!("view '{name}' cannot be planned: the session has ended");
        };
        let plan = state.create_logical_plan(&query).await?;
        self.views.write().expect("lock").insert(name.to_string());
        Ok(Arc::new(ViewTable::new(plan, Some(query))))
    }

    /// Whether `name` is one of the session's own (in-memory) tables.
    pub fn is_session_table(&self, name: &str) -> bool {
        self.session_tables.read().expect("lock").contains_key(name)
    }

    /// Opens a fragvec table snapshot by relation name.
    pub async fn open_table(&self, name: &RelationName) -> Result<Arc<FragvecTable>, FormatError> {
        let dir = Arc::new(self.db.table(&name.table)?);
        let snapshot = match name.version {
            Some(v) => dir.snapshot(v).await?,
            None => dir.latest_for_query().await?,
        };
        let vc = if name.virtual_columns {
            VirtualColumns {
                row_addr: true,
                row_id: true,
            }
        } else {
            VirtualColumns::default()
        };
        let defaults = self.column_defaults(&snapshot)?;
        Ok(Arc::new(
            FragvecTable::new(snapshot, vc, self.index_cache.clone())
                .with_column_defaults(defaults),
        ))
    }

    /// The table's `DEFAULT` expressions, planned in the session's current state (they may
    /// call functions: `now()`, ...). None without a session: such a table is read, not
    /// inserted into.
    fn column_defaults(
        &self,
        snapshot: &crate::format::Snapshot,
    ) -> Result<HashMap<String, Expr>, FormatError> {
        let recorded = &snapshot.manifest.properties.column_defaults;
        if recorded.is_empty() {
            return Ok(HashMap::new());
        }
        let state = self.session_state();
        let Some(state) = state else {
            return Ok(HashMap::new());
        };
        let schema = DFSchema::try_from(snapshot.schema.as_ref().clone())
            .map_err(|e| FormatError::invalid(e.to_string()))?;
        recorded
            .iter()
            .map(|(column, sql)| {
                state
                    .create_logical_expr(sql, &schema)
                    .map(|e| (column.clone(), e))
                    .map_err(|e| {
                        FormatError::invalid(format!("DEFAULT of column '{column}' ({sql}): {e}"))
                    })
            })
            .collect()
    }
}

#[async_trait]
impl SchemaProvider for FragvecSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names = self.known.read().expect("lock").clone();
        names.extend(self.views.read().expect("lock").iter().cloned());
        names.extend(self.session_tables.read().expect("lock").keys().cloned());
        names.sort();
        names.dedup();
        names
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if let Some(t) = self.session_tables.read().expect("lock").get(name) {
            return Ok(Some(t.clone()));
        }
        let Some(relation) = RelationName::parse(name) else {
            return Ok(None);
        };
        if crate::format::table_names::validate_table_name(&relation.table).is_err() {
            return Ok(None);
        }
        match self.open_table(&relation).await {
            Ok(t) => Ok(Some(t)),
            Err(FormatError::NotFound(_)) if relation.version.is_none() => {
                match self.db.read_view(&relation.table).await? {
                    Some(query) => Ok(Some(self.open_view(&relation.table, query).await?)),
                    None => {
                        self.views.write().expect("lock").remove(&relation.table);
                        Ok(None)
                    }
                }
            }
            Err(FormatError::NotFound(_)) => Ok(None),
            Err(e) => Err(DataFusionError::from(e)),
        }
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        if self.known.read().expect("lock").contains(&name) {
            return plan_err!("table '{name}' already exists");
        }
        Ok(self
            .session_tables
            .write()
            .expect("lock")
            .insert(name, table))
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(self.session_tables.write().expect("lock").remove(name))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.known.read().expect("lock").iter().any(|n| n == name)
            || self.is_view(name)
            || self.is_session_table(name)
    }
}

/// `e` with the closest of the `known` table names suggested, when `e` says a table does
/// not exist and a known name is close. A planning error ("table '...' not found" from
/// DataFusion for a query's relation, qualified by catalog and schema; "table '...' does
/// not exist" from fragvec's statements) stays one, with the hint appended; the format
/// layer's typed "does not exist" gets the hint as a first line over it, so it keeps its
/// SQLSTATE. Any other error is returned unchanged.
pub fn with_closest_table(
    e: DataFusionError,
    known: impl FnOnce() -> Vec<String>,
) -> DataFusionError {
    // The missing name, and whether the error is a planning error (rebuilt with the hint).
    let (missing, planning) = match e.find_root() {
        // DataFusion's wording, pinned by the test below. Its source position (a
        // `Diagnostic` around the error) is not kept: fragvec's front ends do not show it.
        DataFusionError::Plan(text) => match text.strip_prefix("table '").and_then(|t| {
            t.strip_suffix("' not found")
                .or_else(|| t.strip_suffix("' does not exist"))
        }) {
            Some(q) => (q.rsplit('.').next().unwrap_or(q).to_string(), Some(text)),
            None => return e,
        },
        DataFusionError::External(inner) => match inner.downcast_ref::<FormatError>() {
            Some(FormatError::NotFound(name)) => (name.clone(), None),
            _ => return e,
        },
        _ => return e,
    };
    // The names are listed only for an error that names a missing table.
    let known = known();
    let Some(close) = super::options::closest_name(&missing, known.iter().map(String::as_str))
        .filter(|close| *close != missing)
    else {
        return e;
    };
    match planning {
        Some(text) => DataFusionError::Plan(format!("{text}; did you mean '{close}'?")),
        None => DataFusionError::Context(
            format!("table '{missing}' does not exist; did you mean '{close}'?"),
            Box::new(e),
        ),
    }
}

#[cfg(test)]
mod closest_table_tests {
    use super::*;

    #[tokio::test]
    async fn a_misspelt_table_gets_the_closest_name() {
        let known = vec!["items".to_string(), "orders".to_string()];
        // DataFusion's own error for an unknown relation, as a query gets it.
        let ctx = datafusion::prelude::SessionContext::new();
        let e = ctx.sql("SELECT * FROM itemz").await.unwrap_err();
        let hinted = with_closest_table(e, || known.clone()).to_string();
        assert_eq!(
            hinted,
            "Error during planning: table 'datafusion.public.itemz' not found; did you mean 'items'?"
        );
        // fragvec's own, through the DataFusion boundary.
        let e: DataFusionError = FormatError::NotFound("ordrs".into()).into();
        let hinted = with_closest_table(e, || known.clone());
        assert!(
            hinted
                .to_string()
                .starts_with("table 'ordrs' does not exist; did you mean 'orders'?"),
            "{hinted}"
        );
        assert!(matches!(hinted.find_root(), DataFusionError::External(_)));
        // Nothing close, or another error: unchanged.
        let e: DataFusionError = FormatError::NotFound("zzzzzzzzzz".into()).into();
        let text = e.to_string();
        assert_eq!(with_closest_table(e, || known.clone()).to_string(), text);
        let e = datafusion::common::plan_datafusion_err!("no");
        assert_eq!(
            with_closest_table(e, || known.clone()).to_string(),
            "Error during planning: no"
        );
    }
}

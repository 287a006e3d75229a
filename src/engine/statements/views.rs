//! CREATE VIEW and DROP VIEW: views stored in the database (`format::views`), planned afresh
//! each time a query uses them (see [`crate::engine::catalog`]), so they read the latest
//! committed versions (or the version a `VERSION AS OF` inside names) and survive the session.
//! Temporary and materialized views are left to DataFusion.

use datafusion::catalog::SchemaProvider;
use datafusion::common::{Result, plan_err};
use datafusion::sql::sqlparser::ast::{CreateView, ObjectName, ObjectNamePart};

use crate::engine::session::{FragvecSession, StatementResult};
use crate::format::FormatError;
use crate::sql::pin;

fn view_name(name: &ObjectName) -> Option<String> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => Some(pin::normalize_ident(ident)),
        _ => None,
    }
}

/// `CREATE [OR REPLACE] VIEW [IF NOT EXISTS] v AS <query>`. `None`: not a view fragvec keeps
/// (temporary, materialized, or a qualified name), for DataFusion to create.
pub async fn create_view(
    session: &FragvecSession,
    view: &CreateView,
) -> Result<Option<StatementResult>> {
    let Some(name) = view_name(&view.name) else {
        return Ok(None);
    };
    if view.temporary || view.materialized {
        return Ok(None);
    }
    if !view.columns.is_empty() {
        return plan_err!(
            "CREATE VIEW {name} (columns ...) is not supported: alias the columns in the query"
        );
    }
    let db = session.database();
    if db.table(&name)?.latest_version().await?.is_some() || session.schema.is_session_table(&name)
    {
        return plan_err!("table '{name}' already exists");
    }
    let query = view.query.to_string();
    // A view that cannot be read is refused when it is created, not when it is used.
    session
        .context()
        .state()
        .create_logical_plan(&query)
        .await?;
    match db.create_view(&name, &query, view.or_replace).await {
        Ok(()) => {}
        Err(FormatError::AlreadyExists(_)) if view.if_not_exists => {}
        Err(FormatError::AlreadyExists(_)) => return plan_err!("view '{name}' already exists"),
        Err(e) => return Err(e.into()),
    }
    session.schema.refresh().await?;
    Ok(Some(StatementResult::empty()))
}

/// `DROP VIEW [IF EXISTS] v, ...`. `None` when a name is not a stored view (DataFusion then
/// drops its own session views, or reports the missing one).
pub async fn drop_views(
    session: &FragvecSession,
    names: &[ObjectName],
    if_exists: bool,
) -> Result<Option<StatementResult>> {
    if names.len() > 1 {
        return Ok(None); // DataFusion refuses several names, with its own error
    }
    let db = session.database();
    let mut ours = Vec::with_capacity(names.len());
    for name in names {
        let Some(name) = view_name(name) else {
            return Ok(None);
        };
        if db.read_view(&name).await?.is_none() {
            if if_exists && !session.schema.table_exist(&name) {
                continue;
            }
            return Ok(None);
        }
        ours.push(name);
    }
    for name in ours {
        db.drop_view(&name).await?;
    }
    session.schema.refresh().await?;
    Ok(Some(StatementResult::empty()))
}

//! Enough of PostgreSQL's catalog for clients: psql's `\d` family, psycopg's and asyncpg's
//! type lookups (`TypeInfo.fetch(conn, 'vector')` runs `... WHERE t.oid = 'vector'::regtype`),
//! pgvector's `register_vector`.
//!
//! * Tables: `pg_type` (the built-in types clients ask for, and pgvector's `vector`, `halfvec`,
//!   `sparsevec` with stable OIDs), `pg_namespace`, `pg_database`, `pg_am`, `pg_extension`,
//!   `pg_settings`, and `pg_class` / `pg_attribute` / `pg_tables` built from the session's tables
//!   when a statement reads them. Registered in a `pg_catalog` schema and, as PostgreSQL
//!   searches `pg_catalog` first, under their bare names too.
//! * Functions: `format_type`, `pg_table_is_visible`, `pg_get_userbyid`, `obj_description`,
//!   `current_database`, `version`, ... answering as a single-database, single-owner server.
//! * Rewrites of what DataFusion does not plan: `'name'::regtype` / `::regclass` (to OIDs),
//!   `oid::regtype::text` (to the type's name), `OPERATOR(pg_catalog.~)`, `COLLATE ...`, and
//!   function names qualified with `pg_catalog.`.
//!
//! The rows are in `rows`, the functions in `functions`, the rewrites in `rewrite`.

mod functions;
mod rewrite;
mod rows;

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::common::Result;
use datafusion::datasource::MemTable;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::VisitMut;

pub use self::functions::format_type;
use self::rewrite::{EmptyRelations, Rewrite};
pub use self::rows::{index_oid, table_oid, type_name, type_oid};
use crate::FragvecSession;
use crate::sql::FragvecStatement;

const PG_CATALOG_NS: i64 = 11;
const PUBLIC_NS: i64 = 2200;
const OWNER: i64 = 10;
/// The tables this module answers for (bare names are session tables of each connection).
const TABLES: &[&str] = &[
    "pg_type",
    "pg_namespace",
    "pg_database",
    "pg_am",
    "pg_extension",
    "pg_settings",
    "pg_class",
    "pg_attribute",
    "pg_tables",
    "pg_index",
    "pg_description",
    "pg_range",
    "pg_roles",
    "pg_user",
    "pg_collation",
    "pg_inherits",
    "pg_constraint",
    "pg_proc",
];

/// Registers `tables` in the `pg_catalog` schema and under their bare names.
fn register(session: &FragvecSession, tables: Vec<(&'static str, RecordBatch)>) -> Result<()> {
    let ctx = session.context();
    let default_catalog = ctx.state().config_options().catalog.default_catalog.clone();
    let catalog = ctx
        .catalog(&default_catalog)
        .ok_or_else(|| datafusion::common::plan_datafusion_err!("no default catalog"))?;
    let pg_catalog = match catalog.schema("pg_catalog") {
        Some(s) => s,
        None => {
            let s: Arc<dyn SchemaProvider> = Arc::new(MemorySchemaProvider::new());
            catalog.register_schema("pg_catalog", s.clone())?;
            s
        }
    };
    for (name, batch) in tables {
        let table = Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?);
        pg_catalog.deregister_table(name)?;
        pg_catalog.register_table(name.to_string(), table.clone())?;
        ctx.register_table(name, table)?;
    }
    Ok(())
}

/// Installs the catalog and its functions in a connection's session.
pub fn install(
    session: &FragvecSession,
    database: &str,
    settings: &[(String, String)],
) -> Result<()> {
    register(session, rows::static_tables(database, settings)?)?;
    // pg_index's first rows: until a statement reads the catalog, no table has an index.
    register(session, rows::no_indexes()?)?;
    functions::register_functions(session, database);
    functions::register_indexdef(session, vec![]);
    Ok(())
}

/// Gets a statement ready to run: catalog rewrites, and fresh `pg_class` / `pg_attribute`
/// when it reads them. True when the statement may have been rewritten (it looked like a
/// catalog query).
/// `sql`: the text the statement came from, to tell cheaply whether it is a catalog query
/// (rendering the statement again would cost a KNN query its whole vector's text).
pub async fn prepare(
    session: &FragvecSession,
    sql: &str,
    statement: &mut FragvecStatement,
) -> Result<bool> {
    let FragvecStatement::DataFusion(s) = statement else {
        return Ok(false);
    };
    let DFStatement::Statement(inner) = s.as_mut() else {
        return Ok(false);
    };
    let text = sql.to_ascii_lowercase();
    if !(text.contains("pg_")
        || text.contains("reg")
        || text.contains("operator(")
        || text.contains("collate"))
    {
        return Ok(false);
    }
    // Empty relations first: their queries go whole, before anything is rewritten in them.
    let _ = inner.visit(&mut EmptyRelations);
    let _ = inner.visit(&mut Rewrite);
    if ["pg_class", "pg_attribute", "pg_tables", "pg_index"]
        .iter()
        .any(|t| text.contains(t))
    {
        let (tables, indexes) = rows::table_tables(session).await?;
        register(session, tables)?;
        functions::register_indexdef(session, indexes);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, StringArray};

    /// Runs `sql` as the server would, returning its rows' count.
    async fn rows_of(s: &FragvecSession, sql: &str) -> Result<usize> {
        let mut st = s.parse(sql)?.remove(0);
        prepare(s, sql, &mut st).await?;
        Ok(s.execute(st).await?.num_rows())
    }

    #[tokio::test]
    async fn queries_of_empty_relations_answer_no_rows_and_aggregates_one() {
        let s = FragvecSession::open("memory://pg-catalog-empty")
            .await
            .unwrap();
        install(&s, "db", &[]).unwrap();
        // psql's `\d TABLE` policy query: ARRAY(SELECT ...) and = any() never get planned.
        let policies = "SELECT pol.polname, pol.polpermissive, CASE WHEN pol.polroles = '{0}' \
            THEN NULL ELSE pg_catalog.array_to_string(array(select rolname from pg_catalog.pg_roles \
            where oid = any (pol.polroles) order by 1),',') END, \
            pg_catalog.pg_get_expr(pol.polqual, pol.polrelid), \
            pg_catalog.pg_get_expr(pol.polwithcheck, pol.polrelid) \
            FROM pg_catalog.pg_policy pol WHERE pol.polrelid = '16635' ORDER BY 1";
        assert_eq!(rows_of(&s, policies).await.unwrap(), 0);
        // A union of empty branches, one with an aggregate inside a subquery.
        let union = "SELECT pubname FROM pg_catalog.pg_publication p \
            JOIN pg_catalog.pg_class c ON true UNION SELECT (SELECT string_agg(relname, ',') \
            FROM pg_class) FROM pg_publication_rel ORDER BY 1";
        assert_eq!(rows_of(&s, union).await.unwrap(), 0);
        // A left join keeps its left side; an aggregate makes a row out of none.
        assert_eq!(
            rows_of(
                &s,
                "SELECT n.nspname FROM pg_namespace n LEFT JOIN pg_inherits i ON true"
            )
            .await
            .unwrap(),
            3
        );
        assert_eq!(
            rows_of(&s, "SELECT count(*) FROM pg_inherits")
                .await
                .unwrap(),
            1
        );
        // A scalar subquery of an empty relation is NULL; of a catalog, its one value.
        assert_eq!(
            rows_of(
                &s,
                "SELECT (SELECT adbin FROM pg_attrdef d WHERE d.adrelid = n.oid), \
                 (SELECT t.typname FROM pg_type t WHERE t.oid = n.oid) FROM pg_namespace n"
            )
            .await
            .unwrap(),
            3
        );
    }

    #[tokio::test]
    async fn session_functions_answer_as_postgresql_does() {
        let s = FragvecSession::open("memory://pg-catalog-functions")
            .await
            .unwrap();
        install(&s, "db", &[]).unwrap();
        let sql = "SELECT current_schema(), current_database(),                    pg_catalog.current_schema() = 'public' AS in_public";
        let mut st = s.parse(sql).unwrap().remove(0);
        prepare(&s, sql, &mut st).await.unwrap();
        let r = s.execute(st).await.unwrap();
        let b = &r.batches[0];
        let text = |i: usize| {
            let col = b.column(i).as_any().downcast_ref::<StringArray>().unwrap();
            col.value(0).to_string()
        };
        assert_eq!((text(0), text(1)), ("public".into(), "db".into()));
    }

    #[tokio::test]
    async fn psycopg_type_lookup_runs() {
        let s = FragvecSession::open("memory://pg-catalog-test")
            .await
            .unwrap();
        install(&s, "db", &[]).unwrap();
        let sql = "SELECT typname AS name, oid, typarray AS array_oid, oid::regtype::text AS alt_name, \
                   typdelim AS delimiter FROM pg_type t WHERE t.oid = 'vector'::regtype ORDER BY t.oid";
        let mut st = s.parse(sql).unwrap().remove(0);
        prepare(&s, sql, &mut st).await.unwrap();
        let r = s.execute(st).await.unwrap();
        let b = &r.batches[0];
        assert_eq!(b.num_rows(), 1);
        let alt = b.column(3).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(alt.value(0), "vector");
        let missing_sql = "SELECT 'nope'::regtype";
        let mut missing = s.parse(missing_sql).unwrap().remove(0);
        prepare(&s, missing_sql, &mut missing).await.unwrap();
        assert!(s.execute(missing).await.is_err());
    }
}

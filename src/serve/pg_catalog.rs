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

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Int16Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, CastKind, DataType as SqlType, Expr, FunctionArg, FunctionArgExpr,
    FunctionArguments, Value, VisitMut, VisitorMut,
};

use super::types::{
    HALFVEC_ARRAY_OID, HALFVEC_OID, SPARSEVEC_ARRAY_OID, SPARSEVEC_OID, VECTOR_ARRAY_OID,
    VECTOR_OID, pg_type,
};
use crate::FragvecSession;
use crate::sql::FragvecStatement;
use crate::sql::vector_syntax::call;

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

/// One `pg_type` row: oid, name, typlen, category, element type, array type, namespace.
struct TypeRow {
    oid: i64,
    name: &'static str,
    len: i16,
    category: &'static str,
    elem: i64,
    array: i64,
    namespace: i64,
}

const fn t(oid: i64, name: &'static str, len: i16, category: &'static str, array: i64) -> TypeRow {
    TypeRow {
        oid,
        name,
        len,
        category,
        elem: 0,
        array,
        namespace: PG_CATALOG_NS,
    }
}
const fn a(oid: i64, name: &'static str, elem: i64) -> TypeRow {
    TypeRow {
        oid,
        name,
        len: -1,
        category: "A",
        elem,
        array: 0,
        namespace: PG_CATALOG_NS,
    }
}
const fn ext(oid: i64, name: &'static str, array: i64) -> TypeRow {
    TypeRow {
        oid,
        name,
        len: -1,
        category: "U",
        elem: 0,
        array,
        namespace: PUBLIC_NS,
    }
}

/// The types `pg_type` lists.
const TYPES: &[TypeRow] = &[
    t(16, "bool", 1, "B", 1000),
    t(17, "bytea", -1, "U", 1001),
    t(18, "char", 1, "Z", 1002),
    t(19, "name", 64, "S", 1003),
    t(20, "int8", 8, "N", 1016),
    t(21, "int2", 2, "N", 1005),
    t(23, "int4", 4, "N", 1007),
    t(25, "text", -1, "S", 1009),
    t(26, "oid", 4, "N", 1028),
    t(114, "json", -1, "U", 199),
    t(700, "float4", 4, "N", 1021),
    t(701, "float8", 8, "N", 1022),
    t(705, "unknown", -2, "X", 0),
    t(1042, "bpchar", -1, "S", 1014),
    t(1043, "varchar", -1, "S", 1015),
    t(1082, "date", 4, "D", 1182),
    t(1083, "time", 8, "D", 1183),
    t(1114, "timestamp", 8, "D", 1115),
    t(1184, "timestamptz", 8, "D", 1185),
    t(1186, "interval", 16, "T", 1187),
    t(1560, "bit", -1, "V", 1561),
    t(1562, "varbit", -1, "V", 1563),
    t(1700, "numeric", -1, "N", 1231),
    t(2205, "regclass", 4, "N", 2210),
    t(2206, "regtype", 4, "N", 2211),
    t(2249, "record", -1, "P", 2287),
    t(2950, "uuid", 16, "U", 2951),
    t(3802, "jsonb", -1, "U", 3807),
    a(1000, "_bool", 16),
    a(1001, "_bytea", 17),
    a(1002, "_char", 18),
    a(1003, "_name", 19),
    a(1005, "_int2", 21),
    a(1007, "_int4", 23),
    a(1009, "_text", 25),
    a(1014, "_bpchar", 1042),
    a(1015, "_varchar", 1043),
    a(1016, "_int8", 20),
    a(1021, "_float4", 700),
    a(1022, "_float8", 701),
    a(1028, "_oid", 26),
    a(1115, "_timestamp", 1114),
    a(1182, "_date", 1082),
    a(1183, "_time", 1083),
    a(1185, "_timestamptz", 1184),
    a(1187, "_interval", 1186),
    a(1231, "_numeric", 1700),
    a(1561, "_bit", 1560),
    a(1563, "_varbit", 1562),
    a(199, "_json", 114),
    a(2210, "_regclass", 2205),
    a(2211, "_regtype", 2206),
    a(2287, "_record", 2249),
    a(2951, "_uuid", 2950),
    a(3807, "_jsonb", 3802),
    ext(VECTOR_OID as i64, "vector", VECTOR_ARRAY_OID as i64),
    ext(HALFVEC_OID as i64, "halfvec", HALFVEC_ARRAY_OID as i64),
    ext(
        SPARSEVEC_OID as i64,
        "sparsevec",
        SPARSEVEC_ARRAY_OID as i64,
    ),
    TypeRow {
        oid: VECTOR_ARRAY_OID as i64,
        name: "_vector",
        len: -1,
        category: "A",
        elem: VECTOR_OID as i64,
        array: 0,
        namespace: PUBLIC_NS,
    },
    TypeRow {
        oid: HALFVEC_ARRAY_OID as i64,
        name: "_halfvec",
        len: -1,
        category: "A",
        elem: HALFVEC_OID as i64,
        array: 0,
        namespace: PUBLIC_NS,
    },
    TypeRow {
        oid: SPARSEVEC_ARRAY_OID as i64,
        name: "_sparsevec",
        len: -1,
        category: "A",
        elem: SPARSEVEC_OID as i64,
        array: 0,
        namespace: PUBLIC_NS,
    },
];

/// The OID of the type SQL names `name` (`integer`, `pg_catalog.int4`, `vector`, ...).
pub fn type_oid(name: &str) -> Option<i64> {
    let lower = name.trim().trim_matches('"').to_ascii_lowercase();
    let bare = lower
        .strip_prefix("pg_catalog.")
        .or_else(|| lower.strip_prefix("public."))
        .unwrap_or(&lower);
    let (bare, array) = match bare.strip_suffix("[]") {
        Some(b) => (b, true),
        None => (bare, false),
    };
    let canonical = match bare {
        "boolean" => "bool",
        "smallint" => "int2",
        "integer" | "int" => "int4",
        "bigint" => "int8",
        "real" => "float4",
        "double precision" => "float8",
        "character varying" => "varchar",
        "character" => "bpchar",
        "timestamp without time zone" => "timestamp",
        "timestamp with time zone" => "timestamptz",
        "decimal" => "numeric",
        other => other,
    };
    let row = TYPES.iter().find(|t| t.name == canonical)?;
    if array {
        (row.array != 0).then_some(row.array)
    } else {
        Some(row.oid)
    }
}

/// The name of type `oid` as `regtype` prints it.
pub fn type_name(oid: i64) -> Option<&'static str> {
    TYPES.iter().find(|t| t.oid == oid).map(|t| t.name)
}

/// The stable OID of a table: a hash of its name (tables have no OIDs of their own).
pub fn table_oid(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    100_000 + (h % 2_000_000_000) as i64
}

/// Columns PostgreSQL types `"char"`: one byte in binary, which asyncpg insists on.
const CHAR_COLUMNS: &[&str] = &[
    "typtype",
    "typcategory",
    "typdelim",
    "relkind",
    "relpersistence",
    "relreplident",
    "attidentity",
    "attgenerated",
    "amtype",
    "contype",
    "datlocprovider",
];
/// Columns PostgreSQL types `name`.
const NAME_COLUMNS: &[&str] = &[
    "typname",
    "nspname",
    "relname",
    "attname",
    "datname",
    "amname",
    "extname",
    "rolname",
    "usename",
    "collname",
    "conname",
    "proname",
    "schemaname",
    "tablename",
    "tableowner",
];

fn batch(columns: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| {
            let f = Field::new(*n, a.data_type().clone(), true);
            let kind = if CHAR_COLUMNS.contains(n) {
                "char"
            } else if NAME_COLUMNS.contains(n) {
                "name"
            } else {
                return f;
            };
            f.with_metadata([(super::types::PG_TYPE_METADATA.to_string(), kind.to_string())].into())
        })
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )?)
}

fn strs<S: AsRef<str>>(v: impl IntoIterator<Item = S>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(v))
}
fn i64s(v: impl IntoIterator<Item = i64>) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(v))
}
fn i32s(v: impl IntoIterator<Item = i32>) -> ArrayRef {
    Arc::new(Int32Array::from_iter_values(v))
}
fn i16s(v: impl IntoIterator<Item = i16>) -> ArrayRef {
    Arc::new(Int16Array::from_iter_values(v))
}
fn bools(v: impl IntoIterator<Item = bool>) -> ArrayRef {
    Arc::new(BooleanArray::from_iter(v.into_iter().map(Some)))
}
fn null_strs(n: usize) -> ArrayRef {
    Arc::new(StringArray::from(vec![None::<&str>; n]))
}

fn pg_type_batch() -> Result<RecordBatch> {
    let n = TYPES.len();
    batch(vec![
        ("oid", i64s(TYPES.iter().map(|t| t.oid))),
        ("typname", strs(TYPES.iter().map(|t| t.name))),
        ("typnamespace", i64s(TYPES.iter().map(|t| t.namespace))),
        ("typowner", i64s(TYPES.iter().map(|_| OWNER))),
        ("typlen", i16s(TYPES.iter().map(|t| t.len))),
        (
            "typbyval",
            bools(TYPES.iter().map(|t| (1..=8).contains(&t.len))),
        ),
        (
            "typtype",
            strs(
                TYPES
                    .iter()
                    .map(|t| if t.category == "P" { "p" } else { "b" }),
            ),
        ),
        ("typcategory", strs(TYPES.iter().map(|t| t.category))),
        ("typispreferred", bools(TYPES.iter().map(|_| false))),
        ("typisdefined", bools(TYPES.iter().map(|_| true))),
        ("typdelim", strs(TYPES.iter().map(|_| ","))),
        ("typrelid", i64s(TYPES.iter().map(|_| 0))),
        ("typelem", i64s(TYPES.iter().map(|t| t.elem))),
        ("typarray", i64s(TYPES.iter().map(|t| t.array))),
        (
            "typinput",
            strs(
                TYPES
                    .iter()
                    .map(|t| format!("{}_in", t.name.trim_start_matches('_'))),
            ),
        ),
        (
            "typoutput",
            strs(
                TYPES
                    .iter()
                    .map(|t| format!("{}_out", t.name.trim_start_matches('_'))),
            ),
        ),
        (
            "typreceive",
            strs(
                TYPES
                    .iter()
                    .map(|t| format!("{}_recv", t.name.trim_start_matches('_'))),
            ),
        ),
        (
            "typsend",
            strs(
                TYPES
                    .iter()
                    .map(|t| format!("{}_send", t.name.trim_start_matches('_'))),
            ),
        ),
        ("typbasetype", i64s(TYPES.iter().map(|_| 0))),
        ("typtypmod", i32s(TYPES.iter().map(|_| -1))),
        ("typnotnull", bools(TYPES.iter().map(|_| false))),
        ("typndims", i32s(TYPES.iter().map(|_| 0))),
        (
            "typcollation",
            i64s(
                TYPES
                    .iter()
                    .map(|t| if t.category == "S" { 100 } else { 0 }),
            ),
        ),
        ("typdefault", null_strs(n)),
    ])
}

/// The catalog tables that do not depend on the database's tables.
fn static_tables(
    database: &str,
    settings: &[(String, String)],
) -> Result<Vec<(&'static str, RecordBatch)>> {
    Ok(vec![
        ("pg_type", pg_type_batch()?),
        (
            "pg_namespace",
            batch(vec![
                ("oid", i64s([PG_CATALOG_NS, PUBLIC_NS, 13_000])),
                (
                    "nspname",
                    strs(["pg_catalog", "public", "information_schema"]),
                ),
                ("nspowner", i64s([OWNER; 3])),
                ("nspacl", null_strs(3)),
            ])?,
        ),
        (
            "pg_database",
            batch(vec![
                ("oid", i64s([16_384])),
                ("datname", strs([database])),
                ("datdba", i64s([OWNER])),
                ("encoding", i32s([6])),
                ("datlocprovider", strs(["c"])),
                ("datcollate", strs(["C"])),
                ("datctype", strs(["C"])),
                ("daticulocale", null_strs(1)),
                ("datistemplate", bools([false])),
                ("datallowconn", bools([true])),
                ("datconnlimit", i32s([-1])),
                ("dattablespace", i64s([1663])),
                ("datacl", null_strs(1)),
            ])?,
        ),
        (
            "pg_am",
            batch(vec![
                ("oid", i64s([2, 403, 16_400])),
                ("amname", strs(["heap", "btree", "ivfflat"])),
                ("amtype", strs(["t", "i", "i"])),
            ])?,
        ),
        (
            "pg_extension",
            batch(vec![
                ("oid", i64s([16_401])),
                ("extname", strs(["vector"])),
                ("extowner", i64s([OWNER])),
                ("extnamespace", i64s([PUBLIC_NS])),
                ("extrelocatable", bools([true])),
                ("extversion", strs(["0.8.0"])),
            ])?,
        ),
        (
            "pg_settings",
            batch(vec![
                ("name", strs(settings.iter().map(|(k, _)| k))),
                ("setting", strs(settings.iter().map(|(_, v)| v))),
                ("unit", null_strs(settings.len())),
                ("category", strs(settings.iter().map(|_| "fragvec"))),
                ("short_desc", strs(settings.iter().map(|_| ""))),
                ("vartype", strs(settings.iter().map(|_| "string"))),
                ("source", strs(settings.iter().map(|_| "default"))),
            ])?,
        ),
        (
            "pg_range",
            batch(vec![
                ("rngtypid", i64s([])),
                ("rngsubtype", i64s([])),
                ("rngmultitypid", i64s([])),
            ])?,
        ),
        (
            "pg_roles",
            batch(vec![
                ("oid", i64s([OWNER])),
                ("rolname", strs(["fragvec"])),
                ("rolsuper", bools([true])),
                ("rolcanlogin", bools([true])),
            ])?,
        ),
        (
            "pg_user",
            batch(vec![
                ("usesysid", i64s([OWNER])),
                ("usename", strs(["fragvec"])),
                ("usesuper", bools([true])),
            ])?,
        ),
        (
            "pg_description",
            batch(vec![
                ("objoid", i64s([])),
                ("classoid", i64s([])),
                ("objsubid", i32s([])),
                ("description", strs(Vec::<&str>::new())),
            ])?,
        ),
        (
            "pg_collation",
            batch(vec![
                ("oid", i64s([100])),
                ("collname", strs(["default"])),
                ("collnamespace", i64s([PG_CATALOG_NS])),
            ])?,
        ),
        (
            "pg_inherits",
            batch(vec![
                ("inhrelid", i64s([])),
                ("inhparent", i64s([])),
                ("inhseqno", i32s([])),
            ])?,
        ),
        (
            "pg_constraint",
            batch(vec![
                ("oid", i64s([])),
                ("conname", strs(Vec::<&str>::new())),
                ("conrelid", i64s([])),
                ("contype", strs(Vec::<&str>::new())),
                ("conindid", i64s([])),
            ])?,
        ),
        (
            "pg_proc",
            batch(vec![
                ("oid", i64s([])),
                ("proname", strs(Vec::<&str>::new())),
                ("pronamespace", i64s([])),
            ])?,
        ),
        (
            "pg_index",
            batch(vec![
                ("indexrelid", i64s([])),
                ("indrelid", i64s([])),
                ("indnatts", i16s([])),
                ("indisunique", bools([])),
                ("indisprimary", bools([])),
                ("indisclustered", bools([])),
                ("indisvalid", bools([])),
                ("indkey", strs(Vec::<&str>::new())),
            ])?,
        ),
    ])
}

/// `pg_class`, `pg_attribute` and `pg_tables` of the session's tables (views too).
async fn table_tables(session: &FragvecSession) -> Result<Vec<(&'static str, RecordBatch)>> {
    let ctx = session.context();
    let state = ctx.state();
    let options = state.config_options();
    let catalog = ctx.catalog(&options.catalog.default_catalog);
    let schema = catalog.and_then(|c| c.schema(&options.catalog.default_schema));
    let mut class = (vec![], vec![], vec![], vec![]); // oid, name, kind, natts
    let mut att = (vec![], vec![], vec![], vec![], vec![], vec![]); // relid, name, type, num, typmod, notnull
    if let Some(schema) = schema {
        let mut names = schema.table_names();
        names.sort();
        for name in names {
            if TABLES.contains(&name.as_str()) {
                continue;
            }
            let Some(table) = schema.table(&name).await? else {
                continue;
            };
            let oid = table_oid(&name);
            let kind = match table.table_type() {
                datafusion::datasource::TableType::View => "v",
                _ => "r",
            };
            let s = table.schema();
            class.0.push(oid);
            class.1.push(name.clone());
            class.2.push(kind);
            class.3.push(s.fields().len() as i16);
            for (i, f) in s.fields().iter().enumerate() {
                let ty = pg_type(f.data_type());
                att.0.push(oid);
                att.1.push(f.name().clone());
                att.2.push(ty.oid() as i64);
                att.3.push(i as i16 + 1);
                att.4
                    .push(crate::format::types::vector_dim(f.data_type()).unwrap_or(-1));
                att.5.push(!f.is_nullable());
            }
        }
    }
    let n = class.0.len();
    let m = att.0.len();
    Ok(vec![
        (
            "pg_class",
            batch(vec![
                ("oid", i64s(class.0.clone())),
                ("relname", strs(class.1.clone())),
                ("relnamespace", i64s(vec![PUBLIC_NS; n])),
                ("reltype", i64s(vec![0; n])),
                ("relowner", i64s(vec![OWNER; n])),
                (
                    "relam",
                    i64s(class.2.iter().map(|k| if *k == "r" { 2 } else { 0 })),
                ),
                ("relkind", strs(class.2.clone())),
                ("relnatts", i16s(class.3)),
                ("relhasindex", bools(vec![false; n])),
                ("relpersistence", strs(vec!["p"; n])),
                ("relispartition", bools(vec![false; n])),
                (
                    "reltuples",
                    Arc::new(datafusion::arrow::array::Float32Array::from(vec![-1.0; n]))
                        as ArrayRef,
                ),
                ("relpages", i32s(vec![0; n])),
                ("relchecks", i16s(vec![0; n])),
                ("relhasrules", bools(vec![false; n])),
                ("relhastriggers", bools(vec![false; n])),
                ("relhassubclass", bools(vec![false; n])),
                ("relrowsecurity", bools(vec![false; n])),
                ("relforcerowsecurity", bools(vec![false; n])),
                ("relreplident", strs(vec!["d"; n])),
                ("reltablespace", i64s(vec![0; n])),
                ("reloftype", i64s(vec![0; n])),
                ("relacl", null_strs(n)),
                ("reloptions", null_strs(n)),
                ("relpartbound", null_strs(n)),
            ])?,
        ),
        (
            "pg_attribute",
            batch(vec![
                ("attrelid", i64s(att.0)),
                ("attname", strs(att.1)),
                ("atttypid", i64s(att.2)),
                ("attnum", i16s(att.3)),
                ("atttypmod", i32s(att.4)),
                ("attnotnull", bools(att.5)),
                ("attlen", i16s(vec![-1; m])),
                ("atthasdef", bools(vec![false; m])),
                ("attisdropped", bools(vec![false; m])),
                ("attidentity", strs(vec![""; m])),
                ("attgenerated", strs(vec![""; m])),
                ("attcollation", i64s(vec![0; m])),
                ("attstattarget", i16s(vec![-1; m])),
                ("attndims", i16s(vec![0; m])),
            ])?,
        ),
        (
            "pg_tables",
            batch(vec![
                (
                    "schemaname",
                    strs(vec![
                        "public";
                        class.2.iter().filter(|k| **k == "r").count()
                    ]),
                ),
                (
                    "tablename",
                    strs(
                        class
                            .1
                            .iter()
                            .zip(&class.2)
                            .filter(|(_, k)| **k == "r")
                            .map(|(n, _)| n),
                    ),
                ),
                (
                    "tableowner",
                    strs(vec![
                        "fragvec";
                        class.2.iter().filter(|k| **k == "r").count()
                    ]),
                ),
            ])?,
        ),
    ])
}

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
    register(session, static_tables(database, settings)?)?;
    register_functions(session, database);
    Ok(())
}

/// Gets a statement ready to run: catalog rewrites, and fresh `pg_class` / `pg_attribute`
/// when it reads them.
/// `sql`: the text the statement came from, to tell cheaply whether it is a catalog query
/// (rendering the statement again would cost a KNN query its whole vector's text).
pub async fn prepare(
    session: &FragvecSession,
    sql: &str,
    statement: &mut FragvecStatement,
) -> Result<()> {
    let FragvecStatement::DataFusion(s) = statement else {
        return Ok(());
    };
    let DFStatement::Statement(inner) = s.as_mut() else {
        return Ok(());
    };
    let text = sql.to_ascii_lowercase();
    if !(text.contains("pg_")
        || text.contains("reg")
        || text.contains("operator(")
        || text.contains("collate"))
    {
        return Ok(());
    }
    let _ = inner.visit(&mut Rewrite);
    if ["pg_class", "pg_attribute", "pg_tables"]
        .iter()
        .any(|t| text.contains(t))
    {
        register(session, table_tables(session).await?)?;
    }
    Ok(())
}

/// The catalog rewrites (see the module documentation).
struct Rewrite;

fn is_call(e: &Expr, name: &str) -> bool {
    matches!(e, Expr::Function(f) if f.name.to_string() == name)
}

/// The last part of a custom type's name, lower-cased (`pg_catalog.regtype` → `regtype`).
fn custom_type(dt: &SqlType) -> Option<String> {
    match dt {
        SqlType::Custom(name, _) => name
            .0
            .last()
            .map(|p| p.to_string().trim_matches('"').to_ascii_lowercase()),
        SqlType::Regclass => Some("regclass".into()),
        _ => None,
    }
}

fn is_text_type(dt: &SqlType) -> bool {
    matches!(dt, SqlType::Text | SqlType::Varchar(_) | SqlType::String(_))
        || custom_type(dt).is_some_and(|n| n == "text" || n == "name")
}

impl VisitorMut for Rewrite {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } => {
                let inner_expr = std::mem::replace(inner.as_mut(), Expr::Value(Value::Null.into()));
                let is_literal = matches!(&inner_expr, Expr::Value(v) if matches!(v.value, Value::SingleQuotedString(_)));
                let custom = custom_type(data_type);
                *expr = match custom.as_deref() {
                    Some("regtype") if is_literal => call("fv_regtype", vec![inner_expr]),
                    Some("regclass") if is_literal => call("fv_regclass", vec![inner_expr]),
                    Some(
                        "regtype" | "regclass" | "oid" | "regproc" | "regnamespace" | "regrole",
                    ) => bigint(inner_expr),
                    Some("name" | "char" | "bpchar") => text(inner_expr),
                    _ if is_text_type(data_type) && is_call(&inner_expr, "fv_regtype") => {
                        call("fv_type_name", vec![inner_expr])
                    }
                    _ if is_text_type(data_type) && is_call(&inner_expr, "fv_oid") => {
                        // `oid::regtype::text`
                        let Expr::Function(f) = &inner_expr else {
                            unreachable!()
                        };
                        let FunctionArguments::List(l) = &f.args else {
                            unreachable!()
                        };
                        let FunctionArg::Unnamed(FunctionArgExpr::Expr(arg)) = &l.args[0] else {
                            unreachable!()
                        };
                        call("fv_type_name", vec![arg.clone()])
                    }
                    _ => {
                        *inner.as_mut() = inner_expr;
                        return ControlFlow::Continue(());
                    }
                };
            }
            Expr::BinaryOp { op, .. } => {
                if let BinaryOperator::PGCustomBinaryOperator(parts) = op
                    && let Some(last) = parts.last()
                {
                    let mapped = match last.as_str() {
                        "~" => Some(BinaryOperator::PGRegexMatch),
                        "~*" => Some(BinaryOperator::PGRegexIMatch),
                        "!~" => Some(BinaryOperator::PGRegexNotMatch),
                        "!~*" => Some(BinaryOperator::PGRegexNotIMatch),
                        "=" => Some(BinaryOperator::Eq),
                        "<>" => Some(BinaryOperator::NotEq),
                        _ => None,
                    };
                    if let Some(m) = mapped {
                        *op = m;
                    }
                }
            }
            Expr::Collate { expr: inner, .. } => {
                *expr = std::mem::replace(inner.as_mut(), Expr::Value(Value::Null.into()));
            }
            Expr::Function(f)
                if f.name.0.len() == 2
                    && f.name.0[0].to_string().eq_ignore_ascii_case("pg_catalog") =>
            {
                f.name.0.remove(0);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// `CAST(e AS BIGINT)`, marked so an outer `::text` can tell it was an OID cast.
fn bigint(e: Expr) -> Expr {
    call("fv_oid", vec![e])
}

fn text(e: Expr) -> Expr {
    Expr::Cast {
        kind: CastKind::Cast,
        expr: Box::new(e),
        data_type: SqlType::Text,
        array: false,
        format: None,
    }
}

/// The catalog's functions.
fn register_functions(session: &FragvecSession, database: &str) {
    use DataType::{Boolean, Int32, Int64, Utf8};
    let ctx = session.context();
    let scalar = |v: ScalarValue| Ok(ColumnarValue::Scalar(v));
    let database = database.to_string();
    let version = format!(
        "PostgreSQL {} (fragvec {}, DataFusion 55)",
        super::settings::SERVER_VERSION,
        env!("CARGO_PKG_VERSION")
    );
    let constant = |name: &str, inputs: Vec<DataType>, value: ScalarValue| {
        let ty = value.data_type();
        create_udf(
            name,
            inputs,
            ty,
            Volatility::Stable,
            Arc::new(move |_: &[ColumnarValue]| scalar(value.clone())),
        )
    };
    for udf in [
        constant(
            "current_database",
            vec![],
            ScalarValue::Utf8(Some(database)),
        ),
        constant("version", vec![], ScalarValue::Utf8(Some(version))),
        constant(
            "pg_backend_pid",
            vec![],
            ScalarValue::Int32(Some(std::process::id() as i32)),
        ),
        constant(
            "pg_table_is_visible",
            vec![Int64],
            ScalarValue::Boolean(Some(true)),
        ),
        constant(
            "pg_type_is_visible",
            vec![Int64],
            ScalarValue::Boolean(Some(true)),
        ),
        constant(
            "pg_get_userbyid",
            vec![Int64],
            ScalarValue::Utf8(Some("fragvec".into())),
        ),
        constant(
            "obj_description",
            vec![Int64, Utf8],
            ScalarValue::Utf8(None),
        ),
        constant(
            "col_description",
            vec![Int64, Int32],
            ScalarValue::Utf8(None),
        ),
        constant(
            "shobj_description",
            vec![Int64, Utf8],
            ScalarValue::Utf8(None),
        ),
        constant(
            "pg_encoding_to_char",
            vec![Int32],
            ScalarValue::Utf8(Some("UTF8".into())),
        ),
        constant("pg_get_expr", vec![Utf8, Int64], ScalarValue::Utf8(None)),
        constant("pg_get_indexdef", vec![Int64], ScalarValue::Utf8(None)),
        constant("pg_table_size", vec![Int64], ScalarValue::Int64(None)),
        constant(
            "pg_total_relation_size",
            vec![Int64],
            ScalarValue::Int64(None),
        ),
        constant("pg_relation_size", vec![Int64], ScalarValue::Int64(None)),
        constant("pg_size_pretty", vec![Int64], ScalarValue::Utf8(None)),
        constant(
            "has_table_privilege",
            vec![Utf8, Utf8],
            ScalarValue::Boolean(Some(true)),
        ),
        constant(
            "has_schema_privilege",
            vec![Utf8, Utf8],
            ScalarValue::Boolean(Some(true)),
        ),
        constant(
            "has_database_privilege",
            vec![Utf8, Utf8],
            ScalarValue::Boolean(Some(true)),
        ),
        map_udf("fv_regtype", Utf8, Int64, |v| match v {
            ScalarValue::Utf8(Some(name)) => match type_oid(&name) {
                Some(oid) => Ok(ScalarValue::Int64(Some(oid))),
                None => exec_err!("type \"{name}\" does not exist"),
            },
            _ => Ok(ScalarValue::Int64(None)),
        }),
        map_udf("to_regtype", Utf8, Int64, |v| match v {
            ScalarValue::Utf8(Some(name)) => Ok(ScalarValue::Int64(type_oid(&name))),
            _ => Ok(ScalarValue::Int64(None)),
        }),
        map_udf("fv_regclass", Utf8, Int64, |v| match v {
            ScalarValue::Utf8(Some(name)) => {
                let bare = name
                    .trim()
                    .trim_start_matches("public.")
                    .trim_matches('"')
                    .to_string();
                Ok(ScalarValue::Int64(Some(table_oid(&bare))))
            }
            _ => Ok(ScalarValue::Int64(None)),
        }),
        map_udf("fv_oid", Int64, Int64, Ok),
        map_udf("fv_type_name", Int64, Utf8, |v| match v {
            ScalarValue::Int64(Some(oid)) => Ok(ScalarValue::Utf8(Some(
                type_name(oid)
                    .map(str::to_string)
                    .unwrap_or_else(|| oid.to_string()),
            ))),
            _ => Ok(ScalarValue::Utf8(None)),
        }),
    ] {
        ctx.register_udf(udf);
    }
    ctx.register_udf(create_udf(
        "format_type",
        vec![Int64, Int32],
        Utf8,
        Volatility::Stable,
        Arc::new(|args: &[ColumnarValue]| {
            let n = args.iter().find_map(|a| match a {
                ColumnarValue::Array(a) => Some(a.len()),
                _ => None,
            });
            let arrays: Vec<ArrayRef> = args
                .iter()
                .map(|a| a.to_array(n.unwrap_or(1)))
                .collect::<Result<_>>()?;
            let oids = arrays[0]
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("Int64");
            let mods = arrays[1]
                .as_any()
                .downcast_ref::<Int32Array>()
                .expect("Int32");
            let out: StringArray = (0..oids.len())
                .map(|i| {
                    (!oids.is_null(i)).then(|| {
                        format_type(oids.value(i), (!mods.is_null(i)).then(|| mods.value(i)))
                    })
                })
                .collect();
            let out: ArrayRef = Arc::new(out);
            Ok(match n {
                Some(_) => ColumnarValue::Array(out),
                None => ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?),
            })
        }),
    ));
    let _ = Boolean;
}

/// `format_type(oid, typmod)` as psql shows a column's type.
pub fn format_type(oid: i64, typmod: Option<i32>) -> String {
    let m = typmod.filter(|m| *m >= 0);
    match (oid, m) {
        (o, Some(n)) if o == VECTOR_OID as i64 => format!("vector({n})"),
        (20, _) => "bigint".into(),
        (21, _) => "smallint".into(),
        (23, _) => "integer".into(),
        (16, _) => "boolean".into(),
        (700, _) => "real".into(),
        (701, _) => "double precision".into(),
        (1043, _) => "character varying".into(),
        (1114, _) => "timestamp without time zone".into(),
        (1184, _) => "timestamp with time zone".into(),
        (1021, _) => "real[]".into(),
        (1022, _) => "double precision[]".into(),
        (1016, _) => "bigint[]".into(),
        (1007, _) => "integer[]".into(),
        (1009, _) => "text[]".into(),
        (o, _) => type_name(o)
            .map(str::to_string)
            .unwrap_or_else(|| "???".into()),
    }
}

/// A one-argument function mapping each value with `f`.
fn map_udf(
    name: &str,
    input: DataType,
    output: DataType,
    f: fn(ScalarValue) -> Result<ScalarValue>,
) -> datafusion::logical_expr::ScalarUDF {
    let out_type = output.clone();
    create_udf(
        name,
        vec![input],
        output,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| match &args[0] {
            ColumnarValue::Scalar(v) => Ok(ColumnarValue::Scalar(f(v.clone())?)),
            ColumnarValue::Array(a) => {
                let values = (0..a.len())
                    .map(|i| ScalarValue::try_from_array(a, i).and_then(f))
                    .collect::<Result<Vec<_>>>()?;
                if values.is_empty() {
                    return Ok(ColumnarValue::Array(
                        datafusion::arrow::array::new_empty_array(&out_type),
                    ));
                }
                Ok(ColumnarValue::Array(ScalarValue::iter_to_array(values)?))
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_and_oids() {
        assert_eq!(type_oid("vector"), Some(VECTOR_OID as i64));
        assert_eq!(type_oid("pg_catalog.int4"), Some(23));
        assert_eq!(type_oid("integer"), Some(23));
        assert_eq!(type_oid("bit"), Some(1560));
        assert_eq!(type_oid("vector[]"), Some(VECTOR_ARRAY_OID as i64));
        assert_eq!(type_oid("nope"), None);
        assert_eq!(type_name(VECTOR_OID as i64), Some("vector"));
        assert_eq!(format_type(VECTOR_OID as i64, Some(3)), "vector(3)");
        // Every array type's element names it as its array, and names are unique.
        for t in TYPES {
            if t.elem != 0 {
                assert_eq!(
                    TYPES.iter().find(|e| e.oid == t.elem).unwrap().array,
                    t.oid,
                    "{}",
                    t.name
                );
            }
            assert_eq!(
                TYPES
                    .iter()
                    .filter(|o| o.oid == t.oid || o.name == t.name)
                    .count(),
                1,
                "{}",
                t.name
            );
        }
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

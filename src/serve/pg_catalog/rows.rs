//! The catalog's rows: the fixed tables (`pg_type` and the single-database, single-owner
//! answers of `pg_namespace`, `pg_database`, ...) and `pg_class` / `pg_attribute` /
//! `pg_tables` built from a session's tables.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int16Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::common::Result;

use super::{OWNER, PG_CATALOG_NS, PUBLIC_NS, TABLES};
use crate::FragvecSession;
use crate::serve::types::{
    HALFVEC_ARRAY_OID, HALFVEC_OID, SPARSEVEC_ARRAY_OID, SPARSEVEC_OID, VECTOR_ARRAY_OID,
    VECTOR_OID, pg_type,
};

/// One `pg_type` row: oid, name, typlen, category, element type, array type, namespace.
pub(super) struct TypeRow {
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
pub(super) const TYPES: &[TypeRow] = &[
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
            f.with_metadata(
                [(
                    crate::serve::types::PG_TYPE_METADATA.to_string(),
                    kind.to_string(),
                )]
                .into(),
            )
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

/// `n` NULL access-control lists (`aclitem[]`, as text lists: no grants are kept).
fn null_acls(n: usize) -> ArrayRef {
    let item = Arc::new(Field::new_list_field(
        datafusion::arrow::datatypes::DataType::Utf8,
        true,
    ));
    Arc::new(datafusion::arrow::array::ListArray::new_null(item, n))
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
pub(super) fn static_tables(
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
                ("nspacl", null_acls(3)),
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
                ("datacl", null_acls(1)),
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
            // No collations: strings compare by their bytes (every attcollation is 0).
            "pg_collation",
            batch(vec![
                ("oid", i64s([])),
                ("collname", strs(Vec::<&str>::new())),
                ("collnamespace", i64s([])),
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
                ("condeferrable", bools([])),
                ("condeferred", bools([])),
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
    ])
}

/// `pg_index` with no rows.
pub(super) fn no_indexes() -> Result<Vec<(&'static str, RecordBatch)>> {
    Ok(vec![("pg_index", index_batch(&[])?)])
}

fn index_batch(indexes: &[IndexRow]) -> Result<RecordBatch> {
    let k = indexes.len();
    batch(vec![
        ("indexrelid", i64s(indexes.iter().map(|i| i.oid))),
        ("indrelid", i64s(indexes.iter().map(|i| i.table_oid))),
        ("indnatts", i16s(vec![1; k])),
        ("indisunique", bools(vec![false; k])),
        ("indisprimary", bools(vec![false; k])),
        ("indisclustered", bools(vec![false; k])),
        ("indisvalid", bools(vec![true; k])),
        ("indisreplident", bools(vec![false; k])),
        ("indkey", strs(vec!["1"; k])),
    ])
}

/// One vector index as the catalog shows it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct IndexRow {
    pub oid: i64,
    pub name: String,
    pub table_oid: i64,
    /// What `pg_get_indexdef` gives.
    pub definition: String,
}

/// The OID of index `index` of table `table` (index names are per table in fragvec).
pub fn index_oid(table: &str, index: &str) -> i64 {
    table_oid(&format!("{table}\0{index}"))
}

/// An index's definition in PostgreSQL's form, which psql's `\d TABLE` shows from
/// ` USING ` on: `"items_idx" ivf_flat (emb) WITH (num_partitions=447, metric=l2)`.
pub(super) fn index_definition(table: &str, def: &crate::format::index_meta::IndexDef) -> String {
    use crate::format::index_meta::IndexKind;
    let mut with = format!("num_partitions={}", def.num_partitions);
    if let IndexKind::IvfPq { num_sub_vectors } = def.kind {
        with.push_str(&format!(", num_sub_vectors={num_sub_vectors}"));
    }
    with.push_str(&format!(", metric={}", def.metric.as_str()));
    format!(
        "CREATE INDEX {} ON public.{table} USING {} ({}) WITH ({with})",
        def.name,
        def.kind.name().to_ascii_lowercase(),
        def.column
    )
}

/// The vector indexes of fragvec table `name` (none for a view or a session table).
async fn indexes_of(session: &FragvecSession, name: &str) -> Vec<IndexRow> {
    let Ok(dir) = session.database().table(name) else {
        return vec![];
    };
    let Ok(snapshot) = std::sync::Arc::new(dir).latest().await else {
        return vec![];
    };
    snapshot
        .manifest
        .indexes
        .iter()
        .map(|def| IndexRow {
            oid: index_oid(name, &def.name),
            name: def.name.clone(),
            table_oid: table_oid(name),
            definition: index_definition(name, def),
        })
        .collect()
}

/// `pg_class` (tables, views and vector indexes), `pg_attribute`, `pg_tables` and `pg_index`
/// of the session's tables; and the indexes, for `pg_get_indexdef`.
pub(super) async fn table_tables(
    session: &FragvecSession,
) -> Result<(Vec<(&'static str, RecordBatch)>, Vec<IndexRow>)> {
    let ctx = session.context();
    let state = ctx.state();
    let options = state.config_options();
    let catalog = ctx.catalog(&options.catalog.default_catalog);
    let schema = catalog.and_then(|c| c.schema(&options.catalog.default_schema));
    let mut class = (vec![], vec![], vec![], vec![]); // oid, name, kind, natts
    let mut att = (vec![], vec![], vec![], vec![], vec![], vec![]); // relid, name, type, num, typmod, notnull
    let mut has_index = vec![];
    let mut indexes: Vec<IndexRow> = vec![];
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
            if kind == "r" {
                let found = indexes_of(session, &name).await;
                has_index.push(!found.is_empty());
                indexes.extend(found);
            } else {
                has_index.push(false);
            }
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
    let index_natts = vec![1i16; indexes.len()];
    // Indexes are pg_class rows too (relkind 'i'), after the tables.
    class.0.extend(indexes.iter().map(|i| i.oid));
    class.1.extend(indexes.iter().map(|i| i.name.clone()));
    class.2.extend(indexes.iter().map(|_| "i"));
    class.3.extend(index_natts);
    has_index.extend(indexes.iter().map(|_| false));
    let n = class.0.len();
    let m = att.0.len();
    let pg_index = index_batch(&indexes)?;
    let tables = vec![
        ("pg_index", pg_index),
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
                ("relhasindex", bools(has_index)),
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
                ("reltoastrelid", i64s(vec![0; n])),
                ("relacl", null_acls(n)),
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
    ];
    Ok((tables, indexes))
}

#[cfg(test)]
mod tests {
    use super::super::format_type;
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
}

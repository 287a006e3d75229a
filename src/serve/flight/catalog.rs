//! What tools ask a Flight SQL server about itself and its tables: catalogs, schemas,
//! tables (with their Arrow schemas), table types, primary keys, SQL info and the type
//! list. Arrow batches built with arrow-flight's metadata builders, which also apply the
//! client's filters.
//!
//! A `VECTOR(n)` column is `FixedSizeList<Float32>[n]`; its field carries
//! [`VECTOR_METADATA_KEY`] so a tool can tell an embedding from any fixed-size list.

use std::sync::{Arc, LazyLock};

use arrow_flight::sql::metadata::{
    GetCatalogsBuilder, GetTablesBuilder, SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo,
    XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use arrow_flight::sql::{
    CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTables, Nullable, Searchable, SqlInfo,
    SqlNullOrdering, SqlSupportedCaseSensitivity, SqlSupportedTransaction, SupportedSqlGrammar,
    XdbcDataType,
};
use datafusion::arrow::array::{Int32Builder, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::TableType;
use tonic::Status;

use crate::FragvecSession;
use crate::format::types::vector_dim;

/// The field metadata key of a vector column; its value is the SQL type, `VECTOR(n)`.
pub const VECTOR_METADATA_KEY: &str = "fragvec.type";

/// The one catalog and schema fragvec has (DataFusion's defaults).
pub const CATALOG: &str = "datafusion";
/// The one schema: every table and view of the database.
pub const SCHEMA: &str = "public";

/// `schema` with each vector field marked by [`VECTOR_METADATA_KEY`].
pub fn mark_vectors(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match vector_dim(f.data_type()) {
            Some(n) => {
                let mut metadata = f.metadata().clone();
                metadata.insert(VECTOR_METADATA_KEY.into(), format!("VECTOR({n})"));
                f.as_ref().clone().with_metadata(metadata)
            }
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The session's tables and views: name, `TABLE` or `VIEW`, and schema.
async fn tables(
    session: &FragvecSession,
) -> Result<Vec<(String, &'static str, SchemaRef)>, Status> {
    session
        .refresh_tables()
        .await
        .map_err(|e| super::status::of(&e))?;
    let ctx = session.context();
    let Some(schema) = ctx.catalog(CATALOG).and_then(|c| c.schema(SCHEMA)) else {
        return Ok(vec![]);
    };
    let mut names = schema.table_names();
    names.sort();
    let mut found = Vec::with_capacity(names.len());
    for name in names {
        let table = match schema.table(&name).await {
            Ok(Some(t)) => t,
            // Dropped since it was listed.
            Ok(None) => continue,
            Err(e) => return Err(super::status::of(&e)),
        };
        let kind = match table.table_type() {
            TableType::View => "VIEW",
            _ => "TABLE",
        };
        found.push((name, kind, mark_vectors(&table.schema())));
    }
    Ok(found)
}

/// `GetCatalogs`: the one catalog.
pub fn catalogs() -> Result<RecordBatch, Status> {
    let mut builder = GetCatalogsBuilder::new();
    builder.append(CATALOG);
    builder.build().map_err(Status::from)
}

/// `GetDbSchemas`: the one schema, if the query's filters keep it.
pub fn db_schemas(query: CommandGetDbSchemas) -> Result<RecordBatch, Status> {
    let mut builder = query.into_builder();
    builder.append(CATALOG, SCHEMA);
    builder.build().map_err(Status::from)
}

/// The Arrow schema of [`db_schemas`]'s answer (for GetFlightInfo).
pub fn db_schemas_schema(query: CommandGetDbSchemas) -> SchemaRef {
    query.into_builder().schema()
}

/// `GetTables`: the database's tables and views the query's filters keep, with their Arrow
/// schemas when it asks (vectors marked by [`VECTOR_METADATA_KEY`]).
pub async fn tables_batch(
    session: &FragvecSession,
    query: CommandGetTables,
) -> Result<RecordBatch, Status> {
    let mut builder: GetTablesBuilder = query.into_builder();
    for (name, kind, schema) in tables(session).await? {
        builder
            .append(CATALOG, SCHEMA, name, kind, &schema)
            .map_err(Status::from)?;
    }
    builder.build().map_err(Status::from)
}

/// `GetTableTypes`: `TABLE` and `VIEW`.
pub fn table_types() -> Result<RecordBatch, Status> {
    let mut builder = arrow_flight::sql::CommandGetTableTypes::default().into_builder();
    builder.append("TABLE");
    builder.append("VIEW");
    builder.build().map_err(Status::from)
}

/// The schema of a GetPrimaryKeys answer (Flight SQL's `CommandGetPrimaryKeys`).
pub fn primary_keys_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("catalog_name", DataType::Utf8, true),
        Field::new("db_schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("column_name", DataType::Utf8, false),
        Field::new("key_name", DataType::Utf8, true),
        Field::new("key_sequence", DataType::Int32, false),
    ]))
}

/// The declared primary key of the table asked about (`PRIMARY KEY` is recorded, not
/// enforced), a row per column in key order.
pub async fn primary_keys(
    session: &FragvecSession,
    query: CommandGetPrimaryKeys,
) -> Result<RecordBatch, Status> {
    let (mut catalog, mut schema, mut table, mut column, mut key, mut seq) = (
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        Int32Builder::new(),
    );
    let asked_elsewhere = query.catalog.as_deref().is_some_and(|c| c != CATALOG)
        || query.db_schema.as_deref().is_some_and(|s| s != SCHEMA);
    if !asked_elsewhere {
        let provider = session
            .context()
            .table_provider(query.table.as_str())
            .await
            .ok();
        if let Some(provider) = provider
            && let Some(constraints) = provider.constraints()
        {
            let fields = provider.schema();
            for c in constraints.iter() {
                if let datafusion::common::Constraint::PrimaryKey(indices) = c {
                    for (n, i) in indices.iter().enumerate() {
                        catalog.append_value(CATALOG);
                        schema.append_value(SCHEMA);
                        table.append_value(&query.table);
                        column.append_value(fields.field(*i).name());
                        key.append_null();
                        seq.append_value(n as i32 + 1);
                    }
                }
            }
        }
    }
    RecordBatch::try_new(
        primary_keys_schema(),
        vec![
            Arc::new(catalog.finish()),
            Arc::new(schema.finish()),
            Arc::new(table.finish()),
            Arc::new(column.finish()),
            Arc::new(key.finish()),
            Arc::new(seq.finish()),
        ],
    )
    .map_err(|e| Status::internal(e.to_string()))
}

/// What GetSqlInfo answers.
pub static SQL_INFO: LazyLock<SqlInfoData> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "fragvec");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.5");
    b.append(SqlInfo::FlightSqlServerReadOnly, false);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    // Each statement commits by itself: there are no transactions to begin.
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, true);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, true);
    b.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, false);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, true);
    b.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32,
    );
    b.append(
        SqlInfo::SqlNullOrdering,
        SqlNullOrdering::SqlNullsSortedHigh as i32,
    );
    b.append(SqlInfo::SqlSupportsColumnAliasing, true);
    b.append(
        SqlInfo::SqlSupportedGrammar,
        SupportedSqlGrammar::SqlCoreGrammar as i32,
    );
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.append(
        SqlInfo::SqlKeywords,
        &[
            "VECTOR",
            "COMPACT",
            "RECLUSTER",
            "VACUUM",
            "OPTIMIZE",
            "KNN",
        ][..],
    );
    b.build().expect("static SQL info")
});

/// The types GetXdbcTypeInfo lists: those `CREATE TABLE` takes.
pub static XDBC_TYPES: LazyLock<XdbcTypeInfoData> = LazyLock::new(|| {
    let mut b = XdbcTypeInfoDataBuilder::new();
    let mut add = |name: &str, data_type: XdbcDataType, size: Option<i32>, params: Option<&str>| {
        b.append(XdbcTypeInfo {
            type_name: name.into(),
            data_type,
            column_size: size,
            literal_prefix: matches!(data_type, XdbcDataType::XdbcVarchar).then(|| "'".into()),
            literal_suffix: matches!(data_type, XdbcDataType::XdbcVarchar).then(|| "'".into()),
            create_params: params.map(|p| vec![p.to_string()]),
            nullable: Nullable::NullabilityNullable,
            case_sensitive: matches!(data_type, XdbcDataType::XdbcVarchar),
            searchable: Searchable::Full,
            unsigned_attribute: Some(false),
            fixed_prec_scale: false,
            auto_increment: Some(false),
            local_type_name: Some(name.into()),
            minimum_scale: None,
            maximum_scale: None,
            sql_data_type: data_type,
            datetime_subcode: None,
            num_prec_radix: size.map(|_| 2),
            interval_precision: None,
        });
    };
    add("BOOLEAN", XdbcDataType::XdbcBit, Some(1), None);
    add("SMALLINT", XdbcDataType::XdbcSmallint, Some(16), None);
    add("INT", XdbcDataType::XdbcInteger, Some(32), None);
    add("BIGINT", XdbcDataType::XdbcBigint, Some(64), None);
    add("REAL", XdbcDataType::XdbcReal, Some(24), None);
    add("DOUBLE", XdbcDataType::XdbcDouble, Some(53), None);
    add("VARCHAR", XdbcDataType::XdbcVarchar, None, None);
    add("DATE", XdbcDataType::XdbcDate, None, None);
    add("TIMESTAMP", XdbcDataType::XdbcTimestamp, None, None);
    // No XDBC code says "vector": it is an array of REAL, created with its dimension.
    add(
        "VECTOR",
        XdbcDataType::XdbcUnknownType,
        None,
        Some("dimension"),
    );
    b.build().expect("static type info")
});

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::format::types::vector_type;

    fn vector_metadata(n: i32) -> HashMap<String, String> {
        HashMap::from([(VECTOR_METADATA_KEY.to_string(), format!("VECTOR({n})"))])
    }

    #[test]
    fn vector_fields_are_marked_and_others_left_alone() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("emb", vector_type(8), true),
        ]);
        let marked = mark_vectors(&schema);
        assert!(marked.field(0).metadata().is_empty());
        assert_eq!(marked.field(1).metadata(), &vector_metadata(8));
        assert_eq!(marked.field(1).data_type(), &vector_type(8));
    }

    #[test]
    fn static_answers_build() {
        assert!(SQL_INFO.record_batch([0u32, 504]).unwrap().num_rows() == 2);
        assert!(XDBC_TYPES.record_batch(None).unwrap().num_rows() >= 10);
        assert_eq!(catalogs().unwrap().num_rows(), 1);
        assert_eq!(table_types().unwrap().num_rows(), 2);
    }
}

//! The catalog's functions (`format_type`, `pg_table_is_visible`, `version`, ...), answering
//! as a single-database, single-owner server.

use std::collections::HashMap;
use std::sync::Arc;

use crate::serve::types::VECTOR_OID;
use datafusion::arrow::array::{Array, ArrayRef, Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::expr_fn::SimpleScalarUDF;
use datafusion::logical_expr::{ColumnarValue, Signature, TypeSignature, Volatility, create_udf};

use super::rows::{IndexRow, table_oid, type_name, type_oid};
use crate::FragvecSession;

/// The catalog's functions.
pub(super) fn register_functions(session: &FragvecSession, database: &str) {
    use DataType::{Boolean, Int32, Int64, Utf8};
    let ctx = session.context();
    let scalar = |v: ScalarValue| Ok(ColumnarValue::Scalar(v));
    let database = database.to_string();
    let version = format!(
        "PostgreSQL {} (fragvec {}, DataFusion 55)",
        crate::serve::settings::SERVER_VERSION,
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
        // Every table is in `public` (pg_namespace's one user schema).
        constant(
            "current_schema",
            vec![],
            ScalarValue::Utf8(Some("public".into())),
        ),
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
        constant(
            "pg_get_constraintdef",
            vec![Int64, Boolean],
            ScalarValue::Utf8(None),
        ),
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
}

/// `pg_get_indexdef(oid)` and psql's `pg_get_indexdef(oid, column, pretty)`: the definitions
/// of `indexes` (as the catalog last read them); NULL for any other OID.
pub(super) fn register_indexdef(session: &FragvecSession, indexes: Vec<IndexRow>) {
    use DataType::{Boolean, Int64, Utf8};
    let definitions: HashMap<i64, String> =
        indexes.into_iter().map(|i| (i.oid, i.definition)).collect();
    let signature = Signature::one_of(
        vec![
            TypeSignature::Exact(vec![Int64]),
            TypeSignature::Exact(vec![Int64, Int64, Boolean]),
        ],
        Volatility::Stable,
    );
    let fun = Arc::new(move |args: &[ColumnarValue]| {
        let definition = |v: ScalarValue| match v {
            ScalarValue::Int64(Some(oid)) => definitions.get(&oid).cloned(),
            _ => None,
        };
        Ok(match &args[0] {
            ColumnarValue::Scalar(v) => {
                ColumnarValue::Scalar(ScalarValue::Utf8(definition(v.clone())))
            }
            ColumnarValue::Array(a) => {
                let out: StringArray = (0..a.len())
                    .map(|i| ScalarValue::try_from_array(a, i).map(definition))
                    .collect::<Result<Vec<_>>>()?
                    .into_iter()
                    .collect();
                ColumnarValue::Array(Arc::new(out))
            }
        })
    });
    let udf = SimpleScalarUDF::new_with_signature("pg_get_indexdef", signature, Utf8, fun);
    session
        .context()
        .register_udf(datafusion::logical_expr::ScalarUDF::new_from_impl(udf));
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

//! The parts of CREATE TABLE that are AST transforms: `VECTOR(n)` columns rewritten to the
//! type DataFusion plans (`FLOAT[n]`, i.e. `FixedSizeList<Float32>[n]`), and `WITH (...)`
//! read into [`TableProperties`]. Unknown options and bad values are planning errors naming
//! them.

use datafusion::common::{Result, internal_datafusion_err, plan_datafusion_err, plan_err};
use datafusion::sql::sqlparser::ast::{
    ColumnDef, DataType as SqlType, Expr as SqlExpr, SqlOption, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::format::TableProperties;

/// `VECTOR(n)` → `FLOAT[n]`, which DataFusion plans as `FixedSizeList<Float32>[n]`.
pub fn rewrite_vector_type(column: &mut ColumnDef) -> Result<()> {
    if let SqlType::Custom(name, modifiers) = &column.data_type
        && name.to_string().eq_ignore_ascii_case("vector")
    {
        let dim: i32 = match modifiers.as_slice() {
            [n] => n.parse().ok().filter(|d| *d > 0).ok_or_else(|| {
                plan_datafusion_err!("VECTOR dimension must be a positive integer, not {n}")
            })?,
            _ => {
                return plan_err!(
                    "column '{}': VECTOR needs a dimension, e.g. VECTOR(128)",
                    column.name
                );
            }
        };
        column.data_type = Parser::new(&GenericDialect {})
            .try_with_sql(&format!("FLOAT[{dim}]"))
            .and_then(|mut p| p.parse_data_type())
            .map_err(|e| internal_datafusion_err!("{e}"))?;
    }
    Ok(())
}

/// Table options of `CREATE TABLE ... WITH (...)`.
pub fn table_properties(options: &[SqlOption]) -> Result<TableProperties> {
    let mut props = TableProperties::default();
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return plan_err!("unsupported table option {option}");
        };
        let key = key.value.to_ascii_lowercase();
        let text = match value {
            SqlExpr::Value(v) => match &v.value {
                Value::Number(n, _) => n.clone(),
                Value::SingleQuotedString(s) => s.clone(),
                Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            SqlExpr::Identifier(i) => i.value.clone(),
            other => other.to_string(),
        };
        match key.as_str() {
            "stable_row_ids" => {
                props.stable_row_ids = text.parse().map_err(|_| {
                    plan_datafusion_err!("stable_row_ids must be true or false, not {text}")
                })?;
            }
            "max_rows_per_fragment" => {
                props.max_rows_per_fragment = text
                    .parse()
                    .ok()
                    .filter(|n| *n > 0 && *n <= crate::format::manifest::MAX_FRAGMENT_ID)
                    .ok_or_else(|| {
                        plan_datafusion_err!(
                            "max_rows_per_fragment must be a positive integer below 2^32, not {text}"
                        )
                    })?;
            }
            other => {
                return plan_err!(
                    "unknown table option '{other}' (known: stable_row_ids, max_rows_per_fragment)"
                );
            }
        }
    }
    Ok(props)
}

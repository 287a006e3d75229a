//! The shell's `\d` (the tables and views of the database) and `\d name` (a table's schema,
//! fragments, indexes, clustering key and version; a view's query), read from the latest
//! manifest of each table.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;

use crate::engine::FragvecSession;
use crate::engine::index_ops::latest;
use crate::format::policy::MaintenancePolicy;
use crate::format::types::display_type;
use crate::index::introspect::indexes_batch;

/// The name as SQL reads it: unquoted names are lowercased, `"Quoted"` ones kept.
pub fn relation_name(text: &str) -> String {
    let text = text.trim().trim_end_matches(';').trim();
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\"\"", "\""),
        None => text.to_lowercase(),
    }
}

fn utf8(name: &str, values: Vec<String>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::Utf8, false),
        Arc::new(StringArray::from(values)),
    )
}

/// A column of figures; `None` (a view's) shows as an empty cell.
fn u64s(name: &str, values: Vec<Option<u64>>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::UInt64, true),
        Arc::new(UInt64Array::from(values)),
    )
}

/// An aligned text table of `columns`.
fn text_table(columns: Vec<(Field, ArrayRef)>) -> Result<String> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?;
    Ok(pretty_format_batches(&[batch])?.to_string())
}

/// `\d`: every table (rows, fragments, indexes, version) and view of the database.
pub async fn list(session: &FragvecSession) -> Result<String> {
    let db = session.database();
    let (mut names, mut kinds, mut rows, mut fragments, mut indexes, mut versions) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for name in db.list_tables().await? {
        let snapshot = latest(db, &name).await?;
        let m = &snapshot.manifest;
        names.push(name);
        kinds.push("table".to_string());
        rows.push(Some(m.fragments.iter().map(|f| f.live_rows()).sum::<u64>()));
        fragments.push(Some(m.fragments.len() as u64));
        indexes.push(Some(m.indexes.len() as u64));
        versions.push(Some(snapshot.version()));
    }
    for name in db.view_names().await? {
        names.push(name);
        kinds.push("view".to_string());
        for figures in [&mut rows, &mut fragments, &mut indexes, &mut versions] {
            figures.push(None);
        }
    }
    if names.is_empty() {
        return Ok("No tables.".to_string());
    }
    text_table(vec![
        utf8("name", names),
        utf8("kind", kinds),
        u64s("rows", rows),
        u64s("fragments", fragments),
        u64s("indexes", indexes),
        u64s("version", versions),
    ])
}

/// `\d name`: a table's columns, fragments, indexes, clustering key and current version, or
/// a view's query.
pub async fn describe(session: &FragvecSession, name: &str) -> Result<String> {
    let db = session.database();
    let name = relation_name(name);
    if let Some(query) = db.read_view(&name).await? {
        return Ok(format!("View \"{name}\":\n{query}"));
    }
    let snapshot = latest(db, &name).await?;
    let m = &snapshot.manifest;
    let fields = snapshot.schema.fields();
    let mut out = format!("Table \"{name}\" (version {})\n", snapshot.version());
    out += &text_table(vec![
        utf8("column", fields.iter().map(|f| f.name().clone()).collect()),
        utf8(
            "type",
            fields.iter().map(|f| display_type(f.data_type())).collect(),
        ),
        utf8(
            "nullable",
            fields
                .iter()
                .map(|f| if f.is_nullable() { "yes" } else { "no" }.to_string())
                .collect(),
        ),
    ])?;
    let physical: u64 = m.fragments.iter().map(|f| f.physical_rows).sum();
    let deleted: u64 = m.fragments.iter().map(|f| f.deleted_rows()).sum();
    out += &format!(
        "\nFragments: {} ({} rows, {} deleted, {} live)\n",
        m.fragments.len(),
        physical,
        deleted,
        physical - deleted.min(physical)
    );
    if m.indexes.is_empty() {
        out += "Indexes: none\n";
    } else {
        let batch = indexes_batch(&snapshot).await?;
        let wanted = [
            "name",
            "column",
            "type",
            "metric",
            "num_partitions",
            "segments",
            "rows",
            "unindexed_fragments",
            "unindexed_rows",
        ];
        let indices = wanted
            .iter()
            .map(|c| batch.schema().index_of(c))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let projected = batch.project(&indices)?;
        out += &format!("Indexes:\n{}\n", pretty_format_batches(&[projected])?);
    }
    let key = &m.properties.cluster_by;
    out += &if key.is_empty() {
        "Clustering key: none\n".to_string()
    } else {
        format!("Clustering key: ({})\n", key.join(", "))
    };
    out += &format!(
        "Properties: stable_row_ids = {}, max_rows_per_fragment = {}\n",
        m.properties.stable_row_ids, m.properties.max_rows_per_fragment
    );
    let policy = &m.properties.maintenance;
    let set: Vec<String> = policy
        .entries()
        .into_iter()
        .zip(MaintenancePolicy::default().entries())
        .filter(|(now, default)| now.1 != default.1)
        .map(|((k, v), _)| format!("{k} = {v}"))
        .collect();
    out += &if policy.is_active() {
        format!("Maintenance: {}", set.join(", "))
    } else {
        format!(
            "Maintenance: off (ALTER TABLE {name} SET (auto_index = on, auto_compact = on) \
             switches it on; SELECT * FROM fragvec_maintenance('{name}') lists its tasks)"
        )
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::relation_name;

    #[test]
    fn names_are_read_as_sql_reads_them() {
        assert_eq!(relation_name(" Items; "), "items");
        assert_eq!(relation_name("\"Items\""), "Items");
        assert_eq!(relation_name("\"a\"\"b\""), "a\"b");
    }
}

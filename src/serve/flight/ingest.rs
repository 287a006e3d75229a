//! Bulk ingest (`CommandStatementIngest`, ADBC's `adbc_ingest`): the client's Arrow stream
//! is written into fragments as it arrives — a batch at a time, never the whole upload in
//! memory — and committed as one append when it ends. A stream that breaks off, or a batch
//! that does not fit the table, ends the ingest with an error and commits nothing (the
//! fragments written so far are never referenced; VACUUM removes them).
//!
//! Modes, as Flight SQL's table definition options give them:
//!
//! | table      | `if_not_exist`      | `if_exists`          | does                              |
//! |------------|---------------------|----------------------|-----------------------------------|
//! | missing    | CREATE              | any                  | creates it with the stream's schema |
//! | missing    | FAIL / unspecified  | any                  | error: no such table              |
//! | exists     | any                 | APPEND               | appends (columns matched by name) |
//! | exists     | any                 | REPLACE              | drops it, then as for a missing table with CREATE |
//! | exists     | any                 | FAIL / unspecified   | error: the table exists           |
//!
//! REPLACE is not atomic: like `CREATE OR REPLACE TABLE ... AS`, the old table goes first.

use std::sync::Arc;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::{CommandStatementIngest, TableExistsOption, TableNotExistOption};
use datafusion::arrow::array::{ArrayRef, RecordBatch, new_null_array};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use tonic::Status;

use crate::FragvecSession;
use crate::format::TableProperties;
use crate::format::types::normalize;

/// Runs one ingest; gives the number of rows written.
pub async fn ingest(
    session: &FragvecSession,
    command: CommandStatementIngest,
    upload: PeekableFlightDataStream,
) -> Result<i64, Status> {
    if command.temporary {
        return Err(Status::unimplemented("fragvec has no temporary tables"));
    }
    if command.transaction_id.is_some() {
        return Err(Status::unimplemented(
            "fragvec has no transactions: each ingest commits by itself",
        ));
    }
    let name = command.table.clone();
    if name.is_empty() {
        return Err(Status::invalid_argument("an ingest needs a table name"));
    }
    let options = command.table_definition_options.unwrap_or_default();
    let if_exists =
        TableExistsOption::try_from(options.if_exists).unwrap_or(TableExistsOption::Unspecified);
    let create = TableNotExistOption::try_from(options.if_not_exist)
        .is_ok_and(|o| o == TableNotExistOption::Create);

    // The stream's schema comes with its first message: read it before touching the table.
    let mut batches = FlightRecordBatchStream::new_from_flight_data(
        upload.map_err(|e| FlightError::Tonic(Box::new(e))),
    )
    .peekable();
    let incoming: SchemaRef = match std::pin::Pin::new(&mut batches).peek().await {
        Some(Err(e)) => return Err(Status::invalid_argument(format!("the upload: {e}"))),
        Some(Ok(b)) => b.schema(),
        None => batches
            .get_ref()
            .schema()
            .cloned()
            .ok_or_else(|| Status::invalid_argument("the upload has no schema"))?,
    };

    let db = session.database();
    let dir = Arc::new(db.table(&name).map_err(format_status)?);
    let exists = dir.latest_version().await.map_err(format_status)?;
    let snapshot = match (exists, if_exists) {
        (Some(version), TableExistsOption::Append) => {
            dir.snapshot(version).await.map_err(format_status)?
        }
        (Some(_), TableExistsOption::Replace) => {
            db.drop_table(&name).await.map_err(format_status)?;
            create_table(session, &name, &incoming).await?
        }
        (Some(_), _) => {
            return Err(Status::already_exists(format!(
                "table '{name}' already exists (ingest with mode append or replace)"
            )));
        }
        (None, _) if create => create_table(session, &name, &incoming).await?,
        (None, _) => {
            return Err(Status::not_found(format!(
                "table '{name}' does not exist (ingest with mode create to make it)"
            )));
        }
    };
    let target = snapshot.schema.clone();
    let positions = positions(&incoming, &target)?;
    let fitted = batches.map(move |b| {
        let b = b.map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        fit(&b, &target, &positions)
    });
    let stream = Box::pin(RecordBatchStreamAdapter::new(
        snapshot.schema.clone(),
        fitted,
    ));
    let written =
        crate::engine::write::append_streams(&snapshot, vec![stream], &session.progress())
            .await
            .map_err(|e| super::status::of(&e))?;
    session
        .refresh_tables()
        .await
        .map_err(|e| super::status::of(&e))?;
    Ok(written as i64)
}

async fn create_table(
    session: &FragvecSession,
    name: &str,
    incoming: &Schema,
) -> Result<crate::format::Snapshot, Status> {
    let fields: Vec<Field> = incoming
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), normalize(f.data_type()), f.is_nullable()))
        .collect();
    session
        .database()
        .create_table(name, &Schema::new(fields), TableProperties::default())
        .await
        .map_err(format_status)
}

/// For each column of `target`, the position of the incoming column of the same name
/// (`None`: the upload leaves it out, which a nullable column allows).
fn positions(incoming: &Schema, target: &Schema) -> Result<Vec<Option<usize>>, Status> {
    let find = |name: &str| {
        incoming.index_of(name).ok().or_else(|| {
            incoming
                .fields()
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(name))
        })
    };
    for f in incoming.fields() {
        if target.index_of(f.name()).is_err()
            && !target
                .fields()
                .iter()
                .any(|t| t.name().eq_ignore_ascii_case(f.name()))
        {
            return Err(Status::invalid_argument(format!(
                "the upload has a column '{}' the table does not have (it has {})",
                f.name(),
                target
                    .fields()
                    .iter()
                    .map(|t| t.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    target
        .fields()
        .iter()
        .map(|t| match find(t.name()) {
            Some(i) => Ok(Some(i)),
            None if t.is_nullable() => Ok(None),
            None => Err(Status::invalid_argument(format!(
                "the upload has no column '{}', which is NOT NULL",
                t.name()
            ))),
        })
        .collect()
}

/// `batch`'s columns in the table's order (missing ones NULL); the writer casts them to
/// the table's types and refuses what does not fit.
fn fit(
    batch: &RecordBatch,
    target: &SchemaRef,
    positions: &[Option<usize>],
) -> datafusion::error::Result<RecordBatch> {
    let columns: Vec<ArrayRef> = target
        .fields()
        .iter()
        .zip(positions)
        .map(|(f, p)| match p {
            Some(i) => batch.column(*i).clone(),
            None => new_null_array(f.data_type(), batch.num_rows()),
        })
        .collect();
    // The columns keep their own types here; the schema is the table's only in names.
    let fields: Vec<Field> = target
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), true))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

fn format_status(e: crate::format::FormatError) -> Status {
    super::status::of(&e.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::DataType;

    #[test]
    fn columns_are_matched_by_name_and_strangers_refused() {
        let target = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
        ]);
        let reordered = Schema::new(vec![
            Field::new("note", DataType::Utf8, true),
            Field::new("ID", DataType::Int32, false),
        ]);
        assert_eq!(
            positions(&reordered, &target).unwrap(),
            vec![Some(1), Some(0)]
        );
        let partial = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        assert_eq!(positions(&partial, &target).unwrap(), vec![Some(0), None]);
        let missing_key = Schema::new(vec![Field::new("note", DataType::Utf8, true)]);
        assert!(positions(&missing_key, &target).is_err());
        let stranger = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("other", DataType::Utf8, true),
        ]);
        let e = positions(&stranger, &target).unwrap_err();
        assert!(e.message().contains("'other'"), "{e}");
    }
}

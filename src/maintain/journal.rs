//! The maintenance journal of a table: one small object per task under
//! `_maintenance/journal/`, written when the task starts (outcome `running`) and again when
//! it ends, so `fragvec_maintenance('t')` shows past and running tasks of every maintainer of
//! the table, in any process. A task whose maintainer died shows as `interrupted` once its
//! lease has expired. The journal keeps the newest [`KEEP`] records.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::error::ArrowError;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::lease;
use crate::format::error::{FormatError, Result};
use crate::format::manifest::now_ms;
use crate::format::store::TableDir;

/// Folder of the journal, relative to the table root.
pub const JOURNAL_DIR: &str = "_maintenance/journal";
/// Records kept (older ones are removed when a round ends).
pub const KEEP: usize = 500;

/// One task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// `<started_ms>-<tag>`: sorts by start time.
    pub id: String,
    /// `index_append`, `compact`, `vacuum`, ... ([`crate::maintain::plan::Task::kind`]).
    pub kind: String,
    /// What it was about, in words.
    pub detail: String,
    /// The maintainer that ran it (its lease holder name).
    pub maintainer: String,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: i64,
    /// When it ended; `None` while it runs.
    pub finished_ms: Option<i64>,
    /// Rows the task read or rewrote.
    pub rows: u64,
    /// Bytes it wrote (new fragments or segment files), when known.
    pub bytes: u64,
    /// `running`, `done`, `nothing to do`, `gave way` (lost to concurrent commits),
    /// `failed: ...`, `skipped: ...`; `interrupted` is derived when reading.
    pub outcome: String,
    /// Commit conflicts retried.
    pub retries: u32,
    /// The table version it committed, if any.
    pub version: Option<u64>,
}

impl TaskRecord {
    /// A task starting now.
    pub fn start(kind: &str, detail: String, maintainer: &str, rows: u64) -> Self {
        let started_ms = now_ms();
        TaskRecord {
            id: format!("{started_ms:015}-{}", crate::format::store::random_tag()),
            kind: kind.to_string(),
            detail,
            maintainer: maintainer.to_string(),
            started_ms,
            finished_ms: None,
            rows,
            bytes: 0,
            outcome: "running".into(),
            retries: 0,
            version: None,
        }
    }

    /// Marks the task ended now, with `outcome` (`done`, or what went wrong).
    pub fn finish(&mut self, outcome: impl Into<String>) {
        self.finished_ms = Some(now_ms());
        self.outcome = outcome.into();
    }
}

fn object(id: &str) -> String {
    format!("{JOURNAL_DIR}/{id}.json")
}

/// Writes (or overwrites) a record.
pub async fn write(dir: &TableDir, record: &TaskRecord) -> Result<()> {
    let path = dir.path(&object(&record.id));
    let body = serde_json::to_vec(record).expect("a task record serializes");
    dir.store()
        .put(&path, PutPayload::from(body))
        .await
        .map_err(|e| FormatError::store(&path, e))?;
    Ok(())
}

/// Every record, oldest first, with `running` tasks whose maintainer no longer holds an
/// unexpired lease shown as `interrupted`.
pub async fn read(dir: &TableDir) -> Result<Vec<TaskRecord>> {
    let mut records = Vec::new();
    for id in ids(dir).await? {
        match dir.read(&object(&id)).await {
            Ok(bytes) => match serde_json::from_slice::<TaskRecord>(&bytes) {
                Ok(r) => records.push(r),
                // A record is informational: a damaged one is skipped, not fatal.
                Err(_) => continue,
            },
            Err(FormatError::ObjectStore {
                source: object_store::Error::NotFound { .. },
                ..
            }) => continue,
            Err(e) => return Err(e),
        }
    }
    let held = lease::current(dir)
        .await?
        .filter(|(_, s)| s.expires_ms > now_ms())
        .map(|(_, s)| s.holder);
    for r in records.iter_mut().filter(|r| r.outcome == "running") {
        if held.as_deref() != Some(r.maintainer.as_str()) {
            r.outcome = "interrupted".into();
        }
    }
    Ok(records)
}

async fn ids(dir: &TableDir) -> Result<Vec<String>> {
    super::json_names(dir, JOURNAL_DIR).await
}

/// Removes all but the newest [`KEEP`] records.
pub async fn trim(dir: &TableDir) -> Result<()> {
    let ids = ids(dir).await?;
    for id in &ids[..ids.len().saturating_sub(KEEP)] {
        let path = dir.path(&object(id));
        match dir.store().delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(FormatError::store(&path, e)),
        }
    }
    Ok(())
}

/// The columns of `MAINTAIN t` and `fragvec_maintenance('t')`.
pub fn journal_schema() -> SchemaRef {
    let ts = || DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("detail", DataType::Utf8, false),
        Field::new("started", ts(), false),
        Field::new("finished", ts(), true),
        Field::new("rows", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("outcome", DataType::Utf8, false),
        Field::new("retries", DataType::UInt32, false),
        Field::new("version", DataType::UInt64, true),
        Field::new("maintainer", DataType::Utf8, false),
    ]))
}

/// Task records as a batch of [`journal_schema`].
pub fn journal_batch(records: &[TaskRecord]) -> std::result::Result<RecordBatch, ArrowError> {
    let strings = |f: &dyn Fn(&TaskRecord) -> &str| {
        Arc::new(StringArray::from_iter_values(records.iter().map(f))) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        strings(&|r| &r.id),
        strings(&|r| &r.kind),
        strings(&|r| &r.detail),
        Arc::new(TimestampMillisecondArray::from_iter_values(
            records.iter().map(|r| r.started_ms),
        )),
        Arc::new(TimestampMillisecondArray::from_iter(
            records.iter().map(|r| r.finished_ms),
        )),
        Arc::new(UInt64Array::from_iter_values(
            records.iter().map(|r| r.rows),
        )),
        Arc::new(UInt64Array::from_iter_values(
            records.iter().map(|r| r.bytes),
        )),
        strings(&|r| &r.outcome),
        Arc::new(UInt32Array::from_iter_values(
            records.iter().map(|r| r.retries),
        )),
        Arc::new(UInt64Array::from_iter(records.iter().map(|r| r.version))),
        strings(&|r| &r.maintainer),
    ];
    RecordBatch::try_new(journal_schema(), columns)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;
    use crate::format::Database;
    use crate::maintain::lease::Lease;

    #[tokio::test]
    async fn records_round_trip_and_a_dead_maintainers_task_reads_as_interrupted() {
        let db = Database::from_store(Arc::new(InMemory::new()), Path::from("db"), "m".into());
        let dir = db.table("t").unwrap();
        let lease = Lease::acquire(&dir, "alive", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        let mut done = TaskRecord::start("compact", "4 fragments into 1".into(), "alive", 400);
        done.finish("done");
        write(&dir, &done).await.unwrap();
        let running = TaskRecord::start("index_append", "i: 10 rows".into(), "alive", 10);
        write(&dir, &running).await.unwrap();
        let orphan = TaskRecord::start("index_merge", "i".into(), "dead", 10);
        write(&dir, &orphan).await.unwrap();
        let got = read(&dir).await.unwrap();
        let outcome = |id: &str| got.iter().find(|r| r.id == id).unwrap().outcome.clone();
        assert_eq!(got.len(), 3);
        assert_eq!(outcome(&done.id), "done");
        assert_eq!(outcome(&running.id), "running");
        assert_eq!(outcome(&orphan.id), "interrupted");
        lease.release(&dir).await.unwrap();
        let got = read(&dir).await.unwrap();
        let running = got.iter().find(|r| r.id == running.id).unwrap();
        assert_eq!(
            running.outcome, "interrupted",
            "its maintainer gave the lease up"
        );
    }
}

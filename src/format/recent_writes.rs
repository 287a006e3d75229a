//! The rows of data files this database handle wrote a moment ago, as they were written.
//!
//! On a live table every commit adds a small fragment (a 100-row INSERT, the one row of a
//! re-embedding UPDATE), and the next KNN query must score it by brute force: without this,
//! the first query on each new version opened the new Parquet file, checked its pages and
//! decompressed them to get back rows the writer had in memory a millisecond before
//! (`knn_bench --after-commits`: the first query after a 100-row INSERT took 1.7× the
//! second's p50). A writer hands its batches here when it finishes a small file, and a
//! reader takes a column from them instead of decoding the file.
//!
//! What is kept is bounded: files of at most [`MAX_FILE_BYTES`] in memory, [`MAX_BYTES`] in
//! all, the oldest forgotten first. The bytes counted are the arrays' whole buffers (a
//! slice of a larger batch counts what it keeps alive), so a file cut from a big input batch
//! is not kept. An entry is keyed by the file's path, which is random and never reused, and
//! answers only for the column names the file was written with: a reader whose manifest
//! lists other columns for the file (a column rewritten or renamed since) reads the file.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use datafusion::arrow::array::{ArrayRef, RecordBatch};

/// Largest file, in bytes of its arrays, whose rows are kept.
pub const MAX_FILE_BYTES: usize = 4 << 20;

/// Bytes of rows kept in all, per database handle.
pub const MAX_BYTES: usize = 32 << 20;

/// The batches of one file and the column names it was written with.
#[derive(Debug)]
struct Written {
    columns: Vec<String>,
    batches: Vec<RecordBatch>,
    bytes: usize,
}

/// Recently written files' batches, by path (see the module docs).
#[derive(Debug, Default)]
pub struct RecentWrites {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<String, Written>,
    /// Paths in the order they were kept, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// Bytes of memory `batches` keep alive.
fn batches_bytes(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::get_array_memory_size).sum()
}

impl RecentWrites {
    /// Keeps the batches of the file at `path`, written with `columns`, if it is small
    /// enough; forgets the oldest files while the whole passes [`MAX_BYTES`].
    pub fn keep(&self, path: String, columns: Vec<String>, batches: Vec<RecordBatch>) {
        let bytes = batches_bytes(&batches);
        if bytes > MAX_FILE_BYTES {
            return;
        }
        let mut state = self.state.lock().expect("recent writes");
        if let Some(old) = state.files.remove(&path) {
            state.bytes -= old.bytes;
            state.order.retain(|p| p != &path);
        }
        while state.bytes + bytes > MAX_BYTES {
            let Some(oldest) = state.order.pop_front() else {
                break;
            };
            if let Some(gone) = state.files.remove(&oldest) {
                state.bytes -= gone.bytes;
            }
        }
        let written = Written {
            columns,
            batches,
            bytes,
        };
        state.files.insert(path.clone(), written);
        state.bytes += bytes;
        state.order.push_back(path);
    }

    /// The arrays of column `column` of the file at `path`, batch by batch, if the file is
    /// kept and was written with exactly the columns `columns` (the file's columns in the
    /// reader's manifest).
    pub fn column(&self, path: &str, columns: &[String], column: &str) -> Option<Vec<ArrayRef>> {
        let state = self.state.lock().expect("recent writes");
        let written = state.files.get(path)?;
        if written.columns != columns {
            return None;
        }
        let i = written.columns.iter().position(|c| c == column)?;
        written
            .batches
            .iter()
            .map(|b| (b.num_columns() == written.columns.len()).then(|| b.column(i).clone()))
            .collect()
    }

    /// Bytes of rows kept now.
    pub fn bytes(&self) -> usize {
        self.state.lock().expect("recent writes").bytes
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("x", DataType::Int64, true),
        ]));
        let ids = Int64Array::from_iter_values(0..rows as i64);
        let xs = Int64Array::from_iter_values((0..rows as i64).map(|i| i * 10));
        RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(xs)]).unwrap()
    }

    fn names() -> Vec<String> {
        vec!["id".to_string(), "x".to_string()]
    }

    #[test]
    fn answers_a_kept_column_for_the_columns_it_was_written_with() {
        let recent = RecentWrites::default();
        recent.keep("a".into(), names(), vec![batch(3), batch(2)]);
        let xs = recent.column("a", &names(), "x").unwrap();
        assert_eq!(xs.iter().map(|a| a.len()).collect::<Vec<_>>(), [3, 2]);
        let first = xs[0].as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(first.values().as_ref(), &[0, 10, 20]);
        assert!(recent.column("a", &names(), "y").is_none());
        assert!(recent.column("b", &names(), "x").is_none());
        // The reader's manifest lists other columns for the file: read the file instead.
        let renamed = vec!["id".to_string(), "y".to_string()];
        assert!(recent.column("a", &renamed, "id").is_none());
        assert!(recent.column("a", &names()[..1], "id").is_none());
    }

    #[test]
    fn a_file_larger_than_the_per_file_bound_is_not_kept() {
        let recent = RecentWrites::default();
        let big = batch(MAX_FILE_BYTES / 16 + 1);
        assert!(batches_bytes(std::slice::from_ref(&big)) > MAX_FILE_BYTES);
        recent.keep("big".into(), names(), vec![big]);
        assert!(recent.column("big", &names(), "id").is_none());
        assert_eq!(recent.bytes(), 0);
        // A small slice of a large batch keeps the whole batch alive: not kept either.
        let slice = batch(MAX_FILE_BYTES / 16 + 1).slice(0, 10);
        recent.keep("slice".into(), names(), vec![slice]);
        assert_eq!(recent.bytes(), 0);
    }

    #[test]
    fn the_oldest_files_go_first_and_the_total_stays_bounded() {
        let recent = RecentWrites::default();
        let one = batch(MAX_FILE_BYTES / 32);
        let each = batches_bytes(std::slice::from_ref(&one));
        let fit = MAX_BYTES / each;
        for i in 0..fit + 3 {
            recent.keep(format!("f{i}"), names(), vec![one.clone()]);
            assert!(recent.bytes() <= MAX_BYTES);
        }
        for i in 0..3 {
            assert!(recent.column(&format!("f{i}"), &names(), "id").is_none());
        }
        for i in 3..fit + 3 {
            assert!(
                recent.column(&format!("f{i}"), &names(), "id").is_some(),
                "f{i}"
            );
        }
        // Keeping a path again replaces it, counted once.
        let before = recent.bytes();
        recent.keep(format!("f{}", fit + 2), names(), vec![one.clone()]);
        assert_eq!(recent.bytes(), before);
    }
}

//! Row-map files on object storage (the stable-partition mapping of the reuse ledger).

use async_trait::async_trait;

use super::error::{FormatError, Result};
use super::store::TableDir;
use crate::ledger::{PartitionMap, Transition};

/// An opened row-map file: its footer in memory, blocks read on demand.
#[derive(Debug)]
pub struct RowMapFile {
    path: String,
}

impl RowMapFile {
    pub async fn open(dir: &TableDir, path: &str, _size: u64, _t: &Transition) -> Result<Self> {
        Err(FormatError::corrupt(
            dir.path(path),
            "row maps are not readable yet",
        ))
    }
}

#[async_trait]
impl PartitionMap for RowMapFile {
    async fn lookup(&self, _positions: &[u64]) -> crate::ledger::Result<Vec<Option<(u16, u32)>>> {
        Err(crate::ledger::LedgerError::Invalid(format!(
            "row map {} is not readable",
            self.path
        )))
    }
}

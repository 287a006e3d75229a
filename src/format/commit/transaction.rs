//! What a commit carries: the [`Transaction`] one statement builds, and its parts.
//!
//! Owns the plain data types of a commit — new fragments and their row ids
//! ([`NewFragment`], [`NewRowIds`]), index segments not yet committed ([`NewSegment`]),
//! index changes ([`IndexChange`]) and rewrites of adjacent fragments ([`Rewrite`],
//! [`RowMapRef`]) — and nothing that decides or does IO.
//!
//! Contract: a transaction is relative to the version it read (`read_version`); every
//! fragment it names by id (deletions, column rewrites, rewrite sources, the files an index
//! build read) is named in *that* version's id domain. New fragments and segments have no
//! ids yet: [`super::rebase::allocate_ids`] gives them ids at commit time, so a transaction
//! can be rebased onto a later version unchanged. Whether it may be is
//! [`super::conflict::check`]'s call.

use std::collections::{BTreeMap, BTreeSet};

use roaring::RoaringBitmap;

use crate::format::fragment_io::WrittenFragment;
use crate::format::index_meta::IndexDef;
use crate::format::manifest::{DataFile, DeletionFile, Fragment, Operation};
use crate::format::policy::PolicyChange;
use crate::format::rowids::RowIdSequence;
use crate::ledger::{FragmentDigest, Mapping, Transition};

/// Row ids of appended rows (ignored by tables without stable row ids).
#[derive(Clone, Debug, PartialEq)]
pub enum NewRowIds {
    /// New rows: ids are allocated from the table's counter at commit time.
    Fresh,
    /// Rows that keep existing ids (the new versions of updated rows).
    Given(RowIdSequence),
}

/// A fragment written but not yet committed: it gets its id when the commit assigns one.
#[derive(Clone, Debug, PartialEq)]
pub struct NewFragment {
    /// The fragment's data files, already in the store, and its row count.
    pub written: WrittenFragment,
    /// Where its rows' stable ids come from.
    pub row_ids: NewRowIds,
}

/// A segment written but not yet committed: it gets its id when the commit assigns one.
#[derive(Clone, Debug, PartialEq)]
pub struct NewSegment {
    /// The segment file's path, relative to the table root; already written.
    pub file: String,
    /// The segment file's size in bytes.
    pub size_bytes: u64,
    /// Rows (vectors) the segment file holds.
    pub rows: u64,
    /// Ids of the fragments whose rows the file holds, in the id domain of the version the
    /// build read.
    pub fragment_bitmap: BTreeSet<u64>,
}

/// Changes to a table's vector indexes.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexChange {
    /// A new index with its first segments.
    Create {
        /// The new index's definition.
        def: IndexDef,
        /// Its first segments, already written.
        segments: Vec<NewSegment>,
    },
    /// Drops an index and all its segments.
    Drop {
        /// The name of the index to drop.
        name: String,
    },
    /// Replaces some segments of an index by new ones (append: none removed; merge: the
    /// inputs removed). With `def`, the index itself is replaced too (retrain).
    ReplaceSegments {
        /// The name of the index whose segments change.
        index: String,
        /// Ids of the segments removed (empty for an append).
        remove: Vec<u64>,
        /// The new segments, already written.
        add: Vec<NewSegment>,
        /// The index's new definition when the change retrains it; `None` keeps the
        /// definition.
        def: Option<IndexDef>,
    },
}

/// A rewrite of adjacent fragments (compaction, recluster): the outputs replace the sources
/// **at the sources' position** in the fragment list, so scan order is kept.
#[derive(Clone, Debug)]
pub struct Rewrite {
    /// The sources as the rewrite read them, in logical order (adjacent).
    pub sources: Vec<FragmentDigest>,
    /// Their data files as read: a source rewritten in place since is a conflict.
    pub source_files: Vec<Vec<DataFile>>,
    /// The deletion file of each source as read (`None`: none). Its rows did not move; rows
    /// deleted since are carried over to the outputs at commit time.
    pub removed: Vec<Option<DeletionFile>>,
    /// The new fragments, in order; their row ids are the sources' surviving ids.
    pub outputs: Vec<NewFragment>,
    /// How rows map onto the outputs (an ordered compaction unless a row map is given).
    pub row_map: Option<RowMapRef>,
}

/// A row-map file written by a stable-partition rewrite.
#[derive(Clone, Debug, PartialEq)]
pub struct RowMapRef {
    /// The row-map file's path, relative to the table root; already written.
    pub path: String,
    /// The row-map file's size in bytes.
    pub size_bytes: u64,
}

impl Rewrite {
    /// The rewrite of `sources` (as read) into `outputs`.
    pub fn of(sources: &[Fragment], outputs: Vec<NewFragment>, row_map: Option<RowMapRef>) -> Self {
        Rewrite {
            sources: sources
                .iter()
                .map(|f| FragmentDigest {
                    id: f.id,
                    physical_rows: f.physical_rows,
                    deleted_rows: f.deleted_rows(),
                })
                .collect(),
            source_files: sources.iter().map(|f| f.files.clone()).collect(),
            removed: sources.iter().map(|f| f.deletion.clone()).collect(),
            outputs,
            row_map,
        }
    }

    /// How this rewrite's rows map onto its outputs, as the ledger records it.
    fn mapping(&self) -> Mapping {
        match &self.row_map {
            None => Mapping::OrderedCompaction {
                removed: self
                    .removed
                    .iter()
                    .map(|d| d.as_ref().map(|d| d.path.clone()))
                    .collect(),
                removed_crc32c: if self.removed.iter().flatten().any(|d| d.crc32c.is_some()) {
                    self.removed
                        .iter()
                        .map(|d| d.as_ref().and_then(|d| d.crc32c))
                        .collect()
                } else {
                    vec![]
                },
            },
            Some(r) => Mapping::StablePartition {
                row_map: r.path.clone(),
                size_bytes: r.size_bytes,
            },
        }
    }

    /// The transition this rewrite records once its outputs have ids.
    pub fn transition(&self, id: u64, read: u64, committed: u64, outputs: &[u64]) -> Transition {
        Transition {
            id,
            source_version: read,
            committed_version: committed,
            sources: self.sources.clone(),
            destinations: self
                .outputs
                .iter()
                .zip(outputs)
                .map(|(o, id)| FragmentDigest {
                    id: *id,
                    physical_rows: o.written.physical_rows,
                    deleted_rows: 0,
                })
                .collect(),
            mapping: self.mapping(),
        }
    }
}

/// The changes one statement makes, relative to the version it read.
#[derive(Clone, Debug)]
pub struct Transaction {
    /// The statement's kind, recorded in the new manifest's transaction record.
    pub operation: Operation,
    /// The version the statement read; every fragment id it names is in that version's
    /// id domain, and a commit onto a later version is a rebase.
    pub read_version: u64,
    /// Appended at the end of the fragment list, in this order.
    pub appends: Vec<NewFragment>,
    /// Offsets newly deleted by this transaction, by fragment id.
    pub deletions: BTreeMap<u64, RoaringBitmap>,
    /// In-place column rewrites: the new file replaces its columns in the fragment.
    pub column_rewrites: BTreeMap<u64, DataFile>,
    /// With `column_rewrites`: the offsets whose values the new files change, by fragment
    /// id. A winner that deleted one of them (a concurrent UPDATE moved the row, or a DELETE
    /// removed it) makes the commit conflict: the new values would land on a dead row.
    pub updated_in_place: BTreeMap<u64, RoaringBitmap>,
    /// At most one change to the table's indexes.
    pub index_change: Option<IndexChange>,
    /// For index builds: the data files of every fragment the new segments cover, as read.
    /// A fragment whose files differ at commit time is marked invalidated in the new segment.
    pub read_fragment_files: BTreeMap<u64, Vec<DataFile>>,
    /// Rewrites of adjacent fragments, spliced in place.
    pub rewrites: Vec<Rewrite>,
    /// A new `CLUSTER BY` key (empty: none).
    pub cluster_by: Option<Vec<String>>,
    /// `ALTER TABLE ... SET / RESET` of maintenance properties, applied in order to the
    /// latest version's policy (so concurrent changes of other names survive a rebase).
    pub policy_changes: Vec<PolicyChange>,
}

impl Transaction {
    /// An empty transaction of `operation` over version `read_version`.
    pub fn new(operation: Operation, read_version: u64) -> Self {
        Self {
            operation,
            read_version,
            appends: vec![],
            deletions: BTreeMap::new(),
            column_rewrites: BTreeMap::new(),
            updated_in_place: BTreeMap::new(),
            index_change: None,
            read_fragment_files: BTreeMap::new(),
            rewrites: vec![],
            cluster_by: None,
            policy_changes: vec![],
        }
    }

    /// Whether committing it would change nothing but the version number.
    pub fn is_empty(&self) -> bool {
        self.appends.is_empty()
            && self.deletions.is_empty()
            && self.column_rewrites.is_empty()
            && self.index_change.is_none()
            && self.rewrites.is_empty()
            && self.cluster_by.is_none()
            && self.policy_changes.is_empty()
    }
}

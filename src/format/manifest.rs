//! The manifest: one immutable JSON document per table version.
//!
//! A manifest is the whole table state at one version: schema, properties, the **ordered** fragment
//! list, id counters, index segments, the reuse ledger, feature flags and the transaction that
//! produced it. It is written once with a create-if-absent put and never modified, so any version
//! can be re-read later (time travel) and two writers can never both publish the same version.
//!
//! # The logical order contract
//!
//! The position of a fragment in [`Manifest::fragments`] is its place in the table's scan order;
//! fragment ids are names, never positions. Ids are never reused and need not be sorted. Every
//! operation says where its fragments go: appends go at the end; rewrites (compaction, recluster)
//! replace their sources in place, at the position of the sources. A scan reads fragments in list
//! order and the rows of each fragment in offset order, so `SELECT * FROM t` without `ORDER BY`
//! returns rows in this logical order.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use super::error::{FormatError, Result};
use super::index_meta::{IndexDef, IndexKind, IndexSegment, validate_segments};
use super::integrity::crc32c;
use super::policy::MaintenancePolicy;
use super::rowids::RowIdSequence;
use crate::ledger::Transition;
use crate::ledger::transition::KNOWN_MAPPINGS;

/// Refuses a table whose reader features this build does not know.
fn check_reader_features<'a>(flags: impl Iterator<Item = &'a str>, table: &str) -> Result<()> {
    for flag in flags {
        if !KNOWN_READER_FEATURES.contains(&flag) {
            return Err(FormatError::UnknownFeature {
                table: table.to_string(),
                flag: flag.to_string(),
            });
        }
    }
    Ok(())
}

/// First field of every manifest; anything else is a foreign file.
pub const MANIFEST_MAGIC: &str = "fragvec-manifest";
/// Manifest layout version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// Reader features this build understands. A table naming any other feature is refused.
pub const KNOWN_READER_FEATURES: &[&str] = &[
    feature::PACKED_VECTORS,
    feature::STABLE_ROW_IDS,
    feature::DELETION_FILES,
    feature::VECTOR_INDEX,
    feature::REUSE_LEDGER,
    feature::SCALAR_CODES_INDEX,
];
/// Writer features this build understands (a writer must understand reader features too).
pub const KNOWN_WRITER_FEATURES: &[&str] = &[
    feature::PACKED_VECTORS,
    feature::STABLE_ROW_IDS,
    feature::DELETION_FILES,
    feature::VECTOR_INDEX,
    feature::REUSE_LEDGER,
    feature::SCALAR_CODES_INDEX,
    feature::CHECKSUMS,
];

/// The compatibility flags a manifest lists in `reader_features` / `writer_features`: a
/// fragvec that does not know one a table lists refuses to read (or write) the table.
pub mod feature {
    /// Fragments carry row-id sequences; `_rowid` is stable across updates and moves.
    pub const STABLE_ROW_IDS: &str = "stable_row_ids";
    /// Fragments may carry deletion files.
    pub const DELETION_FILES: &str = "deletion_files";
    /// The table has vector indexes: readers must apply segment ownership when they use them,
    /// and writers must keep `invalidated_fragments` true.
    pub const VECTOR_INDEX: &str = "vector_index";
    /// Index segments may hold row addresses of rewritten fragments: a reader must translate
    /// them through the reuse ledger before using them.
    pub const REUSE_LEDGER: &str = "reuse_ledger";
    /// The table has an IVF_SQ index, whose segments hold no floats: a reader must re-rank
    /// from the data files (a build that does not know the kind must refuse the table, not
    /// fail to parse it).
    pub const SCALAR_CODES_INDEX: &str = "ivf_sq_index";
    /// Writer feature: data and deletion entries carry CRC32C checksums (see
    /// [`super::super::integrity`]). A writer that does not know them would drop them when
    /// it copies entries into its manifest, so it must not write the table. Readers that
    /// do not know them still read correctly, unverified.
    pub const CHECKSUMS: &str = "checksums";
    /// The table has a vector column, which data files may store packed, as fixed-width
    /// binary (see [`super::super::packed_vectors`]): a reader that does not know it would
    /// refuse those files one by one, mid-query.
    pub const PACKED_VECTORS: &str = "packed_vectors";
}

/// Default for the `max_rows_per_fragment` table option.
pub const DEFAULT_MAX_ROWS_PER_FRAGMENT: u64 = 1 << 20;
/// Fragment ids share a row address with a 32-bit offset, so they must fit in 32 bits.
pub const MAX_FRAGMENT_ID: u64 = u32::MAX as u64;

/// Name of the virtual column holding a row's address.
pub const ROW_ADDR: &str = "_rowaddr";
/// Name of the virtual column holding a row's id (stable id, or the address without them).
pub const ROW_ID: &str = "_rowid";

/// A table column as the manifest records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// The column's name, unique in the table.
    pub name: String,
    /// Arrow's display form of the type, e.g. `Int64` or `FixedSizeList(128 x Float32)`.
    pub data_type: String,
    /// Whether the column may hold NULL.
    pub nullable: bool,
}

/// Options fixed when the table is created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableProperties {
    /// Whether fragments carry row-id sequences, so `_rowid` survives updates and moves
    /// (otherwise `_rowid` is the row address).
    pub stable_row_ids: bool,
    /// The most rows a write puts in one fragment; a larger write makes several fragments.
    pub max_rows_per_fragment: u64,
    /// `CLUSTER BY` key (SQL expressions) a plain `RECLUSTER t` uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_by: Vec<String>,
    /// `PRIMARY KEY` / `UNIQUE` constraints, recorded as DataFusion records them: the
    /// planner derives functional dependencies from them (a query may select a column that
    /// depends on a grouped key); like DataFusion, fragvec does not enforce uniqueness.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<KeyConstraint>,
    /// `DEFAULT` expressions of columns (SQL text, by column name), used by INSERTs that
    /// leave the column out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub column_defaults: Vec<(String, String)>,
    /// What upkeep runs by itself (`ALTER TABLE t SET (auto_index = on, ...)`).
    #[serde(default, skip_serializing_if = "is_default_policy")]
    pub maintenance: MaintenancePolicy,
}

fn is_default_policy(p: &MaintenancePolicy) -> bool {
    *p == MaintenancePolicy::default()
}

/// One `PRIMARY KEY (columns)` or `UNIQUE (columns)` constraint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyConstraint {
    /// `true` for a `PRIMARY KEY`, `false` for a `UNIQUE` constraint.
    pub primary_key: bool,
    /// The names of the constrained columns, in declaration order.
    pub columns: Vec<String>,
}

impl Default for TableProperties {
    fn default() -> Self {
        Self {
            stable_row_ids: false,
            max_rows_per_fragment: DEFAULT_MAX_ROWS_PER_FRAGMENT,
            cluster_by: vec![],
            constraints: vec![],
            column_defaults: vec![],
            maintenance: MaintenancePolicy::default(),
        }
    }
}

/// One Parquet file holding some columns of every physical row of a fragment.
///
/// A fragment starts with one file holding all columns; an in-place column rewrite adds a file
/// with the rewritten columns and drops those columns from the older files' lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// Relative to the table root.
    pub path: String,
    /// Names of the table columns this file holds for the fragment; a column rewritten
    /// in place since is listed only in its newer file.
    pub columns: Vec<String>,
    /// The file's size in bytes.
    pub size_bytes: u64,
    /// Where the file's Parquet footer starts and its CRC32C; the footer holds a CRC32C of
    /// every page (see [`super::integrity`]). Absent for files written before checksums
    /// existed: those are read unverified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footer: Option<FooterChecksum>,
    /// The value range of each scalar column, for skipping the fragment
    /// ([`super::column_stats`]). Empty for files written before ranges existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stats: Vec<super::column_stats::ColumnStats>,
}

/// The checksum of a data file's footer (page indexes, metadata with the page checksum
/// table, trailer): bytes `offset..size_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FooterChecksum {
    /// Byte offset in the file where the footer (page indexes onward) starts.
    pub offset: u64,
    /// The CRC32C of the file's bytes from `offset` to its end.
    pub crc32c: u32,
}

/// A roaring bitmap of deleted offsets of one fragment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionFile {
    /// Relative to the table root.
    pub path: String,
    /// Offsets the file marks deleted: the fragment's deleted-row count.
    pub deleted_rows: u64,
    /// The table version whose deletions this file extends (the commit's read version).
    pub read_version: u64,
    /// CRC32C of the whole file; absent for files written before checksums existed (read
    /// unverified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<u32>,
}

/// A run of rows written together: data files holding its columns, and its deletions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fragment {
    /// The fragment's id: unique in the table, never reused, below 2^32 (see
    /// [`MAX_FRAGMENT_ID`]); a name, not a scan position.
    pub id: u64,
    /// The data files holding the fragment's columns; each table column is in exactly one.
    pub files: Vec<DataFile>,
    /// Rows in each of its data files, deleted ones included (row offsets run
    /// `0..physical_rows`).
    pub physical_rows: u64,
    /// The deletion vector marking its deleted offsets; `None` when no row is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<DeletionFile>,
    /// Present exactly when the table has stable row ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_ids: Option<RowIdSequence>,
}

impl Fragment {
    /// Rows its deletion vector marks deleted (0 without one).
    pub fn deleted_rows(&self) -> u64 {
        self.deletion.as_ref().map_or(0, |d| d.deleted_rows)
    }

    /// Rows not deleted: `physical_rows` minus `deleted_rows`.
    pub fn live_rows(&self) -> u64 {
        self.physical_rows - self.deleted_rows()
    }

    /// The data file that holds `column`, if any.
    pub fn file_for_column(&self, column: &str) -> Option<&DataFile> {
        self.files
            .iter()
            .find(|f| f.columns.iter().any(|c| c == column))
    }
}

/// What produced a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// `CREATE TABLE`: version 1 of a table.
    Create,
    /// `INSERT` and `COPY`: new fragments appended.
    Append,
    /// `DELETE`: rows marked deleted.
    Delete,
    /// `UPDATE`: new row values, appended or rewritten in place.
    Update,
    /// `MERGE`: matched rows updated or deleted, unmatched ones inserted.
    Merge,
    /// `CREATE VECTOR INDEX`: an index and its first segments.
    CreateIndex,
    /// `DROP INDEX`: an index and its segments removed.
    DropIndex,
    /// `OPTIMIZE INDEX`: segments appended, merged or retrained.
    OptimizeIndex,
    /// `COMPACT`: small adjacent fragments rewritten into larger ones.
    Compact,
    /// `RECLUSTER`: fragments rewritten with their rows regrouped by the cluster key.
    Recluster,
    /// `VACUUM`; no statement commits a version with it today (VACUUM only removes files).
    Vacuum,
    /// `ALTER TABLE`: a table property (cluster key, maintenance policy) changed.
    AlterTable,
}

impl Operation {
    /// The operation's name in upper case, as `fragvec_versions` shows it (`APPEND`,
    /// `CREATE INDEX`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Append => "APPEND",
            Operation::Delete => "DELETE",
            Operation::Update => "UPDATE",
            Operation::Merge => "MERGE",
            Operation::CreateIndex => "CREATE INDEX",
            Operation::DropIndex => "DROP INDEX",
            Operation::OptimizeIndex => "OPTIMIZE INDEX",
            Operation::Compact => "COMPACT",
            Operation::Recluster => "RECLUSTER",
            Operation::Vacuum => "VACUUM",
            Operation::AlterTable => "ALTER TABLE",
        }
    }
}

/// What committed a version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransactionRecord {
    /// The kind of statement that committed the version.
    pub operation: Operation,
    /// The version the transaction read (and rebased from, if it lost a race).
    pub read_version: u64,
    /// When the commit built this manifest, in milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Random tag of the transaction, to tell two commits apart in logs.
    pub tag: String,
}

/// One version of a table: its schema, options, fragments, indexes and reuse ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`MANIFEST_MAGIC`]; anything else means the file is not a manifest.
    pub magic: String,
    /// The manifest layout version it was written in (at most [`FORMAT_VERSION`]).
    pub format_version: u32,
    /// The table version it describes; its file name carries the same number.
    pub version: u64,
    /// The table's columns, in schema order.
    pub columns: Vec<ColumnDef>,
    /// The table's options and properties (some changed by `ALTER TABLE`).
    pub properties: TableProperties,
    /// In logical (scan) order. See the module docs.
    pub fragments: Vec<Fragment>,
    /// The id the next new fragment gets; above every fragment id ever used.
    pub next_fragment_id: u64,
    /// The stable row id the next new row gets (tables with stable row ids; unused
    /// otherwise).
    pub next_row_id: u64,
    /// Vector indexes (definitions and shared models); see [`super::index_meta`].
    #[serde(default)]
    pub indexes: Vec<IndexDef>,
    /// Segments of those indexes, oldest first.
    #[serde(default)]
    pub index_segments: Vec<IndexSegment>,
    /// The id the next new index segment gets.
    #[serde(default)]
    pub next_segment_id: u64,
    /// Fragment-reuse ledger: how rewrites moved rows (see [`crate::ledger`]), in commit
    /// order. Translation order is derived from lineage, not from this order.
    #[serde(default)]
    pub reuse_ledger: Vec<Transition>,
    /// The id the next reuse-ledger transition gets.
    #[serde(default)]
    pub next_transition_id: u64,
    /// Features a reader must know to read the table (see [`feature`]).
    pub reader_features: BTreeSet<String>,
    /// Features a writer must know to write the table (see [`feature`]).
    pub writer_features: BTreeSet<String>,
    /// The commit that produced this version.
    pub transaction: TransactionRecord,
}

impl Manifest {
    /// The manifest of version 1 of a new, empty table.
    pub fn new_table(schema: &Schema, properties: TableProperties, tag: String) -> Result<Self> {
        let columns = schema
            .fields()
            .iter()
            .map(|f| ColumnDef {
                name: f.name().clone(),
                data_type: f.data_type().to_string(),
                nullable: f.is_nullable(),
            })
            .collect();
        let mut reader_features = BTreeSet::from([feature::DELETION_FILES.to_string()]);
        if properties.stable_row_ids {
            reader_features.insert(feature::STABLE_ROW_IDS.to_string());
        }
        let mut writer_features = reader_features.clone();
        writer_features.insert(feature::CHECKSUMS.to_string());
        let mut manifest = Manifest {
            magic: MANIFEST_MAGIC.to_string(),
            format_version: FORMAT_VERSION,
            version: 1,
            columns,
            properties,
            fragments: vec![],
            next_fragment_id: 0,
            next_row_id: 0,
            indexes: vec![],
            index_segments: vec![],
            next_segment_id: 0,
            reuse_ledger: vec![],
            next_transition_id: 0,
            writer_features,
            reader_features,
            transaction: TransactionRecord {
                operation: Operation::Create,
                read_version: 0,
                timestamp_ms: now_ms(),
                tag,
            },
        };
        manifest.arrow_schema()?;
        manifest.sync_index_feature();
        Ok(manifest)
    }

    /// The table's Arrow schema, parsed from the column definitions; an error when a
    /// recorded type does not parse.
    pub fn arrow_schema(&self) -> Result<SchemaRef> {
        let fields = self
            .columns
            .iter()
            .map(|c| {
                let dt = DataType::from_str(&c.data_type).map_err(|e| {
                    FormatError::invalid(format!("column '{}' has unreadable type: {e}", c.name))
                })?;
                Ok(Field::new(&c.name, dt, c.nullable))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Rows not deleted, summed over all fragments of this version.
    pub fn live_rows(&self) -> u64 {
        self.fragments.iter().map(Fragment::live_rows).sum()
    }

    /// The fragment with id `id`, if this version has it.
    pub fn fragment(&self, id: u64) -> Option<&Fragment> {
        self.fragments.iter().find(|f| f.id == id)
    }

    /// The manifest as pretty JSON whose last member is `"crc32c"`: the CRC32C of the same
    /// JSON without that member (see `split_checksum`).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = serde_json::to_vec_pretty(self).expect("manifest serializes");
        let sum = crc32c(&body);
        debug_assert!(body.ends_with(b"\n}"));
        body.truncate(body.len() - 2);
        body.extend_from_slice(format!("{CHECKSUM_MEMBER}{sum}\n}}").as_bytes());
        body
    }

    /// Parses and validates a manifest. `path` and `table` only label errors.
    pub fn decode(bytes: &[u8], path: &str, table: &str) -> Result<Self> {
        if let Some((body, recorded)) = split_checksum(bytes) {
            let found = crc32c(&body);
            if found != recorded {
                return Err(FormatError::corrupt(
                    path,
                    format!("manifest: CRC32C is {found:#010x}, {recorded:#010x} was recorded"),
                ));
            }
        }
        // The usual case, read straight into the struct (twice as fast as through a JSON
        // value: a live table's readers decode a manifest per commit); a file that does not
        // read so is read again below for the precise reason.
        let manifest = match serde_json::from_slice::<Manifest>(bytes) {
            Ok(manifest) => {
                if manifest.magic != MANIFEST_MAGIC {
                    return Err(FormatError::corrupt(
                        path,
                        "not a fragvec manifest (bad magic)",
                    ));
                }
                let features = manifest.reader_features.iter().map(String::as_str);
                check_reader_features(features, table)?;
                // Every mapping kind parsed, so each is one this build translates.
                manifest
            }
            Err(_) => Self::decode_with_reasons(bytes, path, table)?,
        };
        manifest
            .validate()
            .map_err(|reason| FormatError::corrupt(path, reason))?;
        Ok(manifest)
    }

    /// Reads a manifest through a JSON value, so that a foreign file, a newer table or an
    /// unknown mapping fails with the precise reason rather than a confusing field error.
    fn decode_with_reasons(bytes: &[u8], path: &str, table: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| FormatError::corrupt(path, format!("not a JSON manifest: {e}")))?;
        if value.get("magic").and_then(|m| m.as_str()) != Some(MANIFEST_MAGIC) {
            return Err(FormatError::corrupt(
                path,
                "not a fragvec manifest (bad magic)",
            ));
        }
        if let Some(flags) = value.get("reader_features").and_then(|f| f.as_array()) {
            let flags = flags.iter().map(|f| f.as_str().unwrap_or("<non-string>"));
            check_reader_features(flags, table)?;
        }
        if let Some(ledger) = value.get("reuse_ledger").and_then(|l| l.as_array()) {
            for t in ledger {
                let kind = t.pointer("/mapping/kind").and_then(|k| k.as_str());
                if !kind.is_some_and(|k| KNOWN_MAPPINGS.contains(&k)) {
                    return Err(FormatError::corrupt(
                        path,
                        format!(
                            "reuse ledger transition {} has mapping kind {} this build cannot \
                             translate",
                            t.get("id").map_or("?".to_string(), |i| i.to_string()),
                            kind.map_or("<missing>".to_string(), |k| format!("'{k}'"))
                        ),
                    ));
                }
            }
        }
        serde_json::from_value(value)
            .map_err(|e| FormatError::corrupt(path, format!("invalid manifest: {e}")))
    }

    /// Refuses to write a table whose writer features this build does not know.
    pub fn check_writable(&self, table: &str) -> Result<()> {
        for flag in &self.writer_features {
            if !KNOWN_WRITER_FEATURES.contains(&flag.as_str()) {
                return Err(FormatError::UnknownFeature {
                    table: table.to_string(),
                    flag: flag.clone(),
                });
            }
        }
        Ok(())
    }

    /// Structural invariants; a violation means the file is corrupt.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.format_version > FORMAT_VERSION || self.format_version == 0 {
            return Err(format!(
                "unsupported manifest format version {}",
                self.format_version
            ));
        }
        if self.version == 0 {
            return Err("version 0 is not a valid table version".into());
        }
        self.validate_indexes()?;
        self.validate_ledger()?;
        let columns: HashSet<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
        if columns.len() != self.columns.len() {
            return Err("duplicate column names".into());
        }
        self.arrow_schema().map_err(|e| e.to_string())?;
        let stable = self.properties.stable_row_ids;
        if stable != self.reader_features.contains(feature::STABLE_ROW_IDS) {
            return Err("stable_row_ids property and feature flag disagree".into());
        }
        if self.properties.max_rows_per_fragment == 0 {
            return Err("max_rows_per_fragment must be positive".into());
        }
        let mut ids = HashSet::new();
        for frag in &self.fragments {
            let id = frag.id;
            if !ids.insert(id) {
                return Err(format!("fragment id {id} appears twice"));
            }
            if id >= self.next_fragment_id || id > MAX_FRAGMENT_ID {
                return Err(format!("fragment id {id} is not below next_fragment_id"));
            }
            if frag.physical_rows > MAX_FRAGMENT_ID {
                return Err(format!("fragment {id} has too many rows"));
            }
            let mut covered: BTreeMap<&str, usize> = BTreeMap::new();
            for file in &frag.files {
                check_relative_path(&file.path)?;
                if let Some(f) = &file.footer
                    && (f.offset < 4 || f.offset >= file.size_bytes)
                {
                    return Err(format!(
                        "fragment {id}: footer offset {} is outside its {}-byte file",
                        f.offset, file.size_bytes
                    ));
                }
                for c in &file.columns {
                    *covered.entry(c.as_str()).or_default() += 1;
                }
            }
            for c in &columns {
                if covered.get(c) != Some(&1) {
                    return Err(format!(
                        "fragment {id}: column '{c}' is not held by exactly one file"
                    ));
                }
            }
            if covered.len() != columns.len() {
                return Err(format!(
                    "fragment {id} holds a column the schema does not have"
                ));
            }
            if let Some(d) = &frag.deletion {
                check_relative_path(&d.path)?;
                if d.deleted_rows > frag.physical_rows {
                    return Err(format!("fragment {id} deletes more rows than it has"));
                }
            }
            match (&frag.row_ids, stable) {
                (Some(seq), true) => {
                    seq.validate()?;
                    if seq.len() != frag.physical_rows {
                        return Err(format!(
                            "fragment {id}: row-id count differs from row count"
                        ));
                    }
                    if seq.max_id().is_some_and(|m| m >= self.next_row_id) {
                        return Err(format!("fragment {id}: row id not below next_row_id"));
                    }
                }
                (None, false) => {}
                (Some(_), false) => {
                    return Err(format!("fragment {id} has row ids, table does not"));
                }
                (None, true) => return Err(format!("fragment {id} lacks row ids")),
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// The definition of the index named `name`, if the table has one.
    pub fn index(&self, name: &str) -> Option<&IndexDef> {
        self.indexes.iter().find(|i| i.name == name)
    }

    /// The segments of the index named `index`, oldest first.
    pub fn segments_of<'a>(
        &'a self,
        index: &'a str,
    ) -> impl Iterator<Item = &'a IndexSegment> + 'a {
        self.index_segments.iter().filter(move |s| s.index == index)
    }

    /// Keeps the `vector_index`, `reuse_ledger`, `ivf_sq_index` and `packed_vectors` feature
    /// flags in step with whether the table has indexes, ledger entries, IVF_SQ indexes and
    /// vector columns, and marks the table as written with checksums (every commit goes
    /// through here).
    pub fn sync_index_feature(&mut self) {
        self.writer_features.insert(feature::CHECKSUMS.to_string());
        let vectors = self.columns.iter().any(|c| {
            DataType::from_str(&c.data_type)
                .is_ok_and(|dt| super::packed_vectors::packed_type(&dt).is_some())
        });
        for flags in [&mut self.reader_features, &mut self.writer_features] {
            for (flag, on) in [
                (feature::VECTOR_INDEX, !self.indexes.is_empty()),
                (feature::REUSE_LEDGER, !self.reuse_ledger.is_empty()),
                (
                    feature::SCALAR_CODES_INDEX,
                    self.indexes.iter().any(|i| i.kind == IndexKind::IvfSq),
                ),
                (feature::PACKED_VECTORS, vectors),
            ] {
                if on {
                    flags.insert(flag.to_string());
                } else {
                    flags.remove(flag);
                }
            }
        }
    }

    fn validate_ledger(&self) -> std::result::Result<(), String> {
        if self.reuse_ledger.is_empty() {
            return Ok(());
        }
        if !self.reader_features.contains(feature::REUSE_LEDGER) {
            return Err("ledger entries without the reuse_ledger feature flag".into());
        }
        crate::ledger::validate(&self.reuse_ledger).map_err(|e| e.to_string())?;
        let current: HashSet<u64> = self.fragments.iter().map(|f| f.id).collect();
        for t in &self.reuse_ledger {
            if t.id >= self.next_transition_id {
                return Err(format!(
                    "transition id {} is not below next_transition_id",
                    t.id
                ));
            }
            for s in &t.sources {
                if current.contains(&s.id) {
                    return Err(format!(
                        "fragment {} is still in the table but transition {} rewrote it",
                        s.id, t.id
                    ));
                }
            }
            for d in &t.destinations {
                if let Some(f) = self.fragment(d.id)
                    && f.physical_rows != d.physical_rows
                {
                    return Err(format!(
                        "transition {} says fragment {} has {} rows, it has {}",
                        t.id, d.id, d.physical_rows, f.physical_rows
                    ));
                }
            }
            for f in t.sources.iter().chain(&t.destinations) {
                if f.id >= self.next_fragment_id {
                    return Err(format!(
                        "transition {} names fragment {} not below next_fragment_id",
                        t.id, f.id
                    ));
                }
            }
            for file in t.mapping.files() {
                check_relative_path(file)?;
            }
        }
        Ok(())
    }

    fn validate_indexes(&self) -> std::result::Result<(), String> {
        if !self.indexes.is_empty() && !self.reader_features.contains(feature::VECTOR_INDEX) {
            return Err("vector indexes without the vector_index feature flag".into());
        }
        let mut names = HashSet::new();
        for index in &self.indexes {
            if !names.insert(index.name.as_str()) {
                return Err(format!("index '{}' defined twice", index.name));
            }
            if !self.columns.iter().any(|c| c.name == index.column) {
                return Err(format!(
                    "index '{}' is on unknown column '{}'",
                    index.name, index.column
                ));
            }
            check_relative_path(&index.model_file)?;
            let segments: Vec<&IndexSegment> = self.segments_of(&index.name).collect();
            validate_segments(&index.name, &segments)?;
        }
        let mut ids = HashSet::new();
        for segment in &self.index_segments {
            check_relative_path(&segment.file)?;
            if self.index(&segment.index).is_none() {
                return Err(format!(
                    "segment {} belongs to unknown index '{}'",
                    segment.id, segment.index
                ));
            }
            if !ids.insert(segment.id) || segment.id >= self.next_segment_id {
                return Err(format!(
                    "segment id {} is duplicated or not below next_segment_id",
                    segment.id
                ));
            }
        }
        Ok(())
    }
}

fn check_relative_path(path: &str) -> std::result::Result<(), String> {
    if path.is_empty()
        || path.starts_with('/')
        || path.contains("..")
        || path.contains("://")
        || path.contains('\\')
    {
        return Err(format!("file path '{path}' is not a plain relative path"));
    }
    Ok(())
}

/// The current time in milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// How [`Manifest::encode`] appends the checksum: the last member of the pretty-printed
/// object. Serde ignores it as an unknown field, so older builds still read the manifest.
const CHECKSUM_MEMBER: &str = ",\n  \"crc32c\": ";

/// The JSON a manifest's checksum covers and the checksum, when the bytes end with the
/// member [`Manifest::encode`] writes; `None` for manifests written without one (before
/// checksums, or by hand), which are read unverified. A damaged checksum member itself either
/// stops the JSON from parsing or leaves the rest of the manifest intact.
fn split_checksum(bytes: &[u8]) -> Option<(Vec<u8>, u32)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let rest = text.strip_suffix("\n}")?;
    let at = rest.rfind(CHECKSUM_MEMBER)?;
    let digits = &rest[at + CHECKSUM_MEMBER.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let recorded = digits.parse().ok()?;
    let mut body = rest.as_bytes()[..at].to_vec();
    body.extend_from_slice(b"\n}");
    Some((body, recorded))
}

#[cfg(test)]
mod tests;

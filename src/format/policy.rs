//! A table's maintenance policy: which upkeep runs by itself and when, stored in the
//! manifest's [`super::TableProperties`] and changed by `ALTER TABLE t SET (name = value)` /
//! `ALTER TABLE t RESET (name)`.
//!
//! This file is the data and its validation only: what the names mean, their defaults and
//! which values are possible. Deciding what to do from a table's state is
//! [`crate::maintain::plan`]; doing it is `crate::engine::maintain`.
//!
//! Every value is checked when it is set, so an impossible policy is an error at `ALTER
//! TABLE`, never a surprise in a background task later. A transaction carries the changes
//! (name, new value or reset), not the whole policy: two concurrent `ALTER TABLE ... SET`
//! of different names both take effect when the later one is rebased.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What runs by itself on a table (see `docs/maintenance.md` for the reasoning behind the
/// defaults). Every task is off until switched on; the thresholds have defaults a user
/// would pick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MaintenancePolicy {
    /// Index the fragments no segment owns (`OPTIMIZE INDEX ... APPEND`), merge segments
    /// and (when `auto_retrain_imbalance` is set) retrain, for every vector index.
    pub auto_index: bool,
    /// Append once the unindexed fragments hold at least this many live rows...
    pub auto_index_rows: u64,
    /// ...or once the oldest of them has waited this long (0: rows alone decide).
    pub auto_index_age_seconds: u64,
    /// Merge the newest segments when an index has more than this many (0: never).
    pub auto_merge_segments: u64,
    /// Retrain an index when its partition imbalance (largest partition's rows × partitions
    /// ÷ rows) exceeds this (0: never). Balanced k-means gives 2–4 on clustered data.
    pub auto_retrain_imbalance: f64,
    /// Compact runs of small fragments of similar size (and fragments heavy with deleted
    /// rows), never across index segment coverage, so indexes are translated, not rebuilt.
    pub auto_compact: bool,
    /// Compact once a run holds this many small fragments of one size tier.
    pub auto_compact_small_fragments: u64,
    /// Recluster the unindexed rows by this key (SQL, e.g. `ivf_partition(emb)`) just
    /// before they are indexed, so that rows of one partition sit together.
    pub auto_recluster: Option<String>,
    /// Vacuum down to this many versions (0: never vacuum).
    pub auto_vacuum_retain: u64,
    /// Files and versions younger than this stay at vacuum (a writer may still need them).
    pub auto_vacuum_grace_seconds: u64,
    /// Bytes of vectors or rows one task may hold or rewrite (a merge, a compaction run).
    pub auto_step_bytes: u64,
}

/// Defaults of [`MaintenancePolicy`].
pub mod defaults {
    /// Default `auto_index_rows`: append once 50,000 live rows are unindexed.
    pub const INDEX_ROWS: u64 = 50_000;
    /// Default `auto_index_age_seconds`: append once the oldest unindexed rows waited
    /// five minutes.
    pub const INDEX_AGE_SECONDS: u64 = 300;
    /// Default `auto_merge_segments`: merge once an index has more than 4 segments. Each
    /// segment is searched on its own, so on a table that keeps growing queries slow down
    /// with the count; a merge of the newest few is cheap (83K rows × 128 floats: 0.75 s in
    /// the streaming benchmark, where 4 in place of 8 lifted the last window's QPS by 41%).
    pub const MERGE_SEGMENTS: u64 = 4;
    /// Default `auto_compact_small_fragments`: compact a run of 16 small fragments of one
    /// size tier.
    pub const COMPACT_SMALL_FRAGMENTS: u64 = 16;
    /// Default `auto_vacuum_grace_seconds`: files and versions younger than 15 minutes
    /// stay.
    pub const VACUUM_GRACE_SECONDS: u64 = 15 * 60;
    /// Default `auto_step_bytes`: one task holds or rewrites at most 1 GiB.
    pub const STEP_BYTES: u64 = 1 << 30;
}

impl Default for MaintenancePolicy {
    fn default() -> Self {
        Self {
            auto_index: false,
            auto_index_rows: defaults::INDEX_ROWS,
            auto_index_age_seconds: defaults::INDEX_AGE_SECONDS,
            auto_merge_segments: defaults::MERGE_SEGMENTS,
            auto_retrain_imbalance: 0.0,
            auto_compact: false,
            auto_compact_small_fragments: defaults::COMPACT_SMALL_FRAGMENTS,
            auto_recluster: None,
            auto_vacuum_retain: 0,
            auto_vacuum_grace_seconds: defaults::VACUUM_GRACE_SECONDS,
            auto_step_bytes: defaults::STEP_BYTES,
        }
    }
}

/// The property names, in the order `\d` and `fragvec_properties` show them.
pub const NAMES: &[&str] = &[
    "auto_index",
    "auto_index_rows",
    "auto_index_age_seconds",
    "auto_merge_segments",
    "auto_retrain_imbalance",
    "auto_compact",
    "auto_compact_small_fragments",
    "auto_recluster",
    "auto_vacuum_retain",
    "auto_vacuum_grace_seconds",
    "auto_step_bytes",
];

/// A property that cannot be set as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyError {
    /// No property of that name.
    Unknown(String),
    /// The value is not possible for the property: (name, value, what it must be).
    Invalid(String, String, &'static str),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Unknown(name) => write!(f, "unknown table property '{name}'"),
            PolicyError::Invalid(name, value, must) => {
                write!(f, "table property {name} must be {must}, not '{value}'")
            }
        }
    }
}

impl std::error::Error for PolicyError {}

fn boolean(name: &str, value: &str) -> Result<bool, PolicyError> {
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(PolicyError::Invalid(
            name.into(),
            value.into(),
            "on or off (true / false)",
        )),
    }
}

/// An integer of at least `min`, or 0 when `zero_ok` (0 then means "never" or "off").
fn integer(
    name: &str,
    value: &str,
    min: u64,
    zero_ok: bool,
    must: &'static str,
) -> Result<u64, PolicyError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| *n >= min || (*n == 0 && zero_ok))
        .ok_or_else(|| PolicyError::Invalid(name.into(), value.into(), must))
}

impl MaintenancePolicy {
    /// Whether any task is switched on (the scheduler visits only such tables).
    pub fn is_active(&self) -> bool {
        self.auto_index
            || self.auto_compact
            || self.auto_recluster.is_some()
            || self.auto_vacuum_retain > 0
    }

    /// Sets `name` to `value` (text as written in SQL), or back to its default for `None`.
    pub fn set(&mut self, name: &str, value: Option<&str>) -> Result<(), PolicyError> {
        let d = MaintenancePolicy::default();
        let name = name.to_ascii_lowercase();
        let n = name.as_str();
        match (n, value) {
            ("auto_index", None) => self.auto_index = d.auto_index,
            ("auto_index", Some(v)) => self.auto_index = boolean(n, v)?,
            ("auto_index_rows", None) => self.auto_index_rows = d.auto_index_rows,
            ("auto_index_rows", Some(v)) => {
                self.auto_index_rows = integer(n, v, 1, false, "a positive integer")?
            }
            ("auto_index_age_seconds", None) => {
                self.auto_index_age_seconds = d.auto_index_age_seconds
            }
            ("auto_index_age_seconds", Some(v)) => {
                self.auto_index_age_seconds = integer(
                    n,
                    v,
                    1,
                    true,
                    "a positive number of seconds, or 0 for rows alone",
                )?
            }
            ("auto_merge_segments", None) => self.auto_merge_segments = d.auto_merge_segments,
            ("auto_merge_segments", Some(v)) => {
                self.auto_merge_segments =
                    integer(n, v, 2, true, "an integer of at least 2, or 0 for never")?
            }
            ("auto_retrain_imbalance", None) => {
                self.auto_retrain_imbalance = d.auto_retrain_imbalance
            }
            ("auto_retrain_imbalance", Some(v)) => {
                self.auto_retrain_imbalance = v
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && (*x == 0.0 || *x > 1.0))
                    .ok_or_else(|| {
                        PolicyError::Invalid(
                            n.into(),
                            v.into(),
                            "a number above 1 (partitions' imbalance), or 0 for never",
                        )
                    })?
            }
            ("auto_compact", None) => self.auto_compact = d.auto_compact,
            ("auto_compact", Some(v)) => self.auto_compact = boolean(n, v)?,
            ("auto_compact_small_fragments", None) => {
                self.auto_compact_small_fragments = d.auto_compact_small_fragments
            }
            ("auto_compact_small_fragments", Some(v)) => {
                self.auto_compact_small_fragments =
                    integer(n, v, 2, false, "an integer of at least 2")?
            }
            ("auto_recluster", None) => self.auto_recluster = None,
            ("auto_recluster", Some(v)) => {
                let key = v.trim();
                self.auto_recluster = match key.to_ascii_lowercase().as_str() {
                    "" | "off" | "none" => None,
                    _ => Some(key.to_string()),
                }
            }
            ("auto_vacuum_retain", None) => self.auto_vacuum_retain = d.auto_vacuum_retain,
            ("auto_vacuum_retain", Some(v)) => {
                self.auto_vacuum_retain = integer(
                    n,
                    v,
                    1,
                    true,
                    "a positive number of versions, or 0 for never",
                )?
            }
            ("auto_vacuum_grace_seconds", None) => {
                self.auto_vacuum_grace_seconds = d.auto_vacuum_grace_seconds
            }
            ("auto_vacuum_grace_seconds", Some(v)) => {
                self.auto_vacuum_grace_seconds =
                    integer(n, v, 0, true, "a non-negative number of seconds")?
            }
            ("auto_step_bytes", None) => self.auto_step_bytes = d.auto_step_bytes,
            ("auto_step_bytes", Some(v)) => {
                self.auto_step_bytes = integer(n, v, 1 << 20, false, "at least 1048576 (1 MiB)")?
            }
            _ => return Err(PolicyError::Unknown(name)),
        }
        Ok(())
    }

    /// Each property's name and value as text, in [`NAMES`] order.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let on = |b: bool| if b { "on" } else { "off" }.to_string();
        NAMES
            .iter()
            .map(|n| {
                let v = match *n {
                    "auto_index" => on(self.auto_index),
                    "auto_index_rows" => self.auto_index_rows.to_string(),
                    "auto_index_age_seconds" => self.auto_index_age_seconds.to_string(),
                    "auto_merge_segments" => self.auto_merge_segments.to_string(),
                    "auto_retrain_imbalance" => self.auto_retrain_imbalance.to_string(),
                    "auto_compact" => on(self.auto_compact),
                    "auto_compact_small_fragments" => self.auto_compact_small_fragments.to_string(),
                    "auto_recluster" => self.auto_recluster.clone().unwrap_or("off".into()),
                    "auto_vacuum_retain" => self.auto_vacuum_retain.to_string(),
                    "auto_vacuum_grace_seconds" => self.auto_vacuum_grace_seconds.to_string(),
                    "auto_step_bytes" => self.auto_step_bytes.to_string(),
                    other => unreachable!("NAMES lists {other} without a value"),
                };
                (*n, v)
            })
            .collect()
    }

    /// Applies `changes` in order (as [`Self::set`]).
    pub fn apply(&mut self, changes: &[PolicyChange]) -> Result<(), PolicyError> {
        for c in changes {
            self.set(&c.name, c.value.as_deref())?;
        }
        Ok(())
    }
}

/// One `SET (name = value)` (`value: Some`) or `RESET (name)` (`None`) of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChange {
    /// The policy property's name, e.g. `auto_index_rows`.
    pub name: String,
    /// Its new value as written in `SET`; `None` for `RESET` (back to its default).
    pub value: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(p: &mut MaintenancePolicy, n: &str, v: &str) -> Result<(), PolicyError> {
        p.set(n, Some(v))
    }

    #[test]
    fn every_name_sets_reads_back_and_resets() {
        let samples = [
            ("auto_index", "on", "on"),
            ("auto_index_rows", "1000", "1000"),
            ("auto_index_age_seconds", "0", "0"),
            ("auto_merge_segments", "4", "4"),
            ("auto_retrain_imbalance", "6.5", "6.5"),
            ("auto_compact", "true", "on"),
            ("auto_compact_small_fragments", "8", "8"),
            ("auto_recluster", "ivf_partition(emb)", "ivf_partition(emb)"),
            ("auto_vacuum_retain", "10", "10"),
            ("auto_vacuum_grace_seconds", "0", "0"),
            ("auto_step_bytes", "1048576", "1048576"),
        ];
        assert_eq!(samples.len(), NAMES.len());
        for (name, value, shown) in samples {
            let mut p = MaintenancePolicy::default();
            set(&mut p, &name.to_uppercase(), value).unwrap();
            let entries: std::collections::HashMap<_, _> = p.entries().into_iter().collect();
            assert_eq!(entries[name], shown, "{name}");
            p.set(name, None).unwrap();
            assert_eq!(p, MaintenancePolicy::default(), "{name} reset");
        }
    }

    #[test]
    fn impossible_values_and_unknown_names_are_refused_and_change_nothing() {
        let bad = [
            ("auto_index", "maybe"),
            ("auto_index_rows", "-1"),
            ("auto_index_rows", "0"),
            ("auto_index_rows", "1e3"),
            ("auto_merge_segments", "1"),
            ("auto_retrain_imbalance", "0.5"),
            ("auto_retrain_imbalance", "NaN"),
            ("auto_retrain_imbalance", "inf"),
            ("auto_compact_small_fragments", "1"),
            ("auto_vacuum_retain", "-3"),
            ("auto_step_bytes", "1000"),
        ];
        for (name, value) in bad {
            let mut p = MaintenancePolicy::default();
            let err = set(&mut p, name, value).unwrap_err();
            assert!(
                matches!(err, PolicyError::Invalid(..)),
                "{name}={value}: {err}"
            );
            assert!(err.to_string().contains(value), "{err}");
            assert_eq!(p, MaintenancePolicy::default());
        }
        let err = set(&mut MaintenancePolicy::default(), "auto_indx", "on").unwrap_err();
        assert_eq!(err, PolicyError::Unknown("auto_indx".into()));
    }

    #[test]
    fn changes_apply_in_order_and_an_empty_policy_is_inactive() {
        let mut p = MaintenancePolicy::default();
        assert!(!p.is_active());
        p.apply(&[
            PolicyChange {
                name: "auto_compact".into(),
                value: Some("on".into()),
            },
            PolicyChange {
                name: "auto_compact".into(),
                value: None,
            },
            PolicyChange {
                name: "auto_vacuum_retain".into(),
                value: Some("5".into()),
            },
        ])
        .unwrap();
        assert!(!p.auto_compact);
        assert!(p.is_active());
    }

    #[test]
    fn an_old_manifest_without_the_policy_reads_as_the_default() {
        let p: MaintenancePolicy = serde_json::from_str("{}").unwrap();
        assert_eq!(p, MaintenancePolicy::default());
        let p: MaintenancePolicy = serde_json::from_str(r#"{"auto_index": true}"#).unwrap();
        assert!(p.auto_index);
        assert_eq!(p.auto_index_rows, defaults::INDEX_ROWS);
    }
}

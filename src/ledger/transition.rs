//! Transitions and the checks that make a ledger trustworthy.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::{LedgerError, Result};

/// A fragment as a rewrite saw it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FragmentDigest {
    /// The fragment's id (a source's as it was, a destination's as the rewrite assigned it).
    pub id: u64,
    /// Rows in the fragment's data files, deleted ones included; at most `u32::MAX`.
    pub physical_rows: u64,
    /// Rows already deleted when the rewrite read the fragment (they do not move).
    pub deleted_rows: u64,
}

impl FragmentDigest {
    /// Rows not deleted when the rewrite read the fragment: the ones that moved.
    pub fn live_rows(&self) -> u64 {
        self.physical_rows - self.deleted_rows
    }
}

/// Mapping kinds this build understands; anything else is refused when the manifest is read.
pub const KNOWN_MAPPINGS: &[&str] = &["ordered_compaction", "stable_partition"];

/// How the rows of the sources map onto the destinations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mapping {
    /// Row order is kept: the surviving rows of the sources, in source order, fill the
    /// destinations in order. `removed[i]` is the deletion file of source `i` as the rewrite
    /// read it (`None`: no row removed); its rows are the ones that did not move.
    /// `removed_crc32c[i]` is that file's CRC32C when the source's manifest entry recorded
    /// one (empty for transitions written before checksums; such files are read unverified).
    OrderedCompaction {
        /// Per source, in source order: the path of its deletion file as the rewrite read it,
        /// relative to the table root (`None`: no row was deleted).
        removed: Vec<Option<String>>,
        /// Per source: the CRC32C of that deletion file, when recorded; empty when no source
        /// recorded one.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        removed_crc32c: Vec<Option<u32>>,
    },
    /// A stable partition: one label per physical source row in a row-map file.
    StablePartition {
        /// The row-map file's path, relative to the table root.
        row_map: String,
        /// The row-map file's size in bytes (readers fetch its tail from this length).
        size_bytes: u64,
    },
}

impl Mapping {
    /// The mapping's kind as the manifest's `kind` tag names it (one of [`KNOWN_MAPPINGS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Mapping::OrderedCompaction { .. } => "ordered_compaction",
            Mapping::StablePartition { .. } => "stable_partition",
        }
    }

    /// Files the mapping needs (kept by VACUUM while the transition is in the ledger).
    pub fn files(&self) -> Vec<&str> {
        match self {
            Mapping::OrderedCompaction { removed, .. } => {
                removed.iter().flatten().map(String::as_str).collect()
            }
            Mapping::StablePartition { row_map, .. } => vec![row_map.as_str()],
        }
    }
}

/// One rewrite: ordered sources replaced by ordered destinations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transition {
    /// Unique within the table's ledger, increasing in commit order.
    pub id: u64,
    /// The version the rewrite read.
    pub source_version: u64,
    /// The version that installed it.
    pub committed_version: u64,
    /// The fragments the rewrite replaced, in logical (scan) order, as it read them.
    pub sources: Vec<FragmentDigest>,
    /// The fragments the rewrite wrote, in logical order; they are born without deletions.
    pub destinations: Vec<FragmentDigest>,
    /// Where each live source row went among the destinations.
    pub mapping: Mapping,
}

impl Transition {
    /// Checks one transition on its own: digests, arity, row conservation.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| LedgerError::Transition {
            transition: self.id,
            reason,
        };
        if self.sources.is_empty() {
            return Err(bad("has no source fragments".into()));
        }
        for d in self.sources.iter().chain(&self.destinations) {
            if d.physical_rows > u32::MAX as u64 {
                return Err(bad(format!(
                    "fragment {} has {} rows, more than a row address can hold",
                    d.id, d.physical_rows
                )));
            }
        }
        for s in &self.sources {
            if s.deleted_rows > s.physical_rows {
                return Err(bad(format!(
                    "source {} deletes {} of {} rows",
                    s.id, s.deleted_rows, s.physical_rows
                )));
            }
        }
        for d in &self.destinations {
            if d.deleted_rows != 0 {
                return Err(bad(format!("destination {} was born with deletions", d.id)));
            }
        }
        // Each count is below 2^32 and there are far fewer than 2^32 of them: no overflow.
        let moved: u64 = self.sources.iter().map(FragmentDigest::live_rows).sum();
        let landed: u64 = self.destinations.iter().map(|d| d.physical_rows).sum();
        if moved != landed {
            return Err(bad(format!(
                "{moved} live source rows but {landed} destination rows"
            )));
        }
        if let Mapping::OrderedCompaction {
            removed,
            removed_crc32c,
        } = &self.mapping
        {
            if removed.len() != self.sources.len() {
                return Err(bad(format!(
                    "{} removed-row entries for {} sources",
                    removed.len(),
                    self.sources.len()
                )));
            }
            if !removed_crc32c.is_empty()
                && (removed_crc32c.len() != removed.len()
                    || removed_crc32c
                        .iter()
                        .zip(removed)
                        .any(|(crc, file)| crc.is_some() && file.is_none()))
            {
                return Err(bad(
                    "removed-row checksums do not match the removed-row files".into(),
                ));
            }
        }
        if let Mapping::OrderedCompaction { removed, .. } = &self.mapping {
            for (s, file) in self.sources.iter().zip(removed) {
                if file.is_none() != (s.deleted_rows == 0) {
                    return Err(bad(format!(
                        "source {} has {} deleted rows but {} deletion file",
                        s.id,
                        s.deleted_rows,
                        if file.is_some() { "a" } else { "no" }
                    )));
                }
            }
        }
        if matches!(self.mapping, Mapping::StablePartition { .. })
            && self.destinations.len() > u16::MAX as usize
        {
            return Err(bad("more than 65535 destinations".into()));
        }
        Ok(())
    }
}

/// Validates a whole ledger and returns the positions of its transitions in **lineage
/// order**: the transition that produced a fragment comes before the one that consumed it.
/// Rejects a fragment produced twice or consumed twice, a transition consuming its own
/// output, and cycles.
pub fn validate(ledger: &[Transition]) -> Result<Vec<usize>> {
    let mut producer: HashMap<u64, usize> = HashMap::new();
    let mut consumer: HashMap<u64, usize> = HashMap::new();
    let mut ids = HashMap::new();
    for (i, t) in ledger.iter().enumerate() {
        t.check()?;
        if ids.insert(t.id, i).is_some() {
            return Err(LedgerError::Invalid(format!(
                "transition id {} appears twice",
                t.id
            )));
        }
        for d in &t.destinations {
            if producer.insert(d.id, i).is_some() {
                return Err(LedgerError::Invalid(format!(
                    "fragment {} is produced by two transitions",
                    d.id
                )));
            }
        }
        for s in &t.sources {
            if consumer.insert(s.id, i).is_some() {
                return Err(LedgerError::Invalid(format!(
                    "fragment {} is consumed by two transitions",
                    s.id
                )));
            }
        }
    }
    // Kahn's algorithm over "t produced a fragment u consumes"; ties by list position so the
    // order is deterministic.
    let mut indegree = vec![0usize; ledger.len()];
    let mut edges: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, t) in ledger.iter().enumerate() {
        for s in &t.sources {
            if let Some(&p) = producer.get(&s.id) {
                if p == i {
                    return Err(LedgerError::Invalid(format!(
                        "transition {} consumes its own output {}",
                        t.id, s.id
                    )));
                }
                edges.entry(p).or_default().push(i);
                indegree[i] += 1;
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..ledger.len()).filter(|i| indegree[*i] == 0).collect();
    let mut order = Vec::with_capacity(ledger.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &j in edges.get(&i).map(Vec::as_slice).unwrap_or(&[]) {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                ready.insert(j);
            }
        }
    }
    if order.len() != ledger.len() {
        return Err(LedgerError::Invalid(
            "transitions form a cycle of fragment lineage".into(),
        ));
    }
    Ok(order)
}

/// Fragments reachable from `start` through the transitions of a valid ledger (`start`
/// included): the fragments that now hold rows that were in `start`.
pub fn descendants(ledger: &[Transition], start: &BTreeSet<u64>) -> BTreeSet<u64> {
    let mut reach = start.clone();
    let order = validate(ledger).unwrap_or_else(|_| (0..ledger.len()).collect());
    for i in order {
        let t = &ledger[i];
        if t.sources.iter().any(|s| reach.contains(&s.id)) {
            reach.extend(t.destinations.iter().map(|d| d.id));
        }
    }
    reach
}

/// The transitions some index segment still needs: those that moved rows of fragments its
/// file names (directly or through earlier transitions). The rest can be dropped.
pub fn needed(ledger: &[Transition], roots: &BTreeSet<u64>) -> Vec<Transition> {
    let reach = descendants(ledger, roots);
    ledger
        .iter()
        .filter(|t| t.sources.iter().any(|s| reach.contains(&s.id)))
        .cloned()
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn digest(id: u64, rows: u64, deleted: u64) -> FragmentDigest {
        FragmentDigest {
            id,
            physical_rows: rows,
            deleted_rows: deleted,
        }
    }

    pub fn ordered(id: u64, sources: &[(u64, u64)], dests: &[(u64, u64)]) -> Transition {
        Transition {
            id,
            source_version: 1,
            committed_version: 2,
            sources: sources.iter().map(|&(f, r)| digest(f, r, 0)).collect(),
            destinations: dests.iter().map(|&(f, r)| digest(f, r, 0)).collect(),
            mapping: Mapping::OrderedCompaction {
                removed: vec![None; sources.len()],
                removed_crc32c: vec![],
            },
        }
    }

    #[test]
    fn lineage_order_is_not_list_order() {
        // 1 -> 2 was listed after 2 -> 3.
        let ledger = vec![
            ordered(7, &[(2, 5)], &[(3, 5)]),
            ordered(3, &[(1, 5)], &[(2, 5)]),
        ];
        assert_eq!(validate(&ledger).unwrap(), vec![1, 0]);
    }

    #[test]
    fn conservation_producers_consumers_and_cycles_are_checked() {
        let lost = ordered(1, &[(1, 5)], &[(2, 4)]);
        assert!(
            validate(&[lost])
                .unwrap_err()
                .to_string()
                .contains("5 live")
        );
        let twice = vec![
            ordered(1, &[(1, 5)], &[(2, 5)]),
            ordered(2, &[(1, 5)], &[(3, 5)]),
        ];
        assert!(
            validate(&twice)
                .unwrap_err()
                .to_string()
                .contains("consumed by two")
        );
        let produced = vec![
            ordered(1, &[(1, 5)], &[(3, 5)]),
            ordered(2, &[(2, 5)], &[(3, 5)]),
        ];
        assert!(
            validate(&produced)
                .unwrap_err()
                .to_string()
                .contains("produced by two")
        );
        let cycle = vec![
            ordered(1, &[(1, 5)], &[(2, 5)]),
            ordered(2, &[(2, 5)], &[(1, 5)]),
        ];
        assert!(validate(&cycle).unwrap_err().to_string().contains("cycle"));
        let own = vec![ordered(1, &[(1, 5)], &[(1, 5)])];
        assert!(validate(&own).is_err());
        let mut wrong_arity = ordered(1, &[(1, 5)], &[(2, 5)]);
        wrong_arity.mapping = Mapping::OrderedCompaction {
            removed: vec![],
            removed_crc32c: vec![],
        };
        assert!(validate(&[wrong_arity]).is_err());
    }

    #[test]
    fn unknown_mapping_kinds_fail_to_parse() {
        let json = r#"{"id":1,"source_version":1,"committed_version":2,"sources":[],
            "destinations":[],"mapping":{"kind":"arbitrary_permutation"}}"#;
        assert!(serde_json::from_str::<Transition>(json).is_err());
    }
}

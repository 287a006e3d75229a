//! Vector-index metadata kept in the manifest: index definitions and their segments.
//!
//! A segment file physically holds the vectors of the fragments in its `fragment_bitmap`
//! (immutable provenance: a merged segment's bitmap is the union of its inputs). A fragment
//! rewritten in place after the segment was built goes to `invalidated_fragments`: the
//! segment's rows of that fragment are stale. A segment may answer only for its **ownership**:
//! `fragment_bitmap − invalidated_fragments`, further masked at query time by the fragments
//! still in the table and their deletion vectors. Ownerships of one index's segments are
//! disjoint, so no row is ever answered twice. This module is pure data and set arithmetic.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The metric an index (and a KNN query) orders by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Euclidean (L2) distance: smaller is nearer.
    L2,
    /// Cosine distance, 1 − cosine similarity: smaller is nearer.
    Cosine,
    /// The dot product: larger is nearer, so rows are ordered by its negative.
    Dot,
}

impl Metric {
    /// The metric named `s`, in any case: `l2` or `euclidean`, `cosine`, `dot` or
    /// `inner_product`; `None` for any other name.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "l2" | "euclidean" => Some(Metric::L2),
            "cosine" => Some(Metric::Cosine),
            "dot" | "inner_product" => Some(Metric::Dot),
            _ => None,
        }
    }

    /// The metric's canonical name (`l2`, `cosine`, `dot`), as the manifest records it.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::Cosine => "cosine",
            Metric::Dot => "dot",
        }
    }
}

/// An index's type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum IndexKind {
    /// IVF over full vectors: each partition holds its rows' floats.
    IvfFlat,
    /// IVF over product-quantized vectors: each partition holds its rows' PQ codes.
    IvfPq {
        /// Sub-vectors each vector is split into; each is coded in one byte.
        num_sub_vectors: u32,
    },
    /// Scalar codes and bound terms only: rows are re-ranked from the table's own floats.
    IvfSq,
}

impl IndexKind {
    /// The kind's SQL name, as in `USING IVF_FLAT` (`IVF_FLAT`, `IVF_PQ`, `IVF_SQ`).
    pub fn name(&self) -> &'static str {
        match self {
            IndexKind::IvfFlat => "IVF_FLAT",
            IndexKind::IvfPq { .. } => "IVF_PQ",
            IndexKind::IvfSq => "IVF_SQ",
        }
    }
}

/// A vector index as the manifest records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexDef {
    /// The index's name, unique among the table's indexes.
    pub name: String,
    /// The name of the vector column it indexes.
    pub column: String,
    /// The index type and its parameters.
    pub kind: IndexKind,
    /// The distance the index orders by; only a KNN query by the same metric uses it.
    pub metric: Metric,
    /// IVF partitions (centroids) of the trained model.
    pub num_partitions: u32,
    /// The trained model (centroids, PQ codebooks) shared by every segment; relative path.
    pub model_file: String,
    /// The model file's size in bytes.
    pub model_size_bytes: u64,
    /// The version the index was built from when it was created or last retrained.
    pub created_at_version: u64,
}

/// One segment file of an index, as the manifest records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexSegment {
    /// The segment's id, unique in the table (allocated from `next_segment_id`).
    pub id: u64,
    /// The name of the index it belongs to.
    pub index: String,
    /// Relative path of the segment file.
    pub file: String,
    /// The segment file's size in bytes.
    pub size_bytes: u64,
    /// Rows the file holds.
    pub rows: u64,
    /// The version the build read: the file holds that version's rows of `fragment_bitmap`.
    pub built_at_version: u64,
    /// Fragments whose rows the file physically holds.
    pub fragment_bitmap: BTreeSet<u64>,
    /// Fragments of the bitmap rewritten in place since: their rows here are stale.
    pub invalidated_fragments: BTreeSet<u64>,
}

impl IndexSegment {
    /// Fragments this segment may answer for (before masking by the current fragment list).
    pub fn ownership(&self) -> BTreeSet<u64> {
        self.fragment_bitmap
            .difference(&self.invalidated_fragments)
            .copied()
            .collect()
    }
}

/// Checks the invariants of one index's segments: disjoint ownerships. (Invalidated
/// fragments may lie outside the bitmap: they can be fragments that rewrites produced from
/// the bitmap's fragments, see [`crate::ledger::ownership`].)
pub fn validate_segments(index: &str, segments: &[&IndexSegment]) -> Result<(), String> {
    let mut owned: BTreeSet<u64> = BTreeSet::new();
    for s in segments {
        for f in s.ownership() {
            if !owned.insert(f) {
                return Err(format!(
                    "fragment {f} is owned by two segments of index '{index}'"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64, bitmap: &[u64], invalid: &[u64]) -> IndexSegment {
        IndexSegment {
            id,
            index: "i".into(),
            file: format!("s{id}"),
            size_bytes: 0,
            rows: 0,
            built_at_version: 1,
            fragment_bitmap: bitmap.iter().copied().collect(),
            invalidated_fragments: invalid.iter().copied().collect(),
        }
    }

    #[test]
    fn ownership_is_bitmap_minus_invalidated() {
        assert_eq!(seg(0, &[1, 2, 3], &[2]).ownership(), BTreeSet::from([1, 3]));
    }

    #[test]
    fn overlapping_ownership_is_rejected_but_invalidated_overlap_is_fine() {
        let a = seg(0, &[1, 2], &[2]);
        let b = seg(1, &[2, 3], &[]);
        assert!(validate_segments("i", &[&a, &b]).is_ok());
        let c = seg(2, &[1], &[]);
        assert!(
            validate_segments("i", &[&a, &c])
                .unwrap_err()
                .contains("fragment 1")
        );
    }
}

//! The id domains every layer shares, owned by the ground floor.
//!
//! * A **fragment id** names a fragment; it says nothing about scan order (the manifest's
//!   fragment list does) and changes at every rewrite (a rewrite's outputs get fresh ids).
//! * A **row address** is a physical row: `(fragment_id << 32) | offset`, the offset being
//!   the row's position in its fragment's files. Deleted rows keep their addresses.
//! * A **row id** is a stable row id (tables with `stable_row_ids`) or, without them, the
//!   row address. Under stable ids an update keeps the id while the address changes.
//! * A **version** numbers a manifest; versions grow by one per commit.
//!
//! The types below give each domain its own name, so a value of one is never passed where
//! another is meant; crossing domains takes a named function, never a cast. The on-disk
//! forms (manifests, segment files) store the plain `u64`; `#[serde(transparent)]` keeps
//! them byte-identical.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Row address of a physical row: `(fragment_id << 32) | offset`.
///
/// The offset must fit 32 bits (fragments hold at most `u32::MAX` rows; the manifest
/// reader rejects larger ones), so the packing is lossless.
#[inline]
pub fn row_address(fragment_id: u64, offset: u64) -> u64 {
    debug_assert!(
        offset <= u32::MAX as u64,
        "row offset {offset} exceeds 32 bits"
    );
    (fragment_id << 32) | offset
}

/// Splits a row address into `(fragment_id, offset)`.
#[inline]
pub fn split_row_address(addr: u64) -> (u64, u64) {
    (addr >> 32, addr & 0xFFFF_FFFF)
}

/// The id of a fragment (a name, not a position in scan order).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FragmentId(pub u64);

impl fmt::Display for FragmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A physical row: fragment and offset, packed as [`row_address`] describes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RowAddr(pub u64);

impl RowAddr {
    /// The address of the row at position `offset` in `fragment`'s files.
    #[inline]
    pub fn new(fragment: FragmentId, offset: u32) -> Self {
        RowAddr(row_address(fragment.0, offset as u64))
    }

    /// The fragment that holds the row (the address's high 32 bits).
    #[inline]
    pub fn fragment(self) -> FragmentId {
        FragmentId(self.0 >> 32)
    }

    /// The row's position in its fragment's files (the address's low 32 bits).
    #[inline]
    pub fn offset(self) -> u32 {
        (self.0 & 0xFFFF_FFFF) as u32
    }
}

impl fmt::Display for RowAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.fragment(), self.offset())
    }
}

/// A stable row id (or, on tables without stable ids, the row's address).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RowId(pub u64);

/// A table version (a manifest's number).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Version(pub u64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_addresses_split_back() {
        let a = row_address(7, 12345);
        assert_eq!(split_row_address(a), (7, 12345));
        let r = RowAddr::new(FragmentId(7), 12345);
        assert_eq!((r.fragment(), r.offset()), (FragmentId(7), 12345));
        assert_eq!(r.0, a);
        assert_eq!(r.to_string(), "(7, 12345)");
    }

    #[test]
    fn ids_serialize_as_plain_numbers() {
        assert_eq!(serde_json::to_string(&FragmentId(3)).unwrap(), "3");
        assert_eq!(serde_json::to_string(&Version(9)).unwrap(), "9");
        let back: RowAddr = serde_json::from_str("4294967297").unwrap();
        assert_eq!((back.fragment(), back.offset()), (FragmentId(1), 1));
    }
}

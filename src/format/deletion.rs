//! Deletion vectors: which physical offsets of one fragment are deleted.
//!
//! On disk: an 8-byte magic, the fragment id and row count it belongs to (little-endian u64s),
//! then a portable roaring bitmap. The header lets a reader refuse a file that was copied to the
//! wrong fragment instead of silently hiding the wrong rows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use roaring::RoaringBitmap;

use super::error::{FormatError, Result};

/// Bytes of decoded deletion vectors a [`DeletionCache`] holds before it starts over.
const CACHE_BYTES: usize = 64 << 20;

/// Decoded deletion vectors of one database, so a query reads each deletion file once per
/// session instead of once per query (on object storage, one request each). Deletion files
/// are immutable and uniquely named, and the key also holds what decoding checked (the
/// fragment, its rows, the checksum), so an entry never goes stale. Bounded by bytes: past
/// `CACHE_BYTES` it starts over.
#[derive(Debug, Default)]
pub struct DeletionCache {
    state: Mutex<(HashMap<String, Arc<RoaringBitmap>>, usize)>,
}

impl DeletionCache {
    /// The decoded deletion vector cached under `key` (the file and what decoding checked),
    /// if the cache holds it.
    pub fn get(&self, key: &str) -> Option<Arc<RoaringBitmap>> {
        self.state
            .lock()
            .expect("deletion cache")
            .0
            .get(key)
            .cloned()
    }

    /// Caches `deleted` under `key`, first emptying the cache if it would pass its byte
    /// budget; a vector larger than the whole budget is not kept.
    pub fn insert(&self, key: String, deleted: Arc<RoaringBitmap>) {
        let size = deleted.serialized_size();
        let mut state = self.state.lock().expect("deletion cache");
        if state.1 + size > CACHE_BYTES {
            *state = Default::default();
        }
        if size <= CACHE_BYTES {
            state.1 += size;
            state.0.insert(key, deleted);
        }
    }
}

const MAGIC: &[u8; 8] = b"FVDELV01";
const HEADER_LEN: usize = 8 + 8 + 8;

/// The deletion file for fragment `fragment_id` of `physical_rows` rows whose deleted
/// offsets are `deleted`: the header, then the portable roaring bitmap.
pub fn encode(fragment_id: u64, physical_rows: u64, deleted: &RoaringBitmap) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + deleted.serialized_size());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&fragment_id.to_le_bytes());
    out.extend_from_slice(&physical_rows.to_le_bytes());
    deleted
        .serialize_into(&mut out)
        .expect("writing to a Vec cannot fail");
    out
}

/// Decodes and checks a deletion file against the fragment that references it.
pub fn decode(
    bytes: &[u8],
    path: &str,
    fragment_id: u64,
    physical_rows: u64,
    expected_deleted: u64,
) -> Result<RoaringBitmap> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return Err(FormatError::corrupt(path, "not a fragvec deletion file"));
    }
    let id = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let rows = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if id != fragment_id || rows != physical_rows {
        return Err(FormatError::corrupt(
            path,
            format!(
                "deletion file is for fragment {id} with {rows} rows, \
                 referenced by fragment {fragment_id} with {physical_rows} rows"
            ),
        ));
    }
    let bitmap = RoaringBitmap::deserialize_from(&bytes[HEADER_LEN..])
        .map_err(|e| FormatError::corrupt(path, format!("bad roaring bitmap: {e}")))?;
    if bitmap.len() != expected_deleted {
        return Err(FormatError::corrupt(
            path,
            format!(
                "holds {} deletions, manifest says {expected_deleted}",
                bitmap.len()
            ),
        ));
    }
    if bitmap.max().is_some_and(|m| u64::from(m) >= physical_rows) {
        return Err(FormatError::corrupt(
            path,
            "deletes an offset past the fragment's end",
        ));
    }
    Ok(bitmap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fuzz::{arbitrary_with_magic, mutated};
    use proptest::prelude::*;

    /// Whatever decodes must honour the checks the caller relies on.
    fn check_decoded(bytes: &[u8], fragment_id: u64, physical_rows: u64, expected: u64) {
        if let Ok(bm) = decode(bytes, "d", fragment_id, physical_rows, expected) {
            assert_eq!(bm.len(), expected);
            assert!(bm.max().is_none_or(|m| u64::from(m) < physical_rows));
        }
    }

    fn valid_file() -> impl Strategy<Value = (Vec<u8>, u64, u64)> {
        (
            0u64..1000,
            prop::collection::btree_set(0u32..70_000, 0..300),
            any::<bool>(),
        )
            .prop_map(|(id, offsets, dense)| {
                let mut bm: RoaringBitmap = offsets.into_iter().collect();
                if dense {
                    // A bitmap container, not just array containers.
                    bm.insert_range(100_000..105_000);
                }
                let rows = bm.max().map_or(10, |m| u64::from(m) + 1);
                (encode(id, rows, &bm), id, rows)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_decode_never_panics_on_arbitrary_bytes(
            bytes in arbitrary_with_magic(MAGIC),
            rows in 0u64..200_000,
            expected in 0u64..100,
        ) {
            check_decoded(&bytes, 0, rows, expected);
            // The header's own ids, so the bitmap parser sees the rest.
            if bytes.len() >= HEADER_LEN {
                let id = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
                let rows = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
                check_decoded(&bytes, id, rows, expected);
            }
        }

        #[test]
        fn prop_decode_never_panics_on_mutated_valid_input(
            (valid, id, rows, bytes) in valid_file()
                .prop_flat_map(|(v, id, rows)| (Just(v.clone()), Just(id), Just(rows), mutated(v))),
        ) {
            let count = RoaringBitmap::deserialize_from(&valid[HEADER_LEN..]).unwrap().len();
            check_decoded(&bytes, id, rows, count);
        }
    }

    #[test]
    fn round_trip() {
        let bm: RoaringBitmap = [1u32, 5, 99].into_iter().collect();
        let bytes = encode(3, 100, &bm);
        assert_eq!(decode(&bytes, "d", 3, 100, 3).unwrap(), bm);
    }

    #[test]
    fn rejects_wrong_fragment_truncation_and_garbage() {
        let bm: RoaringBitmap = [1u32, 5].into_iter().collect();
        let bytes = encode(3, 100, &bm);
        assert!(
            decode(&bytes, "d", 4, 100, 2)
                .unwrap_err()
                .to_string()
                .contains("fragment 3")
        );
        assert!(decode(&bytes[..bytes.len() - 3], "d", 3, 100, 2).is_err());
        assert!(decode(b"garbage", "d", 3, 100, 2).is_err());
        assert!(decode(&bytes, "d", 3, 100, 5).is_err());
        assert!(
            decode(&encode(3, 4, &bm), "d", 3, 4, 2)
                .unwrap_err()
                .to_string()
                .contains("past")
        );
    }
}

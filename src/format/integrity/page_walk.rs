//! Finding the pages of a Parquet column chunk from its bytes, so the writer can checksum
//! each page while the row group is still in memory (the page locations the Parquet writer
//! keeps are only published with the footer, after the bytes have gone to storage).
//!
//! A column chunk is a sequence of pages, each a Thrift-compact `PageHeader` followed by
//! `compressed_page_size` bytes. This module parses just enough of the header to find its
//! end and that size (field 3), skipping every other field generically.
//!
//! Invariants: the lengths returned sum to the chunk's length exactly, or the walk fails.
//! The writer cross-checks the result against the offset index Parquet writes into the
//! footer (see [`super::units`]), so a walker bug fails the write instead of recording a
//! wrong checksum. Pure: no IO, bounded recursion, never panics on arbitrary bytes.

/// Compact-protocol type ids.
mod ty {
    pub const BOOL_TRUE: u8 = 1;
    pub const BOOL_FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
}

/// Nesting a page header never needs (statistics inside a data page header are depth 2).
const MAX_DEPTH: usize = 16;
/// `PageHeader.compressed_page_size`.
const COMPRESSED_PAGE_SIZE_FIELD: i16 = 3;

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or("page header runs past the column chunk")?;
        self.pos += 1;
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        let end = u64::try_from(self.pos)
            .ok()
            .and_then(|p| p.checked_add(n))
            .filter(|&e| e <= self.bytes.len() as u64)
            .ok_or("page header runs past the column chunk")?;
        self.pos = end as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                break;
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 64 bits in a page header".into())
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// Skips one value of compact type `t`.
    fn skip_value(&mut self, t: u8, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("page header nests too deeply".into());
        }
        match t {
            ty::BOOL_TRUE | ty::BOOL_FALSE => Ok(()),
            ty::BYTE => self.skip(1),
            ty::I16 | ty::I32 | ty::I64 => self.varint().map(drop),
            ty::DOUBLE => self.skip(8),
            ty::BINARY => {
                let n = self.varint()?;
                self.skip(n)
            }
            ty::LIST | ty::SET => {
                let header = self.byte()?;
                let elem = header & 0x0f;
                let n = match header >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.skip_elements(elem, n, depth)
            }
            ty::MAP => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let kinds = self.byte()?;
                for _ in 0..n {
                    self.skip_element(kinds >> 4, depth)?;
                    self.skip_element(kinds & 0x0f, depth)?;
                }
                Ok(())
            }
            ty::STRUCT => self.skip_struct(depth + 1),
            other => Err(format!("unknown Thrift type {other} in a page header")),
        }
    }

    /// Inside a collection a boolean takes a byte (as a field it is in the type nibble).
    fn skip_element(&mut self, t: u8, depth: usize) -> Result<(), String> {
        match t {
            ty::BOOL_TRUE | ty::BOOL_FALSE => self.skip(1),
            _ => self.skip_value(t, depth + 1),
        }
    }

    fn skip_elements(&mut self, t: u8, n: u64, depth: usize) -> Result<(), String> {
        // Every element takes at least one byte except empty structs' stop byte, which also
        // takes one: a count larger than the bytes left is corrupt, not a long loop.
        if n > (self.bytes.len() - self.pos) as u64 {
            return Err("collection longer than the page header".into());
        }
        for _ in 0..n {
            self.skip_element(t, depth)?;
        }
        Ok(())
    }

    fn skip_struct(&mut self, depth: usize) -> Result<(), String> {
        let mut last_id = 0i16;
        loop {
            let Some((_, t)) = self.field_header(&mut last_id)? else {
                return Ok(());
            };
            self.skip_value(t, depth)?;
        }
    }

    /// The next field's id and type, or `None` at the struct's stop byte.
    fn field_header(&mut self, last_id: &mut i16) -> Result<Option<(i16, u8)>, String> {
        let b = self.byte()?;
        if b == 0 {
            return Ok(None);
        }
        let t = b & 0x0f;
        let id = match b >> 4 {
            0 => i16::try_from(self.zigzag()?).map_err(|_| "bad field id in a page header")?,
            delta => last_id
                .checked_add(i16::from(delta))
                .ok_or("bad field id in a page header")?,
        };
        *last_id = id;
        Ok(Some((id, t)))
    }
}

/// The length of the page header at the start of `bytes` and the page's compressed size.
fn page_header(bytes: &[u8]) -> Result<(u64, u64), String> {
    let mut c = Cursor { bytes, pos: 0 };
    let mut last_id = 0i16;
    let mut compressed = None;
    while let Some((id, t)) = c.field_header(&mut last_id)? {
        if id == COMPRESSED_PAGE_SIZE_FIELD && t == ty::I32 {
            let size = c.zigzag()?;
            compressed = Some(u64::try_from(size).map_err(|_| "negative page size")?);
        } else {
            c.skip_value(t, 1)?;
        }
    }
    let compressed = compressed.ok_or("page header without compressed_page_size")?;
    Ok((c.pos as u64, compressed))
}

/// The byte length of each page (header included) of a column chunk, in order.
pub fn page_lengths(chunk: &[u8]) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < chunk.len() {
        let (header, body) = page_header(&chunk[at..])?;
        let len = header
            .checked_add(body)
            .filter(|&l| l <= (chunk.len() - at) as u64)
            .ok_or("page runs past the end of its column chunk")?;
        out.push(len);
        at += len as usize;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fuzz::mutated;
    use proptest::prelude::*;

    /// A header with an i32 type, sizes, a nested struct holding binary statistics and a
    /// list, in compact encoding.
    fn header(compressed: i32) -> Vec<u8> {
        let zz = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
        let mut out = Vec::new();
        let varint = |out: &mut Vec<u8>, mut v: u64| {
            while v >= 0x80 {
                out.push(v as u8 | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        };
        out.push(0x15); // field 1, i32
        varint(&mut out, zz(0));
        out.push(0x15); // field 2, i32
        varint(&mut out, zz(i64::from(compressed) * 2));
        out.push(0x15); // field 3, i32
        varint(&mut out, zz(i64::from(compressed)));
        out.push(0x2c); // field 5, struct
        out.push(0x15); // field 1, i32
        varint(&mut out, zz(100));
        out.push(0x4c); // field 5, struct (statistics)
        out.push(0x18); // field 1, binary
        varint(&mut out, 3);
        out.extend_from_slice(b"abc");
        out.push(0x11); // field 2, bool true
        out.push(0x19); // field 3, list
        out.push(0x25); // 2 × i32
        varint(&mut out, zz(7));
        varint(&mut out, zz(-7));
        out.push(0); // end statistics
        out.push(0); // end data page header
        out.push(0); // end page header
        out
    }

    fn chunk(sizes: &[i32]) -> (Vec<u8>, Vec<u64>) {
        let mut bytes = Vec::new();
        let mut lengths = Vec::new();
        for &s in sizes {
            let h = header(s);
            lengths.push((h.len() + s as usize) as u64);
            bytes.extend_from_slice(&h);
            bytes.extend(std::iter::repeat_n(0xAB, s as usize));
        }
        (bytes, lengths)
    }

    #[test]
    fn walks_pages_of_a_hand_made_chunk() {
        let (bytes, lengths) = chunk(&[10, 0, 300, 1]);
        assert_eq!(page_lengths(&bytes).unwrap(), lengths);
        assert_eq!(page_lengths(&[]).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn refuses_truncated_and_overlong_pages() {
        let (bytes, _) = chunk(&[10, 20]);
        assert!(page_lengths(&bytes[..bytes.len() - 1]).is_err());
        assert!(page_lengths(&bytes[..5]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(page_lengths(&long).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_walk_never_panics_and_tiles_what_it_accepts(
            bytes in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..300),
                prop::collection::vec(0i32..200, 0..6).prop_flat_map(|s| mutated(chunk(&s).0)),
            ],
        ) {
            if let Ok(lengths) = page_lengths(&bytes) {
                prop_assert_eq!(lengths.iter().sum::<u64>(), bytes.len() as u64);
            }
        }
    }
}

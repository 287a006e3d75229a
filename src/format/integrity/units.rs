//! The checksum table of a data file: which byte ranges ("units") carry a CRC32C, and the
//! arithmetic that lets a range reader verify exactly the units it fetched.
//!
//! A data file's units tile it exactly, in file order:
//!
//! ```text
//! [0, 4)                    the "PAR1" magic (its checksum is a constant)
//! per row group, per column chunk, in file order:
//!   [chunk start, first page)   the dictionary page, when the chunk has one
//!   each data page               from the offset index (header included)
//! [footer offset, file size)   page indexes, metadata (holding the page table), trailer
//! ```
//!
//! These are exactly the ranges the Parquet reader asks for: the footer once, whole column
//! chunks for a scan, the dictionary page plus the selected pages for a read by offsets.
//! A request that is not a union of whole units is widened to the units it touches, so
//! every byte handed to the decoder has been checked.
//!
//! The page checksums live in the Parquet footer's key-value metadata under
//! [`PAGE_CRC_KEY`] (hex, one `u32` per page unit, row group by row group, column by
//! column); the footer's own checksum and offset live in the manifest's data-file entry, so
//! the table is trusted only after the footer it sits in was verified. Pure: no IO.

use std::ops::Range;

use datafusion::parquet::file::metadata::ParquetMetaData;

/// Key of the page checksum table in the Parquet footer's key-value metadata.
pub const PAGE_CRC_KEY: &str = "fragvec.page_crc32c";
const MAGIC: &[u8; 4] = b"PAR1";

/// One checksummed byte range of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Offset of the unit's first byte in the file.
    pub start: u64,
    /// Offset one past the unit's last byte (exclusive).
    pub end: u64,
    /// The CRC32C of bytes `start..end`.
    pub crc32c: u32,
}

/// A column chunk's byte range and its pages' `(offset, length)` from the offset index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkLayout {
    /// Offset of the chunk's first byte in the file (its dictionary page, if any).
    pub start: u64,
    /// The chunk's length in bytes.
    pub len: u64,
    /// Each data page's `(file offset, length in bytes)`, header included, in file order.
    pub pages: Vec<(u64, u64)>,
}

impl ChunkLayout {
    /// The chunk's units (a dictionary region first when the first page does not start the
    /// chunk), checked to tile the chunk exactly.
    pub fn unit_ranges(&self) -> Result<Vec<Range<u64>>, String> {
        let end = self
            .start
            .checked_add(self.len)
            .ok_or("column chunk range overflows")?;
        let mut out = Vec::with_capacity(self.pages.len() + 1);
        let mut at = self.start;
        if let Some(&(first, _)) = self.pages.first()
            && first > at
        {
            out.push(at..first);
            at = first;
        }
        for &(offset, len) in &self.pages {
            if offset != at || len == 0 {
                return Err(format!(
                    "page at {offset} (length {len}) does not follow the previous one at {at}"
                ));
            }
            at = offset.checked_add(len).ok_or("page range overflows")?;
            out.push(offset..at);
        }
        if at != end {
            return Err(format!("pages end at {at}, their column chunk at {end}"));
        }
        Ok(out)
    }
}

/// The layout of every column chunk of a file, in file order, from its metadata (which must
/// carry the offset index).
pub fn chunk_layouts(metadata: &ParquetMetaData) -> Result<Vec<ChunkLayout>, String> {
    let offsets = metadata
        .offset_index()
        .ok_or("the file has no offset index")?;
    if offsets.len() != metadata.num_row_groups() {
        return Err("offset index and row groups disagree".into());
    }
    let mut out = Vec::new();
    for (rg, index) in metadata.row_groups().iter().zip(offsets) {
        if index.len() != rg.columns().len() {
            return Err("offset index and column chunks disagree".into());
        }
        for (column, pages) in rg.columns().iter().zip(index) {
            let (start, len) = column.byte_range();
            let pages = pages
                .page_locations()
                .iter()
                .map(|p| {
                    let offset = u64::try_from(p.offset).map_err(|_| "negative page offset")?;
                    let len =
                        u64::try_from(p.compressed_page_size).map_err(|_| "negative page size")?;
                    Ok((offset, len))
                })
                .collect::<Result<Vec<_>, String>>()?;
            out.push(ChunkLayout { start, len, pages });
        }
    }
    Ok(out)
}

/// Hex form of a page checksum table.
pub fn encode_crcs(crcs: &[u32]) -> String {
    let mut out = String::with_capacity(crcs.len() * 8);
    for c in crcs {
        out.push_str(&format!("{c:08x}"));
    }
    out
}

/// Parses a footer's [`PAGE_CRC_KEY`] value back into its checksums, one per 8 hex
/// digits; an error when the text is not a whole number of hex words.
pub fn decode_crcs(text: &str) -> Result<Vec<u32>, String> {
    if !text.len().is_multiple_of(8) || !text.is_ascii() {
        return Err("page checksum table is not a list of 8-digit hex words".into());
    }
    (0..text.len())
        .step_by(8)
        .map(|i| {
            u32::from_str_radix(&text[i..i + 8], 16)
                .map_err(|_| "page checksum table is not hex".to_string())
        })
        .collect()
}

/// Every unit of one file, sorted and tiling `[0, file size)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitTable {
    units: Vec<Unit>,
}

impl UnitTable {
    /// Pairs the chunks' units with `crcs` (one per unit, in file order) and adds the magic
    /// and the footer. Fails unless the units tile the file exactly.
    pub fn new(
        chunks: &[ChunkLayout],
        crcs: &[u32],
        footer: Range<u64>,
        footer_crc32c: u32,
    ) -> Result<Self, String> {
        let mut units = vec![Unit {
            start: 0,
            end: MAGIC.len() as u64,
            crc32c: crc32c::crc32c(MAGIC),
        }];
        let mut crcs = crcs.iter();
        for chunk in chunks {
            for r in chunk.unit_ranges()? {
                let &crc32c = crcs.next().ok_or("fewer page checksums than pages")?;
                units.push(Unit {
                    start: r.start,
                    end: r.end,
                    crc32c,
                });
            }
        }
        if crcs.next().is_some() {
            return Err("more page checksums than pages".into());
        }
        units.push(Unit {
            start: footer.start,
            end: footer.end,
            crc32c: footer_crc32c,
        });
        for pair in units.windows(2) {
            if pair[0].end != pair[1].start {
                return Err(format!(
                    "bytes {}..{} belong to no page",
                    pair[0].end, pair[1].start
                ));
            }
        }
        Ok(Self { units })
    }

    /// The units, sorted by offset and tiling the file from byte 0 to its end.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    fn file_len(&self) -> u64 {
        self.units.last().map_or(0, |u| u.end)
    }

    /// Indexes of the units overlapping `range` (non-empty, inside the file).
    fn touching(&self, range: &Range<u64>) -> Result<Range<usize>, String> {
        if range.start >= range.end || range.end > self.file_len() {
            return Err(format!(
                "bytes {range:?} are not a range of the {}-byte file",
                self.file_len()
            ));
        }
        let first = self.units.partition_point(|u| u.end <= range.start);
        let last = self.units.partition_point(|u| u.start < range.end);
        Ok(first..last)
    }

    /// The smallest range of whole units covering `range`: what to fetch to verify it.
    pub fn widen(&self, range: &Range<u64>) -> Result<Range<u64>, String> {
        let i = self.touching(range)?;
        Ok(self.units[i.start].start..self.units[i.end - 1].end)
    }

    /// Checks `bytes`, fetched from `start`, which must be whole units (as
    /// [`widen`](Self::widen) returns). The error names the first unit that fails.
    pub fn verify(&self, start: u64, bytes: &[u8]) -> Result<(), String> {
        let range = start..start + bytes.len() as u64;
        let i = self.touching(&range)?;
        if self.units[i.start].start != range.start || self.units[i.end - 1].end != range.end {
            return Err(format!("bytes {range:?} are not whole checksummed pages"));
        }
        for u in &self.units[i] {
            let slice = &bytes[(u.start - start) as usize..(u.end - start) as usize];
            let found = crc32c::crc32c(slice);
            if found != u.crc32c {
                return Err(format!(
                    "CRC32C of bytes {}..{} is {found:#010x}, the file's checksum table says {:#010x}",
                    u.start, u.end, u.crc32c
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Two chunks: one with a dictionary page and two pages, one with a single page; a
    /// footer after them.
    fn layout() -> (Vec<ChunkLayout>, Range<u64>) {
        let chunks = vec![
            ChunkLayout {
                start: 4,
                len: 30,
                pages: vec![(10, 12), (22, 12)],
            },
            ChunkLayout {
                start: 34,
                len: 6,
                pages: vec![(34, 6)],
            },
        ];
        (chunks, 40..50)
    }

    fn file() -> Vec<u8> {
        let mut f = b"PAR1".to_vec();
        f.extend((4u8..50).map(|b| b.wrapping_mul(37)));
        f
    }

    fn table_for(bytes: &[u8]) -> UnitTable {
        let (chunks, footer) = layout();
        let crcs: Vec<u32> = chunks
            .iter()
            .flat_map(|c| c.unit_ranges().unwrap())
            .map(|r| crc32c::crc32c(&bytes[r.start as usize..r.end as usize]))
            .collect();
        let footer_crc = crc32c::crc32c(&bytes[footer.start as usize..]);
        UnitTable::new(&chunks, &crcs, footer, footer_crc).unwrap()
    }

    #[test]
    fn units_tile_the_file_with_the_dictionary_region_first() {
        let t = table_for(&file());
        let ranges: Vec<_> = t.units().iter().map(|u| u.start..u.end).collect();
        assert_eq!(ranges, vec![0..4, 4..10, 10..22, 22..34, 34..40, 40..50]);
    }

    #[test]
    fn widen_covers_whole_units_and_is_exact_on_unit_requests() {
        let t = table_for(&file());
        assert_eq!(t.widen(&(10..22)).unwrap(), 10..22);
        assert_eq!(t.widen(&(4..34)).unwrap(), 4..34);
        assert_eq!(t.widen(&(11..12)).unwrap(), 10..22);
        assert_eq!(t.widen(&(21..23)).unwrap(), 10..34);
        assert_eq!(t.widen(&(48..50)).unwrap(), 40..50);
        assert!(t.widen(&(48..51)).is_err());
        assert!(t.widen(&(5..5)).is_err());
    }

    #[test]
    fn verify_names_the_damaged_unit() {
        let bytes = file();
        let t = table_for(&bytes);
        assert!(t.verify(4, &bytes[4..34]).is_ok());
        let mut bad = bytes.clone();
        bad[25] ^= 0x10;
        let e = t.verify(4, &bad[4..34]).unwrap_err();
        assert!(e.contains("22..34"), "{e}");
        assert!(
            t.verify(10, &bad[10..22]).is_ok(),
            "other pages stay readable"
        );
        assert!(t.verify(5, &bytes[5..22]).unwrap_err().contains("whole"));
    }

    #[test]
    fn table_and_layout_must_agree() {
        let (chunks, footer) = layout();
        assert!(UnitTable::new(&chunks, &[0; 3], footer.clone(), 0).is_err());
        assert!(UnitTable::new(&chunks, &[0; 5], footer.clone(), 0).is_err());
        assert!(UnitTable::new(&chunks, &[0; 4], 41..50, 0).is_err(), "gap");
        let mut gap = chunks.clone();
        gap[0].pages[1].0 = 23;
        assert!(UnitTable::new(&gap, &[0; 4], footer, 0).is_err());
    }

    #[test]
    fn crc_tables_round_trip_and_refuse_garbage() {
        let crcs = vec![0, 1, u32::MAX, 0xdead_beef];
        assert_eq!(decode_crcs(&encode_crcs(&crcs)).unwrap(), crcs);
        assert_eq!(decode_crcs("").unwrap(), Vec::<u32>::new());
        assert!(decode_crcs("0000000").is_err());
        assert!(decode_crcs("0000000g").is_err());
        assert!(decode_crcs("é0000000").is_err());
    }

    /// A naive reference: the units a byte range touches, by scanning every unit.
    fn naive_widen(t: &UnitTable, r: &Range<u64>) -> Option<Range<u64>> {
        let hit: Vec<&Unit> = t
            .units()
            .iter()
            .filter(|u| u.start < r.end && r.start < u.end)
            .collect();
        Some(hit.first()?.start..hit.last()?.end)
    }

    proptest! {
        #[test]
        fn prop_widen_matches_a_scan_of_every_unit(a in 0u64..52, b in 0u64..52) {
            let t = table_for(&file());
            let r = a.min(b)..a.max(b);
            match t.widen(&r) {
                Ok(w) => {
                    prop_assert_eq!(Some(w.clone()), naive_widen(&t, &r));
                    prop_assert!(w.start <= r.start && r.end <= w.end);
                }
                Err(_) => prop_assert!(r.is_empty() || r.end > 50),
            }
        }

        #[test]
        fn prop_crc_table_decode_never_panics(text in ".{0,40}") {
            let _ = decode_crcs(&text);
        }
    }
}

//! Byte-level pieces of the row-map file: varints, a bounds-checked reader, the checksum,
//! bit packing, and the encoding of one block of labels. Nothing here knows about footers
//! or files; `writer.rs` and `reader.rs` put the pieces together (the object-store side lives
//! in `format::row_map_file`).

use super::block::{BlockLabels, bitset_words};
use super::{Result, RowMapError};

// ---------------------------------------------------------------------------------------
// Varints and the reader

/// Appends `v` as an unsigned LEB128 varint (7 bits per byte, low bits first).
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encoded size of `v` as a varint.
pub(super) fn varint_len(v: u64) -> usize {
    // One byte per started group of 7 significant bits; zero still takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A cursor over untrusted bytes: every read is bounds-checked and names what it was
/// reading, so truncation errors say which field ran out.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    context: &'static str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8], context: &'static str) -> Self {
        Self {
            bytes,
            pos: 0,
            context,
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(RowMapError::Truncated {
                what: format!("{} {what}", self.context),
                needed: n as u64,
                available: self.remaining() as u64,
            });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(super) fn magic(&mut self, what: &'static str) -> Result<[u8; 4]> {
        self.array(what)
    }

    pub(super) fn varint(&mut self, what: &'static str) -> Result<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = self.u8(what)?;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte may only carry the top bit of a u64.
            if i == 9 && bits > 1 {
                break;
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(RowMapError::Corrupt(format!(
            "{} {what}: varint longer than 64 bits",
            self.context
        )))
    }

    /// A varint that must fit a u32 (counts, block sizes).
    pub(super) fn varint_u32(&mut self, what: &'static str) -> Result<u32> {
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| {
            RowMapError::Corrupt(format!("{} {what}: {v} does not fit 32 bits", self.context))
        })
    }

    /// All bytes must have been consumed: a length field that disagrees with the data is
    /// corruption, not padding.
    pub(super) fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(RowMapError::Corrupt(format!(
                "{}: {} unexpected trailing bytes",
                self.context,
                self.remaining()
            )));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Checksum

/// The checksum format 2 files use: CRC32C (hardware accelerated by the `crc32c` crate).
pub(super) fn checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Which checksum a file of a given format version carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Digest {
    /// Format 1: [`legacy_digest`].
    Legacy,
    /// Format 2 on: [`checksum`] (CRC32C).
    Crc32c,
}

impl Digest {
    pub(super) fn of_version(version: u16) -> Self {
        if version == 1 {
            Digest::Legacy
        } else {
            Digest::Crc32c
        }
    }

    pub(super) fn sum(self, bytes: &[u8]) -> u32 {
        match self {
            Digest::Legacy => legacy_digest(bytes),
            Digest::Crc32c => checksum(bytes),
        }
    }
}

/// The 32-bit digest of format 1 files, kept so they stay readable (not cryptographic).
///
/// Four independent 64-bit multiply-rotate lanes over 32-byte stripes, then a tail and an
/// avalanche.
pub(super) fn legacy_digest(bytes: &[u8]) -> u32 {
    const P1: u64 = 0x9E37_79B1_85EB_CA87;
    const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const P3: u64 = 0x1656_67B1_9E37_79F9;
    let round = |acc: u64, word: u64| {
        acc.wrapping_add(word.wrapping_mul(P2))
            .rotate_left(31)
            .wrapping_mul(P1)
    };
    let mut lanes = [P1.wrapping_add(P2), P2, 0, P1.wrapping_neg()];
    let mut stripes = bytes.chunks_exact(32);
    for stripe in &mut stripes {
        for (lane, word) in lanes.iter_mut().zip(stripe.chunks_exact(8)) {
            *lane = round(*lane, le_u64(word));
        }
    }
    let mut h = lanes[0]
        .rotate_left(1)
        .wrapping_add(lanes[1].rotate_left(7))
        .wrapping_add(lanes[2].rotate_left(12))
        .wrapping_add(lanes[3].rotate_left(18))
        .wrapping_add(bytes.len() as u64);
    let mut words = stripes.remainder().chunks_exact(8);
    for word in &mut words {
        h = (h ^ round(0, le_u64(word)))
            .rotate_left(27)
            .wrapping_mul(P1);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b).wrapping_mul(P3))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^= h >> 32;
    h as u32
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

// ---------------------------------------------------------------------------------------
// Bit packing

/// Bits needed to tell `n` values apart: 0 when there is at most one (a block that sends
/// every live row to one destination stores no label bits at all).
pub(super) fn width_for(n: usize) -> u32 {
    if n <= 1 {
        0
    } else {
        usize::BITS - (n - 1).leading_zeros()
    }
}

/// Bytes taken by `n` values packed at `width` bits.
pub(super) fn packed_len(n: usize, width: u32) -> usize {
    (n * width as usize).div_ceil(8)
}

/// Appends `values` packed LSB-first at `width` bits each (every value must fit).
pub(super) fn pack(values: &[u16], width: u32, out: &mut Vec<u8>) {
    if width == 0 {
        return;
    }
    out.reserve(packed_len(values.len(), width));
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &v in values {
        acc |= u64::from(v) << bits;
        bits += width;
        if bits >= 32 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            bits -= 32;
        }
    }
    while bits > 0 {
        out.push(acc as u8);
        acc >>= 8;
        bits = bits.saturating_sub(8);
    }
}

/// Unpacks `n` values of `width` bits from exactly `packed_len(n, width)` bytes.
///
/// Dispatches to a width-specialised loop: eight values of W bits are exactly W bytes, so
/// a group is one or two unaligned u64 loads and eight constant shifts, which the
/// compiler unrolls. A generic bit cursor is several times slower, and unpacking is most
/// of a block decode.
pub(super) fn unpack(bytes: &[u8], width: u32, n: usize) -> Vec<u16> {
    debug_assert_eq!(bytes.len(), packed_len(n, width));
    let mut out = vec![0u16; n];
    match width {
        0 => {}
        1 => unpack_fixed::<1>(bytes, &mut out),
        2 => unpack_fixed::<2>(bytes, &mut out),
        3 => unpack_fixed::<3>(bytes, &mut out),
        4 => unpack_fixed::<4>(bytes, &mut out),
        5 => unpack_fixed::<5>(bytes, &mut out),
        6 => unpack_fixed::<6>(bytes, &mut out),
        7 => unpack_fixed::<7>(bytes, &mut out),
        8 => unpack_fixed::<8>(bytes, &mut out),
        9 => unpack_fixed::<9>(bytes, &mut out),
        10 => unpack_fixed::<10>(bytes, &mut out),
        11 => unpack_fixed::<11>(bytes, &mut out),
        12 => unpack_fixed::<12>(bytes, &mut out),
        13 => unpack_fixed::<13>(bytes, &mut out),
        14 => unpack_fixed::<14>(bytes, &mut out),
        15 => unpack_fixed::<15>(bytes, &mut out),
        _ => unpack_fixed::<16>(bytes, &mut out),
    }
    out
}

fn unpack_fixed<const W: usize>(bytes: &[u8], out: &mut [u16]) {
    let mask = ((1u32 << W) - 1) as u16;
    // Groups whose loads stay inside `bytes` (a group reads at most 16 bytes from its
    // start); the last few go through the per-value path below.
    let groups = (out.len() / 8).min(match bytes.len().checked_sub(16) {
        Some(room) => room / W + 1,
        None => 0,
    });
    let (head, tail) = out.split_at_mut(groups * 8);
    for (g, values) in head.chunks_exact_mut(8).enumerate() {
        let at = g * W;
        let lo = le_u64(&bytes[at..at + 8]);
        if W <= 8 {
            for (j, v) in values.iter_mut().enumerate() {
                *v = (lo >> (j * W)) as u16 & mask;
            }
        } else {
            // Values 4..8 start at bit 4W, a multiple of 4: a second load at that byte,
            // shifted by the leftover nibble, keeps every value inside one u64.
            let hi = le_u64(&bytes[at + 4 * W / 8..at + 4 * W / 8 + 8]) >> (4 * W % 8);
            let (first, second) = values.split_at_mut(4);
            for (j, (a, b)) in first.iter_mut().zip(second).enumerate() {
                *a = (lo >> (j * W)) as u16 & mask;
                *b = (hi >> (j * W)) as u16 & mask;
            }
        }
    }
    let first_bit = groups * 8 * W;
    for (j, v) in tail.iter_mut().enumerate() {
        let bit = first_bit + j * W;
        let mut word = [0u8; 4];
        let start = bit / 8;
        let end = (start + 4).min(bytes.len());
        word[..end - start].copy_from_slice(&bytes[start..end]);
        *v = (u32::from_le_bytes(word) >> (bit % 8)) as u16 & mask;
    }
}

// ---------------------------------------------------------------------------------------
// Blocks

/// Flag byte of a block: bits 0-1 say how deleted rows are stored, bits 2-3 how labels
/// are stored, bits 4-7 are reserved (must be zero, so a newer encoder's blocks are
/// rejected instead of misread).
const DELETED_NONE: u8 = 0;
const DELETED_BITSET: u8 = 1;
const DELETED_GAPS: u8 = 2;
const DELETED_MASK: u8 = 0b11;
/// Live labels as codes into the block's dictionary (sorted destinations whose count
/// grows in this block, taken from the counts matrix), packed at `width_for(k)` bits.
const LABELS_DICTIONARY: u8 = 0;
const LABELS_SHIFT: u8 = 2;
const LABELS_MASK: u8 = 0b11;
const RESERVED_MASK: u8 = 0xF0;

/// Encodes one block. `deleted` holds the sorted in-block positions of deleted rows and
/// `codes` the dictionary code of each live row; `dictionary_len` is the number of
/// distinct destinations in the block.
pub(super) fn encode_block(
    len: u32,
    deleted: &[u32],
    codes: &[u16],
    dictionary_len: usize,
    out: &mut Vec<u8>,
) {
    // Deletions cost nothing when absent; otherwise the cheaper of a bitset (dense
    // deletions) and a varint gap list (a handful of deleted rows in a big block).
    let bitset_len = (len as usize).div_ceil(8);
    let gaps_len = if deleted.is_empty() {
        0
    } else {
        varint_len(deleted.len() as u64)
            + deleted
                .iter()
                .scan(None, |prev: &mut Option<u32>, &p| {
                    let gap = prev.map_or(p, |q| p - q - 1);
                    *prev = Some(p);
                    Some(varint_len(u64::from(gap)))
                })
                .sum::<usize>()
    };
    let deleted_mode = if deleted.is_empty() {
        DELETED_NONE
    } else if gaps_len < bitset_len {
        DELETED_GAPS
    } else {
        DELETED_BITSET
    };
    out.push(deleted_mode | (LABELS_DICTIONARY << LABELS_SHIFT));
    match deleted_mode {
        DELETED_BITSET => {
            let start = out.len();
            out.resize(start + bitset_len, 0);
            for &p in deleted {
                out[start + p as usize / 8] |= 1 << (p % 8);
            }
        }
        DELETED_GAPS => {
            put_varint(out, deleted.len() as u64);
            let mut prev: Option<u32> = None;
            for &p in deleted {
                put_varint(out, u64::from(prev.map_or(p, |q| p - q - 1)));
                prev = Some(p);
            }
        }
        _ => {}
    }
    pack(codes, width_for(dictionary_len), out);
}

/// Decodes one block against its per-destination counts (`deltas[d]` = rows of
/// destination `d` in this block, from the counts matrix) and checks that the block agrees
/// with them: the live row count and the count of every label must match exactly, so a
/// corrupt block fails here instead of translating rows to wrong offsets.
pub(super) fn decode_block(
    block: usize,
    len: u32,
    deltas: &[u32],
    bytes: &[u8],
) -> Result<BlockLabels> {
    let corrupt = |reason: String| RowMapError::CorruptBlock { block, reason };
    let mut r = Reader::new(bytes, "block");
    let flags = r.u8("flags")?;
    let deleted_mode = flags & DELETED_MASK;
    let labels_mode = (flags >> LABELS_SHIFT) & LABELS_MASK;
    if flags & RESERVED_MASK != 0 || deleted_mode > DELETED_GAPS || labels_mode != LABELS_DICTIONARY
    {
        return Err(RowMapError::UnknownBlockEncoding { block, flags });
    }

    let mut deleted = vec![0u64; bitset_words(len)];
    match deleted_mode {
        DELETED_BITSET => {
            let raw = r.take((len as usize).div_ceil(8), "deletion bitset")?;
            for (word, chunk) in deleted.iter_mut().zip(raw.chunks(8)) {
                let mut le = [0u8; 8];
                le[..chunk.len()].copy_from_slice(chunk);
                *word = u64::from_le_bytes(le);
            }
            // Bits past the block's end would be counted as deletions by rank.
            let tail_bits = len % 64;
            if tail_bits != 0 && deleted.last().is_some_and(|&w| w >> tail_bits != 0) {
                return Err(corrupt("deletion bits set past the block's end".into()));
            }
        }
        DELETED_GAPS => {
            let count = r.varint("deletion count")?;
            if count == 0 || count > u64::from(len) {
                return Err(corrupt(format!(
                    "deletion list of {count} entries for {len} rows"
                )));
            }
            let mut next = 0u64;
            for _ in 0..count {
                let p = next + r.varint("deletion gap")?;
                if p >= u64::from(len) {
                    return Err(corrupt(format!("deleted row {p} past {len} rows")));
                }
                deleted[(p / 64) as usize] |= 1 << (p % 64);
                next = p + 1;
            }
        }
        _ => {}
    }
    let num_deleted: u32 = deleted.iter().map(|w| w.count_ones()).sum();
    let live_rows = u64::from(len - num_deleted);
    let expected_live: u64 = deltas.iter().map(|&d| u64::from(d)).sum();
    if live_rows != expected_live {
        return Err(RowMapError::BlockMismatch {
            block,
            what: "live rows (counts vs deletion map)",
            expected: expected_live,
            found: live_rows,
        });
    }

    // The dictionary is not stored: the destinations this block feeds are exactly those
    // whose cumulative count grows across it, which the footer already holds.
    let dictionary: Vec<u16> = deltas
        .iter()
        .enumerate()
        .filter(|&(_, &d)| d > 0)
        .map(|(dest, _)| dest as u16)
        .collect();
    let width = width_for(dictionary.len());
    let live = live_rows as usize;
    let packed = r.take(packed_len(live, width), "labels")?;
    r.finish()
        .map_err(|e| corrupt(format!("block is longer than its labels: {e}")))?;
    let used_bits = live * width as usize % 8;
    if used_bits != 0 && packed.last().is_some_and(|&b| b >> used_bits != 0) {
        return Err(corrupt("padding bits after the last label are set".into()));
    }

    // Codes equal labels when the block feeds destinations 0..k (always so with one
    // destination per block, often so with few): then no lookup is needed.
    let identity = dictionary.iter().enumerate().all(|(i, &l)| i == l as usize);
    let mut live_labels = unpack(packed, width, live);
    // Codes are counted and, if needed, replaced by their labels in the same pass. A
    // code past the dictionary maps to a wrong label, but is then reported below and
    // the block is dropped.
    let seen = if identity {
        count_codes(&mut live_labels, width, None)
    } else {
        let mut table = vec![0u16; 1 << width];
        table[..dictionary.len()].copy_from_slice(&dictionary);
        count_codes(&mut live_labels, width, Some(&table))
    };
    for (code, &found) in seen.iter().enumerate() {
        match dictionary.get(code) {
            Some(&label) if found != deltas[label as usize] => {
                return Err(RowMapError::BlockLabelCount {
                    block,
                    label,
                    expected: deltas[label as usize],
                    found,
                });
            }
            None if found != 0 => {
                return Err(corrupt(format!(
                    "label code {code} used but the block has {} destinations",
                    dictionary.len()
                )));
            }
            _ => {}
        }
    }
    Ok(BlockLabels::from_parts(
        block,
        len,
        deleted,
        num_deleted,
        live_labels,
    ))
}

// ---------------------------------------------------------------------------------------
// Per-block counts (footer)

/// Tag in front of each block's counts in the footer.
const COUNTS_DENSE: u8 = 0;
const COUNTS_SPARSE: u8 = 1;

/// Appends one block's per-destination counts: dense when most destinations occur in the
/// block, sparse `(gap, count)` pairs when few do (block-local clustering).
pub(super) fn encode_block_counts(m: usize, touched: &[u16], counts: &[u32], out: &mut Vec<u8>) {
    let mut sparse_len = varint_len(touched.len() as u64);
    let mut prev: Option<u16> = None;
    for &d in touched {
        let gap = prev.map_or(d, |p| d - p - 1);
        sparse_len += varint_len(u64::from(gap)) + varint_len(u64::from(counts[d as usize]));
        prev = Some(d);
    }
    let dense_len = (m - touched.len())
        + touched
            .iter()
            .map(|&d| varint_len(u64::from(counts[d as usize])))
            .sum::<usize>();
    if dense_len <= sparse_len {
        out.push(COUNTS_DENSE);
        for &c in counts {
            put_varint(out, u64::from(c));
        }
    } else {
        out.push(COUNTS_SPARSE);
        put_varint(out, touched.len() as u64);
        let mut prev: Option<u16> = None;
        for &d in touched {
            put_varint(out, u64::from(prev.map_or(d, |p| d - p - 1)));
            put_varint(out, u64::from(counts[d as usize]));
            prev = Some(d);
        }
    }
}

/// Per-destination counts of one block, appended to `cum` as the next cumulative row.
pub(super) fn decode_block_counts(
    r: &mut Reader<'_>,
    m: usize,
    block: usize,
    cum: &mut Vec<u32>,
) -> Result<()> {
    let prev_start = cum.len() - m;
    cum.extend_from_within(prev_start..);
    let row = &mut cum[prev_start + m..];
    let mut add = |d: usize, count: u32| -> Result<()> {
        row[d] = row[d].checked_add(count).ok_or_else(|| {
            RowMapError::Corrupt(format!(
                "block {block}: destination {d} passes u32::MAX rows"
            ))
        })?;
        Ok(())
    };
    match r.u8("counts tag")? {
        COUNTS_DENSE => {
            for d in 0..m {
                add(d, r.varint_u32("dense count")?)?;
            }
        }
        COUNTS_SPARSE => {
            let n = r.varint("sparse entries")?;
            if n > m as u64 {
                return Err(RowMapError::Corrupt(format!(
                    "block {block}: {n} sparse count entries for {m} destinations"
                )));
            }
            let mut next = 0u64;
            for _ in 0..n {
                let d = next + r.varint("sparse gap")?;
                if d >= m as u64 {
                    return Err(RowMapError::Corrupt(format!(
                        "block {block}: sparse count for destination {d} of {m}"
                    )));
                }
                add(d as usize, r.varint_u32("sparse count")?)?;
                next = d + 1;
            }
        }
        tag => {
            return Err(RowMapError::Corrupt(format!(
                "block {block}: unknown counts tag {tag}"
            )));
        }
    }
    Ok(())
}

/// Counts how often each code in `0..1 << width` occurs and, given a `table` of
/// `1 << width` labels, replaces each code by its label.
///
/// Narrow codes use four interleaved histograms: with few distinct codes, consecutive
/// increments of one counter would each wait for the previous store, and spreading
/// neighbours over four copies lets them overlap. There the table is a full 256 entries
/// indexed by a u8, so the lookup needs no bounds check.
fn count_codes(codes: &mut [u16], width: u32, table: Option<&[u16]>) -> Vec<u32> {
    let size = 1usize << width;
    if width > 8 {
        let mut seen = vec![0u32; size];
        for c in codes.iter_mut() {
            seen[*c as usize] += 1;
            if let Some(t) = table {
                *c = t[*c as usize];
            }
        }
        return seen;
    }
    let mut copies = vec![[0u32; 4]; size];
    let (quads, rest) = codes.as_chunks_mut::<4>();
    match table {
        None => {
            for quad in quads {
                for (lane, &c) in quad.iter().enumerate() {
                    copies[c as usize][lane] += 1;
                }
            }
        }
        Some(t) => {
            let mut full = [0u16; 256];
            full[..t.len()].copy_from_slice(t);
            for quad in quads {
                for (lane, c) in quad.iter_mut().enumerate() {
                    copies[*c as usize][lane] += 1;
                    *c = full[usize::from(*c as u8)];
                }
            }
        }
    }
    for c in rest {
        copies[*c as usize][0] += 1;
        if let Some(t) = table {
            *c = t[*c as usize];
        }
    }
    copies.iter().map(|c| c.iter().sum()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
            let mut r = Reader::new(&buf, "test");
            assert_eq!(r.varint("v").unwrap(), v);
            r.finish().unwrap();
        }
        // Eleven continuation bytes never decode.
        let mut r = Reader::new(&[0xff; 11], "test");
        assert!(r.varint("v").is_err());
    }

    #[test]
    fn packing_round_trips_at_every_width() {
        for width in 0..=16u32 {
            for n in [0usize, 1, 7, 8, 9, 63, 100] {
                let max = if width == 0 { 0 } else { (1u32 << width) - 1 };
                let values: Vec<u16> = (0..n)
                    .map(|i| ((i as u32).wrapping_mul(2_654_435_761) % (max + 1)) as u16)
                    .collect();
                let mut buf = Vec::new();
                pack(&values, width, &mut buf);
                assert_eq!(buf.len(), packed_len(n, width), "w={width} n={n}");
                assert_eq!(unpack(&buf, width, n), values, "w={width} n={n}");
            }
        }
    }

    #[test]
    fn both_digests_see_every_byte() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        for digest in [Digest::Legacy, Digest::Crc32c] {
            let base = digest.sum(&data);
            for i in 0..data.len() {
                let mut d = data.clone();
                d[i] ^= 1;
                assert_ne!(digest.sum(&d), base, "{digest:?}: flip at {i}");
            }
            assert_ne!(digest.sum(&data[..199]), base);
        }
    }

    #[test]
    fn format_2_uses_standard_crc32c() {
        // The CRC32C check value of "123456789" (RFC 3720, iSCSI).
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
        assert_eq!(Digest::of_version(2), Digest::Crc32c);
        assert_eq!(Digest::of_version(1), Digest::Legacy);
        // The format-1 digest is frozen: files written with it must keep verifying.
        assert_eq!(legacy_digest(b"123456789"), 0x44e4_ede0);
        let ramp: Vec<u8> = (0..100).collect();
        assert_eq!(legacy_digest(&ramp), 0x9553_be2f);
    }
}

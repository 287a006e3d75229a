//! Test-only proptest strategies for the decoder fuzz tests of every persisted file kind:
//! arbitrary bytes, and valid encodings damaged the way storage and hostile writers damage
//! them (flipped bits, overwritten bytes, extreme length words, truncation, appended
//! garbage). It lives in the ground layer so `format` and `index` tests can share it.

use proptest::prelude::*;
use proptest::sample::Index;

/// One damage to a byte string.
#[derive(Clone, Debug)]
pub enum Mutation {
    FlipBit(Index, u8),
    Overwrite(Index, u8),
    /// Overwrites 8 bytes (fewer at the end) with a little-endian word, so length and count
    /// fields take extreme values.
    OverwriteWord(Index, u64),
    Truncate(Index),
    Remove(Index),
    Append(Vec<u8>),
}

fn word() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX / 8),
        Just(1u64 << 31),
        0u64..1024,
        any::<u64>(),
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Overwrite(i, v)),
        2 => (any::<Index>(), word()).prop_map(|(i, w)| Mutation::OverwriteWord(i, w)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => any::<Index>().prop_map(Mutation::Remove),
        1 => prop::collection::vec(any::<u8>(), 1..32).prop_map(Mutation::Append),
    ]
}

pub fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Append(tail) => bytes.extend_from_slice(tail),
        _ if bytes.is_empty() => {}
        Mutation::FlipBit(i, bit) => {
            let i = i.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        Mutation::Overwrite(i, v) => {
            let i = i.index(bytes.len());
            bytes[i] = *v;
        }
        Mutation::OverwriteWord(i, w) => {
            let i = i.index(bytes.len());
            let n = (bytes.len() - i).min(8);
            bytes[i..i + n].copy_from_slice(&w.to_le_bytes()[..n]);
        }
        Mutation::Truncate(i) => {
            let len = i.index(bytes.len());
            bytes.truncate(len);
        }
        Mutation::Remove(i) => {
            bytes.remove(i.index(bytes.len()));
        }
    }
}

/// `valid` with one to four mutations applied.
pub fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(mutation(), 1..5).prop_map(move |ms| {
        let mut b = valid.clone();
        for m in &ms {
            apply(&mut b, m);
        }
        b
    })
}

/// Arbitrary bytes, sometimes starting with `magic` so the decoder gets past its first check.
pub fn arbitrary_with_magic(magic: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    (any::<bool>(), prop::collection::vec(any::<u8>(), 0..512)).prop_map(move |(m, rest)| {
        if m {
            let mut b = magic.to_vec();
            b.extend_from_slice(&rest);
            b
        } else {
            rest
        }
    })
}

//! Integrity checks: every persisted byte a query depends on is covered by a CRC32C that is
//! verified when the bytes are read, so a damaged file is an error naming it, never a wrong
//! answer.
//!
//! | file | checksum | recorded in | verified |
//! | --- | --- | --- | --- |
//! | data file (Parquet) | one per page unit ([`units`]) and one for the footer | page table: the Parquet footer; footer: the manifest's data-file entry | each range the reader fetches, before decoding |
//! | deletion file | whole file | the manifest's deletion entry (and the ledger's copy) | whenever it is read |
//! | index segment | per partition (addresses and payload apart) and the footer | the segment footer | each partition range read |
//! | row map | per block and the footer | the row-map footer | each block read |
//! | manifest | JSON structure and cross-checks | — | on decode |
//!
//! Checksums are CRC32C (Castagnoli), computed with the SSE4.2 / ARMv8 CRC instructions by
//! the `crc32c` crate (several GB/s per core, far above the storage bandwidth a read
//! competes with). Files written before checksums existed (manifest entries without them,
//! segment format 1, row-map format 1) are still read, **unverified** for data, deletion and
//! segment files; row-map format 1 keeps its older digest.
//!
//! Layout: [`page_walk`] finds page boundaries in a column chunk's bytes at write time,
//! [`units`] is the checksum table and its range arithmetic (both pure), [`parquet_io`] the
//! writer's sink and the verifying range reader.

pub mod page_walk;
pub mod parquet_io;
pub mod units;

use std::fmt;

use super::error::{FormatError, Result};

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of the bytes `crc` covers followed by `bytes` (`crc32c_append(0, b) == crc32c(b)`),
/// for checksums of data written in pieces.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// Checks a whole file (or a part of it described by `what`) against its recorded CRC32C.
pub fn check(path: impl fmt::Display, what: &str, bytes: &[u8], expected: u32) -> Result<()> {
    let found = crc32c(bytes);
    if found != expected {
        return Err(FormatError::corrupt(
            path,
            format!("{what}: CRC32C is {found:#010x}, {expected:#010x} was recorded"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! Reading and writing the Parquet data files of fragments.
//!
//! Readers return a fragment's **physical** rows in offset order (deleted rows included); the
//! scan layer applies deletion vectors, because only it knows which offsets it needs.
//!
//! Every read goes through `read::read_file`: a file whose manifest entry records a footer
//! checksum is read through the verifying range reader of [`super::integrity`], so a damaged
//! page or footer is a `Corrupt` error naming the file before any value is decoded.
//!
//! Callers speak the table's declared (logical) types only: a column of a type Parquet cannot
//! store is written as its storage type and turned back on read, here and nowhere else (see
//! [`super::storage_types`]). Readers take no predicate; Parquet statistics leave this module
//! as the null counts of [`row_groups_with_nulls`], which every storage type keeps exact,
//! and as the footer [`data_file_footer`] gives a scan's row-group pruning, which uses them
//! only for columns stored as their declared type.

mod read;
mod write;

pub use read::{
    data_file_footer, forget_cached_footers, read_fragment, read_fragment_ranges,
    read_fragment_rows, row_groups_with_nulls,
};
pub use write::{
    ROW_GROUP_ROWS, WrittenFragment, write_column_file, write_fragments, write_partitioned,
    write_sized_fragments,
};

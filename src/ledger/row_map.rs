//! Placeholder until the row-map codec lands.
#[derive(Debug, thiserror::Error)]
pub enum RowMapError {
    #[error("row map: {0}")]
    Invalid(String),
}

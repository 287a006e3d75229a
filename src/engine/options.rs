//! Session options under the `fragvec.` prefix (`SET fragvec.update_mode = 'rewrite_columns'`).

use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;
use datafusion::common::{DataFusionError, Result};

extensions_options! {
    /// fragvec's session options.
    pub struct FragvecOptions {
        /// How UPDATE (and MERGE's matched updates) store new values: `rewrite_rows` deletes
        /// the old rows and appends new versions; `rewrite_columns` rewrites only the changed
        /// columns of the affected fragments in place, keeping every row address.
        pub update_mode: String, default = "rewrite_rows".to_string()
        /// How many times a statement that lost a commit race to a conflicting writer
        /// re-reads the table and runs again.
        pub commit_retries: usize, default = 5
    }
}

impl ConfigExtension for FragvecOptions {
    const PREFIX: &'static str = "fragvec";
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateMode {
    RewriteRows,
    RewriteColumns,
}

impl FragvecOptions {
    pub fn update_mode(&self) -> Result<UpdateMode> {
        match self.update_mode.to_ascii_lowercase().as_str() {
            "rewrite_rows" => Ok(UpdateMode::RewriteRows),
            "rewrite_columns" => Ok(UpdateMode::RewriteColumns),
            other => Err(DataFusionError::Configuration(format!(
                "fragvec.update_mode must be 'rewrite_rows' or 'rewrite_columns', not '{other}'"
            ))),
        }
    }
}

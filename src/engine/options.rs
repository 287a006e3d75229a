//! Session options under the `fragvec.` prefix (`SET fragvec.update_mode = 'rewrite_columns'`).

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::ConfigExtension;
use datafusion::common::{DataFusionError, config_err, config_field, extensions_options};

pub use crate::format::changes::UpdateMode;

use crate::format::progress::Progress;
use datafusion::prelude::SessionConfig;

/// The progress handle kept in a session's configuration (none when not set). Here, not in
/// `session`, so that the operators reporting progress (`write`, `recluster`) need not
/// import the session module that imports them.
pub fn progress_of(config: &SessionConfig) -> Progress {
    config
        .get_extension::<Progress>()
        .map(|p| p.as_ref().clone())
        .unwrap_or_default()
}

impl FromStr for UpdateMode {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "rewrite_rows" => Ok(UpdateMode::RewriteRows),
            "rewrite_columns" => Ok(UpdateMode::RewriteColumns),
            other => config_err!(
                "fragvec.update_mode must be 'rewrite_rows' or 'rewrite_columns', not '{other}'"
            ),
        }
    }
}

impl fmt::Display for UpdateMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpdateMode::RewriteRows => "rewrite_rows",
            UpdateMode::RewriteColumns => "rewrite_columns",
        })
    }
}

config_field!(UpdateMode, value => value.parse::<UpdateMode>()?);

extensions_options! {
    /// fragvec's session options, as DataFusion's macro makes them (see [`FragvecOptions`]).
    pub struct FragvecOptionValues {
        /// `rewrite_rows` (default) or `rewrite_columns`; see [`UpdateMode`].
        pub update_mode: UpdateMode, default = UpdateMode::RewriteRows
        /// How many times a statement that lost a commit race to a conflicting writer
        /// re-reads the table and runs again.
        pub commit_retries: usize, default = 5
        /// IVF partitions a KNN query probes per segment (more: better recall, slower).
        pub nprobes: usize, default = 16
        /// IVF_PQ: candidates re-ranked with exact distances, as a multiple of k.
        pub refine_factor: usize, default = 4
        /// KNN queries score every row exactly: an IVF_FLAT index's segments are read whole
        /// (every partition, raw vectors), other rows from the data files.
        pub exact: bool, default = false
        /// Bytes a session keeps in memory for KNN: index partitions, decoded vector
        /// columns (exact search), small columns of result rows. Default: a quarter of the
        /// machine's memory (or of the cgroup's limit), at least 256 MiB.
        pub index_cache_bytes: usize, default = crate::index::cache::default_budget_bytes()
        /// VACUUM keeps files and versions younger than this (seconds): a commit in
        /// progress may still need them. Must exceed the longest write.
        pub vacuum_grace_seconds: u64, default = 900
        /// Threads the index builds of a `MAINTAIN` statement use (the maintainer of
        /// `fragvec serve` has `--maintenance-threads`).
        pub maintenance_threads: usize, default = 1
        /// A query reuses the newest version of a table this session knows, without asking
        /// the store, when the store confirmed it less than this many milliseconds ago
        /// (bounded staleness; the session's own commits are seen at once; statements that
        /// write always ask). 0: every query asks. Unset: 0 on a local directory and
        /// `memory://`, 1000 on object storage (`s3://`). See `format::latest`.
        pub version_check_ms: Option<u64>, default = None
    }
}

/// fragvec's session options (`SET fragvec.nprobes = 32`). DataFusion's macro lists an
/// extension's options without their prefix, so `SHOW fragvec.nprobes` found nothing and
/// `information_schema.df_settings` said `nprobes`; this wrapper lists them by the names
/// `SET` takes.
#[derive(Debug, Clone, Default)]
pub struct FragvecOptions(pub FragvecOptionValues);

/// The values of a session's `fragvec.*` options, compared without formatting them: a kept
/// plan depends on them, and every reuse checks they still hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OptionsFingerprint {
    update_mode: UpdateMode,
    commit_retries: usize,
    nprobes: usize,
    refine_factor: usize,
    exact: bool,
    index_cache_bytes: usize,
    vacuum_grace_seconds: u64,
    maintenance_threads: usize,
    version_check_ms: Option<u64>,
}

impl FragvecOptions {
    /// The option values, for comparing (a new option must be added here: the pattern
    /// below names every field, so the compiler says so).
    pub fn fingerprint(&self) -> OptionsFingerprint {
        let FragvecOptionValues {
            update_mode,
            commit_retries,
            nprobes,
            refine_factor,
            exact,
            index_cache_bytes,
            vacuum_grace_seconds,
            maintenance_threads,
            version_check_ms,
        } = self.0;
        OptionsFingerprint {
            update_mode,
            commit_retries,
            nprobes,
            refine_factor,
            exact,
            index_cache_bytes,
            vacuum_grace_seconds,
            maintenance_threads,
            version_check_ms,
        }
    }
}

impl std::ops::Deref for FragvecOptions {
    type Target = FragvecOptionValues;
    fn deref(&self) -> &FragvecOptionValues {
        &self.0
    }
}

impl std::ops::DerefMut for FragvecOptions {
    fn deref_mut(&mut self) -> &mut FragvecOptionValues {
        &mut self.0
    }
}

impl datafusion::config::ExtensionOptions for FragvecOptions {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn datafusion::config::ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::common::Result<()> {
        // Entries name their options with the prefix; either form is taken back.
        let key = key
            .strip_prefix(Self::PREFIX)
            .and_then(|k| k.strip_prefix('.'))
            .unwrap_or(key);
        self.0.set(key, value).or_else(|e| {
            // Only a name no option has gets the suggestion; a bad value keeps its message.
            let known: Vec<String> = self.0.entries().into_iter().map(|e| e.key).collect();
            if known.iter().any(|k| k == key) {
                Err(e)
            } else {
                config_err!("{}", unknown_option(key, &known))
            }
        })
    }

    fn entries(&self) -> Vec<datafusion::config::ConfigEntry> {
        let mut entries = self.0.entries();
        for e in &mut entries {
            e.key = format!("{}.{}", Self::PREFIX, e.key);
        }
        entries
    }
}

impl ConfigExtension for FragvecOptions {
    const PREFIX: &'static str = "fragvec";
}

/// The name of `known` closest to a misspelt `key`, when one is close (edit distance at
/// most 3, or a third of the name).
pub fn closest_name<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    use datafusion::common::utils::datafusion_strsim::levenshtein;
    known
        .map(|k| (levenshtein(key, k), k))
        .min()
        .filter(|(distance, k)| *distance <= 3.max(k.len() / 3))
        .map(|(_, k)| k)
}

/// What a misspelt option name is told: the closest option, when one is close, else the
/// list.
fn unknown_option(key: &str, known: &[String]) -> String {
    match closest_name(key, known.iter().map(String::as_str)) {
        Some(k) => format!("there is no option fragvec.{key}; did you mean fragvec.{k}?"),
        None => format!(
            "there is no option fragvec.{key}; fragvec's options are {}",
            known
                .iter()
                .map(|k| format!("fragvec.{k}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::config::ExtensionOptions;

    use super::*;

    #[test]
    fn options_are_listed_and_set_by_their_full_names() {
        let mut o = FragvecOptions::default();
        let keys: Vec<String> = o.entries().into_iter().map(|e| e.key).collect();
        assert!(keys.contains(&"fragvec.nprobes".to_string()), "{keys:?}");
        o.set("fragvec.nprobes", "7").unwrap();
        assert_eq!(o.nprobes, 7);
        o.set("nprobes", "9").unwrap();
        assert_eq!(o.nprobes, 9);
    }

    #[test]
    fn every_option_changes_the_fingerprint() {
        // A value other than the default for each option; every listed option must be here.
        let other = [
            ("update_mode", "rewrite_columns"),
            ("commit_retries", "6"),
            ("nprobes", "17"),
            ("refine_factor", "5"),
            ("exact", "true"),
            ("index_cache_bytes", "12345"),
            ("vacuum_grace_seconds", "901"),
            ("maintenance_threads", "2"),
            ("version_check_ms", "7"),
        ];
        let defaults = FragvecOptions::default();
        let mut listed: Vec<String> = defaults.0.entries().into_iter().map(|e| e.key).collect();
        listed.sort();
        let mut covered: Vec<String> = other.iter().map(|(k, _)| k.to_string()).collect();
        covered.sort();
        assert_eq!(listed, covered);
        for (key, value) in other {
            let mut o = FragvecOptions::default();
            o.set(key, value).unwrap();
            assert_ne!(o.fingerprint(), defaults.fingerprint(), "{key}");
        }
        assert_eq!(
            FragvecOptions::default().fingerprint(),
            defaults.fingerprint()
        );
    }

    #[test]
    fn a_misspelt_option_names_the_closest_one() {
        let mut o = FragvecOptions::default();
        let e = o.set("nprobe", "3").unwrap_err().to_string();
        assert!(e.contains("did you mean fragvec.nprobes?"), "{e}");
        let e = o
            .set("exactly_nothing_alike_at_all", "3")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fragvec's options are") && e.contains("fragvec.exact"),
            "{e}"
        );
    }
}

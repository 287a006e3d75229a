//! PostgreSQL's own session settings, which clients set and show (`SET statement_timeout`,
//! `SET application_name`, `SHOW server_version`, `SET TIME ZONE`, `DISCARD ALL`).
//!
//! A setting whose name has no dot is PostgreSQL's and lives here; `fragvec.*` and
//! `datafusion.*` settings go to the connection's session like any statement.
//! `statement_timeout` is honoured (milliseconds, or a number with a unit: `5s`, `2min`);
//! the others are remembered and shown back, as clients expect, and change nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::engine::session::StatementResult;

/// The PostgreSQL version clients are told (`server_version`): the protocol and catalog this
/// server follows.
pub const SERVER_VERSION: &str = "16.0";

/// A statement about PostgreSQL settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingStatement {
    /// `SET name = value` / `SET name TO value` / `RESET name` (value `None`).
    Set(String, Option<String>),
    /// `SHOW name` (or `SHOW ALL`).
    Show(String),
    /// `DISCARD ALL` (connection pools send it when a connection is returned).
    Discard,
    /// `DEALLOCATE [PREPARE] name | ALL` (psycopg sends it after DDL and ROLLBACK): the
    /// protocol's prepared statements are Parse'd again by name, so there is nothing to free.
    Deallocate(&'static str),
}

/// The setting statement `sql` is, if it names a PostgreSQL setting.
pub fn parse(sql: &str) -> Option<SettingStatement> {
    let text = sql.trim().trim_end_matches(';').trim();
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    match words.as_slice() {
        ["discard", "all"] => return Some(SettingStatement::Discard),
        ["deallocate", "prepare", "all"] | ["deallocate", "all"] => {
            return Some(SettingStatement::Deallocate("DEALLOCATE ALL"));
        }
        ["deallocate", _] | ["deallocate", "prepare", _] => {
            return Some(SettingStatement::Deallocate("DEALLOCATE"));
        }
        ["reset", name] if is_postgres_name(name) => {
            return Some(SettingStatement::Set(name.to_string(), None));
        }
        ["show", name] if is_postgres_name(name) => {
            return Some(SettingStatement::Show(name.to_string()));
        }
        ["set", "time", "zone", ..] | ["set", "session", "time", "zone", ..] => {
            let value = text
                .split_whitespace()
                .skip_while(|w| !w.eq_ignore_ascii_case("zone"))
                .skip(1);
            return Some(SettingStatement::Set(
                "timezone".into(),
                Some(unquote(&value.collect::<Vec<_>>().join(" "))),
            ));
        }
        _ => {}
    }
    let rest = strip_word(text, "set")?;
    let rest = strip_word(rest, "session")
        .or_else(|| strip_word(rest, "local"))
        .unwrap_or(rest);
    let (name, value) = match rest.find('=') {
        Some(i) => (rest[..i].trim(), rest[i + 1..].trim()),
        None => {
            let mut parts = rest.splitn(2, char::is_whitespace);
            let name = parts.next()?;
            let value = strip_word(parts.next()?.trim(), "to")?;
            (name, value.trim())
        }
    };
    let name = name.to_ascii_lowercase();
    if !is_postgres_name(&name) {
        return None;
    }
    let value = if value.eq_ignore_ascii_case("default") {
        None
    } else {
        Some(unquote(value))
    };
    Some(SettingStatement::Set(name, value))
}

/// `text` after its first word if that is `word` (any case).
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let head = text.get(..word.len())?;
    let rest = &text[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(char::is_whitespace))
        .then(|| rest.trim_start())
}

fn is_postgres_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('.')
        && name != "all"
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn unquote(value: &str) -> String {
    let v = value.trim();
    v.strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .map(|v| v.replace("''", "'"))
        .unwrap_or_else(|| v.to_string())
}

/// A connection's PostgreSQL settings.
#[derive(Debug, Clone)]
pub struct Settings {
    values: BTreeMap<String, String>,
    defaults: BTreeMap<String, String>,
}

impl Settings {
    /// Settings with the server's defaults (`statement_timeout_ms`: the server's default
    /// statement timeout, 0 for none).
    pub fn new(statement_timeout_ms: u64, user: &str) -> Self {
        let defaults: BTreeMap<String, String> = [
            ("server_version", SERVER_VERSION.to_string()),
            ("server_version_num", "160000".into()),
            ("server_encoding", "UTF8".into()),
            ("client_encoding", "UTF8".into()),
            ("datestyle", "ISO, MDY".into()),
            ("intervalstyle", "postgres".into()),
            ("timezone", "UTC".into()),
            ("standard_conforming_strings", "on".into()),
            ("integer_datetimes", "on".into()),
            ("application_name", String::new()),
            ("search_path", "\"$user\", public".into()),
            ("statement_timeout", statement_timeout_ms.to_string()),
            ("lock_timeout", "0".into()),
            ("idle_in_transaction_session_timeout", "0".into()),
            ("extra_float_digits", "1".into()),
            ("client_min_messages", "notice".into()),
            ("default_transaction_isolation", "read committed".into()),
            ("transaction_isolation", "read committed".into()),
            ("max_identifier_length", "63".into()),
            ("is_superuser", "off".into()),
            ("session_authorization", user.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Self {
            values: defaults.clone(),
            defaults,
        }
    }

    /// Sets `name` (`None`: back to its default).
    pub fn set(&mut self, name: &str, value: Option<String>) -> Result<(), String> {
        let value = match value {
            Some(v) => v,
            None => self.defaults.get(name).cloned().unwrap_or_default(),
        };
        if name == "statement_timeout" {
            parse_duration_ms(&value)?;
        }
        if matches!(
            name,
            "server_version" | "server_version_num" | "server_encoding" | "integer_datetimes"
        ) {
            return Err(format!("parameter \"{name}\" cannot be changed"));
        }
        self.values.insert(name.to_string(), value);
        Ok(())
    }

    /// `SHOW name` as a one-row result (of [`show_schema`]).
    pub fn show(&self, name: &str) -> Result<StatementResult, String> {
        let value = self
            .values
            .get(name)
            .ok_or_else(|| format!("unrecognized configuration parameter \"{name}\""))?;
        let schema = show_schema(name);
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![value.clone()]))],
        )
        .map_err(|e| e.to_string())?;
        Ok(StatementResult {
            schema,
            batches: vec![batch],
            rows_affected: None,
        })
    }

    /// Every setting back to its default (`DISCARD ALL`).
    pub fn reset_all(&mut self) {
        self.values = self.defaults.clone();
    }

    /// The statement timeout in force (None: no limit).
    pub fn statement_timeout(&self) -> Option<Duration> {
        let ms = parse_duration_ms(self.values.get("statement_timeout")?).ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Every setting (for `pg_settings`).
    pub fn all(&self) -> impl Iterator<Item = (&String, &String)> {
        self.values.iter()
    }
}

/// The columns of `SHOW name`: one text column named after the setting.
pub fn show_schema(name: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, false)]))
}

/// A PostgreSQL time setting in milliseconds: a bare number is milliseconds; units `us`,
/// `ms`, `s`, `min`, `h`, `d`.
pub fn parse_duration_ms(value: &str) -> Result<u64, String> {
    let v = value.trim();
    let split = v
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(v.len());
    let (number, unit) = (v[..split].trim(), v[split..].trim());
    let n: f64 = number
        .parse()
        .map_err(|_| format!("invalid value for a time setting: \"{value}\""))?;
    let factor = match unit {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        other => {
            return Err(format!(
                "invalid unit \"{other}\" for a time setting: valid units are us, ms, s, min, h, d"
            ));
        }
    };
    Ok((n * factor).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_postgres_settings_and_leaves_ours() {
        use SettingStatement::*;
        assert_eq!(
            parse("SET statement_timeout = 5000"),
            Some(Set("statement_timeout".into(), Some("5000".into())))
        );
        assert_eq!(
            parse("set application_name to 'my app'"),
            Some(Set("application_name".into(), Some("my app".into())))
        );
        assert_eq!(
            parse("SET SESSION datestyle = ISO"),
            Some(Set("datestyle".into(), Some("ISO".into())))
        );
        assert_eq!(
            parse("SET TIME ZONE 'UTC'"),
            Some(Set("timezone".into(), Some("UTC".into())))
        );
        assert_eq!(
            parse("RESET statement_timeout"),
            Some(Set("statement_timeout".into(), None))
        );
        assert_eq!(
            parse("SHOW server_version;"),
            Some(Show("server_version".into()))
        );
        assert_eq!(parse("DISCARD ALL"), Some(Discard));
        assert_eq!(parse("DEALLOCATE ALL"), Some(Deallocate("DEALLOCATE ALL")));
        assert_eq!(parse("deallocate _pg3_0"), Some(Deallocate("DEALLOCATE")));
        assert_eq!(parse("SET fragvec.nprobes = 4"), None);
        assert_eq!(parse("SHOW datafusion.execution.batch_size"), None);
        assert_eq!(parse("SHOW ALL"), None);
        assert_eq!(parse("SELECT 1"), None);
        assert_eq!(parse("settle"), None);
    }

    #[test]
    fn statement_timeout_units() {
        let mut s = Settings::new(0, "u");
        assert_eq!(s.statement_timeout(), None);
        s.set("statement_timeout", Some("2s".into())).unwrap();
        assert_eq!(s.statement_timeout(), Some(Duration::from_secs(2)));
        assert!(
            s.set("statement_timeout", Some("2 parsecs".into()))
                .is_err()
        );
        s.set("statement_timeout", None).unwrap();
        assert_eq!(s.statement_timeout(), None);
        assert!(s.set("server_version", Some("1".into())).is_err());
        assert!(s.show("nope").is_err());
    }
}

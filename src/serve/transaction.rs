//! Transaction blocks, honestly: fragvec commits every statement when it runs.
//!
//! `BEGIN` / `COMMIT` / `ROLLBACK` / `SAVEPOINT` / `RELEASE` are accepted so clients that wrap
//! statements in them (psycopg's default, its type introspection, ORMs, pools) work. Reads in a
//! block see each statement's latest version; a write in a block commits when it runs. So a
//! `ROLLBACK` (or `ROLLBACK TO` a savepoint) that would have to undo a write is refused with
//! an error naming the statements already committed, never reported as done. As in
//! PostgreSQL, after an error in a block every statement but the block's end is refused
//! (25P02) until `ROLLBACK` or `COMMIT`.
//!
//! A pure state machine: [`Block::apply`] says what a control statement does.

use super::sqlstate::code;

/// A transaction-control statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// `BEGIN` / `START TRANSACTION`.
    Begin,
    /// `COMMIT` / `END`.
    Commit,
    /// `ROLLBACK` / `ABORT`.
    Rollback,
    /// `SAVEPOINT name`.
    Savepoint(String),
    /// `RELEASE [SAVEPOINT] name`.
    Release(String),
    /// `ROLLBACK TO [SAVEPOINT] name`.
    RollbackTo(String),
}

impl Control {
    /// The control statement `sql` is, if it is one.
    pub fn of(sql: &str) -> Option<Control> {
        let words: Vec<String> = sql
            .trim()
            .trim_end_matches(';')
            .split_whitespace()
            .map(|w| w.to_ascii_lowercase())
            .collect();
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        let name = |rest: &[&str]| -> Option<String> {
            match rest {
                [name] => Some(name.trim_matches('"').to_string()),
                _ => None,
            }
        };
        match w.as_slice() {
            ["begin", rest @ ..]
                if rest.is_empty()
                    || matches!(rest[0], "transaction" | "work" | "isolation" | "read") =>
            {
                Some(Control::Begin)
            }
            ["start", "transaction", ..] => Some(Control::Begin),
            ["commit" | "end", rest @ ..] if rest.len() <= 1 => Some(Control::Commit),
            ["rollback" | "abort", "to", "savepoint", rest @ ..]
            | ["rollback" | "abort", "to", rest @ ..] => name(rest).map(Control::RollbackTo),
            ["rollback" | "abort", rest @ ..] if rest.len() <= 1 => Some(Control::Rollback),
            ["savepoint", rest @ ..] => name(rest).map(Control::Savepoint),
            ["release", "savepoint", rest @ ..] | ["release", rest @ ..] => {
                name(rest).map(Control::Release)
            }
            _ => None,
        }
    }
}

/// What a control statement did: its command tag, and a warning to send first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The command tag (`BEGIN`, `COMMIT`, `ROLLBACK`, ...).
    pub tag: &'static str,
    /// A warning's SQLSTATE and message (`BEGIN` inside a block, ...).
    pub warning: Option<(&'static str, String)>,
}

/// A refused control or statement: SQLSTATE and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The SQLSTATE the client gets.
    pub sqlstate: &'static str,
    /// The message the client gets.
    pub message: String,
}

/// The connection's transaction block.
#[derive(Debug, Default, Clone)]
pub struct Block {
    open: bool,
    failed: bool,
    /// Statements that wrote, in this block, each already committed.
    writes: Vec<String>,
    /// Savepoints, each with how many writes came before it.
    savepoints: Vec<(String, usize)>,
}

impl Block {
    /// Whether a block is open (`BEGIN` ran, no `COMMIT` / `ROLLBACK` yet).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether an error failed the open block (only `ROLLBACK` runs until it ends).
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Whether a statement other than a control statement may run now.
    pub fn admit(&self) -> Result<(), Refused> {
        if self.failed {
            return Err(Refused {
                sqlstate: code::IN_FAILED_SQL_TRANSACTION,
                message: "current transaction is aborted, commands ignored until end of \
                          transaction block"
                    .into(),
            });
        }
        Ok(())
    }

    /// Notes a statement that ran: `wrote`, it committed a change.
    pub fn ran(&mut self, sql: &str, wrote: bool) {
        if self.open && wrote {
            let mut text: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            if text.len() > 80 {
                let cut = (0..=80)
                    .rev()
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(0);
                text.truncate(cut);
                text.push_str("...");
            }
            self.writes.push(text);
        }
    }

    /// Notes a statement that failed.
    pub fn failed(&mut self) {
        if self.open {
            self.failed = true;
        }
    }

    /// Applies a control statement.
    pub fn apply(&mut self, control: &Control) -> Result<Done, Refused> {
        let done = |tag| Ok(Done { tag, warning: None });
        match control {
            Control::Begin => {
                if self.open {
                    return Ok(Done {
                        tag: "BEGIN",
                        warning: Some((
                            code::ACTIVE_SQL_TRANSACTION,
                            "there is already a transaction in progress".into(),
                        )),
                    });
                }
                *self = Block {
                    open: true,
                    ..Block::default()
                };
                done("BEGIN")
            }
            Control::Commit => {
                if !self.open {
                    return Ok(Done {
                        tag: "COMMIT",
                        warning: Some((
                            code::NO_ACTIVE_SQL_TRANSACTION,
                            "there is no transaction in progress".into(),
                        )),
                    });
                }
                let failed = self.failed;
                *self = Block::default();
                // PostgreSQL ends a failed block with ROLLBACK whatever the client said.
                done(if failed { "ROLLBACK" } else { "COMMIT" })
            }
            Control::Rollback => {
                if !self.open {
                    return Ok(Done {
                        tag: "ROLLBACK",
                        warning: Some((
                            code::NO_ACTIVE_SQL_TRANSACTION,
                            "there is no transaction in progress".into(),
                        )),
                    });
                }
                let writes = std::mem::take(&mut self.writes);
                *self = Block::default();
                if writes.is_empty() {
                    done("ROLLBACK")
                } else {
                    Err(refuse_undo("ROLLBACK", &writes))
                }
            }
            Control::Savepoint(name) => {
                if !self.open {
                    return Err(Refused {
                        sqlstate: code::NO_ACTIVE_SQL_TRANSACTION,
                        message: "SAVEPOINT can only be used in transaction blocks".into(),
                    });
                }
                self.admit()?;
                self.savepoints.push((name.clone(), self.writes.len()));
                done("SAVEPOINT")
            }
            Control::Release(name) => {
                let at = self.savepoint(name, "RELEASE SAVEPOINT")?;
                self.admit()?;
                self.savepoints.truncate(at);
                done("RELEASE")
            }
            Control::RollbackTo(name) => {
                let at = self.savepoint(name, "ROLLBACK TO SAVEPOINT")?;
                let since = self.savepoints[at].1;
                self.savepoints.truncate(at + 1);
                self.failed = false;
                if self.writes.len() > since {
                    let writes = self.writes.split_off(since);
                    // The block stays usable: the statements are committed, and now no
                    // longer counted as part of what could be undone.
                    return Err(refuse_undo("ROLLBACK TO SAVEPOINT", &writes));
                }
                done("ROLLBACK")
            }
        }
    }

    fn savepoint(&self, name: &str, what: &str) -> Result<usize, Refused> {
        if !self.open {
            return Err(Refused {
                sqlstate: code::NO_ACTIVE_SQL_TRANSACTION,
                message: format!("{what} can only be used in transaction blocks"),
            });
        }
        self.savepoints
            .iter()
            .rposition(|(n, _)| n == name)
            .ok_or_else(|| Refused {
                sqlstate: "3B001",
                message: format!("savepoint \"{name}\" does not exist"),
            })
    }
}

fn refuse_undo(what: &str, writes: &[String]) -> Refused {
    let list = writes
        .iter()
        .enumerate()
        .map(|(i, w)| format!("  {}. {w}", i + 1))
        .collect::<Vec<_>>()
        .join("\n");
    Refused {
        sqlstate: code::INVALID_TRANSACTION_TERMINATION,
        message: format!(
            "{what} cannot undo {} statement(s) of this block: fragvec commits each statement \
             when it runs, and these were already committed:\n{list}",
            writes.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_statements_are_recognised() {
        assert_eq!(Control::of("BEGIN"), Some(Control::Begin));
        assert_eq!(
            Control::of("begin transaction isolation level serializable;"),
            Some(Control::Begin)
        );
        assert_eq!(Control::of("START TRANSACTION"), Some(Control::Begin));
        assert_eq!(Control::of("commit"), Some(Control::Commit));
        assert_eq!(Control::of("ROLLBACK"), Some(Control::Rollback));
        assert_eq!(
            Control::of("SAVEPOINT \"_pg3_1\""),
            Some(Control::Savepoint("_pg3_1".into()))
        );
        assert_eq!(
            Control::of("RELEASE SAVEPOINT sp"),
            Some(Control::Release("sp".into()))
        );
        assert_eq!(
            Control::of("ROLLBACK TO SAVEPOINT sp"),
            Some(Control::RollbackTo("sp".into()))
        );
        assert_eq!(Control::of("SELECT 1"), None);
        assert_eq!(Control::of("beginning"), None);
    }

    #[test]
    fn a_rollback_after_a_write_is_refused_and_names_it() {
        let mut b = Block::default();
        b.apply(&Control::Begin).unwrap();
        b.ran("SELECT 1", false);
        b.ran("INSERT INTO t VALUES (1)", true);
        let e = b.apply(&Control::Rollback).unwrap_err();
        assert_eq!(e.sqlstate, "2D000");
        assert!(
            e.message.contains("INSERT INTO t VALUES (1)"),
            "{}",
            e.message
        );
        assert!(!b.is_open());
        // Reads only: a rollback is a plain rollback.
        b.apply(&Control::Begin).unwrap();
        b.ran("SELECT 1", false);
        assert_eq!(b.apply(&Control::Rollback).unwrap().tag, "ROLLBACK");
    }

    #[test]
    fn savepoints_and_failed_blocks() {
        let mut b = Block::default();
        assert!(b.apply(&Control::Savepoint("a".into())).is_err());
        b.apply(&Control::Begin).unwrap();
        b.apply(&Control::Savepoint("a".into())).unwrap();
        b.failed();
        assert_eq!(b.admit().unwrap_err().sqlstate, "25P02");
        assert_eq!(
            b.apply(&Control::RollbackTo("a".into())).unwrap().tag,
            "ROLLBACK"
        );
        b.admit().unwrap();
        b.ran("DELETE FROM t", true);
        assert!(b.apply(&Control::RollbackTo("a".into())).is_err());
        b.apply(&Control::Release("a".into())).unwrap();
        assert!(b.apply(&Control::Release("a".into())).is_err());
        b.failed();
        assert_eq!(b.apply(&Control::Commit).unwrap().tag, "ROLLBACK");
        assert!(b.apply(&Control::Commit).unwrap().warning.is_some());
    }
}

//! `COPY ... FROM STDIN` and `COPY ... TO STDOUT` statements: which table or query, which
//! columns, and the data format with its options, checked as PostgreSQL checks them. The
//! data itself is [`super::copy_in`]'s and [`super::copy_out`]'s.

use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, ObjectName,
    Statement,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use pgwire::error::ErrorInfo;

use super::copy_format::{CopyError, CopyFormat, CsvOptions};
use super::sqlstate::{code, error_info};
use crate::sql::pin::normalize_ident;

/// A COPY whose data goes over the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Copy {
    /// `COPY t [(columns)] FROM STDIN`: rows arrive as CopyData messages.
    FromStdin(CopyStatement),
    /// `COPY t [(columns)] TO STDOUT` or `COPY (query) TO STDOUT`: rows leave as CopyData.
    ToStdout(CopyOutStatement),
}

/// A parsed `COPY ... FROM STDIN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyStatement {
    /// The table the rows go into (a plain name, normalized).
    pub table: String,
    /// The columns named, or `None` for all in table order.
    pub columns: Option<Vec<String>>,
    /// How the rows are written in the data.
    pub format: CopyFormat,
}

/// A parsed `COPY ... TO STDOUT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOutStatement {
    /// The query whose rows are sent: the COPY's own, or `SELECT columns FROM table`.
    pub query: String,
    /// How the rows are written in the data.
    pub format: CopyFormat,
}

/// `sql` as a COPY over the connection, if it is one; an error for one with options fragvec
/// does not take. A COPY to or from a file is not one (the engine runs those).
pub fn parse(sql: &str) -> Option<Result<Copy, CopyError>> {
    let head = sql.trim_start().get(..4)?;
    if !head.eq_ignore_ascii_case("copy") {
        return None;
    }
    let lower = sql.to_ascii_lowercase();
    let ours = lower.contains("stdin") || lower.contains("stdout");
    let statements = match Parser::parse_sql(&PostgreSqlDialect {}, sql) {
        Ok(s) => s,
        // A COPY over the connection the parser refuses: say why (anything else is not ours).
        Err(e) if ours => return Some(Err(copy_error(code::SYNTAX_ERROR, e.to_string()))),
        Err(_) => return None,
    };
    let Some(Statement::Copy {
        source,
        to,
        target,
        options,
        legacy_options,
        values,
    }) = statements.first().cloned()
    else {
        return None;
    };
    let direction = match (to, &target) {
        (false, CopyTarget::Stdin) => "COPY FROM STDIN",
        (true, CopyTarget::Stdout) => "COPY TO STDOUT",
        _ => return None,
    };
    // The parser takes what follows `COPY ... FROM STDIN;` in the same text as inline data.
    if statements.len() > 1 || !values.is_empty() || more_after_semicolon(sql) {
        return Some(Err(copy_error(
            code::FEATURE_NOT_SUPPORTED,
            format!(
                "{direction} must be the only statement of its query string; its rows go \
                 as CopyData messages"
            ),
        )));
    }
    let format = match format_of(direction, &options, &legacy_options) {
        Ok(f) => f,
        Err(e) => return Some(Err(e)),
    };
    Some(match (to, source) {
        (
            false,
            CopySource::Table {
                table_name,
                columns,
            },
        ) => table_and_columns(direction, &table_name, &columns).map(|(table, columns)| {
            Copy::FromStdin(CopyStatement {
                table,
                columns,
                format,
            })
        }),
        (false, CopySource::Query(_)) => Err(copy_error(
            code::SYNTAX_ERROR,
            "COPY FROM STDIN takes a table, not a query",
        )),
        (
            true,
            CopySource::Table {
                table_name,
                columns,
            },
        ) => {
            let list = if columns.is_empty() {
                "*".to_string()
            } else {
                let names: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
                names.join(", ")
            };
            Ok(Copy::ToStdout(CopyOutStatement {
                query: format!("SELECT {list} FROM {table_name}"),
                format,
            }))
        }
        (true, CopySource::Query(query)) => Ok(Copy::ToStdout(CopyOutStatement {
            query: query.to_string(),
            format,
        })),
    })
}

/// Whether anything but whitespace and comments follows the first `;` of `sql` (outside
/// quotes: the tokenizer decides).
fn more_after_semicolon(sql: &str) -> bool {
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return false;
    };
    tokens
        .iter()
        .skip_while(|t| **t != Token::SemiColon)
        .skip(1)
        .any(|t| !matches!(t, Token::Whitespace(_) | Token::SemiColon | Token::EOF))
}

/// A COPY FROM's table, a plain name, and its column list (`None` when not given).
fn table_and_columns(
    direction: &str,
    table_name: &ObjectName,
    columns: &[datafusion::sql::sqlparser::ast::Ident],
) -> Result<(String, Option<Vec<String>>), CopyError> {
    let table = match table_name.0.as_slice() {
        [part] => part.as_ident().map(normalize_ident),
        _ => None,
    };
    let Some(table) = table else {
        return Err(copy_error(
            code::FEATURE_NOT_SUPPORTED,
            format!("{direction} does not take a qualified table name ({table_name})"),
        ));
    };
    let columns = (!columns.is_empty()).then(|| columns.iter().map(normalize_ident).collect());
    Ok((table, columns))
}

/// The data format of a COPY and its options, checked as PostgreSQL checks them.
fn format_of(
    direction: &str,
    options: &[CopyOption],
    legacy: &[CopyLegacyOption],
) -> Result<CopyFormat, CopyError> {
    let unsupported = |what: String| {
        copy_error(
            code::FEATURE_NOT_SUPPORTED,
            format!("{direction} does not take {what}"),
        )
    };
    // The format first: the other options' defaults depend on it.
    let mut format = CopyFormat::text();
    let mut header = false;
    let mut delimiter = None;
    let mut null = None;
    let mut quote = None;
    let mut escape = None;
    for o in options {
        if let CopyOption::Format(name) = o {
            format = match name.value.to_ascii_lowercase().as_str() {
                "text" => CopyFormat::text(),
                "csv" => CopyFormat::csv(),
                "binary" => CopyFormat::Binary,
                other => {
                    return Err(copy_error(
                        code::INVALID_PARAMETER_VALUE,
                        format!("COPY format \"{other}\" not recognized"),
                    ));
                }
            };
        }
    }
    for o in legacy {
        match o {
            CopyLegacyOption::Binary => format = CopyFormat::Binary,
            CopyLegacyOption::Csv(csv) => {
                format = CopyFormat::csv();
                for c in csv {
                    match c {
                        CopyLegacyCsvOption::Header => header = true,
                        CopyLegacyCsvOption::Quote(q) => quote = Some(*q),
                        CopyLegacyCsvOption::Escape(e) => escape = Some(*e),
                        other => return Err(unsupported(format!("the option {other}"))),
                    }
                }
            }
            CopyLegacyOption::Delimiter(d) => delimiter = Some(*d),
            CopyLegacyOption::Null(n) => null = Some(n.clone()),
            other => return Err(unsupported(format!("the option {other}"))),
        }
    }
    for o in options {
        match o {
            CopyOption::Format(_) | CopyOption::Freeze(_) => {}
            CopyOption::Delimiter(d) => delimiter = Some(*d),
            CopyOption::Null(n) => null = Some(n.clone()),
            CopyOption::Header(h) => header = *h,
            CopyOption::Quote(q) => quote = Some(*q),
            CopyOption::Escape(e) => escape = Some(*e),
            CopyOption::Encoding(e)
                if matches!(e.to_ascii_uppercase().as_str(), "UTF8" | "UTF-8") => {}
            other => return Err(unsupported(format!("the option {other}"))),
        }
    }
    let one_byte = |c: char, what: &str| -> Result<u8, CopyError> {
        if c.is_ascii() && c != '\n' && c != '\r' {
            Ok(c as u8)
        } else {
            Err(copy_error(
                code::INVALID_PARAMETER_VALUE,
                format!("COPY {what} must be a single one-byte character"),
            ))
        }
    };
    let refuse_for = |what: &str, format: &str| {
        copy_error(
            code::INVALID_PARAMETER_VALUE,
            format!("cannot specify {what} in {format} mode"),
        )
    };
    match &mut format {
        CopyFormat::Binary => {
            for (given, what) in [
                (delimiter.is_some(), "DELIMITER"),
                (null.is_some(), "NULL"),
                (header, "HEADER"),
                (quote.is_some(), "QUOTE"),
                (escape.is_some(), "ESCAPE"),
            ] {
                if given {
                    return Err(refuse_for(what, "BINARY"));
                }
            }
        }
        CopyFormat::Text {
            delimiter: d,
            null: n,
            header: h,
        } => {
            if quote.is_some() || escape.is_some() {
                return Err(copy_error(
                    code::FEATURE_NOT_SUPPORTED,
                    "COPY QUOTE and ESCAPE are available only in CSV mode",
                ));
            }
            if let Some(c) = delimiter {
                *d = one_byte(c, "delimiter")?;
            }
            if let Some(s) = null {
                *n = s.into_bytes();
            }
            *h = header;
        }
        CopyFormat::Csv(CsvOptions {
            delimiter: d,
            quote: q,
            escape: e,
            null: n,
            header: h,
        }) => {
            if let Some(c) = delimiter {
                *d = one_byte(c, "delimiter")?;
            }
            if let Some(c) = quote {
                *q = one_byte(c, "quote")?;
                *e = *q;
            }
            if let Some(c) = escape {
                *e = one_byte(c, "escape")?;
            }
            if let Some(s) = null {
                *n = s.into_bytes();
            }
            *h = header;
            if *d == *q {
                return Err(copy_error(
                    code::INVALID_PARAMETER_VALUE,
                    "COPY delimiter and quote must be different",
                ));
            }
        }
    }
    Ok(format)
}

pub(super) fn copy_error(sqlstate: &'static str, message: impl Into<String>) -> CopyError {
    CopyError {
        sqlstate,
        message: message.into(),
    }
}

impl From<CopyError> for ErrorInfo {
    fn from(e: CopyError) -> Self {
        error_info(e.sqlstate, e.message)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(sql: &str) -> CopyStatement {
        match parse(sql).expect("a COPY").expect("accepted") {
            Copy::FromStdin(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn parsed_out(sql: &str) -> CopyOutStatement {
        match parse(sql).expect("a COPY").expect("accepted") {
            Copy::ToStdout(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn refused(sql: &str) -> CopyError {
        parse(sql).expect("a COPY").expect_err("refused")
    }

    #[test]
    fn statements_and_their_options() {
        let s = parsed("copy Items (ID, emb) from stdin");
        assert_eq!(s.table, "items");
        assert_eq!(s.columns, Some(vec!["id".into(), "emb".into()]));
        assert_eq!(s.format, CopyFormat::text());

        let s =
            parsed("COPY t FROM STDIN WITH (FORMAT csv, HEADER true, DELIMITER ';', NULL 'NA')");
        assert_eq!(s.columns, None);
        assert_eq!(
            s.format,
            CopyFormat::Csv(CsvOptions {
                delimiter: b';',
                quote: b'"',
                escape: b'"',
                null: b"NA".to_vec(),
                header: true,
            })
        );
        // psycopg's and asyncpg's spellings of binary
        assert_eq!(
            parsed("COPY t FROM STDIN (FORMAT BINARY)").format,
            CopyFormat::Binary
        );
        assert_eq!(
            parsed("COPY t FROM STDIN WITH BINARY").format,
            CopyFormat::Binary
        );
        assert_eq!(parsed("COPY t FROM STDIN (FORMAT binary)").format.code(), 1);
        // a quote sets the escape too, unless it is given
        let CopyFormat::Csv(o) = parsed("COPY t FROM STDIN (FORMAT csv, QUOTE '''')").format else {
            panic!()
        };
        assert_eq!((o.quote, o.escape), (b'\'', b'\''));
    }

    #[test]
    fn what_is_not_a_copy_over_the_connection_is_left_alone() {
        assert!(parse("SELECT 1").is_none());
        assert!(parse("COPY t TO '/tmp/x.parquet'").is_none());
        assert!(parse("COPY t FROM '/tmp/x.csv'").is_none());
        assert!(parse("cop").is_none());
    }

    #[test]
    fn options_that_cannot_be_honoured_are_refused() {
        assert_eq!(refused("COPY t FROM STDIN; SELECT 1").sqlstate, "0A000");
        // a `;` in an option, and one ending the statement, are not a second statement
        assert_eq!(
            parsed("COPY t FROM STDIN WITH (DELIMITER ';');").format,
            CopyFormat::Text {
                delimiter: b';',
                null: b"\\N".to_vec(),
                header: false
            }
        );
        assert_eq!(refused("COPY t FROM STDIN WITH (FORMAT").sqlstate, "42601");
        assert_eq!(refused("COPY t FROM STDIN (FORMAT xml)").sqlstate, "22023");
        assert_eq!(
            refused("COPY t FROM STDIN (FORMAT binary, DELIMITER ',')").sqlstate,
            "22023"
        );
        assert_eq!(
            refused("COPY t FROM STDIN (FORMAT csv, DELIMITER '\"')").sqlstate,
            "22023"
        );
        assert_eq!(refused("COPY t FROM STDIN (QUOTE '\"')").sqlstate, "0A000");
        assert_eq!(
            refused("COPY t FROM STDIN (FORCE_NULL (a))").sqlstate,
            "0A000"
        );
        assert_eq!(refused("COPY s.t FROM STDIN").sqlstate, "0A000");
        // the parser already refuses a delimiter of more than one byte
        assert_eq!(
            refused("COPY t FROM STDIN (DELIMITER 'é')").sqlstate,
            "42601"
        );
    }

    #[test]
    fn copy_to_stdout_reads_a_table_or_a_query() {
        let s = parsed_out("copy Items (ID, \"Emb\") to stdout");
        assert_eq!(s.query, "SELECT ID, \"Emb\" FROM Items");
        assert_eq!(s.format, CopyFormat::text());
        let s = parsed_out("COPY items TO STDOUT (FORMAT binary)");
        assert_eq!(
            (s.query.as_str(), s.format),
            ("SELECT * FROM items", CopyFormat::Binary)
        );
        let s = parsed_out("COPY (SELECT id FROM items WHERE id < 3) TO STDOUT WITH CSV HEADER");
        assert_eq!(s.query, "SELECT id FROM items WHERE id < 3");
        let CopyFormat::Csv(o) = s.format else {
            panic!()
        };
        assert!(o.header);
        // options are checked as for FROM, worded for TO
        let e = refused("COPY t TO STDOUT (FORMAT binary, HEADER)");
        assert_eq!(e.sqlstate, "22023");
        let e = refused("COPY t TO STDOUT; SELECT 1");
        assert_eq!(e.sqlstate, "0A000");
        assert!(e.message.starts_with("COPY TO STDOUT"), "{}", e.message);
        assert_eq!(refused("COPY (SELECT 1) FROM STDIN").sqlstate, "42601");
    }
}

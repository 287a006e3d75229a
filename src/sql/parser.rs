//! Statement parsing.
//!
//! One entry point, [`parse_statements`], that recognizes fragvec's own statements by their
//! first keyword and hands everything else to DataFusion's parser. Before parsing, the token
//! stream is rewritten for time travel: `t VERSION AS OF 3` becomes the relation `"t@v3" AS t`,
//! which the catalog resolves to version 3 (DataFusion's generic dialect has no table versions,
//! and would silently ignore one if it had).

use datafusion::common::{DataFusionError, Result};
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Word};

use crate::engine::catalog::RelationName;

/// A parsed statement.
#[derive(Debug, Clone)]
pub enum FragvecStatement {
    /// Anything DataFusion's parser understands; fragvec intercepts some of these
    /// (CREATE TABLE, DROP TABLE, DELETE, UPDATE, MERGE) when it executes them.
    DataFusion(Box<DFStatement>),
}

/// Parses a string of `;`-separated statements.
pub fn parse_statements(sql: &str) -> Result<Vec<FragvecStatement>> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| DataFusionError::SQL(Box::new(e.into()), None))?;
    let tokens = rewrite_version_as_of(tokens)?;
    let mut parser = DFParserBuilder::new(tokens)
        .with_dialect(&dialect)
        .build()?;
    let mut out = Vec::new();
    loop {
        while parser.parser.consume_token(&Token::SemiColon) {}
        if parser.parser.peek_token() == Token::EOF {
            break;
        }
        // fragvec's own statements are recognized here, by their first keyword, before
        // DataFusion's parser sees them.
        let statement = FragvecStatement::DataFusion(Box::new(parser.parse_statement()?));
        out.push(statement);
        let next = parser.parser.peek_token();
        if next != Token::SemiColon && next != Token::EOF {
            return Err(DataFusionError::Plan(format!(
                "expected end of statement, found: {next}"
            )));
        }
    }
    Ok(out)
}

fn is_keyword(t: &Token, kw: Keyword) -> bool {
    matches!(t, Token::Word(w) if w.keyword == kw)
}

/// Rewrites `<name> VERSION AS OF <n>` into `"<name>@v<n>" [AS <name>]`.
fn rewrite_version_as_of(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    // Positions of the non-whitespace tokens, to match the pattern across spaces/comments.
    let solid: Vec<usize> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(t.token, Token::Whitespace(_)))
        .map(|(i, _)| i)
        .collect();
    let mut out = tokens.clone();
    let mut drop = vec![false; tokens.len()];
    let mut inserts: Vec<(usize, Vec<TokenWithSpan>)> = Vec::new();
    for w in 0..solid.len() {
        let at = |k: usize| solid.get(w + k).map(|&i| &tokens[i].token);
        if !(at(1).is_some_and(|t| is_keyword(t, Keyword::VERSION))
            && at(2).is_some_and(|t| is_keyword(t, Keyword::AS))
            && at(3).is_some_and(|t| is_keyword(t, Keyword::OF)))
        {
            continue;
        }
        let Some(Token::Word(table)) = at(0) else {
            return Err(DataFusionError::Plan(
                "VERSION AS OF must follow a table name".into(),
            ));
        };
        let version: u64 = match at(4) {
            Some(Token::Number(n, _)) => n.parse().map_err(|_| {
                DataFusionError::Plan(format!("VERSION AS OF needs a version number, not {n}"))
            })?,
            other => {
                return Err(DataFusionError::Plan(format!(
                    "VERSION AS OF needs a version number, found {}",
                    other
                        .map(|t| t.to_string())
                        .unwrap_or_else(|| "end of input".into())
                )));
            }
        };
        let name = if table.quote_style.is_some() {
            table.value.clone()
        } else {
            table.value.to_lowercase()
        };
        let encoded = RelationName {
            table: name.clone(),
            version: Some(version),
            virtual_columns: false,
        };
        out[solid[w]].token = Token::Word(Word {
            value: encoded.encode(),
            quote_style: Some('"'),
            keyword: Keyword::NoKeyword,
        });
        for k in 1..=4 {
            drop[solid[w + k]] = true;
        }
        // Keep the table's own name as its alias unless the query gives one.
        let has_alias = match at(5) {
            Some(Token::Word(next)) => {
                next.keyword == Keyword::AS || next.keyword == Keyword::NoKeyword
            }
            _ => false,
        };
        if !has_alias {
            let span = tokens[solid[w]].span;
            let word = |value: &str, keyword| TokenWithSpan {
                token: Token::Word(Word {
                    value: value.into(),
                    quote_style: Some('"'),
                    keyword,
                }),
                span,
            };
            let space = TokenWithSpan {
                token: Token::Whitespace(datafusion::sql::sqlparser::tokenizer::Whitespace::Space),
                span,
            };
            let mut as_kw = word("AS", Keyword::AS);
            if let Token::Word(w) = &mut as_kw.token {
                w.quote_style = None;
            }
            inserts.push((
                solid[w + 4],
                vec![space.clone(), as_kw, space, word(&name, Keyword::NoKeyword)],
            ));
        }
    }
    let mut result = Vec::with_capacity(out.len());
    for (i, t) in out.into_iter().enumerate() {
        if !drop[i] {
            result.push(t);
        }
        for (at, extra) in inserts.iter().filter(|(at, _)| *at == i) {
            debug_assert_eq!(*at, i);
            result.extend(extra.iter().cloned());
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(sql: &str) -> String {
        let mut s = parse_statements(sql).unwrap();
        assert_eq!(s.len(), 1);
        let FragvecStatement::DataFusion(s) = s.pop().unwrap();
        s.to_string()
    }

    #[test]
    fn version_as_of_becomes_a_pinned_relation() {
        assert_eq!(
            one("SELECT * FROM t VERSION AS OF 3"),
            "SELECT * FROM \"t@v3\" AS \"t\""
        );
        assert_eq!(
            one("select a.x from T version as of 12 as a where a.x > 1"),
            "SELECT a.x FROM \"t@v12\" AS a WHERE a.x > 1"
        );
    }

    #[test]
    fn version_as_of_needs_a_number() {
        assert!(parse_statements("SELECT * FROM t VERSION AS OF 'x'").is_err());
    }

    #[test]
    fn several_statements() {
        assert_eq!(parse_statements("SELECT 1; SELECT 2;;").unwrap().len(), 2);
        assert!(parse_statements("SELECT 1 SELECT 2").is_err());
    }
}

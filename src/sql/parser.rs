//! Statement parsing.
//!
//! One entry point, [`parse_statements`], that recognizes fragvec's own statements by their
//! first keyword and hands everything else to DataFusion's parser. Before parsing, the token
//! stream is rewritten for time travel: `t VERSION AS OF 3` becomes the relation `"t@v3" AS t`,
//! which the catalog resolves to version 3 (DataFusion's generic dialect has no table versions,
//! and would silently ignore one if it had). pgvector's operators and `VECTOR(n)` casts are
//! rewritten too ([`super::vector_syntax`]).

use datafusion::common::{DataFusionError, Result, plan_datafusion_err, plan_err};
use datafusion::sql::parser::{CopyToSource, DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::Expr;
use datafusion::sql::sqlparser::dialect::{Dialect, GenericDialect};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Word};

use crate::sql::pin::RelationName;
use crate::sql::vector_syntax;

/// A parsed statement.
#[derive(Debug, Clone)]
pub enum FragvecStatement {
    /// Anything DataFusion's parser understands; fragvec intercepts some of these
    /// (CREATE TABLE, DROP TABLE, DELETE, UPDATE, MERGE) when it executes them.
    DataFusion(Box<DFStatement>),
    /// `CREATE VECTOR INDEX name ON t (col) USING IVF_FLAT | IVF_SQ | IVF_PQ [WITH (k = v, ...)]`
    CreateVectorIndex {
        /// The index's name, normalized (unquoted names lower-cased).
        name: String,
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// The vector column it indexes, normalized.
        column: String,
        /// The index type, upper-cased but not yet checked (`IVF_FLAT`, `IVF_SQ`, `IVF_PQ`).
        kind: String,
        /// The `WITH (k = v, ...)` options in order: keys lower-cased, values as written.
        options: Vec<(String, String)>,
    },
    /// `DROP INDEX [IF EXISTS] name ON t`
    DropIndex {
        /// The index's name, normalized (unquoted names lower-cased).
        name: String,
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// `IF EXISTS`: no error when there is no such index.
        if_exists: bool,
    },
    /// `OPTIMIZE INDEX name ON t [APPEND | MERGE n | RETRAIN]`
    OptimizeIndex {
        /// The index's name, normalized (unquoted names lower-cased).
        name: String,
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// Which rewrite of the index's segments to run.
        action: OptimizeAction,
    },
    /// `COMPACT t [WITH (target_rows_per_fragment = n, max_source_fragments = n,
    /// max_source_rows = n, deletion_threshold = x)]`
    Compact {
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// The `WITH (k = v, ...)` options in order: keys lower-cased, values as written.
        options: Vec<(String, String)>,
    },
    /// `RECLUSTER t [BY (expr, ...)] [WITH (target_rows_per_fragment = n | destinations = m)]
    /// [WHERE p]`; without BY, the table's stored CLUSTER BY key. Expressions as SQL text.
    Recluster {
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// The `BY (...)` expressions (empty: the table's CLUSTER BY key).
        keys: Vec<String>,
        /// The `WITH (k = v, ...)` options in order: keys lower-cased, values as written.
        options: Vec<(String, String)>,
        /// The `WHERE` condition as SQL text, its pgvector and DuckDB spellings already
        /// rewritten to fragvec's functions.
        filter: Option<String>,
    },
    /// `VACUUM t [RETAIN n VERSIONS]`
    Vacuum {
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// `RETAIN n VERSIONS` (default: the table's retention).
        retain_versions: Option<u64>,
    },
    /// `ALTER TABLE t SET (name = value, ...)` / `ALTER TABLE t RESET (name, ...)`: table
    /// (maintenance) properties; `None` resets one to its default.
    AlterTableProperties {
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// Each property (name lower-cased) and its new value (`None`: back to its default).
        changes: Vec<(String, Option<String>)>,
    },
    /// `MAINTAIN t [WITH (name = value, ...)]`: one maintenance round now, under the table's
    /// policy with the options overriding it for this round.
    Maintain {
        /// The table's name, normalized (unquoted names lower-cased).
        table: String,
        /// The `WITH (k = v, ...)` options in order: keys lower-cased, values as written.
        options: Vec<(String, String)>,
    },
}

/// What `OPTIMIZE INDEX` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizeAction {
    /// Index the fragments no segment owns, as a new segment.
    Append,
    /// Rewrite the newest `n` segments and the unindexed fragments into one segment.
    Merge(usize),
    /// Train a new model on the current rows and rebuild every segment.
    Retrain,
}

/// Parses a string of `;`-separated statements in DataFusion's default (generic) dialect.
pub fn parse_statements(sql: &str) -> Result<Vec<FragvecStatement>> {
    parse_statements_in(sql, &GenericDialect {}, DEFAULT_RECURSION_LIMIT)
}

/// How deeply nested an expression may be when no session says otherwise (DataFusion's
/// default `datafusion.sql_parser.recursion_limit`).
pub const DEFAULT_RECURSION_LIMIT: usize = 50;

/// Parses a string of `;`-separated statements in `dialect` (a session's
/// `datafusion.sql_parser.dialect`: lambdas, DuckDB's `STRUCT(...)`, Postgres' `#` and `^`,
/// MySQL's intervals, `1_000` all depend on it), nesting at most `recursion_limit` deep.
pub fn parse_statements_in(
    sql: &str,
    dialect: &dyn Dialect,
    recursion_limit: usize,
) -> Result<Vec<FragvecStatement>> {
    let tokens = Tokenizer::new(dialect, sql)
        .tokenize_with_location()
        .map_err(|e| DataFusionError::SQL(Box::new(e.into()), None))?;
    let tokens = rewrite_version_as_of(tokens)?;
    let tokens = vector_syntax::join_vector_operators(tokens);
    let mut parser = DFParserBuilder::new(tokens)
        .with_dialect(dialect)
        .with_recursion_limit(recursion_limit)
        .build()?;
    let mut out = Vec::new();
    loop {
        while parser.parser.consume_token(&Token::SemiColon) {}
        if parser.parser.peek_token() == Token::EOF {
            break;
        }
        // fragvec's own statements are recognized here, by their first keywords, before
        // DataFusion's parser sees them.
        let statement = match own_statement(&mut parser.parser)? {
            Some(s) => s,
            None => {
                let mut statement = parser.parse_statement()?;
                desugar_statement(&mut statement);
                FragvecStatement::DataFusion(Box::new(statement))
            }
        };
        out.push(statement);
        let next = parser.parser.peek_token();
        if next != Token::SemiColon && next != Token::EOF {
            return plan_err!("expected end of statement, found: {next}");
        }
    }
    Ok(out)
}

/// Applies [`vector_syntax::desugar`] to every SQL AST a DataFusion statement holds.
fn desugar_statement(statement: &mut DFStatement) {
    match statement {
        DFStatement::Statement(s) => vector_syntax::desugar(s.as_mut()),
        DFStatement::Explain(e) => desugar_statement(e.statement.as_mut()),
        DFStatement::CopyTo(c) => {
            if let CopyToSource::Query(q) = &mut c.source {
                vector_syntax::desugar(q.as_mut());
            }
        }
        DFStatement::CreateExternalTable(_) | DFStatement::Reset(_) => {}
    }
}

/// Parses one expression (a `knn(...)` filter given as text), with fragvec's spellings.
pub fn parse_expr(sql: &str) -> Result<Expr> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| DataFusionError::SQL(Box::new(e.into()), None))?;
    let tokens = vector_syntax::join_vector_operators(tokens);
    let mut parser = Parser::new(&dialect).with_tokens_with_locations(tokens);
    let mut expr = parser.parse_expr().map_err(sql_err)?;
    if parser.peek_token() != Token::EOF {
        return plan_err!(
            "unexpected {} after the expression {expr}",
            parser.peek_token()
        );
    }
    vector_syntax::desugar(&mut expr);
    Ok(expr)
}

fn word_is(t: &Token, word: &str) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

fn sql_err(e: ParserError) -> DataFusionError {
    DataFusionError::SQL(Box::new(e), None)
}

fn name(p: &mut Parser) -> Result<String> {
    let ident = p.parse_identifier().map_err(sql_err)?;
    Ok(crate::sql::pin::normalize_ident(&ident))
}

/// `name ON table`
fn index_on_table(p: &mut Parser) -> Result<(String, String)> {
    let index = name(p)?;
    p.expect_keyword_is(Keyword::ON).map_err(sql_err)?;
    let table = name(p)?;
    Ok((index, table))
}

/// `[WITH (key = value, ...)]`: keys lower-cased, values as written.
fn with_options(p: &mut Parser) -> Result<Vec<(String, String)>> {
    let mut options = Vec::new();
    if !p.parse_keyword(Keyword::WITH) {
        return Ok(options);
    }
    p.expect_token(&Token::LParen).map_err(sql_err)?;
    loop {
        let key = option_key(p)?;
        p.expect_token(&Token::Eq).map_err(sql_err)?;
        let value = option_value(p, &key)?;
        options.push((key, value));
        if !p.consume_token(&Token::Comma) {
            break;
        }
    }
    p.expect_token(&Token::RParen).map_err(sql_err)?;
    Ok(options)
}

/// The key of `key = value`, lower-cased.
fn option_key(p: &mut Parser) -> Result<String> {
    Ok(p.parse_identifier()
        .map_err(sql_err)?
        .value
        .to_ascii_lowercase())
}

/// The value of `key = value`: a number (negative ones too, so that their error says what
/// is wrong with them rather than with a minus sign), a string or a word.
fn option_value(p: &mut Parser, key: &str) -> Result<String> {
    Ok(match p.next_token().token {
        Token::Number(n, _) => n,
        Token::Minus => match p.next_token().token {
            Token::Number(n, _) => format!("-{n}"),
            other => return plan_err!("bad value for option {key}: -{other}"),
        },
        Token::SingleQuotedString(s) => s,
        Token::Word(w) => w.value,
        other => return plan_err!("bad value for option {key}: {other}"),
    })
}

/// `ALTER TABLE t SET (k = v, ...)` or `ALTER TABLE t RESET (k, ...)`, after `ALTER TABLE`.
fn alter_table_properties(p: &mut Parser) -> Result<FragvecStatement> {
    let table = name(p)?;
    let reset = word_is(&p.next_token().token, "reset");
    p.expect_token(&Token::LParen).map_err(sql_err)?;
    let mut changes = Vec::new();
    loop {
        let key = option_key(p)?;
        let value = if reset {
            None
        } else {
            p.expect_token(&Token::Eq).map_err(sql_err)?;
            Some(option_value(p, &key)?)
        };
        changes.push((key, value));
        if !p.consume_token(&Token::Comma) {
            break;
        }
    }
    p.expect_token(&Token::RParen).map_err(sql_err)?;
    Ok(FragvecStatement::AlterTableProperties { table, changes })
}

/// Parses one of fragvec's own statements, or returns `None` (consuming nothing).
fn own_statement(p: &mut Parser) -> Result<Option<FragvecStatement>> {
    let t0 = p.peek_nth_token(0).token;
    let t1 = p.peek_nth_token(1).token;
    let t2 = p.peek_nth_token(2).token;
    if is_keyword(&t0, Keyword::CREATE) && word_is(&t1, "vector") && is_keyword(&t2, Keyword::INDEX)
    {
        for _ in 0..3 {
            p.next_token();
        }
        let (index, table) = index_on_table(p)?;
        p.expect_token(&Token::LParen).map_err(sql_err)?;
        let column = name(p)?;
        p.expect_token(&Token::RParen).map_err(sql_err)?;
        p.expect_keyword_is(Keyword::USING).map_err(sql_err)?;
        let kind = p
            .parse_identifier()
            .map_err(sql_err)?
            .value
            .to_ascii_uppercase();
        let options = with_options(p)?;
        return Ok(Some(FragvecStatement::CreateVectorIndex {
            name: index,
            table,
            column,
            kind,
            options,
        }));
    }
    if is_keyword(&t0, Keyword::ALTER)
        && is_keyword(&t1, Keyword::TABLE)
        && matches!(t2, Token::Word(_))
        && (is_keyword(&p.peek_nth_token(3).token, Keyword::SET)
            || word_is(&p.peek_nth_token(3).token, "reset"))
        && p.peek_nth_token(4).token == Token::LParen
    {
        p.next_token();
        p.next_token();
        return alter_table_properties(p).map(Some);
    }
    if word_is(&t0, "maintain") && matches!(t1, Token::Word(_)) {
        p.next_token();
        let table = name(p)?;
        let options = with_options(p)?;
        return Ok(Some(FragvecStatement::Maintain { table, options }));
    }
    if word_is(&t0, "compact") && matches!(t1, Token::Word(_)) {
        p.next_token();
        let table = name(p)?;
        let options = with_options(p)?;
        return Ok(Some(FragvecStatement::Compact { table, options }));
    }
    if word_is(&t0, "recluster") && matches!(t1, Token::Word(_)) {
        p.next_token();
        let table = name(p)?;
        let mut keys = Vec::new();
        if p.parse_keyword(Keyword::BY) {
            p.expect_token(&Token::LParen).map_err(sql_err)?;
            keys = p
                .parse_comma_separated(Parser::parse_expr)
                .map_err(sql_err)?
                .into_iter()
                .map(|mut e| {
                    vector_syntax::desugar(&mut e);
                    e.to_string()
                })
                .collect();
            p.expect_token(&Token::RParen).map_err(sql_err)?;
        }
        let options = with_options(p)?;
        let filter = if p.parse_keyword(Keyword::WHERE) {
            let mut e = p.parse_expr().map_err(sql_err)?;
            vector_syntax::desugar(&mut e);
            Some(e.to_string())
        } else {
            None
        };
        return Ok(Some(FragvecStatement::Recluster {
            table,
            keys,
            options,
            filter,
        }));
    }
    if is_keyword(&t0, Keyword::VACUUM) && matches!(t1, Token::Word(_)) {
        p.next_token();
        let table = name(p)?;
        let mut retain_versions = None;
        if word_is(&p.peek_token().token, "retain") {
            p.next_token();
            let n = p.parse_literal_uint().map_err(sql_err)?;
            if !p.parse_keyword(Keyword::VERSIONS) && !word_is(&p.peek_token().token, "version") {
                return plan_err!("expected VACUUM t RETAIN n VERSIONS");
            }
            if word_is(&p.peek_token().token, "version") {
                p.next_token();
            }
            if n == 0 {
                return plan_err!("VACUUM ... RETAIN n VERSIONS needs n >= 1");
            }
            retain_versions = Some(n);
        }
        return Ok(Some(FragvecStatement::Vacuum {
            table,
            retain_versions,
        }));
    }
    if is_keyword(&t0, Keyword::DROP) && is_keyword(&t1, Keyword::INDEX) {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let (index, table) = index_on_table(p)?;
        return Ok(Some(FragvecStatement::DropIndex {
            name: index,
            table,
            if_exists,
        }));
    }
    if is_keyword(&t0, Keyword::OPTIMIZE) && is_keyword(&t1, Keyword::INDEX) {
        p.next_token();
        p.next_token();
        let (index, table) = index_on_table(p)?;
        let next = p.peek_token().token;
        let action = if word_is(&next, "append") {
            p.next_token();
            OptimizeAction::Append
        } else if is_keyword(&next, Keyword::MERGE) {
            p.next_token();
            let n = p.parse_literal_uint().map_err(sql_err)?;
            if n == 0 {
                return plan_err!("OPTIMIZE INDEX ... MERGE n needs n >= 1");
            }
            OptimizeAction::Merge(n as usize)
        } else if word_is(&next, "retrain") {
            p.next_token();
            OptimizeAction::Retrain
        } else {
            OptimizeAction::Append
        };
        return Ok(Some(FragvecStatement::OptimizeIndex {
            name: index,
            table,
            action,
        }));
    }
    Ok(None)
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
            return plan_err!("VERSION AS OF must follow a table name");
        };
        let version: u64 = match at(4) {
            Some(Token::Number(n, _)) => n.parse().map_err(|_| {
                plan_datafusion_err!("VERSION AS OF needs a version number, not {n}")
            })?,
            other => {
                return plan_err!(
                    "VERSION AS OF needs a version number, found {}",
                    other
                        .map(|t| t.to_string())
                        .unwrap_or_else(|| "end of input".into())
                );
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
        let FragvecStatement::DataFusion(s) = s.pop().unwrap() else {
            panic!("not a DataFusion statement")
        };
        s.to_string()
    }

    #[test]
    fn index_statements() {
        let s = parse_statements(
            "CREATE VECTOR INDEX idx ON T (Emb) USING ivf_flat WITH (num_partitions = 4, metric = 'cosine'); \
             DROP INDEX IF EXISTS idx ON t; OPTIMIZE INDEX idx ON t MERGE 2; OPTIMIZE INDEX idx ON t",
        )
        .unwrap();
        assert!(
            matches!(&s[0], FragvecStatement::CreateVectorIndex { name, table, column, kind, options }
            if name == "idx" && table == "t" && column == "emb" && kind == "IVF_FLAT"
               && options == &vec![("num_partitions".to_string(), "4".to_string()), ("metric".to_string(), "cosine".to_string())])
        );
        assert!(matches!(
            &s[1],
            FragvecStatement::DropIndex {
                if_exists: true,
                ..
            }
        ));
        assert!(matches!(
            &s[2],
            FragvecStatement::OptimizeIndex {
                action: OptimizeAction::Merge(2),
                ..
            }
        ));
        assert!(matches!(
            &s[3],
            FragvecStatement::OptimizeIndex {
                action: OptimizeAction::Append,
                ..
            }
        ));
        assert!(parse_statements("CREATE VECTOR INDEX i ON t emb USING IVF_FLAT").is_err());
        assert!(parse_statements("OPTIMIZE INDEX i ON t MERGE 0").is_err());
    }

    #[test]
    fn maintenance_statements() {
        let s = parse_statements(
            "COMPACT T WITH (max_source_fragments = 3); VACUUM t RETAIN 2 VERSIONS; VACUUM t; \
             RECLUSTER t BY (zorder(a, b), c + 1) WITH (destinations = 4) WHERE a > 3; RECLUSTER t",
        )
        .unwrap();
        assert!(matches!(&s[0], FragvecStatement::Compact { table, options }
            if table == "t" && options == &vec![("max_source_fragments".to_string(), "3".to_string())]));
        assert!(matches!(
            &s[1],
            FragvecStatement::Vacuum {
                retain_versions: Some(2),
                ..
            }
        ));
        assert!(matches!(
            &s[2],
            FragvecStatement::Vacuum {
                retain_versions: None,
                ..
            }
        ));
        assert!(
            matches!(&s[3], FragvecStatement::Recluster { keys, options, filter, .. }
            if keys == &vec!["zorder(a, b)".to_string(), "c + 1".to_string()]
               && options.len() == 1 && filter.as_deref() == Some("a > 3"))
        );
        assert!(
            matches!(&s[4], FragvecStatement::Recluster { keys, filter: None, .. } if keys.is_empty())
        );
        assert!(parse_statements("VACUUM t RETAIN 0 VERSIONS").is_err());
        assert!(parse_statements("RECLUSTER t BY (").is_err());
        // A column named `compact` still parses as an ordinary statement.
        assert!(matches!(
            &parse_statements("SELECT 1 AS compact").unwrap()[0],
            FragvecStatement::DataFusion(_)
        ));
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

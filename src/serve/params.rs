//! Bound parameters of the extended query protocol, spliced into the statement text as SQL
//! literals.
//!
//! Why splice rather than bind into a DataFusion plan: every statement the server runs goes
//! through fragvec's own front end (its statements, relation pinning, vector literals taken
//! out as plan parameters, the session's kept KNN plans), which starts from text. A KNN query
//! whose vector arrives as `$1` then takes exactly the path of the same query written with a
//! literal: served by the index, its plan kept and reused for the next vector.
//!
//! Splicing is safe because the literals are rendered here, never copied: numbers are parsed
//! and printed again, vectors parsed to `f32`s and printed, strings quoted with every quote
//! doubled (and backslashes too, in an `E'...'` literal, when there are any).
//!
//! Pure functions, no IO: [`placeholders`] finds `$n` outside strings, quoted identifiers and
//! comments; [`literal`] renders one parameter; [`substitute`] puts them together.

use std::ops::Range;

use pgwire::api::Type;
use pgwire::api::results::FieldFormat;

use super::types::{self, decode_vector_binary};

/// A parameter the server cannot use: SQLSTATE and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    /// The SQLSTATE the client gets (22P02 for a value that does not parse).
    pub sqlstate: &'static str,
    /// The message the client gets.
    pub message: String,
}

impl ParamError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            sqlstate: "22P02",
            message: message.into(),
        }
    }
    /// A binary value of the wrong length or form (22P03).
    pub fn binary_format(message: impl Into<String>) -> Self {
        Self {
            sqlstate: "22P03",
            message: message.into(),
        }
    }
}

/// Where each placeholder `$n` of `sql` is: its byte range and `n` (1-based). Placeholders
/// inside string literals (`'...'`, `E'...'`, `$tag$...$tag$`), quoted identifiers and
/// comments are not placeholders, nor is `$n` inside a word (`a$1`).
pub fn placeholders(sql: &str) -> Vec<(Range<usize>, usize)> {
    scan_placeholders(sql, false)
}

/// [`placeholders`], also taking each `?` as the next parameter (`$1`, `$2`, ... in the
/// order they appear): the style of ODBC, JDBC and ADBC clients (Flight SQL).
pub fn placeholders_with_qmarks(sql: &str) -> Vec<(Range<usize>, usize)> {
    scan_placeholders(sql, true)
}

fn scan_placeholders(sql: &str, qmarks: bool) -> Vec<(Range<usize>, usize)> {
    let b = sql.as_bytes();
    let mut found = Vec::new();
    let mut next_qmark = 1;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'?' if qmarks => {
                found.push((i..i + 1, next_qmark));
                next_qmark += 1;
                i += 1;
            }
            b'\'' => {
                let escapes = i > 0 && matches!(b[i - 1], b'E' | b'e') && !word_before(b, i - 1);
                i = skip_quoted(b, i, b'\'', escapes);
            }
            b'"' => i = skip_quoted(b, i, b'"', false),
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => i = skip_block_comment(b, i),
            b'$' => {
                let start = i;
                let mut j = i + 1;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                if j > i + 1 && !word_before(b, start) {
                    if let Ok(n) = sql[start + 1..j].parse::<usize>() {
                        found.push((start..j, n));
                    }
                    i = j;
                } else if let Some(end) = dollar_quote_end(b, i) {
                    i = end;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    found
}

/// Whether the byte before `at` continues a word (so `$1` there is part of a name).
fn word_before(b: &[u8], at: usize) -> bool {
    at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_' || b[at - 1] == b'$')
}

/// The index after the closing `quote` of the literal opening at `start` (a doubled quote
/// is part of it; with `escapes`, so is a backslash-escaped byte). Unclosed: the end.
fn skip_quoted(b: &[u8], start: usize, quote: u8, escapes: bool) -> usize {
    let mut i = start + 1;
    while i < b.len() {
        if escapes && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i] == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    b.len()
}

/// The index after a (nested) block comment opening at `start`.
fn skip_block_comment(b: &[u8], start: usize) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i + 1 < b.len() {
        if b[i] == b'/' && b[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The index after a dollar-quoted string `$tag$...$tag$` opening at `start`, if one opens
/// there.
fn dollar_quote_end(b: &[u8], start: usize) -> Option<usize> {
    if word_before(b, start) {
        return None;
    }
    let mut j = start + 1;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    if b.get(j) != Some(&b'$') || b.get(start + 1).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let tag = &b[start..=j];
    let body = j + 1;
    let close = b[body..].windows(tag.len()).position(|w| w == tag)?;
    Some(body + close + tag.len())
}

/// The highest placeholder number in `sql` (0 without placeholders).
pub fn parameter_count(sql: &str) -> usize {
    placeholders(sql).iter().map(|(_, n)| *n).max().unwrap_or(0)
}

/// `sql` with each `?` written as the `$n` it stands for (see [`placeholders_with_qmarks`]):
/// the form DataFusion plans, to describe a statement an ADBC client prepared.
pub fn numbered_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut last = 0;
    for (range, n) in placeholders_with_qmarks(sql) {
        if &sql[range.clone()] == "?" {
            out.push_str(&sql[last..range.start]);
            out.push_str(&format!("${n}"));
            last = range.end;
        }
    }
    out.push_str(&sql[last..]);
    out
}

/// `sql` with each `$n` replaced by `literals[n - 1]`.
pub fn substitute(sql: &str, literals: &[String]) -> Result<String, ParamError> {
    substitute_at(sql, placeholders(sql), literals)
}

/// `sql` with each placeholder found (see [`placeholders`]) replaced by `literals[n - 1]`.
pub fn substitute_at(
    sql: &str,
    found: Vec<(Range<usize>, usize)>,
    literals: &[String],
) -> Result<String, ParamError> {
    let mut out =
        String::with_capacity(sql.len() + literals.iter().map(String::len).sum::<usize>());
    let mut last = 0;
    for (range, n) in found {
        let Some(literal) = n.checked_sub(1).and_then(|i| literals.get(i)) else {
            return Err(ParamError {
                sqlstate: "08P01",
                message: format!(
                    "the statement uses parameter ${n} but {} were bound",
                    literals.len()
                ),
            });
        };
        out.push_str(&sql[last..range.start]);
        // Spaces keep a literal from fusing with a neighbouring token (`-$1` with -5).
        out.push(' ');
        out.push_str(literal);
        out.push(' ');
        last = range.end;
    }
    out.push_str(&sql[last..]);
    Ok(out)
}

/// A SQL string literal holding `s` exactly.
pub fn quote_string(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// The SQL literal of one bound parameter of type `ty` sent in `format` (`None`: NULL).
/// A parameter whose type the client left open (`unknown`) is taken as text, as PostgreSQL
/// does: DataFusion coerces the string where the statement needs another type.
pub fn literal(ty: &Type, format: FieldFormat, value: Option<&[u8]>) -> Result<String, ParamError> {
    let Some(bytes) = value else {
        return Ok("NULL".to_string());
    };
    match format {
        FieldFormat::Text => text_literal(ty, bytes),
        FieldFormat::Binary => binary_literal(ty, bytes),
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, ParamError> {
    std::str::from_utf8(bytes).map_err(|_| ParamError {
        sqlstate: "22021",
        message: "a parameter is not valid UTF-8".into(),
    })
}

fn text_literal(ty: &Type, bytes: &[u8]) -> Result<String, ParamError> {
    let text = utf8(bytes)?;
    let t = text.trim();
    match *ty {
        Type::BOOL => parse_bool(t)
            .map(|v| if v { "TRUE" } else { "FALSE" }.to_string())
            .ok_or_else(|| {
                ParamError::invalid(format!("invalid input syntax for type boolean: \"{text}\""))
            }),
        Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => {
            t.parse::<i64>().map(|v| v.to_string()).map_err(|_| {
                ParamError::invalid(format!(
                    "invalid input syntax for type {}: \"{text}\"",
                    ty.name()
                ))
            })
        }
        Type::FLOAT4 | Type::FLOAT8 => t.parse::<f64>().map(float_literal).map_err(|_| {
            ParamError::invalid(format!(
                "invalid input syntax for type {}: \"{text}\"",
                ty.name()
            ))
        }),
        Type::NUMERIC => numeric_literal(t).ok_or_else(|| {
            ParamError::invalid(format!("invalid input syntax for type numeric: \"{text}\""))
        }),
        Type::DATE => Ok(format!("CAST({} AS DATE)", quote_string(t))),
        Type::TIMESTAMP => Ok(format!("CAST({} AS TIMESTAMP)", quote_string(t))),
        Type::TIMESTAMPTZ => Ok(format!("CAST({} AS TIMESTAMPTZ)", quote_string(t))),
        Type::BYTEA => bytea_text_literal(t),
        _ if types::is_vector(ty) => {
            let v = crate::sql::vector_syntax::parse_vector_text(t).ok_or_else(|| {
                ParamError::invalid(format!("invalid input syntax for type vector: \"{text}\""))
            })?;
            vector_literal(v.into_iter().map(|x| x as f32))
        }
        _ => Ok(quote_string(text)),
    }
}

fn binary_literal(ty: &Type, b: &[u8]) -> Result<String, ParamError> {
    let fixed = |n: usize| -> Result<&[u8], ParamError> {
        if b.len() == n {
            Ok(b)
        } else {
            Err(ParamError::binary_format(format!(
                "a binary {} parameter has {} bytes, expected {n}",
                ty.name(),
                b.len()
            )))
        }
    };
    match *ty {
        Type::BOOL => Ok(if fixed(1)?[0] != 0 { "TRUE" } else { "FALSE" }.to_string()),
        Type::INT2 => Ok(i16::from_be_bytes(fixed(2)?.try_into().unwrap()).to_string()),
        Type::INT4 => Ok(i32::from_be_bytes(fixed(4)?.try_into().unwrap()).to_string()),
        Type::OID => Ok(u32::from_be_bytes(fixed(4)?.try_into().unwrap()).to_string()),
        Type::INT8 => Ok(i64::from_be_bytes(fixed(8)?.try_into().unwrap()).to_string()),
        Type::FLOAT4 => Ok(float_literal(
            f32::from_be_bytes(fixed(4)?.try_into().unwrap()) as f64,
        )),
        Type::FLOAT8 => Ok(float_literal(f64::from_be_bytes(
            fixed(8)?.try_into().unwrap(),
        ))),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::JSON => {
            Ok(quote_string(utf8(b)?))
        }
        Type::BYTEA => Ok(format!("X'{}'", hex(b))),
        Type::FLOAT4_ARRAY | Type::FLOAT8_ARRAY => {
            let values = types::decode_float_array_binary(b).map_err(ParamError::binary_format)?;
            match values {
                Some(v) => Ok(format!(
                    "[{}]",
                    v.iter()
                        .map(|x| float_literal(*x))
                        .collect::<Vec<_>>()
                        .join(",")
                )),
                None => Err(ParamError::invalid("an array parameter has a NULL element")),
            }
        }
        _ if types::is_vector(ty) => vector_literal(
            decode_vector_binary(b)
                .map_err(ParamError::binary_format)?
                .into_iter(),
        ),
        _ => Err(ParamError {
            sqlstate: "0A000",
            message: format!(
                "binary parameters of type {} are not supported; send this parameter as text",
                ty.name()
            ),
        }),
    }
}

fn parse_bool(t: &str) -> Option<bool> {
    match t.to_ascii_lowercase().as_str() {
        "t" | "true" | "y" | "yes" | "on" | "1" => Some(true),
        "f" | "false" | "n" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// A float as DataFusion reads it back to the same value (`NaN` and infinities as casts).
pub fn float_literal(v: f64) -> String {
    if v.is_finite() {
        // `{:?}` prints the shortest text that reads back to the same f64, with a `.0` or an
        // exponent, so DataFusion reads a float, not an integer.
        format!("{v:?}")
    } else if v.is_nan() {
        "CAST('NaN' AS DOUBLE)".to_string()
    } else if v > 0.0 {
        "CAST('Infinity' AS DOUBLE)".to_string()
    } else {
        "CAST('-Infinity' AS DOUBLE)".to_string()
    }
}

/// A numeric literal, if `t` is one (digits, one point, an exponent): printed as given.
fn numeric_literal(t: &str) -> Option<String> {
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let digits = mantissa.strip_prefix(['-', '+']).unwrap_or(mantissa);
    let ok_mantissa = !digits.is_empty()
        && digits.bytes().filter(|c| *c == b'.').count() <= 1
        && digits.bytes().all(|c| c.is_ascii_digit() || c == b'.')
        && digits.bytes().any(|c| c.is_ascii_digit());
    let ok_exponent = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit())
    });
    (ok_mantissa && ok_exponent).then(|| t.to_string())
}

/// A pgvector value as a vector literal, `[1,2.5]::VECTOR`: each `f32` printed so it
/// reads back to the same bits. The cast makes it a vector wherever it goes: a distance
/// (served by the index like any vector literal) or an INSERT into a `VECTOR(n)` column.
/// Written as an array, not as text, so that the session's statement shapes see it: the
/// next execution with another vector runs on the kept plan without a parse.
/// pgvector refuses NaN and infinite elements; so does the server.
pub fn vector_literal(values: impl Iterator<Item = f32>) -> Result<String, ParamError> {
    let mut out = String::from("[");
    for (i, v) in values.enumerate() {
        if !v.is_finite() {
            return Err(ParamError::invalid(format!(
                "element {} of a vector parameter is {v}; vectors hold finite numbers",
                i + 1
            )));
        }
        if i > 0 {
            out.push(',');
        }
        out.push_str(&v.to_string());
    }
    out.push_str("]::VECTOR");
    Ok(out)
}

/// One parameter as [`bound_shape`] takes it: a rendered literal, or a vector's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    /// What [`literal`] rendered.
    Literal(String),
    /// A `vector` parameter's elements (finite), decoded but not written out.
    Vector(Vec<f32>),
}

/// The shape ([`crate::sql::vector_shape`]) of the text [`substitute`] makes of `sql` and
/// `params`, without writing out the vectors: a vector of at least
/// [`MIN_ELEMENTS`](crate::sql::vector_shape::MIN_ELEMENTS) elements takes its literal's
/// place as the mask, its values go to the shape's lists. The shape equals what
/// [`shape_of`](crate::sql::vector_shape::shape_of) finds in the spliced text, its lists the
/// same `f32`s; `None` when there is no such vector, or the text needs the full path.
pub fn bound_shape(sql: &str, params: &[Bound]) -> Option<crate::sql::vector_shape::Shape> {
    use crate::sql::vector_shape::{MASK, MIN_ELEMENTS, shape_with_lists};
    let masked_literal = format!("{MASK}::VECTOR");
    let masked = |b: &Bound| matches!(b, Bound::Vector(v) if v.len() >= MIN_ELEMENTS);
    let found = placeholders(sql);
    let mut lists = Vec::new();
    for (_, n) in &found {
        if let Some(Bound::Vector(v)) = n.checked_sub(1).and_then(|i| params.get(i))
            && v.len() >= MIN_ELEMENTS
        {
            lists.push(v.iter().map(|&x| f64::from(x)).collect());
        }
    }
    if lists.is_empty() {
        return None;
    }
    let mut literals = Vec::with_capacity(params.len());
    for b in params {
        literals.push(match b {
            Bound::Vector(v) if v.iter().any(|x| !x.is_finite()) => return None,
            _ if masked(b) => masked_literal.clone(),
            Bound::Literal(l) => l.clone(),
            Bound::Vector(v) => vector_literal(v.iter().copied()).ok()?,
        });
    }
    let text = substitute_at(sql, found, &literals).ok()?;
    shape_with_lists(&text, lists)
}

/// A `bytea` in PostgreSQL's hex text form (`\x...`) as a binary literal.
fn bytea_text_literal(t: &str) -> Result<String, ParamError> {
    let hex_digits = t.strip_prefix("\\x").ok_or_else(|| {
        ParamError::invalid("a bytea parameter in text must use the hex form \\x...")
    })?;
    if hex_digits.len() % 2 != 0 || !hex_digits.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(ParamError::invalid(
            "invalid hexadecimal data in a bytea parameter",
        ));
    }
    Ok(format!("X'{hex_digits}'"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn qmarks_are_numbered_outside_strings_and_comments() {
        assert_eq!(
            numbered_placeholders("SELECT ?, '?', \"?\" -- ?\n FROM t WHERE a = ? AND b = $7"),
            "SELECT $1, '?', \"?\" -- ?\n FROM t WHERE a = $2 AND b = $7"
        );
        assert_eq!(numbered_placeholders("SELECT 1"), "SELECT 1");
    }

    #[test]
    fn finds_placeholders_outside_literals_and_comments() {
        let sql = "SELECT $1, '$2', \"$3\", a$4, E'\\'$5', $$ $6 $$, $t$ $7 $t$ -- $8\n /* $9 /* $10 */ */ $11";
        let found: Vec<usize> = placeholders(sql).into_iter().map(|(_, n)| n).collect();
        assert_eq!(found, vec![1, 11]);
        assert_eq!(parameter_count("SELECT $2 + $1"), 2);
        assert_eq!(parameter_count("SELECT 1"), 0);
    }

    #[test]
    fn substitutes_and_refuses_missing_parameters() {
        let s = substitute("SELECT $1, -$2", &["'a''b'".into(), "-5".into()]).unwrap();
        assert_eq!(s, "SELECT  'a''b' , - -5 ");
        let e = substitute("SELECT $3", &["1".into()]).unwrap_err();
        assert_eq!(e.sqlstate, "08P01");
    }

    #[test]
    fn renders_typed_literals() {
        let t = |ty: &Type, s: &str| literal(ty, FieldFormat::Text, Some(s.as_bytes()));
        assert_eq!(t(&Type::INT8, " 42 ").unwrap(), "42");
        assert!(t(&Type::INT4, "1; DROP TABLE x").is_err());
        assert_eq!(t(&Type::FLOAT8, "1").unwrap(), "1.0");
        assert_eq!(t(&Type::BOOL, "t").unwrap(), "TRUE");
        assert_eq!(t(&Type::TEXT, "it's").unwrap(), "'it''s'");
        assert_eq!(t(&Type::UNKNOWN, "a\\'b").unwrap(), "E'a\\\\''b'");
        assert_eq!(t(&Type::NUMERIC, "-1.5e3").unwrap(), "-1.5e3");
        assert!(t(&Type::NUMERIC, "1e").is_err());
        assert_eq!(
            literal(&Type::INT8, FieldFormat::Text, None).unwrap(),
            "NULL"
        );
        let b = |ty: &Type, v: &[u8]| literal(ty, FieldFormat::Binary, Some(v));
        assert_eq!(b(&Type::INT4, &7i32.to_be_bytes()).unwrap(), "7");
        assert_eq!(b(&Type::FLOAT4, &0.5f32.to_be_bytes()).unwrap(), "0.5");
        assert_eq!(b(&Type::INT8, &[1, 2]).unwrap_err().sqlstate, "22P03");
        assert_eq!(b(&Type::NUMERIC, &[0; 8]).unwrap_err().sqlstate, "0A000");
    }

    #[test]
    fn vectors_in_both_formats() {
        let ty = types::vector_type();
        let text = literal(&ty, FieldFormat::Text, Some(b"[1, 2.5,-3]")).unwrap();
        assert_eq!(text, "[1,2.5,-3]::VECTOR");
        let mut bin = vec![0, 3, 0, 0];
        for v in [1.0f32, 2.5, -3.0] {
            bin.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(literal(&ty, FieldFormat::Binary, Some(&bin)).unwrap(), text);
        assert!(literal(&ty, FieldFormat::Binary, Some(&bin[..7])).is_err());
        assert!(literal(&ty, FieldFormat::Text, Some(b"[1,")).is_err());
        let mut nan = vec![0, 1, 0, 0];
        nan.extend_from_slice(&f32::NAN.to_be_bytes());
        assert_eq!(
            literal(&ty, FieldFormat::Binary, Some(&nan))
                .unwrap_err()
                .sqlstate,
            "22P02"
        );
    }

    proptest! {
        /// Any string survives quoting: the tokenizer reads back exactly the string.
        #[test]
        fn quoted_strings_read_back(s in "\\PC*") {
            use datafusion::sql::sqlparser::dialect::GenericDialect;
            use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
            let quoted = quote_string(&s);
            let tokens = Tokenizer::new(&GenericDialect {}, &quoted).tokenize().unwrap();
            prop_assert_eq!(tokens.len(), 1);
            match &tokens[0] {
                Token::SingleQuotedString(v) | Token::EscapedStringLiteral(v) => prop_assert_eq!(v, &s),
                other => prop_assert!(false, "unexpected token {other:?}"),
            }
        }

        /// A statement's shape made from its decoded vectors is the shape of its spliced text,
        /// with the same f32 values: whatever the vectors, other parameters and placement.
        #[test]
        fn bound_shape_is_the_spliced_texts_shape(
            bits in proptest::collection::vec(any::<u32>(), 8..20),
            short in proptest::collection::vec(-10f32..10f32, 1..8),
            text_param in "[a-z' ]{0,6}",
            sql_index in 0usize..4,
        ) {
            let v: Vec<f32> = bits.into_iter().map(f32::from_bits).filter(|x| x.is_finite()).collect();
            prop_assume!(v.len() >= 8);
            let sql = [
                "SELECT id FROM t ORDER BY emb <-> $1 LIMIT 10",
                "SELECT id FROM t WHERE note = $2 ORDER BY emb <=> $1 LIMIT $3",
                "SELECT id, emb <-> $1 AS d FROM t WHERE emb <-> $1 < 5 AND w <-> $3 < 1 ORDER BY d",
                "SELECT $2, [1,2,3,4,5,6,7,8,9], '[1,2,3,4,5,6,7,8,9]', $1",
            ][sql_index];
            let params = [
                Bound::Vector(v.clone()),
                Bound::Literal(quote_string(&text_param)),
                Bound::Vector(short.clone()),
            ];
            let literals: Vec<String> = params.iter().map(|b| match b {
                Bound::Literal(l) => l.clone(),
                Bound::Vector(v) => vector_literal(v.iter().copied()).unwrap(),
            }).collect();
            let spliced = substitute(sql, &literals).unwrap();
            let want = crate::sql::vector_shape::shape_of(&spliced);
            let got = bound_shape(sql, &params);
            if sql_index == 3 {
                // A list of the text's own: the full path reads it.
                prop_assert!(got.is_none());
            } else {
                let (want, got) = (want.unwrap(), got.unwrap());
                prop_assert_eq!(&got.text, &want.text);
                let as_f32 = |l: &Vec<Vec<f64>>| -> Vec<Vec<f32>> {
                    l.iter().map(|v| v.iter().map(|&x| x as f32).collect()).collect()
                };
                prop_assert_eq!(as_f32(&got.lists), as_f32(&want.lists));
            }
        }

        /// f32 vector elements read back to the same bits.
        #[test]
        fn vector_elements_round_trip(v in proptest::collection::vec(-1e30f32..1e30f32, 1..20)) {
            let lit = vector_literal(v.iter().copied()).unwrap();
            let text = lit.strip_suffix("::VECTOR").unwrap();
            let parsed = crate::sql::vector_syntax::parse_vector_text(text).unwrap();
            let back: Vec<f32> = parsed.into_iter().map(|x| x as f32).collect();
            prop_assert_eq!(back, v);
        }
    }
}

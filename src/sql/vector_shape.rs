//! The shape of a statement's text: the text with its long numeric list literals masked, and
//! their values, found without parsing.
//!
//! An application sends the same KNN statement again and again with another query vector.
//! Parsing 128 (or 1536) numbers with the SQL parser and walking the tree costs more than the
//! search; two texts equal outside their list literals parse to trees that differ only in
//! those lists' values. So the session can key what it learnt from running one text (the
//! plan it kept, see `engine::statements::shapes`) by the masked text, and answer the next
//! text of that shape from its list values alone.
//!
//! The scan is deliberately narrow. It copies quoted strings (`'…'`, `''` escapes) and quoted
//! identifiers (`"…"`) untouched, and gives up (`None`) on anything whose lexing depends on
//! the dialect in ways it does not follow: comments (`--`, `/*`, `#` other than pgvector's
//! `<#>`), backslashes, `$` quoting and backticks. A list is masked only when it is `[`,
//! numbers separated by commas, `]`, with at least [`MIN_ELEMENTS`] numbers (the vector
//! literals `vector_params` turns into parameters); every other bracket is copied. Pure
//! string work, no IO.

/// Lists shorter than this stay in the masked text (`vector_params` plans them as written).
pub const MIN_ELEMENTS: usize = 8;

/// What replaces each masked list in the shape text.
pub const MASK: &str = "[?]";

/// A statement text with its long numeric list literals masked.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The text with each masked list written as `[?]`.
    pub text: String,
    /// The values of the masked lists, in text order.
    pub lists: Vec<Vec<f64>>,
}

/// The shape of `sql`, or `None` when the text has no masked list or uses lexical forms the
/// scan does not follow (see the module docs).
pub fn shape_of(sql: &str) -> Option<Shape> {
    scan(sql).filter(|s| !s.lists.is_empty())
}

/// The shape of a text whose lists are masked already: a server that splices decoded
/// vector parameters into a statement as [`MASK`] gives their values as `lists` (in text
/// order) instead of writing them out for [`shape_of`] to read back. `None` when the scan
/// does not follow `text`, or finds a list of its own (it would have to be in `lists`).
pub fn shape_with_lists(text: &str, lists: Vec<Vec<f64>>) -> Option<Shape> {
    let scanned = scan(text)?;
    (scanned.lists.is_empty() && !lists.is_empty()).then_some(Shape {
        text: scanned.text,
        lists,
    })
}

/// The text with its long numeric lists masked, and their values (none is no error).
fn scan(sql: &str) -> Option<Shape> {
    let bytes = sql.as_bytes();
    let mut text = String::with_capacity(sql.len().min(4096));
    let mut lists = Vec::new();
    let mut i = 0;
    let mut copied = 0; // bytes of `sql` before this are in `text` or masked
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => i = quoted_end(bytes, i, q)?,
            b'\\' | b'$' | b'`' => return None,
            b'-' if bytes.get(i + 1) == Some(&b'-') => return None,
            b'/' if bytes.get(i + 1) == Some(&b'*') => return None,
            b'#' if !(i > 0 && bytes[i - 1] == b'<' && bytes.get(i + 1) == Some(&b'>')) => {
                return None;
            }
            b'[' => match numeric_list(bytes, i) {
                Some((values, end)) if values.len() >= MIN_ELEMENTS => {
                    text.push_str(&sql[copied..i]);
                    text.push_str(MASK);
                    lists.push(values);
                    i = end;
                    copied = end;
                }
                _ => i += 1,
            },
            _ => i += 1,
        }
    }
    text.push_str(&sql[copied..]);
    Some(Shape { text, lists })
}

/// The index just past the quoted run starting at `start` (a doubled quote is an escaped
/// one); `None` if it never closes.
fn quoted_end(bytes: &[u8], start: usize, quote: u8) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        if bytes[i] == quote {
            if bytes.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// `[n, n, …]` starting at `start`: its values and the index past `]`.
fn numeric_list(bytes: &[u8], start: usize) -> Option<(Vec<f64>, usize)> {
    let mut values = Vec::new();
    let mut i = skip_space(bytes, start + 1);
    loop {
        let (value, end) = signed_number(bytes, i)?;
        values.push(value);
        i = skip_space(bytes, end);
        match bytes.get(i)? {
            b',' => i = skip_space(bytes, i + 1),
            b']' => return Some((values, i + 1)),
            _ => return None,
        }
    }
}

/// An optional sign (as a unary operator, so spaces may follow it) and an unsigned number,
/// valued as the parser's tree would value it: the number parsed as `f64`, negated for `-`.
fn signed_number(bytes: &[u8], start: usize) -> Option<(f64, usize)> {
    let (negative, i) = match bytes.get(start)? {
        b'-' => (true, skip_space(bytes, start + 1)),
        b'+' => (false, skip_space(bytes, start + 1)),
        _ => (false, start),
    };
    let end = unsigned_number_end(bytes, i)?;
    let text = std::str::from_utf8(&bytes[i..end]).ok()?;
    let value: f64 = text.parse().ok()?;
    Some((if negative { -value } else { value }, end))
}

/// The end of `digits[.digits][e[+-]digits]` or `.digits[e[+-]digits]` at `start`; `None`
/// for anything else (hex, underscores, a letter right after: forms left to the parser).
fn unsigned_number_end(bytes: &[u8], start: usize) -> Option<usize> {
    let digits = |mut i: usize| {
        let from = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        (i, i - from)
    };
    let (mut i, whole) = digits(start);
    let mut fraction = 0;
    if bytes.get(i) == Some(&b'.') {
        (i, fraction) = digits(i + 1);
    }
    if whole + fraction == 0 {
        return None;
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(bytes.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let (end, exponent) = digits(j);
        if exponent == 0 {
            return None;
        }
        i = end;
    }
    if bytes
        .get(i)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
    {
        return None;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn vector(values: &[f32]) -> String {
        let items: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
        format!("[{}]", items.join(", "))
    }

    #[test]
    fn masks_long_numeric_lists_and_keeps_the_rest() {
        let v = [0.5f32, -1.0, 2e-3, 3.0, 4.0, 5.0, 6.0, 7.0];
        let sql = format!(
            "SELECT id, tags FROM t WHERE tags = [1, 2] ORDER BY emb <-> {} LIMIT 10",
            vector(&v)
        );
        let shape = shape_of(&sql).unwrap();
        assert_eq!(
            shape.text,
            "SELECT id, tags FROM t WHERE tags = [1, 2] ORDER BY emb <-> [?] LIMIT 10"
        );
        // The values as written (`0.002`), parsed as `f64` like the parser's tree holds them.
        assert_eq!(
            shape.lists,
            vec![vec![0.5, -1.0, 0.002, 3.0, 4.0, 5.0, 6.0, 7.0]]
        );
        // pgvector's negative inner product operator is not a comment.
        assert!(shape_of(&sql.replace("<->", "<#>")).is_some());
    }

    #[test]
    fn lists_inside_quotes_are_text_and_unfollowed_lexing_gives_up() {
        let list = "[1,2,3,4,5,6,7,8]";
        assert_eq!(shape_of(&format!("SELECT '{list}'")), None);
        assert_eq!(shape_of(&format!("SELECT \"a{list}\" FROM t")), None);
        let quoted = shape_of(&format!("SELECT 'it''s {list}', {list}")).unwrap();
        assert_eq!(quoted.text, format!("SELECT 'it''s {list}', [?]"));
        for bad in [
            format!("SELECT {list} -- c"),
            format!("SELECT {list} /* c */"),
            format!("SELECT {list} # c"),
            format!("SELECT E'\\'' , {list}"),
            format!("SELECT $$x$$, {list}"),
            format!("SELECT `a`, {list}"),
            format!("SELECT 'open {list}"),
        ] {
            assert_eq!(shape_of(&bad), None, "{bad}");
        }
        // Forms the parser reads differently are not masked.
        for kept in [
            "[0x1,2,3,4,5,6,7,8]",
            "[1_0,2,3,4,5,6,7,8]",
            "[1e,2,3,4,5,6,7,8]",
            "[1,2,3,4,5,6,7,8,]",
            "[[1,2,3,4,5,6,7,8]]",
            "[1,2,3,4,5,6,7,a]",
        ] {
            let got = shape_of(&format!("SELECT {kept}"));
            assert!(
                got.as_ref().is_none_or(|s| s.text.contains(kept)
                    || (kept.starts_with("[[") && s.text == "SELECT [[?]]")),
                "{kept}: {got:?}"
            );
        }
    }

    proptest! {
        /// Two texts differing only in their vectors have the same shape, and the lists are
        /// the values written (as `f64` parsing of the written `f32`s gives them).
        #[test]
        fn prop_shape_is_the_text_without_its_vectors(
            a in proptest::collection::vec(-1e6f32..1e6, 8..40),
            b in proptest::collection::vec(-1e6f32..1e6, 8..40),
            spaced in any::<bool>(),
        ) {
            let items = |v: &[f32]| -> Vec<String> {
                v.iter()
                    .map(|x| if spaced { format!(" {x:e} ") } else { format!("{x}") })
                    .collect()
            };
            let write = |v: &[f32]| format!("[{}]", items(v).join(","));
            let sql = |v: &[f32]| {
                format!("SELECT id FROM t WHERE c = 'x[1]' ORDER BY l2_distance(emb, {}) LIMIT 5", write(v))
            };
            let (sa, sb) = (shape_of(&sql(&a)).unwrap(), shape_of(&sql(&b)).unwrap());
            prop_assert_eq!(&sa.text, &sb.text);
            // The value the parser's tree holds: the written number parsed as `f64`.
            let expect: Vec<f64> = items(&a).iter().map(|t| t.trim().parse().unwrap()).collect();
            prop_assert_eq!(&sa.lists, &vec![expect]);
        }
    }
}

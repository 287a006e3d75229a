//! The three data formats of PostgreSQL's `COPY ... FROM STDIN`, decoded into rows of
//! cells: the arithmetic, no IO. The client's CopyData messages split the data anywhere —
//! inside a row, a quoted field or a length word — so a decoder takes bytes in pieces of any
//! size and gives the same rows as for the whole ([`RowDecoder::feed`], then
//! [`RowDecoder::finish`]).
//!
//! - **text**: a row per line, fields split by the delimiter (tab), `\N` for NULL, backslash
//!   escapes (`\t`, `\n`, `\\`, octal `\123`, hex `\x4F`, ...), `\.` alone ends the data.
//! - **csv**: RFC 4180 with PostgreSQL's options: quoted fields may hold delimiters, quotes
//!   (doubled, or after the escape character) and newlines; an unquoted empty field is NULL
//!   (or the `NULL` option's string), a quoted one is an empty string; `HEADER` skips a line.
//! - **binary**: `PGCOPY\n\377\r\n\0`, flags, a header extension, then per row a 16-bit field
//!   count and per field a 32-bit length (-1: NULL) and its bytes in the column type's binary
//!   form; a field count of -1 ends the data.

/// One cell: `None` is SQL NULL. Text and CSV cells are UTF-8 text (checked); binary cells
/// are the type's binary form.
pub type Cell = Option<Vec<u8>>;

/// What went wrong, worded for the client (SQLSTATE 22P04, bad COPY file format, unless
/// said otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyError {
    /// The SQLSTATE the client gets.
    pub sqlstate: &'static str,
    /// The message the client gets.
    pub message: String,
}

fn bad(message: impl Into<String>) -> CopyError {
    CopyError {
        sqlstate: "22P04",
        message: message.into(),
    }
}

/// The options of one COPY, as its `WITH (...)` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyFormat {
    /// PostgreSQL's text format (the default).
    Text {
        /// Between fields (tab).
        delimiter: u8,
        /// What a NULL is written as (`\N`).
        null: Vec<u8>,
        /// Whether a line of column names comes first.
        header: bool,
    },
    /// CSV, with its options.
    Csv(CsvOptions),
    /// PostgreSQL's binary format (no options).
    Binary,
}

/// The options of CSV format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// Between fields (`,`).
    pub delimiter: u8,
    /// Around a field that needs quoting (`"`).
    pub quote: u8,
    /// Before a quote (or itself) inside quotes (the quote character, so quotes double).
    pub escape: u8,
    /// What a NULL is written as (nothing: an unquoted empty field).
    pub null: Vec<u8>,
    /// Whether a line of column names comes first.
    pub header: bool,
}

impl CopyFormat {
    /// PostgreSQL's defaults for text format.
    pub fn text() -> Self {
        CopyFormat::Text {
            delimiter: b'\t',
            null: b"\\N".to_vec(),
            header: false,
        }
    }

    /// PostgreSQL's defaults for CSV format.
    pub fn csv() -> Self {
        CopyFormat::Csv(CsvOptions {
            delimiter: b',',
            quote: b'"',
            escape: b'"',
            null: Vec::new(),
            header: false,
        })
    }

    /// The format code of CopyInResponse: 0 textual, 1 binary.
    pub fn code(&self) -> i8 {
        matches!(self, CopyFormat::Binary) as i8
    }
}

/// The binary format's 11-byte signature.
pub const BINARY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// Rows out of a COPY's bytes, in pieces.
#[derive(Debug)]
pub struct RowDecoder {
    format: CopyFormat,
    columns: usize,
    /// Bytes fed and not yet part of a whole row.
    pending: Vec<u8>,
    /// Rows decoded so far (the data's own row number, for messages).
    rows: u64,
    /// Lines / bytes still to skip before rows (a CSV header, the binary header).
    header_left: bool,
    /// The end marker (`\.` or the binary trailer) was seen: nothing may follow.
    ended: bool,
}

impl RowDecoder {
    /// A decoder for rows of `columns` cells.
    pub fn new(format: CopyFormat, columns: usize) -> Self {
        let header_left = match &format {
            CopyFormat::Csv(o) => o.header,
            CopyFormat::Binary => true,
            CopyFormat::Text { header, .. } => *header,
        };
        Self {
            format,
            columns,
            pending: Vec::new(),
            rows: 0,
            header_left,
            ended: false,
        }
    }

    /// Rows decoded so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Takes the next piece of the data; appends the rows it completes to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Vec<Cell>>) -> Result<(), CopyError> {
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let used = self.decode(&pending, out)?;
        pending.drain(..used);
        self.pending = pending;
        Ok(())
    }

    /// Decodes the whole rows at the start of `data`; gives the bytes they used.
    fn decode(&mut self, data: &[u8], out: &mut Vec<Vec<Cell>>) -> Result<usize, CopyError> {
        let mut at = 0;
        while at < data.len() {
            let rest = &data[at..];
            if self.ended {
                // PostgreSQL ignores what follows `\.` in text format; binary refuses.
                if matches!(self.format, CopyFormat::Binary) {
                    return Err(bad("data after the binary COPY trailer"));
                }
                return Ok(data.len());
            }
            let step = match &self.format {
                CopyFormat::Binary => self.binary_step(rest)?,
                CopyFormat::Text { .. } | CopyFormat::Csv(_) => self.line_step(rest, false)?,
            };
            match step {
                Step::NeedMore => break,
                Step::Consumed(n, row) => {
                    at += n;
                    if let Some(row) = row {
                        self.rows += 1;
                        out.push(row);
                    }
                }
            }
        }
        Ok(at)
    }

    /// The data has ended (CopyDone): decodes a last line without its newline, and refuses
    /// a row or binary trailer cut short.
    pub fn finish(&mut self, out: &mut Vec<Vec<Cell>>) -> Result<(), CopyError> {
        if self.pending.is_empty() || self.ended {
            return self.finish_binary_check();
        }
        match &self.format {
            CopyFormat::Binary => Err(bad(format!(
                "the binary COPY data ends inside a row ({} bytes left over)",
                self.pending.len()
            ))),
            _ => {
                let rest = std::mem::take(&mut self.pending);
                match self.line_step(&rest, true)? {
                    Step::Consumed(_, Some(row)) => {
                        self.rows += 1;
                        out.push(row);
                        Ok(())
                    }
                    Step::Consumed(_, None) => Ok(()),
                    Step::NeedMore => Err(bad(
                        "the CSV data ends inside a quoted field (unterminated CSV quoted field)",
                    )),
                }
            }
        }
    }

    fn finish_binary_check(&self) -> Result<(), CopyError> {
        if matches!(self.format, CopyFormat::Binary) && self.header_left {
            return Err(bad("the binary COPY data has no header (PGCOPY signature)"));
        }
        Ok(())
    }

    /// One line of text or CSV (or the CSV header, or `\.`). `last`: no newline will come.
    fn line_step(&mut self, rest: &[u8], last: bool) -> Result<Step, CopyError> {
        let (fields, used) = match &self.format {
            CopyFormat::Text {
                delimiter, null, ..
            } => {
                let Some(end) = memchr(b'\n', rest).or(last.then_some(rest.len())) else {
                    return Ok(Step::NeedMore);
                };
                let mut line = &rest[..end];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                let used = (end + 1).min(rest.len());
                if line == b"\\." {
                    self.ended = true;
                    return Ok(Step::Consumed(used, None));
                }
                (split_text(line, *delimiter, null, self.rows + 1)?, used)
            }
            CopyFormat::Csv(options) => match split_csv(rest, options, last) {
                None => return Ok(Step::NeedMore),
                Some((fields, used, marker)) => {
                    if marker {
                        self.ended = true;
                        return Ok(Step::Consumed(used, None));
                    }
                    let row = self.rows + 1;
                    let fields = fields
                        .into_iter()
                        .map(|f| f.map(|v| utf8(v, row)).transpose())
                        .collect::<Result<Vec<_>, _>>()?;
                    (fields, used)
                }
            },
            CopyFormat::Binary => unreachable!("binary data is not read in lines"),
        };
        if self.header_left {
            self.header_left = false;
            return Ok(Step::Consumed(used, None));
        }
        if fields.len() != self.columns {
            return Err(bad(format!(
                "row {}: {} fields, the COPY has {} columns",
                self.rows + 1,
                fields.len(),
                self.columns
            )));
        }
        Ok(Step::Consumed(used, Some(fields)))
    }

    /// The binary header, one row, or the trailer.
    fn binary_step(&mut self, rest: &[u8]) -> Result<Step, CopyError> {
        if self.header_left {
            // signature, flags, extension length, extension
            if rest.len() < BINARY_SIGNATURE.len() + 8 {
                return Ok(Step::NeedMore);
            }
            if &rest[..BINARY_SIGNATURE.len()] != BINARY_SIGNATURE {
                return Err(bad(
                    "the binary COPY data does not start with the PGCOPY signature",
                ));
            }
            let flags = be_i32(&rest[11..15]);
            if flags & (1 << 16) != 0 {
                return Err(bad("binary COPY data with OIDs is not supported"));
            }
            let extension = be_i32(&rest[15..19]);
            if extension < 0 {
                return Err(bad("the binary COPY header's extension length is negative"));
            }
            let used = 19 + extension as usize;
            if rest.len() < used {
                return Ok(Step::NeedMore);
            }
            self.header_left = false;
            return Ok(Step::Consumed(used, None));
        }
        if rest.len() < 2 {
            return Ok(Step::NeedMore);
        }
        let count = i16::from_be_bytes([rest[0], rest[1]]);
        if count == -1 {
            self.ended = true;
            return Ok(Step::Consumed(2, None));
        }
        if count as i64 != self.columns as i64 {
            return Err(bad(format!(
                "row {}: {count} fields, the COPY has {} columns",
                self.rows + 1,
                self.columns
            )));
        }
        let mut at = 2;
        let mut row = Vec::with_capacity(self.columns);
        for _ in 0..self.columns {
            if rest.len() < at + 4 {
                return Ok(Step::NeedMore);
            }
            let len = be_i32(&rest[at..at + 4]);
            at += 4;
            if len == -1 {
                row.push(None);
                continue;
            }
            if len < 0 {
                return Err(bad(format!(
                    "row {}: a field length of {len}",
                    self.rows + 1
                )));
            }
            let len = len as usize;
            if rest.len() < at + len {
                return Ok(Step::NeedMore);
            }
            row.push(Some(rest[at..at + len].to_vec()));
            at += len;
        }
        Ok(Step::Consumed(at, Some(row)))
    }
}

enum Step {
    NeedMore,
    /// Bytes used, and the row they held (none for a header or an end marker).
    Consumed(usize, Option<Vec<Cell>>),
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

fn utf8(bytes: Vec<u8>, row: u64) -> Result<Vec<u8>, CopyError> {
    match std::str::from_utf8(&bytes) {
        Ok(_) => Ok(bytes),
        Err(_) => Err(CopyError {
            sqlstate: "22021",
            message: format!("row {row}: invalid byte sequence for encoding \"UTF8\""),
        }),
    }
}

/// A text-format line's fields, escapes undone. The NULL string is compared before
/// unescaping, as PostgreSQL does.
fn split_text(line: &[u8], delimiter: u8, null: &[u8], row: u64) -> Result<Vec<Cell>, CopyError> {
    let mut fields = Vec::new();
    let mut raw_start = 0;
    let mut field = Vec::new();
    let mut i = 0;
    loop {
        if i == line.len() || line[i] == delimiter {
            let raw = &line[raw_start..i];
            fields.push(if raw == null {
                None
            } else {
                Some(utf8(std::mem::take(&mut field), row)?)
            });
            field.clear();
            if i == line.len() {
                return Ok(fields);
            }
            i += 1;
            raw_start = i;
            continue;
        }
        let b = line[i];
        if b != b'\\' || i + 1 == line.len() {
            field.push(b);
            i += 1;
            continue;
        }
        let next = line[i + 1];
        i += 2;
        match next {
            b'b' => field.push(8),
            b'f' => field.push(12),
            b'n' => field.push(b'\n'),
            b'r' => field.push(b'\r'),
            b't' => field.push(b'\t'),
            b'v' => field.push(11),
            b'0'..=b'7' => {
                let mut value = (next - b'0') as u32;
                let mut digits = 1;
                while digits < 3 && i < line.len() && (b'0'..=b'7').contains(&line[i]) {
                    value = value * 8 + (line[i] - b'0') as u32;
                    i += 1;
                    digits += 1;
                }
                field.push((value & 0xff) as u8);
            }
            b'x' if i < line.len() && line[i].is_ascii_hexdigit() => {
                let mut value = 0u32;
                let mut digits = 0;
                while digits < 2 && i < line.len() && line[i].is_ascii_hexdigit() {
                    value = value * 16 + (line[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    digits += 1;
                }
                field.push(value as u8);
            }
            other => field.push(other),
        }
    }
}

/// One CSV record from the start of `rest`: its fields, the bytes it used, and whether it
/// was the end marker `\.`. `None` when the record is not whole yet (and `last` is false).
fn split_csv(rest: &[u8], o: &CsvOptions, last: bool) -> Option<(Vec<Cell>, usize, bool)> {
    let mut fields = Vec::new();
    let mut field = Vec::new();
    let mut quoted_any = false;
    let mut in_quotes = false;
    let mut i = 0;
    let push = |fields: &mut Vec<Cell>, field: &mut Vec<u8>, quoted: bool| {
        let f = std::mem::take(field);
        fields.push(if !quoted && f == o.null {
            None
        } else {
            Some(f)
        });
    };
    loop {
        if i == rest.len() {
            if !last || in_quotes {
                return None;
            }
            push(&mut fields, &mut field, quoted_any);
            break;
        }
        let b = rest[i];
        if in_quotes {
            // As PostgreSQL reads it: the escape character before a quote or before itself
            // stands for that character; before anything else it is itself.
            let escaped = rest.get(i + 1).filter(|&&n| n == o.quote || n == o.escape);
            if b == o.escape && o.escape != o.quote && escaped.is_some() {
                field.push(rest[i + 1]);
                i += 2;
            } else if b == o.escape && o.escape != o.quote && i + 1 == rest.len() && !last {
                return None; // the escaped character is in the next piece
            } else if b == o.quote {
                if o.escape == o.quote && rest.get(i + 1) == Some(&o.quote) {
                    field.push(o.quote);
                    i += 2;
                } else if o.escape == o.quote && i + 1 == rest.len() && !last {
                    return None; // a doubled quote may continue in the next piece
                } else {
                    in_quotes = false;
                    i += 1;
                }
            } else {
                field.push(b);
                i += 1;
            }
            continue;
        }
        if b == o.quote {
            in_quotes = true;
            quoted_any = true;
            i += 1;
        } else if b == o.delimiter {
            push(&mut fields, &mut field, quoted_any);
            quoted_any = false;
            i += 1;
        } else if b == b'\n' || b == b'\r' {
            let mut used = i + 1;
            if b == b'\r' {
                match rest.get(i + 1) {
                    Some(b'\n') => used += 1,
                    None if !last => return None,
                    _ => {}
                }
            }
            if fields.is_empty() && !quoted_any && field == b"\\." {
                return Some((Vec::new(), used, true));
            }
            push(&mut fields, &mut field, quoted_any);
            return Some((fields, used, false));
        } else {
            field.push(b);
            i += 1;
        }
    }
    if fields.len() == 1 && fields[0].as_deref() == Some(b"\\.") {
        return Some((Vec::new(), rest.len(), true));
    }
    Some((fields, rest.len(), false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_whole(
        format: CopyFormat,
        columns: usize,
        data: &[u8],
    ) -> Result<Vec<Vec<Cell>>, CopyError> {
        let mut d = RowDecoder::new(format, columns);
        let mut out = Vec::new();
        d.feed(data, &mut out)?;
        d.finish(&mut out)?;
        Ok(out)
    }

    fn decode_in_pieces(
        format: CopyFormat,
        columns: usize,
        data: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<Vec<Cell>>, CopyError> {
        let mut d = RowDecoder::new(format, columns);
        let mut out = Vec::new();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        cuts.sort();
        let mut at = 0;
        for c in cuts {
            d.feed(&data[at..c], &mut out)?;
            at = c;
        }
        d.feed(&data[at..], &mut out)?;
        d.finish(&mut out)?;
        Ok(out)
    }

    fn s(v: &str) -> Cell {
        Some(v.as_bytes().to_vec())
    }

    #[test]
    fn text_rows_nulls_and_escapes() {
        let data = b"1\t[1,2,3]\tplain\n2\t\\N\ttab\\there\\nnew\\\\slash\\101\\x41\n\\.\nignored";
        let rows = decode_whole(CopyFormat::text(), 3, data).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![s("1"), s("[1,2,3]"), s("plain")],
                vec![s("2"), None, s("tab\there\nnew\\slashAA")],
            ]
        );
    }

    #[test]
    fn text_last_line_without_newline_and_crlf() {
        let rows = decode_whole(CopyFormat::text(), 2, b"1\ta\r\n2\tb").unwrap();
        assert_eq!(rows, vec![vec![s("1"), s("a")], vec![s("2"), s("b")]]);
    }

    #[test]
    fn wrong_field_counts_are_refused_with_the_row() {
        let e = decode_whole(CopyFormat::text(), 2, b"1\ta\n2\n").unwrap_err();
        assert_eq!(e.sqlstate, "22P04");
        assert!(e.message.contains("row 2: 1 fields"), "{}", e.message);
    }

    #[test]
    fn csv_quotes_nulls_header_and_newlines_in_fields() {
        let mut format = CopyFormat::csv();
        if let CopyFormat::Csv(o) = &mut format {
            o.header = true;
        }
        let data =
            b"id,emb,note\n1,\"[1,2]\",\"say \"\"hi\"\"\"\n2,,\"\"\n3,\"[3,4]\",\"two\nlines\"\r\n";
        let rows = decode_whole(format, 3, data).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![s("1"), s("[1,2]"), s("say \"hi\"")],
                vec![s("2"), None, s("")],
                vec![s("3"), s("[3,4]"), s("two\nlines")],
            ]
        );
    }

    #[test]
    fn csv_escape_before_itself_or_a_quote() {
        let CopyFormat::Csv(mut o) = CopyFormat::csv() else {
            unreachable!()
        };
        o.escape = b'\\';
        let rows = decode_whole(CopyFormat::Csv(o), 1, b"\"a\\\\b\\\"c\\d\"\n").unwrap();
        assert_eq!(rows, vec![vec![s("a\\b\"c\\d")]]);
    }

    #[test]
    fn csv_unterminated_quote_is_refused() {
        let e = decode_whole(CopyFormat::csv(), 2, b"1,\"open\n").unwrap_err();
        assert!(e.message.contains("unterminated"), "{}", e.message);
    }

    /// `rows` as COPY TO writes them in `format`.
    fn written(format: &CopyFormat, rows: &[Vec<Cell>]) -> Vec<u8> {
        use crate::serve::copy_encode;
        let mut out = copy_encode::header(format, &[]);
        for r in rows {
            let cells: Vec<_> = r.iter().map(|c| c.as_deref()).collect();
            copy_encode::row(format, &cells, &mut out);
        }
        out.extend_from_slice(&copy_encode::trailer(format));
        out
    }

    fn binary(rows: &[Vec<Cell>]) -> Vec<u8> {
        written(&CopyFormat::Binary, rows)
    }

    #[test]
    fn binary_rows_and_damage() {
        let rows = vec![
            vec![Some(7i64.to_be_bytes().to_vec()), None],
            vec![Some(vec![]), Some(vec![1, 2, 3])],
        ];
        let data = binary(&rows);
        assert_eq!(decode_whole(CopyFormat::Binary, 2, &data).unwrap(), rows);
        // cut short
        let e = decode_whole(CopyFormat::Binary, 2, &data[..data.len() - 5]).unwrap_err();
        assert!(e.message.contains("ends inside a row"), "{}", e.message);
        // no signature
        assert!(decode_whole(CopyFormat::Binary, 2, b"PGCOPY\nxx\0\0\0\0\0\0\0\0\0").is_err());
        // a negative length other than -1
        let mut bad_len = binary(&[]);
        bad_len.truncate(19);
        bad_len.extend_from_slice(&2i16.to_be_bytes());
        bad_len.extend_from_slice(&(-7i32).to_be_bytes());
        assert!(decode_whole(CopyFormat::Binary, 2, &bad_len).is_err());
        // wrong field count
        assert!(decode_whole(CopyFormat::Binary, 3, &data).is_err());
        // empty data: no header
        assert!(decode_whole(CopyFormat::Binary, 2, b"").is_err());
    }

    #[test]
    fn invalid_utf8_text_is_refused() {
        let e = decode_whole(CopyFormat::text(), 1, b"\xff\xfe\n").unwrap_err();
        assert_eq!(e.sqlstate, "22021");
    }

    fn cell_strategy() -> impl Strategy<Value = Cell> {
        prop_oneof![
            1 => Just(None),
            6 => proptest::collection::vec(
                prop_oneof![Just(b'a'), Just(b','), Just(b'"'), Just(b'\n'), Just(b'\t'),
                            Just(b'\\'), Just(b'\r'), Just(b'N'), Just(b'.'), Just(b'7')],
                0..6
            ).prop_map(Some),
        ]
    }

    proptest! {
        /// Any rows, written as PostgreSQL writes each format and cut into any pieces,
        /// decode to themselves.
        #[test]
        fn every_format_round_trips_in_any_pieces(
            rows in proptest::collection::vec(proptest::collection::vec(cell_strategy(), 3), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            for (format, data) in [
                (CopyFormat::text(), written(&CopyFormat::text(), &rows)),
                (CopyFormat::csv(), written(&CopyFormat::csv(), &rows)),
                (CopyFormat::Binary, binary(&rows)),
            ] {
                let got = decode_in_pieces(format.clone(), 3, &data, &cuts).unwrap();
                prop_assert_eq!(&got, &rows, "{:?} {:?}", format, String::from_utf8_lossy(&data));
            }
        }
    }
}

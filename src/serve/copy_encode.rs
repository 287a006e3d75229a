//! Rows of cells written in the three data formats of `COPY ... TO STDOUT`, as PostgreSQL's
//! COPY writes them: the arithmetic, no IO. [`super::copy_format`] reads what this writes
//! (a property test holds them to each other, for every option a client can give).
//!
//! - **text**: fields split by the delimiter, `\N` (or the `NULL` option) for NULL, a
//!   backslash before a backslash or the delimiter, and `\b \f \n \r \t \v` for those
//!   control characters.
//! - **csv**: a field is quoted when it holds the delimiter, the quote, a line break, or
//!   equals the NULL string (so an empty string is `""` and NULL is empty); inside quotes,
//!   the quote and the escape character are preceded by the escape character.
//! - **binary**: the signature, flags and an empty header extension; per row a 16-bit field
//!   count and per field a 32-bit length (-1: NULL) and its bytes; a field count of -1 ends.
//!
//! Each row is one CopyData message of its own, as PostgreSQL sends it; the binary header
//! goes before the first row and the trailer alone after the last.

use super::copy_format::{BINARY_SIGNATURE, CopyFormat, CsvOptions};

/// One cell of a row to write: `None` is SQL NULL; text and CSV cells are the value's text
/// form, binary cells the type's binary form.
pub type CellRef<'a> = Option<&'a [u8]>;

/// What precedes the rows: the binary header, or with `HEADER` the line of column names.
pub fn header(format: &CopyFormat, names: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    match format {
        CopyFormat::Binary => {
            out.extend_from_slice(BINARY_SIGNATURE);
            out.extend_from_slice(&0i32.to_be_bytes()); // flags: no OIDs
            out.extend_from_slice(&0i32.to_be_bytes()); // header extension: none
        }
        CopyFormat::Text { header: true, .. }
        | CopyFormat::Csv(CsvOptions { header: true, .. }) => {
            let cells: Vec<CellRef> = names.iter().map(|n| Some(n.as_bytes())).collect();
            // A column named like the NULL string is still a name: written as text, quoted
            // in CSV.
            row(format, &cells, &mut out);
        }
        _ => {}
    }
    out
}

/// Appends one row to `out`.
pub fn row(format: &CopyFormat, cells: &[CellRef], out: &mut Vec<u8>) {
    match format {
        CopyFormat::Text {
            delimiter, null, ..
        } => {
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    out.push(*delimiter);
                }
                match cell {
                    None => out.extend_from_slice(null),
                    Some(v) => text_field(v, *delimiter, out),
                }
            }
            out.push(b'\n');
        }
        CopyFormat::Csv(options) => {
            let single = cells.len() == 1;
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    out.push(options.delimiter);
                }
                match cell {
                    None => out.extend_from_slice(&options.null),
                    Some(v) => csv_field(v, options, single, out),
                }
            }
            out.push(b'\n');
        }
        CopyFormat::Binary => {
            out.extend_from_slice(&(cells.len() as i16).to_be_bytes());
            for cell in cells {
                match cell {
                    None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                    Some(v) => {
                        out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                        out.extend_from_slice(v);
                    }
                }
            }
        }
    }
}

/// What follows the last row: the binary trailer, nothing in text and CSV (over the
/// protocol, CopyDone ends the data).
pub fn trailer(format: &CopyFormat) -> Vec<u8> {
    match format {
        CopyFormat::Binary => (-1i16).to_be_bytes().to_vec(),
        _ => Vec::new(),
    }
}

fn text_field(v: &[u8], delimiter: u8, out: &mut Vec<u8>) {
    for &b in v {
        let escaped = match b {
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x0b => b'v',
            _ if b == delimiter => b,
            _ => {
                out.push(b);
                continue;
            }
        };
        out.push(b'\\');
        out.push(escaped);
    }
}

fn csv_field(v: &[u8], o: &CsvOptions, single: bool, out: &mut Vec<u8>) {
    let quote = v == o.null.as_slice()
        // `\.` alone on a line would read as the end of the data.
        || (single && v == b"\\.")
        || v
            .iter()
            .any(|&b| b == o.delimiter || b == o.quote || b == b'\n' || b == b'\r');
    if !quote {
        out.extend_from_slice(v);
        return;
    }
    out.push(o.quote);
    for &b in v {
        if b == o.quote || b == o.escape {
            out.push(o.escape);
        }
        out.push(b);
    }
    out.push(o.quote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::copy_format::{Cell, RowDecoder};
    use proptest::prelude::*;

    fn write(format: &CopyFormat, names: &[&str], rows: &[Vec<Cell>]) -> Vec<u8> {
        let mut out = header(format, names);
        for r in rows {
            let cells: Vec<CellRef> = r.iter().map(|c| c.as_deref()).collect();
            row(format, &cells, &mut out);
        }
        out.extend_from_slice(&trailer(format));
        out
    }

    fn read(format: &CopyFormat, columns: usize, data: &[u8]) -> Vec<Vec<Cell>> {
        let mut decoder = RowDecoder::new(format.clone(), columns);
        let mut rows = Vec::new();
        decoder.feed(data, &mut rows).unwrap();
        decoder.finish(&mut rows).unwrap();
        rows
    }

    fn s(v: &str) -> Cell {
        Some(v.as_bytes().to_vec())
    }

    #[test]
    fn text_as_postgresql_writes_it() {
        let rows = vec![
            vec![s("1"), s("[1,2]"), None],
            vec![s("a\tb\\c\nd"), s(""), s("\\N")],
        ];
        let data = write(&CopyFormat::text(), &["id", "emb", "note"], &rows);
        assert_eq!(
            data,
            b"1\t[1,2]\t\\N\na\\tb\\\\c\\nd\t\t\\\\N\n".to_vec(),
            "{}",
            String::from_utf8_lossy(&data)
        );
    }

    #[test]
    fn csv_quotes_only_what_needs_it() {
        let CopyFormat::Csv(mut o) = CopyFormat::csv() else {
            unreachable!()
        };
        o.header = true;
        let format = CopyFormat::Csv(o);
        let rows = vec![
            vec![s("1"), s("[1,2]"), s("say \"hi\"")],
            vec![s("2"), None, s("")],
            vec![s("3"), s("plain"), s("two\nlines")],
        ];
        let data = write(&format, &["id", "emb", "note"], &rows);
        assert_eq!(
            String::from_utf8(data).unwrap(),
            "id,emb,note\n1,\"[1,2]\",\"say \"\"hi\"\"\"\n2,,\"\"\n3,plain,\"two\nlines\"\n"
        );
    }

    #[test]
    fn binary_header_rows_and_trailer() {
        let rows = vec![vec![Some(7i64.to_be_bytes().to_vec()), None]];
        let data = write(&CopyFormat::Binary, &["a", "b"], &rows);
        assert_eq!(&data[..11], BINARY_SIGNATURE);
        assert_eq!(&data[data.len() - 2..], &[0xff, 0xff]);
        assert_eq!(read(&CopyFormat::Binary, 2, &data), rows);
        // No rows: the header and the trailer still make a whole COPY.
        assert_eq!(
            read(
                &CopyFormat::Binary,
                2,
                &write(&CopyFormat::Binary, &[], &[])
            ),
            Vec::<Vec<Cell>>::new()
        );
    }

    fn cell() -> impl Strategy<Value = Cell> {
        prop_oneof![
            1 => Just(None),
            6 => proptest::collection::vec(
                prop_oneof![Just(b'a'), Just(b','), Just(b';'), Just(b'|'), Just(b'"'),
                            Just(b'\''), Just(b'\n'), Just(b'\t'), Just(b'\\'), Just(b'\r'),
                            Just(b'N'), Just(b'.'), Just(b'7'), Just(0x08), Just(0x0b)],
                0..6
            ).prop_map(Some),
        ]
    }

    /// Every format with options a client may give (text's NULL string is one no cell can
    /// equal: in text format PostgreSQL cannot tell them apart either).
    fn format() -> impl Strategy<Value = CopyFormat> {
        let delimiter = prop_oneof![Just(b','), Just(b'\t'), Just(b';'), Just(b'|')];
        let text = (
            delimiter.clone(),
            prop_oneof![Just(&b"\\N"[..]), Just(&b"NULL"[..])],
            any::<bool>(),
        )
            .prop_map(|(delimiter, null, header)| CopyFormat::Text {
                delimiter,
                null: null.to_vec(),
                header,
            });
        let csv = (
            delimiter,
            prop_oneof![Just(b'"'), Just(b'\'')],
            prop_oneof![Just(None), Just(Some(b'\\'))],
            prop_oneof![Just(&b""[..]), Just(&b"\\N"[..]), Just(&b"N"[..])],
            any::<bool>(),
        )
            .prop_filter("delimiter and quote differ", |(d, q, ..)| d != q)
            .prop_map(|(delimiter, quote, escape, null, header)| {
                CopyFormat::Csv(CsvOptions {
                    delimiter,
                    quote,
                    escape: escape.unwrap_or(quote),
                    null: null.to_vec(),
                    header,
                })
            });
        prop_oneof![text, csv, Just(CopyFormat::Binary)]
    }

    proptest! {
        /// Whatever COPY TO writes, COPY FROM reads back as the same rows.
        #[test]
        fn what_is_written_reads_back(
            format in format(),
            width in 1usize..4,
            rows in proptest::collection::vec(proptest::collection::vec(cell(), 3), 0..8),
        ) {
            let rows: Vec<Vec<Cell>> = rows.into_iter().map(|mut r| { r.truncate(width); r }).collect();
            let names = ["id", "a,b", "N"];
            let data = write(&format, &names[..width], &rows);
            let got = read(&format, width, &data);
            prop_assert_eq!(&got, &rows, "{:?} {:?}", format, String::from_utf8_lossy(&data));
        }
    }
}

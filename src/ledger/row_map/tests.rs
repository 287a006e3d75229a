//! Row-map tests. Every translation is checked against a plain replay of the rewrite: walk
//! all rows in scan order with one counter per destination.

use proptest::prelude::*;

use super::writer::FooterParts;
use super::*;
use crate::ledger::fuzz::mutated;

/// splitmix64: a tiny deterministic generator, so a proptest case is one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every physical row's label in scan order (`None` = deleted).
fn all_labels(sources: &[SourceRows], live: &[u16]) -> Vec<Option<u16>> {
    let mut live = live.iter();
    let mut out = Vec::new();
    for s in sources {
        let mut deleted = s.deleted.iter().peekable();
        for offset in 0..s.physical_rows {
            if deleted.peek().is_some_and(|&&d| u64::from(d) == offset) {
                deleted.next();
                out.push(None);
            } else {
                out.push(Some(*live.next().expect("one label per live row")));
            }
        }
    }
    out
}

/// The replay: what every row translates to.
fn reference(labels: &[Option<u16>], m: usize) -> Vec<Option<Placement>> {
    let mut next = vec![0u32; m];
    labels
        .iter()
        .map(|l| {
            l.map(|l| {
                let offset = next[l as usize];
                next[l as usize] += 1;
                (l, offset)
            })
        })
        .collect()
}

fn totals_of(live: &[u16], m: usize) -> Vec<u64> {
    let mut t = vec![0u64; m];
    for &l in live {
        t[l as usize] += 1;
    }
    t
}

fn write(sources: &[SourceRows], live: &[u16], m: usize, block_rows: u32) -> Vec<u8> {
    let mut w = RowMapWriter::new(sources, m, block_rows).unwrap();
    w.push_all(live).unwrap();
    w.finish(&totals_of(live, m)).unwrap()
}

/// Footer from a tail of at most `TAIL_READ_HINT` bytes, re-reading if it says so, the
/// way an object-store reader would.
fn open(bytes: &[u8]) -> RowMapFooter {
    let len = bytes.len() as u64;
    let first = &bytes[bytes.len() - (TAIL_READ_HINT.min(len) as usize)..];
    let needed = RowMapFooter::required_tail_len(first, len).unwrap();
    let tail = &bytes[bytes.len() - needed.max(first.len() as u64) as usize..];
    RowMapFooter::decode(tail, len).unwrap()
}

fn block_bytes<'b>(footer: &RowMapFooter, bytes: &'b [u8], b: usize) -> &'b [u8] {
    let r = footer.block_range(b);
    &bytes[r.start as usize..r.end as usize]
}

fn decode_all(footer: &RowMapFooter, bytes: &[u8]) -> Vec<BlockLabels> {
    (0..footer.num_blocks())
        .map(|b| {
            footer
                .decode_block(b, block_bytes(footer, bytes, b))
                .unwrap()
        })
        .collect()
}

/// Sweeps from `start_row` to the end, feeding blocks in chunks of `chunk` rows.
fn sweep(
    counts: &CountsMatrix,
    blocks: &[BlockLabels],
    start_row: u64,
    chunk: usize,
) -> Vec<Option<Placement>> {
    let mut s = SweepTranslator::new(counts, start_row).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![None; chunk];
    while let Some(b) = s.next_block() {
        let n = s.fill(&blocks[b], &mut buf).unwrap();
        assert!(n > 0);
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// Same, one row at a time through the iterator.
fn sweep_rows(
    counts: &CountsMatrix,
    blocks: &[BlockLabels],
    start_row: u64,
) -> Vec<Option<Placement>> {
    let mut s = SweepTranslator::new(counts, start_row).unwrap();
    let mut out = Vec::new();
    while let Some(b) = s.next_block() {
        out.extend(s.rows(&blocks[b]).unwrap());
    }
    out
}

/// Sources F1 (5 rows, row 2 deleted) then F2 (3 rows), destinations [F10, F11].
fn worked_example() -> (Vec<SourceRows>, Vec<u16>) {
    let sources = vec![
        SourceRows {
            physical_rows: 5,
            deleted: vec![2],
        },
        SourceRows {
            physical_rows: 3,
            deleted: vec![],
        },
    ];
    (sources, vec![0, 1, 0, 0, 1, 0, 1])
}

#[test]
fn worked_example_from_the_design() {
    let (sources, live) = worked_example();
    let bytes = write(&sources, &live, 2, 4);
    check_header(&bytes).unwrap();
    let footer = open(&bytes);
    let counts = footer.counts();
    assert_eq!(footer.num_blocks(), 2);
    assert_eq!(counts.cumulative(0), &[2, 1]);
    assert_eq!(counts.cumulative(1), &[4, 3]);
    assert_eq!(counts.base(0), &[0, 0]);
    assert_eq!(counts.base(1), &[2, 1]);
    assert_eq!(footer.totals(), &[4, 3]);
    assert_eq!(
        counts,
        &CountsMatrix::from_labels(2, 4, &all_labels(&sources, &live)).unwrap()
    );

    let blocks = decode_all(&footer, &bytes);
    let expected = vec![
        Some((0, 0)),
        Some((1, 0)),
        None,
        Some((0, 1)),
        Some((0, 2)),
        Some((1, 1)),
        Some((0, 3)),
        Some((1, 2)),
    ];
    for (row, want) in expected.iter().enumerate() {
        let (b, pos) = footer.locate(row as u64).unwrap();
        assert_eq!(
            footer.translate(row as u64, &blocks[b]).unwrap(),
            *want,
            "row {row}"
        );
        assert_eq!(
            translate_in_block(&blocks[b], pos, counts.base(b)).unwrap(),
            *want
        );
    }
    // Row 6: block 1, position 2, label 0; base 2 plus one earlier F10 row in the block.
    assert_eq!(footer.locate(6).unwrap(), (1, 2));
    assert_eq!(footer.translate(6, &blocks[1]).unwrap(), Some((0, 3)));

    assert_eq!(sweep(counts, &blocks, 0, 3), expected);
    let mut from_block_1 = SweepTranslator::at_block(counts, 1).unwrap();
    assert_eq!(from_block_1.counters(), &[2, 1]);
    let got: Vec<_> = from_block_1.rows(&blocks[1]).unwrap().collect();
    assert_eq!(got, expected[4..]);
    assert_eq!(sweep_rows(counts, &blocks, 6), expected[6..]);

    let all: Vec<u64> = (0..8).collect();
    assert_eq!(
        footer.translate_sorted(&all, |b| blocks.get(b)).unwrap(),
        expected
    );
    assert_eq!(
        footer.translate_sorted(&[6, 6], |b| blocks.get(b)).unwrap(),
        vec![Some((0, 3)); 2]
    );
}

#[derive(Debug, Clone)]
struct Case {
    sources: Vec<SourceRows>,
    live: Vec<u16>,
    m: usize,
    block_rows: u32,
    seed: u64,
}

/// Sources with each row deleted never, rarely, often, or always; some with no rows.
fn make_case(shapes: &[(u64, u8)], m: usize, block_rows: u32, seed: u64) -> Case {
    let mut rng = Rng(seed);
    let sources: Vec<SourceRows> = shapes
        .iter()
        .map(|&(physical_rows, mode)| {
            let one_in = match mode {
                0 => u64::MAX,
                1 => 50,
                2 => 3,
                _ => 1,
            };
            let deleted = (0..physical_rows as u32)
                .filter(|_| one_in == 1 || (one_in != u64::MAX && rng.below(one_in) == 0))
                .collect();
            SourceRows {
                physical_rows,
                deleted,
            }
        })
        .collect();
    let live_rows: u64 = sources
        .iter()
        .map(|s| s.physical_rows - s.deleted.len() as u64)
        .sum();
    // Either uniform labels or runs from a few destinations, so both wide and narrow
    // dictionaries occur.
    let local = rng.below(2) == 0;
    let mut current = 0u16;
    let live = (0..live_rows)
        .map(|_| {
            if !local || rng.below(16) == 0 {
                current = rng.below(m as u64) as u16;
            }
            current
        })
        .collect();
    Case {
        sources,
        live,
        m,
        block_rows,
        seed,
    }
}

fn small_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((0u64..40, 0u8..4), 0..6),
        1usize..40,
        1u32..=9,
        any::<u64>(),
    )
        .prop_map(|(shapes, m, block_rows, seed)| make_case(&shapes, m, block_rows, seed))
}

fn large_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((prop_oneof![Just(0u64), 30_000u64..70_000], 0u8..4), 2..5),
        prop_oneof![Just(1usize), 2usize..20, 900usize..1200],
        65_530u32..=65_536,
        any::<u64>(),
    )
        .prop_map(|(shapes, m, block_rows, seed)| make_case(&shapes, m, block_rows, seed))
}

/// Checks everything that is cheap enough for the case's size; `every_row` does point
/// lookups and sweep starts at every row, otherwise at a sample.
fn check_case(case: &Case, every_row: bool) {
    let labels = all_labels(&case.sources, &case.live);
    let want = reference(&labels, case.m);
    let bytes = write(&case.sources, &case.live, case.m, case.block_rows);
    let footer = open(&bytes);
    let counts = footer.counts();
    assert_eq!(
        counts,
        &CountsMatrix::from_labels(case.m, case.block_rows, &labels).unwrap()
    );
    assert_eq!(footer.total_rows(), labels.len() as u64);

    // Round trip of every block.
    let blocks = decode_all(&footer, &bytes);
    for (b, block) in blocks.iter().enumerate() {
        let start = b * case.block_rows as usize;
        let expected = &labels[start..start + block.len() as usize];
        assert_eq!(block.labels().collect::<Vec<_>>(), expected, "block {b}");
        assert_eq!(block, &BlockLabels::from_labels(b, expected).unwrap());
    }

    let mut rng = Rng(case.seed ^ 0x5555);
    let n = labels.len() as u64;
    let sample: Vec<u64> = if every_row || n <= 200 {
        (0..n).collect()
    } else {
        let mut s: Vec<u64> = (0..200).map(|_| rng.below(n)).collect();
        s.extend([0, n - 1]);
        s
    };
    for &row in &sample {
        let (b, _) = footer.locate(row).unwrap();
        assert_eq!(
            footer.translate(row, &blocks[b]).unwrap(),
            want[row as usize],
            "row {row}"
        );
    }

    // Sweeps from every block boundary, and from sampled mid-block starts.
    for b in 0..=footer.num_blocks() {
        let start = (b as u64 * u64::from(case.block_rows)).min(n);
        let chunk = 1 + rng.below(3 * u64::from(case.block_rows)) as usize;
        assert_eq!(
            sweep(counts, &blocks, start, chunk),
            want[start as usize..],
            "sweep from block {b}"
        );
    }
    let starts: Vec<u64> = if every_row {
        (0..=n).collect()
    } else {
        (0..4).map(|_| rng.below(n + 1)).collect()
    };
    for &start in &starts {
        assert_eq!(
            sweep_rows(counts, &blocks, start),
            want[start as usize..],
            "row sweep from {start}"
        );
        assert_eq!(
            sweep(counts, &blocks, start, 7),
            want[start as usize..],
            "sweep from {start}"
        );
    }

    // Sorted batches: a sparse sample with duplicates, and a dense stretch.
    let mut batch = sample.clone();
    batch.extend(sample.iter().take(10));
    batch.sort_unstable();
    let dense_start = rng.below(n.max(1));
    batch.extend(dense_start..n.min(dense_start + 3000));
    batch.sort_unstable();
    let got = translate_sorted(counts, &batch, |b| blocks.get(b)).unwrap();
    let expected: Vec<_> = batch.iter().map(|&r| want[r as usize]).collect();
    assert_eq!(got, expected);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn small_maps_match_the_replay(case in small_case()) {
        check_case(&case, true);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    #[test]
    fn large_maps_match_the_replay(case in large_case()) {
        check_case(&case, false);
    }
}

#[test]
fn empty_and_fully_deleted_maps() {
    // No rows at all.
    let bytes = write(&[], &[], 3, 4);
    let footer = open(&bytes);
    assert_eq!((footer.num_blocks(), footer.total_rows()), (0, 0));
    assert_eq!(footer.totals(), &[0, 0, 0]);
    assert!(
        translate_sorted(footer.counts(), &[], |_| None)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        SweepTranslator::new(footer.counts(), 0)
            .unwrap()
            .next_block(),
        None
    );

    // Only deleted rows, a zero-row source in between, and no destinations at all.
    let sources = vec![
        SourceRows {
            physical_rows: 3,
            deleted: vec![0, 1, 2],
        },
        SourceRows::default(),
        SourceRows {
            physical_rows: 6,
            deleted: (0..6).collect(),
        },
    ];
    let bytes = write(&sources, &[], 0, 4);
    let footer = open(&bytes);
    let blocks = decode_all(&footer, &bytes);
    assert_eq!(sweep(footer.counts(), &blocks, 0, 5), vec![None; 9]);
    assert_eq!(footer.translate(8, &blocks[2]).unwrap(), None);
}

#[test]
fn deleted_tail_is_drained_by_finish() {
    let sources = vec![
        SourceRows {
            physical_rows: 6,
            deleted: vec![3, 4, 5],
        },
        SourceRows {
            physical_rows: 2,
            deleted: vec![0, 1],
        },
    ];
    let bytes = write(&sources, &[1, 0, 1], 2, 3);
    let footer = open(&bytes);
    let blocks = decode_all(&footer, &bytes);
    assert_eq!(
        sweep(footer.counts(), &blocks, 0, 100),
        vec![
            Some((1, 0)),
            Some((0, 0)),
            Some((1, 1)),
            None,
            None,
            None,
            None,
            None
        ]
    );
}

// ---------------------------------------------------------------------------------------
// Writer errors

fn one_source(rows: u64, deleted: Vec<u32>) -> Vec<SourceRows> {
    vec![SourceRows {
        physical_rows: rows,
        deleted,
    }]
}

#[test]
fn writer_rejects_bad_input() {
    let src = one_source(3, vec![1]);
    let err = |r: Result<RowMapWriter<'_>>| r.unwrap_err();
    assert_eq!(
        err(RowMapWriter::new(&src, 2, 0)),
        RowMapError::BlockRows {
            found: 0,
            max: MAX_BLOCK_ROWS
        }
    );
    assert!(matches!(
        err(RowMapWriter::new(&src, 0, 4)),
        RowMapError::Destinations {
            num_destinations: 0,
            live_rows: 2
        }
    ));
    assert!(matches!(
        err(RowMapWriter::new(&src, 65_536, 4)),
        RowMapError::Destinations { .. }
    ));
    RowMapWriter::new(&src, 65_535, 4).unwrap();
    let bad = one_source(3, vec![3]);
    assert_eq!(
        err(RowMapWriter::new(&bad, 2, 4)),
        RowMapError::DeletedOffsetOutOfRange {
            source_index: 0,
            offset: 3,
            physical_rows: 3
        }
    );
    for deleted in [vec![2, 1], vec![1, 1]] {
        let bad = [SourceRows::default(), one_source(3, deleted).remove(0)];
        assert!(matches!(
            err(RowMapWriter::new(&bad, 2, 4)),
            RowMapError::DeletedOffsetsUnsorted {
                source_index: 1,
                index: 1,
                ..
            }
        ));
    }

    let mut w = RowMapWriter::new(&src, 2, 4).unwrap();
    assert_eq!(
        w.push(2).unwrap_err(),
        RowMapError::LabelOutOfRange {
            label: 2,
            live_row: 0,
            num_destinations: 2
        }
    );
    w.push_all(&[0, 1]).unwrap();
    assert_eq!(
        w.push(0).unwrap_err(),
        RowMapError::TooManyLabels { live_rows: 2 }
    );
    assert_eq!(
        w.finish(&[1, 2]).unwrap_err(),
        RowMapError::DestinationTotal {
            destination: 1,
            expected: 2,
            found: 1
        }
    );

    let mut w = RowMapWriter::new(&src, 2, 4).unwrap();
    w.push(0).unwrap();
    assert_eq!(
        w.finish(&[1, 0]).unwrap_err(),
        RowMapError::TooFewLabels {
            pushed: 1,
            live_rows: 2
        }
    );

    let mut w = RowMapWriter::new(&src, 2, 4).unwrap();
    w.push_all(&[0, 1]).unwrap();
    assert_eq!(
        w.finish(&[1, 1, 0]).unwrap_err(),
        RowMapError::ExpectedTotalsLen {
            expected: 2,
            found: 3
        }
    );

    let mut w = RowMapWriter::new(&src, 2, 4).unwrap();
    w.preset_total(1, u64::from(u32::MAX));
    w.push(0).unwrap();
    assert_eq!(
        w.push(1).unwrap_err(),
        RowMapError::DestinationOverflow { destination: 1 }
    );
}

// ---------------------------------------------------------------------------------------
// Decoder hardening

/// A map with a few blocks, deletions and a short last block.
fn sample_file() -> Vec<u8> {
    let case = make_case(&[(23, 1), (0, 0), (17, 2), (9, 3), (30, 0)], 7, 8, 42);
    write(&case.sources, &case.live, case.m, case.block_rows)
}

fn footer_start(bytes: &[u8]) -> usize {
    let len = bytes.len();
    let footer_len = u64::from_le_bytes(bytes[len - 16..len - 8].try_into().unwrap());
    len - 16 - footer_len as usize
}

#[test]
fn decoder_rejects_bad_magic_version_and_tag() {
    let bytes = sample_file();
    let len = bytes.len();
    let at = footer_start(&bytes);

    let mut b = bytes.clone();
    b[len - 1] ^= 0xff;
    assert!(matches!(
        RowMapFooter::decode(&b, len as u64),
        Err(RowMapError::BadMagic {
            what: "trailer",
            ..
        })
    ));
    let mut b = bytes.clone();
    b[at] = b'X';
    assert!(matches!(
        RowMapFooter::decode(&b, len as u64),
        Err(RowMapError::BadMagic { what: "footer", .. })
    ));
    for version in [0u8, 3] {
        let mut b = bytes.clone();
        b[at + 4] = version;
        let e = RowMapFooter::decode(&b, len as u64).unwrap_err();
        assert_eq!(
            e,
            RowMapError::UnsupportedVersion {
                found: u16::from(version),
                supported: 2
            }
        );
        assert!(e.to_string().contains(&format!("version {version}")), "{e}");
    }
    let mut b = bytes.clone();
    b[at + 6] = 7;
    let e = RowMapFooter::decode(&b, len as u64).unwrap_err();
    assert_eq!(
        e,
        RowMapError::UnknownRepresentation {
            found: 7,
            supported: 0
        }
    );
    assert!(e.to_string().contains("tag 7"), "{e}");
    let mut b = bytes.clone();
    b[at + 30] ^= 1;
    assert!(matches!(
        RowMapFooter::decode(&b, len as u64),
        Err(RowMapError::FooterChecksum { .. })
    ));

    let mut head = bytes[..8].to_vec();
    head[4] = 9;
    assert!(matches!(
        check_header(&head),
        Err(RowMapError::UnsupportedVersion { found: 9, .. })
    ));
    assert!(matches!(
        check_header(b"PAR1xxxx"),
        Err(RowMapError::BadMagic { what: "header", .. })
    ));
}

#[test]
fn decoder_rejects_every_truncation() {
    let bytes = sample_file();
    let len = bytes.len();
    RowMapFooter::decode(&bytes, len as u64).unwrap();
    // A shorter file (the end cut off).
    for cut in 0..len {
        assert!(
            RowMapFooter::decode(&bytes[..cut], cut as u64).is_err(),
            "file cut to {cut} bytes"
        );
    }
    // A tail read that is too short for the footer.
    let needed = RowMapFooter::required_tail_len(&bytes[len - 16..], len as u64).unwrap();
    for tail in 0..needed as usize {
        let e = RowMapFooter::decode(&bytes[len - tail..], len as u64).unwrap_err();
        assert!(
            matches!(e, RowMapError::Truncated { .. }),
            "tail {tail}: {e}"
        );
    }
    // A block cut short or given with a byte too many.
    let footer = open(&bytes);
    let block = block_bytes(&footer, &bytes, 1);
    assert!(footer.decode_block(1, &block[..block.len() - 1]).is_err());
    let mut longer = block.to_vec();
    longer.push(0);
    assert!(footer.decode_block(1, &longer).is_err());
    assert!(matches!(
        footer.decode_block(footer.num_blocks(), block),
        Err(RowMapError::BlockOutOfRange { .. })
    ));
}

#[test]
fn counts_validation() {
    // Worked-example counts are fine; the same with the short last block too.
    CountsMatrix::new(2, 4, 8, &[2, 1, 4, 3]).unwrap();
    CountsMatrix::new(2, 4, 6, &[2, 1, 3, 2]).unwrap();
    assert_eq!(
        CountsMatrix::new(2, 4, 8, &[2, 1, 1, 3]).unwrap_err(),
        RowMapError::CountsNotMonotone {
            block: 1,
            destination: 0,
            previous: 2,
            found: 1
        }
    );
    assert_eq!(
        CountsMatrix::new(2, 4, 8, &[3, 2, 4, 3]).unwrap_err(),
        RowMapError::BlockOverBudget {
            block: 0,
            live: 5,
            block_len: 4
        }
    );
    // The last block holds 2 rows, not 4.
    assert_eq!(
        CountsMatrix::new(2, 4, 6, &[2, 1, 4, 3]).unwrap_err(),
        RowMapError::BlockOverBudget {
            block: 1,
            live: 4,
            block_len: 2
        }
    );
    assert!(CountsMatrix::new(2, 4, 8, &[2, 1]).is_err());
    assert!(CountsMatrix::new(2, 0, 8, &[]).is_err());
}

/// A file whose footer says what `parts` say, with a correct checksum, over the blocks
/// of `template`.
fn with_footer(template: &[u8], edit: impl FnOnce(&mut FooterParts<'_>)) -> Vec<u8> {
    let footer = open(template);
    let counts = footer.counts();
    let m = counts.num_destinations();
    let mut counts_bytes = Vec::new();
    for b in 0..counts.num_blocks() {
        counts_bytes.push(0);
        for c in counts.block_counts(b) {
            super::codec::put_varint(&mut counts_bytes, u64::from(c));
        }
    }
    let sizes: Vec<u64> = (0..footer.num_blocks())
        .map(|b| footer.block_range(b).end - footer.block_range(b).start)
        .collect();
    let sums: Vec<u32> = (0..footer.num_blocks())
        .map(|b| super::codec::checksum(block_bytes(&footer, template, b)))
        .collect();
    let legacy_sums: Vec<u32> = (0..footer.num_blocks())
        .map(|b| super::codec::legacy_digest(block_bytes(&footer, template, b)))
        .collect();
    let totals = counts.totals().to_vec();
    let mut parts = FooterParts {
        version: FORMAT_VERSION,
        representation: REPR_BLOCKED_LABELS,
        num_destinations: m as u32,
        block_rows: counts.block_rows(),
        total_rows: counts.total_rows(),
        num_blocks: counts.num_blocks() as u64,
        totals: &totals,
        counts: &counts_bytes,
        block_sizes: &sizes,
        block_checksums: &sums,
    };
    edit(&mut parts);
    if parts.version == 1 && std::ptr::eq(parts.block_checksums, sums.as_slice()) {
        parts.block_checksums = &legacy_sums;
    }
    let mut out = template[..footer_start(template)].to_vec();
    parts.append_to(&mut out);
    out
}

/// Format 1 files (the home-made digest, before CRC32C) stay readable and still catch a
/// damaged block.
#[test]
fn version_1_files_are_read_with_their_digest() {
    let v2 = sample_file();
    let mut template = v2.clone();
    template[4..6].copy_from_slice(&1u16.to_le_bytes());
    let v1 = with_footer(&template, |p| p.version = 1);
    check_header(&v1).unwrap();
    let (old, new) = (open(&v1), open(&v2));
    assert_eq!(old.counts(), new.counts());
    for b in 0..new.num_blocks() {
        let bytes = block_bytes(&old, &v1, b);
        assert_eq!(
            old.decode_block(b, bytes).unwrap(),
            new.decode_block(b, block_bytes(&new, &v2, b)).unwrap()
        );
        let mut bad = bytes.to_vec();
        bad[0] ^= 0x80;
        assert!(matches!(
            old.decode_block(b, &bad),
            Err(RowMapError::BlockChecksum { .. })
        ));
    }
    // A version-1 footer sealed with CRC32C is refused: the digest follows the version.
    let mut wrong = v1.clone();
    let n = wrong.len();
    let footer_len = u64::from_le_bytes(wrong[n - 16..n - 8].try_into().unwrap()) as usize;
    let sum = super::codec::checksum(&wrong[n - 16 - footer_len..n - 16]);
    wrong[n - 8..n - 4].copy_from_slice(&sum.to_le_bytes());
    assert!(matches!(
        RowMapFooter::decode(&wrong, n as u64),
        Err(RowMapError::FooterChecksum { .. })
    ));
}

#[test]
fn decoder_rejects_inconsistent_footers() {
    let (sources, live) = worked_example();
    let bytes = write(&sources, &live, 2, 4);
    let decode = |b: &[u8]| RowMapFooter::decode(b, b.len() as u64);
    // The rebuilt footer is accepted as is.
    decode(&with_footer(&bytes, |_| {})).unwrap();

    // Block 0 claims 5 live rows in 4.
    let e = decode(&with_footer(&bytes, |p| p.counts = &[0u8, 3, 2, 0, 1, 1])).unwrap_err();
    assert_eq!(
        e,
        RowMapError::BlockOverBudget {
            block: 0,
            live: 5,
            block_len: 4
        }
    );
    assert_eq!(
        decode(&with_footer(&bytes, |p| p.totals = &[4u32, 2])).unwrap_err(),
        RowMapError::TotalsDisagree {
            destination: 1,
            total: 2,
            last: 3
        }
    );
    assert!(matches!(
        decode(&with_footer(&bytes, |p| p.counts = &[0u8, 2, 1, 9, 2, 2])),
        Err(RowMapError::Corrupt(msg)) if msg.contains("unknown counts tag 9")
    ));
    // Counts that overflow u32 cannot be monotone.
    assert!(
        decode(&with_footer(&bytes, |p| p.counts = &[
            0u8, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0
        ]))
        .is_err()
    );
    assert!(decode(&with_footer(&bytes, |p| p.num_blocks = 3)).is_err());
    assert!(decode(&with_footer(&bytes, |p| p.total_rows = 9)).is_err());
    assert!(decode(&with_footer(&bytes, |p| p.block_rows = 0)).is_err());
    assert!(matches!(
        decode(&with_footer(&bytes, |p| p.block_sizes = &[1u64, 3])),
        Err(RowMapError::Corrupt(msg)) if msg.contains("footer starts")
    ));
    assert!(decode(&with_footer(&bytes, |p| p.block_sizes = &[0u64, 0])).is_err());
    assert!(decode(&with_footer(&bytes, |p| p.num_destinations = 70_000)).is_err());
    assert!(
        decode(&with_footer(&bytes, |p| {
            p.num_destinations = 70_000;
            p.totals = &[0u32; 70_000];
        }))
        .is_err()
    );
}

#[test]
fn block_decoder_checks_counts_and_flags() {
    let (sources, live) = worked_example();
    let bytes = write(&sources, &live, 2, 4);
    let footer = open(&bytes);
    let block0 = block_bytes(&footer, &bytes, 0).to_vec();

    let mut b = block0.clone();
    b[0] |= 0x40;
    assert_eq!(
        footer.decode_block_unchecked(0, &b).unwrap_err(),
        RowMapError::UnknownBlockEncoding {
            block: 0,
            flags: block0[0] | 0x40
        }
    );
    assert!(matches!(
        footer.decode_block(0, &b),
        Err(RowMapError::BlockChecksum { block: 0, .. })
    ));

    // Block 0 is labels 0, 1, -, 0 as codes of width 1: make them 0, 0, -, 0.
    let mut swapped = block0.clone();
    let last = swapped.len() - 1;
    swapped[last] = 0;
    assert_eq!(
        footer.decode_block_unchecked(0, &swapped).unwrap_err(),
        RowMapError::BlockLabelCount {
            block: 0,
            label: 0,
            expected: 2,
            found: 3
        }
    );
    // Un-deleting row 2 leaves one live row too many.
    let mut undeleted = block0.clone();
    undeleted[1] = 0;
    assert!(footer.decode_block_unchecked(0, &undeleted).is_err());

    // Counts taken from the wrong block.
    assert!(matches!(
        super::codec::decode_block(0, 4, &[3, 1], &block0),
        Err(RowMapError::BlockMismatch { block: 0, .. })
    ));
    // A block must be supplied where the rows say, in sweeps too.
    let blocks = decode_all(&footer, &bytes);
    let mut s = SweepTranslator::at_block(footer.counts(), 0).unwrap();
    assert!(matches!(
        s.fill(&blocks[1], &mut [None; 4]),
        Err(RowMapError::SweepOrder { .. })
    ));
    // Blocks built in memory are checked against the destination count too.
    let foreign = BlockLabels::from_labels(0, &[Some(0), Some(5), None, Some(0)]).unwrap();
    let mut s = SweepTranslator::at_block(footer.counts(), 0).unwrap();
    assert!(matches!(
        s.fill(&foreign, &mut [None; 4]),
        Err(RowMapError::LabelWithoutBase { label: 5, .. })
    ));
    assert!(matches!(
        foreign.translate(1, footer.counts().base(0)),
        Err(RowMapError::LabelWithoutBase { label: 5, .. })
    ));
    assert!(matches!(
        footer.translate(6, &blocks[0]),
        Err(RowMapError::BlockMismatch { .. })
    ));
    assert!(matches!(
        translate_sorted(footer.counts(), &[5, 1], |b| blocks.get(b)),
        Err(RowMapError::UnsortedRows { index: 1, .. })
    ));
    assert!(matches!(
        translate_sorted(footer.counts(), &[8], |b| blocks.get(b)),
        Err(RowMapError::RowOutOfRange { row: 8, .. })
    ));
    assert!(matches!(
        translate_sorted(footer.counts(), &[5], |_| None),
        Err(RowMapError::MissingBlock { block: 1 })
    ));
}

/// Uses whatever decodes without panicking.
fn exercise(bytes: &[u8]) {
    let Ok(footer) = RowMapFooter::decode(bytes, bytes.len() as u64) else {
        return;
    };
    for b in 0..footer.num_blocks() {
        if let Ok(block) = footer.decode_block(b, block_bytes(&footer, bytes, b)) {
            let first = b as u64 * u64::from(footer.block_rows());
            for pos in 0..block.len() {
                footer.translate(first + u64::from(pos), &block).unwrap();
            }
        }
    }
}

#[test]
fn fuzzed_files_never_panic() {
    let mut rng = Rng(7);
    for file in 0..6 {
        let case = make_case(
            &[(40, file % 4), (0, 0), (35, 1), (20, 2)],
            1 + file as usize * 5,
            1 + u32::from(file) * 3,
            file.into(),
        );
        let bytes = write(&case.sources, &case.live, case.m, case.block_rows);
        let footer = open(&bytes);
        for _ in 0..400 {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(b.len() as u64) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            exercise(&b);
            let cut = rng.below(b.len() as u64) as usize;
            exercise(&b[..cut]);
            exercise(&b[cut..]);
        }
        // Corrupt blocks past the checksum: the count checks must catch what matters,
        // and what decodes must still agree with the footer's counts.
        for b in 0..footer.num_blocks() {
            let good = block_bytes(&footer, &bytes, b);
            for _ in 0..100 {
                let mut bad = good.to_vec();
                let i = rng.below(bad.len() as u64) as usize;
                bad[i] ^= 1 << rng.below(8);
                if let Ok(block) = footer.decode_block_unchecked(b, &bad) {
                    let counts = CountsMatrix::from_labels(
                        case.m,
                        footer.block_rows(),
                        &block.labels().collect::<Vec<_>>(),
                    )
                    .unwrap();
                    assert_eq!(counts.cumulative(0), footer.counts().block_counts(b));
                }
            }
        }
    }
}

#[test]
fn tail_hint_covers_large_footers_in_two_reads() {
    // 300 destinations, all in every block: a footer far beyond a small first read.
    let live: Vec<u16> = (0..30_000u32).map(|i| (i * 7919 % 300) as u16).collect();
    let sources = one_source(30_000, vec![]);
    let bytes = write(&sources, &live, 300, 256);
    let len = bytes.len() as u64;
    let first = &bytes[bytes.len() - 1024..];
    let needed = RowMapFooter::required_tail_len(first, len).unwrap();
    assert!(needed > 1024);
    assert!(matches!(
        RowMapFooter::decode(first, len),
        Err(RowMapError::Truncated { .. })
    ));
    let footer = RowMapFooter::decode(&bytes[(len - needed) as usize..], len).unwrap();
    assert_eq!(footer.num_blocks(), 118);
    assert!(RowMapFooter::tail_len_hint() >= TRAILER_LEN);
}

/// Encoded bits per physical row for `blocks` full default-size blocks, 1/8 deleted.
fn bits_per_row(blocks: u64, label: impl Fn(&mut Rng, u64) -> u16) -> f64 {
    let rows = blocks * u64::from(DEFAULT_BLOCK_ROWS);
    let mut rng = Rng(99);
    let deleted: Vec<u32> = (0..rows as u32).filter(|_| rng.below(8) == 0).collect();
    let sources = one_source(rows, deleted);
    let labels = all_labels(&sources, &vec![0; rows as usize]);
    let live: Vec<u16> = labels
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_some())
        .map(|(row, _)| label(&mut rng, row as u64))
        .collect();
    let bytes = write(&sources, &live, 1000, DEFAULT_BLOCK_ROWS);
    bytes.len() as f64 * 8.0 / rows as f64
}

#[test]
fn encoded_size_stays_within_budget() {
    let uniform = bits_per_row(3, |rng, _| rng.below(1000) as u16);
    assert!(uniform <= 10.3, "uniform labels: {uniform:.3} bits/row");
    // Each block draws from 16 destinations of its own.
    let local = bits_per_row(3, |rng, row| {
        let block = row / u64::from(DEFAULT_BLOCK_ROWS);
        ((block * 16 + rng.below(16)) * 37 % 1000) as u16
    });
    assert!(local <= 5.3, "block-local labels: {local:.3} bits/row");
}

// ---------------------------------------------------------------------------------------
// Property-based decoder fuzzing: arbitrary and damaged input never panics.

/// Recomputes the footer checksum after damage, so the damage reaches the checks behind it
/// (a stale checksum stops almost every damaged footer at the first check).
fn reseal(bytes: &mut [u8]) {
    let n = bytes.len();
    if n < TRAILER_LEN as usize {
        return;
    }
    let footer_len = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap());
    if footer_len > (n - 16) as u64 {
        return;
    }
    let sum = super::codec::checksum(&bytes[n - 16 - footer_len as usize..n - 16]);
    bytes[n - 8..n - 4].copy_from_slice(&sum.to_le_bytes());
}

/// Decodes `tail` as the end of a `file_len`-byte file; what decodes is self-consistent.
fn check_footer(tail: &[u8], file_len: u64) {
    let _ = RowMapFooter::required_tail_len(tail, file_len);
    if let Ok(footer) = RowMapFooter::decode(tail, file_len) {
        footer.counts().validate().unwrap();
        assert_eq!(footer.file_len(), file_len);
        let mut end = HEADER_LEN;
        for b in 0..footer.num_blocks() {
            let r = footer.block_range(b);
            assert!(r.start == end && r.end > r.start, "blocks are contiguous");
            end = r.end;
        }
        assert!(end <= file_len);
    }
}

/// A block decoded without its checksum still agrees with the footer's counts. `b` may be
/// past the last block: `decode_block` must refuse it (the unchecked test hook indexes
/// blocks directly, so it only sees blocks that exist).
fn check_block(footer: &RowMapFooter, m: usize, b: usize, bytes: &[u8]) {
    let _ = footer.decode_block(b, bytes);
    if b >= footer.num_blocks() {
        return;
    }
    if let Ok(block) = footer.decode_block_unchecked(b, bytes) {
        let labels: Vec<_> = block.labels().collect();
        let counts = CountsMatrix::from_labels(m, footer.block_rows(), &labels).unwrap();
        assert_eq!(counts.cumulative(0), footer.counts().block_counts(b));
    }
}

/// A small valid row-map file and its destination count.
fn small_file() -> impl Strategy<Value = (Vec<u8>, usize)> {
    small_case().prop_map(|case| {
        let bytes = write(&case.sources, &case.live, case.m, case.block_rows);
        (bytes, case.m)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prop_row_map_footer_decode_never_panics_on_arbitrary_bytes(
        mut tail in prop::collection::vec(any::<u8>(), 0..300),
        trailer in any::<bool>(),
        extra in prop_oneof![0u64..64, any::<u64>()],
    ) {
        if trailer && tail.len() >= TRAILER_LEN as usize {
            // A plausible trailer: the magic, a footer length that fits, a valid checksum.
            let n = tail.len();
            let footer_len = (tail[0] as usize % (n - 15)) as u64;
            tail[n - 16..n - 8].copy_from_slice(&footer_len.to_le_bytes());
            tail[n - 4..].copy_from_slice(&FILE_MAGIC);
            reseal(&mut tail);
        }
        check_footer(&tail, (tail.len() as u64).saturating_add(extra));
        check_footer(&tail, tail.len() as u64);
    }

    #[test]
    fn prop_row_map_footer_decode_never_panics_on_mutated_valid_input(
        (bytes, resealed) in small_file()
            .prop_flat_map(|(v, _)| (mutated(v), any::<bool>())),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = bytes;
        if resealed {
            reseal(&mut bytes);
        }
        let len = bytes.len() as u64;
        check_footer(&bytes, len);
        // A shorter tail of the same file, as a first ranged read would fetch.
        check_footer(&bytes[cut.index(bytes.len() + 1).min(bytes.len())..], len);
        exercise(&bytes);
    }

    #[test]
    fn prop_decode_block_never_panics_on_arbitrary_bytes(
        (bytes, m) in small_file(),
        b in any::<prop::sample::Index>(),
        block in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let footer = open(&bytes);
        let b = b.index(footer.num_blocks() + 1);
        check_block(&footer, m, b, &block);
    }

    #[test]
    fn prop_decode_block_never_panics_on_mutated_valid_input(
        ((bytes, m), b, damage) in small_file().prop_flat_map(|(v, m)| {
            let footer = open(&v);
            let blocks = footer.num_blocks().max(1);
            (Just((v, m)), 0..blocks, prop::collection::vec(crate::ledger::fuzz::mutation(), 1..5))
        }),
    ) {
        let footer = open(&bytes);
        if b < footer.num_blocks() {
            let mut block = block_bytes(&footer, &bytes, b).to_vec();
            for d in &damage {
                crate::ledger::fuzz::apply(&mut block, d);
            }
            check_block(&footer, m, b, &block);
        }
    }
}

//! Stable-partition row map: encoded size, decode, rank, sweep and batch translation.
//!
//! `cargo bench --bench row_map` (release). 2M source rows in 20 sources of 100K, about
//! 1/8 deleted at random, 1000 destinations, 64K-row blocks, fixed seed. Two label
//! shapes: uniform over all destinations (the budget case for a first reclustering) and
//! block-local (each 64K block draws from 16 destinations). Everything is in memory; file
//! IO is not measured.

use std::hint::black_box;
use std::time::Instant;

use fragvec::ledger::row_map::{
    BlockLabels, DEFAULT_BLOCK_ROWS, Placement, RowMapFooter, RowMapWriter, SourceRows,
    translate_sorted,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SOURCES: usize = 20;
const ROWS_PER_SOURCE: u64 = 100_000;
const DESTINATIONS: usize = 1000;
const LOCAL_DESTINATIONS: u64 = 16;

struct Map {
    bytes: Vec<u8>,
    footer: RowMapFooter,
    blocks: Vec<BlockLabels>,
}

fn sources(rng: &mut StdRng) -> Vec<SourceRows> {
    (0..SOURCES)
        .map(|_| SourceRows {
            physical_rows: ROWS_PER_SOURCE,
            deleted: (0..ROWS_PER_SOURCE as u32)
                .filter(|_| rng.random_range(0..8) == 0)
                .collect(),
        })
        .collect()
}

/// Writes a map whose live row at global position `row` gets `label(rng, row)`.
fn build(
    sources: &[SourceRows],
    rng: &mut StdRng,
    label: impl Fn(&mut StdRng, u64) -> u16,
) -> (Map, f64) {
    let mut live = Vec::new();
    let mut row = 0u64;
    for s in sources {
        let mut deleted = s.deleted.iter().peekable();
        for offset in 0..s.physical_rows {
            if deleted.peek().is_some_and(|&&d| u64::from(d) == offset) {
                deleted.next();
            } else {
                live.push(label(rng, row));
            }
            row += 1;
        }
    }
    let mut totals = vec![0u64; DESTINATIONS];
    for &l in &live {
        totals[l as usize] += 1;
    }
    let t = Instant::now();
    let mut w = RowMapWriter::new(sources, DESTINATIONS, DEFAULT_BLOCK_ROWS).unwrap();
    w.push_all(&live).unwrap();
    let bytes = w.finish(&totals).unwrap();
    let write_rows_per_s = row as f64 / t.elapsed().as_secs_f64();
    let footer = open(&bytes);
    let blocks = (0..footer.num_blocks())
        .map(|b| {
            footer
                .decode_block(b, block_bytes(&footer, &bytes, b))
                .unwrap()
        })
        .collect();
    (
        Map {
            bytes,
            footer,
            blocks,
        },
        write_rows_per_s,
    )
}

fn open(bytes: &[u8]) -> RowMapFooter {
    let len = bytes.len() as u64;
    let first = &bytes[(len - RowMapFooter::tail_len_hint().min(len)) as usize..];
    let needed = RowMapFooter::required_tail_len(first, len).unwrap();
    let tail = &bytes[(len - needed.max(first.len() as u64)) as usize..];
    RowMapFooter::decode(tail, len).unwrap()
}

fn block_bytes<'b>(footer: &RowMapFooter, bytes: &'b [u8], b: usize) -> &'b [u8] {
    let r = footer.block_range(b);
    &bytes[r.start as usize..r.end as usize]
}

/// Mean time of `f` over enough iterations to fill ~0.3 s, in microseconds.
fn micros(mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    let mut iters = 0u64;
    while t.elapsed().as_secs_f64() < 0.3 {
        for _ in 0..16 {
            f();
        }
        iters += 16;
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn report(name: &str, map: &Map, write_rows_per_s: f64) {
    let rows = map.footer.total_rows();
    let footer = &map.footer;
    let counts = footer.counts();
    println!("\n== {name} labels ==");
    println!(
        "encoded size            {:>10.3} bits/row   ({} bytes for {rows} rows, {} blocks)",
        map.bytes.len() as f64 * 8.0 / rows as f64,
        map.bytes.len(),
        footer.num_blocks()
    );
    println!(
        "write                   {:>10.1} M rows/s",
        write_rows_per_s / 1e6
    );
    let footer_us = micros(|| {
        black_box(open(black_box(&map.bytes)));
    });
    println!("footer decode           {footer_us:>10.1} µs");

    let b = 1;
    let raw = block_bytes(footer, &map.bytes, b);
    let decode_us = micros(|| {
        black_box(footer.decode_block(b, black_box(raw)).unwrap());
    });
    println!(
        "decode one 64K block    {decode_us:>10.1} µs   ({} bytes)",
        raw.len()
    );

    // Rank over (nearly) the whole block: the last rows of full blocks, cycling through
    // blocks so the labels vary.
    let full = footer.num_blocks() - 1;
    let mut k = 0usize;
    let rank_us = micros(|| {
        let b = k % full;
        let pos = DEFAULT_BLOCK_ROWS - 1 - (k % 64) as u32;
        k += 1;
        black_box(
            map.blocks[b]
                .translate(black_box(pos), counts.base(b))
                .unwrap(),
        );
    });
    println!("rank, full 64K block    {rank_us:>10.2} µs");
    let point_us = micros(|| {
        let row = 3 * u64::from(DEFAULT_BLOCK_ROWS) - 7;
        let (b, _) = footer.locate(row).unwrap();
        let block = footer
            .decode_block(b, block_bytes(footer, &map.bytes, b))
            .unwrap();
        black_box(footer.translate(row, &block).unwrap());
    });
    println!("point: decode + rank    {point_us:>10.1} µs");

    let mut out: Vec<Option<Placement>> = vec![None; DEFAULT_BLOCK_ROWS as usize];
    let mut passes = 0u64;
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < 0.5 {
        let mut sweep = footer.sweep_from(0).unwrap();
        while let Some(b) = sweep.next_block() {
            let n = sweep.fill(&map.blocks[b], &mut out).unwrap();
            black_box(&out[..n]);
        }
        passes += 1;
    }
    let sweep_rate = (passes * rows) as f64 / t.elapsed().as_secs_f64();
    println!(
        "sweep (fill)            {:>10.0} M rows/s",
        sweep_rate / 1e6
    );
    let t = Instant::now();
    let mut sweep = footer.sweep_from(12_345).unwrap();
    let mut live = 0u64;
    while let Some(b) = sweep.next_block() {
        live += sweep.rows(&map.blocks[b]).unwrap().flatten().count() as u64;
    }
    black_box(live);
    println!(
        "sweep (row iterator)    {:>10.0} M rows/s",
        (rows - 12_345) as f64 / t.elapsed().as_secs_f64() / 1e6
    );

    let mut rng = StdRng::seed_from_u64(5);
    let mut sparse: Vec<u64> = (0..2000).map(|_| rng.random_range(0..rows)).collect();
    sparse.sort_unstable();
    let sparse_us = micros(|| {
        black_box(translate_sorted(counts, &sparse, |b| map.blocks.get(b)).unwrap());
    });
    println!(
        "batch, 2000 random rows {:>10.1} µs   ({:.2} µs/row)",
        sparse_us,
        sparse_us / sparse.len() as f64
    );
    let dense: Vec<u64> = (100_000..400_000).step_by(3).collect();
    let dense_us = micros(|| {
        black_box(translate_sorted(counts, &dense, |b| map.blocks.get(b)).unwrap());
    });
    println!(
        "batch, every 3rd row    {:>10.1} M rows/s ({} rows)",
        dense.len() as f64 / dense_us,
        dense.len()
    );
}

fn main() {
    let mut rng = StdRng::seed_from_u64(42);
    let sources = sources(&mut rng);
    let deleted: usize = sources.iter().map(|s| s.deleted.len()).sum();
    println!(
        "row map: {} sources × {ROWS_PER_SOURCE} rows, {deleted} deleted ({:.1}%), \
         {DESTINATIONS} destinations, blocks of {DEFAULT_BLOCK_ROWS}",
        SOURCES,
        deleted as f64 * 100.0 / (SOURCES as f64 * ROWS_PER_SOURCE as f64)
    );

    let (uniform, w) = build(&sources, &mut rng, |rng, _| {
        rng.random_range(0..DESTINATIONS as u16)
    });
    report("uniform-random", &uniform, w);

    // Each block gets its own 16 distinct destinations, spread over the destination range.
    let picks: Vec<Vec<u16>> = (0..64)
        .map(|_| {
            rand::seq::index::sample(&mut rng, DESTINATIONS, LOCAL_DESTINATIONS as usize)
                .into_iter()
                .map(|d| d as u16)
                .collect()
        })
        .collect();
    let (local, w) = build(&sources, &mut rng, |rng, row| {
        let block = (row / u64::from(DEFAULT_BLOCK_ROWS)) as usize;
        picks[block][rng.random_range(0..LOCAL_DESTINATIONS as usize)]
    });
    report("block-local (16 per block)", &local, w);
}

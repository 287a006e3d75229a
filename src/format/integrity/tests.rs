//! Data-file checksums end to end on a temporary directory: what is verified is what is
//! read, a damaged page fails only the reads that touch it, and files written before
//! checksums still read.

use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
use datafusion::parquet::file::serialized_reader::ReadOptionsBuilder;
use futures::TryStreamExt;

use crate::format::fragment_io::{read_fragment_rows, write_fragments};
use crate::format::manifest::{DataFile, Fragment};
use crate::format::{Database, FormatError, TableDir, TableProperties, read_fragment};

/// Rows per test fragment: two row groups, several pages per column chunk.
const ROWS: i64 = 70_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x", DataType::Float64, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

async fn fragment() -> (tempfile::TempDir, Arc<TableDir>, Fragment) {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::open(tmp.path().to_str().unwrap()).await.unwrap();
    let snap = db
        .create_table("t", &schema(), TableProperties::default())
        .await
        .unwrap();
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS)),
            Arc::new(Float64Array::from_iter(
                (0..ROWS).map(|i| (i % 7 != 0).then_some(i as f64 * 0.5)),
            )),
            // Few distinct values: a dictionary page.
            Arc::new(StringArray::from_iter(
                (0..ROWS).map(|i| (i % 5 != 0).then(|| format!("n{}", i % 13))),
            )),
        ],
    )
    .unwrap();
    let written = write_fragments(
        &snap.dir,
        &schema(),
        futures::stream::iter(vec![Ok(batch)]),
        ROWS as u64,
    )
    .await
    .unwrap();
    let fragment = Fragment {
        id: 0,
        files: written[0].files.clone(),
        physical_rows: ROWS as u64,
        deletion: None,
        row_ids: None,
    };
    (tmp, snap.dir.clone(), fragment)
}

fn local(tmp: &tempfile::TempDir, file: &DataFile) -> std::path::PathBuf {
    tmp.path().join("t").join(&file.path)
}

/// Page ranges `(first row, byte range)` of column `c` in row group `rg`.
fn pages(
    tmp: &tempfile::TempDir,
    file: &DataFile,
    rg: usize,
    c: usize,
) -> Vec<(i64, std::ops::Range<u64>)> {
    let f = std::fs::File::open(local(tmp, file)).unwrap();
    let options = ReadOptionsBuilder::new().with_page_index().build();
    let reader = SerializedFileReader::new_with_options(f, options).unwrap();
    reader.metadata().offset_index().unwrap()[rg][c]
        .page_locations()
        .iter()
        .map(|p| {
            let start = p.offset as u64;
            (
                p.first_row_index,
                start..start + p.compressed_page_size as u64,
            )
        })
        .collect()
}

fn flip(tmp: &tempfile::TempDir, file: &DataFile, at: u64) {
    let path = local(tmp, file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
}

async fn read(dir: &Arc<TableDir>, f: &Fragment, column: &str) -> Result<usize, FormatError> {
    let s = Arc::new(
        schema()
            .project(&[schema().index_of(column).unwrap()])
            .unwrap(),
    );
    let batches: Vec<RecordBatch> = read_fragment(dir.clone(), f, s, 8192).try_collect().await?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

fn is_corrupt(e: &FormatError, file: &DataFile, what: &str) -> bool {
    matches!(e, FormatError::Corrupt { path, reason } if path.ends_with(&file.path) && reason.contains(what))
}

#[tokio::test]
async fn a_damaged_page_fails_only_the_reads_that_touch_it() {
    let (tmp, dir, frag) = fragment().await;
    let file = &frag.files[0];
    assert!(file.footer.is_some(), "new files record a footer checksum");
    // A page in the middle of column x, row group 0.
    let x_pages = pages(&tmp, file, 0, 1);
    assert!(x_pages.len() >= 3, "{x_pages:?}");
    let (first_row, damaged) = x_pages[x_pages.len() / 2].clone();
    flip(&tmp, file, damaged.end - 3);

    assert_eq!(read(&dir, &frag, "id").await.unwrap(), ROWS as usize);
    assert_eq!(read(&dir, &frag, "name").await.unwrap(), ROWS as usize);
    let e = read(&dir, &frag, "x").await.unwrap_err();
    assert!(
        is_corrupt(
            &e,
            file,
            &format!("bytes {}..{}", damaged.start, damaged.end)
        ),
        "{e}"
    );

    // Reads by offset fetch (and verify) only the pages holding those rows.
    let x = Arc::new(schema().project(&[1]).unwrap());
    let far: Vec<RecordBatch> = read_fragment_rows(dir.clone(), &frag, x.clone(), &[5, 69_000])
        .try_collect()
        .await
        .unwrap();
    assert_eq!(far.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    let hit = first_row as u64;
    let e = read_fragment_rows(dir.clone(), &frag, x, &[5, hit])
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err();
    assert!(is_corrupt(&e, file, "CRC32C"), "{e}");
}

#[tokio::test]
async fn damaged_dictionary_pages_and_footers_are_refused() {
    let (tmp, dir, frag) = fragment().await;
    let file = frag.files[0].clone();
    // The name column's dictionary page sits before its first data page.
    let first = pages(&tmp, &file, 0, 2)[0].1.start;
    flip(&tmp, &file, first - 2);
    assert_eq!(read(&dir, &frag, "id").await.unwrap(), ROWS as usize);
    let e = read(&dir, &frag, "name").await.unwrap_err();
    assert!(is_corrupt(&e, &file, "CRC32C"), "{e}");

    let (tmp, dir, frag) = fragment().await;
    let file = frag.files[0].clone();
    flip(&tmp, &file, file.size_bytes - 20);
    let e = read(&dir, &frag, "id").await.unwrap_err();
    assert!(is_corrupt(&e, &file, "footer"), "{e}");
}

/// Manifest entries written before checksums have no footer checksum: the file is read as
/// before (unverified), damage and all.
#[tokio::test]
async fn files_without_a_recorded_checksum_read_unverified() {
    let (tmp, dir, mut frag) = fragment().await;
    frag.files[0].footer = None;
    assert_eq!(read(&dir, &frag, "x").await.unwrap(), ROWS as usize);
    let file = frag.files[0].clone();
    let (_, page) = pages(&tmp, &file, 0, 0)[1].clone();
    flip(&tmp, &file, page.end - 3);
    // Whatever the decoder makes of it: no verification error.
    if let Err(e) = read(&dir, &frag, "id").await {
        assert!(!e.to_string().contains("CRC32C"), "{e}");
    }
}

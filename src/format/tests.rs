//! Hardening tests of the format layer against a real (temporary) directory: racing writers,
//! crashes between data files and manifest, corrupt and foreign files, unknown features.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use roaring::RoaringBitmap;

use super::*;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]))
}

async fn new_table(stable: bool) -> (tempfile::TempDir, Database, Snapshot) {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::open(tmp.path().to_str().unwrap()).await.unwrap();
    let props = TableProperties {
        stable_row_ids: stable,
        max_rows_per_fragment: 100,
        ..Default::default()
    };
    let snap = db.create_table("t", &schema(), props).await.unwrap();
    (tmp, db, snap)
}

async fn write(snap: &Snapshot, ids: std::ops::Range<i64>) -> Vec<WrittenFragment> {
    let batch =
        RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from_iter_values(ids))]).unwrap();
    let stream = futures::stream::iter(vec![Ok(batch)]);
    write_fragments(&snap.dir, &snap.schema, stream, 100)
        .await
        .unwrap()
}

async fn append(snap: &Snapshot, ids: std::ops::Range<i64>) -> Result<Snapshot> {
    commit_written(snap, write(snap, ids).await).await
}

/// Commits `written` fragments to `snap`'s table as one append of fresh rows.
async fn commit_written(snap: &Snapshot, written: Vec<WrittenFragment>) -> Result<Snapshot> {
    let mut txn = Transaction::new(Operation::Append, snap.version());
    txn.appends = written
        .into_iter()
        .map(|w| NewFragment {
            written: w,
            row_ids: NewRowIds::Fresh,
        })
        .collect();
    commit(&snap.dir, &snap.manifest, &txn).await
}

/// Every fragment of `snap`, in order, read as `schema` in one batch.
async fn read_all(snap: &Snapshot, schema: &SchemaRef, batch_size: usize) -> RecordBatch {
    use futures::TryStreamExt;
    let mut all = Vec::new();
    for f in &snap.manifest.fragments {
        let batches: Vec<RecordBatch> =
            read_fragment(snap.dir.clone(), f, schema.clone(), batch_size)
                .try_collect()
                .await
                .unwrap();
        all.extend(batches);
    }
    datafusion::arrow::compute::concat_batches(schema, &all).unwrap()
}

/// The rows at `offsets` of `fragment`, read as `schema` (as a KNN re-rank reads them).
async fn read_rows(
    snap: &Snapshot,
    fragment: &Fragment,
    schema: &SchemaRef,
    offsets: &[u64],
) -> Vec<RecordBatch> {
    use futures::TryStreamExt;
    fragment_io::read_fragment_rows(snap.dir.clone(), fragment, schema.clone(), offsets)
        .try_collect()
        .await
        .unwrap()
}

/// The floats of the first column (vectors of `dim`) of `batches`, row after row.
fn vector_floats(batches: &[RecordBatch], dim: usize) -> Vec<f32> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Float32Type;
    batches
        .iter()
        .flat_map(|b| {
            let list = b.column(0).as_fixed_size_list();
            let values = list.values().as_primitive::<Float32Type>().values();
            values[list.offset() * dim..(list.offset() + list.len()) * dim].to_vec()
        })
        .collect()
}

/// The Arrow schema a data file was written with (its storage types).
fn stored_schema(path: std::path::PathBuf) -> SchemaRef {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
        .unwrap()
        .schema()
        .clone()
}

async fn read_ids(snap: &Snapshot) -> Vec<i64> {
    let mut out = Vec::new();
    for frag in &snap.manifest.fragments {
        let deleted = snap.dir.read_deletions(frag).await.unwrap();
        let mut stream = read_fragment(snap.dir.clone(), frag, snap.schema.clone(), 1000);
        let mut offset = 0u32;
        while let Some(b) = stream.next().await {
            let b = b.unwrap();
            let col = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            for v in col.values() {
                if !deleted.contains(offset) {
                    out.push(*v);
                }
                offset += 1;
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_appenders_lose_no_rows() {
    let (_tmp, _db, snap) = new_table(true).await;
    let mut tasks = Vec::new();
    for w in 0..8i64 {
        let snap = snap.clone();
        tasks.push(tokio::spawn(async move {
            // Every writer read version 1 and must be rebased over the others.
            append(&snap, w * 1000..w * 1000 + 150).await.unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let latest = snap.dir.latest().await.unwrap();
    assert_eq!(latest.version(), 9);
    let mut ids = read_ids(&latest).await;
    ids.sort();
    let mut expected: Vec<i64> = (0..8).flat_map(|w| w * 1000..w * 1000 + 150).collect();
    expected.sort();
    assert_eq!(ids, expected);
    // Row ids were allocated without overlap.
    let mut row_ids: Vec<u64> = latest
        .manifest
        .fragments
        .iter()
        .flat_map(|f| f.row_ids.as_ref().unwrap().iter())
        .collect();
    row_ids.sort();
    assert_eq!(row_ids, (0..1200).collect::<Vec<u64>>());
}

#[tokio::test]
async fn deletes_of_disjoint_rows_merge_and_overlapping_ones_conflict() {
    let (_tmp, _db, snap) = new_table(false).await;
    let v2 = append(&snap, 0..10).await.unwrap();
    let delete = |rows: &[u32]| {
        let mut txn = Transaction::new(Operation::Delete, v2.version());
        txn.deletions
            .insert(0, rows.iter().copied().collect::<RoaringBitmap>());
        txn
    };
    commit(&v2.dir, &v2.manifest, &delete(&[1, 2]))
        .await
        .unwrap();
    // Read at v2 too, deletes other rows: rebased, both deletions survive.
    let v4 = commit(&v2.dir, &v2.manifest, &delete(&[5])).await.unwrap();
    assert_eq!(read_ids(&v4).await, vec![0, 3, 4, 6, 7, 8, 9]);
    // Read at v2, deletes a row a winner already deleted: the statement must re-read.
    let err = commit(&v2.dir, &v2.manifest, &delete(&[2, 7]))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert_eq!(
        read_ids(&v4.dir.latest().await.unwrap()).await,
        vec![0, 3, 4, 6, 7, 8, 9]
    );
}

#[tokio::test]
async fn files_without_a_manifest_are_invisible_orphans() {
    let (_tmp, _db, snap) = new_table(false).await;
    let v2 = append(&snap, 0..5).await.unwrap();
    // A writer crashes after writing its data but before publishing the manifest.
    let orphans = write(&v2, 100..150).await;
    assert_eq!(orphans.len(), 1);
    let latest = v2.dir.latest().await.unwrap();
    assert_eq!(latest.version(), 2);
    assert_eq!(read_ids(&latest).await, vec![0, 1, 2, 3, 4]);
    // And the table keeps working.
    let v3 = append(&latest, 5..6).await.unwrap();
    assert_eq!(read_ids(&v3).await, vec![0, 1, 2, 3, 4, 5]);
}

async fn put_manifest_bytes(db: &Database, version: u64, bytes: Vec<u8>) {
    let path = object_store::path::Path::from(format!("t/_versions/{version:020}.manifest"));
    db.store()
        .put(&path, PutPayload::from(bytes))
        .await
        .unwrap();
}

#[tokio::test]
async fn corrupt_and_foreign_manifests_are_clear_errors() {
    let (_tmp, db, snap) = new_table(false).await;
    put_manifest_bytes(&db, 2, b"\x00\x01garbage".to_vec()).await;
    let err = snap.dir.latest().await.unwrap_err().to_string();
    assert!(
        err.contains("corrupt") && err.contains("not a JSON manifest"),
        "{err}"
    );
    put_manifest_bytes(&db, 2, br#"{"magic": "lance", "version": 2}"#.to_vec()).await;
    let err = snap.dir.latest().await.unwrap_err().to_string();
    assert!(err.contains("not a fragvec manifest"), "{err}");
    // A manifest whose contents claim another version than its name.
    let mut m = (*snap.manifest).clone();
    m.version = 7;
    put_manifest_bytes(&db, 2, m.encode()).await;
    let err = snap.dir.latest().await.unwrap_err().to_string();
    assert!(err.contains("contents say 7"), "{err}");
    // Version 1 is still readable.
    assert_eq!(snap.dir.snapshot(1).await.unwrap().version(), 1);
}

#[tokio::test]
async fn unknown_feature_flags_are_refused_by_name() {
    let (_tmp, db, snap) = new_table(false).await;
    let mut m = (*snap.manifest).clone();
    m.version = 2;
    m.reader_features.insert("quantum_rows".into());
    put_manifest_bytes(&db, 2, m.encode()).await;
    let err = snap.dir.latest().await.unwrap_err().to_string();
    assert!(err.contains("needs feature 'quantum_rows'"), "{err}");

    let mut m = (*snap.manifest).clone();
    m.version = 3;
    m.writer_features.insert("future_writes".into());
    put_manifest_bytes(&db, 3, m.encode()).await;
    let latest = snap.dir.latest().await.unwrap(); // readable...
    let err = append(&latest, 0..1).await.unwrap_err().to_string(); // ...but not writable
    assert!(err.contains("future_writes"), "{err}");
}

#[tokio::test]
async fn deletion_file_for_another_fragment_is_corrupt() {
    let (_tmp, _db, snap) = new_table(false).await;
    let v2 = append(&snap, 0..150).await.unwrap(); // fragments 0 (100 rows) and 1 (50 rows)
    let mut txn = Transaction::new(Operation::Delete, 2);
    txn.deletions.insert(0, [3u32].into_iter().collect());
    let v3 = commit(&v2.dir, &v2.manifest, &txn).await.unwrap();
    // Point fragment 1 at fragment 0's deletion file.
    let mut m = (*v3.manifest).clone();
    m.fragments[1].deletion = m.fragments[0].deletion.clone();
    let err = v3
        .dir
        .read_deletions(&m.fragments[1])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is for fragment 0"), "{err}");
}

#[tokio::test]
async fn memory_databases_are_shared_by_name() {
    let a = Database::open("memory://shared-test").await.unwrap();
    a.create_table("m", &schema(), TableProperties::default())
        .await
        .unwrap();
    let b = Database::open("memory://shared-test").await.unwrap();
    assert_eq!(b.list_tables().await.unwrap(), vec!["m".to_string()]);
    let c = Database::open("memory://other-test").await.unwrap();
    assert!(c.list_tables().await.unwrap().is_empty());
    assert!(matches!(
        b.create_table("m", &schema(), TableProperties::default())
            .await,
        Err(FormatError::AlreadyExists(_))
    ));
    b.drop_table("m").await.unwrap();
    assert!(a.list_tables().await.unwrap().is_empty());
}

/// Vector columns are written without a dictionary (floats rarely repeat); others keep it.
#[tokio::test]
async fn vector_columns_skip_the_dictionary() {
    use datafusion::arrow::array::{FixedSizeListArray, Float32Array};
    use datafusion::parquet::basic::Encoding;
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::open(tmp.path().to_str().unwrap()).await.unwrap();
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("emb", DataType::FixedSizeList(item.clone(), 2), true),
    ]));
    let snap = db
        .create_table("v", &schema, manifest::TableProperties::default())
        .await
        .unwrap();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1, 1, 1, 2])),
            Arc::new(FixedSizeListArray::new(
                item,
                2,
                Arc::new(Float32Array::from(vec![
                    1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0,
                ])),
                None,
            )),
        ],
    )
    .unwrap();
    let written = write_fragments(
        &snap.dir,
        &schema,
        futures::stream::iter(vec![Ok(batch)]),
        10,
    )
    .await
    .unwrap();
    let path = tmp.path().join("v").join(&written[0].files[0].path);
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let group = reader.metadata().row_group(0);
    let dictionary = |i: usize| {
        group
            .column(i)
            .encodings()
            .any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY))
    };
    assert!(dictionary(0), "id keeps its dictionary");
    assert!(!dictionary(1), "{:?}", group.column(1).column_path());
    // The packed vectors keep the NULL count that finding NULL vectors reads.
    let nulls = group
        .column(1)
        .statistics()
        .and_then(|s| s.null_count_opt());
    assert_eq!(nulls, Some(0));
}

/// A store that ignores `PutMode::Create` (an old S3-compatible server that drops the
/// `If-None-Match` header): every put overwrites.
#[derive(Debug)]
struct IgnoresPutIfAbsent(object_store::memory::InMemory);

impl std::fmt::Display for IgnoresPutIfAbsent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IgnoresPutIfAbsent")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for IgnoresPutIfAbsent {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: PutPayload,
        _opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.0
            .put_opts(location, payload, object_store::PutOptions::default())
            .await
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.0.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

/// A store that honours create-if-absent passes the check (twice: the second time its probe
/// object exists already); one that ignores it is refused, naming the database.
#[tokio::test]
async fn stores_without_put_if_absent_are_refused() {
    use super::store::check_put_if_absent;
    let root = object_store::path::Path::from("db");
    let good = object_store::memory::InMemory::new();
    check_put_if_absent(&good, &root, "memory://good")
        .await
        .unwrap();
    check_put_if_absent(&good, &root, "memory://good")
        .await
        .unwrap();
    let bad = IgnoresPutIfAbsent(object_store::memory::InMemory::new());
    for _ in 0..2 {
        let err = check_put_if_absent(&bad, &root, "s3://old-server/db")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, FormatError::NoPutIfAbsent { location, .. } if location == "s3://old-server/db"),
            "{err}"
        );
        assert!(
            err.to_string().contains("second create-if-absent put"),
            "{err}"
        );
    }
}

/// `AWS_CONDITIONAL_PUT=disabled`: object_store refuses `PutMode::Create` itself (no request
/// is sent), and so does the check.
#[cfg(feature = "s3")]
#[tokio::test]
async fn s3_with_conditional_puts_disabled_is_refused() {
    use super::store::check_put_if_absent;
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name("b")
        .with_region("us-east-1")
        .with_access_key_id("k")
        .with_secret_access_key("s")
        .with_endpoint("http://127.0.0.1:9")
        .with_allow_http(true)
        .with_conditional_put(object_store::aws::S3ConditionalPut::Disabled)
        .build()
        .unwrap();
    let err = check_put_if_absent(&s3, &object_store::path::Path::from("db"), "s3://b/db")
        .await
        .unwrap_err();
    assert!(matches!(err, FormatError::NoPutIfAbsent { .. }), "{err}");
    assert!(
        err.to_string().contains("conditional put is disabled"),
        "{err}"
    );
}

/// Columns of types Parquet cannot store (an interval with nanoseconds, dictionaries of lists
/// and of dictionaries, run-end encoding) are written as their storage types and read back as
/// declared: whole, projected and reordered, by offsets, and from a column file.
#[tokio::test]
async fn unstorable_types_round_trip_through_fragments() {
    use datafusion::arrow::array::{ArrayRef, IntervalMonthDayNanoArray, ListArray, StringArray};
    use datafusion::arrow::compute::{cast, concat_batches};
    use datafusion::arrow::datatypes::{Int32Type, IntervalMonthDayNano, IntervalUnit};
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use futures::TryStreamExt;

    let tmp = tempfile::tempdir().unwrap();
    let db = Database::open(tmp.path().to_str().unwrap()).await.unwrap();
    let iv = |m, d, n| Some(IntervalMonthDayNano::new(m, d, n));
    let ivs: ArrayRef = Arc::new(IntervalMonthDayNanoArray::from(vec![
        iv(1, 2, 3),
        None,
        iv(-1, 0, i64::MAX),
        iv(0, 0, 1),
        None,
    ]));
    let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![Some(1), None]),
        None,
        Some(vec![]),
        Some(vec![Some(1), None]),
        Some(vec![Some(7)]),
    ]));
    let strings: ArrayRef = Arc::new(StringArray::from(vec![
        Some("a"),
        Some("a"),
        None,
        Some("b"),
        Some("b"),
    ]));
    let dict = |k: DataType, v: &DataType| DataType::Dictionary(Box::new(k), Box::new(v.clone()));
    let dict_of_lists = dict(DataType::Int16, lists.data_type());
    let dict_in_dict = dict(DataType::Int32, &dict(DataType::UInt32, &DataType::Utf8));
    let ree = DataType::RunEndEncoded(
        Arc::new(Field::new("run_ends", DataType::Int32, false)),
        Arc::new(Field::new("values", DataType::Utf8, true)),
    );
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("iv", DataType::Interval(IntervalUnit::MonthDayNano), true),
        Field::new("dl", dict_of_lists.clone(), true),
        Field::new("dd", dict_in_dict.clone(), true),
        Field::new("r", ree.clone(), true),
    ]));
    let dl = crate::format::storage_types::from_storage(
        &crate::format::storage_types::to_storage(&lists).unwrap(),
        &dict_of_lists,
    )
    .unwrap();
    let dd = cast(
        &cast(&strings, &dict(DataType::UInt32, &DataType::Utf8)).unwrap(),
        &dict_in_dict,
    )
    .unwrap();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..5)),
            ivs.clone(),
            dl,
            dd,
            cast(&strings, &ree).unwrap(),
        ],
    )
    .unwrap();
    let snap = db
        .create_table("odd", &schema, TableProperties::default())
        .await
        .unwrap();
    let written = write_fragments(
        &snap.dir,
        &schema,
        futures::stream::iter(vec![Ok(batch.slice(0, 2)), Ok(batch.slice(2, 3))]),
        3,
    )
    .await
    .unwrap();
    assert_eq!(written.len(), 2);
    // The file holds the storage types.
    let path = tmp.path().join("odd").join(&written[0].files[0].path);
    let stored = stored_schema(path);
    assert!(matches!(stored.field(1).data_type(), DataType::Struct(_)));
    assert_eq!(stored.field(4).data_type(), &DataType::Utf8);
    let snap = commit_written(&snap, written).await.unwrap();
    let read = |schema: SchemaRef| {
        let snap = snap.clone();
        async move { read_all(&snap, &schema, 2).await }
    };
    let text = |b: &RecordBatch| {
        pretty_format_batches(std::slice::from_ref(b))
            .unwrap()
            .to_string()
    };
    let back = read(schema.clone()).await;
    assert_eq!(back.schema(), schema);
    assert_eq!(text(&back), text(&batch));
    let projected: SchemaRef = Arc::new(schema.project(&[4, 1, 3]).unwrap());
    let back = read(projected.clone()).await;
    assert_eq!(back.schema(), projected);
    assert_eq!(text(&back), text(&batch.project(&[4, 1, 3]).unwrap()));
    // By offsets (the KNN path).
    let second = &snap.manifest.fragments[1];
    let rows: Vec<RecordBatch> =
        fragment_io::read_fragment_rows(snap.dir.clone(), second, schema.clone(), &[1])
            .try_collect()
            .await
            .unwrap();
    let expected = batch.slice(4, 1);
    assert_eq!(
        text(&concat_batches(&schema, &rows).unwrap()),
        text(&expected)
    );
    // A column file (UPDATE's in-place rewrite) holding the interval column.
    let only_iv: SchemaRef = Arc::new(schema.project(&[1]).unwrap());
    let replaced = RecordBatch::try_new(only_iv.clone(), vec![ivs.slice(1, 2)]).unwrap();
    let (file, rows) = fragment_io::write_column_file(&snap.dir, vec![replaced.clone()], &only_iv)
        .await
        .unwrap();
    assert_eq!(rows, 2);
    let mut patched = second.clone();
    patched.files[0].columns.retain(|c| c != "iv");
    patched.files.push(file);
    let back: Vec<RecordBatch> = read_fragment(snap.dir.clone(), &patched, schema.clone(), 8)
        .try_collect()
        .await
        .unwrap();
    let back = concat_batches(&schema, &back).unwrap();
    assert_eq!(text(&back.project(&[1]).unwrap()), text(&replaced));
    assert_eq!(
        text(&back.project(&[0, 2, 3, 4]).unwrap()),
        text(&batch.slice(3, 2).project(&[0, 2, 3, 4]).unwrap())
    );
}

/// A vector column's row group larger than [`fetch_windows::FETCH_BYTES`] is read in windows:
/// no single request fetches much more than that, and every read (whole, by offsets, by
/// ranges) returns the same rows as the data written.
#[tokio::test]
async fn a_large_row_group_is_fetched_in_bounded_windows() {
    use datafusion::arrow::array::{FixedSizeListArray, Float32Array};
    use fetch_windows::FETCH_BYTES;
    use futures::TryStreamExt;
    use metered_store::MeteredStore;

    const DIM: i32 = 768;
    const ROWS: usize = 6000; // 18 MB of floats in one row group
    // The limit and a page of slack, written out so that a larger limit fails here.
    const BOUND: u64 = 9 << 20;
    const { assert!(FETCH_BYTES < BOUND) };
    let store = Arc::new(MeteredStore::new(Arc::new(
        object_store::memory::InMemory::new(),
    )));
    let db = Database::from_store(
        store.clone(),
        object_store::path::Path::from("db"),
        "m".into(),
    );
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new(
        "emb",
        DataType::FixedSizeList(item.clone(), DIM),
        true,
    )]));
    let props = TableProperties {
        max_rows_per_fragment: ROWS as u64,
        ..Default::default()
    };
    let snap = db.create_table("v", &schema, props).await.unwrap();
    // Random floats: LZ4 cannot shrink them, so a page's bytes on disk are its size.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let values: Vec<f32> = (0..ROWS * DIM as usize)
        .map(|_| rand::Rng::random_range(&mut rng, -1.0f32..1.0))
        .collect();
    let list = FixedSizeListArray::new(
        item,
        DIM,
        Arc::new(Float32Array::from(values.clone())),
        None,
    );
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list)]).unwrap();
    let written = write_fragments(
        &snap.dir,
        &schema,
        futures::stream::iter(vec![Ok(batch)]),
        ROWS as u64,
    )
    .await
    .unwrap();
    let snap = commit_written(&snap, written).await.unwrap();
    let frag = &snap.manifest.fragments[0];
    let largest_request = |trace: Vec<String>| -> u64 {
        trace
            .iter()
            .filter_map(|l| {
                l.strip_prefix("GET range ")?
                    .split(' ')
                    .next()?
                    .split_once("..")
            })
            .map(|(a, b)| b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap())
            .max()
            .unwrap_or(0)
    };
    crate::format::fragment_io::forget_cached_footers();
    store.trace(true);

    let whole: Vec<RecordBatch> = read_fragment(snap.dir.clone(), frag, schema.clone(), 1024)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(vector_floats(&whole, DIM as usize), values);
    let largest = largest_request(store.take_trace());
    assert!(largest <= BOUND, "one request fetched {largest} bytes");

    let offsets = [0u64, 1, 2_999, 3_000, 5_999];
    let picked = read_rows(&snap, frag, &schema, &offsets).await;
    let want: Vec<f32> = offsets
        .iter()
        .flat_map(|&o| values[o as usize * DIM as usize..(o as usize + 1) * DIM as usize].to_vec())
        .collect();
    assert_eq!(vector_floats(&picked, DIM as usize), want);
    let read = store.take_trace();
    assert!(
        largest_request(read) < 1 << 20,
        "a few rows fetch a few pages"
    );
    // Vector pages of about 16 KB: five rows read (footers cached) fetch about five pages,
    // not five 64 KB pages.
    let before = store.round_trips();
    let again = read_rows(&snap, frag, &schema, &offsets).await;
    assert_eq!(
        again.iter().map(|b| b.num_rows()).sum::<usize>(),
        offsets.len()
    );
    let fetched = store.round_trips().since(&before).bytes_read;
    assert!(fetched <= 5 * 24 * 1024, "5 rows fetched {fetched} bytes");

    let ranges = [100u64..2_800, 2_900..5_100];
    let ranged: Vec<RecordBatch> =
        fragment_io::read_fragment_ranges(snap.dir.clone(), frag, schema.clone(), &ranges, 500)
            .try_collect()
            .await
            .unwrap();
    let want: Vec<f32> = ranges
        .iter()
        .flat_map(|r| {
            values[r.start as usize * DIM as usize..r.end as usize * DIM as usize].to_vec()
        })
        .collect();
    assert_eq!(vector_floats(&ranged, DIM as usize), want);
    assert!(largest_request(store.take_trace()) <= BOUND);
}

mod packed;

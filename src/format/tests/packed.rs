//! Vector columns stored packed, beside files written before packing.

use super::*;

/// A vector column is written packed (fixed-width binary), the table names the
/// `packed_vectors` feature, and a file that still holds the column as a list (written before
/// packing) is read beside packed ones: whole, and by offsets, as a KNN re-rank reads it.
#[tokio::test]
async fn vector_columns_are_packed_and_list_files_still_read() {
    use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Float32Array};
    use datafusion::arrow::buffer::NullBuffer;
    use datafusion::arrow::compute::concat_batches;
    use datafusion::parquet::arrow::ArrowWriter;

    let tmp = tempfile::tempdir().unwrap();
    let db = Database::open(tmp.path().to_str().unwrap()).await.unwrap();
    let vector = crate::format::types::vector_type(3);
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("emb", vector.clone(), true),
    ]));
    let DataType::FixedSizeList(item, _) = &vector else {
        unreachable!()
    };
    let rows = |from: i64| {
        let floats: Vec<f32> = (0..12).map(|i| from as f32 + i as f32 / 7.0).collect();
        let emb = FixedSizeListArray::new(
            item.clone(),
            3,
            Arc::new(Float32Array::from(floats)),
            Some(NullBuffer::from(vec![true, false, true, true])),
        );
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(from..from + 4)),
            Arc::new(emb),
        ];
        RecordBatch::try_new(schema.clone(), columns).unwrap()
    };
    let snap = db
        .create_table("v", &schema, TableProperties::default())
        .await
        .unwrap();
    let flagged = |m: &Manifest| {
        let flag = manifest::feature::PACKED_VECTORS;
        m.reader_features.contains(flag) && m.writer_features.contains(flag)
    };
    assert!(flagged(&snap.manifest));
    let packed = write_fragments(&snap.dir, &schema, futures::stream::iter([Ok(rows(0))]), 4)
        .await
        .unwrap();
    let path = tmp.path().join("v").join(&packed[0].files[0].path);
    assert_eq!(
        stored_schema(path).field(1).data_type(),
        &DataType::FixedSizeBinary(12)
    );
    // A file as fragvec wrote it before packing: the declared list type, no checksums.
    let mut old = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut old, schema.clone(), None).unwrap();
    writer.write(&rows(100)).unwrap();
    writer.close().unwrap();
    let relative = "data/before-packing.parquet".to_string();
    std::fs::write(tmp.path().join("v").join(&relative), &old).unwrap();
    let listed = WrittenFragment {
        files: vec![manifest::DataFile {
            path: relative,
            columns: vec!["id".into(), "emb".into()],
            size_bytes: old.len() as u64,
            footer: None,
            stats: vec![],
        }],
        physical_rows: 4,
    };
    let snap = commit_written(&snap, vec![listed, packed[0].clone()])
        .await
        .unwrap();
    assert!(flagged(&snap.manifest));
    for f in &snap.manifest.fragments {
        let by_offset = read_rows(&snap, f, &schema, &[1, 3]).await;
        let from = if f.id == 0 { 100 } else { 0 };
        let wanted = concat_batches(&schema, &[rows(from).slice(1, 1), rows(from).slice(3, 1)]);
        assert_eq!(
            concat_batches(&schema, &by_offset).unwrap(),
            wanted.unwrap()
        );
    }
    let expected = concat_batches(&schema, &[rows(100), rows(0)]).unwrap();
    assert_eq!(read_all(&snap, &schema, 3).await, expected);
}

/// Rows read by offset from several row groups come back in arrays sized for the rows each
/// group gave, not for every row asked of the fragment: a KNN re-rank holds its batches
/// until it has scored them all, and a packed 768-float column sized for the whole request
/// in every row group held 3 MB per group under concurrent queries.
#[tokio::test]
async fn rows_read_by_offset_hold_no_more_than_their_bytes() {
    use datafusion::arrow::array::{Array, FixedSizeListArray, Float32Array};

    const DIM: i32 = 16;
    let groups = 3;
    let rows = groups * fragment_io::ROW_GROUP_ROWS;
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::open(tmp.path().to_str().unwrap()).await.unwrap();
    let vector = crate::format::types::vector_type(DIM);
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("emb", vector.clone(), false)]));
    let DataType::FixedSizeList(item, _) = &vector else {
        unreachable!()
    };
    let floats = Float32Array::from_iter_values((0..rows * DIM as usize).map(|i| i as f32));
    let emb = FixedSizeListArray::new(item.clone(), DIM, Arc::new(floats), None);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(emb)]).unwrap();
    let snap = db
        .create_table("v", &schema, TableProperties::default())
        .await
        .unwrap();
    let written = write_fragments(
        &snap.dir,
        &schema,
        futures::stream::iter([Ok(batch)]),
        rows as u64,
    )
    .await
    .unwrap();
    let snap = commit_written(&snap, written).await.unwrap();
    let fragment = &snap.manifest.fragments[0];
    // 40 rows from each row group.
    let offsets: Vec<u64> = (0..groups as u64)
        .flat_map(|g| (0..40).map(move |i| g * fragment_io::ROW_GROUP_ROWS as u64 + i * 97))
        .collect();
    let batches = read_rows(&snap, fragment, &schema, &offsets).await;
    assert_eq!(
        batches.iter().map(|b| b.num_rows()).sum::<usize>(),
        offsets.len()
    );
    for b in &batches {
        let payload = b.num_rows() * DIM as usize * 4;
        let held = b.column(0).get_buffer_memory_size();
        assert!(
            held <= payload + 1024,
            "{} rows of {payload} bytes held {held} bytes",
            b.num_rows()
        );
    }
    // And the values are the rows asked for.
    let got = vector_floats(&batches, DIM as usize);
    let wanted: Vec<f32> = offsets
        .iter()
        .flat_map(|&o| (0..DIM as u64).map(move |d| (o * DIM as u64 + d) as f32))
        .collect();
    assert_eq!(got, wanted);
}

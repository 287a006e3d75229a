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
    use futures::TryStreamExt;

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
        let by_offset: Vec<RecordBatch> =
            fragment_io::read_fragment_rows(snap.dir.clone(), f, schema.clone(), &[1, 3])
                .try_collect()
                .await
                .unwrap();
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

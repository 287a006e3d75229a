//! Tests of the manifest model: validation, decoding of damaged and hostile manifests.

use super::*;
use crate::format::index_meta::{IndexKind, Metric};
use crate::ledger::fuzz::{arbitrary_with_magic, mutated};
use proptest::prelude::*;
use proptest::sample::Index;

fn sample() -> Manifest {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "emb",
            DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, true)), 4),
            true,
        ),
    ]);
    Manifest::new_table(&schema, TableProperties::default(), "t".into()).unwrap()
}

fn with_ledger(mapping: serde_json::Value) -> Vec<u8> {
    let mut m = sample();
    m.next_fragment_id = 3;
    m.next_transition_id = 1;
    m.reader_features.insert(feature::REUSE_LEDGER.into());
    m.writer_features.insert(feature::REUSE_LEDGER.into());
    let mut v: serde_json::Value = serde_json::from_slice(&m.encode()).unwrap();
    v["reuse_ledger"] = serde_json::json!([{
        "id": 0, "source_version": 1, "committed_version": 2,
        "sources": [{"id": 0, "physical_rows": 4, "deleted_rows": 0},
                    {"id": 1, "physical_rows": 2, "deleted_rows": 0}],
        "destinations": [{"id": 2, "physical_rows": 6, "deleted_rows": 0}],
        "mapping": mapping,
    }]);
    serde_json::to_vec(&v).unwrap()
}

/// Manifests written before checksums existed have no `footer`, `crc32c` or
/// `removed_crc32c` fields, no checksum of their own and no `checksums` writer feature: they
/// still read, unverified.
#[test]
fn manifests_written_before_checksums_still_read() {
    let m = rich();
    assert!(m.writer_features.contains(feature::CHECKSUMS));
    let mut v: serde_json::Value = serde_json::from_slice(&m.encode()).unwrap();
    for f in v["fragments"].as_array_mut().unwrap() {
        f["files"][0].as_object_mut().unwrap().remove("footer");
        f["deletion"].as_object_mut().unwrap().remove("crc32c");
    }
    v["writer_features"] = serde_json::json!(["deletion_files", "stable_row_ids", "vector_index"]);
    v.as_object_mut().unwrap().remove("crc32c");
    let text = serde_json::to_string(&v).unwrap();
    assert!(!text.contains("footer") && !text.contains("crc32c"));
    let old = Manifest::decode(text.as_bytes(), "m", "t").unwrap();
    for f in &old.fragments {
        assert_eq!(f.files[0].footer, None);
        assert_eq!(f.deletion.as_ref().unwrap().crc32c, None);
    }
    // New entries round-trip their checksums.
    let again = Manifest::decode(&m.encode(), "m", "t").unwrap();
    assert_eq!(
        again.fragments[1].files[0].footer.unwrap().crc32c,
        0xdead_beef
    );
    assert_eq!(
        again.fragments[1].deletion.as_ref().unwrap().crc32c,
        Some(7)
    );
    let ledger =
        with_ledger(serde_json::json!({"kind": "ordered_compaction", "removed": [null, null]}));
    match &Manifest::decode(&ledger, "m", "t").unwrap().reuse_ledger[0].mapping {
        crate::ledger::Mapping::OrderedCompaction { removed_crc32c, .. } => {
            assert!(removed_crc32c.is_empty())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn checksum_entries_are_checked_when_read() {
    let mut m = rich();
    m.fragments[1].files[0].footer = Some(FooterChecksum {
        offset: 100,
        crc32c: 0,
    });
    let e = Manifest::decode(&m.encode(), "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("footer offset 100"), "{e}");
    // A removed-row checksum for a source without a removed-row file.
    let bad = with_ledger(serde_json::json!({
        "kind": "ordered_compaction", "removed": [null, null], "removed_crc32c": [7, null]
    }));
    let e = Manifest::decode(&bad, "m", "t").unwrap_err().to_string();
    assert!(e.contains("removed-row checksums"), "{e}");
}

#[test]
fn ledger_entries_are_checked_when_read() {
    let ok =
        with_ledger(serde_json::json!({"kind": "ordered_compaction", "removed": [null, null]}));
    let m = Manifest::decode(&ok, "m", "t").unwrap();
    assert_eq!(m.reuse_ledger.len(), 1);
    let e = Manifest::decode(
        &with_ledger(serde_json::json!({"kind": "arbitrary_permutation"})),
        "m",
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("mapping kind 'arbitrary_permutation'"), "{e}");
    // Rows not conserved (a source row goes nowhere): corrupt, not mistranslated.
    let lost = String::from_utf8(ok.clone())
        .unwrap()
        .replace("\"physical_rows\":6", "\"physical_rows\":5");
    let e = Manifest::decode(lost.as_bytes(), "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 live source rows but 5"), "{e}");
    // Without the feature flag the entries are refused too.
    let mut v: serde_json::Value = serde_json::from_slice(&ok).unwrap();
    v["reader_features"] = serde_json::json!(["deletion_files"]);
    let e = Manifest::decode(&serde_json::to_vec(&v).unwrap(), "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("reuse_ledger feature"), "{e}");
}

/// A table with stable row ids, deletions, an index with a segment: most of what
/// `validate` checks has something to check.
fn rich() -> Manifest {
    let mut m = sample();
    m.properties.stable_row_ids = true;
    m.reader_features.insert(feature::STABLE_ROW_IDS.into());
    m.writer_features.insert(feature::STABLE_ROW_IDS.into());
    m.next_fragment_id = 2;
    m.next_row_id = 40;
    for (id, ids) in [(0u64, vec![0u64, 1, 2, 3, 4, 9]), (1, vec![30, 7, 31, 32])] {
        m.fragments.push(Fragment {
            id,
            files: vec![DataFile {
                path: format!("data/{id}.parquet"),
                columns: vec!["id".into(), "emb".into()],
                size_bytes: 100,
                // Fragment 0 as written before checksums, fragment 1 with them.
                footer: (id == 1).then_some(FooterChecksum {
                    offset: 60,
                    crc32c: 0xdead_beef,
                }),
                stats: Vec::new(),
            }],
            physical_rows: ids.len() as u64,
            deletion: Some(DeletionFile {
                path: format!("deletions/{id}.bin"),
                deleted_rows: 2,
                read_version: 1,
                crc32c: (id == 1).then_some(7),
            }),
            row_ids: Some(RowIdSequence::from_ids(ids)),
        });
    }
    m.indexes.push(IndexDef {
        name: "i".into(),
        column: "emb".into(),
        kind: IndexKind::IvfFlat,
        metric: Metric::L2,
        num_partitions: 2,
        model_file: "_indexes/i/m.model".into(),
        model_size_bytes: 10,
        created_at_version: 1,
    });
    m.index_segments.push(IndexSegment {
        id: 0,
        index: "i".into(),
        file: "_indexes/i/0.seg".into(),
        size_bytes: 10,
        rows: 10,
        built_at_version: 1,
        fragment_bitmap: [0, 1].into(),
        invalidated_fragments: [1].into(),
    });
    m.next_segment_id = 1;
    m.sync_index_feature();
    m
}

/// A manifest that decodes passed `validate` and re-encodes to an equal manifest.
fn check_decoded(bytes: &[u8]) {
    if let Ok(m) = Manifest::decode(bytes, "m", "t") {
        m.validate().unwrap();
        assert_eq!(Manifest::decode(&m.encode(), "m", "t").unwrap(), m);
        m.live_rows();
    }
}

/// JSON-aware damage: replaces some leaves of a valid manifest with hostile values, so
/// the validation behind the parser is exercised (byte damage mostly breaks the JSON).
fn json_mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let hostile = prop_oneof![
        Just(serde_json::json!(u64::MAX)),
        Just(serde_json::json!(0)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(u32::MAX)),
        Just(serde_json::json!(1e300)),
        Just(serde_json::json!(null)),
        Just(serde_json::json!("../escape")),
        Just(serde_json::json!("")),
        Just(serde_json::json!("FixedSizeList(0 x Float32)")),
        Just(serde_json::json!([])),
        any::<u64>().prop_map(|n| serde_json::json!(n)),
    ];
    prop::collection::vec((any::<Index>(), hostile), 1..4).prop_map(move |edits| {
        let mut v: serde_json::Value = serde_json::from_slice(&valid).unwrap();
        for (at, new) in edits {
            let mut leaves = Vec::new();
            leaf_pointers(&v, String::new(), &mut leaves);
            let target = &leaves[at.index(leaves.len())];
            *v.pointer_mut(target).unwrap() = new;
        }
        serde_json::to_vec(&v).unwrap()
    })
}

fn leaf_pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    let children: Vec<(String, &serde_json::Value)> = match v {
        serde_json::Value::Object(o) => o.iter().map(|(k, c)| (k.clone(), c)).collect(),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, c)| (i.to_string(), c))
            .collect(),
        _ => vec![],
    };
    if children.is_empty() {
        out.push(at);
    } else {
        for (k, c) in children {
            leaf_pointers(c, format!("{at}/{k}"), out);
        }
    }
}

fn valid_manifest() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(rich().encode()),
        Just(with_ledger(
            serde_json::json!({"kind": "ordered_compaction", "removed": [null, null]})
        )),
    ]
}

/// Every flipped bit of a manifest is refused, or (inside the checksum member itself, whose
/// damage leaves the rest intact) reads as the same manifest: a flip in a fragment list, a
/// segment's fragment bitmap or a column name must never read as a different table.
#[test]
fn every_flipped_bit_of_a_manifest_is_refused_or_harmless() {
    let m = rich();
    let bytes = m.encode();
    assert!(split_checksum(&bytes).is_some());
    for at in 0..bytes.len() {
        for bit in 0..8 {
            let mut bad = bytes.clone();
            bad[at] ^= 1 << bit;
            if let Ok(read) = Manifest::decode(&bad, "m", "t") {
                assert_eq!(read, m, "flip at {at} bit {bit} read as another manifest");
            }
        }
    }
    let mut bad = bytes.clone();
    let digit = bad.iter().position(|b| *b == b'4').unwrap();
    bad[digit] = b'5';
    let e = Manifest::decode(&bad, "m", "t").unwrap_err().to_string();
    assert!(e.contains("CRC32C"), "{e}");
}

#[test]
fn rich_sample_is_valid() {
    let m = rich();
    assert_eq!(Manifest::decode(&m.encode(), "m", "t").unwrap(), m);
}

#[test]
fn row_ids_longer_than_u64_are_corrupt_not_overflowed() {
    let mut v: serde_json::Value = serde_json::from_slice(&rich().encode()).unwrap();
    v["fragments"][0]["row_ids"] = serde_json::json!({"segments": [
        {"kind": "range", "start": 0, "end": u64::MAX},
        {"kind": "range", "start": 0, "end": 7}]});
    let e = Manifest::decode(&serde_json::to_vec(&v).unwrap(), "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("longer than"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prop_manifest_decode_never_panics_on_arbitrary_bytes(
        bytes in arbitrary_with_magic(br#"{"magic":"fragvec-manifest","#),
    ) {
        check_decoded(&bytes);
    }

    #[test]
    fn prop_manifest_decode_never_panics_on_mutated_valid_input(
        bytes in valid_manifest().prop_flat_map(|v| prop_oneof![
            mutated(v.clone()),
            json_mutated(v),
        ]),
    ) {
        check_decoded(&bytes);
    }
}

#[test]
fn schema_round_trips_through_json() {
    let m = sample();
    let back = Manifest::decode(&m.encode(), "m", "t").unwrap();
    assert_eq!(back, m);
    assert_eq!(back.arrow_schema().unwrap(), m.arrow_schema().unwrap());
}

#[test]
fn unknown_reader_feature_is_named() {
    let mut m = sample();
    m.reader_features.insert("time_machine".into());
    let err = Manifest::decode(&m.encode(), "m", "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("time_machine"), "{err}");
}

#[test]
fn foreign_and_truncated_files_are_corrupt() {
    let e = Manifest::decode(b"{\"hello\": 1}", "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad magic"), "{e}");
    let bytes = sample().encode();
    let e = Manifest::decode(&bytes[..bytes.len() / 2], "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a JSON manifest"), "{e}");
}

#[test]
fn fragment_missing_a_column_is_corrupt() {
    let mut m = sample();
    m.next_fragment_id = 1;
    m.fragments.push(Fragment {
        id: 0,
        files: vec![DataFile {
            path: "data/a.parquet".into(),
            columns: vec!["id".into()],
            size_bytes: 1,
            footer: None,
            stats: Vec::new(),
        }],
        physical_rows: 3,
        deletion: None,
        row_ids: None,
    });
    let e = Manifest::decode(&m.encode(), "m", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("'emb'"), "{e}");
}

#[test]
fn escaping_paths_are_corrupt() {
    let mut m = sample();
    m.next_fragment_id = 1;
    m.fragments.push(Fragment {
        id: 0,
        files: vec![DataFile {
            path: "../other/x.parquet".into(),
            columns: vec!["id".into(), "emb".into()],
            size_bytes: 1,
            footer: None,
            stats: Vec::new(),
        }],
        physical_rows: 3,
        deletion: None,
        row_ids: None,
    });
    assert!(Manifest::decode(&m.encode(), "m", "t").is_err());
}

proptest! {
    /// A float column range is read back bit for bit: a bound one ULP inside the true one
    /// would let a filter skip a fragment holding a matching row. (JSON parsers are not all
    /// exact for 17-digit numbers; this one must be.) And what a writer caches of the
    /// manifest it wrote is what every reader decodes.
    #[test]
    fn float_ranges_round_trip_exactly(
        bounds in prop::collection::vec(
            prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO, 1..64)
    ) {
        use crate::format::column_stats::{ColumnStats, StatValue};
        let mut m = rich();
        m.fragments[0].files[0].stats = bounds
            .iter()
            .map(|b| ColumnStats {
                column: "id".into(),
                min: Some(StatValue::Float(*b)),
                max: Some(StatValue::Float(*b)),
                nulls: 0,
            })
            .collect();
        let decoded = Manifest::decode(&m.encode(), "m", "t").unwrap();
        for (got, want) in decoded.fragments[0].files[0].stats.iter().zip(&bounds) {
            let Some(StatValue::Float(got)) = got.min else { panic!("{got:?}") };
            prop_assert_eq!(got.to_bits(), want.to_bits());
        }
        prop_assert_eq!(decoded, m);
    }
}

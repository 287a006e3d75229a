use proptest::prelude::*;

use super::*;

/// Every record of `spill`, bucket by bucket, as read back.
fn read_all(spill: &Spill, chunk_bytes: usize) -> Vec<Vec<(usize, u64, Vec<u8>)>> {
    (0..spill.buckets())
        .map(|b| {
            let mut got = Vec::new();
            spill
                .read_bucket(b, chunk_bytes, |p, addr, payload| {
                    got.push((p, addr, payload.to_vec()));
                    Ok(())
                })
                .unwrap();
            got
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Reading the buckets back gives each bucket's rows in the order they were pushed, and
    /// every row in the bucket `buckets_of` names for its partition: the naive reference is
    /// the pushed rows filtered by bucket.
    #[test]
    fn prop_spilled_rows_read_back_in_order_by_bucket(
        partitions in 1usize..40,
        buckets in 1usize..12,
        row_width in 0usize..9,
        buffer_bytes in 1usize..200,
        chunk_bytes in 1usize..300,
        rows in prop::collection::vec((any::<u32>(), any::<u64>(), any::<u8>()), 0..300),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut spill =
            Spill::create("i", dir.path(), partitions, buckets, row_width, buffer_bytes).unwrap();
        let rows: Vec<(usize, u64, Vec<u8>)> = rows
            .into_iter()
            .map(|(p, addr, byte)| ((p as usize) % partitions, addr, vec![byte; row_width]))
            .collect();
        for (p, addr, payload) in &rows {
            spill.push(*p as u32, *addr, payload).unwrap();
        }
        spill.flush().unwrap();
        prop_assert_eq!(spill.records(), rows.len() as u64);
        prop_assert_eq!(
            spill.bytes_written(),
            rows.len() as u64 * (RECORD_HEADER_BYTES + row_width) as u64
        );
        let got = read_all(&spill, chunk_bytes);
        prop_assert!(spill.buckets() <= buckets.max(1));
        for (b, got) in got.iter().enumerate() {
            let want: Vec<_> = rows
                .iter()
                .filter(|(p, _, _)| spill.buckets_of(*p..*p + 1) == (b..b + 1))
                .cloned()
                .collect();
            prop_assert_eq!(got, &want, "bucket {}", b);
        }
        // A range of partitions names every bucket holding one of them, and no other.
        for start in 0..partitions {
            for end in start + 1..=partitions {
                let named = spill.buckets_of(start..end);
                let holding: Vec<usize> = (start..end)
                    .map(|p| spill.buckets_of(p..p + 1).start)
                    .collect();
                prop_assert_eq!(Some(&named.start), holding.first());
                prop_assert_eq!(Some(&(named.end - 1)), holding.last());
            }
        }
    }
}

#[test]
fn bucket_counts_follow_the_bytes_within_their_limits() {
    assert_eq!(bucket_count(1000, 3_000, 100, 256), 30);
    assert_eq!(bucket_count(1000, 3_001, 100, 256), 31);
    assert_eq!(bucket_count(1000, 1 << 40, 100, 256), 256);
    assert_eq!(bucket_count(10, 1 << 40, 100, 256), 10);
    assert_eq!(bucket_count(10, 0, 100, 256), 1);
    assert_eq!(bucket_count(0, 5, 0, 256), 1);
}

#[test]
fn a_row_outside_the_partitions_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut spill = Spill::create("idx", dir.path(), 4, 2, 3, 64).unwrap();
    let err = spill.push(4, 1, &[0; 3]).unwrap_err().to_string();
    assert!(err.contains("idx") && err.contains("partition 4"), "{err}");
    let err = spill.push(1, 1, &[0; 2]).unwrap_err().to_string();
    assert!(err.contains("2 bytes"), "{err}");
}

#[test]
fn a_bucket_whose_file_changed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut spill = Spill::create("idx", dir.path(), 4, 2, 3, 1).unwrap();
    spill.push(1, 7, &[1, 2, 3]).unwrap();
    spill.push(3, 8, &[4, 5, 6]).unwrap();
    spill.flush().unwrap();
    // Bytes written behind the spill's back into bucket `b`; the error reading it back.
    let mut tamper = |b: usize, bytes: &[u8]| {
        (&spill.buckets[b].file).write_all(bytes).unwrap();
        spill.buckets[b].len += bytes.len() as u64;
        spill
            .read_bucket(b, 64, |_, _, _| Ok(()))
            .unwrap_err()
            .to_string()
    };
    // A row of partition 3 in bucket 0 (partitions 0 and 1).
    let mut row = 3u32.to_le_bytes().to_vec();
    row.extend_from_slice(&[0; 11]);
    let err = tamper(0, &row);
    assert!(err.contains("partition 3"), "{err}");
    // Half a record.
    let err = tamper(1, &[0; 5]);
    assert!(err.contains("not whole records"), "{err}");
    // Bytes the spill did not write (its count back at its one record).
    (&spill.buckets[1].file).write_all(&[0; 10]).unwrap();
    spill.buckets[1].len = 15;
    let err = spill
        .read_bucket(1, 64, |_, _, _| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("30 bytes, 15 written"), "{err}");
}

#[test]
fn a_spill_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spill = Spill::create("idx", dir.path(), 8, 4, 2, 16).unwrap();
        for p in 0..8 {
            spill.push(p, p as u64, &[p as u8; 2]).unwrap();
        }
        spill.flush().unwrap();
        assert_eq!(read_all(&spill, 5).concat().len(), 8);
        if cfg!(unix) {
            // Unlinked once created.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("nope");
    let err = Spill::create("idx", &gone, 8, 4, 2, 16)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("cannot build index 'idx'") && err.contains("create the temporary file"),
        "{err}"
    );
}

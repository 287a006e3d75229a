use super::*;

fn part(rows: usize) -> Entry {
    Entry::Partition(Arc::new(Partition {
        quantized: Default::default(),
        addrs: vec![0; rows],
        codes: vec![],
        vectors: vec![],
    }))
}

fn key(p: usize) -> Key {
    Key::Partition {
        file: "t/s".into(),
        partition: p,
    }
}

#[test]
fn default_budget_is_a_quarter_of_usable_memory_with_a_floor() {
    let meminfo = "MemTotal:       24683652 kB\nMemFree:        14377900 kB\n";
    let quarter = 24683652 * 1024 / 4;
    assert_eq!(budget_from(Some(meminfo), None), quarter);
    assert_eq!(budget_from(Some(meminfo), Some("max\n")), quarter);
    assert_eq!(budget_from(Some(meminfo), Some("8589934592\n")), 2 << 30);
    assert_eq!(
        budget_from(Some(meminfo), Some("9223372036854771712")),
        quarter
    );
    assert_eq!(budget_from(None, None), FALLBACK_BUDGET_BYTES);
    assert_eq!(budget_from(Some("garbage"), None), FALLBACK_BUDGET_BYTES);
    let small = "MemTotal: 1048576 kB";
    assert_eq!(budget_from(Some(small), None), FALLBACK_BUDGET_BYTES);
}

#[test]
fn budget_evicts_oldest_first_and_skips_oversized_entries() {
    let mut s = CacheState::default();
    s.admit(key(0), part(4), 64); // 32 bytes
    s.admit(key(1), part(4), 64);
    assert_eq!(s.bytes, 64);
    s.admit(key(2), part(4), 64); // evicts key 0
    assert!(!s.entries.contains_key(&key(0)));
    assert!(s.entries.contains_key(&key(1)) && s.entries.contains_key(&key(2)));
    s.admit(key(3), part(100), 64); // larger than the budget: not kept
    assert!(!s.entries.contains_key(&key(3)));
    assert_eq!(s.bytes, 64);
}

#[test]
fn an_entry_used_since_the_last_sweep_outlives_an_unused_newer_one() {
    let mut s = CacheState::default();
    for p in 0..4 {
        s.admit(key(p), part(2), 64); // 16 bytes each: full
    }
    assert!(s.get(&key(0)).is_some()); // the oldest, but in use
    s.admit(key(4), part(2), 64);
    assert!(s.entries.contains_key(&key(0)), "used: kept once");
    assert!(!s.entries.contains_key(&key(1)), "oldest unused: evicted");
    // key 0's mark was cleared by the sweep: unused since, it goes next after 2 and 3.
    s.admit(key(5), part(6), 64); // 48 bytes: evicts 2, 3 then 0
    assert!(!s.entries.contains_key(&key(0)));
    assert!(s.entries.contains_key(&key(4)) && s.entries.contains_key(&key(5)));
    assert_eq!(s.bytes, 64);
    // Every entry in use: the sweep clears the marks and then evicts the oldest.
    assert!(s.get(&key(4)).is_some() && s.get(&key(5)).is_some());
    s.admit(key(6), part(2), 64);
    assert!(!s.entries.contains_key(&key(4)) && s.entries.contains_key(&key(5)));
    assert_eq!(s.bytes, 64);
}

/// Quantized rows added to a reused partition are counted while it is kept and given
/// back when it goes. Partitions about to be admitted, or reused, are quantized only while
/// an eighth of the budget stays free.
#[test]
fn quantized_rows_are_counted_while_kept_and_made_only_with_room() {
    let cache = IndexCache::new(1 << 20);
    let dim = 32;
    let flat = |rows: usize| {
        Arc::new(Partition {
            quantized: Default::default(),
            addrs: (0..rows as u64).collect(),
            codes: vec![],
            vectors: (0..rows * dim).map(|i| (i % 7) as f32).collect(),
        })
    };
    let (a, b) = (flat(1000), flat(1000));
    let plain = a.bytes(); // 136,000 bytes each
    cache.admit(key(0), Entry::Partition(a.clone()));
    cache.admit(key(1), Entry::Partition(b.clone()));
    assert_eq!(cache.bytes_held(), 2 * plain);
    cache.quantize_reused(&[(key(0), a.clone())]);
    let extra = 1000 * dim + 3 * dim * 4 + 1000 * 12; // codes, lo, step, centre, bounds
    assert_eq!(a.bytes(), plain + extra);
    assert_eq!(cache.bytes_held(), 2 * plain + extra);
    // A second call finds it done: nothing counted twice.
    cache.quantize_reused(&[(key(0), a.clone())]);
    assert_eq!(cache.bytes_held(), 2 * plain + extra);
    // Two queries that quantized it at once both recount it: counted once.
    cache.state.lock().unwrap().recount(&key(0), &a, 1 << 20);
    assert_eq!(cache.bytes_held(), 2 * plain + extra);
    // Not the cached partition under that key any more: computed, not counted.
    let stray = flat(10);
    cache.quantize_reused(&[(key(1), stray.clone())]);
    assert!(stray.quantized.get().is_some());
    assert_eq!(cache.bytes_held(), 2 * plain + extra);
    // Room for a newcomer and its codes: quantized before admission.
    let c = flat(1000);
    cache.quantize_if_room(&[&c]);
    assert!(c.quantized.get().is_some());
    // No room (it would evict): left as floats.
    cache.set_budget(2 * plain + extra + plain);
    let d = flat(1000);
    cache.quantize_if_room(&[&d]);
    assert!(d.quantized.get().is_none());
    // Reused, but no room for its quantized rows: left as floats.
    cache.set_budget(2 * plain + extra + extra / 2);
    cache.quantize_reused(&[(key(1), b.clone())]);
    assert!(b.quantized.get().is_none());
    assert_eq!(cache.bytes_held(), 2 * plain + extra);
    let mut state = cache.state.lock().unwrap();
    state.make_room(usize::MAX / 2, 0);
    assert_eq!(state.bytes, 0);
}

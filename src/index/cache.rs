//! The index cache: what KNN queries and index maintenance keep between statements of a
//! session, under **one byte budget** (`fragvec.index_cache_bytes`).
//!
//! Budgeted entries (evicted by second chance when a new one does not fit: the oldest entry
//! not used since the last sweep goes first, so a hot partition outlives a one-off read; an
//! entry larger than the whole budget is used once and not kept):
//! * segment partitions as stored, and partitions translated through a ledger state, with
//!   the quantized rows of IVF_FLAT partitions ([`super::quantized`], a quarter of their
//!   bytes more, counted against the budget). A partition is quantized when it is admitted,
//!   or found in the cache again, while an eighth of the budget stays free;
//! * or, for an IVF_FLAT segment whose floats do not fit the budget but whose sketches do,
//!   the sketches of its partitions as stored (`sketches`): a query then reads from the
//!   file only the rows their codes cannot rule out;
//! * decoded vector columns of data files (brute force and exact scoring);
//! * whole decoded fixed-width columns of data files (fetching a KNN answer's rows);
//! * the rows of one table version that pass a KNN query's WHERE filter, by the filter's
//!   identity as the engine spells it ([`IndexCache::filter_mask`]): a filter evaluated over
//!   every row costs a pass over the table per query, one a repeated filter (a tenant, a
//!   category) pays once per version.
//!
//! Small, count-capped metadata (not budgeted: a few bytes to a few KB each): segment
//! footers, IVF models, loaded reuse ledgers and derived segment ownerships. Every key names
//! the table directory and the immutable file (or ledger content) it was read from, so a
//! table dropped and created again never hits a stale entry.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::ArrayRef;
use roaring::RoaringTreemap;

use super::error::{IndexError, Result};
use super::ivf::IvfModel;
use super::ownership::segment_ownerships;
use super::parallel;
use super::quantized::QuantizedRows;
use super::row_centroids::RowCentroids;
use super::row_centroids::background::{AssignableRows, CentroidSlot};
use super::segment::{self, Footer, Partition};
use super::sketch::Sketch;
use crate::format::index_meta::{IndexDef, IndexSegment};
use crate::format::ledger_io::{ledger_key, load_ledger};
use crate::format::{FormatError, Manifest, TableDir};
use crate::ledger::{LedgerView, SegmentOwnership};

/// Ledger states and ownership derivations kept; past these counts the maps start over
/// (each entry is small and rebuilt by the next query that needs it).
const MAX_LEDGERS: usize = 64;
const MAX_OWNERSHIPS: usize = 256;

/// The default cache budget when the machine's memory cannot be read, and its floor.
pub const FALLBACK_BUDGET_BYTES: usize = 256 * 1024 * 1024;

/// The default `fragvec.index_cache_bytes`: a quarter of the memory this process may use
/// (physical memory, or the cgroup's limit when lower), at least
/// [`FALLBACK_BUDGET_BYTES`]; that fallback when neither can be read (not Linux). Read once
/// per process: every session's default options (a worker builds one per task) ask for it.
pub fn default_budget_bytes() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        budget_from(
            read("/proc/meminfo").as_deref(),
            read("/sys/fs/cgroup/memory.max")
                .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
                .as_deref(),
        )
    })
}

/// [`default_budget_bytes`] from the text of `/proc/meminfo` and of the cgroup's limit file.
fn budget_from(meminfo: Option<&str>, cgroup_limit: Option<&str>) -> usize {
    let physical = meminfo.and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kb.checked_mul(1024)
    });
    // "max" (no limit) and absurd v1 "unlimited" values do not parse or exceed physical.
    let limit = cgroup_limit.and_then(|l| l.trim().parse::<u64>().ok());
    let usable = match (physical, limit) {
        (Some(p), Some(l)) => p.min(l),
        (Some(p), None) => p,
        (None, Some(l)) => l,
        (None, None) => return FALLBACK_BUDGET_BYTES,
    };
    usize::try_from(usable / 4)
        .unwrap_or(usize::MAX)
        .max(FALLBACK_BUDGET_BYTES)
}

/// The vector column of one fragment's data file, decoded, for exact scoring.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ColumnVectors {
    /// Floats per vector.
    pub dim: usize,
    /// `rows × dim` floats; a NULL row's slots are zero.
    pub values: Vec<f32>,
    /// Per row: whether the vector is non-NULL.
    pub valid: Vec<bool>,
    /// How many rows are NULL.
    pub nulls: usize,
    /// Each row's nearest centroid, once assigned (in the background), for the bounds that
    /// let brute force skip rows ([`crate::index::row_centroids`]).
    pub centroids: CentroidSlot,
}

impl ColumnVectors {
    /// Bytes counted against the budget, with room for the rows' centroids reserved.
    fn bytes(&self) -> usize {
        self.values.len() * 4 + self.valid.len() * (1 + RowCentroids::BYTES_PER_ROW)
    }

    /// Appends `other`'s rows.
    pub fn append(&mut self, other: &ColumnVectors) {
        self.dim = other.dim;
        self.values.extend_from_slice(&other.values);
        self.valid.extend_from_slice(&other.valid);
        self.nulls += other.nulls;
        self.centroids = CentroidSlot::default();
    }

    /// Row `i`'s vector, or `None` for a NULL.
    #[inline]
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.valid[i].then(|| &self.values[i * self.dim..(i + 1) * self.dim])
    }
}

impl AssignableRows for ColumnVectors {
    fn slot(&self) -> &CentroidSlot {
        &self.centroids
    }

    fn assign(&self, model: &Arc<IvfModel>) -> Option<RowCentroids> {
        RowCentroids::compute(self.dim, &self.values, &self.valid, model)
    }
}

/// How to bring a segment's rows up to date: the ledger and the segment's ownership.
#[derive(Clone, Copy, Debug)]
pub struct Translation<'a> {
    /// The reuse ledger as the table version sees it.
    pub view: &'a LedgerView,
    /// Which rows the segment still owns.
    pub ownership: &'a SegmentOwnership,
}

/// What a budgeted entry is, by its source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// Partition `partition` of a segment file, as stored.
    Partition { file: String, partition: usize },
    /// The same, translated through a ledger state, limited to what the segment owns.
    Translated {
        file: String,
        ledger: u64,
        invalidated: Vec<u64>,
        partition: usize,
    },
    /// Partition `partition` of a segment file, kept by its sketch ([`sketches`]).
    Sketch { file: String, partition: usize },
    /// An IVF_SQ partition's sketch translated through a ledger state, as `Translated`.
    TranslatedSketch {
        file: String,
        ledger: u64,
        invalidated: Vec<u64>,
        partition: usize,
    },
    /// The decoded vector column of a data file.
    Vectors { file: String, column: String },
    /// A whole decoded column of a data file.
    Column { file: String, column: String },
    /// The rows of version `version` ([`version_key`]) passing the filter `filter`.
    FilterMask { version: String, filter: String },
}

#[derive(Debug, Clone)]
enum Entry {
    Partition(Arc<Partition>),
    Sketch(Arc<Sketch>),
    Vectors(Arc<ColumnVectors>),
    Column(ArrayRef),
    FilterMask(Arc<RoaringTreemap>),
}

impl Entry {
    fn bytes(&self) -> usize {
        match self {
            Entry::Partition(p) => p.bytes(),
            Entry::Sketch(s) => s.bytes(),
            Entry::Vectors(v) => v.bytes(),
            Entry::Column(a) => a.get_array_memory_size(),
            Entry::FilterMask(m) => m.serialized_size(),
        }
    }
}

/// The session's index cache (see the module docs).
#[derive(Debug)]
pub struct IndexCache {
    budget: AtomicUsize,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    footers: HashMap<String, Arc<Footer>>,
    models: HashMap<String, Arc<IvfModel>>,
    ledgers: HashMap<String, Arc<LedgerView>>,
    /// The same views by manifest ([`version_key`]): found without hashing the ledger.
    ledgers_by_version: HashMap<String, Arc<LedgerView>>,
    ownerships: HashMap<String, Arc<BTreeMap<u64, SegmentOwnership>>>,
    /// The same ownerships by manifest and index ([`version_key`]).
    ownerships_by_version: HashMap<String, Arc<BTreeMap<u64, SegmentOwnership>>>,
    /// A faster hash than SipHash: looked up for every fragment a brute force scores.
    entries: datafusion::common::HashMap<Key, Slot>,
    /// Admission order; an entry used since it was last swept goes to the back once.
    order: VecDeque<Key>,
    bytes: usize,
}

#[derive(Debug)]
struct Slot {
    entry: Entry,
    /// Read since admitted or since the eviction sweep last passed it.
    used: bool,
    /// Bytes counted for the entry: its size when admitted, plus what it grew since (a
    /// partition's quantized rows).
    bytes: usize,
}

impl CacheState {
    fn get(&mut self, key: &Key) -> Option<Entry> {
        let slot = self.entries.get_mut(key)?;
        slot.used = true;
        Some(slot.entry.clone())
    }

    /// Inserts an entry if it fits the budget, evicting by second chance (CLOCK): from the
    /// oldest, an entry used since the sweep last passed it is kept once (moved to the back),
    /// an unused one is evicted. Two sweeps at most, since the first clears every mark.
    fn admit(&mut self, key: Key, entry: Entry, budget: usize) {
        let size = entry.bytes();
        if size > budget || self.entries.contains_key(&key) {
            return;
        }
        self.make_room(size, budget);
        self.bytes += size;
        self.entries.insert(
            key.clone(),
            Slot {
                entry,
                used: false,
                bytes: size,
            },
        );
        self.order.push_back(key);
    }

    /// Evicts until `size` more bytes fit the budget (or nothing is left to evict).
    fn make_room(&mut self, size: usize, budget: usize) {
        while self.bytes + size > budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            match self.entries.get_mut(&old) {
                Some(slot) if slot.used => {
                    slot.used = false;
                    self.order.push_back(old);
                }
                Some(_) => {
                    let evicted = self.entries.remove(&old).expect("present");
                    self.bytes -= evicted.bytes;
                }
                None => {}
            }
        }
    }

    /// Counts what the partition cached under `key` holds now (if it is still that
    /// partition: its quantized rows may have been added since it was admitted), evicting
    /// others, or the partition itself, to stay within the budget. Counting what it holds,
    /// not what was added, lets two queries that quantized it at once count it once.
    fn recount(&mut self, key: &Key, part: &Arc<Partition>, budget: usize) {
        match self.entries.get_mut(key) {
            Some(slot) if matches!(&slot.entry, Entry::Partition(p) if Arc::ptr_eq(p, part)) => {
                let now = part.bytes().max(slot.bytes);
                self.bytes += now - slot.bytes;
                slot.bytes = now;
            }
            _ => return,
        }
        if self.bytes > budget {
            self.make_room(0, budget);
        }
    }
}

impl IndexCache {
    /// An empty cache holding at most `budget_bytes`.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget: AtomicUsize::new(budget_bytes),
            state: Mutex::new(CacheState::default()),
        }
    }

    /// Changes the byte budget (the session option may change between queries).
    pub fn set_budget(&self, bytes: usize) {
        self.budget.store(bytes, AtomicOrdering::Relaxed);
    }

    /// The byte budget (for callers deciding what is worth caching).
    pub fn budget(&self) -> usize {
        self.budget.load(AtomicOrdering::Relaxed)
    }

    /// Bytes held by budgeted entries now.
    pub fn bytes_held(&self) -> usize {
        self.state.lock().expect("cache lock").bytes
    }

    fn get(&self, key: &Key) -> Option<Entry> {
        self.state.lock().expect("cache lock").get(key)
    }

    /// Quantizes the IVF_FLAT partitions among `hits` (found in the cache, so reused) that
    /// are not yet, on every core when they are several, and counts their bytes; only while
    /// the budget has room ([`Self::has_room`]): a full cache churns, and quantizing
    /// partitions it is about to evict costs each query more than it saves (measured at 1M
    /// × 768 with a 1 GiB budget, quantizing every reused partition: nprobes 16 went from
    /// 10.7 to 28.8 ms).
    fn quantize_reused(&self, hits: &[(Key, Arc<Partition>)]) {
        let todo: Vec<&(Key, Arc<Partition>)> = hits
            .iter()
            .filter(|(_, p)| p.quantized.get().is_none() && !p.vectors.is_empty())
            .collect();
        if todo.is_empty() {
            return;
        }
        let parts: Vec<&Partition> = todo.iter().map(|(_, p)| p.as_ref()).collect();
        if !self.has_room(parts.iter().map(|p| quantized_bytes(p)).sum()) {
            return;
        }
        quantize_all(&parts);
        let budget = self.budget();
        let mut state = self.state.lock().expect("cache lock");
        for (key, p) in todo {
            state.recount(key, p, budget);
        }
    }

    /// Quantizes `parts`, about to be admitted, when the budget has room for them and their
    /// quantized rows ([`Self::has_room`]).
    fn quantize_if_room(&self, parts: &[&Partition]) {
        if self.has_room(parts.iter().map(|p| p.bytes() + quantized_bytes(p)).sum()) {
            quantize_all(parts);
        }
    }

    /// Whether `bytes` more fit the budget with an eighth of it still free. A cache that
    /// is full churns: an eviction often frees a little more than the entry it admits, and
    /// quantizing into that gap costs queries time for partitions about to be evicted.
    fn has_room(&self, bytes: usize) -> bool {
        let held = self.state.lock().expect("cache lock").bytes;
        let budget = self.budget();
        held + bytes + budget / 8 <= budget
    }

    fn admit(&self, key: Key, entry: Entry) {
        let budget = self.budget();
        self.state
            .lock()
            .expect("cache lock")
            .admit(key, entry, budget);
    }

    /// The decoded vectors of `column` in data file `file` (read with `load` on a miss).
    pub async fn vectors<F, Fut>(
        &self,
        file: String,
        column: &str,
        load: F,
    ) -> Result<Arc<ColumnVectors>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<ColumnVectors>>,
    {
        let key = Key::Vectors {
            file,
            column: column.to_string(),
        };
        if let Some(Entry::Vectors(hit)) = self.get(&key) {
            return Ok(hit);
        }
        let vectors = Arc::new(load().await?);
        self.admit(key, Entry::Vectors(vectors.clone()));
        Ok(vectors)
    }

    /// The decoded vectors of `column` in data file `file` if they are cached (no read).
    pub fn cached_vectors(&self, file: String, column: &str) -> Option<Arc<ColumnVectors>> {
        let key = Key::Vectors {
            file,
            column: column.to_string(),
        };
        match self.get(&key) {
            Some(Entry::Vectors(hit)) => Some(hit),
            _ => None,
        }
    }

    /// A whole decoded column of data file `file` (every physical row): fetching a KNN
    /// answer's k rows then costs k lookups instead of decoding pages.
    pub async fn column<F, Fut>(&self, file: &str, column: &str, load: F) -> Result<ArrayRef>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<ArrayRef>>,
    {
        let key = Key::Column {
            file: file.to_string(),
            column: column.to_string(),
        };
        if let Some(Entry::Column(hit)) = self.get(&key) {
            return Ok(hit);
        }
        let array = load().await?;
        self.admit(key, Entry::Column(array.clone()));
        Ok(array)
    }

    /// The rows of `manifest`'s version passing the filter whose identity is `filter`, if a
    /// query kept them ([`Self::keep_filter_mask`]). `filter` must name everything the rows
    /// depend on besides the version: two filters with one identity must pass the same rows.
    pub fn filter_mask(
        &self,
        dir: &TableDir,
        manifest: &Manifest,
        filter: &str,
    ) -> Option<Arc<RoaringTreemap>> {
        let key = Key::FilterMask {
            version: version_key(dir, manifest),
            filter: filter.to_string(),
        };
        match self.get(&key) {
            Some(Entry::FilterMask(hit)) => Some(hit),
            _ => None,
        }
    }

    /// Keeps the rows of `manifest`'s version passing the filter `filter` (see
    /// [`Self::filter_mask`]), under the budget like any other entry.
    pub fn keep_filter_mask(
        &self,
        dir: &TableDir,
        manifest: &Manifest,
        filter: String,
        rows: Arc<RoaringTreemap>,
    ) {
        let key = Key::FilterMask {
            version: version_key(dir, manifest),
            filter,
        };
        self.admit(key, Entry::FilterMask(rows));
    }

    /// The loaded reuse ledger of a manifest (shared by every version with the same ledger).
    pub async fn ledger(&self, dir: &TableDir, manifest: &Manifest) -> Result<Arc<LedgerView>> {
        if manifest.reuse_ledger.is_empty() {
            return Ok(Arc::new(LedgerView::default()));
        }
        let version = version_key(dir, manifest);
        let found = {
            let state = self.state.lock().expect("cache lock");
            state.ledgers_by_version.get(&version).cloned()
        };
        if let Some(v) = found {
            return Ok(v);
        }
        // Versions that share a ledger (every commit but a rewrite's) share its view.
        let key = format!("{}#{}", dir.name(), ledger_key(manifest));
        let found = self
            .state
            .lock()
            .expect("cache lock")
            .ledgers
            .get(&key)
            .cloned();
        let view = match found {
            Some(v) => v,
            None => Arc::new(load_ledger(dir, manifest).await?),
        };
        let mut state = self.state.lock().expect("cache lock");
        bounded_insert(&mut state.ledgers, key, view.clone(), MAX_LEDGERS);
        bounded_insert(
            &mut state.ledgers_by_version,
            version,
            view.clone(),
            MAX_LEDGERS,
        );
        Ok(view)
    }

    /// Each segment of `index` with its ownership in `manifest`'s fragment ids.
    pub async fn ownerships(
        &self,
        dir: &TableDir,
        manifest: &Manifest,
        view: &LedgerView,
        index: &str,
    ) -> Result<Arc<BTreeMap<u64, SegmentOwnership>>> {
        if view.is_empty() {
            return Ok(Arc::new(
                segment_ownerships(dir, manifest, view, index).await?,
            ));
        }
        let version = format!("{}#{index}", version_key(dir, manifest));
        let found = {
            let state = self.state.lock().expect("cache lock");
            state.ownerships_by_version.get(&version).cloned()
        };
        if let Some(o) = found {
            return Ok(o);
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in &manifest.fragments {
            f.id.hash(&mut h);
        }
        for s in manifest.segments_of(index) {
            (&s.file, &s.fragment_bitmap, &s.invalidated_fragments).hash(&mut h);
        }
        let key = format!("{}#{index}#{}#{:x}", dir.name(), view.key(), h.finish());
        let found = self
            .state
            .lock()
            .expect("cache lock")
            .ownerships
            .get(&key)
            .cloned();
        let owners = match found {
            Some(o) => o,
            None => Arc::new(segment_ownerships(dir, manifest, view, index).await?),
        };
        let mut state = self.state.lock().expect("cache lock");
        bounded_insert(&mut state.ownerships, key, owners.clone(), MAX_OWNERSHIPS);
        bounded_insert(
            &mut state.ownerships_by_version,
            version,
            owners.clone(),
            MAX_OWNERSHIPS,
        );
        Ok(owners)
    }

    /// An index's model (cached: models are small, shared and immutable), checked against
    /// its definition.
    pub async fn model(&self, dir: &TableDir, def: &IndexDef) -> Result<Arc<IvfModel>> {
        let key = format!("{}/{}", dir.name(), def.model_file);
        if let Some(m) = self.state.lock().expect("cache lock").models.get(&key) {
            return Ok(m.clone());
        }
        let path = dir.path(&def.model_file);
        let bytes = dir.read(&def.model_file).await?;
        let model = Arc::new(IvfModel::decode(&bytes).map_err(|r| FormatError::corrupt(&path, r))?);
        if model.metric != def.metric || model.partitions() != def.num_partitions as usize {
            return Err(
                FormatError::corrupt(&path, "model does not match its index definition").into(),
            );
        }
        self.state
            .lock()
            .expect("cache lock")
            .models
            .insert(key, model.clone());
        Ok(model)
    }

    /// A segment's footer, checked against the index model and the manifest.
    pub async fn segment_footer(
        &self,
        dir: &TableDir,
        segment: &IndexSegment,
        model: &IvfModel,
    ) -> Result<Arc<Footer>> {
        let footer = self.footer(dir, &segment.file, segment.size_bytes).await?;
        check_footer(dir, segment, &footer, model)?;
        Ok(footer)
    }

    /// A segment file's footer (cached: footers are tiny and files immutable).
    pub async fn footer(&self, dir: &TableDir, file: &str, size: u64) -> Result<Arc<Footer>> {
        let key = format!("{}/{file}", dir.name());
        if let Some(f) = self.state.lock().expect("cache lock").footers.get(&key) {
            return Ok(f.clone());
        }
        let footer = Arc::new(segment::read_footer(dir, file, size).await?);
        self.state
            .lock()
            .expect("cache lock")
            .footers
            .insert(key, footer.clone());
        Ok(footer)
    }

    /// One partition of a segment file, as stored.
    pub async fn partition(
        &self,
        dir: &TableDir,
        file: &str,
        footer: &Footer,
        p: usize,
        pq: bool,
    ) -> Result<Arc<Partition>> {
        let key = Key::Partition {
            file: format!("{}/{file}", dir.name()),
            partition: p,
        };
        if let Some(Entry::Partition(hit)) = self.get(&key) {
            return Ok(hit);
        }
        let partition = Arc::new(segment::read_partition(dir, file, footer, p, pq).await?);
        self.admit(key, Entry::Partition(partition.clone()));
        Ok(partition)
    }

    /// Partitions `ps` of a segment file, as stored: the cached ones from the cache, the
    /// others read together ([`segment::read_partitions`]: close ranges coalesced, the
    /// requests sent concurrently), and kept when `admit` (a scan of a segment larger than
    /// the budget passes `false`, so it does not flush what repeated queries use).
    pub async fn partitions(
        &self,
        dir: &TableDir,
        file: &str,
        footer: &Footer,
        ps: &[usize],
        pq: bool,
        admit: bool,
    ) -> Result<Vec<Arc<Partition>>> {
        let key = |p: usize| Key::Partition {
            file: format!("{}/{file}", dir.name()),
            partition: p,
        };
        let mut found: Vec<Option<Arc<Partition>>> = ps
            .iter()
            .map(|&p| match self.get(&key(p)) {
                Some(Entry::Partition(hit)) => Some(hit),
                _ => None,
            })
            .collect();
        let hits: Vec<(Key, Arc<Partition>)> = ps
            .iter()
            .zip(&found)
            .filter_map(|(&p, hit)| Some((key(p), hit.clone()?)))
            .collect();
        self.quantize_reused(&hits);
        let missing: Vec<usize> = ps
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(&p, _)| p)
            .collect();
        let read = segment::read_partitions(dir, file, footer, &missing, pq).await?;
        if admit {
            self.quantize_if_room(&read.iter().collect::<Vec<_>>());
        }
        let mut read = read.into_iter();
        for (slot, &p) in found.iter_mut().zip(ps) {
            if slot.is_none() {
                let partition = Arc::new(read.next().expect("one partition per missing one"));
                if admit {
                    self.admit(key(p), Entry::Partition(partition.clone()));
                }
                *slot = Some(partition);
            }
        }
        Ok(found.into_iter().flatten().collect())
    }

    /// [`Self::translated_partition`] of several partitions, whose stored forms are read
    /// together ([`Self::partitions`]).
    pub async fn translated_partitions(
        &self,
        dir: &TableDir,
        segment: &IndexSegment,
        footer: &Footer,
        ps: &[usize],
        pq: bool,
        translation: Translation<'_>,
    ) -> Result<Vec<Arc<Partition>>> {
        let missing: Vec<usize> = ps
            .iter()
            .copied()
            .filter(|&p| {
                !matches!(
                    self.get(&translated_key(dir, segment, translation.view, p)),
                    Some(Entry::Partition(_))
                )
            })
            .collect();
        // Brings the stored forms of the missing ones into the cache in one go (when the
        // budget keeps them; the loop below reads any it did not keep).
        self.partitions(dir, &segment.file, footer, &missing, pq, true)
            .await?;
        let mut out = Vec::with_capacity(ps.len());
        for &p in ps {
            out.push(
                self.translated_partition(dir, segment, footer, p, pq, translation)
                    .await?,
            );
        }
        Ok(out)
    }

    /// A partition of a segment whose rows were moved by rewrites: addresses translated
    /// through the ledger, rows the segment does not own (any more) dropped. Cached under the
    /// ledger state and the segment's invalidations.
    pub async fn translated_partition(
        &self,
        dir: &TableDir,
        segment: &IndexSegment,
        footer: &Footer,
        p: usize,
        pq: bool,
        translation: Translation<'_>,
    ) -> Result<Arc<Partition>> {
        let Translation { view, ownership } = translation;
        let key = translated_key(dir, segment, view, p);
        if let Some(Entry::Partition(hit)) = self.get(&key) {
            self.quantize_reused(&[(key, hit.clone())]);
            return Ok(hit);
        }
        let raw = self.partition(dir, &segment.file, footer, p, pq).await?;
        let moved = view
            .translate(&raw.addrs)
            .await
            .map_err(|e| IndexError::ledger(dir.name(), e))?;
        let width = if raw.is_empty() {
            0
        } else if pq {
            raw.codes.len() / raw.len()
        } else {
            raw.vectors.len() / raw.len()
        };
        let mut out = Partition::default();
        for (i, addr) in moved.into_iter().enumerate() {
            let Some(addr) = addr.filter(|a| ownership.covers(*a)) else {
                continue;
            };
            out.addrs.push(addr);
            if pq {
                out.codes
                    .extend_from_slice(&raw.codes[i * width..(i + 1) * width]);
            } else {
                out.vectors
                    .extend_from_slice(&raw.vectors[i * width..(i + 1) * width]);
            }
        }
        self.quantize_if_room(&[&out]);
        let out = Arc::new(out);
        self.admit(key, Entry::Partition(out.clone()));
        Ok(out)
    }
}

/// Identifies one version's manifest of a table: its version and its transaction's random
/// tag (a table dropped and created again reuses version numbers, not tags). What is derived
/// from a whole manifest is then found once per version by this short key, not by hashing
/// the manifest's ledger or fragments on every query (1.4% each of a server's CPU under
/// `perf` on a table committing 30 times a second).
fn version_key(dir: &TableDir, manifest: &Manifest) -> String {
    format!(
        "{}#{}#{}",
        dir.name(),
        manifest.version,
        manifest.transaction.tag
    )
}

/// Inserts into a map kept below `max` entries (emptied when full: its values are cheap to
/// derive again, and the live versions come back first).
fn bounded_insert<V>(map: &mut HashMap<String, V>, key: String, value: V, max: usize) {
    if map.len() >= max {
        map.clear();
    }
    map.insert(key, value);
}

/// About what quantizing `part` adds ([`QuantizedRows::estimated_bytes`]).
fn quantized_bytes(part: &Partition) -> usize {
    let dim = part.vectors.len() / part.len().max(1);
    QuantizedRows::estimated_bytes(part.len() as u64, dim) as usize
}

/// Quantizes the rows of `parts`, on every core when they are several.
fn quantize_all(parts: &[&Partition]) {
    let threads = if parts.len() > 1 {
        parallel::cores()
    } else {
        1
    };
    parallel::claim_each(parts, threads, || (), |_, p| p.quantize());
}

/// The cache key of partition `p` of `segment` translated through `view`.
fn translated_key(dir: &TableDir, segment: &IndexSegment, view: &LedgerView, p: usize) -> Key {
    Key::Translated {
        file: format!("{}/{}", dir.name(), segment.file),
        ledger: segment_lineage(view, segment),
        invalidated: segment.invalidated_fragments.iter().copied().collect(),
        partition: p,
    }
}

/// The part of the ledger a segment's rows pass through ([`LedgerView::lineage_key`]): what
/// its translated partitions depend on, besides its invalidations.
pub(crate) fn segment_lineage(view: &LedgerView, segment: &IndexSegment) -> u64 {
    view.lineage_key(&segment.file, || segment.fragment_bitmap.iter().copied())
}

/// Checks a segment's footer against its index model and its manifest entry, so a foreign
/// or mismatched file is refused before any partition is read.
fn check_footer(
    dir: &TableDir,
    segment: &IndexSegment,
    footer: &Footer,
    model: &IvfModel,
) -> crate::format::Result<()> {
    let width = model.row_width();
    if footer.partitions.len() != model.partitions()
        || footer.row_width != width
        || footer.rows() != segment.rows
    {
        return Err(FormatError::corrupt(
            dir.path(&segment.file),
            format!(
                "segment has {} partitions of {}-byte rows ({} rows); its index expects {} \
                 partitions of {width}-byte rows and the manifest {} rows",
                footer.partitions.len(),
                footer.row_width,
                footer.rows(),
                model.partitions(),
                segment.rows
            ),
        ));
    }
    Ok(())
}

mod sketches;
#[cfg(test)]
mod tests;

pub use sketches::Probed;

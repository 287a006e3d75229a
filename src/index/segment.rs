//! Segment files: the rows of some fragments, grouped by IVF partition, so a query reads only
//! the partitions it probes (one range read each).
//!
//! Layout (little-endian): for each partition in order, its row addresses (`u64` each) then its
//! payload (`dim` f32 per row for IVF_FLAT, `sub_vectors` code bytes per row for IVF_PQ); then a
//! footer: magic `FVSEG001`, `u32` partitions, `u32` payload bytes per row, and per partition
//! `u64` offset and `u64` rows; then `u64` footer length and the end magic `FVSEGEND`.
//! Opening checks that the footer describes contiguous blocks that exactly fill the file.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::ObjectStoreExt;

use super::ivf::IvfModel;
use crate::format::index_meta::{IndexDef, IndexSegment};
use crate::format::ledger_io::{ledger_key, load_ledger, segment_ownerships};
use crate::format::{FormatError, Manifest, Result, TableDir};
use crate::ledger::{LedgerView, SegmentOwnership};

const MAGIC: &[u8; 8] = b"FVSEG001";
const END_MAGIC: &[u8; 8] = b"FVSEGEND";

/// The rows of one partition of one segment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Partition {
    pub addrs: Vec<u64>,
    /// `addrs.len() × width` bytes for PQ codes, or empty for IVF_FLAT.
    pub codes: Vec<u8>,
    /// `addrs.len() × dim` floats for IVF_FLAT, or empty for IVF_PQ.
    pub vectors: Vec<f32>,
}

impl Partition {
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    fn bytes(&self) -> usize {
        self.addrs.len() * 8 + self.codes.len() + self.vectors.len() * 4
    }
}

/// Where each partition lives in a segment file.
#[derive(Debug, Clone, PartialEq)]
pub struct Footer {
    /// Payload bytes per row (`4 × dim` for flat vectors, `sub_vectors` for PQ codes).
    pub row_width: usize,
    pub partitions: Vec<(u64, u64)>,
}

impl Footer {
    pub fn rows(&self) -> u64 {
        self.partitions.iter().map(|p| p.1).sum()
    }

    fn range(&self, p: usize) -> Range<u64> {
        let (offset, rows) = self.partitions[p];
        offset..offset + rows * (8 + self.row_width as u64)
    }

    /// Where partition `p`'s row addresses are (they come first in the partition).
    pub fn addrs_range(&self, p: usize) -> Range<u64> {
        let (offset, rows) = self.partitions[p];
        offset..offset + rows * 8
    }
}

/// Decodes a partition's address bytes (see [`Footer::addrs_range`]).
pub fn decode_addrs(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect()
}

/// Encodes partitions (flat vectors when `pq_width == 0`, else PQ codes of that width).
pub fn encode(partitions: &[Partition], row_width: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut index = Vec::with_capacity(partitions.len());
    for p in partitions {
        index.push((out.len() as u64, p.len() as u64));
        for a in &p.addrs {
            out.extend_from_slice(&a.to_le_bytes());
        }
        for v in &p.vectors {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&p.codes);
    }
    let footer_start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(partitions.len() as u32).to_le_bytes());
    out.extend_from_slice(&(row_width as u32).to_le_bytes());
    for (offset, rows) in index {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&rows.to_le_bytes());
    }
    let footer_len = (out.len() - footer_start) as u64;
    out.extend_from_slice(&footer_len.to_le_bytes());
    out.extend_from_slice(END_MAGIC);
    out
}

/// Decodes and checks a footer (`footer` excludes the trailing length and end magic).
pub fn decode_footer(footer: &[u8], file_size: u64) -> std::result::Result<Footer, String> {
    if footer.len() < 16 || &footer[..8] != MAGIC {
        return Err("not a fragvec segment footer".into());
    }
    let partitions = u32::from_le_bytes(footer[8..12].try_into().expect("4")) as usize;
    let row_width = u32::from_le_bytes(footer[12..16].try_into().expect("4")) as usize;
    if footer.len() != 16 + partitions * 16 {
        return Err("footer length does not match its partition count".into());
    }
    let mut index = Vec::with_capacity(partitions);
    let mut expected = 0u64;
    for p in 0..partitions {
        let at = 16 + p * 16;
        let offset = u64::from_le_bytes(footer[at..at + 8].try_into().expect("8"));
        let rows = u64::from_le_bytes(footer[at + 8..at + 16].try_into().expect("8"));
        if offset != expected {
            return Err(format!(
                "partition {p} starts at {offset}, expected {expected}"
            ));
        }
        expected = rows
            .checked_mul(8 + row_width as u64)
            .and_then(|b| b.checked_add(offset))
            .ok_or("partition sizes overflow")?;
        index.push((offset, rows));
    }
    if expected + footer.len() as u64 + 16 != file_size {
        return Err("partitions and footer do not fill the file exactly".into());
    }
    Ok(Footer {
        row_width,
        partitions: index,
    })
}

fn decode_partition(bytes: &[u8], rows: usize, row_width: usize, pq: bool) -> Partition {
    let (addrs, payload) = bytes.split_at(rows * 8);
    let addrs = addrs
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect();
    if pq {
        Partition {
            addrs,
            codes: payload[..rows * row_width].to_vec(),
            vectors: vec![],
        }
    } else {
        let vectors = payload
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        Partition {
            addrs,
            codes: vec![],
            vectors,
        }
    }
}

/// The vector column of one fragment's data file, decoded, for brute-force scoring.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ColumnVectors {
    pub dim: usize,
    /// `rows × dim` floats; a NULL row's slots are zero.
    pub values: Vec<f32>,
    /// Per row: whether the vector is non-NULL.
    pub valid: Vec<bool>,
}

impl ColumnVectors {
    fn bytes(&self) -> usize {
        self.values.len() * 4 + self.valid.len()
    }
}

/// What the byte budget holds.
#[derive(Debug, Clone)]
enum Entry {
    Partition(Arc<Partition>),
    Vectors(Arc<ColumnVectors>),
    Column(datafusion::arrow::array::ArrayRef),
}

impl Entry {
    fn bytes(&self) -> usize {
        match self {
            Entry::Partition(p) => p.bytes(),
            Entry::Vectors(v) => v.bytes(),
            Entry::Column(a) => a.get_array_memory_size(),
        }
    }
}

/// A byte-bounded cache of segment footers and partitions, shared by a session's queries.
/// Ledger states and ownership derivations kept per session; past these counts the maps start
/// over (each entry is small, and rebuilt on the next query that needs it).
const MAX_LEDGERS: usize = 64;
const MAX_OWNERSHIPS: usize = 256;

/// How to bring a segment's rows up to date: the ledger and the segment's ownership.
#[derive(Clone, Copy, Debug)]
pub struct Translation<'a> {
    pub view: &'a LedgerView,
    pub ownership: &'a SegmentOwnership,
}

#[derive(Debug)]
pub struct PartitionCache {
    budget: AtomicUsize,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    footers: HashMap<String, Arc<Footer>>,
    models: HashMap<String, Arc<IvfModel>>,
    /// Loaded reuse ledgers by (table, ledger state); small: one entry per transition.
    ledgers: HashMap<String, Arc<LedgerView>>,
    /// Segment ownerships by (table, index, ledger, fragments, segments): deriving a partial
    /// ownership reads row maps, so it is done once per table state.
    ownerships: HashMap<String, Arc<BTreeMap<u64, SegmentOwnership>>>,
    /// Partitions keyed by (segment file, partition); decoded vector columns by (data file, 0).
    entries: HashMap<(String, usize), Entry>,
    order: VecDeque<(String, usize)>,
    bytes: usize,
}

impl CacheState {
    /// Inserts an entry if it fits the budget, evicting the oldest entries first.
    fn admit(&mut self, key: (String, usize), entry: Entry, budget: usize) {
        let size = entry.bytes();
        if size > budget || self.entries.contains_key(&key) {
            return;
        }
        while self.bytes + size > budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(evicted) = self.entries.remove(&old) {
                self.bytes -= evicted.bytes();
            }
        }
        self.bytes += size;
        self.entries.insert(key.clone(), entry);
        self.order.push_back(key);
    }
}

impl PartitionCache {
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

    /// The decoded vectors of `column` in one data file (read with `load` on a miss).
    pub async fn vectors<F, Fut>(&self, key: &str, load: F) -> Result<Arc<ColumnVectors>>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<ColumnVectors>>,
    {
        let key = (key.to_string(), 0);
        if let Some(Entry::Vectors(hit)) = self.state.lock().expect("cache lock").entries.get(&key)
        {
            return Ok(hit.clone());
        }
        let vectors = Arc::new(load().await?);
        let budget = self.budget.load(AtomicOrdering::Relaxed);
        self.state
            .lock()
            .expect("cache lock")
            .admit(key, Entry::Vectors(vectors.clone()), budget);
        Ok(vectors)
    }

    /// Reads an index's model file (cached: models are small, shared and immutable).
    /// The loaded reuse ledger of a manifest (shared by every version with the same ledger).
    pub async fn ledger(&self, dir: &TableDir, manifest: &Manifest) -> Result<Arc<LedgerView>> {
        if manifest.reuse_ledger.is_empty() {
            return Ok(Arc::new(LedgerView::default()));
        }
        let key = format!("{}#{}", dir.name(), ledger_key(manifest));
        if let Some(v) = self.state.lock().expect("cache lock").ledgers.get(&key) {
            return Ok(v.clone());
        }
        let view = Arc::new(load_ledger(dir, manifest).await?);
        let mut state = self.state.lock().expect("cache lock");
        if state.ledgers.len() >= MAX_LEDGERS {
            state.ledgers.clear();
        }
        state.ledgers.insert(key, view.clone());
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
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in &manifest.fragments {
            f.id.hash(&mut h);
        }
        for s in manifest.segments_of(index) {
            (&s.file, &s.fragment_bitmap, &s.invalidated_fragments).hash(&mut h);
        }
        let key = format!("{}#{index}#{}#{:x}", dir.name(), view.key(), h.finish());
        if let Some(o) = self.state.lock().expect("cache lock").ownerships.get(&key) {
            return Ok(o.clone());
        }
        let owners = Arc::new(segment_ownerships(dir, manifest, view, index).await?);
        let mut state = self.state.lock().expect("cache lock");
        if state.ownerships.len() >= MAX_OWNERSHIPS {
            state.ownerships.clear();
        }
        state.ownerships.insert(key, owners.clone());
        Ok(owners)
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
        let invalidated: Vec<String> = segment
            .invalidated_fragments
            .iter()
            .map(|f| f.to_string())
            .collect();
        let key = (
            format!(
                "{}/{}#{}#{}",
                dir.name(),
                segment.file,
                view.key(),
                invalidated.join(",")
            ),
            p,
        );
        if let Some(Entry::Partition(hit)) =
            self.state.lock().expect("cache lock").entries.get(&key)
        {
            return Ok(hit.clone());
        }
        let raw = self.partition(dir, &segment.file, footer, p, pq).await?;
        let moved = view
            .translate(&raw.addrs)
            .await
            .map_err(|e| FormatError::ledger(dir.name(), e))?;
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
        let out = Arc::new(out);
        let budget = self.budget.load(AtomicOrdering::Relaxed);
        self.state
            .lock()
            .expect("cache lock")
            .admit(key, Entry::Partition(out.clone()), budget);
        Ok(out)
    }

    /// A whole decoded column of one data file (every physical row), within the byte budget:
    /// fetching a KNN answer's k rows then costs k lookups instead of decoding pages.
    pub async fn column<F, Fut>(
        &self,
        key: &str,
        load: F,
    ) -> Result<datafusion::arrow::array::ArrayRef>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<datafusion::arrow::array::ArrayRef>>,
    {
        let key = (key.to_string(), 0);
        if let Some(Entry::Column(hit)) = self.state.lock().expect("cache lock").entries.get(&key) {
            return Ok(hit.clone());
        }
        let column = load().await?;
        let budget = self.budget.load(AtomicOrdering::Relaxed);
        self.state
            .lock()
            .expect("cache lock")
            .admit(key, Entry::Column(column.clone()), budget);
        Ok(column)
    }

    /// The byte budget (for callers deciding what is worth caching).
    pub fn budget(&self) -> usize {
        self.budget.load(AtomicOrdering::Relaxed)
    }

    pub async fn model(&self, dir: &TableDir, def: &IndexDef) -> Result<Arc<IvfModel>> {
        let key = format!("{}/{}", dir.name(), def.model_file);
        if let Some(m) = self.state.lock().expect("cache lock").models.get(&key) {
            return Ok(m.clone());
        }
        let path = dir.path(&def.model_file);
        let bytes = dir.read(&def.model_file).await?;
        let model = Arc::new(IvfModel::decode(&bytes).map_err(|r| FormatError::corrupt(&path, r))?);
        if model.metric != def.metric || model.partitions() != def.num_partitions as usize {
            return Err(FormatError::corrupt(
                &path,
                "model does not match its index definition",
            ));
        }
        self.state
            .lock()
            .expect("cache lock")
            .models
            .insert(key, model.clone());
        Ok(model)
    }

    /// Reads a segment's footer and checks it against the index model and the manifest, so a
    /// foreign or mismatched file is refused before any partition is read.
    pub async fn segment_footer(
        &self,
        dir: &TableDir,
        segment: &IndexSegment,
        model: &IvfModel,
    ) -> Result<Arc<Footer>> {
        let footer = self.footer(dir, &segment.file, segment.size_bytes).await?;
        let width = model.pq.as_ref().map_or(model.dim * 4, |pq| pq.sub_vectors);
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
        Ok(footer)
    }

    /// Reads a segment's footer (cached: footers are tiny and files immutable).
    pub async fn footer(&self, dir: &TableDir, file: &str, size: u64) -> Result<Arc<Footer>> {
        let key = format!("{}/{file}", dir.name());
        if let Some(f) = self.state.lock().expect("cache lock").footers.get(&key) {
            return Ok(f.clone());
        }
        let path = dir.path(file);
        let corrupt = |reason: String| FormatError::corrupt(&path, reason);
        if size < 16 {
            return Err(corrupt("too small to be a segment file".into()));
        }
        let tail = dir
            .store()
            .get_range(&path, size - 16..size)
            .await
            .map_err(|e| FormatError::store(&path, e))?;
        if &tail[8..] != END_MAGIC {
            return Err(corrupt("not a fragvec segment file (bad end magic)".into()));
        }
        let footer_len = u64::from_le_bytes(tail[..8].try_into().expect("8"));
        if footer_len + 16 > size {
            return Err(corrupt("footer longer than the file".into()));
        }
        let bytes = dir
            .store()
            .get_range(&path, size - 16 - footer_len..size - 16)
            .await
            .map_err(|e| FormatError::store(&path, e))?;
        let footer = Arc::new(decode_footer(&bytes, size).map_err(corrupt)?);
        self.state
            .lock()
            .expect("cache lock")
            .footers
            .insert(key, footer.clone());
        Ok(footer)
    }

    /// Reads one partition through the cache.
    pub async fn partition(
        &self,
        dir: &TableDir,
        file: &str,
        footer: &Footer,
        p: usize,
        pq: bool,
    ) -> Result<Arc<Partition>> {
        let key = (format!("{}/{file}", dir.name()), p);
        if let Some(Entry::Partition(hit)) =
            self.state.lock().expect("cache lock").entries.get(&key)
        {
            return Ok(hit.clone());
        }
        let rows = footer.partitions[p].1 as usize;
        let partition = if rows == 0 {
            Arc::new(Partition::default())
        } else {
            let path = dir.path(file);
            let bytes: Bytes = dir
                .store()
                .get_range(&path, footer.range(p))
                .await
                .map_err(|e| FormatError::store(&path, e))?;
            Arc::new(decode_partition(&bytes, rows, footer.row_width, pq))
        };
        let budget = self.budget.load(AtomicOrdering::Relaxed);
        self.state.lock().expect("cache lock").admit(
            key,
            Entry::Partition(partition.clone()),
            budget,
        );
        Ok(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<Partition> {
        vec![
            Partition {
                addrs: vec![1, 2],
                codes: vec![],
                vectors: vec![1.0, 2.0, 3.0, 4.0],
            },
            Partition::default(),
            Partition {
                addrs: vec![9],
                codes: vec![],
                vectors: vec![5.0, 6.0],
            },
        ]
    }

    fn split(bytes: &[u8]) -> (&[u8], u64) {
        let n = bytes.len();
        let footer_len = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
        (&bytes[n - 16 - footer_len..n - 16], n as u64)
    }

    #[test]
    fn partitions_round_trip() {
        let bytes = encode(&parts(), 8);
        let (footer, size) = split(&bytes);
        let footer = decode_footer(footer, size).unwrap();
        assert_eq!(footer.rows(), 3);
        for (p, expected) in parts().iter().enumerate() {
            let r = footer.range(p);
            let got = decode_partition(
                &bytes[r.start as usize..r.end as usize],
                expected.len(),
                8,
                false,
            );
            assert_eq!(&got, expected);
        }
    }

    #[test]
    fn damaged_footers_are_refused() {
        let bytes = encode(&parts(), 8);
        let (footer, size) = split(&bytes);
        assert!(decode_footer(footer, size + 1).is_err());
        let mut bad = footer.to_vec();
        bad[16] = 7; // first partition offset
        assert!(decode_footer(&bad, size).is_err());
        assert!(decode_footer(&footer[..footer.len() - 1], size).is_err());
        let mut bad = footer.to_vec();
        bad[0] = b'x';
        assert!(decode_footer(&bad, size).is_err());
    }
}

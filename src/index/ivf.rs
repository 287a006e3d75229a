//! The IVF model shared by every segment of one index: the partition centroids (and, for
//! IVF_PQ, the product-quantization codebooks), and its file encoding.
//!
//! File layout (little-endian): magic `FVIVF002`, then `u32` metric, dim, partitions, PQ
//! sub-vectors (0 for IVF_FLAT), the centroids (`partitions × dim` f32), then for IVF_PQ the
//! codebooks (`sub_vectors × 256 × dim/sub_vectors` f32), then the `u32` CRC32C of every byte
//! before it. A file of the wrong size, magic, shape or checksum is refused when opened: a
//! flipped bit in a centroid would otherwise silently send queries to the wrong partitions
//! and new rows into the wrong ones. Format 1 (`FVIVF001`, the same without the checksum) is
//! still read, unverified.
//!
//! Format 3 (`FVIVF003`, written only for IVF_SQ models, so other models stay readable by
//! older builds): the same header plus a fifth `u32` (1: a scalar grid follows), and after
//! the centroids (and codebooks) the grid's `lo` then `hi` (`partitions × dim` f32 each).

use super::distance::{Metric, l2_squared, metric_key};
use super::kmeans;
use super::sq::{self, ScalarGrid};
use crate::format::integrity::crc32c;

const MAGIC: &[u8; 8] = b"FVIVF002";
/// Format 1, written before checksums: read unverified.
const MAGIC_V1: &[u8; 8] = b"FVIVF001";
/// Format 3: format 2 plus a scalar grid (IVF_SQ).
const MAGIC_V3: &[u8; 8] = b"FVIVF003";
/// Magic and the four header words.
const HEADER: usize = 24;
/// Codewords per PQ sub-quantizer (one byte per code).
pub const PQ_CODES: usize = 256;

/// A trained IVF model: centroids, and the quantizer of its index type.
#[derive(Clone, Debug, PartialEq)]
pub struct IvfModel {
    /// The distance it was trained for.
    pub metric: Metric,
    /// Vector dimensions.
    pub dim: usize,
    /// `partitions × dim`, row-major.
    pub centroids: Vec<f32>,
    /// IVF_PQ: the product quantizer.
    pub pq: Option<ProductQuantizer>,
    /// IVF_SQ: each partition's code grid ([`super::sq`]).
    pub sq: Option<ScalarGrid>,
}

/// A product quantizer: `sub_vectors` codebooks of [`PQ_CODES`] codewords.
#[derive(Clone, Debug, PartialEq)]
pub struct ProductQuantizer {
    /// Sub-vectors per vector (each coded in one byte).
    pub sub_vectors: usize,
    /// `sub_vectors × PQ_CODES × sub_dim`.
    pub codebooks: Vec<f32>,
}

impl ProductQuantizer {
    /// Dimensions of one sub-vector of a `dim`-dimensional vector.
    pub fn sub_dim(&self, dim: usize) -> usize {
        dim / self.sub_vectors
    }

    /// Trains codebooks on residual-free vectors (`n × dim`), calling `on_codebook` after each
    /// of the `sub_vectors` codebooks.
    pub fn train(
        data: &[f32],
        dim: usize,
        sub_vectors: usize,
        seed: u64,
        on_codebook: &dyn Fn(),
    ) -> Self {
        let sub_dim = dim / sub_vectors;
        let n = data.len() / dim;
        let mut codebooks = Vec::with_capacity(sub_vectors * PQ_CODES * sub_dim);
        for m in 0..sub_vectors {
            let mut part = Vec::with_capacity(n * sub_dim);
            for row in data.chunks_exact(dim) {
                part.extend_from_slice(&row[m * sub_dim..(m + 1) * sub_dim]);
            }
            let mut book = kmeans::train(&part, sub_dim, PQ_CODES, 15, seed.wrapping_add(m as u64));
            // Fewer training rows than codes: pad with copies so every code decodes.
            while book.len() < PQ_CODES * sub_dim {
                let fill = book[..sub_dim.min(book.len())].to_vec();
                if fill.is_empty() {
                    book.resize(PQ_CODES * sub_dim, 0.0);
                } else {
                    book.extend_from_slice(&fill);
                }
            }
            codebooks.extend_from_slice(&book[..PQ_CODES * sub_dim]);
            on_codebook();
        }
        Self {
            sub_vectors,
            codebooks,
        }
    }

    /// Appends the codes of `v` to `out`.
    #[inline]
    pub fn encode(&self, v: &[f32], out: &mut Vec<u8>) {
        let sub_dim = v.len() / self.sub_vectors;
        for m in 0..self.sub_vectors {
            let book = &self.codebooks[m * PQ_CODES * sub_dim..(m + 1) * PQ_CODES * sub_dim];
            let (code, _) = kmeans::nearest(book, sub_dim, &v[m * sub_dim..(m + 1) * sub_dim]);
            out.push(code as u8);
        }
    }

    /// Asymmetric distance table for query `q`: `sub_vectors × PQ_CODES` partial keys, so the
    /// key of a code row is the sum of one entry per sub-vector. L2 uses squared distances,
    /// dot and cosine the negative inner product (cosine queries are normalized first).
    pub fn distance_table(&self, q: &[f32], metric: Metric) -> Vec<f32> {
        let sub_dim = q.len() / self.sub_vectors;
        let mut table = Vec::with_capacity(self.sub_vectors * PQ_CODES);
        for m in 0..self.sub_vectors {
            let qs = &q[m * sub_dim..(m + 1) * sub_dim];
            let book = &self.codebooks[m * PQ_CODES * sub_dim..(m + 1) * PQ_CODES * sub_dim];
            for c in book.chunks_exact(sub_dim) {
                table.push(match metric {
                    Metric::L2 => l2_squared(qs, c),
                    Metric::Dot | Metric::Cosine => -super::distance::dot(qs, c),
                });
            }
        }
        table
    }
}

impl IvfModel {
    /// How many partitions.
    pub fn partitions(&self) -> usize {
        self.centroids.len() / self.dim.max(1)
    }

    /// Payload bytes per row in this model's segments: floats (IVF_FLAT), PQ codes, or
    /// scalar codes with their bound terms (IVF_SQ).
    pub fn row_width(&self) -> usize {
        match (&self.pq, &self.sq) {
            (Some(pq), _) => pq.sub_vectors,
            (None, Some(_)) => sq::row_width(self.dim),
            (None, None) => self.dim * 4,
        }
    }

    /// Whether segments hold coded bytes rather than floats (IVF_PQ, IVF_SQ).
    pub fn coded(&self) -> bool {
        self.pq.is_some() || self.sq.is_some()
    }

    /// The vector used for partitioning and PQ: cosine indexes work on unit vectors.
    pub fn prepare(&self, v: &[f32]) -> Option<Vec<f32>> {
        match self.metric {
            Metric::Cosine => {
                let norm = super::distance::norm_squared(v).sqrt();
                (norm > 0.0).then(|| v.iter().map(|x| x / norm).collect())
            }
            _ => Some(v.to_vec()),
        }
    }

    /// The partition a (prepared) vector belongs to: the same choice as a build makes (see
    /// [`super::nearest`]); many vectors at once go through [`super::nearest::CentroidTable`].
    pub fn partition_of(&self, v: &[f32]) -> usize {
        let mut out = [(0u32, 0f32)];
        super::nearest::CentroidTable::new(&self.centroids, self.dim).assign(v, &mut out);
        out[0].0 as usize
    }

    /// Partitions in the order a query should probe them (nearest centroid first), its first
    /// `n` ordered at once and the others only if asked ([`ProbeOrder::rest`]): a query probes
    /// a few of hundreds of partitions, and sorting them all cost more than choosing the few.
    pub fn probe_order_from(&self, q: &[f32], n: usize) -> ProbeOrder {
        let keyed: Vec<(f32, usize)> = self
            .centroids
            .chunks_exact(self.dim)
            .enumerate()
            .map(|(i, c)| {
                let key = match self.metric {
                    Metric::L2 | Metric::Cosine => l2_squared(q, c),
                    Metric::Dot => metric_key(Metric::Dot, q, c).unwrap_or(f32::INFINITY),
                };
                (key, i)
            })
            .collect();
        ProbeOrder::new(keyed, n)
    }

    /// The model file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.centroids.len() * 4);
        out.extend_from_slice(if self.sq.is_some() { MAGIC_V3 } else { MAGIC });
        let metric = match self.metric {
            Metric::L2 => 0u32,
            Metric::Cosine => 1,
            Metric::Dot => 2,
        };
        for v in [
            metric,
            self.dim as u32,
            self.partitions() as u32,
            self.pq.as_ref().map_or(0, |p| p.sub_vectors as u32),
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if self.sq.is_some() {
            out.extend_from_slice(&1u32.to_le_bytes());
        }
        for x in &self.centroids {
            out.extend_from_slice(&x.to_le_bytes());
        }
        if let Some(pq) = &self.pq {
            for x in &pq.codebooks {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        if let Some(grid) = &self.sq {
            for x in grid.lo.iter().chain(&grid.hi) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        let sum = crc32c(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// A model from its file's bytes; an error for a damaged or foreign file.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (checked, header) = match bytes.get(..8) {
            Some(m) if m == MAGIC => (true, HEADER),
            Some(m) if m == MAGIC_V3 => (true, HEADER + 4),
            Some(m) if m == MAGIC_V1 => (false, HEADER),
            _ => return Err("not a fragvec IVF model file".into()),
        };
        let bytes = if checked {
            if bytes.len() < header + 4 {
                return Err(format!(
                    "model file has {} bytes, too few for a header",
                    bytes.len()
                ));
            }
            let (body, tail) = bytes.split_at(bytes.len() - 4);
            let recorded = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
            let found = crc32c(body);
            if found != recorded {
                return Err(format!(
                    "model file: CRC32C is {found:#010x}, {recorded:#010x} was recorded"
                ));
            }
            body
        } else {
            bytes
        };
        if bytes.len() < header {
            return Err("not a fragvec IVF model file".into());
        }
        let word = |i: usize| {
            u32::from_le_bytes(bytes[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes")) as usize
        };
        let metric = match word(0) {
            0 => Metric::L2,
            1 => Metric::Cosine,
            2 => Metric::Dot,
            m => return Err(format!("unknown metric tag {m}")),
        };
        let (dim, partitions, sub_vectors) = (word(1), word(2), word(3));
        let grid = header > HEADER;
        if grid && word(4) != 1 {
            return Err(format!("unknown model extension {}", word(4)));
        }
        if dim == 0 || partitions == 0 || (sub_vectors > 0 && dim % sub_vectors != 0) {
            return Err(format!(
                "bad model shape: dim {dim}, partitions {partitions}, sub-vectors {sub_vectors}"
            ));
        }
        // The header's counts are untrusted: size arithmetic must not overflow.
        let implied = partitions
            .checked_mul(dim)
            .and_then(|c| c.checked_add(if sub_vectors > 0 { PQ_CODES * dim } else { 0 }))
            .and_then(|c| c.checked_add(if grid { 2 * partitions * dim } else { 0 }))
            .and_then(|floats| floats.checked_mul(4))
            .and_then(|b| b.checked_add(header));
        if implied != Some(bytes.len()) {
            return Err(format!(
                "model file has {} bytes, its header (dim {dim}, partitions {partitions}, \
                 sub-vectors {sub_vectors}) implies {}",
                bytes.len(),
                implied.map_or("more than fit in memory".to_string(), |n| n.to_string())
            ));
        }
        let values: Vec<f32> = bytes[header..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let (centroids, rest) = values.split_at(partitions * dim);
        let (books, grid_values) = rest.split_at(if sub_vectors > 0 { PQ_CODES * dim } else { 0 });
        let pq = (sub_vectors > 0).then(|| ProductQuantizer {
            sub_vectors,
            codebooks: books.to_vec(),
        });
        let sq = if grid {
            let (lo, hi) = grid_values.split_at(partitions * dim);
            let grid = ScalarGrid {
                dim,
                lo: lo.to_vec(),
                hi: hi.to_vec(),
            };
            grid.check()?;
            Some(grid)
        } else {
            None
        };
        Ok(Self {
            metric,
            dim,
            centroids: centroids.to_vec(),
            pq,
            sq,
        })
    }
}

/// Partitions by the distance of their centroid to a query: the first `n` ordered, the rest
/// ordered when first asked for. Ties are broken by partition number, so the order is the
/// one a full stable sort by distance gives.
#[derive(Debug)]
pub struct ProbeOrder {
    /// Per partition, the query's key to its centroid (squared distance for L2 and cosine).
    keys: Vec<f32>,
    first: Vec<usize>,
    rest_keyed: Vec<(f32, usize)>,
    rest: std::sync::OnceLock<Vec<usize>>,
}

fn by_key(a: &(f32, usize), b: &(f32, usize)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

impl ProbeOrder {
    fn new(mut keyed: Vec<(f32, usize)>, n: usize) -> Self {
        let mut keys = vec![f32::NAN; keyed.len()];
        for &(key, i) in &keyed {
            if let Some(slot) = keys.get_mut(i) {
                *slot = key;
            }
        }
        let n = n.min(keyed.len());
        if n < keyed.len() && n > 0 {
            keyed.select_nth_unstable_by(n - 1, by_key);
        }
        let rest_keyed = keyed.split_off(n);
        keyed.sort_unstable_by(by_key);
        Self {
            keys,
            first: keyed.into_iter().map(|(_, i)| i).collect(),
            rest_keyed,
            rest: std::sync::OnceLock::new(),
        }
    }

    /// Per partition, the query's key to its centroid: the squared distance of the prepared
    /// query for L2 and cosine, the negated inner product for dot.
    pub fn centroid_keys(&self) -> &[f32] {
        &self.keys
    }

    /// The nearest partitions, nearest first (as many as asked, or all there are).
    pub fn first(&self) -> &[usize] {
        &self.first
    }

    /// The partitions after [`Self::first`], nearest first.
    pub fn rest(&self) -> &[usize] {
        self.rest.get_or_init(|| {
            let mut keyed = self.rest_keyed.clone();
            keyed.sort_unstable_by(by_key);
            keyed.into_iter().map(|(_, i)| i).collect()
        })
    }

    /// Whether [`Self::first`] holds every partition.
    pub fn is_exhaustive(&self) -> bool {
        self.rest_keyed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fuzz::{arbitrary_with_magic, mutated};
    use proptest::prelude::*;

    /// A model of kind 0 (IVF_FLAT), 1 (IVF_PQ) or 2 (IVF_SQ).
    fn model(kind: u8) -> IvfModel {
        let centroids: Vec<f32> = (0..3 * 4).map(|i| i as f32).collect();
        let pq = (kind == 1).then(|| ProductQuantizer {
            sub_vectors: 2,
            codebooks: (0..2 * PQ_CODES * 2).map(|i| i as f32).collect(),
        });
        let sq = (kind == 2).then(|| ScalarGrid {
            dim: 4,
            lo: (0..3 * 4).map(|i| i as f32 - 1.0).collect(),
            hi: (0..3 * 4).map(|i| i as f32 + 1.0).collect(),
        });
        IvfModel {
            metric: Metric::Cosine,
            dim: 4,
            centroids,
            pq,
            sq,
        }
    }

    #[test]
    fn model_files_round_trip_and_reject_damage() {
        for kind in [0, 1, 2] {
            let m = model(kind);
            let bytes = m.encode();
            assert_eq!(IvfModel::decode(&bytes).unwrap(), m);
            assert!(IvfModel::decode(&bytes[..bytes.len() - 1]).is_err());
            let mut bad = bytes.clone();
            bad[0] = b'X';
            assert!(IvfModel::decode(&bad).is_err());
            let mut bad = bytes.clone();
            bad[8] = 9; // metric tag
            assert!(IvfModel::decode(&bad).unwrap_err().contains("CRC32C"));
            // With a valid checksum the tag itself is refused.
            let n = bad.len() - 4;
            let sum = crc32c(&bad[..n]);
            bad[n..].copy_from_slice(&sum.to_le_bytes());
            assert!(IvfModel::decode(&bad).unwrap_err().contains("metric"));
        }
    }

    #[test]
    fn huge_header_counts_are_refused_not_overflowed() {
        // dim = partitions = u32::MAX: `partitions × dim × 4` overflows usize.
        for magic in [MAGIC, MAGIC_V1] {
            let mut bytes = magic.to_vec();
            for w in [0u32, u32::MAX, u32::MAX, 0] {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
            if magic == MAGIC {
                let sum = crc32c(&bytes);
                bytes.extend_from_slice(&sum.to_le_bytes());
            }
            let e = IvfModel::decode(&bytes).unwrap_err();
            assert!(e.contains("more than fit in memory"), "{e}");
        }
    }

    /// Every single flipped bit of a model file is refused: a damaged centroid would route
    /// queries and new rows to the wrong partitions without any other sign.
    #[test]
    fn every_flipped_bit_is_refused() {
        for kind in [0, 1, 2] {
            let bytes = model(kind).encode();
            for at in 0..bytes.len() {
                for bit in [0, 3, 7] {
                    let mut bad = bytes.clone();
                    bad[at] ^= 1 << bit;
                    assert!(IvfModel::decode(&bad).is_err(), "flip at {at} bit {bit}");
                }
            }
            let e = IvfModel::decode(&{
                let mut bad = bytes.clone();
                bad[30] ^= 1;
                bad
            })
            .unwrap_err();
            assert!(e.contains("CRC32C"), "{e}");
        }
    }

    /// Files written before checksums (format 1) still read.
    #[test]
    fn format_1_files_are_read_unverified() {
        for kind in [0, 1] {
            let m = model(kind);
            let v2 = m.encode();
            let mut v1 = MAGIC_V1.to_vec();
            v1.extend_from_slice(&v2[8..v2.len() - 4]);
            assert_eq!(IvfModel::decode(&v1).unwrap(), m);
        }
    }

    /// A decoded model re-encodes to exactly its bytes (format 1: the same bytes behind the
    /// new magic, plus the checksum), and its shape is consistent.
    fn check_decoded(bytes: &[u8]) {
        if let Ok(m) = IvfModel::decode(bytes) {
            let encoded = m.encode();
            if bytes[..8] == MAGIC_V1[..] {
                assert_eq!(&encoded[8..encoded.len() - 4], &bytes[8..]);
            } else {
                assert_eq!(encoded, bytes);
            }
            assert_eq!(m.centroids.len(), m.partitions() * m.dim);
            if let Some(pq) = &m.pq {
                assert_eq!(
                    pq.codebooks.len(),
                    PQ_CODES * pq.sub_dim(m.dim) * pq.sub_vectors
                );
            }
        }
    }

    fn small_header() -> impl Strategy<Value = Vec<u8>> {
        // A header with small counts followed by some floats, so sizes sometimes match.
        // With the current magic the checksum is appended, so the body is what is tested.
        (
            any::<bool>(),
            (0u32..4, 1u32..5, 1u32..4, 0u32..3, 0usize..2200),
        )
            .prop_map(|(v1, (m, d, p, s, n))| {
                let mut b = if v1 {
                    MAGIC_V1.to_vec()
                } else {
                    MAGIC.to_vec()
                };
                for w in [m, d, p, s] {
                    b.extend_from_slice(&w.to_le_bytes());
                }
                b.extend((0..n * 4).map(|i| i as u8));
                if !v1 {
                    let sum = crc32c(&b);
                    b.extend_from_slice(&sum.to_le_bytes());
                }
                b
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_ivf_model_decode_never_panics_on_arbitrary_bytes(
            bytes in prop_oneof![
                arbitrary_with_magic(MAGIC),
                arbitrary_with_magic(MAGIC_V1),
                small_header()
            ],
        ) {
            check_decoded(&bytes);
        }

        #[test]
        fn prop_probe_order_from_is_a_stable_sort_by_distance(
            // Few distinct centroids, so that ties are common.
            centroids in proptest::collection::vec(0u8..6, 1..60),
            q in 0u8..6,
            n in 0usize..70,
        ) {
            let m = IvfModel {
                metric: Metric::L2,
                dim: 1,
                centroids: centroids.iter().map(|c| *c as f32).collect(),
                pq: None,
                sq: None,
            };
            let q = [q as f32];
            let mut naive: Vec<usize> = (0..centroids.len()).collect();
            naive.sort_by(|a, b| l2_squared(&q, &m.centroids[*a..*a + 1])
                .total_cmp(&l2_squared(&q, &m.centroids[*b..*b + 1])));
            let order = m.probe_order_from(&q, n);
            let split = n.min(naive.len());
            prop_assert_eq!(order.first(), &naive[..split]);
            prop_assert_eq!(order.is_exhaustive(), split == naive.len());
            prop_assert_eq!(order.rest(), &naive[split..]);
            let all = m.probe_order_from(&q, naive.len());
            prop_assert_eq!(all.first(), &naive[..]);
        }

        #[test]
        fn prop_ivf_model_decode_never_panics_on_mutated_valid_input(
            bytes in (0u8..3).prop_flat_map(|kind| mutated(model(kind).encode())),
        ) {
            check_decoded(&bytes);
        }
    }

    #[test]
    fn probe_order_starts_at_the_nearest_centroid() {
        let m = IvfModel {
            metric: Metric::L2,
            dim: 1,
            centroids: vec![0.0, 10.0, 5.0],
            pq: None,
            sq: None,
        };
        assert_eq!(m.probe_order_from(&[6.0], 3).first(), &[2, 1, 0]);
        assert_eq!(m.partition_of(&[9.0]), 1);
    }

    #[test]
    fn pq_codes_decode_to_their_nearest_codeword() {
        let mut data = Vec::new();
        for i in 0..600 {
            data.extend_from_slice(&[(i % 7) as f32, (i % 5) as f32, (i % 3) as f32, 1.0]);
        }
        let pq = ProductQuantizer::train(&data, 4, 2, 1, &|| {});
        let mut codes = Vec::new();
        pq.encode(&[3.0, 2.0, 1.0, 1.0], &mut codes);
        let table = pq.distance_table(&[3.0, 2.0, 1.0, 1.0], Metric::L2);
        let key: f32 = codes
            .iter()
            .enumerate()
            .map(|(m, c)| table[m * PQ_CODES + *c as usize])
            .sum();
        assert!(
            key < 1e-3,
            "a training vector encodes almost exactly: {key}"
        );
    }
}

/// A partition holding more than this multiple of the mean partition size is split.
pub const SPLIT_FACTOR: f64 = 4.0;
/// ... unless it holds fewer rows than this (small indexes are left alone).
pub const SPLIT_MIN_ROWS: usize = 1024;

/// Whether a partition of `rows` rows has outgrown its share of `total` rows over `partitions`.
pub fn is_oversized(rows: usize, total: usize, partitions: usize) -> bool {
    let mean = total as f64 / partitions.max(1) as f64;
    rows >= SPLIT_MIN_ROWS && rows as f64 > SPLIT_FACTOR * mean
}

/// Splits every oversized partition of a flat index in two with 2-means: the partition keeps
/// one centroid, a new partition (appended) gets the other, and the partition's rows move to
/// the nearer of the two. Returns the partitions that were split. Only valid when `parts`
/// holds every row of the index (all segments are being rewritten), since all segments share
/// the centroids.
pub fn split_oversized(
    model: &mut IvfModel,
    parts: &mut Vec<super::segment::Partition>,
    seed: u64,
) -> Vec<usize> {
    assert!(model.pq.is_none(), "PQ partitions hold codes, not vectors");
    let dim = model.dim;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let count = parts.len();
    let mut split = Vec::new();
    for p in 0..count {
        if !is_oversized(parts[p].len(), total, count) {
            continue;
        }
        let prepared: Vec<Option<Vec<f32>>> = parts[p]
            .vectors
            .chunks_exact(dim)
            .map(|v| model.prepare(v))
            .collect();
        let training: Vec<f32> = prepared.iter().flatten().flatten().copied().collect();
        let two = kmeans::train(&training, dim, 2, 10, seed.wrapping_add(p as u64));
        if two.len() < 2 * dim || two[..dim] == two[dim..] {
            continue; // all rows identical: nothing to split
        }
        let old = std::mem::take(&mut parts[p]);
        let mut keep = super::segment::Partition::default();
        let mut moved = super::segment::Partition::default();
        for ((addr, v), prep) in old
            .addrs
            .iter()
            .zip(old.vectors.chunks_exact(dim))
            .zip(&prepared)
        {
            let side = prep
                .as_deref()
                .map_or(0, |x| kmeans::nearest(&two, dim, x).0);
            let target = if side == 0 { &mut keep } else { &mut moved };
            target.addrs.push(*addr);
            target.vectors.extend_from_slice(v);
        }
        model.centroids[p * dim..(p + 1) * dim].copy_from_slice(&two[..dim]);
        model.centroids.extend_from_slice(&two[dim..]);
        parts[p] = keep;
        parts.push(moved);
        split.push(p);
    }
    split
}

#[cfg(test)]
mod split_tests {
    use super::*;
    use crate::index::segment::Partition;

    #[test]
    fn an_oversized_partition_splits_and_keeps_every_row() {
        let centroids: Vec<f32> = (0..8).map(|c| c as f32 * 100.0).collect();
        let mut model = IvfModel {
            metric: Metric::L2,
            dim: 1,
            centroids,
            pq: None,
            sq: None,
        };
        // Partition 0 holds two far-apart clumps, 2000 rows; the seven others 10 rows each.
        let mut big = Partition::default();
        for i in 0..2000u64 {
            big.addrs.push(i);
            big.vectors.push(if i % 2 == 0 { -10.0 } else { 10.0 });
        }
        let mut parts = vec![big];
        for c in 1..8u64 {
            parts.push(Partition {
                quantized: Default::default(),
                addrs: (c * 100..c * 100 + 10).collect(),
                codes: vec![],
                vectors: vec![c as f32 * 100.0; 10],
            });
        }
        assert_eq!(split_oversized(&mut model, &mut parts, 1), vec![0]);
        assert_eq!(model.partitions(), 9);
        assert_eq!(parts.len(), 9);
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), 2070);
        assert_eq!((parts[0].len(), parts[8].len()), (1000, 1000));
        // Rows sit in the partition whose centroid is nearest.
        for (p, part) in parts.iter().enumerate() {
            for v in &part.vectors {
                assert_eq!(model.partition_of(&[*v]), p);
            }
        }
        // Balanced now: nothing more to split.
        assert!(split_oversized(&mut model, &mut parts, 1).is_empty());
    }
}

//! The IVF model shared by every segment of one index: the partition centroids (and, for
//! IVF_PQ, the product-quantization codebooks), and its file encoding.
//!
//! File layout (little-endian): magic `FVIVF001`, then `u32` metric, dim, partitions, PQ
//! sub-vectors (0 for IVF_FLAT), the centroids (`partitions × dim` f32), then for IVF_PQ the
//! codebooks (`sub_vectors × 256 × dim/sub_vectors` f32). A file of the wrong size, magic or
//! shape is refused when opened.

use super::distance::{Metric, l2_squared, metric_key};
use super::kmeans;

const MAGIC: &[u8; 8] = b"FVIVF001";
/// Codewords per PQ sub-quantizer (one byte per code).
pub const PQ_CODES: usize = 256;

#[derive(Clone, Debug, PartialEq)]
pub struct IvfModel {
    pub metric: Metric,
    pub dim: usize,
    /// `partitions × dim`, row-major.
    pub centroids: Vec<f32>,
    pub pq: Option<ProductQuantizer>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProductQuantizer {
    pub sub_vectors: usize,
    /// `sub_vectors × PQ_CODES × sub_dim`.
    pub codebooks: Vec<f32>,
}

impl ProductQuantizer {
    pub fn sub_dim(&self, dim: usize) -> usize {
        dim / self.sub_vectors
    }

    /// Trains codebooks on residual-free vectors (`n × dim`).
    pub fn train(data: &[f32], dim: usize, sub_vectors: usize, seed: u64) -> Self {
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
        }
        Self {
            sub_vectors,
            codebooks,
        }
    }

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
    pub fn partitions(&self) -> usize {
        self.centroids.len() / self.dim.max(1)
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

    /// The partition a (prepared) vector belongs to.
    pub fn partition_of(&self, v: &[f32]) -> usize {
        kmeans::nearest(&self.centroids, self.dim, v).0
    }

    /// Partitions in the order a query should probe them (nearest centroid first).
    pub fn probe_order(&self, q: &[f32]) -> Vec<usize> {
        let mut keyed: Vec<(f32, usize)> = self
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
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
        keyed.into_iter().map(|(_, i)| i).collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.centroids.len() * 4);
        out.extend_from_slice(MAGIC);
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
        for x in &self.centroids {
            out.extend_from_slice(&x.to_le_bytes());
        }
        if let Some(pq) = &self.pq {
            for x in &pq.codebooks {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 24 || &bytes[..8] != MAGIC {
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
        if dim == 0 || partitions == 0 || (sub_vectors > 0 && dim % sub_vectors != 0) {
            return Err(format!(
                "bad model shape: dim {dim}, partitions {partitions}, sub-vectors {sub_vectors}"
            ));
        }
        let floats = partitions * dim + if sub_vectors > 0 { PQ_CODES * dim } else { 0 };
        if bytes.len() != 24 + floats * 4 {
            return Err(format!(
                "model file has {} bytes, its header implies {}",
                bytes.len(),
                24 + floats * 4
            ));
        }
        let values: Vec<f32> = bytes[24..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let (centroids, books) = values.split_at(partitions * dim);
        let pq = (sub_vectors > 0).then(|| ProductQuantizer {
            sub_vectors,
            codebooks: books.to_vec(),
        });
        Ok(Self {
            metric,
            dim,
            centroids: centroids.to_vec(),
            pq,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(pq: bool) -> IvfModel {
        let centroids: Vec<f32> = (0..3 * 4).map(|i| i as f32).collect();
        let pq = pq.then(|| ProductQuantizer {
            sub_vectors: 2,
            codebooks: (0..2 * PQ_CODES * 2).map(|i| i as f32).collect(),
        });
        IvfModel {
            metric: Metric::Cosine,
            dim: 4,
            centroids,
            pq,
        }
    }

    #[test]
    fn model_files_round_trip_and_reject_damage() {
        for pq in [false, true] {
            let m = model(pq);
            let bytes = m.encode();
            assert_eq!(IvfModel::decode(&bytes).unwrap(), m);
            assert!(IvfModel::decode(&bytes[..bytes.len() - 1]).is_err());
            let mut bad = bytes.clone();
            bad[0] = b'X';
            assert!(IvfModel::decode(&bad).is_err());
            let mut bad = bytes.clone();
            bad[8] = 9; // metric tag
            assert!(IvfModel::decode(&bad).unwrap_err().contains("metric"));
        }
    }

    #[test]
    fn probe_order_starts_at_the_nearest_centroid() {
        let m = IvfModel {
            metric: Metric::L2,
            dim: 1,
            centroids: vec![0.0, 10.0, 5.0],
            pq: None,
        };
        assert_eq!(m.probe_order(&[6.0]), vec![2, 1, 0]);
        assert_eq!(m.partition_of(&[9.0]), 1);
    }

    #[test]
    fn pq_codes_decode_to_their_nearest_codeword() {
        let mut data = Vec::new();
        for i in 0..600 {
            data.extend_from_slice(&[(i % 7) as f32, (i % 5) as f32, (i % 3) as f32, 1.0]);
        }
        let pq = ProductQuantizer::train(&data, 4, 2, 1);
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

//! Data shared by the vector benchmarks: clustered vectors, queries near them, and a
//! DataFusion table holding them.

use std::sync::Arc;

use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use rand::Rng;

/// A standard normal sample (Box-Muller).
pub fn gaussian(rng: &mut impl Rng) -> f32 {
    let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-9), rng.random());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f32::consts::PI * v).cos()
}

/// `rows` vectors of `dim` dimensions around `blobs` random centres (row-major), and
/// `queries` query vectors near random rows.
pub fn clustered(
    rng: &mut impl Rng,
    rows: usize,
    dim: usize,
    blobs: usize,
    queries: usize,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let centers: Vec<f32> = (0..blobs * dim)
        .map(|_| rng.random::<f32>() * 10.0)
        .collect();
    let mut data = Vec::with_capacity(rows * dim);
    for _ in 0..rows {
        let b = rng.random_range(0..blobs);
        for d in 0..dim {
            data.push(centers[b * dim + d] + gaussian(rng));
        }
    }
    let queries = (0..queries)
        .map(|_| {
            let i = rng.random_range(0..rows);
            data[i * dim..(i + 1) * dim]
                .iter()
                .map(|x| x + 0.5 * gaussian(rng))
                .collect()
        })
        .collect();
    (data, queries)
}

/// `(id BIGINT, emb VECTOR(dim))` over `data` (ids 0..), in batches of `batch_rows`.
pub fn vector_table(data: &[f32], dim: usize, batch_rows: usize) -> Result<(MemTable, usize)> {
    let rows = data.len() / dim;
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "emb",
            DataType::FixedSizeList(item.clone(), dim as i32),
            true,
        ),
    ]));
    let mut batches = Vec::new();
    for start in (0..rows).step_by(batch_rows) {
        let n = batch_rows.min(rows - start);
        let ids = Int64Array::from_iter_values(start as i64..(start + n) as i64);
        let values = Float32Array::from(data[start * dim..(start + n) * dim].to_vec());
        let emb = FixedSizeListArray::new(item.clone(), dim as i32, Arc::new(values), None);
        batches.push(RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(ids), Arc::new(emb)],
        )?);
    }
    let count = batches.len();
    Ok((MemTable::try_new(schema, vec![batches])?, count))
}

/// A vector as a SQL array literal.
pub fn literal(q: &[f32]) -> String {
    let parts: Vec<String> = q.iter().map(|x| format!("{x:.6}")).collect();
    format!("[{}]", parts.join(", "))
}

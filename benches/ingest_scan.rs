//! Ingest and full-scan throughput of fragvec tables next to DataFusion's own Parquet path,
//! on the same in-memory data, in the same run.
//!
//! `cargo bench --bench ingest_scan` (release). Rows: 1M × (id BIGINT, emb VECTOR(128)) by
//! default; set `FRAGVEC_BENCH_ROWS` to change. Prints rows/s per path and the ratios.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use rand::{Rng, SeedableRng};

const DIM: i32 = 128;
const BATCH: usize = 8192;
const RUNS: usize = 3;

fn data(rows: usize, partitions: usize) -> (Arc<Schema>, Vec<Vec<RecordBatch>>) {
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("emb", DataType::FixedSizeList(item.clone(), DIM), true),
    ]));
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut parts = vec![Vec::new(); partitions];
    let mut start = 0usize;
    let mut p = 0;
    while start < rows {
        let n = BATCH.min(rows - start);
        let ids = Int64Array::from_iter_values(start as i64..(start + n) as i64);
        let values: Float32Array = (0..n * DIM as usize).map(|_| rng.random::<f32>()).collect();
        let emb = FixedSizeListArray::new(item.clone(), DIM, Arc::new(values), None);
        parts[p % partitions].push(
            RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(emb)]).unwrap(),
        );
        start += n;
        p += 1;
    }
    (schema, parts)
}

async fn best_of<F, Fut>(mut f: F) -> Result<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut best = Duration::MAX;
    for run in 0..RUNS {
        let t = Instant::now();
        f(run).await?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

async fn drain(ctx: &SessionContext, sql: &str) -> Result<usize> {
    let mut stream = ctx.sql(sql).await?.execute_stream().await?;
    let mut rows = 0;
    while let Some(b) = stream.next().await {
        rows += b?.num_rows();
    }
    Ok(rows)
}

fn rate(rows: usize, d: Duration) -> f64 {
    rows as f64 / d.as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(()); // cargo test --benches asks benches to list themselves
    }
    let rows: usize = std::env::var("FRAGVEC_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    let tmp = tempfile::tempdir()?;
    let config = SessionConfig::new().with_target_partitions(2);
    let ctx = SessionContext::new_with_config(config);
    let (schema, parts) = data(rows, 2);
    ctx.register_table("src", Arc::new(MemTable::try_new(schema, parts)?))?;
    let session = fragvec::register(&ctx, tmp.path().join("db").to_str().unwrap()).await?;
    let pq_dir = tmp.path().join("parquet");

    let ingest_fragvec = best_of(|run| {
        let session = session.clone();
        async move {
            session
                .sql(&format!(
                    "CREATE TABLE t{run} (id BIGINT NOT NULL, emb VECTOR({DIM}))"
                ))
                .await?;
            session
                .sql(&format!("INSERT INTO t{run} SELECT * FROM src"))
                .await?;
            Ok(())
        }
    })
    .await?;
    // DataFusion's COPY TO with its default codec (zstd), and with fragvec's (lz4_raw).
    let copy = |codec: &'static str| {
        let ctx = ctx.clone();
        let pq_dir = pq_dir.clone();
        move |run: usize| {
            let ctx = ctx.clone();
            let path = pq_dir.join(format!("{codec}{run}.parquet"));
            async move {
                let options = match codec {
                    "default" => String::new(),
                    c => format!(" OPTIONS ('format.compression' '{c}')"),
                };
                ctx.sql(&format!(
                    "COPY (SELECT * FROM src) TO '{}' STORED AS PARQUET{options}",
                    path.display()
                ))
                .await?
                .collect()
                .await?;
                Ok(())
            }
        }
    };
    let ingest_df = best_of(copy("default")).await?;
    let ingest_df_lz4 = best_of(copy("lz4_raw")).await?;
    for (name, file) in [("pq", "default0"), ("pq_lz4", "lz4_raw0")] {
        ctx.sql(&format!(
            "CREATE EXTERNAL TABLE {name} STORED AS PARQUET LOCATION '{}'",
            pq_dir.join(format!("{file}.parquet")).display()
        ))
        .await?;
    }
    let scan = |sql: &'static str| {
        let ctx = ctx.clone();
        move |_| {
            let ctx = ctx.clone();
            async move {
                assert_eq!(drain(&ctx, sql).await?, rows);
                Ok(())
            }
        }
    };
    let scan_fragvec = best_of(scan("SELECT * FROM t0")).await?;
    let scan_df = best_of(scan("SELECT * FROM pq")).await?;
    let scan_df_lz4 = best_of(scan("SELECT * FROM pq_lz4")).await?;

    let line = |what: &str, d: Duration| {
        println!(
            "{what:<40} {:>12.0} rows/s  ({:.3} s)",
            rate(rows, d),
            d.as_secs_f64()
        );
    };
    println!("rows: {rows} x (id BIGINT, emb VECTOR({DIM})), best of {RUNS}, 2 target partitions");
    line("ingest fragvec INSERT (lz4_raw)", ingest_fragvec);
    line("ingest DataFusion COPY TO (default zstd)", ingest_df);
    line("ingest DataFusion COPY TO (lz4_raw)", ingest_df_lz4);
    let ratio = |ours: Duration, theirs: Duration| theirs.as_secs_f64() / ours.as_secs_f64();
    println!(
        "ingest ratio fragvec/DataFusion: {:.2} vs default, {:.2} vs same codec (goal >= 0.7)",
        ratio(ingest_fragvec, ingest_df),
        ratio(ingest_fragvec, ingest_df_lz4)
    );
    line("scan fragvec SELECT *", scan_fragvec);
    line("scan DataFusion Parquet (default zstd)", scan_df);
    line("scan DataFusion Parquet (lz4_raw)", scan_df_lz4);
    println!(
        "scan ratio fragvec/DataFusion: {:.2} vs default, {:.2} vs same codec (goal >= 0.8)",
        ratio(scan_fragvec, scan_df),
        ratio(scan_fragvec, scan_df_lz4)
    );
    Ok(())
}

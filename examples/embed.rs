//! Embedding fragvec in a DataFusion application.
//!
//! `fragvec::register` turns an existing `SessionContext` into a fragvec session over a
//! database: its tables become the default schema, and the returned `FragvecSession` runs
//! the statements DataFusion alone cannot (CREATE TABLE with vectors, DELETE, UPDATE, MERGE).
//! Plain queries work through the context as usual.
//!
//! Run with `cargo run --example embed`.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;

#[tokio::main]
async fn main() -> Result<()> {
    let ctx = SessionContext::new();
    let fragvec = fragvec::register(&ctx, "memory://embed-example").await?;

    fragvec
        .sql(
            "CREATE TABLE docs (id BIGINT NOT NULL, title VARCHAR, emb VECTOR(3)) \
             WITH (stable_row_ids = true);
             INSERT INTO docs VALUES (1, 'intro', [0.1, 0.2, 0.3]), (2, 'usage', [0.3, 0.2, 0.1]);
             UPDATE docs SET title = 'Introduction' WHERE id = 1;",
        )
        .await?;

    // Reads go through DataFusion's own API, on the same context.
    let df = ctx.sql("SELECT id, title FROM docs ORDER BY id").await?;
    df.clone().show().await?;
    let batches = df.collect().await?;
    let ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(ids, vec![1, 2]);

    // Nearest neighbours through the context: the query vector in pgvector's text form is
    // one string for DataFusion to plan (an array literal is one expression per number).
    let nearest = ctx
        .sql("SELECT id FROM docs ORDER BY l2_distance(emb, '[0.3, 0.2, 0.0]') LIMIT 1")
        .await?
        .collect()
        .await?;
    assert_eq!(nearest[0].column(0).as_primitive::<Int64Type>().value(0), 2);

    // Every version stays readable.
    let before = fragvec
        .sql_one("SELECT title FROM docs VERSION AS OF 2 WHERE id = 1")
        .await?;
    let title = before.batches[0]
        .column(0)
        .as_string_view()
        .value(0)
        .to_string();
    assert_eq!(title, "intro");
    println!("title of doc 1 at version 2: {title}");
    Ok(())
}

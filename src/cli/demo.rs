//! `fragvec demo`: builds a small table of generated vectors and walks through what works.

use super::Format;
use super::output::print;
use crate::engine::FragvecSession;

/// The tour: each step is a caption and the SQL it runs.
const TOUR: &[(&str, &str)] = &[
    ("Start clean", "DROP TABLE IF EXISTS demo_items"),
    (
        "A table with a 4-dimensional vector column, stable row ids, and small fragments",
        "CREATE TABLE demo_items (id BIGINT NOT NULL, category VARCHAR, emb VECTOR(4)) \
         WITH (stable_row_ids = true, max_rows_per_fragment = 4000)",
    ),
    (
        "Load 10,000 generated rows (one INSERT, split into fragments of 4,000)",
        "INSERT INTO demo_items \
         SELECT value, CASE WHEN value % 3 = 0 THEN 'red' WHEN value % 3 = 1 THEN 'green' ELSE 'blue' END, \
                [cos(value), sin(value), cos(value / 7.0), sin(value / 7.0)] \
         FROM generate_series(0, 9999)",
    ),
    (
        "Fragments, in logical order",
        "SELECT * FROM fragvec_fragments('demo_items')",
    ),
    (
        "Rows per category",
        "SELECT category, count(*) AS n FROM demo_items GROUP BY category ORDER BY category",
    ),
    (
        "Delete the blue rows (deletion vectors, no rewrite)",
        "DELETE FROM demo_items WHERE category = 'blue'",
    ),
    (
        "Update in place: only the vector column of affected fragments is rewritten",
        "SET fragvec.update_mode = 'rewrite_columns'",
    ),
    ("", "UPDATE demo_items SET emb = [0, 0, 0, 0] WHERE id < 3"),
    (
        "Update by rewriting rows: old versions deleted, new ones appended under the same row id",
        "SET fragvec.update_mode = 'rewrite_rows'",
    ),
    ("", "UPDATE demo_items SET category = 'red' WHERE id = 4"),
    (
        "MERGE: update matches, insert the rest",
        "MERGE INTO demo_items AS t USING (SELECT * FROM (VALUES (4, 'purple'), (20000, 'new')) AS v(id, category)) AS s \
         ON t.id = s.id \
         WHEN MATCHED THEN UPDATE SET category = s.category \
         WHEN NOT MATCHED THEN INSERT (id, category, emb) VALUES (s.id, s.category, [1, 1, 1, 1])",
    ),
    (
        "Row ids survive updates",
        "SELECT id, category, _rowid FROM demo_items WHERE id IN (0, 4, 20000) ORDER BY id",
    ),
    (
        "Every version is kept",
        "SELECT version, operation, read_version, fragments, rows FROM fragvec_versions('demo_items')",
    ),
    (
        "Time travel: the table before the DELETE",
        "SELECT count(*) AS rows FROM demo_items VERSION AS OF 2",
    ),
    ("And now", "SELECT count(*) AS rows FROM demo_items"),
    (
        "A vector index: IVF with 16 partitions",
        "CREATE VECTOR INDEX demo_emb ON demo_items (emb) USING IVF_FLAT WITH (num_partitions = 16)",
    ),
    (
        "Nearest neighbours through the index (EXPLAIN shows KnnExec)",
        "EXPLAIN SELECT id FROM demo_items ORDER BY l2_distance(emb, [1, 0, 1, 0]) LIMIT 5",
    ),
    (
        "",
        "SELECT id, category, l2_distance(emb, [1, 0, 1, 0]) AS distance FROM demo_items \
         ORDER BY distance LIMIT 5",
    ),
    (
        "WHERE filters before the top-k: always k qualifying rows",
        "SELECT id, category, l2_distance(emb, [1, 0, 1, 0]) AS distance FROM demo_items \
         WHERE category = 'green' ORDER BY distance LIMIT 3",
    ),
    (
        "New rows are found before the index is optimized (scored by brute force)",
        "INSERT INTO demo_items VALUES (30000, 'fresh', [1, 0, 1, 0])",
    ),
    (
        "",
        "SELECT id, _distance FROM knn('demo_items', 'emb', [1, 0, 1, 0], 2)",
    ),
    (
        "Index them as a new segment",
        "OPTIMIZE INDEX demo_emb ON demo_items",
    ),
    (
        "",
        "SELECT index, segment_id, rows, fragment_bitmap, invalidated_fragments \
         FROM fragvec_segments('demo_items')",
    ),
    (
        "Compact the small fragments in place; the segments are not rebuilt, the ledger records \
         where rows moved",
        "COMPACT demo_items WITH (target_rows_per_fragment = 8000)",
    ),
    (
        "",
        "SELECT transition_id, kind, sources, destinations, rows_moved FROM fragvec_ledger('demo_items')",
    ),
    (
        "How scattered the IVF partitions are over the fragments",
        "SELECT * FROM recluster_information('demo_items', 'ivf_partition(emb)')",
    ),
    (
        "Recluster by IVF partition (a stable partition recorded in a row map; index kept)",
        "RECLUSTER demo_items BY (ivf_partition(emb)) WITH (destinations = 4)",
    ),
    (
        "",
        "SELECT * FROM recluster_information('demo_items', 'ivf_partition(emb)')",
    ),
    (
        "The same nearest neighbours, through the translated segments",
        "SELECT id, category, l2_distance(emb, [1, 0, 1, 0]) AS d FROM demo_items \
         ORDER BY d LIMIT 5",
    ),
];

/// Runs the demo's tour on `session`, printing each step's statement and result.
pub async fn run(session: &FragvecSession, format: Format) -> Result<(), String> {
    let mut out = std::io::stdout();
    for (i, (caption, sql)) in TOUR.iter().enumerate() {
        if !caption.is_empty() {
            println!("\n-- {caption}");
        }
        println!("{sql};");
        let result = session
            .sql_one(sql)
            .await
            .map_err(|e| format!("demo step {}: {e}", i + 1))?;
        print(&result, format, &mut out).map_err(|e| e.to_string())?;
    }
    println!(
        "\nThe demo database is at {}; open it with `fragvec --db {}`.",
        session.database().location(),
        session.database().location()
    );
    Ok(())
}

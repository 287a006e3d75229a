//! A counter of the `KnnExec` line of a query's `EXPLAIN ANALYZE` (the KNN tests' window on
//! what a search did: fragments pruned, filter rows reused, ...).

use fragvec::engine::FragvecSession;

/// The counter `name` on the `KnnExec` line of `EXPLAIN ANALYZE sql`.
pub async fn knn_metric(s: &FragvecSession, sql: &str, name: &str) -> usize {
    let r = s.sql_one(&format!("EXPLAIN ANALYZE {sql}")).await.unwrap();
    let plan = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    let line = plan
        .lines()
        .find(|l| l.contains("KnnExec"))
        .unwrap_or_else(|| panic!("{sql}: no KnnExec in\n{plan}"));
    let key = format!("{name}=");
    let at = line
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {line}"));
    line[at + key.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

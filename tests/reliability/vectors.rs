//! The vectors the reliability tables hold (a function of the row id, so a model of the ids
//! is a model of the vectors too) and a KNN check against that model.

use std::time::Duration;

use super::shell::Shell;

/// The SQL of the vector of the row whose id is `id_expr`.
pub fn vector_sql(id_expr: &str) -> String {
    format!("[{id_expr} % 13, {id_expr} % 7, {id_expr} % 5, {id_expr} % 3]")
}

pub fn vector_of(id: i64) -> [f32; 4] {
    [
        (id % 13) as f32,
        (id % 7) as f32,
        (id % 5) as f32,
        (id % 3) as f32,
    ]
}

fn l2(a: [f32; 4], b: [f32; 4]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f32>()
        .sqrt()
}

/// `ORDER BY l2_distance(emb, q) LIMIT k` on `table` must return `min(k, live)` distinct live
/// rows whose distances are the k smallest of the live rows (ties may pick any of the tied
/// rows).
pub fn check_knn(
    shell: &mut Shell,
    table: &str,
    live: &[i64],
    q: [f32; 4],
    k: usize,
) -> Result<(), String> {
    let qs = format!("[{}, {}, {}, {}]", q[0], q[1], q[2], q[3]);
    let sql = format!(
        "SELECT id, l2_distance(emb, {qs}) AS d FROM {table} ORDER BY l2_distance(emb, {qs}) LIMIT {k}"
    );
    let outcome = shell.run(&sql, Duration::from_secs(120));
    let Some(lines) = outcome.rows() else {
        return Err(format!("{sql}: {outcome:?}"));
    };
    let mut want: Vec<f32> = live.iter().map(|id| l2(vector_of(*id), q)).collect();
    want.sort_by(f32::total_cmp);
    want.truncate(k);
    let mut got = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for line in lines {
        let (id, d) = line.split_once(',').ok_or(format!("{sql}: {line}"))?;
        let id: i64 = id.parse().map_err(|e| format!("{sql}: {line}: {e}"))?;
        let d: f32 = d.parse().map_err(|e| format!("{sql}: {line}: {e}"))?;
        if live.binary_search(&id).is_err() {
            return Err(format!("{sql}: returned row {id}, which is not live"));
        }
        if !ids.insert(id) {
            return Err(format!("{sql}: returned row {id} twice"));
        }
        if (d - l2(vector_of(id), q)).abs() > 1e-3 {
            return Err(format!(
                "{sql}: row {id} at distance {d}, its vector gives another"
            ));
        }
        got.push(d);
    }
    got.sort_by(f32::total_cmp);
    let same = got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-3);
    if !same {
        return Err(format!(
            "{sql}: distances {got:?}, the live rows' nearest are {want:?}"
        ));
    }
    Ok(())
}

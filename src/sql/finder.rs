//! Finder queries: each DELETE, UPDATE or MERGE becomes one SELECT over the pinned target
//! snapshot that returns, per affected target row, its address (`__fv_addr`), its row id
//! (`__fv_rowid`), what to do (`__fv_action`, MERGE only) and the row's new values.
//!
//! Because the finder is an ordinary query, DataFusion plans all of it: subqueries in WHERE
//! (which DataFusion 55's own DML path silently drops, turning "delete some" into "delete all"),
//! joins with the MERGE source, casts and functions. The builders here are pure string
//! assembly from the parsed statement and are unit-tested without a session.

use std::collections::BTreeSet;

use datafusion::common::{Result, internal_err, plan_err};
use datafusion::sql::sqlparser::ast::{
    Assignment, AssignmentTarget, Delete, Expr, FromTable, Merge, MergeAction, MergeClauseKind,
    MergeInsertKind, ObjectName, ObjectNamePart, TableFactor, TableWithJoins, Update,
};

use super::pin::normalize_ident;
use crate::format::manifest::{ROW_ADDR, ROW_ID};

/// Name of the finder's bookkeeping column holding the target row's address (`_rowaddr`).
pub const ADDR: &str = "__fv_addr";
/// Name of the finder's bookkeeping column holding the target row's stable id (`_rowid`).
pub const ROWID: &str = "__fv_rowid";
/// Name of the finder's bookkeeping column saying what happens to the row
/// ([`Action::code`]); a finder without it applies its `default_action` to every row.
pub const ACTION: &str = "__fv_action";

/// What happens to one finder row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The target row goes.
    Delete,
    /// The target row gets new values.
    Update,
    /// A new row (MERGE's `WHEN NOT MATCHED THEN INSERT`).
    Insert,
}

impl Action {
    /// The action as the finder's action column holds it.
    pub fn code(self) -> &'static str {
        match self {
            Action::Delete => "D",
            Action::Update => "U",
            Action::Insert => "I",
        }
    }

    /// The action `code` names (the inverse of [`Self::code`]).
    pub fn from_code(code: &str) -> Result<Self> {
        match code {
            "D" => Ok(Action::Delete),
            "U" => Ok(Action::Update),
            "I" => Ok(Action::Insert),
            other => internal_err!("unknown finder action {other}"),
        }
    }
}

/// The target of a DML statement.
#[derive(Debug, Clone, PartialEq)]
pub struct DmlTarget {
    /// The target table's name.
    pub table: String,
    /// How the statement refers to the target in expressions.
    pub alias: String,
}

/// A DML statement's finder: the query whose rows say which target rows change and how.
#[derive(Debug, Clone)]
pub struct Finder {
    /// The query, as SQL text: the bookkeeping columns ([`ADDR`], [`ROWID`], and [`ACTION`]
    /// for MERGE) then, for UPDATE and MERGE, every target column's new value.
    pub sql: String,
    /// Action of rows when the finder has no action column.
    pub default_action: Action,
    /// Columns that updates assign (what a `rewrite_columns` update rewrites).
    pub assigned_columns: Vec<String>,
}

/// One table column of the target: its name and, for vector columns, the dimension.
#[derive(Debug, Clone)]
pub struct TargetColumn {
    /// The column's name.
    pub name: String,
    /// Its dimension, for a vector column.
    pub vector_dim: Option<i32>,
}

/// `"name"`, with embedded quotes doubled.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn table_name(name: &ObjectName) -> Result<String> {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(i)) => Ok(normalize_ident(i)),
        _ => plan_err!("unsupported table name {name}"),
    }
}

fn target_of_factor(tf: &TableFactor, what: &str) -> Result<DmlTarget> {
    match tf {
        TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } => {
            let table = table_name(name)?;
            let alias = alias
                .as_ref()
                .map_or_else(|| quote(&table), |a| a.name.to_string());
            Ok(DmlTarget { table, alias })
        }
        _ => plan_err!("the target of {what} must be a table"),
    }
}

fn single_table(tables: &[TableWithJoins], what: &str) -> Result<DmlTarget> {
    match tables {
        [t] if t.joins.is_empty() => target_of_factor(&t.relation, what),
        _ => plan_err!("{what} takes exactly one target table, without joins"),
    }
}

/// The target of `DELETE`; an error for forms fragvec does not take (USING, RETURNING, ...).
pub fn delete_target(d: &Delete) -> Result<DmlTarget> {
    if d.using.is_some() || d.returning.is_some() || !d.order_by.is_empty() || d.limit.is_some() {
        return plan_err!("DELETE supports only FROM <table> [WHERE ...]");
    }
    if !d.tables.is_empty() {
        return plan_err!("multi-table DELETE is not supported");
    }
    match &d.from {
        FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => single_table(t, "DELETE"),
    }
}

/// The target of `UPDATE`; an error for forms fragvec does not take (FROM, RETURNING, ...).
pub fn update_target(u: &Update) -> Result<DmlTarget> {
    if u.from.is_some() {
        return plan_err!("UPDATE ... FROM is not supported; use MERGE INTO");
    }
    if u.returning.is_some() || !u.order_by.is_empty() || u.limit.is_some() || u.or.is_some() {
        return plan_err!("UPDATE supports only SET ... [WHERE ...]");
    }
    single_table(std::slice::from_ref(&u.table), "UPDATE")
}

/// The target of `MERGE INTO`.
pub fn merge_target(m: &Merge) -> Result<DmlTarget> {
    if m.output.is_some() {
        return plan_err!("MERGE ... OUTPUT is not supported");
    }
    target_of_factor(&m.table, "MERGE")
}

fn bookkeeping(alias: &str) -> String {
    format!(
        "{alias}.{} AS {}, {alias}.{} AS {}",
        quote(ROW_ADDR),
        quote(ADDR),
        quote(ROW_ID),
        quote(ROWID)
    )
}

/// The finder of `DELETE` over `relation` (the target pinned, with virtual columns): the
/// addresses of the rows its `WHERE` keeps.
pub fn delete_finder(d: &Delete, target: &DmlTarget, relation: &str) -> Result<Finder> {
    let mut sql = format!(
        "SELECT {} FROM {} AS {}",
        bookkeeping(&target.alias),
        quote(relation),
        target.alias
    );
    if let Some(sel) = &d.selection {
        sql.push_str(&format!(" WHERE {sel}"));
    }
    Ok(Finder {
        sql,
        default_action: Action::Delete,
        assigned_columns: vec![],
    })
}

/// Resolves `SET` assignments to (column, value), checking names.
fn assignments<'a>(
    list: &'a [Assignment],
    columns: &[TargetColumn],
) -> Result<Vec<(String, &'a Expr)>> {
    let mut out: Vec<(String, &Expr)> = Vec::new();
    for a in list {
        let AssignmentTarget::ColumnName(name) = &a.target else {
            return plan_err!("tuple assignments are not supported");
        };
        let col = table_name(name)?;
        if col == ROW_ADDR || col == ROW_ID {
            return plan_err!("{col} is a virtual column and cannot be assigned");
        }
        if !columns.iter().any(|c| c.name == col) {
            return plan_err!("column '{col}' does not exist in the target table");
        }
        if out.iter().any(|(c, _)| *c == col) {
            return plan_err!("column '{col}' is assigned twice");
        }
        out.push((col, &a.value));
    }
    Ok(out)
}

/// A value expression for a column, with vector columns cast to their type so that branches of
/// a CASE agree (an array literal is a `List<Float64>`).
fn typed(value: &str, column: &TargetColumn) -> String {
    match column.vector_dim {
        Some(n) => format!("CAST({value} AS FLOAT[{n}])"),
        None => format!("({value})"),
    }
}

/// The finder of `UPDATE`: each row its `WHERE` keeps, with the assigned columns' new values.
pub fn update_finder(
    u: &Update,
    target: &DmlTarget,
    relation: &str,
    columns: &[TargetColumn],
) -> Result<Finder> {
    let assigned = assignments(&u.assignments, columns)?;
    let a = &target.alias;
    let values: Vec<String> = columns
        .iter()
        .map(|c| match assigned.iter().find(|(n, _)| *n == c.name) {
            Some((_, v)) => format!("{} AS {}", typed(&v.to_string(), c), quote(&c.name)),
            None => format!("{a}.{} AS {}", quote(&c.name), quote(&c.name)),
        })
        .collect();
    let mut sql = format!(
        "SELECT {}, {} FROM {} AS {a}",
        bookkeeping(a),
        values.join(", "),
        quote(relation)
    );
    if let Some(sel) = &u.selection {
        sql.push_str(&format!(" WHERE {sel}"));
    }
    Ok(Finder {
        sql,
        default_action: Action::Update,
        assigned_columns: assigned.into_iter().map(|(c, _)| c).collect(),
    })
}

/// The finder of `MERGE`: each source row matched or not, with its action and values.
pub fn merge_finder(
    m: &Merge,
    target: &DmlTarget,
    relation: &str,
    columns: &[TargetColumn],
) -> Result<Finder> {
    let a = &target.alias;
    let s = match &m.source {
        TableFactor::Table { name, alias, .. } => match alias {
            Some(al) => al.name.to_string(),
            None => quote(&table_name(name)?),
        },
        TableFactor::Derived {
            alias: Some(al), ..
        } => al.name.to_string(),
        TableFactor::Derived { alias: None, .. } => {
            return plan_err!("a MERGE source subquery needs an alias");
        }
        other => return plan_err!("unsupported MERGE source {other}"),
    };
    let present = quote("__fv_src");
    let source = format!("(SELECT *, TRUE AS {present} FROM {}) AS {s}", m.source);
    let kinds: BTreeSet<u8> = m
        .clauses
        .iter()
        .map(|c| match c.clause_kind {
            MergeClauseKind::Matched => 0,
            MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget => 1,
            MergeClauseKind::NotMatchedBySource => 2,
        })
        .collect();
    let join = if kinds.contains(&2) {
        "FULL OUTER JOIN"
    } else if kinds.contains(&1) {
        "RIGHT JOIN"
    } else {
        "JOIN"
    };
    let addr = format!("{a}.{}", quote(ROW_ADDR));
    let mut actions = Vec::new();
    let mut per_column: Vec<Vec<String>> = vec![Vec::new(); columns.len()];
    let mut assigned_columns: Vec<String> = Vec::new();
    for clause in &m.clauses {
        let kind_cond = match clause.clause_kind {
            MergeClauseKind::Matched => format!("{addr} IS NOT NULL AND {s}.{present} IS NOT NULL"),
            MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget => {
                format!("{addr} IS NULL")
            }
            MergeClauseKind::NotMatchedBySource => format!("{s}.{present} IS NULL"),
        };
        let cond = match &clause.predicate {
            Some(p) => format!("({kind_cond}) AND ({p})"),
            None => kind_cond,
        };
        let inserting = matches!(
            clause.clause_kind,
            MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget
        );
        let values: Vec<String> = match &clause.action {
            MergeAction::Delete { .. } if !inserting => {
                actions.push(format!("WHEN {cond} THEN '{}'", Action::Delete.code()));
                columns.iter().map(|_| "NULL".to_string()).collect()
            }
            MergeAction::Update(up) if !inserting => {
                if up.update_predicate.is_some() || up.delete_predicate.is_some() {
                    return plan_err!("MERGE UPDATE ... WHERE / DELETE WHERE is not supported");
                }
                actions.push(format!("WHEN {cond} THEN '{}'", Action::Update.code()));
                let assigned = assignments(&up.assignments, columns)?;
                for (c, _) in &assigned {
                    if !assigned_columns.contains(c) {
                        assigned_columns.push(c.clone());
                    }
                }
                columns
                    .iter()
                    .map(|c| match assigned.iter().find(|(n, _)| *n == c.name) {
                        Some((_, v)) => typed(&v.to_string(), c),
                        None => typed(&format!("{a}.{}", quote(&c.name)), c),
                    })
                    .collect()
            }
            MergeAction::Insert(ins) if inserting => {
                if ins.insert_predicate.is_some() {
                    return plan_err!("MERGE INSERT ... WHERE is not supported");
                }
                let MergeInsertKind::Values(v) = &ins.kind else {
                    return plan_err!("MERGE INSERT ROW is not supported; list the VALUES");
                };
                let [row] = v.rows.as_slice() else {
                    return plan_err!("MERGE INSERT takes exactly one VALUES row");
                };
                let names: Vec<String> = if ins.columns.is_empty() {
                    columns.iter().map(|c| c.name.clone()).collect()
                } else {
                    ins.columns.iter().map(table_name).collect::<Result<_>>()?
                };
                if names.len() != row.content.len() {
                    return plan_err!(
                        "MERGE INSERT names {} columns but gives {} values",
                        names.len(),
                        row.content.len()
                    );
                }
                for n in &names {
                    if !columns.iter().any(|c| c.name == *n) {
                        return plan_err!("column '{n}' does not exist in the target table");
                    }
                }
                actions.push(format!("WHEN {cond} THEN '{}'", Action::Insert.code()));
                columns
                    .iter()
                    .map(|c| match names.iter().position(|n| *n == c.name) {
                        Some(i) => typed(&row.content[i].to_string(), c),
                        None => "NULL".to_string(),
                    })
                    .collect()
            }
            _ => {
                return plan_err!(
                    "WHEN MATCHED / NOT MATCHED BY SOURCE take UPDATE or DELETE; \
                     WHEN NOT MATCHED takes INSERT"
                );
            }
        };
        for (i, v) in values.into_iter().enumerate() {
            per_column[i].push(format!("WHEN {cond} THEN {v}"));
        }
    }
    if m.clauses.is_empty() {
        return plan_err!("MERGE needs at least one WHEN clause");
    }
    let column_exprs: Vec<String> = columns
        .iter()
        .zip(&per_column)
        .map(|(c, whens)| format!("CASE {} END AS {}", whens.join(" "), quote(&c.name)))
        .collect();
    let inner = format!(
        "SELECT {}, CASE {} END AS {}, {} FROM {} AS {a} {join} {source} ON {}",
        bookkeeping(a),
        actions.join(" "),
        quote(ACTION),
        column_exprs.join(", "),
        quote(relation),
        m.on
    );
    let sql = format!(
        "SELECT * FROM ({inner}) AS \"__fv_m\" WHERE {} IS NOT NULL",
        quote(ACTION)
    );
    Ok(Finder {
        sql,
        default_action: Action::Update,
        assigned_columns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::ast::Statement;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse(sql: &str) -> Statement {
        Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0)
    }

    fn cols() -> Vec<TargetColumn> {
        vec![
            TargetColumn {
                name: "id".into(),
                vector_dim: None,
            },
            TargetColumn {
                name: "emb".into(),
                vector_dim: Some(2),
            },
        ]
    }

    #[test]
    fn delete_keeps_the_whole_predicate() {
        let Statement::Delete(d) = parse("DELETE FROM t WHERE id IN (SELECT x FROM u)") else {
            panic!()
        };
        let target = delete_target(&d).unwrap();
        assert_eq!(
            target,
            DmlTarget {
                table: "t".into(),
                alias: "\"t\"".into()
            }
        );
        let f = delete_finder(&d, &target, "t@v3#vc").unwrap();
        assert_eq!(
            f.sql,
            "SELECT \"t\".\"_rowaddr\" AS \"__fv_addr\", \"t\".\"_rowid\" AS \"__fv_rowid\" \
             FROM \"t@v3#vc\" AS \"t\" WHERE id IN (SELECT x FROM u)"
        );
    }

    #[test]
    fn update_projects_every_column() {
        let Statement::Update(u) = parse("UPDATE t SET emb = [1, 2] WHERE id = 1") else {
            panic!()
        };
        let target = update_target(&u).unwrap();
        let f = update_finder(&u, &target, "t@v1#vc", &cols()).unwrap();
        assert!(f.sql.contains("\"t\".\"id\" AS \"id\""), "{}", f.sql);
        assert!(
            f.sql.contains("CAST([1, 2] AS FLOAT[2]) AS \"emb\""),
            "{}",
            f.sql
        );
        assert_eq!(f.assigned_columns, vec!["emb".to_string()]);
    }

    #[test]
    fn update_rejects_unknown_and_virtual_columns() {
        let Statement::Update(u) = parse("UPDATE t SET nope = 1") else {
            panic!()
        };
        let t = update_target(&u).unwrap();
        assert!(
            update_finder(&u, &t, "x", &cols())
                .unwrap_err()
                .to_string()
                .contains("nope")
        );
        let Statement::Update(u) = parse("UPDATE t SET _rowid = 1") else {
            panic!()
        };
        assert!(
            update_finder(&u, &t, "x", &cols())
                .unwrap_err()
                .to_string()
                .contains("virtual")
        );
    }

    #[test]
    fn merge_chooses_the_join_from_its_clauses() {
        let Statement::Merge(m) = parse(
            "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET emb = s.emb \
             WHEN NOT MATCHED THEN INSERT (id, emb) VALUES (s.id, s.emb)",
        ) else {
            panic!()
        };
        let target = merge_target(&m).unwrap();
        let f = merge_finder(&m, &target, "t@v1#vc", &cols()).unwrap();
        assert!(
            f.sql
                .contains("RIGHT JOIN (SELECT *, TRUE AS \"__fv_src\" FROM s) AS \"s\""),
            "{}",
            f.sql
        );
        assert_eq!(f.assigned_columns, vec!["emb".to_string()]);
    }
}

//! Relation pinning: every fragvec table a statement names is resolved to one version before
//! the statement is planned, so a table read twice in one query is read at the same version,
//! and DML commits against exactly the version its finder read.
//!
//! Pinned relations are renamed to their encoded form (`"t@v7"`, `"t@v7#vc"` when the statement
//! uses `_rowaddr` / `_rowid`) and keep their original name as alias.

use std::collections::{BTreeSet, HashMap};
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Ident, ObjectName, ObjectNamePart, Query, TableAlias, TableFactor, Visit, VisitMut, Visitor,
    VisitorMut,
};

/// A relation name as the front end passes it to the catalog: `table[@v<version>][#vc]`.
/// `#vc` adds the virtual columns `_rowaddr` and `_rowid` to the table's schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationName {
    /// The table's name.
    pub table: String,
    /// The version pinned (`None`: the latest).
    pub version: Option<u64>,
    /// Whether `_rowaddr` and `_rowid` are added.
    pub virtual_columns: bool,
}

impl RelationName {
    /// `name` as the front end wrote it; `None` for a name that is not one of these.
    pub fn parse(name: &str) -> Option<Self> {
        let (rest, virtual_columns) = match name.strip_suffix("#vc") {
            Some(r) => (r, true),
            None => (name, false),
        };
        let (table, version) = match rest.split_once("@v") {
            Some((t, v)) => (t, Some(v.parse().ok()?)),
            None => (rest, None),
        };
        if table.contains(['@', '#']) {
            return None;
        }
        Some(Self {
            table: table.to_string(),
            version,
            virtual_columns,
        })
    }

    /// The name as the catalog is given it (the inverse of [`Self::parse`]).
    pub fn encode(&self) -> String {
        let mut s = self.table.clone();
        if let Some(v) = self.version {
            s.push_str(&format!("@v{v}"));
        }
        if self.virtual_columns {
            s.push_str("#vc");
        }
        s
    }
}

/// Normalizes an identifier as DataFusion does: unquoted names are lower-cased.
pub fn normalize_ident(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// The table a plain relation name refers to, if it names one in the default schema.
pub fn relation_of(name: &ObjectName) -> Option<RelationName> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => Some(normalize_ident(i)),
            ObjectNamePart::Function(_) => None,
        })
        .collect::<Option<_>>()?;
    let table = match parts.as_slice() {
        [t] => t,
        [s, t] if s == "public" => t,
        [c, s, t] if c == "datafusion" && s == "public" => t,
        _ => return None,
    };
    RelationName::parse(table)
}

/// Tables named in a statement's FROM clauses (not CTE names), by base table name.
pub fn referenced_tables<V: Visit>(statement: &V) -> BTreeSet<String> {
    collect_tables(statement, false)
}

/// The [`referenced_tables`] named at least once without a version (whose newest version
/// pinning must find; a relation already pinned needs no look-up).
pub fn unpinned_tables<V: Visit>(statement: &V) -> BTreeSet<String> {
    collect_tables(statement, true)
}

fn collect_tables<V: Visit>(statement: &V, unpinned_only: bool) -> BTreeSet<String> {
    struct Collect {
        tables: BTreeSet<String>,
        ctes: BTreeSet<String>,
        unpinned_only: bool,
    }
    impl Visitor for Collect {
        type Break = ();
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
            if let Some(with) = &query.with {
                for cte in &with.cte_tables {
                    self.ctes.insert(normalize_ident(&cte.alias.name));
                }
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_table_factor(&mut self, tf: &TableFactor) -> ControlFlow<()> {
            if let TableFactor::Table {
                name, args: None, ..
            } = tf
                && let Some(rel) = relation_of(name)
                && !(self.unpinned_only && rel.version.is_some())
            {
                self.tables.insert(rel.table);
            }
            ControlFlow::Continue(())
        }
    }
    let mut c = Collect {
        tables: BTreeSet::new(),
        ctes: BTreeSet::new(),
        unpinned_only,
    };
    let _ = statement.visit(&mut c);
    c.tables.retain(|t| !c.ctes.contains(t));
    c.tables
}

/// Renames relations of the tables in `latest` (table → version to read when the statement
/// does not name one) to their pinned, encoded form.
pub fn pin_relations<V: VisitMut>(
    statement: &mut V,
    latest: &HashMap<String, u64>,
    virtual_columns: bool,
) {
    struct Pin<'a> {
        latest: &'a HashMap<String, u64>,
        virtual_columns: bool,
    }
    impl VisitorMut for Pin<'_> {
        type Break = ();
        fn pre_visit_table_factor(&mut self, tf: &mut TableFactor) -> ControlFlow<()> {
            if let TableFactor::Table {
                name,
                alias,
                args: None,
                ..
            } = tf
                && let Some(mut rel) = relation_of(name)
                && let Some(&version) = self.latest.get(&rel.table)
            {
                rel.version = Some(rel.version.unwrap_or(version));
                rel.virtual_columns |= self.virtual_columns;
                *name = ObjectName(vec![ObjectNamePart::Identifier(Ident::with_quote(
                    '"',
                    rel.encode(),
                ))]);
                if alias.is_none() {
                    *alias = Some(TableAlias {
                        explicit: true,
                        name: Ident::with_quote('"', rel.table.clone()),
                        columns: vec![],
                        at: None,
                    });
                }
            }
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Pin {
        latest,
        virtual_columns,
    });
}

/// Whether a statement's text refers to a virtual column.
pub fn mentions_virtual_columns(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    lower.contains("_rowaddr") || lower.contains("_rowid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    #[test]
    fn pins_tables_but_not_ctes() {
        let sql =
            "WITH c AS (SELECT * FROM t) SELECT * FROM c JOIN u ON c.x = u.x JOIN ext ON true";
        let mut stmt = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0);
        let tables = referenced_tables(&stmt);
        assert_eq!(
            tables,
            BTreeSet::from(["ext".to_string(), "t".to_string(), "u".to_string()])
        );
        let latest = HashMap::from([("t".to_string(), 3), ("u".to_string(), 5)]);
        pin_relations(&mut stmt, &latest, false);
        let text = stmt.to_string();
        assert!(text.contains("FROM \"t@v3\" AS \"t\""), "{text}");
        assert!(text.contains("JOIN \"u@v5\" AS \"u\""), "{text}");
        assert!(text.contains("JOIN ext ON"), "{text}");
    }

    #[test]
    fn explicit_versions_win_and_virtual_columns_are_added() {
        let mut stmt = Parser::parse_sql(&GenericDialect {}, "SELECT _rowid FROM \"t@v2\" AS t")
            .unwrap()
            .remove(0);
        pin_relations(&mut stmt, &HashMap::from([("t".to_string(), 9)]), true);
        assert!(stmt.to_string().contains("\"t@v2#vc\" AS t"), "{stmt}");
    }

    #[test]
    fn relation_names_round_trip() {
        for s in ["t", "t@v3", "t#vc", "t@v12#vc"] {
            assert_eq!(RelationName::parse(s).unwrap().encode(), s);
        }
        assert!(RelationName::parse("t@vx").is_none());
        assert!(RelationName::parse("a#b").is_none());
    }
}

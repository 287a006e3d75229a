//! A statement prepared with Parse, and a portal's bound parameters (Bind's values, in the
//! types the client or Describe gave), read three ways: decoded for the bound-INSERT path,
//! as a KNN text's shape with its vectors decoded, and spliced into the statement's text as
//! SQL literals.

use std::sync::{Arc, Mutex};

use pgwire::api::Type;
use pgwire::api::portal::Portal;
use pgwire::error::PgWireResult;

use super::bound_insert::{self, InsertShape};
use super::params;
use super::sqlstate::{error_info, user_error};
use super::types;

/// A statement prepared with Parse: its text, and the parameter types this server told the
/// client at Describe (the client encodes its values by them when it named none itself).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The statement's text, `$n` placeholders and all.
    pub sql: Arc<str>,
    /// The statement's shape when it is a plain INSERT of parameters (computed once).
    pub insert: Arc<std::sync::OnceLock<Option<InsertShape>>>,
    /// The parameter types Describe reported for it.
    pub described: Arc<Mutex<Vec<Type>>>,
    /// Whether Describe told the client the statement returns no rows: its Execute may then
    /// send none (a fragvec statement's one-row report becomes its command tag).
    pub described_no_rows: Arc<std::sync::atomic::AtomicBool>,
}

impl Prepared {
    pub(super) fn new(sql: &str) -> Self {
        Self {
            sql: sql.into(),
            insert: Arc::default(),
            described: Arc::default(),
            described_no_rows: Arc::default(),
        }
    }
}

/// The type of a portal's parameter `i`: the one the client gave, else the one Describe
/// told it.
fn parameter_type(portal: &Portal<Prepared>, i: usize) -> Type {
    let stmt = &portal.statement;
    let described = stmt
        .statement
        .described
        .lock()
        .expect("lock")
        .get(i)
        .cloned();
    stmt.parameter_types
        .get(i)
        .cloned()
        .flatten()
        .filter(|t| *t != Type::UNKNOWN)
        .or(described)
        .unwrap_or(Type::UNKNOWN)
}

/// A portal's parameters decoded for [`bound_insert`]; `None` when one is of a type it does
/// not take.
pub(super) fn bound_values(
    portal: &Portal<Prepared>,
) -> PgWireResult<Option<Vec<bound_insert::Value>>> {
    let mut values = Vec::with_capacity(portal.parameters.len());
    for (i, value) in portal.parameters.iter().enumerate() {
        let format = portal.parameter_format.format_for(i);
        match bound_insert::decode(&parameter_type(portal, i), format, value.as_deref()) {
            Ok(Some(v)) => values.push(v),
            Ok(None) => return Ok(None),
            Err(e) => {
                return Err(user_error(error_info(
                    e.sqlstate,
                    format!("parameter ${}: {}", i + 1, e.message),
                )));
            }
        }
    }
    Ok(Some(values))
}

/// The shape of a portal's text with its vector parameters decoded, not spliced
/// ([`params::bound_shape`]); `None` without one, or when a parameter is one the full path
/// must word an error for.
pub(super) fn bound_shape(portal: &Portal<Prepared>) -> Option<crate::sql::vector_shape::Shape> {
    let mut bound = Vec::with_capacity(portal.parameters.len());
    let mut vectors = 0;
    for (i, value) in portal.parameters.iter().enumerate() {
        let ty = parameter_type(portal, i);
        let format = portal.parameter_format.format_for(i);
        if types::is_vector(&ty) {
            let Ok(Some(bound_insert::Value::Vector(v))) =
                bound_insert::decode(&ty, format, value.as_deref())
            else {
                return None;
            };
            vectors += 1;
            bound.push(params::Bound::Vector(v));
            continue;
        }
        let literal = params::literal(&ty, format, value.as_deref()).ok()?;
        bound.push(params::Bound::Literal(literal));
    }
    if vectors == 0 {
        return None;
    }
    params::bound_shape(&portal.statement.statement.sql, &bound)
}

/// The SQL of a portal: the statement's text with the bound values spliced in.
pub(super) fn bound_sql(portal: &Portal<Prepared>) -> PgWireResult<String> {
    let stmt = &portal.statement;
    let mut literals = Vec::with_capacity(portal.parameters.len());
    for (i, value) in portal.parameters.iter().enumerate() {
        let ty = parameter_type(portal, i);
        let format = portal.parameter_format.format_for(i);
        let lit = params::literal(&ty, format, value.as_deref()).map_err(|e| {
            user_error(error_info(
                e.sqlstate,
                format!("parameter ${}: {}", i + 1, e.message),
            ))
        })?;
        literals.push(lit);
    }
    params::substitute(&stmt.statement.sql, &literals)
        .map_err(|e| user_error(error_info(e.sqlstate, e.message)))
}

/// Identity of a portal (a Bind makes a new one, even under the same name).
pub(super) fn portal_key(portal: &Portal<Prepared>) -> usize {
    Arc::as_ptr(&portal.state) as *const () as usize
}

//! fragvec's SQL front end, the part that needs no session: parsing (ours first, then
//! DataFusion's), relation pinning, turning DML into finder queries, and the AST transforms
//! of CREATE TABLE ([`ddl`]).
//!
//! Everything here works on sqlparser ASTs and strings; executing statements is
//! [`crate::engine::FragvecSession`]'s job.

pub mod ddl;
pub mod finder;
pub mod knn_call;
pub mod parser;
pub mod pin;
pub mod vector_params;
pub mod vector_shape;
pub mod vector_syntax;

pub use parser::{
    FragvecStatement, OptimizeAction, parse_expr, parse_statements, parse_statements_in,
};

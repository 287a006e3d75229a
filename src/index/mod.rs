//! Vector indexes: distance kernels, k-means, IVF / PQ models, segment files, the index
//! cache, segment ownership, the KNN search entry point, and index builds.
//!
//! * Pure arithmetic, no IO: [`distance`], [`kmeans`], [`nearest`] (many rows to their
//!   centroids), [`ivf`], [`search`] (scoring partitions under a row mask into a top-k),
//!   [`parallel`] (one query's scoring spread over the cores), [`sample`] (the training
//!   sample of every build), [`quantized`] (bounds of rows' keys from one byte per value),
//!   [`sketch`] (a partition kept without its floats, and the exact search over it).
//! * Files: [`segment`] (the segment codec and its range reads), [`build`] (models and
//!   segments written from a snapshot, every vector in memory), [`build_stream`] (the same
//!   within a memory budget, in passes).
//! * [`ownership`]: which current rows each segment may answer for.
//! * [`cache`]: footers, models, ledgers, ownerships, partitions (as floats or sketches) and
//!   decoded columns under one byte budget.
//! * [`knn`]: the one entry point answering a KNN request for a table snapshot.
//! * [`optimize`]: creating, appending to, merging, retraining and dropping an index.
//! * [`assigned`]: the partition the index assigned to each row it holds (`ivf_partition`).
//! * [`introspect`]: `fragvec_indexes` figures.
//!
//! Uses `format` (files, manifests, commits) and `ledger` (translation); knows nothing of
//! DataFusion's planner. Errors: [`IndexError`].

pub mod assigned;
pub mod build;
pub mod build_stream;
pub mod cache;
pub mod distance;
pub mod error;
pub mod introspect;
pub mod ivf;
pub mod kmeans;
pub mod knn;
pub mod nearest;
pub mod optimize;
pub mod ownership;
pub mod parallel;
pub mod quantized;
pub mod row_centroids;
pub mod row_mask;
pub mod sample;
pub mod search;
pub mod segment;
pub mod sketch;
pub mod sq;

pub use error::{IndexError, Result};

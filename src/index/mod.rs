//! Vector indexes: distance kernels, k-means, the IVF model (flat and PQ), segment files and
//! their partition cache, and per-segment search with a row mask.
//!
//! The arithmetic (`distance`, `kmeans`, `ivf`, `search`) needs no IO; `segment` and `build`
//! read and write files through the table's object store.

pub mod build;
pub mod distance;
pub mod ivf;
pub mod kmeans;
pub mod search;
pub mod segment;

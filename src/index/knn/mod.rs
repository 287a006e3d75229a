//! KNN search over one table snapshot: the index layer's one entry point, [`search`].
//!
//! Given a snapshot, the vector column, a query vector, `k`, the metric, an optional index
//! and an optional row mask (the addresses passing the query's WHERE filter, evaluated by the
//! engine), it returns at most `k` row addresses with their distance keys, nearest first,
//! plus the counters `EXPLAIN ANALYZE` shows.
//!
//! Contract (what makes the answer exact about which rows exist):
//! * For each segment, its **ownership** (see [`super::ownership`]), the deletion vectors and
//!   the row mask are applied to every row **before** it can enter that segment's local
//!   top-k ([`super::search::RowMask`]), so a stale, deleted or filtered row never takes a
//!   valid row's place.
//! * A segment with nothing invalidated, all fragments present and none with deletions, under
//!   a query without a mask, takes the unfiltered fast path (same answer, no per-row checks).
//! * When probing `nprobes` partitions finds fewer than `k` rows, more partitions are probed.
//! * IVF_PQ candidates (`k × refine_factor` per segment) are re-ranked with exact distances.
//! * Fragments no segment owns are scored by brute force, skipping rows a segment owns.
//! * A mask admitting few rows (≤ [`EXACT_MASK_ROWS`], or ≤ k) is answered by scoring exactly
//!   those rows.
//! * If the index still yields fewer than `k` rows while more rows qualify (rows with NULL
//!   vectors are not indexed), the whole query is answered exactly.
//! * Rows without a defined distance (NULL vectors, zero vectors under cosine) get key
//!   `f32::INFINITY` and rank last, like `NULLS LAST`.
//! * With `undefined_first` (`NULLS FIRST`), up to `k` rows with a NULL vector (`undefined`)
//!   come first, with key `f32::NEG_INFINITY`, and the search fills the rest of the `k` with
//!   the nearest other rows (each row once).
//!
//! A search can be split into [`share`]s (segments plus the unowned rows of some fragments),
//! each answered by [`search_share`] under the same rules; see [`share`] for what merging
//! their answers gives.
//!
//! IO: model, footers and probed partitions through the [`IndexCache`]; vector columns of
//! unindexed fragments decoded once and cached within the budget; deletion vectors read
//! together, each once per session (the database keeps them decoded). Memory: O(k) per segment plus cached entries.

mod exact;
pub mod rows;
mod scan;
mod segments;
pub mod share;
mod sketched;
mod undefined;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::{StreamExt, TryStreamExt};
use roaring::RoaringTreemap;

use super::cache::IndexCache;
use super::distance::{Metric, metric_key};
use super::error::{IndexError, Result};
use super::row_mask::Deletions;
use super::search::{Candidate, TopK};
use crate::format::Snapshot;
use crate::format::index_meta::IndexDef;
pub use share::{KnnShare, ShareRows, Slice};

/// Masks admitting at most this many rows are answered by scoring exactly those rows.
pub const EXACT_MASK_ROWS: u64 = 4096;

/// What to search for.
#[derive(Clone, Copy, Debug)]
pub struct KnnRequest<'a> {
    /// The table version searched.
    pub snapshot: &'a Snapshot,
    /// The vector column (a table column name).
    pub column: &'a str,
    /// The query vector.
    pub vector: &'a [f32],
    /// The distance the rows are ranked by.
    pub metric: Metric,
    /// How many nearest rows to return.
    pub k: usize,
    /// The index to search; `None` scores every row exactly.
    pub index: Option<&'a IndexDef>,
    /// IVF partitions to probe per segment (at least 1).
    pub nprobes: usize,
    /// PQ re-ranking depth: `k × refine_factor` candidates per segment (at least 1).
    pub refine_factor: usize,
    /// Addresses of the rows passing the query's WHERE filter; `None` = no filter.
    pub mask: Option<&'a RoaringTreemap>,
    /// Rows without a distance (NULL vectors) first, as `NULLS FIRST` orders them.
    pub undefined_first: bool,
}

/// Counters of one search (shown by `EXPLAIN ANALYZE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnnStats {
    /// Index segments searched.
    pub segments_searched: usize,
    /// IVF partitions scored, over all segments.
    pub partitions_probed: usize,
    /// Rows whose distance was computed.
    pub rows_scored: usize,
    /// Rows of a segment it no longer owns.
    pub dropped_ownership: usize,
    /// Rows deleted since the segment was written.
    pub dropped_deleted: usize,
    /// Rows the WHERE filter dropped.
    pub dropped_filter: usize,
    /// Rows of quantized partitions ruled out from their codes (not scored from floats).
    pub skipped_by_bound: usize,
    /// Rows scored by brute force (no segment owns their fragment).
    pub unindexed_rows: usize,
    /// Searches the data files answered because the index could not.
    pub exact_fallbacks: usize,
    /// Data fragments whose rows were read from Parquet (scoring or fetching rows).
    pub fragments_read: usize,
    /// Rows of other slices' partitions a sliced share counted (not scored) to decide as
    /// one machine would whether to probe further (see [`share`]).
    pub counted_for_slices: usize,
    /// Rows of another slice's partition a sliced share scored for its starting bound only
    /// (the nearest probed partition; see `Searcher::seed_bound`).
    pub seen_for_slice_bound: usize,
    /// Whether the answer came from scoring the masked rows exactly.
    pub exact_mask: bool,
}

/// The answer: at most `k` candidates, nearest first.
#[derive(Debug, Default)]
pub struct KnnAnswer {
    /// The nearest rows, nearest first.
    pub candidates: Vec<Candidate>,
    /// Current vectors of candidates found in IVF_FLAT segments (their rows passed the
    /// segment's mask, so these are the rows' values): fetching them needs no Parquet read.
    pub vectors: HashMap<u64, Vec<f32>>,
    /// What the search did.
    pub stats: KnnStats,
}

/// Counters updated from shared references (scoring runs on several threads).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub segments_searched: AtomicUsize,
    pub partitions_probed: AtomicUsize,
    pub rows_scored: AtomicUsize,
    pub dropped_ownership: AtomicUsize,
    pub dropped_deleted: AtomicUsize,
    pub dropped_filter: AtomicUsize,
    pub skipped_by_bound: AtomicUsize,
    pub unindexed_rows: AtomicUsize,
    pub exact_fallbacks: AtomicUsize,
    pub fragments_read: AtomicUsize,
    pub counted_for_slices: AtomicUsize,
    pub seen_for_slice_bound: AtomicUsize,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicUsize, n: usize) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn stats(&self) -> KnnStats {
        let get = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        KnnStats {
            segments_searched: get(&self.segments_searched),
            partitions_probed: get(&self.partitions_probed),
            rows_scored: get(&self.rows_scored),
            dropped_ownership: get(&self.dropped_ownership),
            dropped_deleted: get(&self.dropped_deleted),
            dropped_filter: get(&self.dropped_filter),
            skipped_by_bound: get(&self.skipped_by_bound),
            unindexed_rows: get(&self.unindexed_rows),
            exact_fallbacks: get(&self.exact_fallbacks),
            fragments_read: get(&self.fragments_read),
            counted_for_slices: get(&self.counted_for_slices),
            seen_for_slice_bound: get(&self.seen_for_slice_bound),
            exact_mask: false,
        }
    }
}

/// The exact distance key of one vector (`None`: a NULL vector); `f32::INFINITY` when the
/// distance is undefined or the dimensions differ. The one scoring rule every exact path
/// (brute force, re-ranking, masked rows) uses.
#[inline]
pub(crate) fn exact_key(metric: Metric, q: &[f32], v: Option<&[f32]>) -> f32 {
    match v {
        Some(v) if v.len() == q.len() => metric_key(metric, q, v).unwrap_or(f32::INFINITY),
        _ => f32::INFINITY,
    }
}

/// One search's state: the request, the cache, the snapshot's deletion vectors.
pub(crate) struct Searcher<'a> {
    pub req: KnnRequest<'a>,
    pub cache: &'a IndexCache,
    /// Deletion vectors of the snapshot's fragments that have one, read once per query.
    pub deletions: Deletions,
    pub counters: Counters,
    /// The part of the search this run answers for; `None`: all of it.
    pub scope: Option<Scope>,
}

/// A share resolved against the snapshot (see [`share`]).
pub(crate) struct Scope {
    pub segments: BTreeSet<u64>,
    pub fragments: BTreeSet<u64>,
    pub rows: ShareRows,
}

impl Scope {
    /// A sliced share's slice: it decides from the whole table's counts (see [`share`]).
    pub fn slice(&self) -> Option<Slice> {
        self.rows.slice()
    }
}

/// Answers a KNN request (see the module docs for the contract).
pub async fn search(req: KnnRequest<'_>, cache: &IndexCache) -> Result<KnnAnswer> {
    search_in(req, None, cache).await
}

/// Answers the part of a KNN request that `share` names: the local top-k of the share's
/// owned, live, qualifying rows (see [`share`]).
pub async fn search_share(
    req: KnnRequest<'_>,
    share: &KnnShare,
    cache: &IndexCache,
) -> Result<KnnAnswer> {
    search_in(req, Some(share), cache).await
}

/// Fragments (ids) holding rows of `share` in a search with `index` (`None`: exact), so a
/// caller evaluating the WHERE filter of a share reads only these.
pub async fn share_fragments(
    snapshot: &Snapshot,
    index: Option<&IndexDef>,
    share: &KnnShare,
    cache: &IndexCache,
) -> Result<BTreeSet<u64>> {
    Ok(resolve_share(snapshot, index, share, cache)
        .await?
        .fragments()
        .collect())
}

async fn resolve_share(
    snapshot: &Snapshot,
    index: Option<&IndexDef>,
    share: &KnnShare,
    cache: &IndexCache,
) -> Result<ShareRows> {
    let manifest = &snapshot.manifest;
    let owners = match index {
        Some(index) => {
            let view = cache.ledger(&snapshot.dir, manifest).await?;
            Some(
                cache
                    .ownerships(&snapshot.dir, manifest, &view, &index.name)
                    .await?,
            )
        }
        None => None,
    };
    Ok(ShareRows::resolve(
        share,
        &manifest.fragments,
        owners.as_deref(),
    ))
}

async fn search_in(
    req: KnnRequest<'_>,
    share: Option<&KnnShare>,
    cache: &IndexCache,
) -> Result<KnnAnswer> {
    let scope = match share {
        Some(share) => Some(Scope {
            segments: share.segments.clone(),
            fragments: share.fragments.clone(),
            rows: resolve_share(req.snapshot, req.index, share, cache).await?,
        }),
        None => None,
    };
    // A share's WHERE mask holds only its own rows, so every count and path below (the
    // exact-mask path, the exact fallback) sees exactly the share's qualifying rows. A
    // sliced share keeps the whole table's mask: it decides from the whole table's counts.
    let restricted = match (&scope, req.mask) {
        (Some(scope), Some(mask)) if scope.slice().is_none() => Some(scope.rows.restrict(mask)),
        _ => None,
    };
    let req = KnnRequest {
        mask: restricted.as_ref().or(req.mask),
        ..req
    };
    let snapshot = req.snapshot;
    // Independent reads, sent together (each is cached per database after its first read).
    let reads: Vec<_> = snapshot
        .manifest
        .fragments
        .iter()
        .filter(|f| f.deletion.is_some())
        .map(
            |f| async move { Ok::<_, IndexError>((f.id, snapshot.dir.shared_deletions(f).await?)) },
        )
        .collect();
    let deletions: Deletions = futures::stream::iter(reads)
        .buffered(crate::format::ranges::CONCURRENT_REQUESTS)
        .try_collect()
        .await?;
    let searcher = Searcher {
        req: KnnRequest {
            nprobes: req.nprobes.max(1),
            refine_factor: req.refine_factor.max(1),
            ..req
        },
        cache,
        deletions,
        counters: Counters::default(),
        scope,
    };
    if !req.undefined_first {
        return searcher.run().await;
    }
    let undefined = searcher.undefined_rows(req.k).await?;
    // A sliced share searches for all `k` (truncated below): its decisions are made from the
    // whole table's counts, which must be compared with the same `k` in every share.
    let sliced = share.is_some_and(|s| s.slice.is_some());
    let mut answer = if undefined.len() < req.k {
        let rest = Searcher {
            req: KnnRequest {
                k: if sliced {
                    req.k
                } else {
                    req.k - undefined.len()
                },
                ..searcher.req
            },
            ..searcher
        };
        rest.run().await?
    } else {
        KnnAnswer {
            stats: searcher.counters.stats(),
            ..KnnAnswer::default()
        }
    };
    // An exact fallback scores every row, so it may return some of them again (last).
    let seen: std::collections::HashSet<u64> = undefined.iter().copied().collect();
    answer.candidates.retain(|c| !seen.contains(&c.addr));
    answer.candidates.splice(
        0..0,
        undefined.into_iter().map(|addr| Candidate {
            key: f32::NEG_INFINITY,
            addr,
        }),
    );
    answer.candidates.truncate(req.k);
    Ok(answer)
}

impl Searcher<'_> {
    async fn run(self) -> Result<KnnAnswer> {
        let k = self.req.k;
        let all = &self.req.snapshot.manifest.fragments;
        let sliced = self.scope.as_ref().is_some_and(|s| s.slice().is_some());
        let qualifying = match (self.req.mask, &self.scope) {
            (Some(m), _) => m.len(),
            (None, Some(scope)) if !sliced => scope.rows.live_rows(all, &self.deletions),
            (None, _) => self.req.snapshot.manifest.live_rows(),
        };
        let mut vectors = HashMap::new();
        let mut exact_mask = false;
        let candidates = match (self.req.mask, self.req.index) {
            (Some(mask), _) if qualifying <= EXACT_MASK_ROWS.max(k as u64) => {
                // Few qualifying rows: score exactly them.
                exact_mask = true;
                let addrs: Vec<u64> = match &self.scope {
                    // A sliced share scores its slice of the whole table's masked rows.
                    Some(scope) if sliced => scope.rows.restrict(mask).iter().collect(),
                    _ => mask.iter().collect(),
                };
                let mut top = TopK::new(k);
                for c in self.score_addresses(&addrs).await? {
                    top.push(c);
                }
                top.into_sorted()
            }
            (_, None) => self.brute_force_scope().await?,
            (_, Some(index)) => {
                let (found, found_vectors, found_anywhere) = self.indexed(index).await?;
                vectors = found_vectors;
                // What the single machine found (a sliced share found only its slice).
                let found_anywhere = found_anywhere.unwrap_or(found.len() as u64);
                if found_anywhere < k as u64 && found_anywhere < qualifying {
                    // Rows the index cannot return (NULL vectors) would be in the exact answer.
                    Counters::add(&self.counters.exact_fallbacks, 1);
                    vectors.clear();
                    self.brute_force_scope().await?
                } else {
                    found
                }
            }
        };
        let mut stats = self.counters.stats();
        stats.exact_mask = exact_mask;
        Ok(KnnAnswer {
            candidates,
            vectors,
            stats,
        })
    }

    /// Exact top-k over every row the search answers for: the whole table, or the share's
    /// rows.
    pub(super) async fn brute_force_scope(&self) -> Result<Vec<Candidate>> {
        let all = self.req.snapshot.manifest.fragments.iter();
        match &self.scope {
            None => {
                self.brute_force(&all.collect::<Vec<_>>(), &HashMap::new())
                    .await
            }
            Some(scope) => {
                let mine: Vec<&crate::format::Fragment> =
                    all.filter(|f| scope.rows.contains_fragment(f.id)).collect();
                self.brute_force(&mine, &scope.rows.skipped(mine.iter().copied()))
                    .await
            }
        }
    }
}

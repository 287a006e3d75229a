//! The indexed path: each segment searched under its ownership mask, then brute force over
//! the fragments no segment owns, merged into one top-k.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use roaring::RoaringBitmap;

use super::exact::Bounds;
use super::{Counters, Scope, Searcher, Slice};
use crate::format::Fragment;
use crate::format::index_meta::IndexDef;
use crate::format::index_meta::IndexSegment;
use crate::index::cache::{Probed, Translation};
use crate::index::error::{IndexError, Result};
use crate::index::ivf::IvfModel;
use crate::index::row_centroids::QueryBound;
use crate::index::row_mask::MaskCursor;
use crate::index::search::{
    Candidate, RowMask, SearchStats, TopK, Verdict, score_flat, score_partitions, score_pq,
};
use crate::index::segment::{Footer, Partition};
use crate::ledger::ids::split_row_address;
use crate::ledger::{Coverage, LedgerView, SegmentOwnership};

impl Searcher<'_> {
    fn record(&self, s: &SearchStats) {
        let c = &self.counters;
        Counters::add(&c.partitions_probed, s.partitions_probed);
        Counters::add(&c.rows_scored, s.rows_scored);
        Counters::add(&c.dropped_ownership, s.dropped_ownership);
        Counters::add(&c.dropped_deleted, s.dropped_deleted);
        Counters::add(&c.dropped_filter, s.dropped_filter);
        Counters::add(&c.skipped_by_bound, s.skipped_by_bound);
    }

    /// Index search plus brute force over fragments no segment owns.
    /// Returns the candidates, for IVF_FLAT the vectors of those found in segments, and for
    /// a sliced share how many rows the single machine's search finds (at most `k`; see
    /// [`super::share`]).
    pub(super) async fn indexed(
        &self,
        index: &IndexDef,
    ) -> Result<(Vec<Candidate>, HashMap<u64, Vec<f32>>, Option<u64>)> {
        let req = &self.req;
        let mask_rows = req.mask;
        let snapshot = req.snapshot;
        let manifest = &snapshot.manifest;
        let dir = &snapshot.dir;
        let k = req.k;
        // The model and the searched segments' footers are independent reads: sent together
        // (the footers are checked against the model below, when each segment is searched).
        let footers = manifest
            .segments_of(&index.name)
            .filter(|s| {
                self.scope
                    .as_ref()
                    .is_none_or(|sc| sc.segments.contains(&s.id))
            })
            .map(|s| self.cache.footer(dir, &s.file, s.size_bytes));
        let (model, footers) = futures::join!(
            self.cache.model(dir, index),
            futures::future::try_join_all(footers)
        );
        // A damaged model is reported before a damaged footer, whichever read ended first.
        let model = model?;
        footers?;
        if model.dim != req.vector.len() {
            return Err(IndexError::DimensionMismatch {
                query: req.vector.len(),
                column: req.column.to_string(),
                column_dim: model.dim,
            });
        }
        let Some(prepared) = model.prepare(req.vector) else {
            // A zero query vector under cosine has no nearest rows; every distance is NULL.
            return Ok((self.brute_force_scope().await?, HashMap::new(), None));
        };
        let current: HashSet<u64> = manifest.fragments.iter().map(|f| f.id).collect();
        let deletions = &self.deletions;
        let pq_width = model.pq.as_ref().map(|pq| pq.sub_vectors);
        let table = model
            .pq
            .as_ref()
            .map(|pq| pq.distance_table(&prepared, req.metric));
        // IVF_PQ keeps more candidates to re-rank; IVF_SQ rules rows out exactly.
        let keep = if pq_width.is_some() {
            k.saturating_mul(req.refine_factor)
        } else {
            k
        };
        let probe_order = model.probe_order_from(&prepared, req.nprobes);
        let mut global = TopK::new(keep);
        // Ownership in current fragment ids: rewrites recorded in the ledger moved rows of
        // the segments' fragments, and ownership follows them.
        let view = self.cache.ledger(dir, manifest).await?;
        let owners = self
            .cache
            .ownerships(dir, manifest, &view, &index.name)
            .await?;
        let mut owned_anywhere: HashSet<u64> = HashSet::new();
        let mut covered_rows: HashMap<u64, RoaringBitmap> = HashMap::new();
        let mut vectors: HashMap<u64, Vec<f32>> = HashMap::new();
        // What every segment owns decides which rows are unowned, also in a share that
        // searches only some segments.
        for segment in manifest.segments_of(&index.name) {
            for (f, coverage) in &owners[&segment.id].fragments {
                match coverage {
                    Coverage::Whole => {
                        owned_anywhere.insert(*f);
                    }
                    Coverage::Rows(rows) => *covered_rows.entry(*f).or_default() |= rows,
                }
            }
        }
        let searched: Vec<_> = manifest
            .segments_of(&index.name)
            .filter(|s| {
                self.scope
                    .as_ref()
                    .is_none_or(|sc| sc.segments.contains(&s.id))
            })
            .collect();
        // Every segment probes its first `nprobes` partitions whatever it finds, in groups of
        // bounded bytes (one group unless the probes are many, as in an exact search): the
        // footers, then the first group of every segment, are read together (one round trip
        // each on object storage, instead of one per segment and per partition).
        let first = probe_order.first();
        let exhaustive = probe_order.is_exhaustive();
        // A sliced share scores its slice of them (and counts the others' rows when its own
        // are too few to decide, as the single machine decides, whether to probe further).
        let slice = self.scope.as_ref().and_then(Scope::slice);
        let mine: Vec<usize> = first
            .iter()
            .copied()
            .filter(|p| slice.is_none_or(|sl| sl.has_partition(*p)))
            .collect();
        // Rows the single machine's search finds in the segments, while below `keep`
        // (a sliced share's count; `None` once some segment found `keep`).
        let mut found_in_segments = Some(0u64);
        let group_bytes = probe_group_bytes(self.cache.budget());
        let reading: Vec<_> = searched
            .iter()
            .filter(|s| !owners[&s.id].fragments.is_empty())
            .copied()
            .collect();
        let footers = futures::future::try_join_all(
            reading
                .iter()
                .map(|s| self.cache.segment_footer(dir, s, &model)),
        )
        .await?;
        let plans: HashMap<u64, ProbePlan> = reading
            .iter()
            .zip(&footers)
            .map(|(segment, footer)| {
                let plan = ProbePlan {
                    groups: footer.probe_groups(&mine, group_bytes),
                    translated: segment.fragment_bitmap.iter().any(|f| view.consumes(*f)),
                    // A scan of every partition of a segment larger than the budget would
                    // evict what repeated queries use and gain nothing: it is not kept.
                    admit: !exhaustive || footer.data_bytes() <= self.cache.budget() as u64,
                };
                (segment.id, plan)
            })
            .collect();
        let mut prefetched: HashMap<u64, Vec<Probed>> =
            futures::future::try_join_all(reading.iter().zip(&footers).map(|(segment, footer)| {
                let plan = &plans[&segment.id];
                let ps = plan.groups.first().map_or(&[][..], |g| &mine[g.clone()]);
                let ownership = &owners[&segment.id];
                let probe = SegmentProbe {
                    segment,
                    footer,
                    model: &model,
                    plan,
                    view: &view,
                    ownership,
                };
                async move {
                    let parts = self.read_probed(&probe, ps).await?;
                    Ok::<_, IndexError>((segment.id, parts))
                }
            }))
            .await?
            .into_iter()
            .collect();
        let mut footers: HashMap<u64, _> = reading.iter().map(|s| s.id).zip(footers).collect();
        for segment in searched {
            Counters::add(&self.counters.segments_searched, 1);
            let ownership = &owners[&segment.id];
            if ownership.fragments.is_empty() {
                continue;
            }
            let plan = &plans[&segment.id];
            // Translated partitions hold only rows the segment owns, at current addresses.
            let translated = plan.translated;
            let fast = mask_rows.is_none()
                && ownership
                    .fragments
                    .keys()
                    .all(|f| !deletions.contains_key(f))
                && (translated
                    || (segment.invalidated_fragments.is_empty()
                        && segment.fragment_bitmap.iter().all(|f| current.contains(f))));
            let mask = (!fast).then(|| RowMask {
                owned: ownership.fragments.keys().copied().collect(), // a BTreeMap: ascending
                deletions: Some(deletions),
                allowed: mask_rows,
            });
            let footer = footers.remove(&segment.id).expect("read above");
            let probe = SegmentProbe {
                segment,
                footer: &footer,
                model: &model,
                plan,
                view: &view,
                ownership,
            };
            let score = |part: &Partition, top: &mut TopK, stats: &mut SearchStats| match (
                &table, pq_width,
            ) {
                (Some(t), Some(w)) => score_pq(part, w, t, mask.as_ref(), top, stats),
                _ => score_flat(
                    part,
                    model.dim,
                    req.vector,
                    req.metric,
                    mask.as_ref(),
                    top,
                    stats,
                ),
            };
            // The first `nprobes` partitions are always scored, group by group: each group
            // together, on every core when it is large enough. For IVF_FLAT, the vectors of
            // each group's best rows are kept (a group is dropped once scored).
            let mut stats = SearchStats::default();
            let seed = match slice {
                Some(slice) => {
                    self.seed_bound(&probe, slice, first, mask.as_ref(), keep, &score)
                        .await?
                }
                None => None,
            };
            let mut top = TopK::below(keep, seed);
            let mut best_vectors: HashMap<u64, Vec<f32>> = HashMap::new();
            for (g, group) in plan.groups.iter().enumerate() {
                let ps = &mine[group.clone()];
                let probed = match prefetched.remove(&segment.id).filter(|_| g == 0) {
                    Some(probed) => probed,
                    None => self.read_probed(&probe, ps).await?,
                };
                let parts = self
                    .resolve(
                        segment,
                        model.sq.is_some(),
                        &footer,
                        ps,
                        probed,
                        mask.as_ref(),
                        keep,
                        top.bound(),
                        &score,
                        &mut stats,
                    )
                    .await?;
                let (group_top, group_stats) = score_partitions(
                    &parts,
                    keep,
                    top.limit(),
                    pq_width.unwrap_or(model.dim),
                    score,
                );
                stats.add(&group_stats);
                let group_best = group_top.into_sorted();
                if pq_width.is_none() {
                    keep_vectors(&parts, model.dim, &group_best, &mut best_vectors);
                }
                for c in group_best {
                    top.push(c);
                }
            }
            // Then further partitions, one at a time, only while fewer than `keep` rows
            // were found. A sliced share whose slice found fewer counts the rows the other
            // slices find (reading their partitions' addresses, not kept in the cache), and
            // probes on while the single machine would, scoring only its own partitions.
            let mut found = match slice {
                // The nearest partition alone held `keep` rows the single machine admits.
                Some(_) if seed.is_some() => keep as u64,
                Some(slice) if !top.is_full() => {
                    let others: Vec<usize> = first
                        .iter()
                        .copied()
                        .filter(|p| !slice.has_partition(*p))
                        .collect();
                    top.len() as u64 + self.count_rows(&probe, &others, mask.as_ref()).await?
                }
                _ => top.len() as u64,
            };
            let mut probed_parts = Vec::new();
            // The rest of the order is only sorted when a segment probes past `nprobes`.
            let rest: &[usize] = if found < keep as u64 {
                probe_order.rest()
            } else {
                &[]
            };
            for &p in rest {
                if found >= keep as u64 {
                    break;
                }
                if slice.is_some_and(|sl| !sl.has_partition(p)) {
                    found += self.count_rows(&probe, &[p], mask.as_ref()).await?;
                    continue;
                }
                let before = top.len();
                let probed = self.read_probed(&probe, &[p]).await?;
                let part = self
                    .resolve(
                        segment,
                        model.sq.is_some(),
                        &footer,
                        &[p],
                        probed,
                        mask.as_ref(),
                        keep,
                        top.bound(),
                        &score,
                        &mut stats,
                    )
                    .await?
                    .pop()
                    .expect("one partition read per partition asked");
                score(&part, &mut top, &mut stats);
                // Below `keep`, every admitted row enters the top.
                found += (top.len() - before) as u64;
                probed_parts.push(part);
            }
            found_in_segments = found_in_segments
                .map(|n| n + found)
                .filter(|_| found < keep as u64);
            self.record(&stats);
            let local = top.into_sorted();
            if pq_width.is_none() {
                // These rows passed this segment's mask, so its vectors are their current
                // values: keep them, and the rows need not be read from Parquet again.
                keep_vectors(&probed_parts, model.dim, &local, &mut best_vectors);
                for c in &local {
                    if let Some(v) = best_vectors.remove(&c.addr) {
                        vectors.insert(c.addr, v);
                    }
                }
            }
            for c in local {
                global.push(c);
            }
        }
        let mut candidates = global.into_sorted();
        if pq_width.is_some() {
            // Re-rank the PQ candidates with exact distances of their current vectors.
            let addrs: Vec<u64> = candidates.iter().map(|c| c.addr).collect();
            let mut top = TopK::new(k);
            for c in self.score_addresses(&addrs).await? {
                top.push(c);
            }
            candidates = top.into_sorted();
        }
        // Borrowed, not cloned: on a live table these are hundreds of small fragments, and
        // cloning their descriptions on every query was 6% of a server's CPU under `perf`.
        let unindexed: Vec<&Fragment> = manifest
            .fragments
            .iter()
            .filter(|f| !owned_anywhere.contains(&f.id))
            .filter(|f| {
                self.scope
                    .as_ref()
                    .is_none_or(|sc| sc.fragments.contains(&f.id))
            })
            .collect();
        // What the single machine finds: at least `k` once a segment found `keep`, else the
        // segments' rows plus every qualifying unowned row (brute force scores them all).
        let found_anywhere = match (slice, found_in_segments) {
            (None, _) => None,
            (Some(_), None) => Some(k as u64),
            (Some(_), Some(n)) => {
                let mut unowned = 0u64;
                for f in &unindexed {
                    unowned += self
                        .scorable(f, &covered_rows)?
                        .iter()
                        .map(|r| u64::from(r.end - r.start))
                        .sum::<u64>();
                }
                Some((n.min(keep as u64) + unowned).min(k as u64))
            }
        };
        // A sliced share scores the unowned rows at its offsets.
        let skipped = match slice {
            None => covered_rows,
            Some(slice) => unindexed
                .iter()
                .map(|f| {
                    let mut skip = slice.others(f.physical_rows);
                    if let Some(covered) = covered_rows.get(&f.id) {
                        skip |= covered;
                    }
                    (f.id, skip)
                })
                .collect(),
        };
        if !unindexed.is_empty() {
            Counters::add(
                &self.counters.unindexed_rows,
                unindexed
                    .iter()
                    .map(|f| {
                        let covered = skipped.get(&f.id).map_or(0, |r| r.len());
                        f.live_rows().saturating_sub(covered) as usize
                    })
                    .sum(),
            );
            // Unindexed rows enter only below the index's k-th best, and their centroid
            // bounds rule most of them out unscored (the same model's centroids).
            let ceiling = (candidates.len() >= k).then(|| candidates[k - 1]);
            let bounds = QueryBound::new(model.metric, probe_order.centroid_keys(), model.dim)
                .filter(|_| model.metric == req.metric)
                .map(|query| Bounds {
                    model: &model,
                    query,
                });
            let unindexed_best = self
                .brute_force_below(&unindexed, &skipped, ceiling, bounds.as_ref())
                .await?;
            let mut top = TopK::new(k);
            for c in candidates.into_iter().chain(unindexed_best) {
                top.push(c);
            }
            candidates = top.into_sorted();
        }
        // Rows whose distance is undefined (zero vectors under cosine) rank after all others;
        // only keep them if there is room, exactly like `NULLS LAST`.
        candidates.truncate(k);
        if pq_width.is_none() {
            // Winners from unindexed fragments: their current vectors are in the cached
            // columns brute force scored, so fetching the answer needs no Parquet read.
            for c in &candidates {
                if vectors.contains_key(&c.addr) {
                    continue;
                }
                let (frag, offset) = split_row_address(c.addr);
                if let Some(fragment) = unindexed.iter().find(|f| f.id == frag)
                    && let Some(v) = self.cached_row_vector(fragment, offset)
                {
                    vectors.insert(c.addr, v);
                }
            }
        }
        Ok((candidates, vectors, found_anywhere))
    }
}

/// Bytes of partitions a search holds at a time per segment when it probes many (an exact
/// search probes all): a quarter of the cache budget, within 64 KiB–64 MiB. Groups this large
/// keep both cores busy; their reads are coalesced and sent together.
fn probe_group_bytes(budget: usize) -> u64 {
    (budget as u64 / 4).clamp(64 << 10, 64 << 20)
}

/// What reading one segment's partitions takes: the segment, its footer, the model, how its
/// probes are read, the ledger view and the segment's ownership.
#[derive(Clone, Copy)]
struct SegmentProbe<'a> {
    segment: &'a IndexSegment,
    footer: &'a Footer,
    model: &'a IvfModel,
    plan: &'a ProbePlan,
    view: &'a LedgerView,
    ownership: &'a SegmentOwnership,
}

/// How one segment's probes are read: in which groups, through the ledger or not, and
/// whether the partitions read are kept in the cache.
struct ProbePlan {
    groups: Vec<std::ops::Range<usize>>,
    translated: bool,
    admit: bool,
}

/// Copies into `out` the vectors of `wanted`'s rows found in flat partitions `parts`. This
/// looks at every probed address (an exact search: every indexed row), so each is first
/// tested against a 1024-bit filter of the ≤ `keep` wanted addresses (one shift and mask;
/// about 1% pass with k = 10), and only those are looked up in the sorted list.
fn keep_vectors(
    parts: &[Arc<Partition>],
    dim: usize,
    wanted: &[Candidate],
    out: &mut HashMap<u64, Vec<f32>>,
) {
    let mut wanted: Vec<u64> = wanted.iter().map(|c| c.addr).collect();
    wanted.sort_unstable();
    // Offsets within a fragment vary in the low bits, fragment ids in the high ones.
    let slot = |addr: u64| ((addr ^ (addr >> 32)) & 1023) as usize;
    let mut filter = [0u64; 16];
    for &a in &wanted {
        filter[slot(a) >> 6] |= 1 << (slot(a) & 63);
    }
    for part in parts {
        for (i, addr) in part.addrs.iter().enumerate() {
            let s = slot(*addr);
            if (filter[s >> 6] >> (s & 63)) & 1 == 1 && wanted.binary_search(addr).is_ok() {
                out.insert(*addr, part.vectors[i * dim..(i + 1) * dim].to_vec());
            }
        }
    }
}

impl Searcher<'_> {
    /// A sliced share's starting ceiling in one segment: the `keep`-th best row of the
    /// nearest probed partition, when another slice holds it and it has `keep` rows the
    /// mask admits.
    ///
    /// A slice sees only its own partitions, so without it a share's top-k fills from
    /// partitions farther than the nearest and rules out fewer rows than the single machine:
    /// two slices looked at 1.6× the rows of one machine at nprobes 16 (148.5 K against
    /// 93.5 K, 2M × 32, 256 partitions). Exact: `keep` rows the single machine scores come
    /// before every row above the ceiling, so no such row is in its answer; the nearest
    /// partition's rows stay its own slice's to return. The partition is read as the
    /// share's own are (kept in the cache when they are), so a worker also caches the
    /// partitions nearest to the queries it serves.
    async fn seed_bound<F>(
        &self,
        probe: &SegmentProbe<'_>,
        slice: Slice,
        first: &[usize],
        mask: Option<&RowMask<'_>>,
        keep: usize,
        score: &F,
    ) -> Result<Option<Candidate>>
    where
        F: Fn(&Partition, &mut TopK, &mut SearchStats),
    {
        let Some(&nearest) = first.first() else {
            return Ok(None);
        };
        if slice.has_partition(nearest) {
            return Ok(None);
        }
        let mut stats = SearchStats::default();
        let probed = self.read_probed(probe, &[nearest]).await?;
        let mut seed = TopK::new(keep);
        let parts = self
            .resolve(
                probe.segment,
                probe.model.sq.is_some(),
                probe.footer,
                &[nearest],
                probed,
                mask,
                keep,
                seed.bound(),
                score,
                &mut stats,
            )
            .await?;
        for part in &parts {
            score(part, &mut seed, &mut stats);
        }
        Counters::add(
            &self.counters.seen_for_slice_bound,
            parts.iter().map(|p| p.len()).sum(),
        );
        Ok(seed.worst())
    }

    /// How many rows of partitions `ps` of `segment` pass `mask` (all rows without one): what
    /// scoring them would add to a top that is not full. Read as a search reads them, but not
    /// kept in the cache (they are another slice's).
    async fn count_rows(
        &self,
        probe: &SegmentProbe<'_>,
        ps: &[usize],
        mask: Option<&RowMask<'_>>,
    ) -> Result<u64> {
        if ps.is_empty() {
            return Ok(0);
        }
        let plan = ProbePlan {
            groups: Vec::new(),
            admit: false,
            ..*probe.plan
        };
        let probed = self
            .read_probed(
                &SegmentProbe {
                    plan: &plan,
                    ..*probe
                },
                ps,
            )
            .await?;
        let counted: usize = probed
            .iter()
            .map(|p| match p {
                Probed::Floats(part) => part.addrs.len(),
                Probed::Sketch(sketch) => sketch.addrs.len(),
            })
            .sum();
        Counters::add(&self.counters.counted_for_slices, counted);
        let admitted = |addrs: &[u64]| match mask {
            None => addrs.len() as u64,
            Some(m) => {
                let mut cursor = MaskCursor::new(m);
                addrs
                    .iter()
                    .filter(|a| cursor.verdict(**a) == Verdict::Keep)
                    .count() as u64
            }
        };
        Ok(probed
            .iter()
            .map(|p| match p {
                Probed::Floats(part) => admitted(&part.addrs),
                Probed::Sketch(sketch) => admitted(&sketch.addrs),
            })
            .sum())
    }

    /// Partitions `ps` of `segment` as a search scores them: translated through the ledger
    /// when rewrites moved the segment's rows, else as stored: floats or sketches, as the
    /// cache keeps them ([`crate::index::cache::IndexCache::probe`]; floats kept per `plan`).
    /// IVF_SQ partitions are always sketches.
    async fn read_probed(&self, probe: &SegmentProbe<'_>, ps: &[usize]) -> Result<Vec<Probed>> {
        let SegmentProbe {
            segment,
            footer,
            model,
            plan,
            view,
            ownership,
        } = *probe;
        let dir = &self.req.snapshot.dir;
        let pq = model.coded();
        if let Some(grid) = &model.sq {
            if !plan.translated {
                let sketches = self
                    .cache
                    .sq_sketches(dir, &segment.file, footer, ps, grid, plan.admit)
                    .await?;
                return Ok(sketches.into_iter().map(Probed::Sketch).collect());
            }
            let translation = Translation { view, ownership };
            let sketches = self
                .cache
                .translated_sq_sketches(dir, segment, footer, ps, grid, translation)
                .await?;
            return Ok(sketches.into_iter().map(Probed::Sketch).collect());
        }
        if plan.translated {
            let parts = self
                .cache
                .translated_partitions(
                    dir,
                    segment,
                    footer,
                    ps,
                    pq,
                    Translation { view, ownership },
                )
                .await?;
            Ok(parts.into_iter().map(Probed::Floats).collect())
        } else {
            self.cache
                .probe(dir, &segment.file, footer, ps, pq, plan.admit)
                .await
        }
    }
}

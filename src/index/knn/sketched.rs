//! Turning probed partitions the cache keeps as sketches into float partitions a search
//! scores: the rows their codes cannot rule out, read from the segment file by row
//! ([`crate::index::sketch::Refine`] decides which; [`crate::index::segment::read_rows`]
//! reads and checks them).

use std::sync::Arc;

use super::Searcher;
use crate::format::index_meta::IndexSegment;
use crate::index::cache::Probed;
use crate::index::error::Result;
use crate::index::search::{RowMask, SearchStats, TopK};
use crate::index::segment::{self, Footer, Partition, RowAt};
use crate::index::sketch::{Refine, RowRef, Sketch};

impl Searcher<'_> {
    /// Partitions `ps` of `segment`, probed as `probed`, as float partitions to score with
    /// `score` into a top-`keep` whose k-th key is `bound` so far (a NaN while not full):
    /// floats as they are, sketches refined into the rows that may enter (their drops and
    /// skipped rows counted in `stats`). Scoring the result answers what scoring every row
    /// of every partition answers.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn resolve<F>(
        &self,
        segment: &IndexSegment,
        footer: &Footer,
        ps: &[usize],
        probed: Vec<Probed>,
        mask: Option<&RowMask<'_>>,
        keep: usize,
        bound: f32,
        score: &F,
        stats: &mut SearchStats,
    ) -> Result<Vec<Arc<Partition>>>
    where
        F: Fn(&Partition, &mut TopK, &mut SearchStats),
    {
        let mut parts = Vec::with_capacity(probed.len());
        let mut sketches: Vec<Arc<Sketch>> = Vec::new();
        let mut partition_of = Vec::new();
        for (probed, &p) in probed.into_iter().zip(ps) {
            match probed {
                Probed::Floats(part) => parts.push(part),
                Probed::Sketch(sketch) => {
                    sketches.push(sketch);
                    partition_of.push(p);
                }
            }
        }
        if sketches.is_empty() {
            return Ok(parts);
        }
        let dir = &self.req.snapshot.dir;
        let dim = footer.row_width / 4;
        let rows_at = |refs: &[RowRef]| -> Vec<RowAt> {
            refs.iter()
                .map(|r| RowAt {
                    partition: partition_of[r.sketch as usize],
                    row: r.row,
                    crc: sketches[r.sketch as usize].row_sums[r.row as usize],
                })
                .collect()
        };
        let (q, metric) = (self.req.vector, self.req.metric);
        let mut refine = Refine::new(&sketches, dim, q, metric, mask, keep, bound);
        let first = refine.first();
        let floats = segment::read_rows(dir, &segment.file, footer, &rows_at(&first)).await?;
        let second = refine.second(&first, &floats, score);
        let floats = segment::read_rows(dir, &segment.file, footer, &rows_at(&second)).await?;
        let (read, refined) = refine.finish(&second, &floats);
        stats.add(&refined);
        parts.extend(read);
        Ok(parts)
    }
}

//! Turning probed partitions the cache keeps as sketches into float partitions a search
//! scores: the rows their codes cannot rule out ([`crate::index::sketch::Refine`] decides
//! which), read by row from the segment file ([`crate::index::segment::read_rows`] reads and
//! checks them) or, for IVF_SQ, whose segments hold no floats, from the table's data files
//! by row address, each checked against the checksum the segment recorded.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float32Type, Schema};

use super::Searcher;
use crate::format::FormatError;
use crate::format::index_meta::IndexSegment;
use crate::index::cache::Probed;
use crate::index::error::Result;
use crate::index::search::{RowMask, SearchStats, TopK};
use crate::index::segment::{self, Footer, Partition, RowAt};
use crate::index::sketch::{Refine, RowRef, Sketch};
use crate::index::sq;
use crate::ledger::ids::row_address;

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
        from_table: bool,
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
        let dim = self.req.vector.len();
        let rows_at = |refs: &[RowRef]| -> Vec<RowAt> {
            refs.iter()
                .map(|r| RowAt {
                    partition: partition_of[r.sketch as usize],
                    row: r.row,
                    crc: sketches[r.sketch as usize].row_sums[r.row as usize],
                })
                .collect()
        };
        let read = async |refs: &[RowRef]| -> Result<Vec<f32>> {
            if from_table {
                self.table_floats(segment, &sketches, refs).await
            } else {
                Ok(segment::read_rows(dir, &segment.file, footer, &rows_at(refs)).await?)
            }
        };
        let (q, metric) = (self.req.vector, self.req.metric);
        let mut refine = Refine::new(&sketches, dim, q, metric, mask, keep, bound);
        let first = refine.first();
        let floats = read(&first).await?;
        let second = refine.second(&first, &floats, score);
        let floats = read(&second).await?;
        let (read, refined) = refine.finish(&second, &floats);
        stats.add(&refined);
        parts.extend(read);
        Ok(parts)
    }

    /// The floats of rows `refs` of `sketches` (IVF_SQ partitions of `segment`), in that
    /// order, from the table's data files: whole vector columns the cache already holds,
    /// else only the rows asked for ([`super::rows::RowReader::read_rows`]: the fragments
    /// read concurrently, each for the pages holding its rows). Each row is checked against
    /// the checksum the segment recorded: an address that no longer holds the vector the
    /// segment coded is an error naming both, never a wrong distance.
    async fn table_floats(
        &self,
        segment: &IndexSegment,
        sketches: &[Arc<Sketch>],
        refs: &[RowRef],
    ) -> Result<Vec<f32>> {
        let dim = self.req.vector.len();
        let snapshot = self.req.snapshot;
        let addrs: Vec<u64> = refs
            .iter()
            .map(|r| sketches[r.sketch as usize].addrs[r.row as usize])
            .collect();
        let mut found: HashMap<u64, Vec<f32>> = HashMap::with_capacity(addrs.len());
        let mut missing = Vec::new();
        for &addr in &addrs {
            let (frag, offset) = crate::ledger::ids::split_row_address(addr);
            let cached = snapshot
                .manifest
                .fragments
                .iter()
                .find(|f| f.id == frag)
                .and_then(|f| self.cached_row_vector(f, offset));
            match cached {
                Some(v) => {
                    found.insert(addr, v);
                }
                None => missing.push(addr),
            }
        }
        if !missing.is_empty() {
            let field = snapshot.schema.field_with_name(self.req.column)?.clone();
            let schema = Arc::new(Schema::new(vec![field]));
            for (fragment, offsets, batch) in self.rows().read_rows(&missing, schema).await? {
                let list = batch.column(0).as_fixed_size_list();
                let values = list.values().as_primitive::<Float32Type>().values();
                let width = list.value_length() as usize;
                for (i, o) in offsets.iter().enumerate() {
                    let addr = row_address(fragment.id, *o);
                    if width != dim || !list.is_valid(i) {
                        return Err(self.mismatch(
                            segment,
                            addr,
                            "holds no vector of its dimension",
                        ));
                    }
                    found.insert(addr, values[i * width..(i + 1) * width].to_vec());
                }
            }
        }
        let mut out = Vec::with_capacity(refs.len() * dim);
        for (r, addr) in refs.iter().zip(&addrs) {
            let v = found
                .get(addr)
                .ok_or_else(|| self.mismatch(segment, *addr, "was not read"))?;
            if sq::row_sum(v) != sketches[r.sketch as usize].row_sums[r.row as usize] {
                return Err(self.mismatch(
                    segment,
                    *addr,
                    "holds another vector than the one indexed",
                ));
            }
            out.extend_from_slice(v);
        }
        Ok(out)
    }

    fn mismatch(
        &self,
        segment: &IndexSegment,
        addr: u64,
        what: &str,
    ) -> crate::index::error::IndexError {
        let (frag, offset) = crate::ledger::ids::split_row_address(addr);
        FormatError::corrupt(
            self.req.snapshot.dir.path(&segment.file),
            format!("IVF_SQ segment: row {offset} of fragment {frag} {what}"),
        )
        .into()
    }
}

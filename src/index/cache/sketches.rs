//! Which form the cache keeps a segment's partitions in, and probing them in that form.
//!
//! Floats (with their quantized rows) are fastest: nothing is read per query. When a
//! segment's floats do not fit the budget with an eighth free, keeping some of them means
//! each query reads most of what it probes from the file again (at 1M × 768 with a 1 GiB
//! budget, two thirds of 48 MB per query at nprobes 16). Its sketches ([`Sketch`]: about a
//! quarter of the bytes) may fit: the cache then keeps sketches only, and a query reads the
//! floats of the few rows their codes cannot rule out ([`crate::index::sketch::Refine`]).
//! When neither fits, partitions are kept as floats while they fit (as for any entry).
//!
//! The choice is made per segment from its footer against the whole budget, so several
//! large segments may still evict each other's sketches; every entry stays exact either way.

use std::sync::Arc;

use super::{Entry, IndexCache, Key, Translation};
use crate::format::index_meta::IndexSegment;
use crate::format::{FormatError, TableDir};
use crate::index::error::IndexError;
use crate::index::error::Result;
use crate::index::parallel;
use crate::index::quantized::{MIN_DIM, QuantizedRows};
use crate::index::segment::{self, Footer, Partition};
use crate::index::sketch::Sketch;
use crate::index::sq::ScalarGrid;

/// A probed partition as the cache gives it.
#[derive(Debug, Clone)]
pub enum Probed {
    /// The partition's floats (kept, or just read).
    Floats(Arc<Partition>),
    /// The partition's sketch: its floats are read by row when needed.
    Sketch(Arc<Sketch>),
}

impl IndexCache {
    /// Whether the partitions of the segment `footer` describes are kept as sketches: an
    /// IVF_FLAT segment of at least [`MIN_DIM`] dimensions whose floats and quantized rows
    /// do not fit the budget with an eighth of it free, while its sketches do.
    pub fn keeps_sketches(&self, footer: &Footer, pq: bool) -> bool {
        let budget = self.budget() as u64;
        let room = budget - budget / 8;
        let dim = footer.row_width / 4;
        let rows = footer.rows();
        !pq && footer.row_width.is_multiple_of(4)
            && dim >= MIN_DIM
            && footer
                .data_bytes()
                .saturating_add(QuantizedRows::estimated_bytes(rows, dim))
                > room
            && Sketch::estimated_bytes(rows, dim) <= room
    }

    /// Partitions `ps` of a segment file in the form the cache keeps them
    /// ([`Self::keeps_sketches`]): floats as [`Self::partitions`] gives them (kept when
    /// `admit`), or sketches. A partition kept neither way is read whole; its sketch is
    /// kept and its floats are given to this query.
    pub async fn probe(
        &self,
        dir: &TableDir,
        file: &str,
        footer: &Footer,
        ps: &[usize],
        pq: bool,
        admit: bool,
    ) -> Result<Vec<Probed>> {
        if !self.keeps_sketches(footer, pq) {
            let parts = self.partitions(dir, file, footer, ps, pq, admit).await?;
            return Ok(parts.into_iter().map(Probed::Floats).collect());
        }
        let name = format!("{}/{file}", dir.name());
        let floats_key = |partition| Key::Partition {
            file: name.clone(),
            partition,
        };
        let sketch_key = |partition| Key::Sketch {
            file: name.clone(),
            partition,
        };
        // Floats kept before the budget changed are still the fastest form.
        let mut found: Vec<Option<Probed>> = ps
            .iter()
            .map(|&p| match self.get(&floats_key(p)) {
                Some(Entry::Partition(hit)) => Some(Probed::Floats(hit)),
                _ => match self.get(&sketch_key(p)) {
                    Some(Entry::Sketch(hit)) => Some(Probed::Sketch(hit)),
                    _ => None,
                },
            })
            .collect();
        let missing: Vec<usize> = ps
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(&p, _)| p)
            .collect();
        if missing.is_empty() {
            return Ok(found.into_iter().flatten().collect());
        }
        let read = segment::read_partitions(dir, file, footer, &missing, pq).await?;
        let sketches = sketch_all(&read, footer.row_width / 4);
        let mut read = read.into_iter().zip(sketches).zip(&missing);
        for slot in found.iter_mut().filter(|f| f.is_none()) {
            let ((part, sketch), &p) = read.next().expect("one partition per missing one");
            let part = Arc::new(part);
            match sketch {
                Some(sketch) => self.admit(sketch_key(p), Entry::Sketch(Arc::new(sketch))),
                // Empty, or rows that cannot be quantized: kept as floats, like any entry.
                None if admit => self.admit(floats_key(p), Entry::Partition(part.clone())),
                None => {}
            }
            *slot = Some(Probed::Floats(part));
        }
        Ok(found.into_iter().flatten().collect())
    }
}

impl IndexCache {
    /// Partitions `ps` of an IVF_SQ segment file as sketches (codes and bound terms decoded
    /// once per partition), kept within the budget when `admit`. These segments hold no
    /// floats: the sketch is the only form.
    pub async fn sq_sketches(
        &self,
        dir: &TableDir,
        file: &str,
        footer: &Footer,
        ps: &[usize],
        grid: &ScalarGrid,
        admit: bool,
    ) -> Result<Vec<Arc<Sketch>>> {
        let name = format!("{}/{file}", dir.name());
        let key = |partition| Key::Sketch {
            file: name.clone(),
            partition,
        };
        let (mut found, missing) = self.cached_sketches(ps, key);
        if missing.is_empty() {
            return Ok(found.into_iter().flatten().collect());
        }
        let read = segment::read_partitions(dir, file, footer, &missing, true).await?;
        let items: Vec<(usize, (usize, Partition))> =
            missing.iter().copied().zip(read).enumerate().collect();
        let threads = if items.len() > 1 {
            parallel::cores()
        } else {
            1
        };
        let mut decoded: Vec<(usize, std::result::Result<Sketch, String>)> =
            parallel::claim_each(&items, threads, Vec::new, |out, (i, (p, part))| {
                out.push((
                    *i,
                    Sketch::of_sq(&grid.coder(*p), part.addrs.clone(), &part.codes),
                ))
            })
            .into_iter()
            .flatten()
            .collect();
        decoded.sort_unstable_by_key(|(i, _)| *i);
        let mut decoded = decoded.into_iter().zip(&missing);
        for slot in found.iter_mut().filter(|f| f.is_none()) {
            let ((_, sketch), &p) = decoded.next().expect("one sketch per missing partition");
            let sketch = Arc::new(sketch.map_err(|e| FormatError::corrupt(dir.path(file), e))?);
            if admit {
                self.admit(key(p), Entry::Sketch(sketch.clone()));
            }
            *slot = Some(sketch);
        }
        Ok(found.into_iter().flatten().collect())
    }
}

impl IndexCache {
    /// The sketches of partitions `ps` kept under `key(p)` (`None` where not kept), and the
    /// partitions not kept.
    fn cached_sketches(
        &self,
        ps: &[usize],
        key: impl Fn(usize) -> Key,
    ) -> (Vec<Option<Arc<Sketch>>>, Vec<usize>) {
        let found: Vec<Option<Arc<Sketch>>> = ps
            .iter()
            .map(|&p| match self.get(&key(p)) {
                Some(Entry::Sketch(hit)) => Some(hit),
                _ => None,
            })
            .collect();
        let missing = ps
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(&p, _)| p)
            .collect();
        (found, missing)
    }

    /// Partitions `ps` of an IVF_SQ segment whose rows rewrites moved: each stored sketch
    /// ([`Self::sq_sketches`]) with its addresses translated through the ledger and the rows
    /// the segment does not own (any more) dropped, kept under the ledger state and the
    /// segment's invalidations (as translated float partitions are).
    pub async fn translated_sq_sketches(
        &self,
        dir: &TableDir,
        segment: &IndexSegment,
        footer: &Footer,
        ps: &[usize],
        grid: &ScalarGrid,
        translation: Translation<'_>,
    ) -> Result<Vec<Arc<Sketch>>> {
        let Translation { view, ownership } = translation;
        let key = |partition| Key::TranslatedSketch {
            file: format!("{}/{}", dir.name(), segment.file),
            ledger: super::segment_lineage(view, segment),
            invalidated: segment.invalidated_fragments.iter().copied().collect(),
            partition,
        };
        let (mut found, missing) = self.cached_sketches(ps, key);
        if missing.is_empty() {
            return Ok(found.into_iter().flatten().collect());
        }
        // Only the translated form is kept: the stored one is not what queries score.
        let stored = self
            .sq_sketches(dir, &segment.file, footer, &missing, grid, false)
            .await?;
        let mut stored = stored.into_iter().zip(&missing);
        for slot in found.iter_mut().filter(|f| f.is_none()) {
            let (sketch, &p) = stored.next().expect("one sketch per missing partition");
            let moved = view
                .translate(&sketch.addrs)
                .await
                .map_err(|e| IndexError::ledger(dir.name(), e))?;
            let picks: Vec<(usize, u64)> = moved
                .into_iter()
                .enumerate()
                .filter_map(|(i, a)| Some((i, a.filter(|a| ownership.covers(*a))?)))
                .collect();
            let translated = Arc::new(sketch.select(&picks));
            self.admit(key(p), Entry::Sketch(translated.clone()));
            *slot = Some(translated);
        }
        Ok(found.into_iter().flatten().collect())
    }
}

/// The sketch of each of `parts` (`None` for those that cannot be sketched), on every core
/// when they are several.
fn sketch_all(parts: &[Partition], dim: usize) -> Vec<Option<Sketch>> {
    let items: Vec<(usize, &Partition)> = parts.iter().enumerate().collect();
    let threads = if parts.len() > 1 {
        parallel::cores()
    } else {
        1
    };
    let mut made: Vec<(usize, Option<Sketch>)> =
        parallel::claim_each(&items, threads, Vec::new, |out, (i, part)| {
            out.push((*i, Sketch::of(part, dim)))
        })
        .into_iter()
        .flatten()
        .collect();
    made.sort_unstable_by_key(|(i, _)| *i);
    made.into_iter().map(|(_, s)| s).collect()
}

//! Manifests and transactions the commit modules' unit tests build on (test only).

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::rebase::apply;
use super::transaction::{IndexChange, NewFragment, NewRowIds, NewSegment, Transaction};
use crate::format::fragment_io::WrittenFragment;
use crate::format::manifest::{DataFile, Manifest, Operation, TableProperties};

pub(super) fn table(stable: bool) -> Manifest {
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
    let props = TableProperties {
        stable_row_ids: stable,
        ..Default::default()
    };
    Manifest::new_table(&schema, props, "t".into()).unwrap()
}

pub(super) fn append(rows: u64, name: &str) -> NewFragment {
    NewFragment {
        written: WrittenFragment {
            files: vec![DataFile {
                path: format!("data/{name}.parquet"),
                columns: vec!["id".into()],
                size_bytes: 10,
                footer: None,
                stats: Vec::new(),
            }],
            physical_rows: rows,
        },
        row_ids: NewRowIds::Fresh,
    }
}

pub(super) fn with_index(m: &Manifest) -> Manifest {
    use crate::format::index_meta::{IndexDef, IndexKind, Metric};
    let mut t = Transaction::new(Operation::CreateIndex, m.version);
    t.index_change = Some(IndexChange::Create {
        def: IndexDef {
            name: "i".into(),
            column: "id".into(),
            kind: IndexKind::IvfFlat,
            metric: Metric::L2,
            num_partitions: 1,
            model_file: "_indexes/i/m.model".into(),
            model_size_bytes: 1,
            created_at_version: m.version,
        },
        segments: vec![],
    });
    apply(m, &t, &BTreeMap::new(), "i".into()).unwrap()
}

pub(super) fn segment_over(fragments: &[u64]) -> NewSegment {
    NewSegment {
        file: "_indexes/i/s.seg".into(),
        size_bytes: 1,
        rows: 1,
        fragment_bitmap: fragments.iter().copied().collect(),
    }
}

//! `FragvecCodec`: fragvec's operators on the wire, as datafusion-proto's
//! `PhysicalExtensionCodec` (registered on the coordinator and on every worker).
//!
//! An encoded [`FragmentScanExec`] or [`KnnExec`] is self-contained: a worker decodes it
//! without reading the store (decoding cannot wait for IO), so it carries the database
//! location, the table, the pinned version and the manifest's bytes; the read and work
//! schemas, the projection (output columns), the pushed-down predicate (a datafusion-proto
//! `PhysicalExprNode`, bound to the work schema), the limit, the virtual columns and the
//! fragments read. A KNN node adds the query vector, k, metric, nprobes, the index (by name,
//! found in the manifest) and its share of a split search. Session options (`fragvec.*`)
//! travel with the query as a distributed option extension, not in the nodes.
//!
//! Decoding validates what it rebuilds and fails with [`DistributedError::BadPlanNode`],
//! never with a node that would read the wrong rows: the wire version, the manifest (its own
//! checks, and the version it names), schemas that agree with the table's and with each
//! other, indices in range, fragments and segments the manifest has, a known metric and index.
//!
//! `InsertExec` (and every statement that writes) runs on the coordinator only: encoding it
//! is refused with [`DistributedError::CoordinatorOnly`].

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;

use super::databases::Databases;
use super::error::DistributedError;
use crate::engine::knn::{KnnExec, KnnQuery};
use crate::engine::scan::{FragmentScanExec, ROW_ADDR, ROW_ID, ScanSpec, VirtualColumns};
use crate::format::{Manifest, Snapshot};
use crate::index::distance::Metric;
use crate::index::knn::{KnnShare, Slice};

/// The wire format of fragvec's nodes; a worker refuses another.
pub const WIRE_VERSION: u32 = 1;

/// One of fragvec's nodes.
#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    /// [`WIRE_VERSION`] of the coordinator that encoded it.
    #[prost(uint32, tag = "1")]
    pub wire_version: u32,
    /// A [`FragmentScanExec`]; exactly one of `scan` and `knn` is set.
    #[prost(message, optional, tag = "2")]
    pub scan: Option<ScanProto>,
    /// A [`KnnExec`], with the scan it reads inside; exactly one of `scan` and `knn` is set.
    #[prost(message, optional, tag = "3")]
    pub knn: Option<KnnProto>,
}

/// A [`FragmentScanExec`] (also the scan part of a [`KnnExec`]).
#[derive(Clone, PartialEq, Message)]
pub struct ScanProto {
    /// The database, as the worker knows it (see `Databases`).
    #[prost(string, tag = "1")]
    pub database: String,
    /// The table's name in that database.
    #[prost(string, tag = "2")]
    pub table: String,
    /// The table version read.
    #[prost(uint64, tag = "3")]
    pub version: u64,
    /// The manifest of `version`, as stored.
    #[prost(bytes = "vec", tag = "4")]
    pub manifest: Vec<u8>,
    /// The table columns read.
    #[prost(message, optional, tag = "5")]
    pub read_schema: Option<protobuf::Schema>,
    /// The columns read plus the virtual ones asked for (what the predicate is bound to).
    #[prost(message, optional, tag = "6")]
    pub work_schema: Option<protobuf::Schema>,
    /// Whether `_rowaddr` is produced.
    #[prost(bool, tag = "7")]
    pub row_addr: bool,
    /// Whether `_rowid` is produced.
    #[prost(bool, tag = "8")]
    pub row_id: bool,
    /// The pushed-down filter, over `work_schema`.
    #[prost(message, optional, tag = "9")]
    pub predicate: Option<protobuf::PhysicalExprNode>,
    /// The columns of `work_schema` produced, in order.
    #[prost(uint32, repeated, tag = "10")]
    pub output_indices: Vec<u32>,
    /// At most this many rows.
    #[prost(uint64, optional, tag = "11")]
    pub limit: Option<u64>,
    /// The fragments read; absent: all of them.
    #[prost(message, optional, tag = "12")]
    pub fragments: Option<IdsProto>,
}

/// A set of fragment ids.
#[derive(Clone, PartialEq, Message)]
pub struct IdsProto {
    /// The fragment ids, ascending.
    #[prost(uint64, repeated, tag = "1")]
    pub ids: Vec<u64>,
}

/// A [`KnnExec`].
#[derive(Clone, PartialEq, Message)]
pub struct KnnProto {
    /// The scan the search runs over (its snapshot, filter and columns): required, and
    /// without `fragments` (a split search is cut by `share` instead).
    #[prost(message, optional, tag = "1")]
    pub scan: Option<ScanProto>,
    /// The vector column searched.
    #[prost(string, tag = "2")]
    pub column: String,
    /// The query vector.
    #[prost(float, repeated, tag = "3")]
    pub vector: Vec<f32>,
    /// The distance (`l2`, `cosine`, `dot`).
    #[prost(string, tag = "4")]
    pub metric: String,
    /// How many nearest rows the search returns.
    #[prost(uint64, tag = "5")]
    pub k: u64,
    /// IVF partitions probed per segment.
    #[prost(uint64, tag = "6")]
    pub nprobes: u64,
    /// The index searched (a name in the manifest); absent: exact search.
    #[prost(string, optional, tag = "7")]
    pub index: Option<String>,
    /// This task's share of the search; absent: all of it.
    #[prost(message, optional, tag = "8")]
    pub share: Option<ShareProto>,
    /// Rows with a NULL vector first (`ORDER BY ... DESC`, i.e. `NULLS FIRST`).
    #[prost(bool, tag = "9")]
    pub nulls_first: bool,
}

/// A [`KnnShare`].
#[derive(Clone, PartialEq, Message)]
pub struct ShareProto {
    /// The index segments it searches.
    #[prost(uint64, repeated, tag = "1")]
    pub segments: Vec<u64>,
    /// The unindexed fragments it scores.
    #[prost(uint64, repeated, tag = "2")]
    pub fragments: Vec<u64>,
    /// The slice's position, from 0 (ignored when `slice_of` is 0).
    #[prost(uint32, tag = "3")]
    pub slice_index: u32,
    /// How many slices the split has (0: not sliced).
    #[prost(uint32, tag = "4")]
    pub slice_of: u32,
}

/// Encodes and decodes fragvec's operators over the databases a process serves.
#[derive(Debug, Clone)]
pub struct FragvecCodec {
    databases: Arc<Databases>,
}

impl FragvecCodec {
    /// A codec resolving the databases named in plans through `databases`.
    pub fn new(databases: Arc<Databases>) -> Self {
        Self { databases }
    }
}

impl PhysicalExtensionCodec for FragvecCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node =
            NodeProto::decode(buf).map_err(|e| DistributedError::bad_node("a fragvec node", e))?;
        if node.wire_version != WIRE_VERSION {
            return Err(DistributedError::bad_node(
                "a fragvec node",
                format!(
                    "wire version {}, this fragvec speaks {WIRE_VERSION}",
                    node.wire_version
                ),
            )
            .into());
        }
        if !inputs.is_empty() {
            return Err(
                DistributedError::bad_node("a fragvec node", "leaf nodes have no inputs").into(),
            );
        }
        let decoder = Decoder {
            databases: &self.databases,
            ctx,
            codec: self,
            proto_converter,
        };
        match (node.scan, node.knn) {
            (Some(scan), None) => {
                let (spec, fragments) = decoder.scan(scan, "FragmentScanExec")?;
                let mut exec = FragmentScanExec::new(spec)?;
                if let Some(ids) = fragments {
                    exec = exec.with_fragments(ids);
                }
                Ok(Arc::new(exec))
            }
            (None, Some(knn)) => Ok(Arc::new(decoder.knn(knn)?)),
            _ => Err(DistributedError::bad_node(
                "a fragvec node",
                "exactly one of scan and knn must be set",
            )
            .into()),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let encoder = Encoder {
            databases: &self.databases,
            codec: self,
            proto_converter,
        };
        let proto = if let Some(scan) = node.downcast_ref::<FragmentScanExec>() {
            NodeProto {
                wire_version: WIRE_VERSION,
                scan: Some(encoder.scan(scan.spec(), scan.fragment_subset())?),
                knn: None,
            }
        } else if let Some(knn) = node.downcast_ref::<KnnExec>() {
            NodeProto {
                wire_version: WIRE_VERSION,
                scan: None,
                knn: Some(encoder.knn(knn)?),
            }
        } else {
            // Statements that write (InsertExec) and anything else fragvec does not know.
            return Err(DistributedError::CoordinatorOnly {
                node: node.name().to_string(),
            }
            .into());
        };
        proto
            .encode(buf)
            .map_err(|e| DataFusionError::Internal(format!("encoding a fragvec node: {e}")))
    }
}

struct Encoder<'a> {
    databases: &'a Databases,
    codec: &'a FragvecCodec,
    proto_converter: &'a dyn PhysicalProtoConverterExtension,
}

impl Encoder<'_> {
    fn scan(&self, spec: &ScanSpec, fragments: Option<&BTreeSet<u64>>) -> Result<ScanProto> {
        let snapshot = &spec.snapshot;
        let database = self.databases.location_of(&snapshot.dir).ok_or_else(|| {
            let open = self.databases.locations();
            DistributedError::ForeignTable {
                table: snapshot.name().to_string(),
                open: if open.is_empty() {
                    "none".into()
                } else {
                    open.join(", ")
                },
            }
        })?;
        let predicate = match &spec.predicate {
            Some(p) => Some(self.proto_converter.physical_expr_to_proto(p, self.codec)?),
            None => None,
        };
        Ok(ScanProto {
            database,
            table: snapshot.name().to_string(),
            version: snapshot.version(),
            manifest: snapshot.manifest.encode(),
            read_schema: Some(spec.read_schema.as_ref().try_into()?),
            work_schema: Some(spec.work_schema.as_ref().try_into()?),
            row_addr: spec.virtual_columns.row_addr,
            row_id: spec.virtual_columns.row_id,
            predicate,
            output_indices: spec
                .output_indices
                .iter()
                .map(|i| u32::try_from(*i).expect("column index fits u32"))
                .collect(),
            limit: spec.limit.map(|l| l as u64),
            fragments: fragments.map(|ids| IdsProto {
                ids: ids.iter().copied().collect(),
            }),
        })
    }

    fn knn(&self, knn: &KnnExec) -> Result<KnnProto> {
        let query = knn.query();
        Ok(KnnProto {
            scan: Some(self.scan(knn.scan_spec(), None)?),
            column: query.column.clone(),
            vector: query.vector.clone(),
            metric: query.metric.as_str().to_string(),
            k: query.k as u64,
            nprobes: query.nprobes as u64,
            nulls_first: query.nulls_first,
            index: knn.index().map(|i| i.name.clone()),
            share: knn.share().map(|s| ShareProto {
                segments: s.segments.iter().copied().collect(),
                fragments: s.fragments.iter().copied().collect(),
                slice_index: s.slice.map_or(0, |sl| sl.index),
                slice_of: s.slice.map_or(0, |sl| sl.of),
            }),
        })
    }
}

struct Decoder<'a> {
    databases: &'a Databases,
    ctx: &'a TaskContext,
    codec: &'a FragvecCodec,
    proto_converter: &'a dyn PhysicalProtoConverterExtension,
}

impl Decoder<'_> {
    /// A scan's spec and fragment subset.
    fn scan(
        &self,
        proto: ScanProto,
        node: &'static str,
    ) -> Result<(ScanSpec, Option<BTreeSet<u64>>)> {
        let bad =
            |what: String| -> DataFusionError { DistributedError::bad_node(node, what).into() };
        let served = self.databases.get(&proto.database)?;
        let snapshot = self.databases.decoded_snapshot(
            &proto.database,
            &proto.table,
            proto.version,
            &proto.manifest,
            || {
                let manifest = Manifest::decode(&proto.manifest, "<plan>", &proto.table)?;
                if manifest.version != proto.version {
                    return Err(bad(format!(
                        "the manifest is version {}, the node pins {}",
                        manifest.version, proto.version
                    )));
                }
                let dir = served.database.table(&proto.table)?;
                Ok(Snapshot::new(Arc::new(dir), Arc::new(manifest))?)
            },
        )?;
        let read_schema = schema_of(proto.read_schema.as_ref(), "read schema").map_err(bad)?;
        let work_schema = schema_of(proto.work_schema.as_ref(), "work schema").map_err(bad)?;
        for field in read_schema.fields() {
            match snapshot.schema.field_with_name(field.name()) {
                Ok(table) if table.data_type() == field.data_type() => {}
                _ => {
                    return Err(bad(format!(
                        "column '{}' ({}) is not a column of table '{}'",
                        field.name(),
                        field.data_type(),
                        proto.table
                    )));
                }
            }
        }
        let virtual_columns = VirtualColumns {
            row_addr: proto.row_addr,
            row_id: proto.row_id,
        };
        let expected = work_schema_of(&read_schema, virtual_columns);
        if expected.fields() != work_schema.fields() {
            return Err(bad(
                "the work schema is not the read schema plus the virtual columns".into(),
            ));
        }
        let output_indices: Vec<usize> = proto.output_indices.iter().map(|i| *i as usize).collect();
        if let Some(i) = output_indices
            .iter()
            .find(|i| **i >= work_schema.fields().len())
        {
            return Err(bad(format!("output column {i} is out of range")));
        }
        let predicate = match &proto.predicate {
            Some(p) => {
                let decode_ctx = PhysicalPlanDecodeContext::new(self.ctx, self.codec);
                let expr =
                    self.proto_converter
                        .proto_to_physical_expr(p, &work_schema, &decode_ctx)?;
                if expr.data_type(&work_schema)? != DataType::Boolean {
                    return Err(bad("the predicate is not boolean".into()));
                }
                Some(expr)
            }
            None => None,
        };
        let fragments = match proto.fragments {
            Some(ids) => {
                let ids: BTreeSet<u64> = ids.ids.into_iter().collect();
                if let Some(f) = ids
                    .iter()
                    .find(|f| snapshot.manifest.fragment(**f).is_none())
                {
                    return Err(bad(format!(
                        "fragment {f} is not in version {}",
                        proto.version
                    )));
                }
                Some(ids)
            }
            None => None,
        };
        let spec = ScanSpec {
            snapshot,
            read_schema,
            work_schema,
            virtual_columns,
            predicate,
            output_indices,
            limit: proto.limit.map(|l| l as usize),
        };
        Ok((spec, fragments))
    }

    fn knn(&self, proto: KnnProto) -> Result<KnnExec> {
        let node = "KnnExec";
        let bad =
            |what: String| -> DataFusionError { DistributedError::bad_node(node, what).into() };
        let scan = proto
            .scan
            .ok_or_else(|| bad("the scan is missing".into()))?;
        let location = scan.database.clone();
        let (spec, fragments) = self.scan(scan, node)?;
        if fragments.is_some() {
            return Err(bad("a KNN search is split by shares, not fragments".into()));
        }
        let manifest = &spec.snapshot.manifest;
        let metric = Metric::parse(&proto.metric)
            .ok_or_else(|| bad(format!("unknown metric '{}'", proto.metric)))?;
        if spec.snapshot.schema.field_with_name(&proto.column).is_err() {
            return Err(bad(format!("no column '{}'", proto.column)));
        }
        let index = match &proto.index {
            Some(name) => Some(
                manifest
                    .index(name)
                    .cloned()
                    .ok_or_else(|| bad(format!("no index '{name}' in the manifest")))?,
            ),
            None => None,
        };
        let share = match proto.share {
            Some(s) => {
                let slice = match s.slice_of {
                    0 => None,
                    of => Some(Slice::new(s.slice_index, of).ok_or_else(|| {
                        bad(format!("slice {} of {of} does not exist", s.slice_index))
                    })?),
                };
                let share = KnnShare {
                    segments: s.segments.into_iter().collect(),
                    fragments: s.fragments.into_iter().collect(),
                    slice,
                };
                if let Some(seg) = share
                    .segments
                    .iter()
                    .find(|id| !manifest.index_segments.iter().any(|s| s.id == **id))
                {
                    return Err(bad(format!("segment {seg} is not in the manifest")));
                }
                if let Some(f) = share
                    .fragments
                    .iter()
                    .find(|f| manifest.fragment(**f).is_none())
                {
                    return Err(bad(format!("fragment {f} is not in the manifest")));
                }
                Some(share)
            }
            None => None,
        };
        let query = KnnQuery {
            column: proto.column,
            vector: proto.vector,
            metric,
            k: usize::try_from(proto.k).map_err(|_| bad("k is too large".into()))?,
            nprobes: usize::try_from(proto.nprobes)
                .map_err(|_| bad("nprobes is too large".into()))?,
            nulls_first: proto.nulls_first,
        };
        let cache = self.databases.get(&location)?.cache;
        let knn = KnnExec::new(spec, query, index, cache)?;
        match share {
            Some(share) => knn.with_share(share),
            None => Ok(knn),
        }
    }
}

fn schema_of(proto: Option<&protobuf::Schema>, what: &str) -> Result<SchemaRef, String> {
    let proto = proto.ok_or_else(|| format!("the {what} is missing"))?;
    Schema::try_from(proto)
        .map(Arc::new)
        .map_err(|e| format!("the {what} does not decode: {e}"))
}

/// The schema a scan evaluates filters on: its read columns, then the virtual columns.
fn work_schema_of(read: &Schema, virtual_columns: VirtualColumns) -> Schema {
    let mut fields: Vec<Field> = read.fields().iter().map(|f| f.as_ref().clone()).collect();
    if virtual_columns.row_addr {
        fields.push(Field::new(ROW_ADDR, DataType::UInt64, false));
    }
    if virtual_columns.row_id {
        fields.push(Field::new(ROW_ID, DataType::UInt64, false));
    }
    Schema::new(fields)
}

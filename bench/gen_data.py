#!/usr/bin/env python3
"""Generates the KNN benchmark's data set: clustered vectors, queries, categories and exact
ground truth, with a fixed seed, into one directory that every system reads.

    python bench/gen_data.py --rows 1000000 --dim 128 --out DIR

Data: 256 Gaussian blobs, centres ~ N(0, 1)^D, standard deviation 0.5 per dimension; each row
picks a blob uniformly. Queries are fresh draws from the same mixture (not rows of the data).
Each row has a `category` in 0..9 (uniform, ~10% of rows per value); query i is filtered on
`category = query_category[i]`. Ground truth is computed in float64 from the float32 values
as stored: the 100 nearest rows by squared L2 distance, nearest first (ties by id).

Files written (all arrays little-endian, .npy version 1; ids are row numbers 0..N-1):
    items.parquet        the table: id BIGINT, category INT, emb FixedSizeList<Float32>[D]
                         (uncompressed, row groups of 65,536 rows)
    vectors.npy          float32 [N, D]   the same vectors, row i = id i
    category.npy         int32   [N]
    queries.npy          float32 [Q, D]
    query_category.npy   int32   [Q]
    gt.npy               int64   [Q, 100] nearest ids, nearest first
    gt_distances.npy     float64 [Q, 100] their squared L2 distances
    gt_filtered.npy      int64   [Q, 100] nearest ids among rows with category = query_category
    meta.json            rows, dim, blobs, std, categories, queries, seed, k_truth

Generation streams in chunks of 65,536 rows (each chunk has its own seeded generator), so
10M × 768 (30 GB) is written without holding it in memory. `--no-vectors-npy` leaves out
vectors.npy (only numpy and faiss read it): a second copy of the floats that 5M × 768 cannot
spare on disk; the ground truth's final re-scoring then reads its candidates' rows back from
items.parquet, one row group at a time. Needs numpy and pyarrow.
"""

import argparse
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BLOBS = 256
STD = 0.5
CATEGORIES = 10
K_TRUTH = 100
CHUNK = 65536
QUERY_STREAM = 1 << 40  # generator key of the queries, apart from every chunk's key


def centres(seed, dim):
    return np.random.default_rng(seed).standard_normal((BLOBS, dim))


def chunk_rows(seed, index, rows, dim, ctr):
    """Rows of chunk `index`: (float32 vectors [rows, dim], int32 categories [rows])."""
    rng = np.random.default_rng([seed, index])
    blob = rng.integers(0, BLOBS, rows)
    vectors = (ctr[blob] + STD * rng.standard_normal((rows, dim))).astype(np.float32)
    category = rng.integers(0, CATEGORIES, rows).astype(np.int32)
    return vectors, category


def merge_top(best_d, best_i, d, ids, k):
    """Merges candidate distances `d` [Q, m] (ids `ids` [m] or [Q, m]) into the running
    top-k (best_d, best_i) [Q, k], keeping the k smallest per query, ties by id."""
    if ids.ndim == 1:
        ids = np.broadcast_to(ids, d.shape)
    all_d = np.concatenate([best_d, d], axis=1)
    all_i = np.concatenate([best_i, ids], axis=1)
    if all_d.shape[1] > k:
        part = np.argpartition(all_d, k - 1, axis=1)[:, :k]
        all_d = np.take_along_axis(all_d, part, axis=1)
        all_i = np.take_along_axis(all_i, part, axis=1)
    order = np.lexsort((all_i, all_d), axis=1)
    return np.take_along_axis(all_d, order, axis=1), np.take_along_axis(all_i, order, axis=1)


def parquet_rows(path, ids, dim):
    """A function from an array of ids (each among `ids`, or negative) to their vectors,
    read from the Parquet file at `path` (row i = id i, row groups of CHUNK rows) one row
    group at a time; negative ids give zeros."""
    want = np.unique(ids[ids >= 0])
    got = np.zeros((len(want), dim), dtype=np.float32)
    pf = pq.ParquetFile(path)
    for group in np.unique(want // CHUNK):
        inside = np.nonzero(want // CHUNK == group)[0]
        emb = pf.read_row_group(int(group), columns=["emb"]).column("emb").combine_chunks()
        flat = emb.flatten().to_numpy().reshape(-1, dim)
        got[inside] = flat[want[inside] - group * CHUNK]

    def rows_of(asked):
        at = np.searchsorted(want, np.maximum(asked, 0))
        out = got[np.minimum(at, len(want) - 1)]
        out[asked < 0] = 0
        return out
    return rows_of


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-vectors-npy", action="store_true",
                    help="do not write vectors.npy (numpy and faiss then cannot run)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    n, dim, nq = a.rows, a.dim, a.queries
    ctr = centres(a.seed, dim)

    qrng = np.random.default_rng([a.seed, QUERY_STREAM])
    qblob = qrng.integers(0, BLOBS, nq)
    queries = (ctr[qblob] + STD * qrng.standard_normal((nq, dim))).astype(np.float32)
    qcat = qrng.integers(0, CATEGORIES, nq).astype(np.int32)
    q64 = queries.astype(np.float64)
    qnorm = (q64 * q64).sum(axis=1)

    vectors = None if a.no_vectors_npy else np.lib.format.open_memmap(
        os.path.join(a.out, "vectors.npy"), mode="w+", dtype=np.float32, shape=(n, dim))
    category = np.empty(n, dtype=np.int32)
    item = pa.field("item", pa.float32(), nullable=True)
    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        pa.field("category", pa.int32(), nullable=False),
        pa.field("emb", pa.list_(item, dim), nullable=True),
    ])
    writer = pq.ParquetWriter(os.path.join(a.out, "items.parquet"), schema,
                              compression="none", write_statistics=["id", "category"])
    k = min(K_TRUTH, n)
    inf = np.full((nq, 0), np.inf)
    best = (inf, np.zeros((nq, 0), dtype=np.int64))
    best_f = (inf, np.zeros((nq, 0), dtype=np.int64))
    for index, start in enumerate(range(0, n, CHUNK)):
        rows = min(CHUNK, n - start)
        v, c = chunk_rows(a.seed, index, rows, dim, ctr)
        if vectors is not None:
            vectors[start:start + rows] = v
        category[start:start + rows] = c
        ids = np.arange(start, start + rows, dtype=np.int64)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), dim)
        writer.write_table(pa.table([pa.array(ids), pa.array(c), emb], schema=schema),
                           row_group_size=CHUNK)
        # Candidates by the float64 expansion |x|² − 2x·q + |q|², then re-scored directly.
        v64 = v.astype(np.float64)
        d = (v64 * v64).sum(axis=1)[None, :] - 2.0 * (q64 @ v64.T) + qnorm[:, None]
        best = merge_top(*best, d, ids, k)
        d[c[None, :] != qcat[:, None]] = np.inf
        best_f = merge_top(*best_f, d, ids, k)
        print(f"\r{start + rows:,} / {n:,} rows", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    writer.close()
    if vectors is not None:
        vectors.flush()
    rows_of = (lambda ids: vectors[ids]) if vectors is not None else parquet_rows(
        os.path.join(a.out, "items.parquet"), np.concatenate([best[1], best_f[1]], axis=None), dim)

    def exact(ids):
        """Direct float64 distances of each query to its candidate ids, re-sorted."""
        d = np.stack([((rows_of(ids[i]).astype(np.float64) - q64[i]) ** 2).sum(axis=1)
                      for i in range(nq)])
        d[ids < 0] = np.inf
        order = np.lexsort((ids, d), axis=1)
        return np.take_along_axis(d, order, axis=1), np.take_along_axis(ids, order, axis=1)

    gt_d, gt = exact(best[1])
    # Filtered truth: rows of other categories were never candidates; fewer than k qualifying
    # rows leave infinite slots, marked -1.
    gt_f = np.where(np.isfinite(best_f[0]), best_f[1], -1)
    _, gt_f = exact(gt_f)
    gt_f = np.where(gt_f >= 0, gt_f, -1)

    np.save(os.path.join(a.out, "category.npy"), category)
    np.save(os.path.join(a.out, "queries.npy"), queries)
    np.save(os.path.join(a.out, "query_category.npy"), qcat)
    np.save(os.path.join(a.out, "gt.npy"), gt)
    np.save(os.path.join(a.out, "gt_distances.npy"), gt_d)
    np.save(os.path.join(a.out, "gt_filtered.npy"), gt_f)
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump({"rows": n, "dim": dim, "blobs": BLOBS, "std": STD,
                   "categories": CATEGORIES, "queries": nq, "seed": a.seed,
                   "k_truth": k}, f, indent=1)
    print(f"wrote {a.out}: {n:,} x {dim}, {nq} queries", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Moving many rows: Flight SQL against the Postgres endpoint and DuckDB, on the same data.

One run, one machine, the same table of N rows x (BIGINT, VECTOR(D)):
- fetch: `SELECT id, emb FROM t` through Flight SQL (ADBC, fetch_arrow_table), through the
  Postgres endpoint (psycopg 3, binary, pgvector's numpy loader), and DuckDB reading the same
  rows from a local Parquet file (read_parquet(...).arrow()) as the anchor; rows per second,
  best of --repeat runs;
- ingest: the same Arrow table through adbc_ingest, against the shell's
  `INSERT INTO t SELECT * FROM` an external Parquet table (both write fragments and commit once).

    python bench/flight_bench.py --fragvec-bin target/release/fragvec --rows 1000000 --dim 128

Prints each figure and the ratios the issue asks for; the scratch directory is deleted unless
--keep.
"""

import argparse
import os
import shutil
import subprocess
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

warnings.simplefilter("ignore")  # ADBC: "Cannot disable autocommit" (fragvec has no transactions)


def arrow_table(rows, dim, seed=7):
    vectors = np.random.default_rng(seed).random((rows, dim), dtype=np.float32)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim)
    return pa.table({"id": pa.array(np.arange(rows, dtype=np.int64)), "emb": emb})


def start_server(binary, db):
    proc = subprocess.Popen(
        [binary, "--db", db, "serve", "--pg", "127.0.0.1:0", "--flight", "127.0.0.1:0"],
        stdout=subprocess.PIPE, text=True)
    pg = proc.stdout.readline().split("://")[1].strip()
    flight = proc.stdout.readline().split(" on ")[1].strip()
    return proc, pg, flight


def best(repeat, fn):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fragvec-bin", required=True)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scratch", default=None, help="a directory for the databases and the Parquet file")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    import adbc_driver_flightsql.dbapi as flight_sql
    import duckdb
    import psycopg
    from pgvector.psycopg import register_vector

    scratch = tempfile.mkdtemp(prefix="flight-bench-", dir=args.scratch)
    try:
        table = arrow_table(args.rows, args.dim)
        parquet = os.path.join(scratch, "items.parquet")
        pq.write_table(table, parquet)
        # Batches under the Go client's 16 MiB message limit.
        batch_rows = max(1, (12 << 20) // (args.dim * 4 + 8))
        print("data: %d rows x (BIGINT, VECTOR(%d)), %.0f MB of vectors; fragvec %s"
              % (args.rows, args.dim, args.rows * args.dim * 4 / 1e6, args.fragvec_bin))

        # Ingest through Flight (adbc_ingest), then the same rows by the shell from Parquet.
        proc, pg, flight = start_server(args.fragvec_bin, os.path.join(scratch, "served"))
        try:
            conn = flight_sql.connect(flight)
            cur = conn.cursor()
            start = time.perf_counter()
            cur.adbc_ingest("items", table.to_batches(max_chunksize=batch_rows), mode="create")
            ingest_flight = time.perf_counter() - start
            cur.execute("SELECT count(*) FROM items")
            assert cur.fetchall() == [(args.rows,)]

            sql = ("CREATE TABLE items (id BIGINT, emb VECTOR(%d)); "
                   "CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '%s'; "
                   "INSERT INTO items SELECT id, emb FROM src" % (args.dim, parquet))
            start = time.perf_counter()
            subprocess.run([args.fragvec_bin, "--db", os.path.join(scratch, "local"), "-c", sql],
                           check=True, stdout=subprocess.DEVNULL)
            ingest_local = time.perf_counter() - start

            def flight_fetch():
                cur.execute("SELECT id, emb FROM items")
                got = cur.fetch_arrow_table()
                assert got.num_rows == args.rows

            pg_conn = psycopg.connect("host=%s port=%s user=fragvec dbname=fragvec"
                                      % tuple(pg.rsplit(":", 1)), autocommit=True)
            register_vector(pg_conn)

            def psycopg_fetch():
                with pg_conn.cursor(binary=True) as c:
                    c.execute("SELECT id, emb FROM items")
                    rows = c.fetchall()
                    first = rows[0][1]
                    first = first.to_numpy() if hasattr(first, "to_numpy") else first
                    assert len(rows) == args.rows and len(first) == args.dim

            duck = duckdb.connect()

            def duckdb_fetch():
                got = duck.sql("SELECT id, emb FROM read_parquet('%s')" % parquet).fetch_arrow_table()
                assert got.num_rows == args.rows

            fetch_flight = best(args.repeat, flight_fetch)
            fetch_psycopg = best(args.repeat, psycopg_fetch)
            fetch_duckdb = best(args.repeat, duckdb_fetch)
            cur.close()
            conn.close()
            pg_conn.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)

        rate = lambda s: args.rows / s
        print("fetch, rows/s (best of %d):" % args.repeat)
        print("  Flight SQL (ADBC, fetch_arrow_table)  %12.0f  (%.2f s)" % (rate(fetch_flight), fetch_flight))
        print("  Postgres endpoint (psycopg, binary)   %12.0f  (%.2f s)" % (rate(fetch_psycopg), fetch_psycopg))
        print("  DuckDB read_parquet (local file)      %12.0f  (%.2f s)" % (rate(fetch_duckdb), fetch_duckdb))
        print("  Flight / psycopg: %.1fx   Flight / DuckDB: %.2fx"
              % (fetch_psycopg / fetch_flight, fetch_duckdb / fetch_flight))
        print("ingest, rows/s:")
        print("  adbc_ingest through Flight SQL        %12.0f  (%.2f s)" % (rate(ingest_flight), ingest_flight))
        print("  shell INSERT ... SELECT FROM Parquet  %12.0f  (%.2f s)" % (rate(ingest_local), ingest_local))
        print("  adbc_ingest time / local INSERT time: %.2fx" % (ingest_flight / ingest_local))
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A quick throughput probe of a running Postgres-protocol server: N client processes, each
sending pg_client_bench.py's one query function (`knn()`: psycopg 3, register_vector, the
vector bound as a numpy array, prepared, binary results) in a loop for S seconds.

    python bench/pg_load.py --data DIR --conninfo "host=127.0.0.1 port=5433 user=fragvec" \
        --clients 4 --seconds 8 --setting "SET fragvec.nprobes = 2"

Prints the total queries per second. For A/B runs of two server builds on one database
(start one, probe, stop it, start the other, ...), where pg_client_bench.py's full sweep
is more than needed; figures worth keeping come from pg_client_bench.py.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pg_client_bench import connect, knn  # noqa: E402


def client(conninfo, data, seconds, setting, start, out):
    """Queries from `start` on (clients start spread over the query set, as in
    pg_client_bench.py: clients in lockstep on the same vectors share warm caches)."""
    queries = np.load(os.path.join(data, "queries.npy")).astype(np.float32)
    conn = connect(conninfo)
    cur = conn.cursor(binary=True)
    if setting:
        cur.execute(setting)
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        knn(cur, queries[(start + n) % len(queries)])
        n += 1
    out.put(n)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a gen_data.py directory (its queries.npy)")
    p.add_argument("--conninfo", required=True)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--setting", default="", help="a statement each client runs first")
    a = p.parse_args()
    out = mp.Queue()
    nq = len(np.load(os.path.join(a.data, "queries.npy"), mmap_mode="r"))
    procs = [mp.Process(target=client,
                        args=(a.conninfo, a.data, a.seconds, a.setting, k * nq // a.clients, out))
             for k in range(a.clients)]
    for proc in procs:
        proc.start()
    total = sum(out.get() for _ in procs)
    for proc in procs:
        proc.join()
    print(f"{a.clients} clients: {total / a.seconds:,.0f} queries/s")


if __name__ == "__main__":
    main()

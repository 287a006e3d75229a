#!/usr/bin/env python3
"""Client benchmark: the same psycopg code against PostgreSQL 16 + pgvector (IVFFlat, HNSW)
and against `fragvec serve`, on one data directory written by gen_data.py.

    PY=~/.cache/fragvec-bench-venv/bin/python
    $PY bench/pg_client_bench.py --data ~/.cache/fragvec-bench-data/200k-128
    $PY bench/pg_client_bench.py --data DIR --systems fragvec --fragvec-bin PATH --seconds 5

Systems:
  ivfflat  PostgreSQL 16 + pgvector from the PyPI package `pgserver`, database bench_ivfflat:
           table items with one IVFFlat index (lists = √N); setting: SET ivfflat.probes = p
  hnsw     the same server, database bench_hnsw (a copy of the loaded table) with one HNSW
           index (m = 16, ef_construction = 64); setting: SET hnsw.ef_search = e
  fragvec  `fragvec serve` over DATA/fragvec-serve-db, table items loaded from items.parquet
           with an IVF_FLAT index (num_partitions = √N); setting: SET fragvec.nprobes = p

Every system is queried by one function, `knn()` below: register_vector(conn), then
`SELECT id FROM items [WHERE category = %s] ORDER BY emb <-> %s LIMIT 10` with the query as a
numpy float32 array, prepared (`prepare=True`), autocommit, over TCP on 127.0.0.1. Per system
and setting it reports single-client p50/p95 and recall@10 (unfiltered against gt.npy,
filtered against gt_filtered.npy), queries per second at each number of concurrent
connections (one worker process per connection, each with its own connection, a warm-up, then
a fixed window), and the server's memory with those connections open. A Markdown table goes to
stdout, raw JSON records are appended to DATA/pg_client_results.jsonl. See bench/PG_CLIENTS.md.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np

K = 10
SQL_KNN = "SELECT id FROM items ORDER BY emb <-> %s LIMIT 10"
SQL_KNN_FILTERED = "SELECT id FROM items WHERE category = %s ORDER BY emb <-> %s LIMIT 10"
ALL_SYSTEMS = ("ivfflat", "hnsw", "fragvec")


# ---------------------------------------------------------------- the one query path

def connect(conninfo):
    """One client connection, set up identically for every system."""
    import psycopg
    from pgvector.psycopg import register_vector
    conn = psycopg.connect(conninfo, autocommit=True)
    register_vector(conn)
    return conn


def knn(cur, q, category=None, prepare=True):
    """THE query function, used for every system: ids of the 10 nearest rows to `q`."""
    if category is None:
        cur.execute(SQL_KNN, (q,), prepare=prepare)
    else:
        cur.execute(SQL_KNN_FILTERED, (int(category), q), prepare=prepare)
    return [r[0] for r in cur.fetchall()]


# ---------------------------------------------------------------- helpers

def now():
    return time.perf_counter()


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_workload(data):
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    return {
        "meta": meta,
        "queries": np.load(os.path.join(data, "queries.npy")).astype(np.float32),
        "qcat": np.load(os.path.join(data, "query_category.npy")),
        "gt": np.load(os.path.join(data, "gt.npy"))[:, :K],
        "gt_f": np.load(os.path.join(data, "gt_filtered.npy"))[:, :K],
    }


def recall_of(found, truth):
    truth = set(int(x) for x in truth if x >= 0)
    if not truth:
        return 1.0
    return len(truth.intersection(int(x) for x in found)) / len(truth)


def pct(sorted_ms, p):
    return float(sorted_ms[int(round((len(sorted_ms) - 1) * p))])


def proc_status(pid):
    """VmRSS and VmHWM of one process, bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0]) * 1024
    except OSError:     # a process that just exited
        pass
    return out


def proc_pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_busy(seconds=1.0):
    """Share of all cores busy over `seconds` (from /proc/stat): what else runs on the machine
    while this benchmark is idle."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]          # total, idle + iowait
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def cpu_ticks_total():
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def process_ticks(pid, reaped=True):
    """utime + stime of a process (+ cutime + cstime of its children already reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    v = stat[stat.rindex(")") + 2:].split()
    return sum(int(x) for x in v[11:15 if reaped else 13])


class OtherCpu:
    """The share of the machine's CPU used by anything but this benchmark (its own processes,
    the workers it reaped, and the server with its children) between start and stop."""

    def __init__(self, server_pid):
        self.server_pid = server_pid
        self.start = self.sample()

    def ours(self):
        pid = self.server_pid
        return (process_ticks(os.getpid()) + process_ticks(pid) +
                sum(process_ticks(c) for c in children_of(pid)))

    def sample(self):
        busy, total = cpu_ticks_total()
        return busy, total, self.ours()

    def stop(self):
        b0, t0, o0 = self.start
        b1, t1, o1 = self.sample()
        return max(0.0, ((b1 - b0) - (o1 - o0)) / max(1, t1 - t0))


def children_of(pid):
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid:
            kids.append(int(d))
    return kids


# ---------------------------------------------------------------- servers

class PgCluster:
    """PostgreSQL 16 + pgvector from pgserver. pgserver initialises PGDATA and starts the
    server (Unix socket only); we restart it with our settings on 127.0.0.1:PORT (TCP, like
    fragvec serve) unless --pg-transport unix."""

    def __init__(self, pgdata, transport, shared_buffers):
        import warnings
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")  # platformdirs, harmless
        import pgserver
        self.pgserver = pgserver
        self.pgdata = os.path.abspath(pgdata)
        self.transport = transport
        self.shared_buffers = shared_buffers
        self.user = "pgserver" if os.geteuid() == 0 else None
        self.port = None
        self.srv = None

    def start(self):
        first = self.srv is None
        if first:
            os.makedirs(os.path.dirname(self.pgdata), exist_ok=True)
            # initdb (if needed) and start; we stop it ourselves (cleanup_mode=None)
            self.srv = self.pgserver.get_server(self.pgdata, cleanup_mode=None)
            # pgserver's choice: PGDATA itself unless that path is too long for a socket
            self.socket_dir = str(self.srv.get_postmaster_info().socket_dir or self.pgdata)
            uri = self.srv.get_uri()
            import psycopg
            with psycopg.connect(uri, autocommit=True) as c:
                c.execute(f"ALTER SYSTEM SET shared_buffers = '{self.shared_buffers}'")
        self.port = self.port or free_port()
        opts = f"-k {self.socket_dir} -p {self.port} "
        opts += "-h 127.0.0.1" if self.transport == "tcp" else "-h ''"
        self._ctl(["-w", "-o", opts, "-l", os.path.join(self.pgdata, "log"),
                   "restart" if first or self.running() else "start"])

    def running(self):
        pid = self.pid()
        return pid is not None and os.path.exists(f"/proc/{pid}")

    def _ctl(self, args):
        self.pgserver.pg_ctl(args, pgdata=self.pgdata, user=self.user, timeout=600)

    def stop(self):
        if self.running():
            self._ctl(["-w", "-m", "fast", "stop"])

    def pid(self):
        try:
            with open(os.path.join(self.pgdata, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def conninfo(self, db):
        host = "127.0.0.1" if self.transport == "tcp" else self.socket_dir
        return f"host={host} port={self.port} user=postgres dbname={db}"

    def memory(self):
        pid = self.pid()
        pids = [pid] + children_of(pid)
        rss = sum(proc_status(p).get("VmRSS", 0) for p in pids)
        pss = sum(proc_pss(p) for p in pids)
        return {"rss_sum_mb": rss / 1e6, "pss_sum_mb": pss / 1e6, "processes": len(pids)}


class FragvecServer:
    def __init__(self, binary, db, allow_files, log_path):
        self.binary, self.db, self.allow_files, self.log_path = binary, db, allow_files, log_path
        self.proc = None
        self.port = None
        self.allow_flag = True

    def start(self):
        for attempt in (0, 1):
            cmd = [self.binary, "serve", "--db", self.db, "--pg", "127.0.0.1:0"]
            if self.allow_flag:
                cmd += ["--allow-files", self.allow_files]
            logf = open(self.log_path, "a")
            logf.write(f"\n# {' '.join(cmd)}\n")
            logf.flush()
            start = os.path.getsize(self.log_path)
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
            logf.close()
            deadline = now() + 120
            while now() < deadline:
                with open(self.log_path) as f:
                    f.seek(start)
                    text = f.read()
                if "listening on postgresql://" in text:
                    addr = text.split("listening on postgresql://", 1)[1].split()[0]
                    self.port = int(addr.rsplit(":", 1)[1].strip("/"))
                    return
                if self.proc.poll() is not None:
                    if self.allow_flag and "--allow-files" in text:
                        log("fragvec serve refuses --allow-files; starting it without")
                        self.allow_flag = False
                        break
                    raise RuntimeError(f"fragvec serve exited {self.proc.returncode}:\n{text}")
                time.sleep(0.05)
            else:
                raise RuntimeError("fragvec serve did not report its address in 120 s")
        raise RuntimeError("fragvec serve did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def conninfo(self, db=None):
        return f"host=127.0.0.1 port={self.port} user=fragvec dbname=fragvec"

    def pid(self):
        return self.proc.pid

    def memory(self):
        s = proc_status(self.proc.pid)
        return {"rss_mb": s["VmRSS"] / 1e6, "hwm_mb": s["VmHWM"] / 1e6, "processes": 1}

    def version(self):
        try:
            return subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return f"? ({e})"


# ---------------------------------------------------------------- loading

def parquet_batches(data, rows_per_batch=65536):
    import pyarrow.parquet as pq
    f = pq.ParquetFile(os.path.join(data, "items.parquet"))
    for b in f.iter_batches(batch_size=rows_per_batch, columns=["id", "category", "emb"]):
        ids = b.column(0).to_numpy()
        cats = b.column(1).to_numpy()
        emb = b.column(2)
        dim = emb.type.list_size
        vecs = emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim)
        yield ids, cats, vecs


def pg_copy_binary(cur, data, dim):
    """COPY items FROM STDIN (FORMAT BINARY), rows built with numpy: per row int16 3 fields,
    then (int32 length, value) for id int8, category int4 and emb in pgvector's binary form
    (int16 dim, int16 0, dim float32), all big-endian."""
    row = np.dtype([("n", ">i2"), ("l_id", ">i4"), ("id", ">i8"), ("l_cat", ">i4"),
                    ("cat", ">i4"), ("l_emb", ">i4"), ("dim", ">i2"), ("unused", ">i2"),
                    ("emb", ">f4", (dim,))])
    n = 0
    with cur.copy("COPY items (id, category, emb) FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.write(b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00")
        for ids, cats, vecs in parquet_batches(data):
            a = np.empty(len(ids), dtype=row)
            a["n"], a["l_id"], a["id"], a["l_cat"], a["cat"] = 3, 8, ids, 4, cats
            a["l_emb"], a["dim"], a["unused"], a["emb"] = 4 + 4 * dim, dim, 0, vecs
            copy.write(a.tobytes())
            n += len(ids)
        copy.write(b"\xff\xff")
    return n


def pg_setup(pg, data, meta, systems, reuse):
    """Loads bench_ivfflat.items once, copies it to bench_hnsw, builds one index in each."""
    import psycopg
    n, dim = meta["rows"], meta["dim"]
    lists = max(1, round(math.sqrt(n)))
    records = []
    with psycopg.connect(pg.conninfo("postgres"), autocommit=True) as c:
        have = {r[0] for r in c.execute("SELECT datname FROM pg_database")}
    wanted = {"ivfflat": "bench_ivfflat", "hnsw": "bench_hnsw"}
    if reuse and all(wanted[s] in have for s in systems if s in wanted):
        log("pg: --reuse: databases exist, not loading")
        return records
    with psycopg.connect(pg.conninfo("postgres"), autocommit=True) as c:
        for db in wanted.values():
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute("CREATE DATABASE bench_ivfflat")
    t = now()
    with psycopg.connect(pg.conninfo("bench_ivfflat"), autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
        c.execute(f"CREATE TABLE items (id bigint PRIMARY KEY, category int, emb vector({dim}))")
        loaded = pg_copy_binary(c.cursor(), data, dim)
        load_s = now() - t
        c.execute("VACUUM ANALYZE items")
        vac_s = now() - t - load_s
    log(f"pg: COPY {loaded} rows {load_s:.1f} s, VACUUM ANALYZE {vac_s:.1f} s")
    records.append({"kind": "setup", "system": "pg", "step": "COPY FROM STDIN (BINARY)",
                    "rows": loaded, "seconds": load_s})
    records.append({"kind": "setup", "system": "pg", "step": "VACUUM ANALYZE", "seconds": vac_s})
    if "hnsw" in systems:
        with psycopg.connect(pg.conninfo("postgres"), autocommit=True) as c:
            c.execute("CREATE DATABASE bench_hnsw TEMPLATE bench_ivfflat")
    builds = {
        "ivfflat": ("bench_ivfflat", f"CREATE INDEX items_ivfflat ON items USING ivfflat "
                                     f"(emb vector_l2_ops) WITH (lists = {lists})"),
        "hnsw": ("bench_hnsw", "CREATE INDEX items_hnsw ON items USING hnsw "
                               "(emb vector_l2_ops) WITH (m = 16, ef_construction = 64)"),
    }
    for s in ("ivfflat", "hnsw"):
        if s not in systems:
            continue
        db, sql = builds[s]
        with psycopg.connect(pg.conninfo(db), autocommit=True) as c:
            c.execute("SET maintenance_work_mem = '2GB'")
            t = now()
            c.execute(sql)
            build_s = now() - t
            size = c.execute("SELECT pg_relation_size(indexrelid) FROM pg_index "
                             "WHERE indrelid = 'items'::regclass AND NOT indisprimary").fetchone()[0]
        log(f"{s}: {sql}: {build_s:.1f} s, {size / 1e6:.0f} MB")
        records.append({"kind": "setup", "system": s, "step": "index build", "sql": sql,
                        "seconds": build_s, "index_mb": size / 1e6})
    return records


def fragvec_setup(fv, data, meta, reuse):
    n, dim = meta["rows"], meta["dim"]
    parts = max(1, round(math.sqrt(n)))
    records = []
    conn = connect(fv.conninfo())
    have = [r[0] for r in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_name = 'items'")]
    if reuse and have:
        log("fragvec: --reuse: table items exists, not loading")
        conn.close()
        return records
    conn.execute(f"CREATE TABLE items (id BIGINT NOT NULL, category INT NOT NULL, "
                 f"emb VECTOR({dim}))")
    # The same COPY as PostgreSQL's load, from the same code.
    t = now()
    loaded = pg_copy_binary(conn.cursor(), data, dim)
    load_s = now() - t
    log(f"fragvec: COPY {loaded} rows {load_s:.1f} s")
    records.append({"kind": "setup", "system": "fragvec", "step": "COPY FROM STDIN (BINARY)",
                    "rows": loaded, "seconds": load_s})
    sql = (f"CREATE VECTOR INDEX items_idx ON items (emb) USING IVF_FLAT "
           f"WITH (num_partitions = {parts})")
    t = now()
    conn.execute(sql)
    build_s = now() - t
    log(f"fragvec: {sql}: {build_s:.1f} s")
    records.append({"kind": "setup", "system": "fragvec", "step": "index build", "sql": sql,
                    "seconds": build_s})
    conn.close()
    return records


# ---------------------------------------------------------------- checks

def plan_text(cur, sql, params):
    rows = cur.execute("EXPLAIN " + sql, params).fetchall()
    return "\n".join(str(r[-1]) for r in rows)


def check_plan(system, cur, q, cat):
    """EXPLAIN of the unfiltered and the filtered query (with the session's setting): which
    access path answers it. For PostgreSQL also the generic plan that a prepared statement
    may switch to after 5 executions."""
    want = {"ivfflat": "items_ivfflat", "hnsw": "items_hnsw", "fragvec": "KnnExec"}[system]
    plans = {"unfiltered": plan_text(cur, SQL_KNN, (q,)),
             "filtered": plan_text(cur, SQL_KNN_FILTERED, (int(cat), q))}
    if system != "fragvec":
        for name, sql in (("generic unfiltered", SQL_KNN), ("generic filtered", SQL_KNN_FILTERED)):
            text = sql.replace("%s", "$1", 1).replace("%s", "$2", 1)
            # simple query protocol: an extended-protocol Parse would ask for the $n values
            res = cur.connection.pgconn.exec_(f"EXPLAIN (GENERIC_PLAN) {text}".encode())
            plans[name] = "\n".join(res.get_value(i, 0).decode() for i in range(res.ntuples))
    ok = all(want in p for p in plans.values())
    return ok, plans


def probe_binary(conninfo, q, cat, prepare):
    """Binary results work if the binary cursor gives the text cursor's answers."""
    conn = connect(conninfo)
    try:
        text = [knn(conn.cursor(), q, None, prepare), knn(conn.cursor(), q, cat, prepare)]
        binary = [knn(conn.cursor(binary=True), q, None, prepare),
                  knn(conn.cursor(binary=True), q, cat, prepare)]
        if binary != text:
            return False, f"binary {binary} != text {text}"
        return True, ""
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


# ---------------------------------------------------------------- measuring

def single_client(conninfo, init_sql, w, binary, prepare, system):
    """All queries one at a time on one connection: a warm-up pass, then a timed pass;
    unfiltered, then filtered."""
    conn = connect(conninfo)
    cur = conn.cursor(binary=binary)
    for s in init_sql:
        cur.execute(s)
    out, answers = {}, []
    qs, qc = w["queries"], w["qcat"]
    for mode in ("unfiltered", "filtered"):
        filt = mode == "filtered"
        for i in range(len(qs)):
            knn(cur, qs[i], qc[i] if filt else None, prepare)
        lat, rec, short = [], 0.0, 0
        for i in range(len(qs)):
            t = now()
            found = knn(cur, qs[i], qc[i] if filt else None, prepare)
            lat.append((now() - t) * 1e3)
            if not filt:
                answers.append(found)
            truth = w["gt_f"][i] if filt else w["gt"][i]
            rec += recall_of(found, truth)
            if len(found) < sum(1 for x in truth if x >= 0):
                short += 1
        lat.sort()
        out[mode] = {"p50_ms": pct(lat, 0.5), "p95_ms": pct(lat, 0.95),
                     "recall": rec / len(qs), "short": short}
    ok, plans = check_plan(system, cur, qs[0], qc[0])
    conn.close()
    return out, ok, plans, answers


def qps_worker(conninfo, init_sql, binary, prepare, queries, expected, start, warmup_s,
               seconds, barrier, results, release):
    """One connection in its own process: warm up, wait for all, then loop over the queries
    for `seconds` and report (count, elapsed, latencies in ms, answers that differ from the
    single client's as sets of ids)."""
    conn = None
    try:
        conn = connect(conninfo)
        cur = conn.cursor(binary=binary)
        for s in init_sql:
            cur.execute(s)
        n, i = len(queries), start
        end = now() + warmup_s
        while now() < end:
            knn(cur, queries[i % n], None, prepare)
            i += 1
        barrier.wait(timeout=600)
        t0 = now()
        deadline = t0 + seconds
        lat, found = [], []
        while True:
            t = now()
            found.append((i % n, knn(cur, queries[i % n], None, prepare)))
            i += 1
            t1 = now()
            lat.append((t1 - t) * 1e3)
            if t1 >= deadline:
                break
        differ = sum(1 for j, ids in found if set(ids) != set(expected[j]))
        results.put(("ok", len(lat), t1 - t0, lat, differ))
    except Exception as e:  # noqa: BLE001
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        results.put(("error", f"{type(e).__name__}: {e}", 0, [], 0))
    release.wait(timeout=600)
    if conn is not None:
        conn.close()


def measure_qps(conninfo, init_sql, w, expected, binary, prepare, conns, warmup_s, seconds,
                memory):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(conns)
    results = ctx.Queue()
    release = ctx.Event()
    nq = len(w["queries"])
    procs = [ctx.Process(target=qps_worker,
                         args=(conninfo, init_sql, binary, prepare, w["queries"], expected,
                               (k * nq) // conns, warmup_s, seconds, barrier, results, release))
             for k in range(conns)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in procs:
            got.append(results.get(timeout=warmup_s + seconds + 600))
        mem = memory()   # every connection still open
    finally:
        release.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    errors = [g[1] for g in got if g[0] != "ok"]
    if errors:
        raise RuntimeError(f"{len(errors)} of {conns} workers failed: {errors[0]}")
    lat = np.sort(np.concatenate([np.asarray(g[3]) for g in got]))
    return {"connections": conns, "qps": sum(g[1] / g[2] for g in got),
            "queries": sum(g[1] for g in got), "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)), "memory": mem,
            "differing_answers": sum(g[4] for g in got)}


# ---------------------------------------------------------------- report

def mem_cell(m):
    if m is None:
        return ""
    if "rss_sum_mb" in m:
        return f"{m['rss_sum_mb']:.0f} / {m['pss_sum_mb']:.0f}"
    return f"{m['rss_mb']:.0f} / {m['hwm_mb']:.0f}"


def mem_points(conns):
    """The connection counts whose memory the table shows: the fewest and the most."""
    return sorted({conns[0], conns[-1]}) if conns else []


def table(rows, conns):
    head = ["system", "setting", "p50 ms", "p95 ms", "recall", "filt p50", "filt p95",
            "filt recall"] + [f"QPS@{c}" for c in conns] + \
        [f"mem@{c} MB" for c in mem_points(conns)] + ["plan", "other CPU"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        u, f = r["single"]["unfiltered"], r["single"]["filtered"]
        qps = {p["connections"]: p for p in r["qps"]}
        cells = [r["system"], r["setting"], f"{u['p50_ms']:.2f}", f"{u['p95_ms']:.2f}",
                 f"{u['recall']:.3f}", f"{f['p50_ms']:.2f}", f"{f['p95_ms']:.2f}",
                 f"{f['recall']:.3f}"]
        cells += [f"{qps[c]['qps']:,.0f}" if c in qps else "" for c in conns]
        cells += [mem_cell(qps.get(c, {}).get("memory")) for c in mem_points(conns)]
        cells += ["ok" if r["plan_ok"] else "NOT THE INDEX",
                  f"{r['other_cpu']:.0%}" + (" !" if r["other_cpu"] > 0.1 else "")]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def pick(rows, system, target, filtered):
    """The cheapest setting (sweep order) with recall ≥ target (unfiltered, and filtered if
    `filtered`); else the one with the best such recall, flagged."""
    mine = [r for r in rows if r["system"] == system]
    if not mine:
        return None, False

    def worst(r):
        u = r["single"]["unfiltered"]["recall"]
        return min(u, r["single"]["filtered"]["recall"]) if filtered else u
    for r in mine:
        if worst(r) >= target:
            return r, True
    return max(mine, key=worst), False


def summary(rows, conns, target):
    lines, chosen_all, ratios_all = [], {}, {}
    for filtered in (True, False):
        crit = "unfiltered and filtered" if filtered else "unfiltered only"
        lines.append(f"\nAt recall ≥ {target} ({crit}), cheapest setting per system:")
        chosen, ratios = {}, {}
        for s in ALL_SYSTEMS:
            r, met = pick(rows, s, target, filtered)
            if r is None:
                continue
            chosen[s] = r
            qps = {p["connections"]: p["qps"] for p in r["qps"]}
            u, f = r["single"]["unfiltered"], r["single"]["filtered"]
            lines.append(f"- {s}: {r['setting']}" +
                         ("" if met else f" (NO setting reaches {target}; best shown)") +
                         f": p50 {u['p50_ms']:.2f} ms, recall {u['recall']:.3f} / filtered "
                         f"{f['recall']:.3f}, QPS " +
                         " / ".join(f"{qps.get(c, float('nan')):,.0f}" for c in conns) +
                         f" at {' / '.join(map(str, conns))} connections")
        if "fragvec" in chosen:
            fq = {p["connections"]: p["qps"] for p in chosen["fragvec"]["qps"]}
            for other in ("hnsw", "ivfflat"):
                if other not in chosen:
                    continue
                oq = {p["connections"]: p["qps"] for p in chosen[other]["qps"]}
                rs = {c: fq[c] / oq[c] for c in conns if c in fq and c in oq and oq[c] > 0}
                ratios[f"qps_vs_{other}"] = rs
                lines.append(f"- fragvec QPS / pgvector {other}: " +
                             ", ".join(f"{rs[c]:.2f}× at {c}" for c in rs))
            if "ivfflat" in chosen:
                r = (chosen["fragvec"]["single"]["unfiltered"]["p50_ms"] /
                     chosen["ivfflat"]["single"]["unfiltered"]["p50_ms"])
                ratios["p50_vs_ivfflat"] = r
                lines.append(f"- fragvec single-client p50 / ivfflat's: {r:.2f}×")
        key = "filtered_and_unfiltered" if filtered else "unfiltered_only"
        chosen_all[key] = {s: r["setting"] for s, r in chosen.items()}
        ratios_all[key] = ratios
    return "\n".join(lines), chosen_all, ratios_all


# ---------------------------------------------------------------- main

def ints(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a directory written by gen_data.py")
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    ap.add_argument("--connections", default="1,4,16", type=ints)
    ap.add_argument("--seconds", type=float, default=5.0, help="measuring window per QPS point")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="seconds each worker queries before the window opens")
    ap.add_argument("--probes", default="1,2,4,8,16,32", type=ints, help="ivfflat.probes values")
    ap.add_argument("--ef-search", default="40,100,200,400", type=ints, help="hnsw.ef_search values")
    ap.add_argument("--nprobes", type=ints, help="fragvec.nprobes values (default: --probes)")
    ap.add_argument("--target-recall", type=float, default=0.95)
    ap.add_argument("--format", choices=["auto", "binary", "text"], default="auto",
                    help="result format of the cursors (auto: binary if every system "
                         "answers the same in binary, else text for all)")
    ap.add_argument("--no-prepare", action="store_true",
                    help="psycopg's default (prepared after 5 executions) instead of prepare=True")
    ap.add_argument("--fragvec-bin",
                    default=os.path.expanduser("~/.cache/fragvec-target/release/fragvec"))
    ap.add_argument("--fragvec-db", help="default DATA/fragvec-serve-db")
    ap.add_argument("--pgdata", help="default DATA/pgdata")
    ap.add_argument("--pg-transport", choices=["tcp", "unix"], default="tcp",
                    help="tcp: 127.0.0.1 like fragvec serve (default); unix: a Unix socket")
    ap.add_argument("--pg-shared-buffers", default="2GB")
    ap.add_argument("--keep", action="store_true", help="keep both databases after the run")
    ap.add_argument("--reuse", action="store_true",
                    help="query databases a --keep run left, without loading or building "
                         "(implies --keep)")
    ap.add_argument("--no-qps", action="store_true", help="single-client figures only")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                    help="before each system's measurements, wait up to this long for the "
                         "machine's other work to drop under 10%% CPU")
    args = ap.parse_args()

    data = os.path.abspath(os.path.expanduser(args.data))
    # one run per data directory: a second one would delete or restart the first one's servers
    import fcntl
    lock = open(os.path.join(data, ".pg_client_bench.lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another pg_client_bench run is using {data} (its PGDATA and fragvec "
                 f"database); wait for it to end")
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in ALL_SYSTEMS:
            ap.error(f"unknown system {s}")
    conns = [] if args.no_qps else args.connections
    args.keep = args.keep or args.reuse
    prepare = not args.no_prepare
    w = load_workload(data)
    meta = w["meta"]
    n, dim = meta["rows"], meta["dim"]
    parts = max(1, round(math.sqrt(n)))
    nprobes = args.nprobes or args.probes
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    out_path = os.path.join(data, "pg_client_results.jsonl")
    records = []
    q0, c0 = w["queries"][0], w["qcat"][0]

    pg = fv = None
    pg_systems = [s for s in systems if s in ("ivfflat", "hnsw")]
    info = {}
    formats = {}
    try:
        # ---- set-up: load and build every system first (so the result format is known)
        if pg_systems:
            pg = PgCluster(args.pgdata or os.path.join(data, "pgdata"), args.pg_transport,
                           args.pg_shared_buffers)
            if not args.reuse and os.path.exists(pg.pgdata):
                shutil.rmtree(pg.pgdata)
            pg.start()
            records += pg_setup(pg, data, meta, pg_systems, args.reuse)
            import psycopg
            with psycopg.connect(pg.conninfo(f"bench_{pg_systems[0]}"), autocommit=True) as c:
                info["pg_version"] = c.execute("SELECT version()").fetchone()[0]
                info["pgvector"] = c.execute("SELECT extversion FROM pg_extension "
                                             "WHERE extname = 'vector'").fetchone()[0]
                info["pg_shared_buffers"] = c.execute("SHOW shared_buffers").fetchone()[0]
            for s in pg_systems:
                formats[s] = probe_binary(pg.conninfo(f"bench_{s}"), q0, c0, prepare)
            pg.stop()
        if "fragvec" in systems:
            db = os.path.abspath(args.fragvec_db or os.path.join(data, "fragvec-serve-db"))
            if not args.reuse and os.path.exists(db):
                shutil.rmtree(db)
            fv = FragvecServer(args.fragvec_bin, db, data,
                               os.path.join(data, "fragvec-serve.log"))
            info["fragvec"] = fv.version()
            fv.start()
            records += fragvec_setup(fv, data, meta, args.reuse)
            formats["fragvec"] = probe_binary(fv.conninfo(), q0, c0, prepare)
            fv.stop()
        for s, (ok, why) in formats.items():
            if not ok:
                log(f"{s}: binary results fail: {why}")
        if args.format == "auto":
            binary = all(ok for ok, _ in formats.values())
        else:
            binary = args.format == "binary"
        fmt = "binary" if binary else "text"

        # ---- measuring, one system at a time, each on a freshly started server
        settings = {
            "ivfflat": [(f"probes={p}", [f"SET ivfflat.probes = {p}"]) for p in args.probes],
            "hnsw": [(f"ef_search={e}", [f"SET hnsw.ef_search = {e}"]) for e in args.ef_search],
            "fragvec": [(f"nprobes={p}", [f"SET fragvec.nprobes = {p}"]) for p in nprobes],
        }
        rows, busy = [], {}
        for s in systems:
            server = pg if s in ("ivfflat", "hnsw") else fv
            waited = now()
            busy[s] = cpu_busy()
            while busy[s] > 0.1 and now() - waited < args.wait_idle:
                log(f"{s}: CPU {busy[s]:.0%} busy with other work; waiting for it to settle")
                time.sleep(10)
                busy[s] = cpu_busy(2.0)
            load_before = os.getloadavg()[0]
            server.start()
            conninfo = server.conninfo(f"bench_{s}")
            log(f"{s}: measuring on {conninfo} (load average {load_before:.2f}, CPU busy "
                f"before measuring {busy[s]:.0%})")
            try:
                for label, init in settings[s]:
                    other = OtherCpu(server.pid())
                    single, plan_ok, plans, answers = single_client(conninfo, init, w, binary,
                                                                    prepare, s)
                    if not plan_ok:
                        log(f"{s} {label}: the plan does not use the intended index:\n" +
                            "\n".join(f"-- {k}\n{v}" for k, v in plans.items()))
                    points = []
                    for c in conns:
                        points.append(measure_qps(conninfo, init, w, answers, binary, prepare,
                                                  c, args.warmup, args.seconds, server.memory))
                        if points[-1]["differing_answers"]:
                            log(f"{s} {label}: {points[-1]['differing_answers']} answers at "
                                f"{c} connections differ from the single client's")
                    row = {"kind": "result", "run": run_id, "system": s, "setting": label,
                           "init_sql": init, "single": single, "qps": points,
                           "loadavg_1m": [load_before, os.getloadavg()[0]],
                           "cpu_busy_before": busy[s], "other_cpu": other.stop(),
                           "plan_ok": plan_ok, "plans": plans}
                    rows.append(row)
                    u, f = single["unfiltered"], single["filtered"]
                    log(f"{s} {label}: p50 {u['p50_ms']:.2f} ms r {u['recall']:.3f}, filtered "
                        f"p50 {f['p50_ms']:.2f} ms r {f['recall']:.3f}, QPS " +
                        " / ".join(f"{p['qps']:,.0f}" for p in points))
            finally:
                server.stop()
        records += rows

        # ---- report
        print(f"\n## pg_client_bench: {n:,} x {dim}, {len(w['queries'])} queries, k = {K}, "
              f"√N = {parts} lists / partitions\n")
        print(f"Client: psycopg + pgvector.psycopg register_vector, numpy float32 query as a "
              f"bound parameter, prepare={prepare}, {fmt} results"
              + (" (binary failed on: " + ", ".join(s for s, (ok, _) in formats.items()
                                                    if not ok) + ")" if not binary and
                 args.format == "auto" else "")
              + f", autocommit; PostgreSQL over {args.pg_transport}, fragvec over tcp.")
        for k, v in info.items():
            print(f"{k}: {v}")
        for r in records:
            if r.get("kind") == "setup":
                print(f"setup {r['system']}: {r['step']}: {r['seconds']:.1f} s"
                      + (f" ({r['index_mb']:.0f} MB)" if "index_mb" in r else ""))
        print(f"QPS: unfiltered, {args.seconds:g} s window after {args.warmup:g} s warm-up per "
              f"point, one process + connection per client, total over clients.")
        print("mem: server memory with the connections open, MB — PostgreSQL: sum of RSS / "
              "sum of PSS over postmaster + children; fragvec: VmRSS / VmHWM.\n")
        print("other CPU: the share of the machine's CPU that other work (not this benchmark, "
              "not the server) used during the row; ! over 10%: that row's figures are skewed.\n")
        print(table(rows, conns))
        differ = [(r["system"], r["setting"], p["connections"], p["differing_answers"])
                  for r in rows for p in r["qps"] if p["differing_answers"]]
        if conns:
            print("\nAnswers under load (as sets of ids) vs the single client's, same setting: " +
                  ("all identical" if not differ else "; ".join(
                      f"{s} {l} @{c}: {d} differ" for s, l, c, d in differ)))
        text, chosen, ratios = summary(rows, conns, args.target_recall) if conns else ("", {}, {})
        print(text)
        records.append({"kind": "summary", "run": run_id, "chosen": chosen, "ratios": ratios})
        common = {"run": run_id, "data": data, "rows": n, "dim": dim, "format": fmt,
                  "prepare": prepare, "seconds": args.seconds, "warmup": args.warmup,
                  "pg_transport": args.pg_transport, **info}
        with open(out_path, "a") as f:
            for r in records:
                f.write(json.dumps({**common, **r}) + "\n")
        log(f"records appended to {out_path}")
    finally:
        if fv is not None:
            fv.stop()
            if not args.keep and os.path.exists(fv.db):
                shutil.rmtree(fv.db)
        if pg is not None:
            try:
                pg.stop()
            finally:
                if not args.keep and os.path.exists(pg.pgdata):
                    shutil.rmtree(pg.pgdata)


if __name__ == "__main__":
    main()

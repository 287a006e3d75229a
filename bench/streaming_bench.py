#!/usr/bin/env python3
"""Streaming benchmark: KNN queries while rows are inserted, deleted and re-embedded, on
fragvec with and without automatic maintenance, Lance and PostgreSQL + pgvector.

    PY=~/.cache/fragvec-bench-venv/bin/python
    # the full run (1M x 128 anchor data; about 15 min per system and client count)
    $PY bench/streaming_bench.py --data ~/.cache/fragvec-bench-data/1m-128 --clients 1,4
    # one system, one client count
    $PY bench/streaming_bench.py --systems fragvec-auto,lance --clients 4
    # a short check (a few minutes)
    $PY bench/streaming_bench.py --base-rows 50000 --duration 60 --window 15 --clients 1 \\
        --systems fragvec-off,lance,pgvector

Per system and client count C (each a full run, one after the other, same seed):
  1. load ids 0..BASE-1 of items.parquet and build the vector index (IVF_FLAT with
     round(sqrt(BASE)) partitions; pgvector: HNSW m = 16, ef_construction = 64, or IVFFlat);
     fragvec-auto then sets ALTER TABLE items SET (auto_index = on, ...) (AUTO_PROPS below;
     a build without them is reported and skipped here);
  2. pick the search setting: the smallest of the sweep (--nprobes / --ef-search / --pg-probes)
     whose recall@10 over the 200 queries on the static table is >= --choose-recall (0.97),
     then measure the static p50 / p99 / QPS at that setting with C clients (--static-seconds);
  3. stream for --duration seconds: one writer inserts the rows BASE.. in --batch-row batches
     at --rate rows/s, and every --mutation-interval seconds deletes and re-embeds a few random
     live rows (--delete-fraction and --reembed-fraction of the final row count over the run;
     a re-embedded vector is vectors[j] + N(0, --noise) for a random j), while C client threads
     send `SELECT id FROM items ORDER BY emb <-> %s LIMIT 10` (the 200 queries, cycled);
  4. every --window seconds: QPS, p50, p99 of the clients' queries in the window, recall@10
     of --probe-queries queries against exact ground truth of the rows live at that moment
     (writer and clients paused meanwhile, see below), unindexed rows, fragments, segments,
     versions, maintenance tasks run so far;
  5. after the run: count(*), sum(id) and sum(id*id) of the table, and a sample of vectors,
     against the model: PASS / FAIL.

Systems (--systems, default all four):
  fragvec-auto  `fragvec serve --maintenance-interval 5` (--fragvec-bin), the table loaded with
                INSERT ... SELECT from items.parquet, IVF_FLAT, then the ALTER TABLE above;
                state from fragvec_fragments / _versions / _indexes / _maintenance('items')
  fragvec-off   the same without the flag and the ALTER (nobody runs OPTIMIZE)
  lance         pylance in this process: insert = ds.insert (append), delete = ds.delete,
                re-embed = merge_insert("id").when_matched_update_all() (--lance-reembed);
                a thread runs optimize_indices() + compact_files() every 60 s of stream time;
                readers use the dataset object the latest commit published (below)
  pgvector      PostgreSQL 16 + pgvector from pgserver, HNSW (--pg-index ivfflat: IVFFlat)
fragvec and pgvector get the same psycopg SQL: a 100-row INSERT ... VALUES with bound
parameters (vectors as numpy arrays through pgvector's register_vector), DELETE FROM items
WHERE id IN (...), UPDATE items SET emb = %s WHERE id = %s per re-embedded row; autocommit.

Recall probe: at each window boundary the clients and the writer are paused (threading
Conditions: the gate closes, the in-flight query and the in-flight write batch finish), the
probe queries run one at a time on their own connection / dataset object, the exact answer is
computed with numpy over the model (a float32 copy of vectors.npy with every re-embed applied
and a live mask; candidates by |x|^2 - 2 x.q in float32, the best 64 per chunk re-scored in
float64, ties by id), then writer and clients resume. The pause is excluded from the stream
clock (the writer's schedule, the windows and --duration all run on it) and from the QPS
denominator; background maintenance of every system keeps running during the pause.

Output: one JSON record per window (kind "window") and one per system run (kind "run") appended
to OUT/streaming_results.jsonl, a Markdown table per C on stdout, a PNG per C
(OUT/streaming-C{c}.png). Scratch databases go to OUT/streaming-scratch/<system> (removed
after each system's run unless --keep); server logs to OUT/streaming-<system>.log.
See bench/STREAMING.md.
"""

import argparse
import collections
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pg_client_bench import (FragvecServer, PgCluster, children_of, connect,  # noqa: E402
                             cpu_ticks_total, knn, log, now, process_ticks)

K = 10
ALL_SYSTEMS = ("fragvec-auto", "fragvec-off", "lance", "pgvector")
# What fragvec-auto sets before streaming (ALTER TABLE items SET (...)); --auto-set k=v overrides.
AUTO_PROPS = {
    "auto_index": "on",
    "auto_index_rows": 20000,
    "auto_index_age_seconds": 60,
    "auto_compact": "on",
    "auto_compact_small_fragments": 16,
    "auto_merge_segments": 4,
    "auto_vacuum_retain": 20,
}
INDEX_NAME = "items_idx"
LANCE_INDEX = "emb_idx"


class Skip(Exception):
    """A system that cannot run with this build / environment (reported, not fatal)."""


# ---------------------------------------------------------------- the model and ground truth

class Model:
    """What the table should hold: every vector (row i = id i; re-embeds applied), its norm,
    the live mask, and the live ids as a swap-remove list for uniform random picks."""

    def __init__(self, pristine, category, base):
        self.pristine = pristine
        self.category = category
        self.n_total, self.dim = pristine.shape
        self.x = np.empty(pristine.shape, dtype=np.float32)
        self.norms = np.empty(self.n_total, dtype=np.float32)
        self.live = np.zeros(self.n_total, dtype=bool)
        self.list = np.empty(self.n_total, dtype=np.int64)
        self.pos = np.full(self.n_total, -1, dtype=np.int64)
        self.reset(base)

    def reset(self, base):
        for s in range(0, self.n_total, 131072):
            e = min(s + 131072, self.n_total)
            self.x[s:e] = self.pristine[s:e]
            self.norms[s:e] = np.einsum("ij,ij->i", self.x[s:e], self.x[s:e])
        self.live[:] = False
        self.pos[:] = -1
        self.n_live = 0
        self.hi = 0                     # one past the largest id ever inserted
        self.reembedded = []            # ids re-embedded, in order
        self.add(np.arange(base))

    def add(self, ids):
        n = len(ids)
        self.list[self.n_live:self.n_live + n] = ids
        self.pos[ids] = np.arange(self.n_live, self.n_live + n)
        self.live[ids] = True
        self.n_live += n
        if n:
            self.hi = max(self.hi, int(ids.max()) + 1)

    def remove(self, ids):
        for i in ids:
            p = self.pos[i]
            last = self.list[self.n_live - 1]
            self.list[p] = last
            self.pos[last] = p
            self.pos[i] = -1
            self.n_live -= 1
        self.live[ids] = False

    def set_vectors(self, ids, vecs):
        self.x[ids] = vecs
        self.norms[ids] = np.einsum("ij,ij->i", vecs, vecs)
        self.reembedded.extend(int(i) for i in ids)

    def pick(self, rng, k):
        k = min(k, self.n_live)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        return self.list[rng.choice(self.n_live, size=k, replace=False)].copy()

    def live_ids(self):
        return np.sort(self.list[:self.n_live])

    def checksum(self):
        ids = self.list[:self.n_live].astype(np.int64)
        return int(self.n_live), int(ids.sum()), int((ids * ids).sum())

    def exact_topk(self, queries, k=K, chunk=131072, cand=64):
        """Exact nearest live ids per query (float32 candidates, float64 re-scoring)."""
        q32 = np.ascontiguousarray(queries, dtype=np.float32)
        pieces = []
        for s in range(0, self.hi, chunk):
            e = min(s + chunk, self.hi)
            mask = self.live[s:e]
            if not mask.any():
                continue
            d = self.norms[s:e][None, :] - 2.0 * (q32 @ self.x[s:e].T)
            d[:, ~mask] = np.inf
            kk = min(cand, e - s)
            pieces.append(np.argpartition(d, kk - 1, axis=1)[:, :kk] + s)
        cands = np.concatenate(pieces, axis=1)
        out = np.full((len(q32), k), -1, dtype=np.int64)
        for i in range(len(q32)):
            c = np.unique(cands[i])
            c = c[self.live[c]]
            diff = self.x[c].astype(np.float64) - queries[i].astype(np.float64)
            dd = np.einsum("ij,ij->i", diff, diff)
            best = c[np.lexsort((c, dd))[:k]]
            out[i, :len(best)] = best
        return out


def recall_at_k(found, truth):
    total = 0.0
    for f, t in zip(found, truth):
        t = set(int(x) for x in t if x >= 0)
        total += len(t.intersection(int(x) for x in f)) / len(t) if t else 1.0
    return total / max(1, len(truth))


def pctl(values, p):
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values), p))


# ---------------------------------------------------------------- pausing and the stream clock

class Gate:
    """Workers enter before each operation and exit after; pause() closes the gate and waits
    until no operation is in flight."""

    def __init__(self):
        self.cond = threading.Condition()
        self.paused = False
        self.active = 0

    def enter(self, stop):
        with self.cond:
            while self.paused and not stop.is_set():
                self.cond.wait(0.1)
            if stop.is_set():
                return False
            self.active += 1
            return True

    def exit(self):
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def pause(self):
        with self.cond:
            self.paused = True
            while self.active:
                self.cond.wait()

    def resume(self):
        with self.cond:
            self.paused = False
            self.cond.notify_all()


class StreamClock:
    """Seconds since the stream began, not counting the pauses for probes."""

    def __init__(self):
        self.t0 = now()
        self.paused_total = 0.0
        self.pause_start = None

    def t(self):
        p = self.paused_total + (now() - self.pause_start if self.pause_start else 0.0)
        return now() - self.t0 - p

    def pause(self):
        self.pause_start = now()

    def resume(self):
        self.paused_total += now() - self.pause_start
        self.pause_start = None

    def restart(self):
        self.t0, self.paused_total, self.pause_start = now(), 0.0, None


def sleep_until(clock, t, stop):
    while not stop.is_set():
        left = t - clock.t()
        if left <= 0:
            return True
        time.sleep(min(left, 0.05))
    return False


# ---------------------------------------------------------------- systems: common parts

SQL_INSERT_ROW = "(%s, %s, %s)"


class PgWireSystem:
    """A system reached with psycopg: fragvec serve or PostgreSQL. Writes and queries are the
    same SQL for both."""

    def conninfo(self):
        raise NotImplementedError

    def query_client(self, setting):
        return PgQueryClient(self.conninfo(), self.setting_sql(setting))

    def client_spec(self, setting):
        """What a client in another process needs: (conninfo, statements to run first)."""
        return self.conninfo(), self.setting_sql(setting)

    def begin_streaming(self):
        self.wconn = connect(self.conninfo())

    def insert(self, ids, cats, vecs):
        sql = ("INSERT INTO items (id, category, emb) VALUES " +
               ", ".join([SQL_INSERT_ROW] * len(ids)))
        params = []
        for i, c, v in zip(ids, cats, vecs):
            params += [int(i), int(c), v]
        cur = self.wconn.execute(sql, params)
        return cur.rowcount

    def delete(self, ids):
        cur = self.wconn.execute(
            "DELETE FROM items WHERE id IN (" + ", ".join(str(int(i)) for i in ids) + ")")
        return cur.rowcount

    def reembed_one(self, i, cat, vec):
        cur = self.wconn.execute("UPDATE items SET emb = %s WHERE id = %s", (vec, int(i)))
        return cur.rowcount

    def start_background(self, clock):
        pass            # the server's own maintenance (if any) needs nothing from us

    def configure(self):
        pass

    def end_streaming(self):
        if getattr(self, "wconn", None) is not None:
            self.wconn.close()
            self.wconn = None

    def final_checksum(self):
        with connect(self.conninfo()) as c:
            n, s, s2 = c.execute("SELECT count(*), sum(id), sum(id * id) FROM items").fetchone()
        return int(n), int(s or 0), int(s2 or 0)

    def fetch_vectors(self, ids):
        with connect(self.conninfo()) as c:
            rows = c.execute("SELECT id, emb FROM items WHERE id IN (" +
                             ", ".join(str(int(i)) for i in ids) + ")").fetchall()
        out = collections.defaultdict(list)
        for i, v in rows:
            out[int(i)].append(np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v,
                                          dtype=np.float32))
        return out


class PgQueryClient:
    def __init__(self, conninfo, init_sql):
        self.conn = connect(conninfo)
        self.cur = self.conn.cursor()
        for s in init_sql:
            self.cur.execute(s)

    def query(self, q):
        return knn(self.cur, q)

    def close(self):
        self.conn.close()


class FragvecServe(FragvecServer):
    """FragvecServer with extra arguments (--maintenance-interval); raises Skip when the
    binary refuses one of them."""

    def __init__(self, binary, db, allow_files, log_path, extra):
        super().__init__(binary, db, allow_files, log_path)
        self.extra = extra

    def start(self):
        cmd = [self.binary, "serve", "--db", self.db, "--pg", "127.0.0.1:0",
               "--allow-files", self.allow_files] + self.extra
        with open(self.log_path, "a") as logf:
            logf.write(f"\n# {' '.join(cmd)}\n")
        start = os.path.getsize(self.log_path)
        logf = open(self.log_path, "a")
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
                bad = [e for e in self.extra if e.startswith("--") and e in text]
                if "unexpected argument" in text and bad:
                    raise Skip(f"this fragvec binary ({self.binary}) does not know "
                               f"{', '.join(bad)}: it predates automatic maintenance. "
                               f"Server said: {text.strip().splitlines()[0]}")
                raise RuntimeError(f"fragvec serve exited {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        raise RuntimeError("fragvec serve did not report its address in 120 s")


class FragvecSystem(PgWireSystem):
    def __init__(self, name, a, scratch):
        self.name, self.a, self.scratch = name, a, scratch
        self.auto = name == "fragvec-auto"
        self.server = None
        self.state_conn = None
        self.has_maintenance_fn = True

    def start(self):
        extra = []
        if self.auto and self.a.maintenance_interval > 0:
            extra = ["--maintenance-interval", f"{self.a.maintenance_interval:g}"]
        self.server = FragvecServe(self.a.fragvec_bin, os.path.join(self.scratch, "db"),
                                   self.a.data, os.path.join(self.a.out,
                                                             f"streaming-{self.name}.log"),
                                   extra)
        self.server.start()

    def conninfo(self):
        return self.server.conninfo()

    def info(self):
        return {"fragvec": self.server.version(), "server_args": self.server.extra}

    def server_pids(self):
        return [self.server.pid()] if self.server and self.server.proc else []

    def load(self, model, base, parts):
        records = []
        with connect(self.conninfo()) as c:
            path = os.path.join(self.a.data, "items.parquet")
            t = now()
            c.execute(f"CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{path}'")
            c.execute(f"CREATE TABLE items (id BIGINT NOT NULL, category INT NOT NULL, "
                      f"emb VECTOR({model.dim}))")
            cur = c.execute(f"INSERT INTO items SELECT id, category, emb FROM src "
                            f"WHERE id < {base}")
            records.append({"step": "INSERT INTO items SELECT ... WHERE id < BASE",
                            "rows": cur.rowcount, "seconds": now() - t})
            try:
                c.execute("DROP TABLE src")
            except Exception:  # noqa: BLE001 (an external table that stays is harmless)
                pass
            sql = (f"CREATE VECTOR INDEX {INDEX_NAME} ON items (emb) USING IVF_FLAT "
                   f"WITH (num_partitions = {parts})")
            t = now()
            c.execute(sql)
            records.append({"step": "index build", "sql": sql, "seconds": now() - t})
        return records

    def settings(self):
        return [(f"nprobes={p}", p) for p in self.a.nprobes]

    def setting_sql(self, p):
        return [f"SET fragvec.nprobes = {p}"]

    def configure(self):
        """fragvec-auto: the table properties, right after the index build (a static table
        gives automatic maintenance nothing to do, so the sweep and the static baseline are
        unaffected; a build without them fails here, before any measuring)."""
        if self.auto:
            props = ", ".join(f"{k} = {v}" for k, v in self.a.auto_props.items())
            sql = f"ALTER TABLE items SET ({props})"
            try:
                with connect(self.conninfo()) as c:
                    c.execute(sql)
            except Exception as e:  # noqa: BLE001
                raise Skip(f"`{sql}` failed: {type(e).__name__}: {e}. This fragvec build has "
                           f"no automatic maintenance (table properties); fragvec-auto not "
                           f"run.") from None
            log(f"{self.name}: {sql}")

    def begin_streaming(self):
        self.state_conn = connect(self.conninfo())
        super().begin_streaming()

    def reembed(self, ids, cats, vecs):
        return sum(self.reembed_one(i, c, v) for i, c, v in zip(ids, cats, vecs))

    def state(self):
        c = self.state_conn
        one = lambda sql: int(c.execute(sql).fetchone()[0])
        s = {"fragments": one("SELECT count(*) FROM fragvec_fragments('items')"),
             "versions": one("SELECT count(*) FROM fragvec_versions('items')")}
        cur = c.execute("SELECT * FROM fragvec_indexes('items')")
        cols = [d.name for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        row = next((r for r in rows if r["name"] == INDEX_NAME), rows[0] if rows else {})
        num = lambda v: None if v is None else int(v)
        s["segments"] = num(row.get("segments"))
        s["unindexed_fragments"] = num(row.get("unindexed_fragments"))
        s["unindexed_rows"] = num(row.get("unindexed_rows"))
        # rows of fragments that no segment's fragment_bitmap lists: the figure before
        # fragvec_indexes had unindexed_rows
        frags = c.execute("SELECT id, physical_rows, deleted_rows "
                          "FROM fragvec_fragments('items')").fetchall()
        cur = c.execute("SELECT * FROM fragvec_segments('items')")
        cols = [d.name for d in cur.description]
        covered = set()
        for r in cur.fetchall():
            r = dict(zip(cols, r))
            if r.get("index") == INDEX_NAME and r.get("fragment_bitmap"):
                covered.update(int(x) for x in r["fragment_bitmap"].split(","))
        s["unindexed_rows_est"] = sum(int(p) - int(d) for f, p, d in frags
                                      if int(f) not in covered)
        s["maintenance_tasks"], s["maintenance"] = None, None
        if self.has_maintenance_fn:
            try:
                got = c.execute("SELECT kind, outcome FROM fragvec_maintenance('items')"
                                ).fetchall()
                s["maintenance_tasks"] = len(got)
                s["maintenance"] = dict(collections.Counter(f"{k}:{o}" for k, o in got))
            except Exception as e:  # noqa: BLE001
                if "not found" in str(e) or "does not exist" in str(e):
                    self.has_maintenance_fn = False
                else:
                    s["maintenance"] = f"error: {e}"
        return s

    def end_streaming(self):
        super().end_streaming()
        if self.state_conn is not None:
            self.state_conn.close()
            self.state_conn = None

    def stop(self):
        if self.server is not None:
            self.server.stop()


class PgvectorSystem(PgWireSystem):
    name = "pgvector"

    def __init__(self, a, scratch):
        self.a, self.scratch = a, scratch
        self.pg = None
        self.state_conn = None
        self.db = "bench_stream"

    def start(self):
        try:
            # a fresh path per run: pgserver keeps one server object per PGDATA path for
            # the life of the process, a stopped one included
            self.pg = PgCluster(os.path.join(self.scratch, f"pgdata-{time.time_ns()}"), "tcp",
                                self.a.pg_shared_buffers)
        except ImportError as e:
            raise Skip(f"pgserver cannot be imported ({e})") from None
        self.pg.start()

    def conninfo(self):
        return self.pg.conninfo(self.db)

    def info(self):
        with connect(self.conninfo()) as c:
            return {"pg_version": c.execute("SELECT version()").fetchone()[0],
                    "pgvector": c.execute("SELECT extversion FROM pg_extension "
                                          "WHERE extname = 'vector'").fetchone()[0],
                    "pg_shared_buffers": c.execute("SHOW shared_buffers").fetchone()[0],
                    "pg_index": self.a.pg_index}

    def server_pids(self):
        pid = self.pg.pid() if self.pg else None
        return [pid] + children_of(pid) if pid else []

    def load(self, model, base, parts):
        import psycopg
        with psycopg.connect(self.pg.conninfo("postgres"), autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {self.db}")
            c.execute(f"CREATE DATABASE {self.db}")
        records = []
        dim = model.dim
        row = np.dtype([("n", ">i2"), ("l_id", ">i4"), ("id", ">i8"), ("l_cat", ">i4"),
                        ("cat", ">i4"), ("l_emb", ">i4"), ("dim", ">i2"), ("unused", ">i2"),
                        ("emb", ">f4", (dim,))])
        with psycopg.connect(self.conninfo(), autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS vector")
            c.execute(f"CREATE TABLE items (id bigint PRIMARY KEY, category int, "
                      f"emb vector({dim}))")
            t = now()
            with c.cursor().copy("COPY items (id, category, emb) FROM STDIN "
                                 "WITH (FORMAT BINARY)") as copy:
                copy.write(b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8)
                for s in range(0, base, 65536):
                    e = min(s + 65536, base)
                    arr = np.empty(e - s, dtype=row)
                    arr["n"], arr["l_id"], arr["id"], arr["l_cat"] = 3, 8, np.arange(s, e), 4
                    arr["cat"] = model.category[s:e]
                    arr["l_emb"], arr["dim"], arr["unused"] = 4 + 4 * dim, dim, 0
                    arr["emb"] = model.pristine[s:e]
                    copy.write(arr.tobytes())
                copy.write(b"\xff\xff")
            records.append({"step": "COPY FROM STDIN (BINARY)", "rows": base,
                            "seconds": now() - t})
            t = now()
            c.execute("VACUUM ANALYZE items")
            records.append({"step": "VACUUM ANALYZE", "seconds": now() - t})
            if self.a.pg_index == "hnsw":
                sql = (f"CREATE INDEX items_hnsw ON items USING hnsw (emb vector_l2_ops) "
                       f"WITH (m = {self.a.hnsw_m}, ef_construction = "
                       f"{self.a.hnsw_ef_construction})")
            else:
                sql = (f"CREATE INDEX items_ivfflat ON items USING ivfflat (emb vector_l2_ops) "
                       f"WITH (lists = {parts})")
            c.execute(f"SET maintenance_work_mem = '{self.a.pg_maintenance_work_mem}'")
            t = now()
            c.execute(sql)
            records.append({"step": "index build", "sql": sql, "seconds": now() - t})
            log(f"pgvector: {sql}: {now() - t:.1f} s")
        return records

    def settings(self):
        if self.a.pg_index == "hnsw":
            return [(f"ef_search={e}", e) for e in self.a.ef_search]
        return [(f"probes={p}", p) for p in self.a.pg_probes]

    def setting_sql(self, v):
        if self.a.pg_index == "hnsw":
            return [f"SET hnsw.ef_search = {v}"]
        return [f"SET ivfflat.probes = {v}"]

    def begin_streaming(self):
        self.state_conn = connect(self.conninfo())
        super().begin_streaming()
        self.counters0 = self.counters()

    def counters(self):
        r = self.state_conn.execute(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count "
            "FROM pg_stat_user_tables WHERE relname = 'items'").fetchone()
        return tuple(int(x or 0) for x in r) if r else None

    def reembed(self, ids, cats, vecs):
        return sum(self.reembed_one(i, c, v) for i, c, v in zip(ids, cats, vecs))

    def state(self):
        """autovacuum / autoanalyze runs since the stream began (pg_stat_user_tables)."""
        r = self.counters()
        live, dead, av, aa = r if r else (None,) * 4
        if r and self.counters0:
            av, aa = av - self.counters0[2], aa - self.counters0[3]
        return {"unindexed_rows": 0, "unindexed_rows_est": None, "unindexed_fragments": None,
                "fragments": None, "segments": None, "versions": None,
                "maintenance_tasks": (av + aa) if r else None,
                "maintenance": {"autovacuum": av, "autoanalyze": aa, "n_dead_tup": dead,
                                "n_live_tup": live}}

    def end_streaming(self):
        super().end_streaming()
        if self.state_conn is not None:
            self.state_conn.close()
            self.state_conn = None

    def stop(self):
        if self.pg is not None:
            self.pg.stop()


# ---------------------------------------------------------------- Lance

class LanceSystem:
    """pylance in this process. Readers use, per query, the dataset object that the last
    commit published: every commit (writer or maintenance thread) opens the latest version
    with lance.dataset(path, session=S), S being the session of the first object, so the index
    and metadata caches are shared and nothing is re-read cold."""

    name = "lance"

    def __init__(self, a, scratch):
        self.a, self.scratch = a, scratch
        self.path = os.path.join(scratch, "items.lance")
        self.reader = None
        self.session = None
        self.pub_lock = threading.Lock()
        self.tasks = []
        self.maint_thread = None
        self.maint_stop = threading.Event()
        self.clock = None

    def start(self):
        os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")
        os.environ.setdefault("LANCE_LOG", self.a.lance_log)
        try:
            import lance
        except ImportError as e:
            raise Skip(f"pylance cannot be imported ({e}); ~/.cache/fragvec-bench-venv/bin/pip "
                       f"install pylance") from None
        self.lance = lance

    def info(self):
        return {"lance": self.lance.__version__, "lance_reembed": self.a.lance_reembed,
                "lance_target_partition_size": self.target_partition_size}

    def server_pids(self):
        return []

    def schema(self):
        import pyarrow as pa
        return pa.schema([pa.field("id", pa.int64(), nullable=False),
                          pa.field("category", pa.int32(), nullable=False),
                          pa.field("emb", pa.list_(pa.float32(), self.dim))])

    def table(self, ids, cats, vecs):
        import pyarrow as pa
        vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        return pa.Table.from_arrays(
            [pa.array(np.asarray(ids, dtype=np.int64)), pa.array(np.asarray(cats, np.int32)),
             pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), self.dim)],
            schema=self.schema())

    def load(self, model, base, parts):
        import pyarrow as pa
        self.dim = model.dim
        records = []

        def batches():
            for s in range(0, base, 65536):
                e = min(s + 65536, base)
                yield from self.table(np.arange(s, e), model.category[s:e],
                                      model.pristine[s:e]).to_batches()
        t = now()
        ds = self.lance.write_dataset(pa.RecordBatchReader.from_batches(self.schema(),
                                                                        batches()), self.path)
        records.append({"step": "write_dataset", "rows": base, "seconds": now() - t})
        tps = self.a.lance_target_partition_size
        self.target_partition_size = (max(1, base // parts) if tps == "auto"
                                      else int(tps) or None)
        kw = {}
        if self.target_partition_size:
            kw["target_partition_size"] = self.target_partition_size
        t = now()
        ds.create_index("emb", index_type="IVF_FLAT", metric="L2", num_partitions=parts,
                        name=LANCE_INDEX, **kw)
        records.append({"step": "index build", "seconds": now() - t,
                        "sql": f"create_index('emb', 'IVF_FLAT', num_partitions={parts}, "
                               f"{', '.join(f'{k}={v}' for k, v in kw.items())})"})
        self.session = ds.session()
        self.wds = self.lance.dataset(self.path, session=self.session)
        self.publish()
        return records

    def open_latest(self):
        return self.lance.dataset(self.path, session=self.session)

    def publish(self):
        d = self.open_latest()
        with self.pub_lock:
            if self.reader is None or d.version > self.reader.version:
                self.reader = d

    def settings(self):
        return [(f"nprobes={p}", p) for p in self.a.nprobes]

    def query_client(self, nprobes):
        return LanceQueryClient(self, nprobes)

    def configure(self):
        pass

    def begin_streaming(self):
        pass

    def start_background(self, clock):
        self.clock = clock
        self.maint_stop.clear()
        if self.a.lance_maintenance_interval > 0:
            self.maint_thread = threading.Thread(target=self.maintenance_loop, daemon=True)
            self.maint_thread.start()

    def maintenance_loop(self):
        interval = self.a.lance_maintenance_interval
        k = 1
        while not self.maint_stop.is_set():
            if not sleep_until(self.clock, k * interval, self.maint_stop):
                return
            k += 1
            tasks = [("optimize_indices", lambda d: d.optimize.optimize_indices()),
                     ("compact_files", lambda d: d.optimize.compact_files())]
            if self.a.lance_cleanup_older_than > 0:
                from datetime import timedelta
                age = timedelta(seconds=self.a.lance_cleanup_older_than)
                tasks.append(("cleanup_old_versions",
                              lambda d: d.cleanup_old_versions(older_than=age)))
            for kind, fn in tasks:
                if self.maint_stop.is_set():
                    return
                t0, started = now(), self.clock.t()
                try:
                    res = fn(self.open_latest())
                    outcome = "ok"
                except Exception as e:  # noqa: BLE001
                    res, outcome = None, f"error: {type(e).__name__}: {e}"
                self.tasks.append({"kind": kind, "started": started, "seconds": now() - t0,
                                   "outcome": outcome, "result": str(res) if res else None})
                log(f"lance maintenance: {kind} at {started:.0f} s: {outcome} "
                    f"({now() - t0:.1f} s){'' if res is None else ' ' + str(res)}")
                self.publish()

    def insert(self, ids, cats, vecs):
        self.wds.insert(self.table(ids, cats, vecs))
        self.publish()
        return len(ids)

    def delete(self, ids):
        self.wds.checkout_latest()
        r = self.wds.delete("id IN (" + ", ".join(str(int(i)) for i in ids) + ")")
        self.publish()
        return (r or {}).get("num_deleted_rows", len(ids))

    def reembed(self, ids, cats, vecs):
        self.wds.checkout_latest()
        if self.a.lance_reembed == "merge_insert":
            r = (self.wds.merge_insert("id").when_matched_update_all()
                 .execute(self.table(ids, cats, vecs)))
            n = r.get("num_updated_rows", len(ids))
        else:   # delete + append: two commits
            self.wds.delete("id IN (" + ", ".join(str(int(i)) for i in ids) + ")")
            self.wds.insert(self.table(ids, cats, vecs))
            n = len(ids)
        self.publish()
        return n

    def state(self):
        d = self.open_latest()
        st = d.stats.index_stats(LANCE_INDEX)
        try:
            versions = sum(1 for f in os.listdir(os.path.join(self.path, "_versions"))
                           if f.endswith(".manifest"))
        except OSError:
            versions = None
        kinds = collections.Counter(f"{t['kind']}:{'ok' if t['outcome'] == 'ok' else 'error'}"
                                    for t in self.tasks)
        return {"unindexed_rows": st.get("num_unindexed_rows"),
                "unindexed_rows_est": None,
                "unindexed_fragments": st.get("num_unindexed_fragments"),
                "fragments": len(d.get_fragments()),
                "segments": st.get("num_segments", st.get("num_indices")),
                "versions": versions,
                "maintenance_tasks": len(self.tasks), "maintenance": dict(kinds),
                "lance_partitions": [s.get("num_partitions") for s in st.get("segments", [])]}

    def end_streaming(self):
        self.maint_stop.set()
        if self.maint_thread is not None:
            self.maint_thread.join()
            self.maint_thread = None

    def final_checksum(self):
        d = self.open_latest()
        ids = d.to_table(columns=["id"]).column("id").to_numpy().astype(np.int64)
        return int(len(ids)), int(ids.sum()), int((ids * ids).sum())

    def fetch_vectors(self, ids):
        d = self.open_latest()
        t = d.to_table(columns=["id", "emb"],
                       filter="id IN (" + ", ".join(str(int(i)) for i in ids) + ")")
        out = collections.defaultdict(list)
        embs = t.column("emb").combine_chunks()
        vals = embs.values.to_numpy(zero_copy_only=False).reshape(-1, self.dim)
        for i, v in zip(t.column("id").to_numpy(), vals):
            out[int(i)].append(v)
        return out

    def stop(self):
        self.end_streaming()
        self.reader = self.wds = None


class LanceQueryClient:
    def __init__(self, system, nprobes):
        self.s, self.nprobes = system, nprobes

    def query(self, q):
        d = self.s.reader
        t = d.to_table(columns=["id"], nearest={"column": "emb", "q": q, "k": K,
                                                "nprobes": self.nprobes},
                       disable_scoring_autoprojection=True)
        return t.column("id").to_pylist()

    def close(self):
        pass


def make_system(name, a, scratch):
    if name.startswith("fragvec"):
        return FragvecSystem(name, a, scratch)
    if name == "lance":
        return LanceSystem(a, scratch)
    return PgvectorSystem(a, scratch)


# ---------------------------------------------------------------- CPU of others

class OtherCpu:
    """Share of the machine's CPU used by anything but this process and the system's server
    processes, between two samples."""

    def __init__(self, pids_fn):
        self.pids_fn = pids_fn
        self.prev = self.sample()

    def sample(self):
        busy, total = cpu_ticks_total()
        ours = process_ticks(os.getpid()) + sum(process_ticks(p) for p in self.pids_fn())
        return busy, total, ours

    def take(self):
        cur = self.sample()
        b0, t0, o0 = self.prev
        b1, t1, o1 = cur
        self.prev = cur
        return max(0.0, ((b1 - b0) - (o1 - o0)) / max(1, t1 - t0))


# ---------------------------------------------------------------- measuring

def sweep(system, queries, gt, a):
    """The smallest setting with recall >= --choose-recall on the static table (one client,
    a warm-up pass then a timed pass per setting)."""
    rows = []
    for label, value in system.settings():
        c = system.query_client(value)
        try:
            for q in queries:
                c.query(q)
            lat, found = [], []
            for q in queries:
                t = now()
                found.append(c.query(q))
                lat.append((now() - t) * 1e3)
        finally:
            c.close()
        r = {"setting": label, "value": value, "recall": recall_at_k(found, gt),
             "p50_ms": pctl(lat, 50), "p99_ms": pctl(lat, 99)}
        rows.append(r)
        log(f"{system.name}: static {label}: recall {r['recall']:.3f}, "
            f"p50 {r['p50_ms']:.2f} ms")
        if r["recall"] >= a.choose_recall:
            return r, True, rows
    return max(rows, key=lambda r: r["recall"]), False, rows


class ThreadClients:
    """C query clients as threads of this process (systems queried in-process: Lance)."""

    mode = "threads"

    def __init__(self, system, value, queries, clients):
        self.gate, self.stop_ev = Gate(), threading.Event()
        self.gate.pause()
        self.lat = [[] for _ in range(clients)]
        self.errs = [[] for _ in range(clients)]
        nq = len(queries)
        self.threads = [threading.Thread(target=client_loop, daemon=True,
                                         args=(system, value, queries, (k * nq) // clients,
                                               self.gate, self.stop_ev, self.lat, self.errs, k))
                        for k in range(clients)]
        for t in self.threads:
            t.start()

    def resume(self):
        self.gate.resume()

    def pause(self):
        self.gate.pause()

    def take(self):
        """Latencies (ms) and errors since the last take, while paused."""
        lat = [x for s in self.lat for x in s]
        errs = [x for s in self.errs for x in s]
        for s in self.lat + self.errs:
            s.clear()
        return lat, errs

    def pids(self):
        return []

    def stop(self):
        self.stop_ev.set()
        self.gate.resume()
        for t in self.threads:
            t.join(60)


class ProcessClients(ThreadClients):
    """C query clients, each a process of its own: a client's latency is then the server's
    answer plus its own driver's work, not also a wait for this process's GIL, which the
    writer thread (encoding 100-row batches) and the other clients hold in turn."""

    mode = "processes"

    def __init__(self, conninfo, init_sql, queries, clients):
        ctx = multiprocessing.get_context("spawn")
        nq = len(queries)
        self.pipes, self.procs = [], []
        for k in range(clients):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=process_client, daemon=True,
                               args=(conninfo, init_sql, queries, (k * nq) // clients, theirs))
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
        self.lat = [[] for _ in range(clients)]
        self.errs = [[] for _ in range(clients)]
        self.pause()                        # each has connected (or failed to) once this returns

    def resume(self):
        for p in self.pipes:
            p.send("run")

    def pause(self):
        """Returns once no query is in flight: each client answers after its current query."""
        for p in self.pipes:
            p.send("pause")
        for k, p in enumerate(self.pipes):
            lat, errs = p.recv()
            self.lat[k] += lat
            self.errs[k] += errs

    def pids(self):
        return [p.pid for p in self.procs]

    def stop(self):
        for p in self.pipes:
            p.send("stop")
        for proc in self.procs:
            proc.join(60)


def process_client(conninfo, init_sql, queries, start, pipe):
    """The loop of one ProcessClients client: queries between "run" and "pause"; answers each
    "pause" with its latencies (ms) and errors since the previous one; ends at "stop"."""
    lat, errs = [], []
    try:
        c = PgQueryClient(conninfo, init_sql)
    except Exception as e:  # noqa: BLE001
        c, errs = None, [f"connect: {type(e).__name__}: {e}"]
    n, i, running = len(queries), start, False
    while True:
        if not running or pipe.poll():
            cmd = pipe.recv()
            if cmd == "stop":
                break
            if cmd == "pause":
                pipe.send((lat, errs))
                lat, errs = [], []
            running = cmd == "run" and c is not None
            continue
        try:
            t = now()
            c.query(queries[i % n])
            lat.append((now() - t) * 1e3)
        except Exception as e:  # noqa: BLE001
            errs.append(f"{type(e).__name__}: {e}")
            time.sleep(0.05)
        i += 1
    if c is not None:
        c.close()


def start_clients(system, value, queries, clients, a):
    """C query clients, paused: with --client-processes, processes for systems behind a
    server; else threads."""
    spec = getattr(system, "client_spec", None)
    if spec is None or not a.client_processes:
        return ThreadClients(system, value, queries, clients)
    return ProcessClients(*spec(value), queries, clients)


def client_loop(system, value, queries, start, gate, stop, slot, errors, k):
    try:
        c = system.query_client(value)
    except Exception as e:  # noqa: BLE001
        errors[k].append(f"connect: {type(e).__name__}: {e}")
        return
    n, i = len(queries), start
    try:
        while gate.enter(stop):
            try:
                t = now()
                c.query(queries[i % n])
                slot[k].append((now() - t) * 1e3)
            except Exception as e:  # noqa: BLE001
                errors[k].append(f"{type(e).__name__}: {e}")
                time.sleep(0.05)
            finally:
                gate.exit()
            i += 1
    finally:
        c.close()


def static_baseline(system, value, queries, clients, seconds, a):
    """C clients for `seconds` on the static table: p50, p99, QPS."""
    pool = start_clients(system, value, queries, clients, a)
    pool.resume()
    time.sleep(min(2.0, seconds / 4))       # warm-up, not counted
    pool.pause()
    pool.take()
    pool.resume()
    t0 = now()
    time.sleep(seconds)
    pool.pause()
    elapsed = now() - t0
    all_lat, errs = pool.take()
    pool.stop()
    return {"p50_ms": pctl(all_lat, 50), "p99_ms": pctl(all_lat, 99),
            "qps": len(all_lat) / elapsed, "queries": len(all_lat),
            "errors": len(errs), "clients_as": pool.mode}


def build_schedule(a, model):
    """(stream time, order, kind, arg), sorted: insert batches at a steady rate, mutation
    ticks (deletes, re-embeds) every --mutation-interval seconds."""
    base = a.base_rows
    planned = max(0, min(model.n_total - base, int(a.duration * a.rate)))
    events = []
    for b in range(math.ceil(planned / a.batch)):
        lo = base + b * a.batch
        events.append((b * a.batch / a.rate, 0, "insert", (lo, min(lo + a.batch, base + planned))))
    final_rows = base + planned
    ticks = max(1, int(a.duration / a.mutation_interval))
    n_del = round(a.delete_fraction * final_rows)
    n_upd = round(a.reembed_fraction * final_rows)
    share = lambda total, m: round((m + 1) * total / ticks) - round(m * total / ticks)
    for m in range(ticks):
        t = (m + 0.5) * a.mutation_interval
        if t >= a.duration:
            break
        events.append((t, 1, "mutate", (share(n_del, m), share(n_upd, m))))
    events.sort(key=lambda e: (e[0], e[1]))
    return events, {"planned_inserts": planned, "final_rows": final_rows,
                    "planned_deletes": n_del, "planned_reembeds": n_upd}


class Writer:
    """The one writer thread: executes the schedule on the stream clock, updates the model
    after each successful statement, pauses at the gate."""

    def __init__(self, system, model, events, a, clock, gate, stop):
        self.s, self.m, self.events, self.a = system, model, events, a
        self.clock, self.gate, self.stop = clock, gate, stop
        self.rng = np.random.default_rng(a.seed)
        self.done = collections.Counter()       # rows inserted / deleted / re-embedded, ops
        self.errors = []
        self.lag = []                           # (stream time, seconds behind schedule)
        self.op_ms = collections.defaultdict(list)
        self.next_event = 0
        self.fatal = None

    def run(self):
        try:
            for idx, (t, _, kind, arg) in enumerate(self.events):
                self.next_event = idx
                if t >= self.a.duration or not sleep_until(self.clock, t, self.stop):
                    break
                if self.clock.t() >= self.a.duration:
                    break
                if not self.gate.enter(self.stop):
                    break
                try:
                    self.lag.append((t, self.clock.t() - t))
                    if kind == "insert":
                        self.do_insert(*arg)
                    else:
                        self.do_mutate(*arg)
                finally:
                    self.gate.exit()
            else:
                self.next_event = len(self.events)
        except Exception as e:  # noqa: BLE001
            self.fatal = f"{type(e).__name__}: {e}"
            log(f"{self.s.name}: writer stopped: {self.fatal}\n{traceback.format_exc()}")

    def attempt(self, kind, fn):
        for k in range(self.a.write_retries + 1):
            t = now()
            try:
                r = fn()
                self.op_ms[kind].append((now() - t) * 1e3)
                return True, r
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{kind}: {type(e).__name__}: {e}")
                log(f"{self.s.name}: {kind} failed (attempt {k + 1}): {e}")
                if self.s.name != "lance" and getattr(self.s, "wconn", None) is not None \
                        and self.s.wconn.closed:
                    self.s.wconn = connect(self.s.conninfo())
                time.sleep(0.1)
        return False, None

    def do_insert(self, lo, hi):
        ids = np.arange(lo, hi)
        ok, _ = self.attempt("insert", lambda: self.s.insert(ids, self.m.category[lo:hi],
                                                             self.m.pristine[lo:hi]))
        if ok:
            self.m.add(ids)
            self.done["inserted"] += len(ids)

    def do_mutate(self, n_del, n_upd):
        victims = self.m.pick(self.rng, n_del)
        if len(victims):
            ok, _ = self.attempt("delete", lambda: self.s.delete(victims))
            if ok:
                self.m.remove(victims)
                self.done["deleted"] += len(victims)
        targets = self.m.pick(self.rng, n_upd)
        if len(targets):
            src = self.rng.integers(0, self.m.n_total, size=len(targets))
            noise = self.rng.normal(0.0, self.a.noise, size=(len(targets), self.m.dim))
            vecs = (self.m.pristine[src] + noise).astype(np.float32)
            cats = self.m.category[targets]
            ok, _ = self.attempt("reembed", lambda: self.s.reembed(targets, cats, vecs))
            if ok:
                self.m.set_vectors(targets, vecs)
                self.done["reembedded"] += len(targets)


def run_one(name, clients, w, model, gt_static, a, run_id, out_f):
    """One system at one client count: load, choose the setting, static baseline, stream."""
    scratch = os.path.join(a.out, "streaming-scratch", name)
    if os.path.exists(scratch):
        shutil.rmtree(scratch)
    os.makedirs(scratch)
    model.reset(a.base_rows)
    parts = a.partitions or max(1, round(math.sqrt(a.base_rows)))
    system = make_system(name, a, scratch)
    run = {"kind": "run", "run": run_id, "system": name, "clients": clients,
           "base_rows": a.base_rows, "partitions": parts}
    windows = []
    stop = threading.Event()
    threads = []
    t_run = now()
    try:
        log(f"== {name}, {clients} client(s)")
        system.start()
        run["setup"] = system.load(model, a.base_rows, parts)
        run["info"] = system.info()
        system.configure()
        for r in run["setup"]:
            log(f"{name}: {r['step']}: {r['seconds']:.1f} s")
        queries = w["queries"]
        chosen, met, swept = sweep(system, queries, gt_static, a)
        run.update(setting=chosen["setting"], setting_value=chosen["value"],
                   setting_meets_target=met, sweep=swept)
        if not met:
            log(f"{name}: NO setting reaches recall {a.choose_recall}; using the best, "
                f"{chosen['setting']} ({chosen['recall']:.3f})")
        run["static"] = static_baseline(system, chosen["value"], queries, clients,
                                        a.static_seconds, a)
        st = run["static"]
        log(f"{name}: static at {chosen['setting']}, {clients} client(s): p50 "
            f"{st['p50_ms']:.2f} ms, p99 {st['p99_ms']:.2f} ms, {st['qps']:.0f} QPS")
        system.begin_streaming()
        events, plan = build_schedule(a, model)
        run["plan"] = plan

        # ---- streaming
        probe_idx = np.linspace(0, len(queries) - 1, min(a.probe_queries, len(queries))
                                ).round().astype(int)
        probe_q = queries[probe_idx]
        probe = system.query_client(chosen["value"])
        wgate = Gate()
        wgate.pause()
        clock = StreamClock()
        clock.pause()
        writer = Writer(system, model, events, a, clock, wgate, stop)
        cpool = start_clients(system, chosen["value"], queries, clients, a)
        run["clients_as"] = cpool.mode
        threads = [threading.Thread(target=writer.run, daemon=True)]
        for th in threads:
            th.start()
        time.sleep(0.5)                     # connections opened before the clock starts
        clock.restart()
        system.start_background(clock)
        other = OtherCpu(lambda: list(system.server_pids()) + cpool.pids())
        n_windows = math.ceil(a.duration / a.window - 1e-9)
        win_start = now()
        wgate.resume()
        cpool.resume()
        seen_lag, seen_ops = 0, {}
        for wi in range(n_windows):
            t_end = min((wi + 1) * a.window, a.duration)
            sleep_until(clock, t_end, stop)
            cpool.pause()
            active = now() - win_start
            wgate.pause()
            clock.pause()
            stream_t = clock.t()
            wl, werr = cpool.take()
            # recall probe on the state the model describes
            t0 = now()
            found, plat = [], []
            for q in probe_q:
                tq = now()
                try:
                    found.append(probe.query(q))
                except Exception as e:  # noqa: BLE001
                    found.append([])
                    werr.append(f"probe: {e}")
                plat.append((now() - tq) * 1e3)
            truth = model.exact_topk(probe_q)
            recall = recall_at_k(found, truth)
            probe_s = now() - t0
            t0 = now()
            try:
                state = system.state()
            except Exception as e:  # noqa: BLE001
                state = {"state_error": f"{type(e).__name__}: {e}"}
            state_s = now() - t0
            lags = [x for _, x in writer.lag[seen_lag:]]
            seen_lag = len(writer.lag)
            # how far the writer's next statement is behind its schedule right now
            nxt = writer.next_event
            behind = max(0.0, stream_t - events[nxt][0]) if nxt < len(events) else 0.0
            lags.append(behind)
            ops = {}
            for k, v in writer.op_ms.items():     # this window's write statements
                v = v[seen_ops.get(k, 0):]
                seen_ops[k] = seen_ops.get(k, 0) + len(v)
                ops[k] = {"n": len(v), "p50_ms": pctl(v, 50), "max_ms": max(v, default=None)}
            rec = {"kind": "window", "run": run_id, "system": name, "clients": clients,
                   "window": wi, "t": round(stream_t, 2), "active_s": round(active, 3),
                   "queries": len(wl), "qps": len(wl) / active if active > 0 else None,
                   "p50_ms": pctl(wl, 50), "p99_ms": pctl(wl, 99), "max_ms": max(wl, default=None),
                   "query_errors": len(werr), "first_error": werr[0] if werr else None,
                   "recall": recall, "probe_queries": len(probe_q),
                   "probe_p50_ms": pctl(plat, 50), "probe_seconds": round(probe_s, 3),
                   "state_seconds": round(state_s, 3),
                   "live_rows": model.n_live, "inserted": writer.done["inserted"],
                   "deleted": writer.done["deleted"], "reembedded": writer.done["reembedded"],
                   "write_errors": len(writer.errors),
                   "writer_lag_max_s": max(lags) if lags else 0.0,
                   "writer_behind_s": round(behind, 2),
                   "write_ms": ops,
                   "setting": chosen["setting"], "static_p50_ms": st["p50_ms"],
                   "static_p99_ms": st["p99_ms"], "static_qps": st["qps"],
                   "other_cpu": other.take(), "loadavg_1m": os.getloadavg()[0], **state}
            windows.append(rec)
            out_f.write(json.dumps(rec, default=str) + "\n")
            out_f.flush()
            unidx = rec.get("unindexed_rows")
            if unidx is None:
                unidx = rec.get("unindexed_rows_est")
            log(f"{name} C={clients} t={stream_t:5.0f}s: {rec['qps'] or 0:7.0f} QPS, p50 "
                f"{rec['p50_ms'] or 0:6.2f} p99 {rec['p99_ms'] or 0:7.2f} ms, recall "
                f"{recall:.3f}, live {model.n_live:,}, unindexed {unidx}, fragments "
                f"{rec.get('fragments')}, segments {rec.get('segments')}, versions "
                f"{rec.get('versions')}, maint {rec.get('maintenance_tasks')}, lag "
                f"{rec['writer_lag_max_s']:.1f}s, other CPU {rec['other_cpu']:.0%}"
                + (f", {len(werr)} query errors ({werr[0]})" if werr else ""))
            if writer.fatal:
                run["writer_fatal"] = writer.fatal
                break
            win_start = now()
            clock.resume()
            wgate.resume()
            cpool.resume()
        stop.set()
        cpool.stop()
        wgate.resume()
        for th in threads:
            th.join(120)
        probe.close()
        system.end_streaming()
        run["writes"] = dict(writer.done)
        run["write_errors"] = writer.errors[:20]
        run["events_not_done"] = len(events) - writer.next_event
        if isinstance(system, LanceSystem):
            run["lance_tasks"] = system.tasks
        # ---- final check
        got = system.final_checksum()
        want = model.checksum()
        sample = model.reembedded[-100:] + [int(x) for x in np.random.default_rng(
            a.seed + 1).choice(model.live_ids(), size=min(100, model.n_live), replace=False)]
        sample = sorted(set(i for i in sample if model.live[i]))
        vecs = system.fetch_vectors(sample)
        bad = [i for i in sample if len(vecs.get(i, [])) != 1 or not np.allclose(
            vecs[i][0], model.x[i], rtol=1e-6, atol=1e-6)]
        run["final"] = {"system": list(got), "model": list(want),
                        "vectors_checked": len(sample), "vectors_wrong": bad[:20],
                        "pass": got == want and not bad}
        log(f"{name}: final count/sum(id)/sum(id*id) {got} vs model {want}; "
            f"{len(sample)} vectors, {len(bad)} wrong: "
            f"{'PASS' if run['final']['pass'] else 'FAIL'}")
    except Skip as e:
        run["skipped"] = str(e)
        log(f"{name}: SKIPPED: {e}")
    except Exception as e:  # noqa: BLE001
        run["error"] = f"{type(e).__name__}: {e}"
        log(f"{name}: FAILED: {run['error']}\n{traceback.format_exc()}")
    finally:
        stop.set()
        for th in threads:
            th.join(30)
        try:
            system.stop()
        except Exception as e:  # noqa: BLE001
            log(f"{name}: stopping: {e}")
        if not a.keep and os.path.exists(scratch):
            shutil.rmtree(scratch, ignore_errors=True)
        run["seconds"] = now() - t_run
    out_f.write(json.dumps(run, default=str) + "\n")
    out_f.flush()
    return run, windows


# ---------------------------------------------------------------- report

def fmt(v, spec=",.0f", none="–"):
    return none if v is None else format(v, spec)


def report(clients, runs, windows, a):
    lines = [f"\n## Streaming, {clients} client(s): base {a.base_rows:,} rows, "
             f"{a.duration:g} s at {a.rate:g} rows/s in {a.batch}-row batches, "
             f"{a.delete_fraction:.1%} deleted, {a.reembed_fraction:.1%} re-embedded, "
             f"windows of {a.window:g} s, recall target {a.target_recall}\n"]
    head = ["system", "setting", "static p50 / p99 ms", "min recall", "max p99 ms (× static)",
            "median QPS (static)", "max unindexed rows", "max fragments", "max segments",
            "max versions", "maint. tasks", "writes ins / del / re-emb", "max lag s",
            "final check"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    by = collections.defaultdict(list)
    for r in windows:
        by[r["system"]].append(r)
    for run in runs:
        s = run["system"]
        if "skipped" in run or ("error" in run and not by[s]):
            why = run.get("skipped") or run.get("error")
            lines.append(f"| {s} | " + " | ".join(["–"] * (len(head) - 2)) +
                         f" | {'skipped' if 'skipped' in run else 'FAILED'}: "
                         f"{why[:160].replace('|', '/')} |")
            continue
        ws = by[s]
        st = run.get("static", {})
        mx = lambda k: max((x[k] for x in ws if x.get(k) is not None), default=None)
        unidx = mx("unindexed_rows")
        unidx_cell = fmt(unidx)
        if unidx is None and mx("unindexed_rows_est") is not None:
            unidx_cell = "~" + fmt(mx("unindexed_rows_est"))
        p99 = mx("p99_ms")
        ratio = f" ({p99 / st['p99_ms']:.2f}×)" if p99 and st.get("p99_ms") else ""
        qps = [x["qps"] for x in ws if x.get("qps") is not None]
        rec = [x["recall"] for x in ws]
        minrec = min(rec) if rec else None
        final = run.get("final", {})
        fin = ("PASS" if final.get("pass") else "FAIL") if final else \
            ("FAILED: " + run.get("error", "?")[:80] if "error" in run else "–")
        writes = run.get("writes") or (ws[-1] if ws else {})
        maint = ws[-1].get("maintenance_tasks") if ws else None
        cells = [s, run.get("setting", "–") + ("" if run.get("setting_meets_target", True)
                                               else " (!)"),
                 f"{fmt(st.get('p50_ms'), '.2f')} / {fmt(st.get('p99_ms'), '.2f')}",
                 fmt(minrec, ".3f") + (" !" if minrec is not None and
                                       minrec < a.target_recall else ""),
                 fmt(p99, ".2f") + ratio,
                 f"{fmt(statistics.median(qps) if qps else None)} ({fmt(st.get('qps'))})",
                 unidx_cell, fmt(mx("fragments")), fmt(mx("segments")), fmt(mx("versions")),
                 fmt(maint),
                 f"{writes.get('inserted', 0):,} / {writes.get('deleted', 0):,} / "
                 f"{writes.get('reembedded', 0):,}",
                 fmt(mx("writer_lag_max_s"), ".1f"), fin]
        lines.append("| " + " | ".join(cells) + " |")
    for num in ("fragvec-auto", "fragvec-off"):
        if by[num] and by["lance"]:
            ratios = [x["qps"] / y["qps"] for x, y in zip(by[num], by["lance"])
                      if x.get("qps") and y.get("qps")]
            if ratios:
                lines.append(f"\nQPS {num} ÷ lance per window: min {min(ratios):.2f}×, "
                             f"median {statistics.median(ratios):.2f}× "
                             f"({len(ratios)} windows)")
    for run in runs:
        f = run.get("final")
        if f:
            lines.append(f"- {run['system']}: final count, sum(id), sum(id*id) = "
                         f"{tuple(f['system'])} vs model {tuple(f['model'])}; "
                         f"{f['vectors_checked']} vectors compared, "
                         f"{len(f['vectors_wrong'])} wrong: "
                         f"{'PASS' if f['pass'] else 'FAIL'}")
        if run.get("events_not_done"):
            lines.append(f"- {run['system']}: {run['events_not_done']} scheduled write "
                         f"events not done when the run ended (the writer was behind)")
        for k in ("writer_fatal", "error"):
            if run.get(k):
                lines.append(f"- {run['system']}: {k}: {run[k]}")
        if run.get("write_errors"):
            lines.append(f"- {run['system']}: write errors (first): {run['write_errors'][0]}")
        if run.get("info"):
            lines.append(f"- {run['system']}: " + ", ".join(f"{k} {v}" for k, v in
                                                          run["info"].items()))
    lines.append("\nLegend: (!) no setting reached --choose-recall on the static table; `!` after a "
                 "recall: below --target-recall; `~` unindexed rows estimated from "
                 "fragvec_fragments / fragvec_segments (fragvec_indexes has no unindexed_rows)")
    return "\n".join(lines)


def plot(clients, windows, a, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is missing (~/.cache/fragvec-bench-venv/bin/pip install matplotlib); "
            "no plot")
        return None
    panels = [("qps", "QPS"), ("p99_ms", "p99 (ms)"), ("recall", "recall@10"),
              ("unindexed", "unindexed rows"), ("fragments", "fragments"),
              ("segments", "index segments"), ("versions", "versions"),
              ("maintenance_tasks", "maintenance tasks (cumulative)")]
    fig, axes = plt.subplots(4, 2, figsize=(13, 14), sharex=True)
    by = collections.defaultdict(list)
    for r in windows:
        by[r["system"]].append(r)
    colors = {s: f"C{i}" for i, s in enumerate(ALL_SYSTEMS)}
    for ax, (key, title) in zip(axes.ravel(), panels):
        for s, ws in by.items():
            xs, ys = [], []
            for r in ws:
                v = r.get(key)
                if key == "unindexed":
                    v = r.get("unindexed_rows")
                    if v is None:
                        v = r.get("unindexed_rows_est")
                if v is not None:
                    xs.append(r["t"])
                    ys.append(v)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=s, color=colors[s])
            static = {"qps": "static_qps", "p99_ms": "static_p99_ms"}.get(key)
            if static and ws and ws[0].get(static):
                ax.axhline(ws[0][static], color=colors[s], linestyle="--", linewidth=0.8)
        if key == "unindexed":
            est = sorted(s for s, ws in by.items() if any(
                r.get("unindexed_rows") is None and r.get("unindexed_rows_est") is not None
                for r in ws))
            if est:
                title += f" ({', '.join(est)}: estimated)"
        if key == "recall":
            ax.axhline(a.target_recall, color="grey", linestyle=":", linewidth=1)
        if key in ("qps", "p99_ms") and ax.has_data():
            ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("stream time (s)")
    axes[0][0].legend()
    fig.suptitle(f"streaming_bench: {clients} client(s), base {a.base_rows:,}, "
                 f"{a.rate:g} rows/s (dashed: static QPS / p99 before streaming)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- main

def ints(s):
    return [int(x) for x in str(s).split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.expanduser("~/.cache/fragvec-bench-data/1m-128"))
    ap.add_argument("--out", help="results, plots and scratch databases (default --data)")
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    ap.add_argument("--clients", default="1,4", type=ints,
                    help="concurrent query clients; a list runs everything once per value")
    ap.add_argument("--base-rows", type=int, default=500000)
    ap.add_argument("--duration", type=float, default=600, help="stream seconds")
    ap.add_argument("--rate", type=float, default=1000, help="inserted rows per second")
    ap.add_argument("--batch", type=int, default=100, help="rows per INSERT")
    ap.add_argument("--delete-fraction", type=float, default=0.01,
                    help="of the final row count, deleted over the run")
    ap.add_argument("--reembed-fraction", type=float, default=0.01,
                    help="of the final row count, re-embedded over the run")
    ap.add_argument("--mutation-interval", type=float, default=1.0,
                    help="seconds between delete / re-embed batches")
    ap.add_argument("--noise", type=float, default=0.05, help="sd of a re-embed's noise")
    ap.add_argument("--window", type=float, default=30)
    ap.add_argument("--probe-queries", type=int, default=50)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--partitions", type=int, help="IVF partitions (default √base-rows)")
    ap.add_argument("--nprobes", default="1,2,4,8,16,32", type=ints,
                    help="fragvec and Lance sweep")
    ap.add_argument("--ef-search", default="20,40,80,160,320", type=ints,
                    help="pgvector HNSW sweep")
    ap.add_argument("--pg-probes", default="1,2,4,8,16,32", type=ints,
                    help="pgvector IVFFlat sweep")
    ap.add_argument("--choose-recall", type=float, default=0.97,
                    help="the setting: smallest with this recall on the static table")
    ap.add_argument("--target-recall", type=float, default=0.95,
                    help="windows under it are flagged")
    ap.add_argument("--static-seconds", type=float, default=20,
                    help="static p50/p99 measurement with C clients")
    ap.add_argument("--write-retries", type=int, default=3)
    ap.add_argument("--fragvec-bin", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/fragvec-target"),
        "release", "fragvec"))
    ap.add_argument("--maintenance-interval", type=float, default=5,
                    help="fragvec-auto: serve --maintenance-interval (0: not passed)")
    ap.add_argument("--auto-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override / add one of fragvec-auto's ALTER TABLE SET properties")
    ap.add_argument("--lance-maintenance-interval", type=float, default=60,
                    help="seconds between optimize_indices + compact_files (0: none)")
    ap.add_argument("--lance-reembed", choices=["merge_insert", "delete_append"],
                    default="merge_insert")
    ap.add_argument("--lance-target-partition-size", default="auto",
                    help="create_index target_partition_size (auto: base / partitions, so "
                         "optimize_indices keeps the partition count; 0: Lance's default, "
                         "whose optimize_indices joins small partitions)")
    ap.add_argument("--lance-cleanup-older-than", type=float, default=0,
                    help="also cleanup_old_versions(older_than=S) in the maintenance thread")
    ap.add_argument("--lance-log", default="error",
                    help="LANCE_LOG level for pylance's own messages (warn shows its warnings)")
    ap.add_argument("--pg-index", choices=["hnsw", "ivfflat"], default="hnsw")
    ap.add_argument("--hnsw-m", type=int, default=16)
    ap.add_argument("--hnsw-ef-construction", type=int, default=64)
    ap.add_argument("--pg-shared-buffers", default="2GB")
    ap.add_argument("--pg-maintenance-work-mem", default="2GB")
    ap.add_argument("--keep", action="store_true", help="keep the scratch databases")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--client-processes", action="store_true",
                    help="for systems behind a server, each query client in a process of its "
                         "own (default: threads of the benchmark's process)")
    a = ap.parse_args()
    a.data = os.path.abspath(os.path.expanduser(a.data))
    a.out = os.path.abspath(os.path.expanduser(a.out or a.data))
    a.fragvec_bin = os.path.expanduser(a.fragvec_bin)
    a.auto_props = dict(AUTO_PROPS)
    for kv in a.auto_set:
        k, _, v = kv.partition("=")
        a.auto_props[k.strip()] = v.strip()
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in ALL_SYSTEMS:
            ap.error(f"unknown system {s} (one of {', '.join(ALL_SYSTEMS)})")
    os.makedirs(a.out, exist_ok=True)
    import fcntl
    lock = open(os.path.join(a.out, ".streaming_bench.lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another streaming_bench run uses {a.out}")

    with open(os.path.join(a.data, "meta.json")) as f:
        meta = json.load(f)
    pristine = np.load(os.path.join(a.data, "vectors.npy"), mmap_mode="r")
    category = np.load(os.path.join(a.data, "category.npy")).astype(np.int32)
    w = {"queries": np.load(os.path.join(a.data, "queries.npy")).astype(np.float32)}
    if a.base_rows > meta["rows"]:
        ap.error(f"--base-rows {a.base_rows} > {meta['rows']} rows in {a.data}")
    log(f"model: {pristine.shape[0]:,} x {pristine.shape[1]} (float32 copy in memory)")
    model = Model(pristine, category, a.base_rows)
    t = now()
    gt_static = model.exact_topk(w["queries"])
    log(f"exact top-{K} of {len(w['queries'])} queries over the {a.base_rows:,} base rows: "
        f"{now() - t:.1f} s")
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    out_path = os.path.join(a.out, "streaming_results.jsonl")
    config = {k: v for k, v in vars(a).items()}
    texts = []
    with open(out_path, "a") as out_f:
        out_f.write(json.dumps({"kind": "config", "run": run_id, "config": config,
                                "meta": meta}, default=str) + "\n")
        for c in a.clients:
            runs, wins = [], []
            for s in systems:
                run, ws = run_one(s, c, w, model, gt_static, a, run_id, out_f)
                runs.append(run)
                wins += ws
            text = report(c, runs, wins, a)
            print(text, flush=True)
            texts.append(text)
            if not a.no_plot and wins:
                p = plot(c, wins, a, os.path.join(a.out, f"streaming-C{c}.png"))
                if p:
                    log(f"plot: {p}")
    log(f"records appended to {out_path}")


if __name__ == "__main__":
    main()

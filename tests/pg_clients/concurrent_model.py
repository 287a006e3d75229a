#!/usr/bin/env python3
"""16 concurrent psycopg connections against `fragvec serve`, checked against an in-memory model.

One table; 16 threads, each with its own connection, run a random mix of KNN, INSERT, UPDATE,
DELETE and (fragvec only) COMPACT. Each thread owns the ids it writes (preloaded id % 16, then
its own range), so the model (id -> category, vector) is the union of what every thread
committed, whatever the interleaving. During the run every KNN answer is checked for what holds
under any interleaving: distances ascend and match the returned vectors, no id twice, none of
the thread's own deleted ids, and the thread's own last write is visible (read-your-writes:
a KNN for the exact vector it just wrote answers that id first). At the end the table must hold
exactly the model's rows (nothing missing, nothing extra, no duplicate), and exact KNN
(fragvec: SET fragvec.exact = true; PostgreSQL: no index, so a plain ORDER BY is exact) must
equal the model's top-k, ties broken by id.

Vectors are small integers (coordinates in [-50, 50]), unique per (id, version), so every
distance is exact in float32 and equal distances compare equal.

A write that fails with SQLSTATE 40001 (serialization_failure: a commit conflict) did nothing
and is retried; any other error fails the run.

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres, FV_PREFIX;
FV_THREADS (16), FV_OPS (40 per thread), FV_SEED.
"""

import os
import random
import threading
import time

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from common import FRAGVEC, POSTGRES, check, check_eq, drop_at_exit, note, run_main, step, table

THREADS = int(os.environ.get("FV_THREADS", "16"))
OPS = int(os.environ.get("FV_OPS", "40"))
SEED = int(os.environ.get("FV_SEED", str(int(time.time()))))
T = table("cmodel")
drop_at_exit(T)
PRELOAD = 200
K = 5


def vector(ident, version):
    """A vector unique to (id, version % 8): the base-101 digits of id * 8 + version % 8."""
    n = ident * 8 + version % 8
    out = []
    for _ in range(3):
        out.append(n % 101 - 50)
        n //= 101
    check(n == 0, "id %d too large for 3 base-101 digits", ident)
    return out


def d2(a, b):
    return sum((x - y) ** 2 for x, y in zip(a, b))


def model_top_k(model, q, k, category=None):
    rows = [(d2(v, q), i) for i, (c, v) in model.items() if category is None or c == category]
    return [i for _, i in sorted(rows)[:k]]


class Failure(Exception):
    pass


def connect():
    conn = psycopg.connect(autocommit=True)
    register_vector(conn)
    if FRAGVEC:
        conn.execute("SET fragvec.exact = true")
    return conn


def run_write(conn, sql, params, stats):
    """Runs a write; retries commit conflicts (40001), which change nothing. Returns the cursor."""
    for attempt in range(20):
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            return cur
        except psycopg.errors.SerializationFailure:
            stats["conflicts"] += 1
            time.sleep(0.01 * (attempt + 1))
    raise Failure("20 commit conflicts in a row for %s" % sql)


def worker(tid, model, lock, barrier, errors, stats):
    rng = random.Random(SEED * 1000 + tid)
    mine = {i: model[i] for i in model if i % THREADS == tid}  # id -> (category, vector)
    versions = {i: 0 for i in mine}
    deleted = set()
    next_id = 100000 + tid * 1000
    conn = connect()
    barrier.wait()
    try:
        for op in range(OPS):
            r = rng.random()
            if r < 0.40:  # KNN, checked for what holds under any interleaving
                if mine and rng.random() < 0.5:
                    own = rng.choice(sorted(mine))
                    q = mine[own][1]
                else:
                    own, q = None, [rng.randint(-50, 50) for _ in range(3)]
                rows = conn.execute(
                    "SELECT id, emb, emb <-> %%s AS d FROM %s ORDER BY emb <-> %%s LIMIT %d" % (T, K),
                    (np.array(q), np.array(q)),
                ).fetchall()
                ds = [d for _, _, d in rows]
                check(ds == sorted(ds), "KNN distances not ascending: %r", ds)
                check(len({i for i, _, _ in rows}) == len(rows), "KNN returned an id twice: %r", rows)
                for i, v, d in rows:
                    check(abs(d - d2(v.to_list(), q) ** 0.5) < 1e-3, "KNN distance %r of id %d does not match its vector %r", d, i, v)
                    check(i not in deleted, "KNN returned id %d, which this thread deleted", i)
                    if i in mine:
                        check_eq(v.to_list(), [float(x) for x in mine[i][1]], "vector of own id %d in a KNN answer" % i)
                if own is not None:
                    check(rows and rows[0][0] == own and rows[0][2] == 0, "KNN for own id %d's exact vector answered %r", own, rows[:1])
                stats["knn"] += 1
            elif r < 0.65:  # INSERT 1-5 rows of our own
                new = []
                for _ in range(rng.randint(1, 5)):
                    next_id += 1
                    new.append((next_id, rng.randint(0, 3), vector(next_id, 0)))
                cur = conn.cursor()
                for attempt in range(20):
                    try:
                        cur.executemany("INSERT INTO %s (id, category, emb) VALUES (%%s, %%s, %%s)" % T, [(i, c, np.array(v)) for i, c, v in new])
                        break
                    except psycopg.errors.SerializationFailure:
                        # executemany runs one statement per row: some may have committed. Find out.
                        stats["conflicts"] += 1
                        have = {r[0] for r in conn.execute("SELECT id FROM %s WHERE id >= %%s AND id <= %%s" % T, (new[0][0], new[-1][0]))}
                        for i, c, v in new:
                            if i in have:
                                mine[i], versions[i] = (c, v), 0
                        new = [x for x in new if x[0] not in have]
                        if not new:
                            break
                else:
                    raise Failure("20 commit conflicts in a row for INSERT")
                for i, c, v in new:
                    mine[i], versions[i] = (c, v), 0
                stats["insert"] += 1
                # read-your-writes
                last = new[-1] if new else None
                if last:
                    got = conn.execute("SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 1" % T, (np.array(last[2]),)).fetchone()
                    check_eq(got and got[0], last[0], "KNN right after inserting id %d" % last[0])
            elif r < 0.78 and mine:  # UPDATE one of our rows: new vector and category
                i = rng.choice(sorted(mine))
                versions[i] += 1
                c, v = rng.randint(0, 3), vector(i, versions[i])
                cur = run_write(conn, "UPDATE %s SET category = %%s, emb = %%s WHERE id = %%s" % T, (c, np.array(v), i), stats)
                check_eq(cur.rowcount, 1, "rowcount of UPDATE of own id %d" % i)
                mine[i] = (c, v)
                stats["update"] += 1
            elif r < 0.95 and mine:  # DELETE one or two of our rows
                victims = rng.sample(sorted(mine), min(len(mine), rng.randint(1, 2)))
                cur = run_write(conn, "DELETE FROM %s WHERE id IN (%s)" % (T, ", ".join(["%s"] * len(victims))), victims, stats)
                check_eq(cur.rowcount, len(victims), "rowcount of DELETE of own ids %s" % victims)
                for i in victims:
                    del mine[i]
                    deleted.add(i)
                stats["delete"] += 1
            elif FRAGVEC:  # COMPACT: the rows must not change
                cur = run_write(conn, "COMPACT %s" % T, None, stats)
                if cur.description:  # COMPACT reports what it did as a row
                    cur.fetchall()
                stats["compact"] += 1
        with lock:
            for i in list(model):
                if i % THREADS == tid and i < PRELOAD + 1:
                    del model[i]
            model.update(mine)
    except BaseException as e:
        errors.append("thread %d, op %d: %s: %s" % (tid, op, type(e).__name__, e))
    finally:
        conn.close()


def main():
    step("create and preload the table")
    conn = psycopg.connect(autocommit=True)
    if POSTGRES:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    conn.execute("DROP TABLE IF EXISTS %s" % T)
    conn.execute("CREATE TABLE %s (id BIGINT, category INT, emb VECTOR(3))" % T)
    rng = random.Random(SEED)
    model = {i: (rng.randint(0, 3), vector(i, 0)) for i in range(1, PRELOAD + 1)}
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO %s (id, category, emb) VALUES (%%s, %%s, %%s)" % T, [(i, c, np.array(v)) for i, (c, v) in model.items()])
    if FRAGVEC:
        # KNN goes through KnnExec with an index; fragvec.exact (set on every connection) makes
        # it score every row, so answers are exact.
        conn.execute("CREATE VECTOR INDEX %s_idx ON %s (emb) USING IVF_FLAT WITH (num_partitions = 4)" % (T, T))

    step("%d threads x %d operations (seed %d)" % (THREADS, OPS, SEED))
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)
    errors = []
    stats = {k: 0 for k in ("knn", "insert", "update", "delete", "compact", "conflicts")}
    threads = [threading.Thread(target=worker, args=(t, model, lock, barrier, errors, stats)) for t in range(THREADS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        check(not t.is_alive(), "a thread is still running after 600 s")
    note("seed %d: %s in %.1f s", SEED, ", ".join("%d %s" % (v, k) for k, v in stats.items()), time.monotonic() - t0)
    check(not errors, "%d thread(s) failed:\n  %s", len(errors), "\n  ".join(errors))

    step("the table holds exactly the model's rows")
    rows = conn.execute("SELECT id, category, emb FROM %s" % T).fetchall()
    ids = [r[0] for r in rows]
    check(len(ids) == len(set(ids)), "duplicate ids: %s", sorted(i for i in set(ids) if ids.count(i) > 1)[:20])
    got = {i: (c, [int(x) for x in v.to_list()]) for i, c, v in rows}
    missing = sorted(set(model) - set(got))
    extra = sorted(set(got) - set(model))
    check(not missing, "%d rows missing, e.g. %s", len(missing), missing[:20])
    check(not extra, "%d rows that should not be there, e.g. %s", len(extra), extra[:20])
    wrong = [i for i in model if got[i] != (model[i][0], list(model[i][1]))]
    check(not wrong, "%d rows differ from the model, e.g. id %s: got %r want %r", len(wrong), wrong[:1], got[wrong[0]] if wrong else None, model[wrong[0]] if wrong else None)
    note("%d rows, as the model says", len(got))

    step("exact KNN equals the model's top-k (ties by id)")
    if FRAGVEC:
        conn.execute("SET fragvec.exact = true")
    qrng = random.Random(SEED + 1)
    for n in range(40):
        q = [qrng.randint(-55, 55) for _ in range(3)]
        k = qrng.choice([1, 5, 10, 50])
        got = [r[0] for r in conn.execute("SELECT id FROM %s ORDER BY emb <-> %%s, id LIMIT %d" % (T, k), (np.array(q),))]
        check_eq(got, model_top_k(model, q, k), "exact top-%d for %s" % (k, q))
        cat = n % 4
        got = [r[0] for r in conn.execute("SELECT id FROM %s WHERE category = %%s ORDER BY emb <-> %%s, id LIMIT %d" % (T, k), (cat, np.array(q)))]
        check_eq(got, model_top_k(model, q, k, cat), "exact filtered top-%d for %s, category %d" % (k, q, cat))

    step("DROP TABLE")
    conn.execute("DROP TABLE %s" % T)
    conn.close()


if __name__ == "__main__":
    run_main("concurrent_model", main)

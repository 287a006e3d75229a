#!/usr/bin/env python3
"""fragvec's own statements over the wire, driven by psycopg 3 + pgvector (autocommit).

MERGE INTO ... USING (a table, a subquery with bound parameters, prepared; rows-affected counts
and the rows after; WHEN NOT MATCHED BY SOURCE; a target row matched twice is refused and
changes nothing), `VERSION AS OF n` (an older version's rows, and KNN over them, differ from the
newest; a version as a parameter; old and new joined), the table functions fragvec_versions,
fragvec_fragments, fragvec_indexes and recluster_information, COMPACT (fewer fragments, the
deletions gone, rows and their order unchanged), RECLUSTER t BY (k) (rows unchanged, the
destinations' key ranges disjoint), VACUUM (without RETAIN nothing of the history goes; with
RETAIN 1 VERSIONS the old versions go and time travel to them ends), CREATE VIEW / a query and
KNN through it / DROP VIEW, EXPLAIN ANALYZE of a KNN query (KnnExec and its counters), EXPLAIN
of a prepared KNN query with the vector bound as a parameter (KnnExec, and each execution's own
vector in the plan), and fetched vectors used as numpy arrays.

On PostgreSQL (FV_TARGET=postgres) the portable steps run (MERGE without BY SOURCE, views,
EXPLAIN, numpy); the fragvec-only ones are skipped.

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres, FV_PREFIX.
"""

import datetime
import os
import re
from importlib.metadata import version as package_version

import numpy as np
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector

from common import (
    FRAGVEC,
    POSTGRES,
    check,
    check_eq,
    drop_at_exit,
    note,
    run_main,
    step,
    table,
    top_k,
)

ITEMS = table("items")
SRC = table("src")
VIEW = table("near")
drop_at_exit(ITEMS, SRC)

# id -> (tag, k, vector). Values exact in float32, no two distances to the queries below tie.
ROWS = {
    1: ("a", 30, [0.5, 0.0, 0.0]),
    2: ("b", 10, [0.0, 1.5, 0.0]),
    3: ("c", 20, [0.0, 0.0, 2.25]),
    4: ("d", 40, [1.0, 1.0, -1.0]),
    5: ("e", 10, [-3.5, 0.25, 1.0]),
    6: ("f", 30, [2.0, 2.0, 2.0]),
}
Q = [0.25, 1.0, 0.5]


def as_floats(v):
    return [float(x) for x in v]


def rows_of(conn, source=None):
    """{id: (tag, k, [floats])} of ITEMS (or another FROM source)."""
    got = conn.execute("SELECT id, tag, k, emb FROM %s ORDER BY id" % (source or ITEMS)).fetchall()
    out = {}
    for i, tag, k, emb in got:
        check(emb is None or isinstance(emb, Vector), "emb of id %d comes back as pgvector.Vector, got %r", i, type(emb))
        out[i] = (tag, k, None if emb is None else emb.to_list())
    return out


def vectors(model):
    return {i: v for i, (_, _, v) in model.items()}


def ids(rows):
    return [r[0] for r in rows]


def one(conn, sql, params=None, prepare=None):
    """The single row sql returns, as a dict by column name."""
    cur = conn.execute(sql, params, prepare=prepare)
    rows = cur.fetchall()
    check_eq(len(rows), 1, "rows returned by %s" % sql)
    return dict(zip([d.name for d in cur.description], rows[0]))


def expect_error(conn, sql, params=None, sqlstate=None, what=None):
    """Runs sql, which must fail (with sqlstate, when given); returns the error."""
    try:
        conn.execute(sql, params)
    except psycopg.Error as e:
        if sqlstate is not None:
            check_eq(e.sqlstate, sqlstate, "SQLSTATE of %s (%s)" % (what or sql, e))
        err = e
    else:
        raise AssertionError("%s succeeded; it should have failed" % (what or sql))
    check_eq(conn.execute("SELECT 1").fetchone(), (1,), "SELECT 1 after the error of %s" % (what or sql))
    return err


def plan_text(conn, sql, params=None, prepare=None):
    """EXPLAIN's rows as one text (PostgreSQL: one column; DataFusion: plan_type, plan)."""
    rows = conn.execute(sql, params, prepare=prepare).fetchall()
    return "\n".join(" ".join(str(c) for c in r) for r in rows)


def versions(conn):
    """fragvec_versions(ITEMS) as [(version, operation)]."""
    rows = conn.execute("SELECT version, operation FROM fragvec_versions('%s') ORDER BY version" % ITEMS).fetchall()
    return [(int(v), op) for v, op in rows]


def fragments(conn):
    """fragvec_fragments(ITEMS) as [(position, id, physical_rows, deleted_rows)]."""
    rows = conn.execute(
        "SELECT position, id, physical_rows, deleted_rows FROM fragvec_fragments('%s')" % ITEMS
    ).fetchall()
    return [tuple(int(x) for x in r) for r in rows]


def vec_text(v):
    """A vector as DataFusion prints a literal in a plan: [0.25, 1.0, 0.5]."""
    return "[%s]" % ", ".join(repr(float(x)) for x in v)


def main():
    step("connect (autocommit), register_vector")
    conn = psycopg.connect(autocommit=True)
    if POSTGRES:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    try:
        run(conn)
    finally:
        if not os.environ.get("FV_KEEP"):
            try:
                conn.execute("DROP VIEW IF EXISTS %s" % VIEW)
            except psycopg.Error as e:
                note("(could not drop view %s: %s)", VIEW, e)
        conn.close()


def run(conn):
    step("CREATE TABLE, three INSERTs of two rows (numpy vectors as parameters)")
    conn.execute("DROP TABLE IF EXISTS %s" % ITEMS)
    conn.execute("DROP TABLE IF EXISTS %s" % SRC)
    conn.execute("CREATE TABLE %s (id BIGINT NOT NULL, tag TEXT, k BIGINT, emb VECTOR(3))" % ITEMS)
    model = {}
    two = "INSERT INTO %s (id, tag, k, emb) VALUES (%%s, %%s, %%s, %%s), (%%s, %%s, %%s, %%s)" % ITEMS
    for a, b in ((1, 2), (3, 4), (5, 6)):
        params = []
        for i in (a, b):
            tag, k, v = ROWS[i]
            params += [i, tag, k, np.array(v, dtype=np.float32)]
            model[i] = (tag, k, as_floats(v))
        cur = conn.execute(two, params)
        check_eq(cur.rowcount, 2, "rowcount of an INSERT of two rows")
    check_eq(rows_of(conn), model, "rows after the INSERTs")

    step("fetched vectors as numpy arrays (pgvector %s's loader)" % package_version("pgvector"))
    for binary in (True, False):
        got = conn.cursor(binary=binary).execute("SELECT id, emb FROM %s ORDER BY id" % ITEMS).fetchall()
        for i, v in got:
            check(isinstance(v, Vector), "binary=%s: emb comes back as pgvector.Vector, got %r", binary, type(v))
            a = v.to_numpy()
            check(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (3,),
                  "binary=%s: Vector.to_numpy() of id %d is a float32 array of 3, got %r", binary, i, a)
            check(np.array_equal(a, np.array(ROWS[i][2], dtype=np.float32)),
                  "binary=%s: to_numpy() of id %d: got %r, want %r", binary, i, a, ROWS[i][2])
            if hasattr(v, "__array__"):
                check(np.array_equal(np.asarray(v), a), "np.asarray(Vector) of id %d: %r", i, np.asarray(v))
            else:
                # pgvector-python 0.5.1's Vector has no __array__: np.asarray(v) is a 0-d object
                # array holding it, so an application converts with to_numpy().
                check_eq(np.asarray(v).shape, (), "np.asarray(Vector) without __array__")
        # The arrays do numpy arithmetic: distances agree with the server's <->.
        mat = np.stack([v.to_numpy() for _, v in got])
        check_eq(mat.shape, (6, 3), "shape of the stacked vectors")
        server = conn.execute("SELECT id, emb <-> %%s FROM %s ORDER BY id" % ITEMS, (np.array(Q),)).fetchall()
        mine = np.linalg.norm(mat - np.array(Q, dtype=np.float32), axis=1)
        for (i, d), m in zip(server, mine):
            check(abs(d - float(m)) < 1e-5, "distance of id %d: server %r, numpy %r", i, d, m)
    # A fetched array goes back as a parameter: KNN with row 4's own vector finds row 4 first.
    v4 = conn.execute("SELECT emb FROM %s WHERE id = 4" % ITEMS).fetchone()[0].to_numpy()
    got = conn.execute("SELECT id, emb <-> %%s AS d FROM %s ORDER BY d LIMIT 1" % ITEMS, (v4,)).fetchall()
    check_eq(got, [(4, 0.0)], "KNN with a fetched vector as the query")

    if FRAGVEC:
        step("fragvec_versions and fragvec_fragments after three INSERTs")
        check_eq([op for _, op in versions(conn)], ["CREATE", "APPEND", "APPEND", "APPEND"], "operations")
        frags = fragments(conn)
        check_eq([(p, n, d) for p, _, n, d in frags], [(0, 2, 0), (1, 2, 0), (2, 2, 0)],
                 "(position, physical_rows, deleted_rows) of the fragments")
        cur = conn.execute("SELECT * FROM fragvec_versions('%s')" % ITEMS)
        check_eq([d.name for d in cur.description],
                 ["version", "operation", "timestamp", "read_version", "fragments", "rows"],
                 "fragvec_versions' columns")
        last = cur.fetchall()[-1]
        check_eq((int(last[4]), int(last[5])), (3, 6), "fragments and rows of the newest version")
        step("fragvec_versions and fragvec_indexes through a binary cursor (NUMERIC, TIMESTAMP in binary)")
        got = conn.cursor(binary=True).execute(
            "SELECT version, operation, timestamp FROM fragvec_versions('%s') ORDER BY version" % ITEMS).fetchall()
        check_eq([(int(v), op) for v, op, _ in got], versions(conn), "versions read in binary")
        check(all(isinstance(t, datetime.datetime) for _, _, t in got), "timestamps read in binary")
        conn.cursor(binary=True).execute("SELECT * FROM fragvec_indexes('%s')" % ITEMS).fetchall()
    before_merge = dict(model)
    version_before_merge = versions(conn)[-1][0] if FRAGVEC else None

    step("MERGE INTO ... USING a table: DELETE, UPDATE and INSERT clauses, rowcount")
    conn.execute("CREATE TABLE %s (id BIGINT, tag TEXT, k BIGINT, emb VECTOR(3))" % SRC)
    src = [
        (2, "B", 11, [0.0, 1.5, 0.5]),    # matched: updated
        (3, "drop", 0, None),             # matched, tag 'drop': deleted
        (7, "g", 50, [7.0, 0.0, -7.0]),   # not matched: inserted
        (8, "h", 20, [0.75, 0.75, 0.75]),  # not matched: inserted
    ]
    conn.cursor().executemany(
        "INSERT INTO %s VALUES (%%s, %%s, %%s, %%s)" % SRC,
        [(i, t, k, None if v is None else np.array(v)) for i, t, k, v in src],
    )
    cur = conn.execute(
        "MERGE INTO %s AS t USING %s AS s ON t.id = s.id"
        " WHEN MATCHED AND s.tag = 'drop' THEN DELETE"
        " WHEN MATCHED THEN UPDATE SET tag = s.tag, k = s.k, emb = s.emb"
        " WHEN NOT MATCHED THEN INSERT (id, tag, k, emb) VALUES (s.id, s.tag, s.k, s.emb)" % (ITEMS, SRC)
    )
    check_eq(cur.rowcount, 4, "rowcount of the MERGE (1 deleted, 1 updated, 2 inserted)")
    check_eq(cur.statusmessage, "MERGE 4", "command tag of the MERGE")
    del model[3]
    model[2] = ("B", 11, [0.0, 1.5, 0.5])
    model[7] = ("g", 50, [7.0, 0.0, -7.0])
    model[8] = ("h", 20, [0.75, 0.75, 0.75])
    check_eq(rows_of(conn), model, "rows after the MERGE")

    step("MERGE USING a subquery of bound parameters, prepared: insert, then update")
    merge_p = (
        "MERGE INTO %s AS t USING (SELECT %%s::BIGINT AS id, %%s::TEXT AS tag) AS s ON t.id = s.id"
        " WHEN MATCHED THEN UPDATE SET tag = s.tag"
        " WHEN NOT MATCHED THEN INSERT (id, tag, k, emb) VALUES (s.id, s.tag, %%s, %%s)" % ITEMS
    )
    cur = conn.execute(merge_p, (9, "i", 60, np.array([0.0, -2.0, 0.0])), prepare=True)
    check_eq(cur.rowcount, 1, "rowcount of the MERGE that inserts id 9")
    model[9] = ("i", 60, [0.0, -2.0, 0.0])
    cur = conn.execute(merge_p, (9, "I", 61, np.array([5.0, 5.0, 5.0])), prepare=True)
    check_eq(cur.rowcount, 1, "rowcount of the MERGE that updates id 9")
    model[9] = ("I", 60, [0.0, -2.0, 0.0])  # only tag is set when matched
    check_eq(rows_of(conn), model, "rows after the parameter MERGEs")

    step("CREATE TABLE AS: its command tag counts the rows written (SELECT n)")
    cur = conn.execute("CREATE TABLE %s_copy AS SELECT id, tag FROM %s" % (ITEMS, ITEMS))
    check_eq(cur.statusmessage, "SELECT %d" % len(model), "command tag of CREATE TABLE AS")
    check_eq(cur.rowcount, len(model), "rowcount of CREATE TABLE AS")
    conn.execute("DROP TABLE %s_copy" % ITEMS)

    if FRAGVEC:  # PostgreSQL 17 has BY SOURCE, the reference (16) does not
        step("MERGE ... WHEN NOT MATCHED BY SOURCE")
        cur = conn.execute(
            "MERGE INTO %s AS t USING (SELECT * FROM %s WHERE id = 7) AS s ON t.id = s.id"
            " WHEN NOT MATCHED BY SOURCE AND t.k = 10 THEN UPDATE SET tag = 'orphan'" % (ITEMS, SRC)
        )
        check_eq(cur.rowcount, 1, "rowcount of the BY SOURCE MERGE (id 5, the only k = 10)")
        model[5] = ("orphan",) + model[5][1:]
        check_eq(rows_of(conn), model, "rows after the BY SOURCE MERGE")

    step("MERGE matching a target row twice is refused and changes nothing")
    expect_error(
        conn,
        "MERGE INTO %s AS t USING (SELECT id, tag FROM %s UNION ALL SELECT id, tag FROM %s) AS s"
        " ON t.id = s.id WHEN MATCHED THEN UPDATE SET tag = s.tag" % (ITEMS, SRC, SRC),
        sqlstate="21000",
        what="a MERGE matching id 2 twice",
    )
    check_eq(rows_of(conn), model, "rows after the refused MERGE")

    if FRAGVEC:
        step("VERSION AS OF: the version before the MERGEs holds the old rows")
        ops = [op for _, op in versions(conn)]
        check_eq(ops, ["CREATE", "APPEND", "APPEND", "APPEND", "MERGE", "MERGE", "MERGE", "MERGE"],
                 "operations after the MERGEs (the refused one committed nothing)")
        old = rows_of(conn, "%s VERSION AS OF %d" % (ITEMS, version_before_merge))
        check_eq(old, before_merge, "rows of version %d" % version_before_merge)
        check(old != rows_of(conn), "version %d reads the same rows as the newest", version_before_merge)
        check_eq(conn.execute("SELECT count(*) FROM %s VERSION AS OF 1" % ITEMS).fetchone()[0], 0,
                 "rows of version 1 (CREATE)")
        # The version as a bound parameter.
        got = conn.execute("SELECT id FROM %s VERSION AS OF %%s ORDER BY id" % ITEMS, (version_before_merge,)).fetchall()
        check_eq(ids(got), sorted(before_merge), "ids of VERSION AS OF a parameter")

        step("VERSION AS OF: KNN over the old version, and old joined with new")
        knn_old = "SELECT id FROM %s VERSION AS OF %d ORDER BY emb <-> %%s LIMIT 3" % (ITEMS, version_before_merge)
        got = ids(conn.execute(knn_old, (np.array(Q),)).fetchall())
        check_eq(got, top_k(vectors(before_merge), Q, 3), "KNN over version %d" % version_before_merge)
        check(got != top_k(vectors(model), Q, 3), "KNN over the old version equals the newest's: %s", got)
        got = conn.execute(
            "SELECT a.id, a.tag, b.tag FROM %s VERSION AS OF %d AS a LEFT JOIN %s AS b ON a.id = b.id ORDER BY a.id"
            % (ITEMS, version_before_merge, ITEMS)
        ).fetchall()
        want = [(i, before_merge[i][0], model[i][0] if i in model else None) for i in sorted(before_merge)]
        check_eq(got, want, "old tags next to new ones")
        newest = versions(conn)[-1][0]
        e = expect_error(conn, "SELECT * FROM %s VERSION AS OF %d" % (ITEMS, newest + 5), what="a version that does not exist")
        check("does not exist" in str(e), "the error says the version does not exist: %s", e)
        note("VERSION AS OF a missing version: SQLSTATE %s", e.sqlstate)

        step("fragvec_fragments before COMPACT: the MERGEs left deletions and small fragments")
        frags = fragments(conn)
        live = conn.execute("SELECT count(*) FROM %s" % ITEMS).fetchone()[0]
        check_eq(live, len(model), "count(*)")
        check_eq(sum(n - d for _, _, n, d in frags), live, "sum of physical_rows - deleted_rows")
        check(sum(d for _, _, _, d in frags) > 0, "the MERGEs deleted rows, but no fragment has deleted_rows: %s", frags)
        check_eq([p for p, _, _, _ in frags], list(range(len(frags))), "positions")

        step("COMPACT: fewer fragments, no deletions, rows and their order unchanged")
        order = ids(conn.execute("SELECT id FROM %s" % ITEMS).fetchall())  # the logical order
        r = one(conn, "COMPACT %s" % ITEMS)
        check_eq(sorted(r), sorted(["fragments_removed", "fragments_added", "rows_rewritten", "version"]), "COMPACT's columns")
        check_eq((int(r["fragments_removed"]), int(r["fragments_added"]), int(r["rows_rewritten"])),
                 (len(frags), 1, live), "fragments_removed, fragments_added, rows_rewritten")
        check_eq(int(r["version"]), versions(conn)[-1][0], "COMPACT's version is the newest")
        check_eq(versions(conn)[-1][1], "COMPACT", "operation of the newest version")
        frags = fragments(conn)
        check_eq([(n, d) for _, _, n, d in frags], [(live, 0)], "(physical_rows, deleted_rows) after COMPACT")
        check_eq(ids(conn.execute("SELECT id FROM %s" % ITEMS).fetchall()), order, "logical order after COMPACT")
        check_eq(rows_of(conn), model, "rows after COMPACT")
        r = one(conn, "COMPACT %s" % ITEMS, prepare=True)  # Parse/Bind/Describe portal/Execute
        check_eq(int(r["fragments_removed"]), 0, "fragments_removed of a second COMPACT (nothing to do)")

        step("RECLUSTER BY (k): rows unchanged, each destination a disjoint key range")
        r = one(conn, "RECLUSTER %s BY (k) WITH (destinations = 2)" % ITEMS)
        check_eq(sorted(r), sorted(["rows_rewritten", "destinations", "row_map_bytes", "fragments_removed", "version"]),
                 "RECLUSTER's columns")
        check_eq((int(r["rows_rewritten"]), int(r["destinations"])), (live, 2), "rows_rewritten, destinations")
        check_eq(versions(conn)[-1], (int(r["version"]), "RECLUSTER"), "newest version")
        check_eq(rows_of(conn), model, "rows after RECLUSTER")
        ranges = conn.execute(
            "SELECT min(k), max(k), count(*) FROM %s GROUP BY _rowaddr >> 32 ORDER BY min(k)" % ITEMS
        ).fetchall()
        check_eq(len(ranges), 2, "fragments holding rows after RECLUSTER (%s)" % ranges)
        check(ranges[0][1] < ranges[1][0], "the destinations' k ranges overlap: %s", ranges)
        check_eq(sum(n for _, _, n in ranges), live, "rows over the destinations")
        info = one(conn, "SELECT fragments, rows, average_overlaps FROM recluster_information('%s', 'k')" % ITEMS)
        check_eq((int(info["fragments"]), int(info["rows"]), float(info["average_overlaps"])), (2, live, 0.0),
                 "recluster_information after RECLUSTER")

    step("vector index, then KNN through it")
    if FRAGVEC:
        indexed_version = versions(conn)[-1][0]
        r = one(conn, "CREATE VECTOR INDEX %s_idx ON %s (emb) USING IVF_FLAT WITH (num_partitions = 2)" % (ITEMS, ITEMS))
        check_eq([int(x) for x in r.values()], [len(model)], "rows the index statement reports")
    else:
        conn.execute("CREATE INDEX %s_idx ON %s USING ivfflat (emb vector_l2_ops) WITH (lists = 2)" % (ITEMS, ITEMS))
        conn.execute("SET ivfflat.probes = 2")
    knn = "SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 3" % ITEMS
    check_eq(ids(conn.execute(knn, (np.array(Q),)).fetchall()), top_k(vectors(model), Q, 3), "KNN ids")

    if FRAGVEC:
        step("fragvec_indexes: the index and its rows; a later INSERT is unindexed")
        cur = conn.execute("SELECT * FROM fragvec_indexes('%s')" % ITEMS)
        cols = [d.name for d in cur.description]
        for c in ("name", "column", "type", "metric", "num_partitions", "segments", "rows",
                  "unindexed_fragments", "unindexed_rows", "created_at_version"):
            check(c in cols, "fragvec_indexes has no column %s: %s", c, cols)
        got = [dict(zip(cols, r)) for r in cur.fetchall()]
        check_eq(len(got), 1, "indexes listed")
        ix = got[0]
        check_eq((ix["name"], ix["column"], ix["type"], ix["metric"]), ("%s_idx" % ITEMS, "emb", "IVF_FLAT", "l2"),
                 "name, column, type, metric")
        check_eq([int(ix[c]) for c in ("num_partitions", "segments", "rows", "unindexed_fragments", "unindexed_rows")],
                 [2, 1, len(model), 0, 0], "num_partitions, segments, rows, unindexed_fragments, unindexed_rows")
        # the version the index was built from (its own commit is the next one)
        check_eq(int(ix["created_at_version"]), indexed_version, "created_at_version")
        check_eq(versions(conn)[-1][0], indexed_version + 1, "the index statement's commit")
    conn.execute("INSERT INTO %s VALUES (%%s, %%s, %%s, %%s)" % ITEMS, (10, "j", 70, np.array([0.25, 1.0, 0.75])))
    model[10] = ("j", 70, [0.25, 1.0, 0.75])
    if FRAGVEC:
        ix = one(conn, "SELECT rows, unindexed_fragments, unindexed_rows FROM fragvec_indexes('%s')" % ITEMS)
        check_eq([int(ix[c]) for c in ("rows", "unindexed_fragments", "unindexed_rows")], [len(model) - 1, 1, 1],
                 "rows, unindexed_fragments, unindexed_rows after an INSERT")
    check_eq(ids(conn.execute(knn, (np.array(Q),)).fetchall()), top_k(vectors(model), Q, 3), "KNN ids with an unindexed row")

    step("EXPLAIN ANALYZE of a KNN query: KnnExec and its counters")
    plan = plan_text(conn, "EXPLAIN ANALYZE SELECT id FROM %s ORDER BY emb <-> '%s' LIMIT 3" % (ITEMS, Vector(Q).to_text()))
    if FRAGVEC:
        line = [ln for ln in plan.splitlines() if "KnnExec" in ln]
        check(len(line) == 1, "one KnnExec line in EXPLAIN ANALYZE; got:\n%s", plan)
        metrics = dict(re.findall(r"(\w+)=(\d+)", line[0].split("metrics=[", 1)[-1]))
        check("metrics=[" in line[0], "KnnExec shows metrics; got:\n%s", line[0])
        for c in ("segments_searched", "partitions_probed", "rows_scored", "rows_from_unindexed_fragments", "fragments_read"):
            check(c in metrics, "KnnExec's metrics lack %s: %s", c, line[0])
        check_eq(int(metrics["segments_searched"]), 1, "segments_searched")
        check_eq(int(metrics["rows_from_unindexed_fragments"]), 1, "rows_from_unindexed_fragments (row 10)")
        check(int(metrics["rows_scored"]) >= 1, "rows_scored: %s", line[0])
        check("output_rows=3" in plan, "the plan's top reports 3 output rows; got:\n%s", plan)
    else:
        check("actual" in plan, "EXPLAIN ANALYZE shows actual times; got:\n%s", plan)

    step("EXPLAIN of a prepared KNN query, the vector bound as a parameter")
    explain = "EXPLAIN SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 3" % ITEMS
    for q in (Q, [1.5, -0.5, 0.0], [0.0, 0.0, 4.0]):
        # prepare=True: Parse once as a named statement, then Bind/Execute each vector (binary).
        plan = plan_text(conn, explain, (np.array(q, dtype=np.float32),), prepare=True)
        check(plan.strip() != "", "EXPLAIN returned no text")
        if FRAGVEC:
            check("KnnExec" in plan, "the prepared EXPLAIN names KnnExec; got:\n%s", plan)
            check(vec_text(q) in plan, "the plan holds this execution's vector %s; got:\n%s", vec_text(q), plan)
        got = ids(conn.execute(knn, (np.array(q, dtype=np.float32),), prepare=True).fetchall())
        check_eq(got, top_k(vectors(model), q, 3), "prepared KNN ids for %s" % q)
    plan = plan_text(conn, "EXPLAIN ANALYZE SELECT id FROM %s ORDER BY emb <-> %%b LIMIT 3" % ITEMS,
                     (np.array(Q, dtype=np.float32),), prepare=True)
    if FRAGVEC:
        check("KnnExec" in plan and "rows_scored=" in plan, "prepared EXPLAIN ANALYZE shows KnnExec's counters; got:\n%s", plan)

    if FRAGVEC:
        step("Describe of a prepared COMPACT, VACUUM, MAINTAIN, EXPLAIN names their columns; executed, they answer rows")
        for name, sql, cols in (
            (b"fv_compact", "COMPACT %s" % ITEMS, ["fragments_removed", "fragments_added", "rows_rewritten", "version"]),
            (b"fv_vacuum", "VACUUM %s" % ITEMS, ["versions_removed", "files_removed", "bytes_removed"]),
            (b"fv_maintain", "MAINTAIN %s" % ITEMS, None),
            (b"fv_explain", "EXPLAIN SELECT id FROM %s ORDER BY emb <-> '[1,2,3]' LIMIT 1" % ITEMS, ["plan_type", "plan"]),
            (b"fv_explain_p", "EXPLAIN SELECT id FROM %s ORDER BY emb <-> $1 LIMIT 1" % ITEMS, ["plan_type", "plan"]),
        ):
            conn.pgconn.prepare(name, sql.encode())
            d = conn.pgconn.describe_prepared(name)
            got = [d.fname(i).decode() for i in range(d.nfields)]
            if cols is None:
                check(len(got) > 0 and "kind" in got, "Describe of %s names columns; got %s" % (sql, got))
            else:
                check_eq(got, cols, "columns Describe gives for %s" % sql)
            params = [b"[1,2,3]"] if b"$1" in sql.encode() else None
            r = conn.pgconn.exec_prepared(name, params)
            check_eq(r.status, psycopg.pq.ExecStatus.TUPLES_OK, "%s executed answers rows (%s)" % (sql, r.error_message))
            check_eq(r.nfields, len(got), "%s executed: as many columns as described" % sql)
            if not sql.startswith("MAINTAIN"):
                check(r.ntuples >= 1, "%s executed answers at least one row" % sql)
            conn.pgconn.exec_(b"DEALLOCATE " + name)

    step("CREATE VIEW, a query and KNN through it, the view reads the newest rows")
    conn.execute("DROP VIEW IF EXISTS %s" % VIEW)
    conn.execute("CREATE VIEW %s AS SELECT id, tag, k, emb FROM %s WHERE k >= 20" % (VIEW, ITEMS))
    in_view = {i: r for i, r in model.items() if r[1] >= 20}
    check_eq(rows_of(conn, VIEW), in_view, "rows of the view")
    got = conn.execute(
        "SELECT table_name, table_type FROM information_schema.tables WHERE table_name IN (%s, %s) ORDER BY table_name",
        (ITEMS, VIEW),
    ).fetchall()
    check_eq(got, sorted([(ITEMS, "BASE TABLE"), (VIEW, "VIEW")]), "information_schema.tables")
    knn_view = "SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 2" % VIEW
    check_eq(ids(conn.execute(knn_view, (np.array(Q),)).fetchall()), top_k(vectors(in_view), Q, 2), "KNN through the view")
    if FRAGVEC:
        plan = plan_text(conn, "EXPLAIN " + knn_view, (np.array(Q),))
        check("KnnExec" in plan, "KNN through the view is served by the index; got:\n%s", plan)
    conn.execute("INSERT INTO %s VALUES (%%s, %%s, %%s, %%s)" % ITEMS, (11, "k", 20, np.array([0.25, 1.0, 0.5])))
    model[11] = ("k", 20, [0.25, 1.0, 0.5])
    in_view[11] = model[11]
    check_eq(rows_of(conn, VIEW), in_view, "rows of the view after an INSERT into its table")
    check_eq(ids(conn.execute(knn_view, (np.array(Q),)).fetchall())[0], 11, "KNN through the view finds the new row")

    step("a view named like a table is refused; DROP VIEW; the view is gone")
    expect_error(conn, "CREATE VIEW %s AS SELECT 1 AS one" % ITEMS, sqlstate="42P07", what="CREATE VIEW named like a table")
    conn.execute("DROP VIEW %s" % VIEW)
    expect_error(conn, "SELECT * FROM %s" % VIEW, sqlstate="42P01", what="a query of the dropped view")
    conn.execute("DROP VIEW IF EXISTS %s" % VIEW)
    expect_error(conn, "DROP VIEW %s" % VIEW, sqlstate="42P01", what="DROP VIEW of a missing view")
    check_eq(rows_of(conn), model, "the table after DROP VIEW")

    if FRAGVEC:
        step("VACUUM without RETAIN keeps every version")
        history = versions(conn)
        conn.execute("SET fragvec.vacuum_grace_seconds = 0")  # nothing else writes this table
        r = one(conn, "VACUUM %s" % ITEMS)
        check_eq(sorted(r), ["bytes_removed", "files_removed", "versions_removed"], "VACUUM's columns")
        check_eq(int(r["versions_removed"]), 0, "versions_removed without RETAIN")
        check_eq(versions(conn), history, "versions after VACUUM without RETAIN")
        check_eq(rows_of(conn, "%s VERSION AS OF %d" % (ITEMS, version_before_merge)), before_merge,
                 "time travel after VACUUM without RETAIN")

        step("VACUUM RETAIN 1 VERSIONS: old versions and their files go, the rows stay")
        r = one(conn, "VACUUM %s RETAIN 1 VERSIONS" % ITEMS)
        check_eq(int(r["versions_removed"]), len(history) - 1, "versions_removed")
        check(int(r["files_removed"]) > 0 and int(r["bytes_removed"]) > 0,
              "VACUUM removed no files, though COMPACT and RECLUSTER replaced them: %s", r)
        check_eq(versions(conn), history[-1:], "versions after VACUUM RETAIN 1")
        e = expect_error(conn, "SELECT * FROM %s VERSION AS OF %d" % (ITEMS, version_before_merge),
                         what="time travel to a vacuumed version")
        check("does not exist" in str(e), "the error says the version does not exist: %s", e)
        check_eq(rows_of(conn), model, "rows after VACUUM")
        check_eq(ids(conn.execute(knn, (np.array(Q),)).fetchall()), top_k(vectors(model), Q, 3), "KNN after VACUUM")
        r = one(conn, "VACUUM %s RETAIN 1 VERSIONS" % ITEMS, prepare=True)
        check_eq((int(r["versions_removed"]), int(r["files_removed"])), (0, 0), "a second VACUUM removes nothing")

    step("DROP TABLE")
    conn.execute("DROP TABLE %s" % SRC)
    conn.execute("DROP TABLE %s" % ITEMS)


if __name__ == "__main__":
    run_main("statements", main)

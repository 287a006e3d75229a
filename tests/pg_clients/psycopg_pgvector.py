#!/usr/bin/env python3
"""psycopg 3 + pgvector against `fragvec serve` (or PostgreSQL 16 + pgvector as the reference).

What a Python application does with a vector table: register pgvector's adapters
(TypeInfo.fetch of vector, bit, halfvec, sparsevec), insert numpy vectors as binary and as text
parameters, executemany (pipelined), KNN with the query vector as a parameter (also a prepared
statement reused, and as an untyped string), vectors read back in binary and in text, a filtered
KNN, the three distance operators, transaction blocks, error SQLSTATEs, COPY FROM STDIN,
rows-affected counts, an index, EXPLAIN and (fragvec) COMPACT.

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres, FV_PREFIX.
"""

import numpy as np
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector
from psycopg import ClientCursor

from common import (
    FRAGVEC,
    POSTGRES,
    check,
    check_eq,
    cosine,
    drop_at_exit,
    l2,
    neg_ip,
    note,
    run_main,
    step,
    table,
    top_k,
)

ITEMS = table("items")
drop_at_exit(ITEMS)

# id -> (category, vector): integer-valued, so every L2 distance to an integer query is exact and
# no two rows tie for the queries below.
ROWS = {
    1: (1, [1, 0, 0]),
    2: (1, [0, 2, 0]),
    3: (2, [0, 0, 4]),
    4: (2, [1, 1, 1]),
    5: (1, [4, 5, 6]),
    6: (2, [7, 8, 10]),
    7: (1, [-1, -2, -4]),
    8: (2, [2, 3, 6]),
}
Q = [1, 2, 3]


def expect_error(conn, sql, params=None, sqlstate=None, what=None, client_side=False):
    """Runs sql, which must fail (with sqlstate, when given); returns the error."""
    cur = ClientCursor(conn) if client_side else conn.cursor()
    try:
        cur.execute(sql, params)
    except psycopg.Error as e:
        if sqlstate is not None:
            check_eq(e.sqlstate, sqlstate, "SQLSTATE of %s (%s)" % (what or sql, e))
        err = e
    else:
        raise AssertionError("%s succeeded; it should have failed" % (what or sql))
    # The connection (autocommit) is usable again after the error.
    check_eq(conn.execute("SELECT 1").fetchone(), (1,), "SELECT 1 after the error of %s" % (what or sql))
    return err


def ids(rows):
    return [r[0] for r in rows]


def vec_list(v):
    check(isinstance(v, Vector), "a vector column comes back as pgvector.Vector, got %r", type(v))
    return v.to_list()


def main():
    step("connect (autocommit)")
    conn = psycopg.connect(autocommit=True)
    if POSTGRES:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")

    step("register_vector (TypeInfo.fetch of vector, bit, halfvec, sparsevec)")
    register_vector(conn)

    step("CREATE TABLE")
    conn.execute("DROP TABLE IF EXISTS %s" % ITEMS)
    conn.execute("CREATE TABLE %s (id BIGINT, category INT, emb VECTOR(3))" % ITEMS)

    model = {}  # id -> vector, what the table must hold

    step("executemany INSERT, numpy vectors as binary parameters (%b)")
    first = [(i, c, np.array(v, dtype=np.float32)) for i, (c, v) in ROWS.items() if i <= 4]
    cur = conn.cursor()
    cur.executemany("INSERT INTO %s (id, category, emb) VALUES (%%s, %%s, %%b)" % ITEMS, first)
    check_eq(cur.rowcount, 4, "rowcount after executemany of 4 INSERTs")
    model.update({i: ROWS[i][1] for i in range(1, 5)})

    step("INSERT, numpy vector as a text parameter (%t)")
    cur.execute(
        "INSERT INTO %s (id, category, emb) VALUES (%%s, %%s, %%t)" % ITEMS,
        (5, ROWS[5][0], np.array(ROWS[5][1], dtype=np.float64)),
    )
    check_eq(cur.rowcount, 1, "rowcount after one INSERT")
    model[5] = ROWS[5][1]

    step("INSERT, pgvector.Vector as an automatic-format parameter (%s)")
    cur.execute(
        "INSERT INTO %s (id, category, emb) VALUES (%%s, %%s, %%s)" % ITEMS,
        (6, ROWS[6][0], Vector(ROWS[6][1])),
    )
    check_eq(cur.rowcount, 1, "rowcount after one INSERT")
    model[6] = ROWS[6][1]

    step("INSERT of two rows in one statement, vectors as text literals")
    cur.execute(
        "INSERT INTO %s (id, category, emb) VALUES (7, %d, '%s'), (8, %d, '%s')"
        % (ITEMS, ROWS[7][0], Vector(ROWS[7][1]).to_text(), ROWS[8][0], Vector(ROWS[8][1]).to_text())
    )
    check_eq(cur.rowcount, 2, "rowcount after an INSERT of two rows")
    model[7], model[8] = ROWS[7][1], ROWS[8][1]

    step("INSERT of several rows of bound values in one statement (appended without SQL text)")
    many = "INSERT INTO %s (id, category, emb) VALUES (%%s, %%s, %%s), (%%s, %%s, %%s), (%%s, %%s, %%s)" % ITEMS
    cur.execute(many, (100, 1, np.array([9, 9, 9], dtype=np.float32), 101, 2, Vector([8, 8, 8]), 102, None, None))
    check_eq(cur.rowcount, 3, "rowcount after an INSERT of three bound rows")
    got = conn.execute("SELECT id, category, emb IS NULL FROM %s WHERE id >= 100 ORDER BY id" % ITEMS).fetchall()
    check_eq(got, [(100, 1, False), (101, 2, False), (102, None, True)], "the three rows, NULLs kept")
    e = expect_error(conn, many, (103, 1, np.array([1, 2], dtype=np.float32), 104, 1, None, 105, 1, None),
                     sqlstate="22000", what="a 2-d vector among bound rows into VECTOR(3)")
    check("VECTOR(3)" in str(e), "the error names the column's type: %s", e)
    e = expect_error(conn, many, (106, 2 ** 40, None, 107, 1, None, 108, 1, None), what="a category too big for INT")
    note("an INT overflow among bound rows: SQLSTATE %s: %s", e.sqlstate, e)
    check_eq(conn.execute("SELECT count(*) FROM %s WHERE id >= 103" % ITEMS).fetchone(), (0,),
             "a refused multi-row INSERT wrote nothing")
    conn.execute("DELETE FROM %s WHERE id >= 100" % ITEMS)

    step("read every vector back, binary results")
    got = conn.cursor(binary=True).execute("SELECT id, emb FROM %s ORDER BY id" % ITEMS).fetchall()
    check_eq({i: vec_list(v) for i, v in got}, {i: [float(x) for x in v] for i, v in model.items()}, "rows (binary)")

    step("read every vector back, text results")
    got = conn.cursor(binary=False).execute("SELECT id, emb FROM %s ORDER BY id" % ITEMS).fetchall()
    check_eq({i: vec_list(v) for i, v in got}, {i: [float(x) for x in v] for i, v in model.items()}, "rows (text)")

    step("read vectors with execute(binary=True) and binary=False on one cursor")
    for binary in (True, False):
        row = cur.execute("SELECT emb FROM %s WHERE id = %%s" % ITEMS, (4,), binary=binary).fetchone()
        check_eq(vec_list(row[0]), [1.0, 1.0, 1.0], "emb of id 4 (binary=%s)" % binary)

    step("KNN, query vector a numpy parameter")
    want = top_k(model, Q, 2)
    knn = "SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 2" % ITEMS
    check_eq(ids(conn.execute(knn, (np.array(Q),)).fetchall()), want, "KNN ids")

    step("KNN, query vector as a text parameter (%t) with text results")
    knn_t = "SELECT id FROM %s ORDER BY emb <-> %%t LIMIT 2" % ITEMS
    check_eq(ids(conn.cursor(binary=False).execute(knn_t, (np.array(Q),)).fetchall()), want, "KNN ids (text)")

    step("KNN, the same statement prepared and reused (prepare=True)")
    for q in ([1, 2, 3], [0, 0, 3], [7, 8, 9], [1, 2, 3]):
        got = ids(conn.execute(knn, (np.array(q, dtype=np.float32),), prepare=True).fetchall())
        check_eq(got, top_k(model, q, 2), "prepared KNN ids for %s" % q)

    step("KNN, query vector an untyped string parameter (server infers vector)")
    got = ids(conn.execute(knn, ("[1,2,3]",)).fetchall())
    check_eq(got, want, "KNN ids with a str parameter")

    step("KNN through a client-side-bound cursor (simple query protocol)")
    got = ids(ClientCursor(conn).execute(knn, (Vector(Q),)).fetchall())
    check_eq(got, want, "KNN ids (ClientCursor)")

    step("KNN with distances, all three operators")
    for op, fn in (("<->", l2), ("<=>", cosine), ("<#>", neg_ip)):
        rows = conn.execute(
            "SELECT id, emb %s %%s AS d FROM %s ORDER BY d LIMIT 3" % (op, ITEMS), (np.array(Q),)
        ).fetchall()
        check_eq(ids(rows), top_k(model, Q, 3, fn), "ids ordered by %s" % op)
        for i, d in rows:
            check(abs(d - fn(model[i], Q)) < 1e-4, "distance %s of id %d: got %r want %r", op, i, d, fn(model[i], Q))

    step("filtered KNN (WHERE category = %s)")
    filt = "SELECT id FROM %s WHERE category = %%s ORDER BY emb <-> %%s LIMIT 2" % ITEMS
    for cat in (1, 2):
        sub = {i: v for i, v in model.items() if ROWS[i][0] == cat}
        check_eq(ids(conn.execute(filt, (cat, np.array(Q))).fetchall()), top_k(sub, Q, 2), "filtered KNN, category %d" % cat)

    step("parameters of each scalar type: int, float, str")
    row = conn.execute(
        "SELECT id, category FROM %s WHERE id = %%s AND emb <-> %%s < %%s AND %%s = %%s" % ITEMS,
        (4, np.array(Q), 5.5, "x", "x"),
    ).fetchall()
    check_eq(row, [(4, 2)], "row of id 4 found with int, vector, float and str parameters")

    step("UPDATE a vector (parameter) and the rows-affected count")
    cur.execute("UPDATE %s SET emb = %%s WHERE id = %%s" % ITEMS, (np.array([9, 9, 9]), 4))
    check_eq(cur.rowcount, 1, "rowcount after UPDATE of one row")
    model[4] = [9, 9, 9]
    got = conn.execute("SELECT emb FROM %s WHERE id = 4" % ITEMS).fetchone()[0]
    check_eq(vec_list(got), [9.0, 9.0, 9.0], "updated vector")

    step("DELETE and the rows-affected count")
    cur.execute("DELETE FROM %s WHERE category = %%s AND id > %%s" % ITEMS, (2, 6))
    check_eq(cur.rowcount, 1, "rowcount after DELETE (id 8)")
    del model[8]
    cur.execute("DELETE FROM %s WHERE id = %%s" % ITEMS, (12345,))
    check_eq(cur.rowcount, 0, "rowcount after DELETE of no row")
    check_eq(ids(conn.execute(knn, (np.array(Q),)).fetchall()), top_k(model, Q, 2), "KNN after UPDATE and DELETE")

    step("transaction block that commits (conn.transaction(): BEGIN ... COMMIT)")
    with conn.transaction():
        conn.execute("INSERT INTO %s VALUES (%%s, %%s, %%s)" % ITEMS, (20, 1, np.array([20, 0, 0])))
    model[20] = [20, 0, 0]
    check_eq(conn.execute("SELECT count(*) FROM %s WHERE id = 20" % ITEMS).fetchone()[0], 1, "row 20 after COMMIT")

    step("nested transaction blocks (SAVEPOINT / RELEASE)")
    with conn.transaction():
        with conn.transaction():
            conn.execute("INSERT INTO %s VALUES (%%s, %%s, %%s)" % ITEMS, (21, 1, np.array([21, 0, 0])))
    model[21] = [21, 0, 0]
    check_eq(conn.execute("SELECT count(*) FROM %s WHERE id = 21" % ITEMS).fetchone()[0], 1, "row 21 after RELEASE+COMMIT")

    step("read-only block rolled back (BEGIN; SELECT; ROLLBACK) is fine on both")
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM %s" % ITEMS).fetchone()
    conn.execute("ROLLBACK")
    check_eq(conn.info.transaction_status, psycopg.pq.TransactionStatus.IDLE, "transaction status after ROLLBACK")

    step("ROLLBACK after a write inside a block")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO %s VALUES (%%s, %%s, %%s)" % ITEMS, (22, 1, np.array([22, 0, 0])))
    if POSTGRES:
        # PostgreSQL really rolls back: row 22 is gone.
        conn.execute("ROLLBACK")
        check_eq(conn.execute("SELECT count(*) FROM %s WHERE id = 22" % ITEMS).fetchone()[0], 0, "row 22 after ROLLBACK")
    else:
        # fragvec committed the INSERT when it ran, so it cannot roll it back: ROLLBACK is an error
        # (the client must not believe the write was undone), and row 22 stays.
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error as e:
            note("fragvec: ROLLBACK after a write: SQLSTATE %s: %s" % (e.sqlstate, e.diag.message_primary))
        else:
            raise AssertionError("fragvec accepted ROLLBACK after a committed write; it must be an error")
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("COMMIT")  # leave whatever block the server still reports
        check_eq(conn.execute("SELECT count(*) FROM %s WHERE id = 22" % ITEMS).fetchone()[0], 1, "row 22 after the refused ROLLBACK")
        model[22] = [22, 0, 0]

    step("default (non-autocommit) connection: implicit BEGIN, commit()")
    with psycopg.connect() as conn2:
        register_vector(conn2)
        conn2.execute("INSERT INTO %s VALUES (%%s, %%s, %%s)" % ITEMS, (23, 2, np.array([23, 0, 0])))
        conn2.commit()
        check_eq(ids(conn2.execute(knn, (np.array([23, 0, 0]),)).fetchall())[0], 23, "KNN in a new transaction")
        conn2.commit()
    model[23] = [23, 0, 0]

    step("error SQLSTATEs, extended protocol (a statement with parameters: Parse/Bind/Execute)")
    expect_error(conn, "SELEC %s", (1,), sqlstate="42601", what="a syntax error")
    expect_error(conn, "SELECT * FROM %s WHERE id = %%s" % table("no_such_table"), (1,), sqlstate="42P01", what="a missing table")
    expect_error(conn, "SELECT no_such_column FROM %s WHERE id = %%s" % ITEMS, (1,), sqlstate="42703", what="a missing column")

    step("error SQLSTATEs, simple protocol (psycopg sends a statement without parameters as Query)")
    expect_error(conn, "SELEC 1", sqlstate="42601", what="a syntax error (simple)")
    expect_error(conn, "SELECT * FROM %s" % table("no_such_table"), sqlstate="42P01", what="a missing table (simple)")
    expect_error(conn, "SELECT no_such_column FROM %s" % ITEMS, sqlstate="42703", what="a missing column (simple)")
    expect_error(conn, "SELECT no_such_column FROM %s WHERE id = %%s" % ITEMS, (1,), sqlstate="42703", what="a missing column (ClientCursor)", client_side=True)

    step("a vector of the wrong dimension is an error")
    e = expect_error(conn, "INSERT INTO %s VALUES (%%s, %%s, %%s)" % ITEMS, (30, 1, np.array([1, 2])), what="INSERT of a 2-d vector into VECTOR(3)")
    note("wrong dimension on INSERT: SQLSTATE %s: %s" % (e.sqlstate, e.diag.message_primary))
    e = expect_error(conn, knn, (np.array([1, 2, 3, 4]),), what="KNN with a 4-d query vector")
    note("wrong dimension in KNN: SQLSTATE %s: %s" % (e.sqlstate, e.diag.message_primary))
    e = expect_error(conn, "INSERT INTO %s VALUES (31, 1, '[1,2]')" % ITEMS, what="INSERT of a 2-d text literal")
    check_eq(conn.execute("SELECT count(*) FROM %s WHERE id IN (30, 31)" % ITEMS).fetchone()[0], 0, "rows of the failed INSERTs")

    step("COPY FROM STDIN")
    copied = [(40, 1, np.array([40, 1, 1])), (41, 2, np.array([41, 1, 1]))]
    with cur.copy("COPY %s (id, category, emb) FROM STDIN" % ITEMS) as copy:
        for row in copied:
            copy.write_row(row)
    check_eq(cur.rowcount, 2, "rowcount after COPY of 2 rows")
    model.update({i: list(v) for i, _, v in copied})
    # (copy_in.py checks COPY's formats, errors and atomicity.)

    step("index: CREATE (VECTOR) INDEX, then KNN and EXPLAIN")
    if FRAGVEC:
        conn.execute("CREATE VECTOR INDEX %s_idx ON %s (emb) USING IVF_FLAT WITH (num_partitions = 2)" % (ITEMS, ITEMS))
        conn.execute("SET fragvec.exact = true")  # every row scored: the answer is the model's
    else:
        conn.execute("CREATE INDEX %s_idx ON %s USING ivfflat (emb vector_l2_ops) WITH (lists = 2)" % (ITEMS, ITEMS))
        conn.execute("SET ivfflat.probes = 2")  # every list searched: the answer is the model's
    check_eq(ids(conn.execute(knn, (np.array(Q),)).fetchall()), top_k(model, Q, 2), "KNN with the index")
    # PostgreSQL's EXPLAIN has one text column, DataFusion's two (plan_type, plan): read them all.
    rows = conn.execute("EXPLAIN SELECT id FROM %s ORDER BY emb <-> '[1,2,3]' LIMIT 2" % ITEMS).fetchall()
    plan = "\n".join(" ".join(str(c) for c in r) for r in rows)
    check(plan.strip() != "", "EXPLAIN returned no text")
    if FRAGVEC:
        check("KnnExec" in plan, "fragvec's EXPLAIN names KnnExec; got:\n%s", plan)

    step("COMPACT (fragvec only), then the rows are unchanged")
    if FRAGVEC:
        cur = conn.execute("COMPACT %s" % ITEMS)
        if cur.description:  # COMPACT reports what it did as a row
            cur.fetchall()
    got = conn.execute("SELECT id, emb FROM %s ORDER BY id" % ITEMS).fetchall()
    check_eq({i: vec_list(v) for i, v in got}, {i: [float(x) for x in v] for i, v in model.items()}, "rows at the end")

    step("DROP TABLE")
    conn.execute("DROP TABLE %s" % ITEMS)
    conn.close()


if __name__ == "__main__":
    run_main("psycopg_pgvector", main)

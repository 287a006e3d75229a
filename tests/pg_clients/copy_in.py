#!/usr/bin/env python3
"""COPY ... FROM STDIN against `fragvec serve` (or PostgreSQL 16 + pgvector as the reference).

The bulk loads pgvector's documentation shows: psycopg's `cursor.copy()` writing numpy vectors
in text format and in binary format (`set_types([..., 'vector'])`, pgvector's binary form), raw
CSV with a header, quoted fields and NULLs, columns left out taking their DEFAULT, and asyncpg's `copy_records_to_table` (binary, with
pgvector's codec). 20,000 rows in many CopyData messages, then exact KNN against numpy. A COPY
is all or nothing: a bad row, a wrong dimension or a client that aborts (CopyFail) leaves the
table as it was, and the connection usable. Errors: a missing table (42P01) or column (42703).
In a transaction block, COPY leaves the block open (the ReadyForQuery status says so).

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres, FV_PREFIX.
"""

import asyncio
import struct

import asyncpg
import numpy as np
import psycopg
from pgvector.asyncpg import register_vector as register_vector_async
from pgvector.psycopg import register_vector

import hostile
from common import FRAGVEC, POSTGRES, check, check_eq, drop_at_exit, load_random_vectors, note, run_main, step, table

ITEMS = table("copied")
BIG = table("copied_big")
DEFAULTS = table("copied_defaults")
drop_at_exit(ITEMS, BIG, DEFAULTS)
DIM = 32


def count(conn, name=ITEMS):
    return conn.execute("SELECT count(*) FROM %s" % name).fetchone()[0]


def expect_copy_error(conn, sql, rows=None, data=None, sqlstate=None, what=""):
    """A COPY that must fail as a whole; returns the error."""
    before = count(conn)
    try:
        with conn.cursor().copy(sql) as copy:
            for row in rows or []:
                copy.write_row(row)
            if data is not None:
                copy.write(data)
    except psycopg.Error as e:
        if sqlstate is not None:
            check_eq(e.sqlstate, sqlstate, "SQLSTATE of %s (%s)" % (what, e))
        err = e
    else:
        raise AssertionError("%s succeeded; it should have failed" % what)
    check_eq(conn.execute("SELECT 1").fetchone(), (1,), "SELECT 1 after %s" % what)
    check_eq(count(conn), before, "rows after %s (a failed COPY adds none)" % what)
    return err


def main():
    step("connect, register_vector, CREATE TABLE")
    conn = psycopg.connect(autocommit=True)
    if POSTGRES:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    for name in (ITEMS, BIG, DEFAULTS):
        conn.execute("DROP TABLE IF EXISTS %s" % name)
    conn.execute("CREATE TABLE %s (id BIGINT NOT NULL, category INT, note TEXT, emb VECTOR(3))" % ITEMS)
    model = {}  # id -> (category, note, vector)

    step("COPY in text format: write_row with numpy vectors, a NULL, a tab and a newline in text")
    rows = [
        (1, 1, "plain", np.array([1, 0, 0], dtype=np.float32)),
        (2, None, "tab\there, newline\nthere, back\\slash", np.array([0, 2, 0])),
        (3, 2, None, None),
    ]
    cur = conn.cursor()
    with cur.copy("COPY %s (id, category, note, emb) FROM STDIN" % ITEMS) as copy:
        for r in rows:
            copy.write_row(r)
    check_eq(cur.rowcount, 3, "rowcount after a COPY of 3 rows")
    model.update({r[0]: (r[1], r[2], None if r[3] is None else [float(x) for x in r[3]]) for r in rows})

    step("COPY in binary format: set_types with vector (pgvector's binary form)")
    rows = [(10 + i, i % 3, "b%d" % i, np.array([i, -i, 0.5], dtype=np.float32)) for i in range(5)]
    with cur.copy("COPY %s (id, category, note, emb) FROM STDIN WITH (FORMAT BINARY)" % ITEMS) as copy:
        copy.set_types(["int8", "int4", "text", "vector"])
        for r in rows:
            copy.write_row(r)
    check_eq(cur.rowcount, 5, "rowcount after a binary COPY of 5 rows")
    model.update({r[0]: (r[1], r[2], [float(x) for x in r[3]]) for r in rows})

    step("COPY in CSV format: header, quoted fields, NULL, columns in another order")
    csv = (
        'emb,id,note\n'
        '"[7,8,9]",20,"say ""hi"", twice"\n'
        ',21,\n'
        '"[1.5,2.5,3.5]",22,""\n'
    )
    with cur.copy("COPY %s (emb, id, note) FROM STDIN WITH (FORMAT csv, HEADER true)" % ITEMS) as copy:
        copy.write(csv.encode())
    check_eq(cur.rowcount, 3, "rowcount after a CSV COPY of 3 rows")
    model[20] = (None, 'say "hi", twice', [7.0, 8.0, 9.0])
    model[21] = (None, None, None)
    model[22] = (None, "", [1.5, 2.5, 3.5])

    step("columns a COPY leaves out take their DEFAULT (NOT NULL ones too), or NULL")
    conn.execute(
        "CREATE TABLE %s (id BIGINT NOT NULL, status TEXT NOT NULL DEFAULT 'new', "
        "rank INT DEFAULT 7, note TEXT, emb VECTOR(3))" % DEFAULTS
    )
    with cur.copy("COPY %s (id, emb) FROM STDIN" % DEFAULTS) as copy:
        copy.write_row((1, np.array([1, 2, 3])))
        copy.write_row((2, None))
    with cur.copy("COPY %s (id, status) FROM STDIN WITH (FORMAT BINARY)" % DEFAULTS) as copy:
        copy.set_types(["int8", "text"])
        copy.write_row((3, "done"))
    got = conn.execute("SELECT id, status, rank, note FROM %s ORDER BY id" % DEFAULTS).fetchall()
    check_eq(
        got,
        [(1, "new", 7, None), (2, "new", 7, None), (3, "done", 7, None)],
        "rows a COPY filled with DEFAULTs",
    )

    step("the table holds exactly what was copied")
    got = {
        r[0]: (r[1], r[2], None if r[3] is None else [float(x) for x in r[3].to_list()])
        for r in conn.execute("SELECT id, category, note, emb FROM %s" % ITEMS).fetchall()
    }
    check_eq(got, model, "rows after three COPYs")

    step("a bad value in the middle of a COPY: nothing of it is added")
    expect_copy_error(
        conn,
        "COPY %s (id, category, note, emb) FROM STDIN" % ITEMS,
        data=b"30\t1\tfine\t[1,1,1]\nnot-a-number\t1\tbad\t[1,1,1]\n",
        what="a COPY with a non-integer id",
    )
    e = expect_copy_error(
        conn,
        "COPY %s (id, emb) FROM STDIN" % ITEMS,
        data=b"31\t[1,1,1]\n32\t[1,1]\n",
        sqlstate="22000",
        what="a COPY with a 2-d vector into VECTOR(3)",
    )
    note("wrong dimension in COPY: SQLSTATE %s: %s" % (e.sqlstate, e.diag.message_primary))
    expect_copy_error(
        conn,
        "COPY %s (id, emb) FROM STDIN" % ITEMS,
        data=b"33\t[1,1,1]\n34\n",
        sqlstate="22P04",
        what="a COPY with a row of too few fields",
    )
    expect_copy_error(
        conn,
        "COPY %s (id, emb) FROM STDIN" % ITEMS,
        data=b"\\N\t[1,1,1]\n",
        sqlstate="23502",
        what="a COPY with a NULL in a NOT NULL column",
    )

    step("a COPY the client aborts (CopyFail): nothing of it is added")

    class Abort(Exception):
        pass

    before = count(conn)
    try:
        with cur.copy("COPY %s (id, emb) FROM STDIN" % ITEMS) as copy:
            copy.write_row((40, np.array([4, 4, 4])))
            raise Abort()
    except Abort:
        pass
    check_eq(count(conn), before, "rows after an aborted COPY")

    step("COPY errors: a missing table, a missing column, an unknown format")
    expect_copy_error(conn, "COPY %s_nope FROM STDIN" % ITEMS, sqlstate="42P01", what="COPY into a missing table")
    expect_copy_error(conn, "COPY %s (id, nope) FROM STDIN" % ITEMS, sqlstate="42703", what="COPY of a missing column")
    expect_copy_error(conn, "COPY %s FROM STDIN WITH (FORMAT xml)" % ITEMS, sqlstate="22023", what="COPY of an unknown format")

    step("COPY in a transaction block: the block stays open after it")
    tconn = psycopg.connect()  # not autocommit: psycopg opens a block before the COPY
    register_vector(tconn)
    tcur = tconn.cursor()
    with tcur.copy("COPY %s (id, emb) FROM STDIN" % ITEMS) as copy:
        copy.write_row((50, np.array([5, 5, 5])))
    check_eq(tconn.info.transaction_status, psycopg.pq.TransactionStatus.INTRANS, "status after COPY in a block")
    tconn.commit()
    tconn.close()
    model[50] = (None, None, [5.0, 5.0, 5.0])
    check_eq(count(conn), len(model), "rows after the block's COPY and COMMIT")

    step("20,000 rows x %d in binary, in many CopyData messages; exact KNN against numpy" % DIM)
    data = load_random_vectors(conn, BIG, DIM, 20000, seed=7)
    rng = np.random.default_rng(7)
    check_eq(count(conn, BIG), 20000, "rows in the big table")
    for qi in range(3):
        q = rng.standard_normal(DIM).astype(np.float32)
        got = [r[0] for r in conn.execute("SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 10" % BIG, (q,)).fetchall()]
        want = list(np.argsort(((data - q) ** 2).sum(axis=1), kind="stable")[:10])
        check_eq(got, [int(x) for x in want], "KNN %d over the copied rows" % qi)

    step("COPY over the extended protocol (Parse / Bind / Describe / Execute / Sync, raw socket)")
    extended_protocol_copy()
    model[70] = (None, None, [7.0, 0.0, 0.0])
    model[71] = (None, None, [7.0, 1.0, 0.0])
    check_eq(count(conn), len(model), "rows after the extended-protocol COPY")

    step("asyncpg copy_records_to_table (binary, pgvector's codec)")
    asyncio.run(asyncpg_copy(model))
    check_eq(count(conn), len(model), "rows after asyncpg's COPY")
    conn.close()


def extended_protocol_copy():
    """What libpq does for a COPY sent with PQexecParams: the Sync after Execute arrives during
    copy mode and is ignored; CopyDone is followed by a Sync of its own, answered by
    ReadyForQuery."""
    s = hostile.connect()
    try:
        hostile.authenticate(s)
        sql = ("COPY %s (id, emb) FROM STDIN" % ITEMS).encode()
        s.sendall(
            hostile.msg(b"P", b"\0" + sql + b"\0" + struct.pack(">h", 0))
            + hostile.msg(b"B", b"\0\0" + struct.pack(">hhh", 0, 0, 0))
            + hostile.msg(b"D", b"P\0")
            + hostile.msg(b"E", b"\0" + struct.pack(">i", 0))
            + hostile.msg(b"S", b"")
        )
        seen = []
        while True:
            code, body = hostile.read_msg(s)
            seen.append(code)
            check(code != b"E", "extended COPY refused: %s", hostile.error_fields(body))
            if code == b"G":
                break
        check_eq(seen, [b"1", b"2", b"n", b"G"], "answers before CopyInResponse")
        s.sendall(
            hostile.msg(b"d", b"70\t[7,0,0]\n71\t")
            + hostile.msg(b"d", b"[7,1,0]\n")
            + hostile.msg(b"c", b"")
            + hostile.msg(b"S", b"")
        )
        code, body = hostile.read_msg(s)
        check_eq((code, body), (b"C", b"COPY 2\0"), "CommandComplete after CopyDone")
        code, body = hostile.read_msg(s)
        check_eq((code, body), (b"Z", b"I"), "ReadyForQuery after the Sync")
    finally:
        s.close()


async def asyncpg_copy(model):
    aconn = await asyncpg.connect()
    try:
        try:
            await register_vector_async(aconn)
        except ValueError:
            await register_vector_async(aconn, schema="pg_catalog")
        records = [(60 + i, i, np.array([i, i, i], dtype=np.float32)) for i in range(4)]
        status = await aconn.copy_records_to_table(ITEMS, records=records, columns=["id", "category", "emb"])
        check_eq(status, "COPY 4", "asyncpg's COPY status")
        for i, c, v in records:
            model[i] = (c, None, [float(x) for x in v])
        got = await aconn.fetchval("SELECT emb FROM %s WHERE id = 62" % ITEMS)
        check_eq([float(x) for x in got.to_list()], [2.0, 2.0, 2.0], "a vector asyncpg copied, read back")
    finally:
        await aconn.close()


if __name__ == "__main__":
    check(FRAGVEC or POSTGRES, "a target")
    run_main("copy_in.py", main)

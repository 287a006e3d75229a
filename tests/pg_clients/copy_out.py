#!/usr/bin/env python3
"""COPY ... TO STDOUT against `fragvec serve` (or PostgreSQL 16 + pgvector as the reference).

The exports clients run: psycopg's `cursor.copy("COPY ... TO STDOUT")` read row by row with
`set_types` in text and binary format (vectors back through pgvector's loaders),
a table and a query as the source, a column list; CSV with a header, read raw and parsed with
Python's csv module (quotes, commas, newlines, NULL against the empty string); an export of no
rows in every format (`COPY 0`); 20,000 rows x 32 in binary compared with what was loaded;
asyncpg's `copy_from_table` and `copy_from_query`; errors with their SQLSTATE (a missing table
42P01, an unknown format 22023), each leaving the connection usable.

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres, FV_PREFIX.
"""

import asyncio
import csv
import io

import asyncpg
import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from common import FRAGVEC, POSTGRES, check, check_eq, drop_at_exit, load_random_vectors, run_main, step, table

ITEMS = table("exported")
BIG = table("exported_big")
drop_at_exit(ITEMS, BIG)
DIM = 32
TYPES = ["int8", "int4", "text", "vector"]

ROWS = [
    (1, 1, "plain", [1.0, 0.0, 0.0]),
    (2, None, "tab\there, newline\nthere, back\\slash", [0.0, 2.0, 0.5]),
    (3, 2, None, None),
    (4, 3, 'say "hi", twice', [-1.5, 2.25, 3.0]),
    (5, 4, "", [0.0, 0.0, 1.0]),
]


def floats(v):
    """A vector as a list of floats, from pgvector's Vector, numpy or a list."""
    if v is None:
        return None
    if hasattr(v, "to_list"):
        v = v.to_list()
    return [float(x) for x in v]


def as_model(rows):
    """Rows with vectors as lists of floats (numpy arrays compare badly)."""
    return [tuple(floats(v) if i == 3 else v for i, v in enumerate(r)) for r in rows]


def copy_rows(conn, sql, types):
    """The rows a COPY TO STDOUT sends, typed; and the cursor's rowcount."""
    cur = conn.cursor()
    with cur.copy(sql) as copy:
        copy.set_types(types)
        rows = list(copy.rows())
    return rows, cur.rowcount


def copy_bytes(conn, sql):
    cur = conn.cursor()
    with cur.copy(sql) as copy:
        data = b"".join(bytes(chunk) for chunk in copy)
    return data, cur.rowcount


def expect_error(conn, sql, sqlstate, what):
    try:
        copy_bytes(conn, sql)
    except psycopg.Error as e:
        check_eq(e.sqlstate, sqlstate, "SQLSTATE of %s (%s)" % (what, e))
    else:
        raise AssertionError("%s succeeded; it should have failed" % what)
    check_eq(conn.execute("SELECT 1").fetchone(), (1,), "SELECT 1 after %s" % what)


def main():
    step("connect, register_vector, CREATE TABLE, INSERT")
    conn = psycopg.connect(autocommit=True)
    if POSTGRES:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    for name in (ITEMS, BIG):
        conn.execute("DROP TABLE IF EXISTS %s" % name)
    conn.execute("CREATE TABLE %s (id BIGINT NOT NULL, category INT, note TEXT, emb VECTOR(3))" % ITEMS)
    cur = conn.cursor()
    cur.executemany(
        "INSERT INTO %s (id, category, note, emb) VALUES (%%s, %%s, %%s, %%s)" % ITEMS,
        [(i, c, n, None if v is None else np.array(v, dtype=np.float32)) for i, c, n, v in ROWS],
    )
    ordered = "(SELECT id, category, note, emb FROM %s ORDER BY id)" % ITEMS

    step("COPY (query) TO STDOUT in text format, rows typed with set_types")
    rows, count = copy_rows(conn, "COPY %s TO STDOUT" % ordered, TYPES)
    check_eq(as_model(rows), as_model(ROWS), "rows of a text COPY TO")
    check_eq(count, len(ROWS), "rowcount of a text COPY TO")

    step("COPY (query) TO STDOUT in binary format: vectors in pgvector's binary form")
    rows, count = copy_rows(conn, "COPY %s TO STDOUT (FORMAT BINARY)" % ordered, TYPES)
    check_eq(as_model(rows), as_model(ROWS), "rows of a binary COPY TO")
    check_eq(count, len(ROWS), "rowcount of a binary COPY TO")

    step("COPY table (columns) TO STDOUT: the table's rows, those columns")
    rows, count = copy_rows(conn, "COPY %s (emb, id) TO STDOUT" % ITEMS, ["vector", "int8"])
    got = sorted(as_model([(i, None, None, e) for e, i in rows]))
    check_eq(got, sorted(as_model([(r[0], None, None, r[3]) for r in ROWS])), "rows of COPY t (emb, id) TO")
    check_eq(count, len(ROWS), "rowcount of COPY t (emb, id) TO")

    step("COPY TO STDOUT in CSV with a header, read raw and parsed")
    data, count = copy_bytes(conn, "COPY %s TO STDOUT WITH (FORMAT csv, HEADER true)" % ordered)
    check_eq(count, len(ROWS), "rowcount of a CSV COPY TO")
    lines = list(csv.reader(io.StringIO(data.decode(), newline="")))
    check_eq(lines[0], ["id", "category", "note", "emb"], "the CSV header")
    check_eq(len(lines), len(ROWS) + 1, "CSV records")
    for line, (i, c, n, v) in zip(lines[1:], ROWS):
        check_eq(line[:3], [str(i), "" if c is None else str(c), "" if n is None else n], "CSV fields of row %d" % i)
        if v is None:
            check_eq(line[3], "", "a NULL vector in CSV")
        else:
            check_eq([float(x) for x in line[3].strip("[]").split(",")], v, "a vector in CSV")
    # NULL is an empty field, the empty string a quoted one (row 2's note spans two lines).
    raw = data.decode().split("\n")
    check_eq(raw[4], "3,2,,", "a row with NULL note and vector, raw")
    check(raw[6].startswith('5,4,"",'), "the empty string is quoted: %r", raw[6])

    step("an export of no rows: COPY 0 in every format")
    empty = "(SELECT id, emb FROM %s WHERE id < 0)" % ITEMS
    for options in ("", " (FORMAT binary)"):
        rows, count = copy_rows(conn, "COPY %s TO STDOUT%s" % (empty, options), ["int8", "vector"])
        check_eq((rows, count), ([], 0), "rows and rowcount of an empty COPY TO%s" % options)
    data, count = copy_bytes(conn, "COPY %s TO STDOUT (FORMAT csv, HEADER true)" % empty)
    check_eq((data, count), (b"id,emb\n", 0), "data and rowcount of an empty CSV COPY TO with a header")

    step("COPY TO errors: a missing table, an unknown format, then the connection still works")
    expect_error(conn, "COPY %s_nope TO STDOUT" % ITEMS, "42P01", "COPY of a missing table")
    expect_error(conn, "COPY %s TO STDOUT (FORMAT xml)" % ITEMS, "22023", "COPY TO of an unknown format")

    step("COPY TO in a transaction block: a read, the block stays open")
    tconn = psycopg.connect()
    register_vector(tconn)
    rows, count = copy_rows(tconn, "COPY %s TO STDOUT" % ordered, TYPES)
    check_eq(count, len(ROWS), "rowcount of a COPY TO in a block")
    check_eq(tconn.info.transaction_status, psycopg.pq.TransactionStatus.INTRANS, "status after COPY TO in a block")
    tconn.commit()
    tconn.close()

    step("20,000 rows x %d exported in binary equal what was loaded" % DIM)
    data = load_random_vectors(conn, BIG, DIM, 20000, seed=11)
    rows, count = copy_rows(conn, "COPY %s TO STDOUT (FORMAT BINARY)" % BIG, ["int8", "vector"])
    check_eq(count, 20000, "rowcount of the big export")
    got = np.zeros_like(data)
    seen = np.zeros(len(data), dtype=bool)
    for i, v in rows:
        got[i] = floats(v)
        seen[i] = True
    check(seen.all(), "every row exported once")
    check(np.array_equal(got, data), "exported vectors equal the loaded ones, bit for bit")

    step("asyncpg copy_from_table (CSV, header) and copy_from_query (binary)")
    asyncio.run(asyncpg_copy())
    conn.close()


async def asyncpg_copy():
    aconn = await asyncpg.connect()
    try:
        out = io.BytesIO()
        status = await aconn.copy_from_table(ITEMS, output=out, format="csv", header=True, columns=["id", "note"])
        check_eq(status, "COPY %d" % len(ROWS), "asyncpg's copy_from_table status")
        lines = sorted(list(csv.reader(io.StringIO(out.getvalue().decode(), newline="")))[1:])
        want = sorted([str(i), "" if n is None else n] for i, _, n, _ in ROWS)
        check_eq(lines, want, "asyncpg's CSV export")
        out = io.BytesIO()
        status = await aconn.copy_from_query("SELECT id FROM %s WHERE id <= 2 ORDER BY id" % ITEMS, output=out, format="binary")
        check_eq(status, "COPY 2", "asyncpg's copy_from_query status")
        check(out.getvalue().startswith(b"PGCOPY\n\xff\r\n\0"), "a binary export starts with the signature")
        check(out.getvalue().endswith(b"\xff\xff"), "a binary export ends with the trailer")
    finally:
        await aconn.close()


if __name__ == "__main__":
    check(FRAGVEC or POSTGRES, "a target")
    run_main("copy_out.py", main)

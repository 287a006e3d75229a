#!/usr/bin/env python3
"""asyncpg against `fragvec serve` (or PostgreSQL 16 + pgvector as the reference).

asyncpg prepares every statement (named statements, Describe, binary results) and introspects
every type OID it does not know (vector's) with a recursive CTE over pg_type. This registers
pgvector's binary codec (pgvector.asyncpg.register_vector, i.e. set_type_codec('vector', ...,
format='binary')), then on a second connection a text codec of our own (format='text'), and runs
executemany inserts, KNN with a vector parameter, a prepared statement reused, a cursor fetching a few rows at a time (portal suspension), int / float / str
parameters, status strings, a transaction and error SQLSTATEs.

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres, FV_PREFIX.
"""

import asyncio
import datetime
import decimal

import asyncpg
import numpy as np
from pgvector import Vector
from pgvector.asyncpg import register_vector

from common import FRAGVEC, POSTGRES, check, check_eq, drop_at_exit, l2, note, run_main, step, table, top_k

ITEMS = table("aitems")
drop_at_exit(ITEMS)

# id -> (category, vector): integer-valued, chosen so that no two rows tie for any query below.
VECTORS = {
    1: [-6, -9, 9], 2: [-5, 8, -6], 3: [2, 10, -9], 4: [-7, -3, 10], 5: [3, -5, 11], 6: [-1, 2, 10],
    7: [2, 6, -6], 8: [-6, 6, 5], 9: [6, 6, 0], 10: [-7, -5, -6], 11: [14, 1, 14], 12: [-1, 6, 13],
}
ROWS = {i: (i % 2, v) for i, v in VECTORS.items()}
QUERIES = ([1, 2, 3], [5, 0, 0], [12, 4, 3], [0, 0, 0])


async def register(conn):
    """pgvector's codec; vector is in schema public on PostgreSQL (CREATE EXTENSION's default)
    and wherever the server's pg_type puts it otherwise: public first, then pg_catalog."""
    try:
        await register_vector(conn)
        return "public"
    except ValueError as e:
        if not str(e).startswith("unknown type"):
            raise
    await register_vector(conn, schema="pg_catalog")
    return "pg_catalog"


async def register_text_codec(conn, schema):
    await conn.set_type_codec(
        "vector",
        schema=schema,
        encoder=lambda v: "[" + ",".join(str(float(x)) for x in v) + "]",
        decoder=lambda s: [float(x) for x in s[1:-1].split(",")],
        format="text",
    )


async def expect_error(conn, sql, *args, sqlstate=None, what=None):
    try:
        await conn.fetch(sql, *args)
    except asyncpg.PostgresError as e:
        if sqlstate is not None:
            check_eq(e.sqlstate, sqlstate, "SQLSTATE of %s (%s)" % (what or sql, e))
        err = e
    else:
        raise AssertionError("%s succeeded; it should have failed" % (what or sql))
    check_eq(await conn.fetchval("SELECT 1"), 1, "SELECT 1 after the error of %s" % (what or sql))
    return err


async def amain():
    step("connect")
    conn = await asyncpg.connect()
    if POSTGRES:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")

    step("register pgvector's binary codec (set_type_codec format='binary')")
    schema = await register(conn)
    note("vector type found in schema %s", schema)

    step("CREATE TABLE")
    await conn.execute("DROP TABLE IF EXISTS %s" % ITEMS)
    status = await conn.execute("CREATE TABLE %s (id BIGINT, category INT, emb VECTOR(3))" % ITEMS)
    check_eq(status, "CREATE TABLE", "status of CREATE TABLE")

    step("executemany INSERT with numpy vectors")
    model = {}
    await conn.executemany(
        "INSERT INTO %s (id, category, emb) VALUES ($1, $2, $3)" % ITEMS,
        [(i, c, np.array(v, dtype=np.float32)) for i, (c, v) in ROWS.items() if i <= 8],
    )
    model.update({i: ROWS[i][1] for i in range(1, 9)})

    step("INSERT with a pgvector.Vector parameter: status string")
    for i in range(9, 13):
        status = await conn.execute("INSERT INTO %s (id, category, emb) VALUES ($1, $2, $3)" % ITEMS, i, ROWS[i][0], Vector(ROWS[i][1]))
        check_eq(status, "INSERT 0 1", "status of one INSERT")
        model[i] = ROWS[i][1]

    step("fetch vectors back (binary codec: pgvector.Vector)")
    rows = await conn.fetch("SELECT id, emb FROM %s ORDER BY id" % ITEMS)
    check_eq(len(rows), len(model), "row count")
    for r in rows:
        check(isinstance(r["emb"], Vector), "emb comes back as pgvector.Vector, got %r", type(r["emb"]))
        check_eq(r["emb"].to_list(), [float(x) for x in model[r["id"]]], "emb of id %d" % r["id"])

    step("KNN with a vector parameter")
    knn = "SELECT id, emb <-> $1 AS d FROM %s ORDER BY emb <-> $1 LIMIT 3" % ITEMS
    for q in QUERIES:
        rows = await conn.fetch(knn, np.array(q))
        check_eq([r["id"] for r in rows], top_k(model, q, 3), "KNN ids for %s" % q)
        for r in rows:
            check(abs(r["d"] - l2(model[r["id"]], q)) < 1e-4, "distance of id %d: %r", r["id"], r["d"])

    step("a prepared statement reused")
    stmt = await conn.prepare("SELECT id FROM %s WHERE category = $2 ORDER BY emb <-> $1 LIMIT 2" % ITEMS)
    param_types = [(t.name, t.schema) for t in stmt.get_parameters()]
    note("prepared KNN parameter types: %s", param_types)
    check_eq(param_types[1][0] in ("int4", "int8"), True, "type of the category parameter %s" % (param_types,))
    check_eq(param_types[0][0], "vector", "type of the query-vector parameter")
    check_eq([(a.name, a.type.name) for a in stmt.get_attributes()], [("id", "int8")], "result columns of the prepared KNN")
    for _ in range(2):
        for q in QUERIES:
            for cat in (0, 1):
                got = [r["id"] for r in await stmt.fetch(Vector(q), cat)]
                sub = {i: v for i, v in model.items() if ROWS[i][0] == cat}
                check_eq(got, top_k(sub, q, 2), "prepared filtered KNN for %s, category %d" % (q, cat))

    step("a cursor: Execute with a row limit, the portal suspended between fetches")
    ids = sorted(model)
    async with conn.transaction():
        cur = await conn.cursor("SELECT id FROM %s ORDER BY id" % ITEMS)
        check_eq([r["id"] for r in await cur.fetch(3)], ids[:3], "a cursor's first 3 rows")
        check_eq([r["id"] for r in await cur.fetch(2)], ids[3:5], "its next 2 rows")
        seen = [r["id"] async for r in conn.cursor("SELECT id FROM %s ORDER BY id" % ITEMS, prefetch=2)]
        check_eq(seen, ids, "every row through a cursor that prefetches 2")

    step("int, float and str parameters; fetchval / fetchrow")
    check_eq(await conn.fetchval("SELECT count(*) FROM %s WHERE id > $1" % ITEMS, 6), 6, "count with an int parameter")
    row = await conn.fetchrow("SELECT id, category FROM %s WHERE emb <-> $1 < $2 AND $3 = 'x' ORDER BY id LIMIT 1" % ITEMS, Vector(VECTORS[6]), 1.5, "x")
    check_eq(tuple(row), (6, 0), "row with vector, float and str parameters")

    step("UPDATE and DELETE status strings")
    status = await conn.execute("UPDATE %s SET emb = $1 WHERE id = $2" % ITEMS, Vector([50, 50, 50]), 12)
    check_eq(status, "UPDATE 1", "status of UPDATE")
    model[12] = [50, 50, 50]
    status = await conn.execute("DELETE FROM %s WHERE id >= $1 AND id <= $2" % ITEMS, 10, 11)
    check_eq(status, "DELETE 2", "status of DELETE")
    del model[10], model[11]

    step("transaction block (BEGIN ... COMMIT)")
    async with conn.transaction():
        await conn.execute("INSERT INTO %s VALUES ($1, $2, $3)" % ITEMS, 20, 0, Vector([20, 20, 20]))
    model[20] = [20, 20, 20]

    step("error SQLSTATEs")
    e = await expect_error(conn, "SELEC 1", sqlstate="42601", what="a syntax error")
    check(isinstance(e, asyncpg.PostgresSyntaxError), "a syntax error is PostgresSyntaxError, got %r", type(e))
    await expect_error(conn, "SELECT * FROM %s" % table("no_such_table"), sqlstate="42P01", what="a missing table")
    await expect_error(conn, "SELECT nope FROM %s WHERE id = $1" % ITEMS, 1, sqlstate="42703", what="a missing column")
    e = await expect_error(conn, "INSERT INTO %s VALUES ($1, $2, $3)" % ITEMS, 30, 0, Vector([1, 2]), what="a 2-d vector into VECTOR(3)")
    note("wrong dimension: SQLSTATE %s: %s", e.sqlstate, e)

    step("the rows, through a second connection with a text codec (set_type_codec format='text')")
    conn2 = await asyncpg.connect()
    await register_text_codec(conn2, schema)
    rows = await conn2.fetch("SELECT id, emb FROM %s ORDER BY id" % ITEMS)
    check_eq({r["id"]: r["emb"] for r in rows}, {i: [float(x) for x in v] for i, v in model.items()}, "rows (text codec)")
    for q in QUERIES:
        got = [r["id"] for r in await conn2.fetch("SELECT id FROM %s ORDER BY emb <-> $1 LIMIT 3" % ITEMS, q)]
        check_eq(got, top_k(model, q, 3), "KNN ids (text codec) for %s" % q)
    await conn2.close()

    step("NUMERIC, INTERVAL, TIME and DATE values (asyncpg reads every column in binary)")
    row = await conn.fetchrow(
        "SELECT CAST(1234.5 AS DECIMAL(10,2)) AS d, CAST(-0.05 AS DECIMAL(6,3)) AS small, "
        "INTERVAL '1 day 2 hours' AS i, TIME '10:30:00.25' AS t, DATE '2024-02-29' AS day, 7 AS n")
    check_eq((row["d"], row["small"]), (decimal.Decimal("1234.50"), decimal.Decimal("-0.050")), "decimals")
    check_eq(row["i"], datetime.timedelta(days=1, hours=2), "interval")
    check_eq(row["t"], datetime.time(10, 30, 0, 250000), "time")
    check_eq((row["day"], row["n"]), (datetime.date(2024, 2, 29), 7), "date and int beside them")

    if FRAGVEC:
        step("fragvec_versions in binary: its UInt64 columns are NUMERIC (fragvec only)")
        rows = await conn.fetch("SELECT * FROM fragvec_versions('%s') ORDER BY version" % ITEMS)
        check_eq(list(rows[0].keys()), ["version", "operation", "timestamp", "read_version", "fragments", "rows"],
                 "fragvec_versions' columns")
        check_eq([int(r["version"]) for r in rows], list(range(1, len(rows) + 1)), "versions 1, 2, ...")
        check_eq(rows[0]["operation"], "CREATE", "the first version's operation")
        check(all(isinstance(r["timestamp"], datetime.datetime) for r in rows), "timestamps are datetimes")
        check_eq(int(rows[-1]["rows"]), len(model), "rows of the newest version")

        step("COMPACT (fragvec only): fetch() returns its summary row")
        summary = await conn.fetch("COMPACT %s" % ITEMS)
        check_eq(len(summary), 1, "COMPACT answers one row")
        check("version" in summary[0].keys(), "COMPACT's row has its new version")

    step("DROP TABLE")
    await conn.execute("DROP TABLE %s" % ITEMS)
    await conn.close()


if __name__ == "__main__":
    run_main("asyncpg_vector", lambda: asyncio.run(amain()))

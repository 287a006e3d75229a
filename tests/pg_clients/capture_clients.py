#!/usr/bin/env python3
"""Drives psycopg, pgvector and asyncpg through the minimum a server must answer, one labelled
section at a time, for pgwire_tap.py to record (see capture.sh and CAPTURED.md).

    python capture_clients.py LOGFILE    # PG* env pointing at the tap; FV_TARGET as elsewhere

Each section starts with a line '=== name' appended to LOGFILE (the tap's log), so the decoded
messages that follow belong to it. Table: FV_PREFIX_cap (created, dropped).
"""

import asyncio
import sys
import time

import asyncpg
import numpy as np
import psycopg
from pgvector import Vector
from pgvector.asyncpg import register_vector as asyncpg_register_vector
from pgvector.psycopg import register_vector

from common import POSTGRES, table

LOG = sys.argv[1]
T = table("pyitems")


def section(name):
    time.sleep(0.3)  # let the tap write what came before
    with open(LOG, "a") as f:
        f.write("=== %s\n" % name)


def psycopg_sections():
    section("psycopg: connect (autocommit=False, the default)")
    conn = psycopg.connect()
    conn.close()

    section("psycopg: connect (autocommit=True)")
    conn = psycopg.connect(autocommit=True)

    section("psycopg: setup (not part of the contract)")
    if POSTGRES:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    conn.execute("DROP TABLE IF EXISTS %s" % T)
    conn.execute("CREATE TABLE %s (id BIGINT, category INT, emb VECTOR(3))" % T)

    section("psycopg: pgvector.psycopg.register_vector(conn): TypeInfo.fetch of vector, bit, halfvec, sparsevec")
    register_vector(conn)

    section("psycopg: a default (autocommit=False) connection: implicit BEGIN, then commit()")
    c2 = psycopg.connect()
    c2.execute("SELECT count(*) FROM %s" % T).fetchall()
    c2.commit()
    c2.close()

    section("psycopg: parameters int, float, str (execute, %s)")
    conn.execute("SELECT %s, %s, %s", (7, 1.5, "x")).fetchall()

    section("psycopg: parameters large int, bool, None, str with %t, int with %b")
    conn.execute("SELECT %s, %s, %s, %t, %b", (2**40, True, None, "y", 3)).fetchall()

    section("psycopg: vector parameter (numpy, %s: binary) and a vector column (binary results)")
    conn.execute("INSERT INTO %s VALUES (%%s, %%s, %%s)" % T, (1, 1, np.array([1, 2, 3])))
    conn.cursor(binary=True).execute("SELECT id, emb FROM %s ORDER BY emb <-> %%s LIMIT 1" % T, (np.array([1, 2, 3]),)).fetchall()

    section("psycopg: vector parameter as text (%t) and text results (default)")
    conn.execute("SELECT id, emb FROM %s ORDER BY emb <-> %%t LIMIT 1" % T, (Vector([1, 2, 3]),)).fetchall()

    section("psycopg: vector parameter given as a str")
    conn.execute("SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 1" % T, ("[1,2,3]",)).fetchall()

    section("psycopg: prepare=True, run 3 times")
    for _ in range(3):
        conn.execute("SELECT id FROM %s ORDER BY emb <-> %%s LIMIT 1" % T, (np.array([1, 2, 3]),), prepare=True).fetchall()

    section("psycopg: executemany (pipeline mode)")
    conn.cursor().executemany("INSERT INTO %s VALUES (%%s, %%s, %%s)" % T, [(i, 1, np.array([i, 0, 0])) for i in (2, 3, 4)])

    section("psycopg: a query without parameters")
    conn.execute("SELECT count(*) FROM %s" % T).fetchall()

    section("psycopg: ClientCursor (client-side binding, simple query protocol)")
    psycopg.ClientCursor(conn).execute("SELECT id FROM %s WHERE id = %%s AND emb <-> %%s < %%s" % T, (1, Vector([1, 2, 3]), 0.5)).fetchall()

    section("psycopg: transaction block, nested")
    with conn.transaction():
        with conn.transaction():
            conn.execute("SELECT 1").fetchall()

    section("psycopg: an error (syntax)")
    try:
        conn.execute("SELEC 1")
    except psycopg.Error:
        pass

    section("psycopg: COPY FROM STDIN (text)")
    try:
        with conn.cursor().copy("COPY %s (id, category, emb) FROM STDIN" % T) as copy:
            copy.write_row((10, 1, np.array([10, 0, 0])))
    except psycopg.Error as e:
        print("COPY:", e, file=sys.stderr)

    section("psycopg: close")
    conn.close()


async def asyncpg_sections():
    section("asyncpg: connect")
    conn = await asyncpg.connect()

    section("asyncpg: parameters int, float, str (fetch)")
    await conn.fetch("SELECT $1::int, $2::float8, $3::text", 7, 1.5, "x")

    section("asyncpg: parameters without casts (types from the server's ParameterDescription)")
    await conn.fetch("SELECT id FROM %s WHERE id = $1 AND category = $2" % T, 1, 1)

    section("asyncpg: a vector column before any codec (unknown OID: introspection)")
    rows = await conn.fetch("SELECT id, emb FROM %s ORDER BY id LIMIT 1" % T)
    print("asyncpg, no codec:", rows, file=sys.stderr)

    section("asyncpg: pgvector.asyncpg.register_vector(conn) (set_type_codec 'vector', binary)")
    await asyncpg_register_vector(conn)

    section("asyncpg: vector parameter (binary codec) and a vector column")
    await conn.fetch("SELECT id, emb FROM %s ORDER BY emb <-> $1 LIMIT 1" % T, np.array([1, 2, 3]))

    section("asyncpg: prepare and reuse")
    stmt = await conn.prepare("SELECT id FROM %s WHERE category = $2 ORDER BY emb <-> $1 LIMIT 2" % T)
    for _ in range(2):
        await stmt.fetch(Vector([1, 2, 3]), 1)

    section("asyncpg: executemany")
    await conn.executemany("INSERT INTO %s VALUES ($1, $2, $3)" % T, [(i, 2, Vector([i, 1, 1])) for i in (20, 21)])

    section("asyncpg: execute without parameters (simple query)")
    await conn.execute("SELECT 1")

    section("asyncpg: transaction")
    async with conn.transaction():
        await conn.fetchval("SELECT 1")

    section("asyncpg: close")
    await conn.close()

    section("asyncpg: a fresh connection, set_type_codec('vector', format='text')")
    conn = await asyncpg.connect()
    await conn.set_type_codec("vector", schema="public", encoder=lambda v: str(v), decoder=lambda s: s, format="text")
    await conn.fetch("SELECT id, emb FROM %s ORDER BY emb <-> $1 LIMIT 1" % T, "[1,2,3]")
    await conn.execute("DROP TABLE %s" % T)
    await conn.close()


def main():
    psycopg_sections()
    asyncio.run(asyncpg_sections())
    section("end")


if __name__ == "__main__":
    main()

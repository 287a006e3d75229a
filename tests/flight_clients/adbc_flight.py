#!/usr/bin/env python3
"""ADBC's Flight SQL driver (adbc_driver_flightsql.dbapi, with pyarrow) against `fragvec serve --flight`.

What a Python data application does over Arrow Flight SQL: DDL and INSERT with vector literals,
qmark parameters (a Python list of floats arrives as Arrow list<double>), executemany, results as
Arrow (VECTOR(8) as fixed_size_list<float>[8]), KNN with the query vector a parameter, bulk ingest
(create / append / replace; a misfit append refused whole), an IVF index, EXPLAIN, session SETs,
catalog metadata, errors, cancel, and on a second server, username/password authentication.

Env: FRAGVEC_FLIGHT_URI (grpc://host:port, no auth); optionally FRAGVEC_FLIGHT_AUTH_URI +
FRAGVEC_FLIGHT_USER + FRAGVEC_FLIGHT_PASSWORD (a server with users); FV_ROWS (bulk rows, default
1_000_000); FV_PREFIX (table prefix); FV_KEEP=1 (keep the tables); FRAGVEC_SERVER_PID (the first
server's pid: after the cancel its CPU must go idle); FV_TIMEOUT (seconds before giving up, 1800).
Prints a line per check and exits 0 only if none failed.
"""

import faulthandler
import os
import sys
import threading
import time
import warnings

import adbc_driver_flightsql.dbapi as flight_sql
import numpy as np
import pyarrow as pa
from adbc_driver_manager import AdbcStatusCode

URI = os.environ.get("FRAGVEC_FLIGHT_URI")
AUTH_URI = os.environ.get("FRAGVEC_FLIGHT_AUTH_URI")
USER = os.environ.get("FRAGVEC_FLIGHT_USER")
PASSWORD = os.environ.get("FRAGVEC_FLIGHT_PASSWORD")
ROWS = int(os.environ.get("FV_ROWS", "1_000_000"))
PREFIX = os.environ.get("FV_PREFIX") or "fv_adbc_%d_%d" % (os.getpid(), int(time.time()) % 100000)
SERVER_PID = os.environ.get("FRAGVEC_SERVER_PID")

DIM = 8
ITEMS, BULK, MISSING = PREFIX + "_items", PREFIX + "_bulk", PREFIX + "_missing"
VECTOR_TYPE = pa.list_(pa.float32(), DIM)
# The driver caps a gRPC message at 16 MiB each way and sends a record batch per message (one
# 1M-row chunk fails in the client), so the upload goes as ~10 MB batches, as an application must.
INGEST_BATCH_ROWS = 200_000
REPLACE_ROWS = 20_000  # t_bulk's rows after the replace
CANCEL_AFTER, CANCEL_DEADLINE = 0.5, 5.0  # seconds

# t_items: id -> (cat, vector), with no tie in the top 3 from KNN_Q (checked, so edits keep it so).
LITERAL_ROWS = {1: (1, [1, 0, 0, 0, 0, 0, 0, 0]), 2: (1, [0, 2, 0, 0, 0, 0, 0, 0]),
                3: (2, [0, 0, 3, 0, 0, 0, 0, 0]), 4: (2, [1, 1, 1, 1, 1, 1, 1, 1])}
PARAM_ROWS = {10: (1, [0.1] * DIM), 11: (2, [0.5, -0.5, 0.25, 0, 0, 0, 2, 0])}
MANY_ROWS = {20: (3, [3] * DIM), 21: (3, [0, 0, 0, 0, 0, 0, 0, -1]), 22: (1, [2, 0, 2, 0, 2, 0, 2, 0])}
KNN_Q = [0.9, 0.1, 0.2, 0.3, 0.1, 0.2, 0.1, 0.1]

results = {"ok": 0, "FAIL": 0, "SKIP": 0}
bulk_vectors = {}  # "all": the bulk table's vectors, row i holding id i
warned = set()


class Skip(Exception):
    """A check that cannot run here (says why): neither passed nor failed."""


def check(name, fn, *args):
    """Runs one check: fn raises on failure and may return a detail string."""
    try:
        detail = fn(*args)
    except Skip as e:
        return report("SKIP", name, str(e))
    except Exception as e:  # the driver's errors and failed expectations alike fail this check
        return report("FAIL", name, describe(e))
    return report("ok", name, detail)


def report(kind, name, detail=None):
    results[kind] += 1
    print("%s: %s%s" % (kind, name, " (%s)" % detail if detail else ""), flush=True)


def note(text):
    print("note: " + text, flush=True)


def expect(cond, message, *args):
    if not cond:
        raise AssertionError(message % args if args else message)


def describe(e):
    """An exception as class, ADBC status and message: what tells causes apart."""
    status = getattr(e, "status_code", None)
    return "%s%s: %s" % (type(e).__name__, "[%s]" % status.name if status is not None else "", e)


def expect_error(what, fn, *args):
    """fn(*args) must raise an ADBC error; returns it."""
    try:
        fn(*args)
    except flight_sql.Error as e:
        return e
    raise AssertionError("%s: no error" % what)


def connect(uri=None, **db_kwargs):
    """A DB-API connection as an application makes one (autocommit left at its default)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        conn = flight_sql.connect(uri or URI, db_kwargs=db_kwargs or None)
    for w in caught:  # "Cannot disable autocommit" when the server reports no transactions
        if str(w.message) not in warned:
            warned.add(str(w.message))
            note("the driver warns: %s" % w.message)
    return conn


def query(conn, sql, params=None):
    """Runs sql on a cursor of its own; the whole result as a pyarrow Table."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetch_arrow_table()


def scalar(conn, sql, params=None):
    table = query(conn, sql, params)
    expect(table.num_rows == 1, "%r gave %d rows, not 1", sql, table.num_rows)
    return table.column(table.num_columns - 1)[0].as_py()


def count(conn, table):
    return scalar(conn, "SELECT count(*) FROM %s" % table)


def is_vector_type(t):
    # Compared by parts: the child field's name ("item", "element") is the server's choice.
    return t.id == VECTOR_TYPE.id and t.list_size == DIM and t.value_type == pa.float32()


def vectors_of(column):
    """A vector column as an (n, DIM) float32 array, after checking its type."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    expect(is_vector_type(column.type), "vectors arrive as %s, not %s", column.type, VECTOR_TYPE)
    return np.asarray(column.flatten()).reshape(-1, DIM)


def vector_table(ids, vectors):
    """What bulk ingest sends: id int64, cat int64, emb fixed_size_list<float32>[8]."""
    ids = np.asarray(ids, dtype=np.int64)
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
    return pa.table({"id": ids, "cat": ids % 10, "emb": pa.FixedSizeListArray.from_arrays(flat, DIM)})


def l2(vectors, q):
    return np.sqrt(((vectors.astype(np.float64) - np.asarray(q, dtype=np.float64)) ** 2).sum(axis=1))


# ---- t_items: statements, parameters, Arrow results --------------------------------------------

def items_model():
    rows = {**LITERAL_ROWS, **PARAM_ROWS, **MANY_ROWS}
    ids = np.array(sorted(rows))
    return ids, np.array([rows[i][1] for i in ids], dtype=np.float32)


def create_items(conn):
    query(conn, "CREATE TABLE %s (id BIGINT, cat BIGINT, emb VECTOR(%d))" % (ITEMS, DIM))
    expect(count(conn, ITEMS) == 0, "a new table has rows")


def insert_literals(conn):
    values = ", ".join("(%d, %d, [%s])" % (i, c, ",".join(map(str, v))) for i, (c, v) in LITERAL_ROWS.items())
    answer = query(conn, "INSERT INTO %s VALUES %s" % (ITEMS, values))
    expect(count(conn, ITEMS) == len(LITERAL_ROWS), "count(*) is not %d", len(LITERAL_ROWS))
    return "it answered %s" % answer.to_pylist()


def insert_parameters(conn):
    # One cursor, one text: the second execute reuses the prepared statement, binding anew.
    with conn.cursor() as cur:
        for i, (c, v) in PARAM_ROWS.items():
            cur.execute("INSERT INTO %s VALUES (?, ?, ?)" % ITEMS, (i, c, v))
            cur.fetchall()
    expected = len(LITERAL_ROWS) + len(PARAM_ROWS)
    expect(count(conn, ITEMS) == expected, "count(*) is not %d", expected)


def insert_executemany(conn):
    # One DoPut of a 3-row parameter batch: the statement runs once per row.
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO %s VALUES (?, ?, ?)" % ITEMS, [(i, c, v) for i, (c, v) in MANY_ROWS.items()])
        rowcount = cur.rowcount
    expected = len(items_model()[0])
    expect(count(conn, ITEMS) == expected, "count(*) is not %d", expected)
    return "rowcount %d" % rowcount


def read_items_as_arrow(conn):
    table = query(conn, "SELECT id, emb FROM %s ORDER BY id" % ITEMS)
    ids, vectors = items_model()
    expect(table.column("id").to_pylist() == ids.tolist(), "ids %s", table.column("id").to_pylist())
    got = vectors_of(table.column("emb"))
    expect(np.array_equal(got, vectors), "vectors differ:\n%s\nexpected\n%s", got, vectors)
    return "emb: %s" % table.schema.field("emb").type


def knn_items(conn):
    ids, vectors = items_model()
    d = l2(vectors, KNN_Q)
    order = np.argsort(d)
    expect(d[order[3]] - d[order[2]] > 1e-3, "the test data ties at rank 3")
    expected = ids[order[:3]].tolist()
    got = query(conn, "SELECT id FROM %s ORDER BY emb <-> ? LIMIT 3" % ITEMS, (KNN_Q,)).column("id").to_pylist()
    expect(got == expected, "top 3 %s, expected %s", got, expected)
    return "top 3 %s" % got


def prepared_schemas(conn):
    sql = "SELECT id, emb FROM %s WHERE id > ? AND cat >= ? ORDER BY emb <-> ? LIMIT 3" % ITEMS
    with conn.cursor() as cur:
        params = cur.adbc_prepare(sql)
        expect(params is not None and params.names == ["$1", "$2", "$3"], "parameter schema %s", params)
        expect(params.field(0).type == pa.int64(), "$1 (compared with id BIGINT) is %s", params.field(0).type)
        expect(pa.types.is_list(params.field(2).type) and params.field(2).type.value_type == pa.float32(),
               "$3 (a query vector) is %s", params.field(2).type)
        # Bound as a Python list (list<double>): it still binds.
        cur.execute(sql, (0, 0, KNN_Q))
        table = cur.fetch_arrow_table()
        expect(is_vector_type(table.schema.field("emb").type), "emb came back as %s", table.schema.field("emb").type)
        # A query vector of the wrong dimension is the execute's error, as in PostgreSQL,
        # not the fetch's.
        wrong = expect_error("a query vector of the wrong dimension", cur.execute,
                             "SELECT id FROM %s ORDER BY emb <-> ? LIMIT 3" % ITEMS, ([1.0, 2.0],))
        expect("dimensions" in str(wrong), "the message does not say dimensions: %s", describe(wrong))
    return "parameters %s; wrong dimension: %s" % (
        ", ".join("%s %s" % (f.name, f.type) for f in params), describe(wrong))


# ---- t_bulk: ingest, index, exact KNN, EXPLAIN -------------------------------------------------

def ingest(conn, table, mode):
    batches = table.to_batches(max_chunksize=INGEST_BATCH_ROWS)
    with conn.cursor() as cur:
        return cur.adbc_ingest(BULK, pa.RecordBatchReader.from_batches(table.schema, batches), mode=mode)


def bulk_ingest(conn):
    main = np.random.default_rng(20261203).random((ROWS, DIM), dtype=np.float32)
    extra = np.full((5, DIM), 0.5, dtype=np.float32) + np.arange(5, dtype=np.float32)[:, None]
    start = time.monotonic()
    created = ingest(conn, vector_table(np.arange(ROWS), main), "create")
    seconds = time.monotonic() - start
    appended = ingest(conn, vector_table(np.arange(ROWS, ROWS + 5), extra), "append")
    bulk_vectors["all"] = np.concatenate([main, extra])
    expect((created, appended) == (ROWS, 5), "ingest reported %s and %s rows, not %d and 5", created, appended, ROWS)
    expect(count(conn, BULK) == ROWS + 5, "count(*) is not %d", ROWS + 5)
    return "%d rows in %.1f s" % (ROWS, seconds)


def create_index(conn):
    start = time.monotonic()
    query(conn, "CREATE VECTOR INDEX %s_ix ON %s (emb) USING IVF_FLAT WITH (num_partitions = 16)" % (BULK, BULK))
    return "%.1f s" % (time.monotonic() - start)


def knn_bulk_exact(conn):
    q = np.random.default_rng(7).random(DIM, dtype=np.float32)
    query(conn, "SET fragvec.nprobes = 16")  # all 16 partitions: exact
    got = query(conn, "SELECT id FROM %s ORDER BY emb <-> ? LIMIT 10" % BULK, (q.tolist(),)).column("id").to_pylist()
    d = l2(bulk_vectors["all"], q)
    true = np.sort(np.partition(d, 10)[:10])
    expect(len(set(got)) == 10 and all(0 <= i < len(d) for i in got), "ids %s", got)
    # Distances, not ids: rows at one distance may come in either order.
    expect(np.allclose(d[got], true, atol=1e-4), "distances %s, true top 10 %s", d[got], true)
    return "top 3 %s" % got[:3]


def explain_knn(conn):
    plan = query(conn, "EXPLAIN SELECT id FROM %s ORDER BY emb <-> ? LIMIT 10" % BULK, ([0.5] * DIM,))
    text = "\n".join(str(v) for column in plan.columns for v in column.to_pylist())
    expect("KnnExec" in text, "no KnnExec in the plan:\n%s", text)


def ingest_replace_and_refusals(conn):
    new = np.random.default_rng(99).random((REPLACE_ROWS, DIM), dtype=np.float32)
    replaced = ingest(conn, vector_table(np.arange(REPLACE_ROWS), new), "replace")
    expect(count(conn, BULK) == REPLACE_ROWS, "after replace count(*) is not %d", REPLACE_ROWS)
    # Strings where the table has BIGINT ids: refused, and nothing of it committed.
    misfit = pa.table({"id": ["a", "b"], "cat": pa.array([1, 2], pa.int64()),
                       "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2 * DIM, np.float32)), DIM)})
    bad_append = expect_error("append of string ids", ingest, conn, misfit, "append")
    expect(count(conn, BULK) == REPLACE_ROWS, "a refused append changed count(*)")
    bad_create = expect_error("create over a table", ingest, conn, vector_table([0], np.zeros((1, DIM))), "create")
    expect(count(conn, BULK) == REPLACE_ROWS, "a refused create changed count(*)")
    return "replace reported %s; append: %s; create: %s" % (replaced, describe(bad_append), describe(bad_create))


# ---- sessions, metadata, errors, cancel --------------------------------------------------------

def show_setting(conn, name):
    """A setting's value, by SHOW or else information_schema.df_settings; and which worked."""
    try:
        return str(scalar(conn, "SHOW %s" % name)), "SHOW"
    except flight_sql.Error as e:
        note("SHOW %s failed (%s); trying df_settings" % (name, describe(e)))
    sql = "SELECT value FROM information_schema.df_settings WHERE name = '%s'" % name
    return str(scalar(conn, sql)), "df_settings"


def set_persists(conn):
    query(conn, "SET fragvec.nprobes = 3")
    value, how = show_setting(conn, "fragvec.nprobes")  # another statement, on another cursor
    expect(value == "3", "%s gives %r after SET fragvec.nprobes = 3", how, value)
    other = connect()
    try:
        other_value = show_setting(other, "fragvec.nprobes")[0]
    finally:
        other.close()
    expect(other_value != "3", "another connection sees the SET too")
    return "read with %s; another connection has %s" % (how, other_value)


def metadata(conn):
    found = {}
    for catalog in conn.adbc_get_objects(depth="all").read_all().to_pylist():
        for schema in catalog["catalog_db_schemas"] or []:
            for t in schema["db_schema_tables"] or []:
                columns = [c["column_name"] for c in t["table_columns"] or []]
                found[t["table_name"]] = (catalog["catalog_name"], schema["db_schema_name"], t["table_type"], columns)
    expect(ITEMS in found and BULK in found, "get_objects lists %s", sorted(found))
    expect(found[ITEMS][3] == ["id", "cat", "emb"], "get_objects gives columns %s", found[ITEMS][3])
    emb = conn.adbc_get_table_schema(ITEMS).field("emb").type
    expect(is_vector_type(emb), "get_table_schema: emb is %s", emb)
    types = conn.adbc_get_table_types()
    expect("TABLE" in types, "table types %s", types)
    return "%s is %s.%s, a %s; table types %s" % (ITEMS, found[ITEMS][0], found[ITEMS][1], found[ITEMS][2], types)


def errors(conn):
    missing = expect_error("a missing table", query, conn, "SELECT * FROM %s" % MISSING)
    expect(MISSING in str(missing), "the message does not name %s", MISSING)
    with conn.cursor() as cur:  # the same cursor goes on after a syntax error
        syntax = expect_error("a syntax error", cur.execute, "SELEC 1 FROM")
        cur.execute("SELECT 1")
        expect(cur.fetchall() == [(1,)], "SELECT 1 after the error")
    return "missing table: %s; syntax: %s" % (describe(missing), describe(syntax))


def cancel():
    if not hasattr(flight_sql.Cursor, "adbc_cancel"):
        raise Skip("this adbc_driver_manager has no Cursor.adbc_cancel")
    conn = connect()  # its own: if the cancel fails, the query may go on running on it
    cur = conn.cursor()
    # Long (billions of rows), but made of short steps: a cancel takes effect when the running
    # operator next yields, so a join that spends a minute on one batch (a nested loop over
    # 20,000 x 8,192 vector pairs in a debug build) would only stop at its next batch.
    sql = "SELECT count(*) FROM generate_series(1, 5000000000) AS g(v) WHERE v % 7 = 3"
    cur.adbc_prepare(sql)  # prepared now, so the cancel can only land on the running query
    outcome = {}

    def run():
        start = time.monotonic()
        try:
            cur.execute(sql)
            outcome["rows"] = cur.fetchall()
        except Exception as e:
            outcome["error"] = e
        outcome["seconds"] = time.monotonic() - start

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    time.sleep(CANCEL_AFTER)
    cancelled_at = time.monotonic()
    cur.adbc_cancel()
    worker.join(CANCEL_DEADLINE)
    expect(not worker.is_alive(), "the query still runs %.0f s after adbc_cancel", CANCEL_DEADLINE)
    expect("rows" not in outcome, "the query ended (%s after %.1f s) before the cancel: too fast to test",
           outcome.get("rows"), outcome.get("seconds", 0))
    took = time.monotonic() - cancelled_at
    expect(scalar(conn, "SELECT 1") == 1, "SELECT 1 after the cancel")
    conn.close()
    return "it failed %.2f s after adbc_cancel: %s; %s" % (took, describe(outcome["error"]), server_idle())


def server_idle():
    """With FRAGVEC_SERVER_PID, the server's CPU must go idle: the client gives up at once, so only
    the server's CPU tells whether it stopped the query too."""
    if not SERVER_PID:
        return "server CPU not watched (FRAGVEC_SERVER_PID unset)"

    def cpu_seconds():
        with open("/proc/%s/stat" % SERVER_PID) as f:
            fields = f.read().rsplit(")", 1)[1].split()  # utime and stime: fields 14 and 15
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    for _ in range(20):
        before = cpu_seconds()
        time.sleep(0.5)
        used = cpu_seconds() - before
        if used < 0.1:
            return "then the server idled (%.2f CPU s in 0.5 s)" % used
    raise AssertionError("10 s after the cancel the server still uses %.2f CPU s every 0.5 s" % used)


def auth():
    if not AUTH_URI:
        raise Skip("FRAGVEC_FLIGHT_AUTH_URI unset")
    expect(USER is not None and PASSWORD is not None, "FRAGVEC_FLIGHT_AUTH_URI needs _USER and _PASSWORD")
    if len("%s:%s" % (USER, PASSWORD)) % 3 == 0:
        note("len(user:password) is a multiple of 3, so the driver's unpadded Basic base64 goes untested")
    conn = connect(AUTH_URI, username=USER, password=PASSWORD)
    try:
        expect(scalar(conn, "SELECT 1") == 1, "SELECT 1 with the right password")
    finally:
        conn.close()
    wrong = expect_error("a wrong password", lambda: connect(AUTH_URI, username=USER, password=PASSWORD + "x").close())
    expect(wrong.status_code == AdbcStatusCode.UNAUTHENTICATED, "a wrong password gave %s", describe(wrong))
    anonymous = connect(AUTH_URI)  # no Handshake: only its first statement can be refused
    try:
        refused = expect_error("a statement without credentials", scalar, anonymous, "SELECT 1")
    finally:
        anonymous.close()
    expect(refused.status_code == AdbcStatusCode.UNAUTHENTICATED, "no credentials gave %s", describe(refused))
    return "wrong password: %s" % describe(wrong)


def drop_tables(conn):
    if os.environ.get("FV_KEEP"):
        raise Skip("FV_KEEP is set: %s and %s kept" % (ITEMS, BULK))
    for table in (ITEMS, BULK):
        query(conn, "DROP TABLE %s" % table)
        expect_error("count(*) of the dropped %s" % table, count, conn, table)


def main():
    if not URI:
        sys.exit("FRAGVEC_FLIGHT_URI is not set (grpc://127.0.0.1:PORT of `fragvec serve --flight`)")
    faulthandler.dump_traceback_later(int(os.environ.get("FV_TIMEOUT", "1800")), exit=True)
    print("adbc_flight: %s, tables %s_*, %d bulk rows, adbc_driver_flightsql %s, pyarrow %s"
          % (URI, PREFIX, ROWS, flight_sql.adbc_driver_flightsql.__version__, pa.__version__), flush=True)
    try:
        conn = connect()
        report("ok", "connect", "SELECT 1 gave %s" % scalar(conn, "SELECT 1"))
    except Exception as e:
        report("FAIL", "connect", describe(e))
        return 1
    check("CREATE TABLE with a VECTOR(8) column", create_items, conn)
    check("INSERT ... VALUES with vector literals", insert_literals, conn)
    check("INSERT with ? parameters, a list of floats as the vector", insert_parameters, conn)
    check("executemany INSERT", insert_executemany, conn)
    check("fetch_arrow_table: emb is fixed_size_list<float>[8], exact values", read_items_as_arrow, conn)
    check("KNN with the query vector a parameter", knn_items, conn)
    check("a prepared statement's parameter schema; a wrong-dimension vector fails at execute", prepared_schemas, conn)
    check("adbc_ingest create + append, count(*)", bulk_ingest, conn)
    check("CREATE VECTOR INDEX ... USING IVF_FLAT", create_index, conn)
    check("KNN through the index, every partition probed, equals brute force", knn_bulk_exact, conn)
    check("EXPLAIN with a bound vector shows KnnExec", explain_knn, conn)
    check("adbc_ingest replace; a misfit append and a create over it refused whole", ingest_replace_and_refusals, conn)
    check("SET lasts for the connection, and only for it", set_persists, conn)
    check("adbc_get_objects, adbc_get_table_schema, adbc_get_table_types", metadata, conn)
    check("errors: a missing table, a syntax error, then the cursor goes on", errors, conn)
    check("adbc_cancel stops a running query", cancel)
    check("username/password authentication", auth)
    check("DROP TABLE", drop_tables, conn)
    conn.close()
    print("adbc_flight: %d passed, %d failed, %d skipped" % (results["ok"], results["FAIL"], results["SKIP"]))
    return 1 if results["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())

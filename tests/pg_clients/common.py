"""What every client script here shares: the target, the table prefix, and small checks.

The connection comes from libpq's environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE),
which psycopg, asyncpg and psql all read themselves. FV_TARGET says which server this is:
`fragvec` (default) or `postgres` (PostgreSQL 16 with pgvector, the reference). FV_PREFIX names
this run's tables, so several scripts can share one server at once.
"""

import os
import sys
import time

TARGET = os.environ.get("FV_TARGET", "fragvec")
if TARGET not in ("fragvec", "postgres"):
    sys.exit("FV_TARGET must be fragvec or postgres, not %r" % TARGET)
FRAGVEC = TARGET == "fragvec"
POSTGRES = TARGET == "postgres"

# A table name unique to this process, unless FV_PREFIX is given.
PREFIX = os.environ.get("FV_PREFIX") or "t_%d_%d" % (os.getpid(), int(time.time()) % 100000)


def table(name):
    return "%s_%s" % (PREFIX, name)


def conninfo():
    """host:port/db as the scripts will reach it, for messages."""
    return "%s:%s/%s as %s" % (
        os.environ.get("PGHOST", "(default host)"),
        os.environ.get("PGPORT", "5432"),
        os.environ.get("PGDATABASE", "(default db)"),
        os.environ.get("PGUSER", "(default user)"),
    )


_step = [""]
_tables = []


def drop_at_exit(*names):
    """Tables run_main drops when the script ends, whether it passed or not (FV_KEEP=1 keeps
    them for a look after a failure)."""
    _tables.extend(names)


def _drop_tables():
    if not _tables or os.environ.get("FV_KEEP"):
        return
    try:
        import psycopg

        with psycopg.connect(autocommit=True, connect_timeout=10) as conn:
            for name in _tables:
                try:
                    conn.execute("DROP TABLE IF EXISTS %s" % name)
                except psycopg.Error as e:
                    print("  (could not drop %s: %s)" % (name, e), file=sys.stderr)
    except Exception as e:  # the server may be what failed
        print("  (could not drop %s: %s)" % (", ".join(_tables), e), file=sys.stderr)


def step(text):
    """Names the check under way; a failure reports it."""
    _step[0] = text
    if os.environ.get("FV_VERBOSE"):
        print("  ..", text, file=sys.stderr)


def current_step():
    return _step[0]


def note(text, *args):
    """A line of information on stderr (what a server answered, say)."""
    print("  " + ((text % args) if args else text), file=sys.stderr)


def check(cond, message, *args):
    if not cond:
        raise AssertionError((message % args) if args else message)


def check_eq(got, want, what):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


def run_main(name, fn):
    """Runs fn(); prints one line and exits 0, or prints the failing step and exits 1."""
    t0 = time.monotonic()
    try:
        fn()
    except SystemExit:
        _drop_tables()
        raise
    except BaseException as e:  # report every failure the same way
        import traceback

        traceback.print_exc()
        print(
            "%s: FAILED against %s (%s) at step %r: %s: %s"
            % (name, TARGET, conninfo(), current_step(), type(e).__name__, e),
            file=sys.stderr,
        )
        _drop_tables()
        sys.exit(1)
    print("%s: ok against %s (%.1f s)" % (name, TARGET, time.monotonic() - t0), file=sys.stderr)


def l2(a, b):
    return sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5


def neg_ip(a, b):
    return -sum(x * y for x, y in zip(a, b))


def cosine(a, b):
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return 1.0 - sum(x * y for x, y in zip(a, b)) / (na * nb)


def top_k(rows, q, k, dist=l2):
    """Ids of the k rows nearest q: rows is {id: vector}; ties broken by id."""
    return [i for _, i in sorted((dist(v, q), i) for i, v in rows.items())[:k]]


def load_random_vectors(conn, name, dim, rows, seed):
    """CREATE TABLE name (id BIGINT, emb VECTOR(dim)) holding `rows` random float32 vectors
    (ids 0..rows), loaded by a binary COPY in many CopyData messages; returns the vectors."""
    import numpy as np

    conn.execute("CREATE TABLE %s (id BIGINT, emb VECTOR(%d))" % (name, dim))
    data = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    cur = conn.cursor()
    with cur.copy("COPY %s (id, emb) FROM STDIN WITH (FORMAT BINARY)" % name) as copy:
        copy.set_types(["int8", "vector"])
        for i, v in enumerate(data):
            copy.write_row((i, v))
    check_eq(cur.rowcount, rows, "rowcount after a COPY of %d rows" % rows)
    return data

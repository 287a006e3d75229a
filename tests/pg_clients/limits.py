#!/usr/bin/env python3
"""Limits a server puts on one session, driven by psycopg 3: the protocol's cancel request
(psycopg's `Connection.cancel_safe`, a CancelRequest on a second socket with the session's pid
and secret key) stops the running statement with 57014 and the session stays usable;
`statement_timeout` does the same by itself; and a client may not name the server's files
(`CREATE EXTERNAL TABLE ... LOCATION`, `COPY ... TO`) unless the operator opened a directory.

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_TARGET=fragvec|postgres.
"""

import threading
import time

import psycopg
from psycopg import errors

from common import FRAGVEC, check, check_eq, note, run_main, step

# A statement that runs for a long time and can only be stopped, not answered early: the sum
# cannot come from statistics.
SLOW = (
    "SELECT sum(value % 7) FROM range(4000000000)"
    if FRAGVEC
    else "SELECT pg_sleep(60)"
)


def expect_canceled(conn, what, start_cancel=None):
    """Runs SLOW on conn; start_cancel (if given) is called from another thread after 0.5 s.
    Returns the seconds until the error."""
    t0 = time.monotonic()
    if start_cancel:
        timer = threading.Timer(0.5, start_cancel)
        timer.start()
    try:
        conn.execute(SLOW)
        raise AssertionError("%s: the statement finished instead of being canceled" % what)
    except errors.QueryCanceled as e:
        note("%s: %s (%.2f s)", what, str(e).strip().splitlines()[0], time.monotonic() - t0)
    finally:
        if start_cancel:
            timer.cancel()
    return time.monotonic() - t0


def main():
    with psycopg.connect(autocommit=True, connect_timeout=10) as conn:
        step("a cancel request stops the running statement with 57014")
        took = expect_canceled(conn, "cancel request", start_cancel=conn.cancel_safe)
        check(took < 20, "the cancel took %.1f s to stop the statement", took)
        check_eq(conn.execute("SELECT 1").fetchone(), (1,), "SELECT 1 after the cancel")

        step("a cancel request with nothing running changes nothing")
        conn.cancel_safe()
        time.sleep(0.2)
        check_eq(conn.execute("SELECT 2").fetchone(), (2,), "SELECT 2 after an idle cancel")

        step("statement_timeout stops a statement with 57014")
        conn.execute("SET statement_timeout = 300")
        took = expect_canceled(conn, "statement_timeout")
        check(took < 20, "statement_timeout 300 ms took %.1f s", took)
        conn.execute("SET statement_timeout = 0")
        check_eq(conn.execute("SELECT 3").fetchone(), (3,), "SELECT 3 after the timeout")

        step("a cancel inside a transaction block fails the block until ROLLBACK")
        conn.autocommit = False
        conn.execute("SELECT 1")
        expect_canceled(conn, "cancel in a block", start_cancel=conn.cancel_safe)
        try:
            conn.execute("SELECT 1")
            raise AssertionError("a statement after a canceled one in a block ran")
        except errors.InFailedSqlTransaction:
            pass
        conn.rollback()
        conn.autocommit = True
        check_eq(conn.execute("SELECT 4").fetchone(), (4,), "SELECT 4 after ROLLBACK")

        if FRAGVEC:
            step("server files are closed to clients without --allow-files")
            for sql in (
                "CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '/etc/passwd'",
                "CREATE EXTERNAL TABLE leak STORED AS PARQUET LOCATION 'file:///etc/'",
                "COPY (SELECT 1 AS x) TO '/tmp/fragvec-limits-out.csv' STORED AS CSV",
            ):
                try:
                    conn.execute(sql)
                    raise AssertionError("%s: ran" % sql)
                except errors.InsufficientPrivilege as e:
                    check("--allow-files" in str(e), "the refusal names --allow-files: %s", e)
            check_eq(conn.execute("SELECT 5").fetchone(), (5,), "SELECT 5 after the refusals")


if __name__ == "__main__":
    run_main("limits", main)

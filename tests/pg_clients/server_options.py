#!/usr/bin/env python3
"""What `fragvec serve`'s own options do, seen from real clients (psycopg 3 and asyncpg).
The server is started by tests/serve_options.rs with the options each part needs:

  auth              FRAGVEC_USER=ann FRAGVEC_PASSWORD=... (SCRAM-SHA-256): the right password
                    connects; a wrong password, a wrong user and no password are refused with
                    28P01 (asyncpg's InvalidPasswordError), and the server serves on.
  max_connections   --max-connections 2: a third connection is refused with 53300
                    (TooManyConnectionsError), after the SSL exchange as PostgreSQL does;
                    a cancel request is still served; once one closes, a new one is served.
  statement_timeout --statement-timeout 300: a session's statements stop at 300 ms with 57014
                    without any SET; `SHOW statement_timeout` says so; SET 0 lifts it.
  drain             FV_SERVER_PID: SIGTERM while a statement runs: the statement finishes and
                    its answer arrives, new connections are refused, and the server exits
                    (the Rust test checks it exits 0).

Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FV_PART (one of the above).
"""

import asyncio
import os
import signal
import sys
import threading
import time

import asyncpg
import psycopg
from psycopg import errors

from common import check, check_eq, note, run_main, step

SLOW = "SELECT sum(value % 7) FROM range(4000000000)"


def connect_kwargs(**over):
    kw = dict(
        host=os.environ["PGHOST"],
        port=int(os.environ["PGPORT"]),
        user=os.environ.get("PGUSER", "fragvec"),
        password=os.environ.get("PGPASSWORD"),
        database=os.environ.get("PGDATABASE", "fragvec"),
        timeout=10,
    )
    kw.update(over)
    return kw


async def refused_with(sqlstate, what, **over):
    """Connects with asyncpg and expects the server to refuse with `sqlstate`."""
    try:
        conn = await asyncpg.connect(**connect_kwargs(**over))
    except asyncpg.PostgresError as e:
        check_eq(e.sqlstate, sqlstate, "%s: SQLSTATE of %s" % (what, e))
        note("%s: %s %s", what, e.sqlstate, e)
        return
    await conn.close()
    raise AssertionError("%s: the server let the connection in" % what)


async def auth():
    step("the right password connects (SCRAM-SHA-256)")
    conn = await asyncpg.connect(**connect_kwargs())
    check_eq(await conn.fetchval("SELECT 1"), 1, "SELECT 1")

    step("a wrong password, a wrong user, no password: 28P01")
    await refused_with("28P01", "wrong password", password="not-" + os.environ["PGPASSWORD"])
    await refused_with("28P01", "wrong user", user="mallory")
    # asyncpg falls back to PGPASSWORD: without it for this attempt.
    password = os.environ.pop("PGPASSWORD")
    try:
        await asyncpg.connect(**connect_kwargs(password=None))
        raise AssertionError("no password: the server let the connection in")
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        # asyncpg refuses by itself when the server asks for a password it does not have.
        note("no password: %s", e)
    finally:
        os.environ["PGPASSWORD"] = password

    step("psycopg sees the same refusal")
    try:
        psycopg.connect(password="wrong", connect_timeout=10).close()
        raise AssertionError("psycopg: a wrong password connected")
    except psycopg.OperationalError as e:
        check("password authentication failed" in str(e), "psycopg's message: %s", e)

    step("the first session serves on after the refusals")
    check_eq(await conn.fetchval("SELECT 2"), 2, "SELECT 2 on the first connection")
    await conn.close()


async def max_connections():
    step("two connections are served")
    first = await asyncpg.connect(**connect_kwargs())
    second = await asyncpg.connect(**connect_kwargs())
    check_eq(await first.fetchval("SELECT 1"), 1, "SELECT 1 on the first")
    check_eq(await second.fetchval("SELECT 2"), 2, "SELECT 2 on the second")

    step("a third is refused with 53300")
    await refused_with("53300", "third connection")
    check_eq(await first.fetchval("SELECT 3"), 3, "the first serves on")

    step("a cancel request still reaches a full server")
    # asyncpg cancels a cancelled task's statement with a CancelRequest on a connection of
    # its own: the server must serve it although both slots are taken.
    running = asyncio.create_task(first.fetchval(SLOW))
    await asyncio.sleep(0.5)
    running.cancel()
    try:
        await running
    except asyncio.CancelledError:
        pass
    check_eq(
        await asyncio.wait_for(first.fetchval("SELECT 5"), 10),
        5,
        "the cancelled connection serves on",
    )

    step("once one closes, a new connection is served")
    await second.close()
    # The server frees the slot when it sees the socket close: a moment later, not at once.
    deadline = time.monotonic() + 10
    while True:
        try:
            third = await asyncpg.connect(**connect_kwargs())
            break
        except asyncpg.TooManyConnectionsError:
            check(time.monotonic() < deadline, "the closed connection's slot was not freed")
            await asyncio.sleep(0.1)
    check_eq(await third.fetchval("SELECT 4"), 4, "SELECT 4 on the new connection")
    await third.close()
    await first.close()


def statement_timeout():
    with psycopg.connect(autocommit=True, connect_timeout=10) as conn:
        step("SHOW statement_timeout gives the server's default")
        shown = conn.execute("SHOW statement_timeout").fetchone()[0]
        check(shown in ("300", "300ms"), "SHOW statement_timeout: %r", shown)

        step("a statement stops at the default with 57014, without any SET")
        t0 = time.monotonic()
        try:
            conn.execute(SLOW)
            raise AssertionError("the slow statement finished")
        except errors.QueryCanceled as e:
            took = time.monotonic() - t0
            note("default statement_timeout: %s (%.2f s)", str(e).splitlines()[0], took)
        check(took < 20, "the default timeout took %.1f s", took)
        check_eq(conn.execute("SELECT 1").fetchone(), (1,), "the session serves on")

        step("SET statement_timeout = 0 lifts it for this session only")
        conn.execute("SET statement_timeout = 0")
        check_eq(
            conn.execute("SELECT sum(value) FROM range(1000)").fetchone(),
            (499500,),
            "a short statement with no timeout",
        )
    with psycopg.connect(autocommit=True, connect_timeout=10) as other:
        shown = other.execute("SHOW statement_timeout").fetchone()[0]
        check(shown in ("300", "300ms"), "a new session has the default again: %r", shown)

    step("asyncpg's fetchval (an Execute with a row limit) stops at the default too")
    asyncio.run(timeout_with_row_limit())


async def timeout_with_row_limit():
    conn = await asyncpg.connect(**connect_kwargs())
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(conn.fetchval(SLOW), 30)
        raise AssertionError("the slow statement finished")
    except asyncpg.QueryCanceledError as e:
        took = time.monotonic() - t0
        note("fetchval under the default timeout: %s (%.2f s)", e, took)
    check(took < 20, "the default timeout took %.1f s", took)
    check_eq(await conn.fetchval("SELECT 6"), 6, "the connection serves on")
    await conn.close()


def drain():
    pid = int(os.environ["FV_SERVER_PID"])
    with psycopg.connect(autocommit=True, connect_timeout=10) as conn:
        step("calibrate a statement that runs for a few seconds")
        n = 20_000_000
        t0 = time.monotonic()
        conn.execute("SELECT sum(value %% 7) FROM range(%d)" % n).fetchone()
        took = max(time.monotonic() - t0, 0.01)
        n = min(int(n * 3.0 / took), 4_000_000_000)
        sql = "SELECT sum(value %% 7) FROM range(%d)" % n
        # sum over 0..n of value % 7, in closed form: the answer the server must give.
        full, rest = divmod(n, 7)
        want = full * 21 + rest * (rest - 1) // 2
        note("%d rows take about 3 s (%d took %.2f s)", n, 20_000_000, took)

        step("SIGTERM while it runs: the statement finishes and its answer arrives")
        answer = {}

        def run():
            try:
                answer["row"] = conn.execute(sql).fetchone()
            except BaseException as e:  # reported below
                answer["error"] = e
            answer["at"] = time.monotonic()

        worker = threading.Thread(target=run)
        started = time.monotonic()
        worker.start()
        time.sleep(0.8)
        check(worker.is_alive(), "the statement ended before SIGTERM (too short to test)")
        os.kill(pid, signal.SIGTERM)
        signalled = time.monotonic()

        step("while it drains, new connections are refused")
        time.sleep(0.3)
        try:
            psycopg.connect(connect_timeout=5).close()
            raise AssertionError("a new connection was served after SIGTERM")
        except psycopg.OperationalError as e:
            note("new connection after SIGTERM: %s", str(e).strip().splitlines()[-1])

        worker.join(60)
        check(not worker.is_alive(), "the statement did not finish within 60 s")
        check("error" not in answer, "the running statement failed: %r", answer.get("error"))
        check_eq(answer["row"], (want,), "the running statement's answer")
        note(
            "the statement ran %.2f s, %.2f s of them after SIGTERM",
            answer["at"] - started,
            answer["at"] - signalled,
        )


PARTS = {
    "auth": lambda: asyncio.run(auth()),
    "max_connections": lambda: asyncio.run(max_connections()),
    "statement_timeout": statement_timeout,
    "drain": drain,
}

if __name__ == "__main__":
    part = os.environ.get("FV_PART") or (sys.argv[1] if len(sys.argv) > 1 else "")
    if part not in PARTS:
        sys.exit("FV_PART must be one of %s, not %r" % (", ".join(PARTS), part))
    run_main("server_options " + part, PARTS[part])

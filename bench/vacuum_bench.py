#!/usr/bin/env python3
"""VACUUM on a table with thousands of versions, as a live table has them: the time of one
`VACUUM t RETAIN n VERSIONS` per binary, on identical copies of one table, in one run.

    python bench/vacuum_bench.py --bin new=target/release/fragvec --bin old=/path/to/fragvec

The table (built once with the first binary): `--fragments` inserts of `--rows-per-fragment`
rows each (one fragment each), then deletes of one row at a time until the table has
`--versions` versions, spread over the fragments, so every delete replaces a fragment's
deletion file (the old one becomes garbage once its versions go). Two measurements per
binary, each in a fresh process on a fresh copy, `--repeat` times, medians printed:

- keep: `fragvec.vacuum_grace_seconds = 3600`, so every version was committed within the
  grace period and stays: VACUUM reads what it must and removes nothing;
- remove: grace 0, `RETAIN --retain VERSIONS`: the older versions' manifests and the
  deletion files only they needed are removed.

A process that runs `SELECT 1` on the same copy is timed too and subtracted (start-up, the
catalog). Needs only Python; scratch copies go under `--work` and are deleted.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def run(binary, db, statements):
    args = [binary, "--db", db]
    for s in statements:
        args += ["-c", s]
    started = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{binary} {statements}: exit {out.returncode}\n{out.stderr}")
    return elapsed, out.stdout


def build(binary, db, a):
    script = ["CREATE TABLE t (id BIGINT NOT NULL, emb VECTOR(8));"]
    rows = a.fragments * a.rows_per_fragment
    for f in range(a.fragments):
        values = ", ".join(
            f"({i}, [{', '.join(str((i + d) % 7) for d in range(8))}])"
            for i in range(f * a.rows_per_fragment, (f + 1) * a.rows_per_fragment)
        )
        script.append(f"INSERT INTO t VALUES {values};")
    deletes = a.versions - 1 - a.fragments
    if deletes > rows:
        raise SystemExit("more versions than rows to delete: raise --rows-per-fragment")
    # Row j of fragment f for the j-th pass over the fragments: each delete hits the next
    # fragment, so deletion files are replaced round-robin.
    for n in range(deletes):
        f, j = n % a.fragments, n // a.fragments
        script.append(f"DELETE FROM t WHERE id = {f * a.rows_per_fragment + j};")
    path = os.path.join(a.work, "build.sql")
    with open(path, "w") as out:
        out.write("\n".join(script) + "\n")
    started = time.perf_counter()
    done = subprocess.run([binary, "--db", db, "-f", path], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"building the table failed:\n{done.stderr[-2000:]}")
    print(f"built {a.versions} versions, {a.fragments} fragments in {time.perf_counter() - started:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH of a fragvec binary")
    ap.add_argument("--fragments", type=int, default=300)
    ap.add_argument("--rows-per-fragment", type=int, default=10)
    ap.add_argument("--versions", type=int, default=2500)
    ap.add_argument("--retain", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    owned = a.work is None
    a.work = a.work or tempfile.mkdtemp(prefix="fragvec-vacuum-bench-")
    os.makedirs(a.work, exist_ok=True)
    try:
        source = os.path.join(a.work, "source")
        build(bins[0][1], source, a)
        print(f"| binary | keep: s (VACUUM alone) | remove: s (VACUUM alone) | removed |")
        print("|---|---|---|---|")
        for name, binary in bins:
            keep, remove, removed = [], [], ""
            for _ in range(a.repeat):
                copy = os.path.join(a.work, "copy")
                shutil.copytree(source, copy)
                base, _ = run(binary, copy, ["SELECT 1"])
                t, _ = run(binary, copy, ["SET fragvec.vacuum_grace_seconds = 3600",
                                          f"VACUUM t RETAIN {a.retain} VERSIONS"])
                keep.append(t - base)
                t, out = run(binary, copy, ["SET fragvec.vacuum_grace_seconds = 0",
                                            f"VACUUM t RETAIN {a.retain} VERSIONS"])
                remove.append(t - base)
                removed = " ".join(out.split())[-120:]
                shutil.rmtree(copy)
            print(f"| {name} | {statistics.median(keep):.3f} | {statistics.median(remove):.3f} | {removed} |")
    finally:
        if owned:
            shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()

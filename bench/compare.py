#!/usr/bin/env python3
"""Runs the KNN benchmark on one data directory with every system, one after the other in
one run, and prints one Markdown table with ratios.

    python bench/compare.py --data DIR                       # numpy, faiss, lance, fragvec
    python bench/compare.py --data DIR --systems fragvec,lance

Systems (each runs in its own process, so each peak RSS is its own):
  numpy    exact brute force by matrix product (|x|² − 2 x·q with precomputed norms) over
           vectors.npy in memory; filtered = the same over the category's rows, selected
           beforehand (filter precomputed)
  faiss    IndexIVFFlat (√N partitions, faiss's own training sample), one query per call;
           filtered = IDSelectorBitmap of the category, precomputed
  lance    pylance IVF_FLAT on a Lance copy of items.parquet (DIR/lance-items, written once);
           filtered = `category = c` with prefilter=True
  fragvec  `cargo run --release --example knn_bench -- --data DIR --json` (see that file):
           loads items.parquet through SQL, builds IVF_FLAT, queries through SQL

Every system gets the same queries one at a time, a warm-up pass before each timed pass,
nprobes set exactly (min = max), and recall@10 against the float64 ground truth written by
gen_data.py. A package that cannot be imported is reported and its system skipped.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

K = 10
HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- shared helpers

def emit(**record):
    print(json.dumps(record), flush=True)


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_workload(data):
    import numpy as np
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    w = {
        "meta": meta,
        "queries": np.load(os.path.join(data, "queries.npy")),
        "qcat": np.load(os.path.join(data, "query_category.npy")),
        "gt": np.load(os.path.join(data, "gt.npy"))[:, :K],
        "gt_f": np.load(os.path.join(data, "gt_filtered.npy"))[:, :K],
    }
    return w


def timed_queries(system, mode, nprobes, w, search, filtered):
    """Runs `search(i) -> ids` for every query: a warm-up pass, then a timed one."""
    import numpy as np
    nq = len(w["queries"])
    for i in range(nq):
        search(i)
    lat, recall, short = [], 0.0, 0
    for i in range(nq):
        t = time.perf_counter()
        found = search(i)
        lat.append(time.perf_counter() - t)
        truth = w["gt_f"][i] if filtered else w["gt"][i]
        truth = set(int(x) for x in truth if x >= 0)
        found = [int(x) for x in found if x >= 0]
        if len(found) < len(truth):
            short += 1
        recall += len(truth.intersection(found)) / len(truth) if truth else 1.0
    lat = np.sort(np.array(lat))
    pick = lambda p: float(lat[int(round((len(lat) - 1) * p))]) * 1e3
    emit(system=system, mode=mode, nprobes=nprobes, recall=recall / nq,
         p50_ms=pick(0.5), p95_ms=pick(0.95), short=short)


MEMCAP = os.path.join(HERE, "..", "..", "shared", "tools", "memcap")


def partitions(meta, override):
    return override or max(1, round(meta["rows"] ** 0.5))


# ---------------------------------------------------------------- the systems

def run_numpy(a):
    import numpy as np
    w = load_workload(a.data)
    t = time.perf_counter()
    x = np.load(os.path.join(a.data, "vectors.npy"))
    emit(system="numpy", metric="load (vectors.npy)", value=time.perf_counter() - t, unit="s")
    cat = np.load(os.path.join(a.data, "category.npy"))
    norms = np.einsum("ij,ij->i", x, x)

    def top(d, ids=None):
        i = np.argpartition(d, K - 1)[:K] if len(d) > K else np.arange(len(d))
        i = i[np.argsort(d[i])]
        return i if ids is None else ids[i]

    q = w["queries"]
    timed_queries("numpy", "exact", None, w, lambda i: top(norms - 2.0 * (x @ q[i])), False)
    groups = {}
    for c in np.unique(w["qcat"]):
        ids = np.flatnonzero(cat == c)
        groups[int(c)] = (ids, np.ascontiguousarray(x[ids]), norms[ids])

    def filtered(i):
        ids, xs, ns = groups[int(w["qcat"][i])]
        return top(ns - 2.0 * (xs @ q[i]), ids)

    timed_queries("numpy", "filtered exact", None, w, filtered, True)
    emit(system="numpy", metric="peak RSS", value=peak_rss() / 1e6, unit="MB")


def run_faiss(a):
    import faiss
    import numpy as np
    w = load_workload(a.data)
    x = np.load(os.path.join(a.data, "vectors.npy"))
    cat = np.load(os.path.join(a.data, "category.npy"))
    n, d = x.shape
    t = time.perf_counter()
    quantizer = faiss.IndexFlatL2(d)
    index = faiss.IndexIVFFlat(quantizer, d, partitions(w["meta"], a.partitions))
    index.train(x)
    index.add(x)
    emit(system="faiss", metric="index build (IVF_FLAT)", value=time.perf_counter() - t,
         unit="s")
    emit(system="faiss", metric="version", value=faiss.__version__, unit="")
    q = w["queries"]
    for nprobes in a.nprobes:
        index.nprobe = nprobes
        timed_queries("faiss", "ivf", nprobes, w,
                      lambda i: index.search(q[i:i + 1], K)[1][0], False)
    bitmaps = {int(c): np.packbits(cat == c, bitorder="little") for c in np.unique(w["qcat"])}
    selectors = {c: faiss.IDSelectorBitmap(n, faiss.swig_ptr(b)) for c, b in bitmaps.items()}
    for nprobes in a.filtered_nprobes:
        params = {c: faiss.SearchParametersIVF(sel=s, nprobe=nprobes)
                  for c, s in selectors.items()}
        timed_queries(
            "faiss", "filtered", nprobes, w,
            lambda i: index.search(q[i:i + 1], K, params=params[int(w["qcat"][i])])[1][0],
            True)
    emit(system="faiss", metric="peak RSS", value=peak_rss() / 1e6, unit="MB")


def run_lance(a):
    import lance
    import pyarrow.parquet as pq
    w = load_workload(a.data)
    path = os.path.join(a.data, "lance-items")
    if not os.path.exists(path):
        t = time.perf_counter()
        lance.write_dataset(pq.ParquetFile(os.path.join(a.data, "items.parquet")).iter_batches(
            batch_size=65536), path, schema=pq.read_schema(os.path.join(a.data, "items.parquet")))
        emit(system="lance", metric="load (write dataset, once)",
             value=time.perf_counter() - t, unit="s")
    ds = lance.dataset(path)
    kind = a.lance_index
    extra = {}
    if kind == "IVF_PQ":
        extra["num_sub_vectors"] = a.lance_sub_vectors or max(1, w["meta"]["dim"] // 8)
    built = [i for i in ds.list_indices() if i.get("fields") == ["emb"]]
    if a.lance_reuse and built and built[0].get("type") == kind:
        emit(system="lance", metric="index reused (built by an earlier run)", value=1, unit="")
    else:
        t = time.perf_counter()
        ds.create_index("emb", index_type=kind, metric="L2", replace=True,
                        num_partitions=partitions(w["meta"], a.partitions), **extra)
        emit(system="lance", metric=f"index build ({kind})", value=time.perf_counter() - t,
             unit="s")
    index_bytes = sum(os.path.getsize(os.path.join(d, f))
                      for d, _, files in os.walk(os.path.join(path, "_indices")) for f in files)
    emit(system="lance", metric="index size on disk", value=index_bytes / 1e6, unit="MB")
    emit(system="lance", metric="version", value=lance.__version__, unit="")
    ds = lance.dataset(path)
    q = w["queries"]

    def search(i, nprobes, filtered):
        kw = dict(filter=f"category = {int(w['qcat'][i])}", prefilter=True) if filtered else {}
        nearest = {"column": "emb", "q": q[i], "k": K, "nprobes": nprobes}
        if a.lance_refine:
            nearest["refine_factor"] = a.lance_refine
        if a.lance_ef:
            nearest["ef"] = a.lance_ef
        t = ds.to_table(columns=["id"], nearest=nearest,
                        disable_scoring_autoprojection=True, **kw)
        return t.column("id").to_numpy()

    for nprobes in a.nprobes:
        read = disk_read_bytes()
        timed_queries("lance", "ivf", nprobes, w, lambda i: search(i, nprobes, False), False)
        # Each query runs twice (a warm-up pass, then the timed one).
        emit(system="lance", metric=f"disk read per query nprobes={nprobes}",
             value=(disk_read_bytes() - read) / (2 * len(q)) / 1e6, unit="MB")
    for nprobes in a.filtered_nprobes:
        timed_queries("lance", "filtered", nprobes, w, lambda i: search(i, nprobes, True), True)
    for streams in a.lance_qps_streams:
        emit(system="lance", metric=f"qps streams={streams} nprobes={a.lance_qps_nprobes}",
             value=queries_per_second(streams, a.lance_qps_seconds, len(q),
                                      lambda i: search(i, a.lance_qps_nprobes, False)),
             unit="queries/s")
    emit(system="lance", metric="peak RSS", value=peak_rss() / 1e6, unit="MB")


def disk_read_bytes():
    """Bytes this process has read from storage (not from the page cache) so far."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def queries_per_second(streams, seconds, nq, search):
    """Queries answered per second by `streams` threads each searching in a loop (pylance
    releases the GIL while it searches), after a one-second warm-up."""
    import threading
    stop, counts = threading.Event(), [0] * streams
    measuring = threading.Event()

    def loop(s):
        i = s
        while not stop.is_set():
            search(i % nq)
            if measuring.is_set():
                counts[s] += 1
            i += streams

    threads = [threading.Thread(target=loop, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    measuring.set()
    t0 = time.perf_counter()
    time.sleep(seconds)
    done = sum(counts)
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return done / elapsed


RUNNERS = {"numpy": run_numpy, "faiss": run_faiss, "lance": run_lance}


# ---------------------------------------------------------------- driver and table

def collect(a, system):
    """Runs one system in its own process; returns its JSON records (or an error)."""
    common = ["--data", a.data, "--nprobes", ",".join(map(str, a.nprobes)),
              "--filtered-nprobes", ",".join(map(str, a.filtered_nprobes))]
    if a.partitions:
        common += ["--partitions", str(a.partitions)]
    if system == "fragvec":
        cmd = a.fragvec_cmd.split() + common + ["--json"] + a.fragvec_args.split()
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--run", system] + common
        cmd += ["--lance-index", a.lance_index]
        if a.lance_sub_vectors:
            cmd += ["--lance-sub-vectors", str(a.lance_sub_vectors)]
        if a.lance_refine:
            cmd += ["--lance-refine", str(a.lance_refine)]
        if a.lance_ef:
            cmd += ["--lance-ef", str(a.lance_ef)]
        if a.lance_reuse:
            cmd += ["--lance-reuse"]
        if a.lance_qps_streams:
            cmd += ["--lance-qps-streams", ",".join(map(str, a.lance_qps_streams)),
                    "--lance-qps-nprobes", str(a.lance_qps_nprobes),
                    "--lance-qps-seconds", str(a.lance_qps_seconds)]
    env = dict(os.environ)
    if a.memcap:
        # The whole process (build and queries) under the cap, page cache included, starting
        # from a cold page cache.
        cmd = [MEMCAP, a.memcap] + cmd
        env["MEMCAP_DROP_CACHES"] = "1"
    print(f"== {system}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    records = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0:
        print(f"== {system} failed (exit {p.returncode})", file=sys.stderr)
        records.append({"system": system, "error": f"exit {p.returncode}"})
    return records


def fmt_ms(r):
    if r is None:
        return "–"
    s = f"{r['p50_ms']:.2f} ms (r {r['recall']:.3f})"
    if r.get("short"):
        s += f", {r['short']} short"
    return s


def table(a, records):
    systems = [s for s in a.systems if any(r.get("system") == s for r in records)]
    find = lambda s, **kv: next((r for r in records if r.get("system") == s and
                                 all(r.get(k) == v for k, v in kv.items())), None)
    lines = []
    head = ["measure"] + systems + ["fragvec ÷ lance", "fragvec ÷ faiss", "fragvec ÷ numpy"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))

    def ratio(f, other):
        return f"{f / other:.2f}×" if f is not None and other else "–"

    def row(label, cells, values):
        fv = values.get("fragvec")
        lines.append("| " + " | ".join([label] + [cells.get(s, "–") for s in systems] +
                                       [ratio(fv, values.get(o)) for o in
                                        ("lance", "faiss", "numpy")]) + " |")

    builds = {s: next((r for r in records if r.get("system") == s and
                       str(r.get("metric", "")).startswith("index build")), None)
              for s in systems}
    row("index build (s)", {s: f"{r['value']:.1f} s ({r['metric'][13:-1]})"
                            for s, r in builds.items() if r},
        {s: r["value"] for s, r in builds.items() if r})
    vals = {s: (find(s, metric="index size on disk") or {}).get("value") for s in systems}
    row("index size on disk", {s: f"{v:,.0f} MB" for s, v in vals.items() if v is not None},
        vals)
    for n in a.nprobes:
        rs = {s: find(s, mode="ivf", nprobes=n) for s in systems}
        row(f"p50 nprobes {n}", {s: fmt_ms(r) for s, r in rs.items() if r},
            {s: r["p50_ms"] for s, r in rs.items() if r})
    for n in a.nprobes:
        rs = {s: find(s, mode="ivf", nprobes=n) for s in systems}
        row(f"p95 / p50 nprobes {n}",
            {s: f"{r['p95_ms']:.2f} ms / {r['p95_ms'] / r['p50_ms']:.2f}"
             for s, r in rs.items() if r}, {})
    for n in a.filtered_nprobes:
        rs = {s: find(s, mode="filtered", nprobes=n) for s in systems}
        rs["numpy"] = find("numpy", mode="filtered exact")
        row(f"filtered p50 nprobes {n} (numpy: exact, filter precomputed)",
            {s: fmt_ms(r) for s, r in rs.items() if r},
            {s: r["p50_ms"] for s, r in rs.items() if r})
    rs = {"fragvec": find("fragvec", mode="exact"), "numpy": find("numpy", mode="exact")}
    row("exact p50", {s: fmt_ms(r) for s, r in rs.items() if r},
        {s: r["p50_ms"] for s, r in rs.items() if r})
    for mode, label in [("ivf via SessionContext::sql", "array literal [...]"),
                        ("ivf via SessionContext::sql, text", "text literal '[...]'")]:
        r = find("fragvec", mode=mode)
        if r:
            row(f"fragvec via SessionContext::sql, nprobes 16, {label}",
                {"fragvec": fmt_ms(r)}, {})
    for n in a.nprobes:
        metric = f"disk read per query nprobes={n}"
        vals = {s: (find(s, metric=metric) or {}).get("value") for s in systems}
        if any(v is not None for v in vals.values()):
            row(f"read from disk per query, nprobes {n}",
                {s: f"{v:.2f} MB" for s, v in vals.items() if v is not None}, vals)
    qps = sorted({r["metric"] for r in records if str(r.get("metric", "")).startswith("qps ")},
                 key=lambda m: int(m.split("streams=")[1].split()[0]))
    for metric in qps:
        vals = {s: (find(s, metric=metric) or {}).get("value") for s in systems}
        row(metric.replace("qps", "queries/s,"),
            {s: f"{v:,.0f}" for s, v in vals.items() if v is not None},
            {s: 1 / v for s, v in vals.items() if v})
    vals = {s: (find(s, metric="peak RSS") or {}).get("value") for s in systems}
    row("peak RSS", {s: f"{v:,.0f} MB" for s, v in vals.items() if v is not None}, {})
    for r in records:
        if "error" in r:
            lines.append(f"\n{r['system']}: {r['error']}")
    versions = ", ".join(f"{r['system']} {r['value']}" for r in records
                         if r.get("metric") == "version")
    return "\n".join(lines) + (f"\n\n({versions})" if versions else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--systems", default="numpy,faiss,lance,fragvec")
    ap.add_argument("--nprobes", default="1,4,8,16,32")
    ap.add_argument("--filtered-nprobes", default="4,16")
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--fragvec-cmd",
                    default=f"cargo run --release --manifest-path "
                            f"{os.path.join(HERE, '..', 'Cargo.toml')} --example knn_bench --")
    ap.add_argument("--fragvec-args", default="", help="more arguments for knn_bench")
    ap.add_argument("--lance-index", default="IVF_FLAT",
                    choices=["IVF_FLAT", "IVF_PQ", "IVF_HNSW_SQ"])
    ap.add_argument("--lance-sub-vectors", type=int, help="IVF_PQ sub-vectors (default dim/8)")
    ap.add_argument("--lance-refine", type=int, help="Lance refine_factor (IVF_PQ re-ranking)")
    ap.add_argument("--lance-ef", type=int, help="Lance's HNSW search breadth (IVF_HNSW_*)")
    ap.add_argument("--lance-reuse", action="store_true",
                    help="query the Lance index an earlier run built instead of rebuilding it")
    ap.add_argument("--lance-qps-streams", default="",
                    help="concurrent query threads of Lance's throughput runs, e.g. 1,4")
    ap.add_argument("--lance-qps-nprobes", type=int, default=8)
    ap.add_argument("--lance-qps-seconds", type=float, default=5.0)
    ap.add_argument("--memcap", help="run each system under ../shared/tools/memcap LIMIT "
                                     "(page cache included, cold start), e.g. 1G")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.nprobes = [int(x) for x in a.nprobes.split(",") if x]
    a.filtered_nprobes = [int(x) for x in a.filtered_nprobes.split(",") if x]
    a.systems = [s for s in a.systems.split(",") if s]
    a.lance_qps_streams = [int(x) for x in a.lance_qps_streams.split(",") if x]
    if a.run:
        try:
            RUNNERS[a.run](a)
        except ImportError as e:
            print(f"{a.run}: cannot import ({e}); skipped", file=sys.stderr)
            sys.exit(3)
        return
    with open(os.path.join(a.data, "meta.json")) as f:
        meta = json.load(f)
    records = []
    for s in a.systems:
        records += collect(a, s)
    with open(os.path.join(a.data, "results.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    print(f"\n{meta['rows']:,} × {meta['dim']}, {partitions(meta, a.partitions)} partitions, "
          f"k = {K}, {meta['queries']} queries one at a time (r = recall@10)\n")
    print(table(a, records))


if __name__ == "__main__":
    main()

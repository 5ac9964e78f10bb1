#!/usr/bin/env python3
"""Filtered recall benchmark: single-query p50/p99 of a Kalos store with metadata filters that
match 50%, 10%, 1% and 0.01% of rows, against the unfiltered p50, with peers in the same run:
numpy mask-then-top-k and faiss-cpu IndexFlat with an IDSelectorBatch (when faiss is
installed) on the CPU; torch mask-then-top-k on the GPU (when torch sees one). The CPU peers run
with the CPU engine (`--cpu-peers auto`); a CUDA run leaves them out unless `--cpu-peers on`
(at 1M x 768 they take most of the run's time: numpy copies the matching rows for every query).

    python3 tests/gpu/filter_bench.py                       # CPU engine, 100k x 384 f32
    python3 tests/gpu/filter_bench.py --backend cuda --n 1000000 --dim 768 --dtype f16

Kalos is measured through its C API from this process (a client of the server thread it
starts: the same slot round trip as any client). Prints a markdown table and writes
$OUT/filter_bench.json.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kalos_ct import CPU, CUDA, F16, F32, IP, Store, load  # noqa: E402


def filters_module():
    for p in (os.path.join(HERE, "python", "kalos", "filters.py"), os.path.join(HERE, "..", "..", "bindings", "python", "kalos", "filters.py")):
        if os.path.isfile(p):
            spec = importlib.util.spec_from_file_location("kalos_filters", p)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            return m
    raise FileNotFoundError("kalos/filters.py")


def pct(ts):
    a = np.sort(np.array(ts)) * 1e6
    return float(a[len(a) // 2]), float(a[min(len(a) - 1, int(len(a) * 0.99))])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpu-peers", choices=["auto", "on", "off"], default="auto",
                    help="numpy and faiss-cpu beside Kalos (auto: with --backend cpu only)")
    a = ap.parse_args()
    F = filters_module()
    rng = np.random.default_rng(a.seed)
    X = rng.standard_normal((a.n, a.dim)).astype(np.float32)
    ids = np.arange(a.n, dtype=np.uint64)
    X16 = X.astype(np.float16).astype(np.float32) if a.dtype == "f16" else None
    # One int field whose value is uniform in 0..9999: "n < t" matches t/100 % of rows.
    bucket = rng.permutation(a.n) % 10_000
    lib = load(os.environ.get("KALOS_LIB"))
    st = Store(lib, "filterbench-%d" % os.getpid(), dim=a.dim, metric=IP, dtype=F16 if a.dtype == "f16" else F32,
               backend=CUDA if a.backend == "cuda" else CPU, capacity=a.n + 1)
    batch = max(1, (800 << 10) // (a.dim * 4 + 64))
    for s in range(0, a.n, batch):
        sl = slice(s, s + batch)
        st.upsert(ids[sl], X[sl], fields=F.encode_fields([{"n": int(b)} for b in bucket[sl]]))
    engine = st.stats().engine_name.decode()
    cases = [("none", None, None), ("50%", 5000, None), ("10%", 1000, None), ("1%", 100, None), ("0.01%", 1, None)]
    qs = rng.standard_normal((a.queries, a.dim)).astype(np.float32)

    cpu_peers = a.cpu_peers == "on" or (a.cpu_peers == "auto" and a.backend == "cpu")
    faiss = None
    if cpu_peers:
        try:
            import faiss  # noqa: F811
            fx = faiss.IndexFlatIP(a.dim)
            fx.add(X)
        except ImportError:
            pass
    torch = None
    try:
        import torch  # noqa: F811
        if not torch.cuda.is_available():
            torch = None
        else:
            tX = torch.from_numpy(X).to("cuda", torch.float16 if a.dtype == "f16" else torch.float32)
            tb = torch.from_numpy(bucket).to("cuda")
    except ImportError:
        pass

    rows = []
    for cname, thr, _ in cases:
        fb = None if thr is None else F.lt("n", thr).encode()
        mask = None if thr is None else bucket < thr
        for q in qs[:10]:
            st.recall(q, a.k, filter=fb)
        t = []
        for q in qs:
            t0 = time.perf_counter()
            got = st.recall(q, a.k, filter=fb)
            t.append(time.perf_counter() - t0)
        kp50, kp99 = pct(t)
        # Exactness spot check against numpy over the stored values (f16-rounded for an f16
        # store): every id returned scores at least the reference's k-th score (within f32
        # rounding), and as many come back as match (up to k).
        s = (X16 if X16 is not None else X) @ qs[-1]
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        want = np.argsort(-s, kind="stable")[: min(a.k, int(mask.sum()) if mask is not None else a.n)]
        kth = float(s[want[-1]])
        gs = s[np.asarray(got[0], dtype=np.int64)] if len(got[0]) else np.array([])
        exact = len(got[0]) == len(want) and bool(np.all(gs >= kth - 1e-3 * (1 + abs(kth))))
        row = dict(filter=cname, rows=int(a.n if mask is None else mask.sum()), kalos_p50_us=kp50, kalos_p99_us=kp99,
                   exact=exact)
        if cpu_peers:
            # numpy: mask, then top-k over the matching rows (argpartition).
            t = []
            for q in qs[: max(20, a.queries // 5)]:
                t0 = time.perf_counter()
                if mask is None:
                    sc = X @ q
                    top = np.argpartition(-sc, a.k)[: a.k]
                else:
                    sel = np.flatnonzero(mask)
                    sc = X[sel] @ q
                    kk = min(a.k, len(sel))
                    top = sel[np.argpartition(-sc, kk - 1)[:kk]] if len(sel) > kk else sel
                t.append(time.perf_counter() - t0)
            row["numpy_p50_us"] = pct(t)[0]
        if faiss is not None:
            params = None
            if mask is not None:
                params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(np.flatnonzero(mask).astype(np.int64)))
            t = []
            for q in qs[: max(20, a.queries // 5)]:
                t0 = time.perf_counter()
                fx.search(q.reshape(1, -1), a.k, params=params)
                t.append(time.perf_counter() - t0)
            row["faiss_p50_us"] = pct(t)[0]
        if torch is not None:
            tq = torch.from_numpy(qs).to("cuda", tX.dtype)
            t = []
            for i in range(a.queries):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                sc = tX @ tq[i]
                if thr is not None:
                    sc = sc.masked_fill(tb >= thr, float("-inf"))
                torch.topk(sc, a.k)
                torch.cuda.synchronize()
                t.append(time.perf_counter() - t0)
            row["torch_p50_us"] = pct(t)[0]
        rows.append(row)
    base = rows[0]["kalos_p50_us"]
    print("engine %s, %d x %d %s, k=%d, %d queries, %d threads visible" % (engine, a.n, a.dim, a.dtype, a.k, a.queries, os.cpu_count()))
    cols = ["filter", "rows", "kalos_p50_us", "kalos_p99_us", "vs_unfiltered", "exact", "numpy_p50_us", "faiss_p50_us", "torch_p50_us"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        r["vs_unfiltered"] = r["kalos_p50_us"] / base
        print("| " + " | ".join(("%.1f" % r[c]) if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols) + " |")
    out = os.environ.get("OUT", ".")
    json.dump(dict(engine=engine, n=a.n, dim=a.dim, dtype=a.dtype, k=a.k, rows=rows), open(os.path.join(out, "filter_bench.json"), "w"))
    st.close()
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

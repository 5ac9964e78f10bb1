#!/usr/bin/env python3
"""Python-side overhead of kalos.Kalos.recall: Python recall p50 minus C recall p50.

Both clients recall the same query from the same kalosd server and table, in alternating
rounds (C, Python, C, Python, ...) so that drift in machine load hits both alike; the result is
the median over rounds of (Python p50 − C p50). Three Python variants are timed:

* ``wrapper``: ``kv.recall(q, k)`` (the public API: allocates and returns fresh numpy arrays);
* ``raw``: the bare ctypes call ``lib.kalos_recall(...)`` with preallocated buffers (the floor
  that ctypes itself imposes);
* every latency includes one ``time.perf_counter_ns()`` pair (C: one ``clock_gettime`` pair).

Usage (from the repository root, after ``cargo build --release``):

    python examples/python/bench_overhead.py [--n 10000] [--dim 64] [--k 10] [--iters 20000] [--rounds 5]

Needs gcc (the C client is compiled from examples/python/bench_recall.c against
include/kalos.h and target/release/libkalos.so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import kalos  # noqa: E402
from kalos import _ffi  # noqa: E402


def build_c(tmp: Path) -> Path:
    lib = Path(kalos.library_path).resolve()
    exe = tmp / "bench_recall"
    subprocess.run(
        ["gcc", "-O2", "-I", str(ROOT / "include"), str(ROOT / "examples/python/bench_recall.c"),
         "-L", str(lib.parent), "-lkalos", f"-Wl,-rpath,{lib.parent}", "-o", str(exe)],
        check=True,
    )
    return exe


def py_round(kv: kalos.Kalos, q: np.ndarray, k: int, iters: int) -> dict:
    clock = time.perf_counter_ns
    lat = np.empty(iters, np.int64)
    recall = kv.recall
    for _ in range(2000):
        recall(q, k)
    for i in range(iters):
        t0 = clock()
        recall(q, k)
        lat[i] = clock() - t0
    # raw ctypes call, preallocated buffers, no wrapper
    fn = _ffi.lib.kalos_recall
    ids = np.empty(k, np.uint64)
    sc = np.empty(k, np.float32)
    cnt = np.empty(1, np.uintp)
    h, qa, ia, sa, ca, d = kv._h, q.ctypes.data, ids.ctypes.data, sc.ctypes.data, cnt.ctypes.data, q.shape[0]
    raw = np.empty(iters, np.int64)
    for i in range(iters):
        t0 = clock()
        fn(h, qa, d, k, None, ia, k, sa, k, ca)
        raw[i] = clock() - t0
    timer = np.empty(iters, np.int64)
    for i in range(iters):
        t0 = clock()
        timer[i] = clock() - t0
    return {
        "py_p50_ns": int(np.median(lat)), "py_p99_ns": int(np.percentile(lat, 99)),
        "raw_p50_ns": int(np.median(raw)), "raw_p99_ns": int(np.percentile(raw, 99)),
        "timer_p50_ns": int(np.median(timer)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--json", help="write the results here as JSON")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kalos-bench-"))
    exe = build_c(tmp)
    rng = np.random.default_rng(0)
    np.save(tmp / "v.npy", rng.standard_normal((a.n, a.dim)).astype(np.float32))
    name = f"bench-overhead-{os.getpid()}"
    kalosd = Path(kalos.library_path).resolve().parent / "kalosd"
    srv = subprocess.Popen(
        [str(kalosd), "serve", "--name", name, "--dim", str(a.dim), "--load", str(tmp / "v.npy"),
         "--backend", a.backend],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = srv.stdout.readline()
        while line and "serving" not in line:
            line = srv.stdout.readline()
        print(line.strip())
        q = np.array([((i * 7) % 13) / 13.0 - 0.5 for i in range(a.dim)], dtype=np.float32)
        rounds = []
        with kalos.open(name, role="client") as kv:
            engine = kv.stats()["engine_name"]
            for r in range(a.rounds):
                out = subprocess.run([str(exe), name, str(a.iters), str(a.k)], check=True,
                                     capture_output=True, text=True).stdout
                c = dict(kv_.split("=") for kv_ in out.split())
                p = py_round(kv, q, a.k, a.iters)
                row = {"c_p50_ns": int(c["c_p50_ns"]), "c_p99_ns": int(c["c_p99_ns"]), **p}
                row["overhead_ns"] = row["py_p50_ns"] - row["c_p50_ns"]
                row["raw_overhead_ns"] = row["raw_p50_ns"] - row["c_p50_ns"]
                rounds.append(row)
                print(f"round {r}: C p50 {row['c_p50_ns']} ns | Python p50 {row['py_p50_ns']} ns "
                      f"(raw ctypes {row['raw_p50_ns']} ns) | overhead {row['overhead_ns']} ns "
                      f"(raw {row['raw_overhead_ns']} ns) | timer {row['timer_p50_ns']} ns")
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(10)
    med = {key: int(np.median([r[key] for r in rounds])) for key in rounds[0]}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(), "numpy": np.__version__, "engine": engine,
        "n": a.n, "dim": a.dim, "k": a.k, "iters": a.iters, "rounds": a.rounds, "median": med,
    }
    print(json.dumps(result, indent=2))
    print(f"Python-side overhead (median of rounds): {med['overhead_ns'] / 1000:.2f} us "
          f"(bare ctypes call: {med['raw_overhead_ns'] / 1000:.2f} us); target <= 3 us")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

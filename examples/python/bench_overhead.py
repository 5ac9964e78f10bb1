#!/usr/bin/env python3
"""Python-side overhead of kalos.Kalos.recall: Python recall p50 minus C recall p50.

Both sides recall the same query through the same client handle from the same kalosd server
and table. The C side is examples/python/bench_recall.c, compiled as a shared library and
driven in blocks (its loop and timer are C; one ctypes call starts a block of `--block`
recalls). Blocks alternate: C, Python wrapper, bare ctypes, C, ... so that the server's state
(spinning or parked) and the machine's load hit all three alike; the overhead is the median
over block triples of (Python block p50 − C block p50). Variants:

* ``wrapper``: ``kv.recall(q, k)``, the public API (fresh numpy arrays returned);
* ``raw``: the bare ctypes call ``lib.kalos_recall(...)`` with argtypes and preallocated
  buffers: the floor a plain ctypes binding would have;
* Python latencies include one ``time.perf_counter_ns()`` pair (~50 ns), C ones one
  ``clock_gettime`` pair.

The standalone C program (same source, without -DBENCH_LIB) gives a separate-process C figure.

Usage (from the repository root, after ``cargo build --release``; needs gcc):

    python examples/python/bench_overhead.py [--n 100] [--dim 64] [--k 10] [--blocks 200] [--block 500]
"""

from __future__ import annotations

import argparse
import ctypes
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


def build_c(tmp: Path, shared: bool) -> Path:
    lib = Path(kalos.library_path).resolve()
    out = tmp / ("libbench_recall.so" if shared else "bench_recall")
    extra = ["-DBENCH_LIB", "-shared", "-fPIC"] if shared else []
    subprocess.run(
        ["gcc", "-O2", *extra, "-I", str(ROOT / "include"), str(ROOT / "examples/python/bench_recall.c"),
         "-L", str(lib.parent), "-lkalos", f"-Wl,-rpath,{lib.parent}", "-o", str(out)],
        check=True,
    )
    return out


def paired_blocks(kv: kalos.Kalos, q: np.ndarray, k: int, blocks: int, block: int, cbench) -> dict:
    clock = time.perf_counter_ns
    recall = kv.recall
    fn = _ffi.lib.kalos_recall
    ids = np.empty(k, np.uint64)
    sc = np.empty(k, np.float32)
    cnt = np.empty(1, np.uintp)
    h, qa, ia, sa, ca, d = kv._h, q.ctypes.data, ids.ctypes.data, sc.ctypes.data, cnt.ctypes.data, q.shape[0]
    c_lat = np.empty(block, np.uint64)
    py_lat = np.empty(block, np.int64)
    raw_lat = np.empty(block, np.int64)
    rows = []
    for _ in range(200):  # warm-up
        recall(q, k)
    for b in range(blocks):
        rc = cbench(h, qa, d, k, block, ia, sa, c_lat.ctypes.data)
        assert rc == 0, rc
        for i in range(block):
            t0 = clock()
            recall(q, k)
            py_lat[i] = clock() - t0
        for i in range(block):
            t0 = clock()
            fn(h, qa, d, k, None, ia, k, sa, k, ca)
            raw_lat[i] = clock() - t0
        rows.append((np.median(c_lat), np.median(py_lat), np.median(raw_lat)))
    r = np.array(rows)
    return {
        "c_p50_ns": int(np.median(r[:, 0])),
        "py_p50_ns": int(np.median(r[:, 1])),
        "raw_p50_ns": int(np.median(r[:, 2])),
        "overhead_ns": int(np.median(r[:, 1] - r[:, 0])),
        "raw_overhead_ns": int(np.median(r[:, 2] - r[:, 0])),
        "overhead_p25_ns": int(np.percentile(r[:, 1] - r[:, 0], 25)),
        "overhead_p75_ns": int(np.percentile(r[:, 1] - r[:, 0], 75)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--block", type=int, default=500)
    ap.add_argument("--iters", type=int, default=20000, help="calls of the standalone C program")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--json", help="write the results here as JSON")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kalos-bench-"))
    exe = build_c(tmp, shared=False)
    clib = ctypes.CDLL(str(build_c(tmp, shared=True)))
    cbench = clib.kalos_bench_recall
    cbench.restype = ctypes.c_int32
    cbench.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
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
        out = subprocess.run([str(exe), name, str(a.iters), str(a.k)], check=True, capture_output=True, text=True).stdout
        standalone = {kk: int(v) for kk, v in (x.split("=") for x in out.split()) if kk.startswith("c_")}
        with kalos.open(name, role="client") as kv:
            engine = kv.stats()["engine_name"]
            med = paired_blocks(kv, q, a.k, a.blocks, a.block, cbench)
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(10)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(), "numpy": np.__version__, "engine": engine,
        "n": a.n, "dim": a.dim, "k": a.k, "blocks": a.blocks, "block": a.block,
        "paired": med, "standalone_c_program": standalone,
    }
    print(json.dumps(result, indent=2))
    print(f"Python-side overhead (median over {a.blocks} paired blocks): {med['overhead_ns'] / 1000:.2f} us "
          f"[IQR {med['overhead_p25_ns'] / 1000:.2f}-{med['overhead_p75_ns'] / 1000:.2f}] "
          f"(bare ctypes call: {med['raw_overhead_ns'] / 1000:.2f} us); target <= 3 us")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

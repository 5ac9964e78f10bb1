#!/usr/bin/env python3
"""Python-side overhead of kalos.Kalos.recall: Python recall p50 minus C recall p50.

Both sides recall the same query through the same client handle from the same kalosd server
and table. The C side is examples/python/bench_recall.c, compiled as a shared library and
driven in blocks (its loop and timer are C; one ctypes call starts a block of `--block`
recalls). Blocks alternate: C, the Python variants (each block in another order), bare ctypes,
C, ... so that the server's state (spinning or parked) and the machine's load hit them alike;
an overhead is the median over blocks of (variant block p50 − C block p50). Variants:

* ``py`` (wrapper): ``kv.recall(q, k)``, the public API (fresh numpy arrays returned), as the
  package runs it: through the C extension ``kalos._fastcall`` when it is built (see below);
* ``ctypes``: the same call with ``kalos._FASTCALL = None``, i.e. the package's ctypes fast
  path (what runs when the extension is missing or ``KALOS_PY_FASTCALL=0``); timed only when
  the extension is in use;
* ``raw``: the bare ctypes call ``lib.kalos_recall(...)`` with argtypes and preallocated
  buffers: the floor a plain ctypes binding would have;
* ``baseline`` (with ``--baseline DIR``): ``kv.recall(q, k)`` of another copy of the package
  (``DIR/kalos``, e.g. ``git archive <commit> bindings/python/kalos | tar -x -C DIR --strip-components 2``)
  through its own client handle, timed in the same blocks as ``py``: a change to the binding
  is compared within one run, since the round trip flips between modes from run to run;
* Python latencies include one ``time.perf_counter_ns()`` pair (~50 ns), C ones one
  ``clock_gettime`` pair.

With ``--payloads`` every row is stored with a payload of about 200 bytes and every variant asks
for the hits' payloads: ``kv.recall(q, k, payloads=True)``, and the C and bare ctypes calls go
through ``kalos_recall_payloads`` into a 1 MiB buffer (the ``ctypes`` variant, with the
extension switched off, is then the package's general path for payload recalls).

With ``--namespace NS`` every variant recalls scoped to namespace NS (the server's rows are all
in namespace 0, so NS = 0 scopes without changing the answer): ``kv.recall(q, k, namespace=NS)``,
and the C and bare ctypes calls pass a ``kalos_recall_params`` holding NS.

``wrapper − raw`` (median over blocks of the difference of block p50s) is the binding's own
cost above a bare ctypes call, the figure least moved by the round trip's mode. p99s are over
all the calls of a variant.

The standalone C program (same source, without -DBENCH_LIB) gives a separate-process C figure.

The script imports the package from the checkout (``bindings/python``); build the extension
there first, else ``py`` is the ctypes fast path (the script says so):

    (cd bindings/python && KALOS_PY_NATIVE=0 python setup.py build_ext --inplace)

Usage (from the repository root, after ``cargo build --release``; needs gcc):

    python examples/python/bench_overhead.py [--n 100] [--dim 64] [--k 10] [--blocks 200] [--block 500]
                                             [--baseline DIR] [--namespace NS] [--payloads]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import shutil
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
        ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", *extra, "-I", str(ROOT / "include"),
         str(ROOT / "examples/python/bench_recall.c"), "-L", str(lib.parent), "-lkalos",
         f"-Wl,-rpath,{lib.parent}", "-o", str(out)],
        check=True,
    )
    return out


def load_baseline(pkg_dir: Path):
    """Imports DIR/kalos as the module ``kalos_baseline`` (same libkalos.so as ``kalos``)."""
    os.environ.setdefault("KALOS_LIBRARY", str(Path(kalos.library_path).resolve()))
    init = pkg_dir / "kalos" / "__init__.py"
    spec = importlib.util.spec_from_file_location("kalos_baseline", init, submodule_search_locations=[str(init.parent)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kalos_baseline"] = mod
    spec.loader.exec_module(mod)
    return mod


def paired_blocks(kv: kalos.Kalos, q: np.ndarray, k: int, blocks: int, block: int, cbench, kv_base=None,
                  namespace=None, payloads=False) -> dict:
    clock = time.perf_counter_ns
    fn = _ffi.lib.kalos_recall
    ids = np.empty(k, np.uint64)
    sc = np.empty(k, np.float32)
    cnt = np.empty(1, np.uintp)
    h, qa, ia, sa, ca, d = kv._h, q.ctypes.data, ids.ctypes.data, sc.ctypes.data, cnt.ctypes.data, q.shape[0]
    # --payloads: every side asks for the hits' payloads too (C: kalos_recall_payloads).
    pbuf = np.empty(1 << 20, np.uint8)
    plens = np.empty(k, np.uint32)
    needed = np.empty(1, np.uintp)
    c_args = (pbuf.ctypes.data, pbuf.shape[0], plens.ctypes.data) if payloads else ()
    fast = kalos._FASTCALL
    params = None
    if namespace is not None:
        nsa = np.array([namespace], np.uint64)
        p = _ffi.kalos_recall_params()
        _ffi.lib.kalos_recall_params_init(ctypes.byref(p), ctypes.sizeof(p))
        p.namespaces = nsa.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))
        p.namespaces_len = 1
        params = ctypes.byref(p)

    def scoped(recall):
        kw = {} if namespace is None else {"namespace": namespace}
        if payloads:
            kw["payloads"] = True
        return (lambda q_, k_: recall(q_, k_, **kw)) if kw else recall

    # (name, callable, value of kalos._FASTCALL while it runs)
    timed = [("py", scoped(kv.recall), fast)]
    if fast is not None:
        timed.append(("ctypes", scoped(kv.recall), None))
    if kv_base is not None:
        timed.append(("baseline", scoped(kv_base.recall), None))
    lat = {name: np.empty((blocks, block), np.int64) for name in ["c", "raw"] + [t[0] for t in timed]}
    c_lat = np.empty(block, np.uint64)
    for name, f, mode in timed:  # warm-up
        kalos._FASTCALL = mode
        for _ in range(200):
            f(q, k)
    try:
        for b in range(blocks):
            rc = cbench(h, qa, d, k, block, params, ia, sa, c_lat.ctypes.data, *c_args)
            assert rc == 0, rc
            lat["c"][b] = c_lat
            r = b % len(timed)
            for name, f, mode in timed[r:] + timed[:r]:  # each variant takes each position in turn
                kalos._FASTCALL = mode
                out = lat[name][b]
                for i in range(block):
                    t0 = clock()
                    f(q, k)
                    out[i] = clock() - t0
            out = lat["raw"][b]
            if payloads:
                fp = _ffi.lib.kalos_recall_payloads
                ba, bl, la, na = pbuf.ctypes.data, pbuf.shape[0], plens.ctypes.data, needed.ctypes.data
                for i in range(block):
                    t0 = clock()
                    fp(h, qa, d, k, params, ia, k, sa, k, ba, bl, la, k, ca, na)
                    out[i] = clock() - t0
            else:
                for i in range(block):
                    t0 = clock()
                    fn(h, qa, d, k, params, ia, k, sa, k, ca)
                    out[i] = clock() - t0
    finally:
        kalos._FASTCALL = fast
    p50 = {name: np.median(v, axis=1) for name, v in lat.items()}  # per block

    def paired(a: str, b: str, q_: float = 50) -> int:
        return int(np.percentile(p50[a] - p50[b], q_))

    out = {}
    for name, v in lat.items():
        out[f"{name}_p50_ns"] = int(np.median(p50[name]))
        out[f"{name}_p99_ns"] = int(np.percentile(v, 99))
    out.update({
        "overhead_ns": paired("py", "c"),
        "overhead_p25_ns": paired("py", "c", 25),
        "overhead_p75_ns": paired("py", "c", 75),
        "raw_overhead_ns": paired("raw", "c"),
        "wrapper_minus_raw_ns": paired("py", "raw"),
    })
    if fast is not None:
        out["ctypes_overhead_ns"] = paired("ctypes", "c")
        out["ctypes_minus_raw_ns"] = paired("ctypes", "raw")
        out["wrapper_minus_ctypes_ns"] = paired("py", "ctypes")
        out["wrapper_minus_ctypes_p25_ns"] = paired("py", "ctypes", 25)
        out["wrapper_minus_ctypes_p75_ns"] = paired("py", "ctypes", 75)
    if kv_base is not None:
        out["baseline_overhead_ns"] = paired("baseline", "c")
        out["baseline_minus_raw_ns"] = paired("baseline", "raw")
        out["wrapper_minus_baseline_ns"] = paired("py", "baseline")
    return out


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
    ap.add_argument("--baseline", type=Path, help="directory holding another kalos package (DIR/kalos) to time alongside")
    ap.add_argument("--namespace", type=int, help="scope every recall to this namespace (the rows are in 0)")
    ap.add_argument("--payloads", action="store_true",
                    help="every row gets a payload of about 200 bytes and every variant asks for the hits' payloads")
    a = ap.parse_args()
    base_mod = load_baseline(a.baseline) if a.baseline else None

    tmp = Path(tempfile.mkdtemp(prefix="kalos-bench-"))
    exe = build_c(tmp, shared=False)
    clib = ctypes.CDLL(str(build_c(tmp, shared=True)))
    cbench = clib.kalos_bench_recall_payloads if a.payloads else clib.kalos_bench_recall
    cbench.restype = ctypes.c_int32
    cbench.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    if a.payloads:
        cbench.argtypes += [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((a.n, a.dim)).astype(np.float32)
    np.save(tmp / "v.npy", vecs)
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
            if a.payloads:  # the same rows again, now with payloads
                kv.upsert(np.arange(a.n, dtype=np.uint64), vecs,
                          payloads=[f"memory {i}: " + "the user said something worth remembering. " * 4 for i in range(a.n)])
            engine = kv.stats()["engine_name"]
            kv_base = base_mod.open(name, role="client") if base_mod else None
            try:
                med = paired_blocks(kv, q, a.k, a.blocks, a.block, cbench, kv_base, a.namespace, a.payloads)
            finally:
                if kv_base is not None:
                    kv_base.close()
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(), "numpy": np.__version__, "engine": engine,
        "n": a.n, "dim": a.dim, "k": a.k, "blocks": a.blocks, "block": a.block, "namespace": a.namespace,
        "payloads": a.payloads,
        "fastcall": kalos._FASTCALL is not None, "paired": med, "standalone_c_program": standalone,
    }
    if a.baseline:
        result["baseline"] = str(a.baseline)
    print(json.dumps(result, indent=2))
    print(f"Python-side overhead (median over {a.blocks} paired blocks): {med['overhead_ns'] / 1000:.2f} us "
          f"[IQR {med['overhead_p25_ns'] / 1000:.2f}-{med['overhead_p75_ns'] / 1000:.2f}] "
          f"(bare ctypes call: {med['raw_overhead_ns'] / 1000:.2f} us); target <= 3 us; "
          f"wrapper - bare ctypes: {med['wrapper_minus_raw_ns'] / 1000:.2f} us")
    if "ctypes_overhead_ns" in med:
        print(f"C extension (kalos._fastcall) - ctypes fast path: {med['wrapper_minus_ctypes_ns'] / 1000:+.2f} us "
              f"[IQR {med['wrapper_minus_ctypes_p25_ns'] / 1000:+.2f} to {med['wrapper_minus_ctypes_p75_ns'] / 1000:+.2f}]; "
              f"ctypes fast path overhead: {med['ctypes_overhead_ns'] / 1000:.2f} us")
    else:
        print(f"kalos._fastcall not in use ({kalos._fastpath.disabled_reason}): 'py' is the ctypes fast path")
    print("variant   p50 us   p99 us")
    for name in ("c", "py", "ctypes", "baseline", "raw"):
        if f"{name}_p50_ns" in med:
            print(f"{name:8} {med[f'{name}_p50_ns'] / 1000:7.2f}  {med[f'{name}_p99_ns'] / 1000:7.2f}")
    if a.baseline:
        print(f"baseline {a.baseline}: overhead {med['baseline_overhead_ns'] / 1000:.2f} us, "
              f"baseline - bare ctypes: {med['baseline_minus_raw_ns'] / 1000:.2f} us, "
              f"wrapper - baseline: {med['wrapper_minus_baseline_ns'] / 1000:+.2f} us")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Cost of moving a large recall batch through shared memory (no GPU needed).

A server process (CPU engine, a 16-row table, so the engine's share is negligible) and this
client time ``recall_batch`` of ``--nq`` queries of ``--dim`` floats through the ``kalos``
package: what is left is the transport (the queries copied into the slot, the server's private
copy, checks, the response). With several ``--lib`` paths the builds are run alternately,
``--rounds`` times, so that a before/after comparison shares the machine's state.

Usage (from the repository root, after ``cargo build --release``):

    python examples/python/bench_batch_transport.py [--nq 1024] [--dim 768] [--calls 40]
        [--rounds 3] [--lib target/release/libkalos.so ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))


def serve(name: str, dim: int) -> None:
    import numpy as np
    import kalos

    st = kalos.open(name, dim=dim, role="server", backend="cpu", metric="ip", slot_bytes=8 << 20, slots=4,
                    server_spin_ns=1_000_000_000)
    st.upsert(np.arange(16, dtype=np.uint64), np.random.default_rng(1).standard_normal((16, dim), dtype=np.float32))
    print("READY", flush=True)
    sys.stdin.read()
    st.close()


def measure(lib: str, nq: int, dim: int, calls: int) -> tuple[float, float]:
    """(client p50 ms, server p50 ms) for one build, in a fresh pair of processes."""
    env = dict(os.environ, KALOS_LIBRARY=lib)
    name = "kbt-%d-%d" % (os.getpid(), time.monotonic_ns() % 1_000_000)
    srv = subprocess.Popen([sys.executable, __file__, "--serve", name, "--dim", str(dim)], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if not srv.stdout.readline().startswith("READY"):
            raise RuntimeError("server did not start")
        out = subprocess.run([sys.executable, __file__, "--client", name, "--dim", str(dim), "--nq", str(nq),
                              "--calls", str(calls)], env=env, capture_output=True, text=True, check=True)
        c, s = out.stdout.split()
        return float(c), float(s)
    finally:
        srv.stdin.close()
        srv.wait(timeout=30)


def client(name: str, nq: int, dim: int, calls: int) -> None:
    import numpy as np
    import kalos

    c = kalos.open(name, role="client", client_spin_ns=1_000_000_000)
    q = np.random.default_rng(2).standard_normal((nq, dim), dtype=np.float32)
    c.recall_batch(q, 10)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        c.recall_batch(q, 10)
        ts.append(time.perf_counter() - t0)
    print("%.4f %.4f" % (1e3 * statistics.median(ts), c.stats()["p50_ns"] / 1e6))
    c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nq", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lib", action="append", help="libkalos.so to measure (repeatable)")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--client", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.dim)
        return 0
    if a.client:
        client(a.client, a.nq, a.dim, a.calls)
        return 0
    libs = a.lib or [os.path.join(ROOT, "target", "release", "libkalos.so")]
    print("recall_batch of %d x %d through the kalos package, CPU engine, 16-row table; p50 of %d calls"
          % (a.nq, a.dim, a.calls))
    for r in range(a.rounds):
        for lib in libs:
            c, s = measure(lib, a.nq, a.dim, a.calls)
            print("round %d  %-60s client p50 %.3f ms  server p50 %.3f ms" % (r + 1, lib, c, s), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

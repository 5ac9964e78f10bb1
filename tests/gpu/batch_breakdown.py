"""Where a batch's time goes, as the client sees it (a tuning aid for the H200; not a test).

Starts a server (bench.py's `serve`, a separate process) on an N x D table, then times
batches of B queries from this process through the kalos package and reads the server's own
p50 for them (stats: request taken -> response ready, which covers the engine). Also times a
plain numpy copy of one batch (the host's memory speed). The engine's time per batch is in
the server's report (stderr, KALOS_CUDA_REPORT=1) when it closes.

  python3 batch_breakdown.py [N] [D] [dtype: 0 f32, 1 f16] [B] [batches]

BREAKDOWN_METRIC=0|1|2 picks the store's metric (ip, the default; cosine; l2).
"""
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kalos  # noqa: E402
from kalos_ct import CUDA  # noqa: E402


def main():
    n, dim, dt, b, nb = (int(x) for x in (sys.argv[1:] + ["1000000", "768", "1", "1024", "100"][len(sys.argv) - 1:]))
    name = "kbreak-%d" % os.getpid()
    srv = subprocess.Popen([sys.executable, os.path.join(HERE, "bench.py"), "serve", name, str(n), str(dim), str(dt), os.environ.get("BREAKDOWN_BACKEND", str(CUDA)),
                            os.environ.get("BREAKDOWN_METRIC", "0")],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = srv.stdout.readline()
    assert line.startswith("READY"), line
    if os.environ.get("BREAKDOWN_TORCH") == "1":
        # As bench.py's client process: torch imported and CUDA used in this process first.
        import torch
        a = torch.randn(4096, 4096, device="cuda")
        torch.cuda.synchronize()
        print("BREAKDOWN_TORCH torch %s threads %d, cpus of this process %d" % (torch.__version__, torch.get_num_threads(), len(os.sched_getaffinity(0))), float((a @ a).sum()), flush=True)
    print("cpus of this process %d" % len(os.sched_getaffinity(0)), flush=True)
    kc = kalos.open(name, role="client", client_spin_ns=1_000_000_000)
    rng = np.random.default_rng()
    qs = [rng.standard_normal((b, dim), dtype=np.float32) for _ in range(4)]
    for r in range(3):
        kc.recall_batch(qs[r % 4], 10)
    ts = []
    for r in range(nb):
        t0 = time.perf_counter()
        kc.recall_batch(qs[r % 4], 10)
        ts.append(time.perf_counter() - t0)
    st = kc.stats()
    dst = np.empty_like(qs[0])
    cp = []
    for r in range(200):
        t0 = time.perf_counter()
        np.copyto(dst, qs[r % 4])
        cp.append(time.perf_counter() - t0)
    p = lambda a, q: float(np.percentile(a, q)) * 1e3  # noqa: E731
    print("batch_breakdown %d x %d dtype %d, %d queries, %d batches, KALOS_COPY_THREADS=%s: client p50 %.3f ms p99 %.3f ms; "
          "server p50 %.3f ms (request taken -> response ready, the last %d recalls); numpy copy of one batch p50 %.3f ms"
          % (n, dim, dt, b, nb, os.environ.get("KALOS_COPY_THREADS", "default"), p(ts, 50), p(ts, 99),
             st["p50_ns"] / 1e6, min(nb + 3, 4096), p(cp, 50)), flush=True)
    kc.close()
    srv.stdin.close()
    srv.wait(timeout=60)


if __name__ == "__main__":
    main()

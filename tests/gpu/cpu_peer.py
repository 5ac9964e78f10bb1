#!/usr/bin/env python3
"""numpy's best single query on the CPU, in-process: normalised f32 rows, scores = X @ q, top 10
by argpartition + sort; and faiss-cpu's IndexFlatIP.search on the same rows when faiss is
installed. Thread count from OMP/OPENBLAS_NUM_THREADS (cpu_host.sh sets them; faiss takes it
from OMP_NUM_THREADS). Usage: cpu_peer.py N DIM ITERS; prints p50 / p99 in microseconds."""
import sys
import time

import numpy as np

n, d, it = (int(x) for x in sys.argv[1:4])
rng = np.random.default_rng()
X = rng.standard_normal((n, d), dtype=np.float32)
X /= np.linalg.norm(X, axis=1, keepdims=True)
Q = rng.standard_normal((64, d), dtype=np.float32)


def one(q):
    s = X @ q
    i = np.argpartition(-s, 10)[:10]
    return i[np.argsort(-s[i])]


def timed(fn, label):
    for q in Q[:5]:
        fn(q)
    t = []
    for j in range(it):
        t0 = time.perf_counter()
        fn(Q[j % 64])
        t.append(time.perf_counter() - t0)
    t = np.sort(np.array(t)) * 1e6
    print("%s%d x %d: p50 %.1f us, p99 %.1f us (%d queries)" % (label, n, d, t[len(t) // 2], t[int(len(t) * 0.99)], it), flush=True)


timed(one, "")
try:
    import faiss
except ImportError:
    faiss = None
if faiss is not None:
    index = faiss.IndexFlatIP(d)
    index.add(X)
    timed(lambda q: index.search(q.reshape(1, -1), 10), "faiss ")

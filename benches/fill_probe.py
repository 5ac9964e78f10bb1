#!/usr/bin/env python3
"""Loads N x DIM rows into a store in upserts of one 8 MiB slot each and prints the total time
and the slowest upserts (a table's growth happens inside one of them, on the server thread).

usage: KALOS_LIB=target/release/libkalos.so python3 benches/fill_probe.py N DIM [SCAN [DTYPE]]
SCAN 1 = int8; DTYPE 0 = f32, 1 = f16 (default); CPU engine. Needs numpy.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from kalos_ct import CPU, F16, IP, Store, load  # noqa: E402

n, dim = int(sys.argv[1]), int(sys.argv[2])
scan = int(sys.argv[3]) if len(sys.argv) > 3 else 0
dtype = int(sys.argv[4]) if len(sys.argv) > 4 else F16
st = Store(load(), "fillprobe-%d" % os.getpid(), dim=dim, metric=IP, dtype=dtype, backend=CPU, capacity=n + 16,
           scan=scan, slot_bytes=1 << 23)
chunk = (1 << 23) // (dim * 4 + 64)
X = np.random.default_rng(1).standard_normal((chunk, dim), dtype=np.float32)
times = []
t00 = time.time()
for s in range(0, n, chunk):
    t0 = time.perf_counter()
    st.upsert(np.arange(s, min(s + chunk, n), dtype=np.uint64), X[: min(chunk, n - s)])
    times.append((time.perf_counter() - t0, s))
times.sort(reverse=True)
print("%d x %d: %.1f s in upserts of %d rows; slowest (s, at row): %s"
      % (n, dim, time.time() - t00, chunk, [(round(a, 3), b) for a, b in times[:4]]))
st.close()

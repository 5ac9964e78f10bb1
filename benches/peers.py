#!/usr/bin/env python3
"""Peers for the Kalos CPU benchmark: numpy and faiss-cpu on the same .npy files, queries and k.

usage: peers.py DIR TAG:ITERS [TAG:ITERS ...]
Reads DIR/TAG_x.npy (n, d) float32, DIR/TAG_q.npy (nq, d) float32 and DIR/TAG_ids.npy (Kalos'
top-10 ids of query 0) and prints a markdown table of single-query p50/p99 in microseconds.
"""
import os
import sys
import time

import numpy as np

K = 10


def timeit(fn, qs, iters):
    for i in range(3):
        fn(qs[i % len(qs)])
    lat = []
    for i in range(iters):
        q = qs[i % len(qs)]
        t0 = time.perf_counter_ns()
        fn(q)
        lat.append(time.perf_counter_ns() - t0)
    lat.sort()
    return lat[len(lat) // 2] / 1e3, lat[min(len(lat) - 1, int(round((len(lat) - 1) * 0.99)))] / 1e3


def main():
    d = sys.argv[1]
    try:
        import faiss
    except Exception as e:  # pragma: no cover
        faiss = None
        print(f"faiss-cpu not importable ({e}); `pip install faiss-cpu` to add it")
    ncpu = os.cpu_count()
    print("| table | peer | p50 | p99 | top-10 ids == kalos |")
    print("|---|---|---|---|---|")
    for arg in sys.argv[2:]:
        tag, iters = arg.split(":")
        iters = int(iters)
        x = np.load(os.path.join(d, f"{tag}_x.npy"))
        qs = np.load(os.path.join(d, f"{tag}_q.npy"))
        kal = np.load(os.path.join(d, f"{tag}_ids.npy")).astype(np.int64)

        def np_search(q):
            s = x @ q
            idx = np.argpartition(-s, K)[:K]
            return idx[np.argsort(-s[idx], kind="stable")]

        p50, p99 = timeit(np_search, qs, iters)
        same = np.array_equal(np_search(qs[0]), kal)
        print(f"| {tag} | numpy {np.__version__} argpartition(M@q) | {p50:.1f} | {p99:.1f} | {same} |")
        if faiss is not None:
            index = faiss.IndexFlatIP(x.shape[1])
            index.add(x)
            for nt in sorted({1, ncpu}):
                faiss.omp_set_num_threads(nt)
                p50, p99 = timeit(lambda q: index.search(q[None, :], K), qs, iters)
                ids = index.search(qs[0][None, :], K)[1][0]
                print(f"| {tag} | faiss {faiss.__version__} IndexFlatIP, {nt} thread{'s' if nt > 1 else ''} | {p50:.1f} | {p99:.1f} | {np.array_equal(ids, kal)} |")
            del index
        del x
        sys.stdout.flush()


if __name__ == "__main__":
    main()

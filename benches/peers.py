#!/usr/bin/env python3
"""Peers for the Kalos CPU benchmark: numpy and faiss-cpu on the same .npy files, queries and k.

usage: peers.py DIR TAG:ITERS [TAG:ITERS ...]
       peers.py --cross N:DIM:ITERS [...]   (only the cross-process comparison, random data)
Reads DIR/TAG_x.npy (n, d) float32, DIR/TAG_q.npy (nq, d) float32 and DIR/TAG_ids.npy (Kalos'
top-10 ids of query 0) and prints a markdown table of single-query p50/p99 in microseconds.

With KALOS_LIB=path/to/libkalos.so it also runs a head-to-head: a Kalos server in this process
(through the C ABI, ctypes) and faiss IndexFlatIP with the same thread count, one query each in
alternation, so both see the same machine load at the same moment (the machines these run on
are shared, and numbers taken minutes apart are not comparable). Kalos' time there is a full
recall (slot round trip to its server thread + scan + top-k).
"""
import ctypes
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


class KalosOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("role", ctypes.c_uint32), ("dim", ctypes.c_uint32),
        ("metric", ctypes.c_uint32), ("dtype", ctypes.c_uint32), ("backend", ctypes.c_uint32),
        ("capacity", ctypes.c_uint64), ("slots", ctypes.c_uint32), ("slot_bytes", ctypes.c_uint32),
        ("mode", ctypes.c_uint32), ("max_payload_bytes", ctypes.c_uint32),
        ("client_spin_ns", ctypes.c_uint64), ("server_spin_ns", ctypes.c_uint64),
        ("timeout_ms", ctypes.c_uint64), ("heartbeat_timeout_ms", ctypes.c_uint64),
        ("data_dir", ctypes.c_char_p), ("sync_policy", ctypes.c_uint32), ("threads", ctypes.c_uint32),
        ("sync_interval_ms", ctypes.c_uint64), ("gpu_memory_bytes", ctypes.c_uint64),
    ]


def bind(lib):
    """Argument types of the C functions this script calls."""
    lib.kalos_open.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.kalos_close.argtypes = [ctypes.c_void_p]
    lib.kalos_upsert.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.kalos_recall.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def upsert_all(lib, h, x):
    """Upserts the rows of `x` with ids 0.. in chunks; returns the first failing status or 0."""
    n = x.shape[0]
    for i in range(0, n, 4096):
        ids = np.arange(i, min(n, i + 4096), dtype=np.uint64)
        v = np.ascontiguousarray(x[i:i + len(ids)])
        st = lib.kalos_upsert(h, ids.ctypes.data, len(ids), v.ctypes.data, v.size, None)
        if st != 0:
            return st
    return 0


def head_to_head(lib, faiss, tag, x, qs, iters, threads):
    """Alternates kalos_recall (server with `threads` engine threads) and faiss with `threads`."""
    o = KalosOptions()
    lib.kalos_options_init(ctypes.byref(o), ctypes.sizeof(o))
    o.role, o.dim, o.metric, o.backend = 1, x.shape[1], 0, 1  # server, ip, cpu
    o.capacity, o.threads, o.timeout_ms = x.shape[0], threads, 120000
    o.client_spin_ns, o.server_spin_ns = int(os.environ.get("KALOS_H2H_SPIN", "20000")), 2000000
    h = ctypes.c_void_p()
    name = f"peers-{os.getpid()}-{tag}-{threads}".encode()
    st = lib.kalos_open(name, ctypes.byref(o), ctypes.byref(h))
    if st != 0:
        return f"kalos_open failed: {st}"
    try:
        n, d = x.shape
        st = upsert_all(lib, h, x)
        if st != 0:
            return f"kalos_upsert failed: {st}"
        out_ids = np.zeros(K, dtype=np.uint64)
        out_sc = np.zeros(K, dtype=np.float32)
        cnt = ctypes.c_size_t()
        qs = np.ascontiguousarray(qs, dtype=np.float32)

        def kal(q):
            st = lib.kalos_recall(h, q.ctypes.data, d, K, None, out_ids.ctypes.data, K, out_sc.ctypes.data, K, ctypes.byref(cnt))
            assert st == 0, st

        index = faiss.IndexFlatIP(d)
        index.add(x)
        faiss.omp_set_num_threads(threads)

        def fai(q):
            index.search(q[None, :], K)

        for i in range(3):
            kal(qs[i]); fai(qs[i])
        lk, lf = [], []
        for i in range(iters):
            q = qs[i % len(qs)]
            for fn, lat in ((kal, lk), (fai, lf)) if i % 2 == 0 else ((fai, lf), (kal, lk)):
                t0 = time.perf_counter_ns()
                fn(q)
                lat.append(time.perf_counter_ns() - t0)
        kal(qs[0])
        fids = index.search(qs[0][None, :], K)[1][0]
        same = np.array_equal(out_ids.astype(np.int64), fids)
        lk.sort(); lf.sort()
        p = lambda l, f: l[min(len(l) - 1, int(round((len(l) - 1) * f)))] / 1e3
        single = (f"| {tag} | x{threads} | {p(lk, .5):.1f} | {p(lk, .99):.1f} | {lk[0]/1e3:.1f} | "
                  f"{p(lf, .5):.1f} | {p(lf, .99):.1f} | {lf[0]/1e3:.1f} | {p(lk, .5) / p(lf, .5):.2f} | {same} |")

        # Batches of B queries, the three alternating call by call: queries per second from the
        # median call time.
        B = len(qs)
        bids = np.zeros(B * K, dtype=np.uint64)
        bsc = np.zeros(B * K, dtype=np.float32)
        bcnt = np.zeros(B, dtype=np.uintp)

        def kal_batch():
            st = lib.kalos_recall_batch(h, qs.ctypes.data, qs.size, B, K, None, bids.ctypes.data, B * K,
                                        bsc.ctypes.data, B * K, bcnt.ctypes.data, B)
            assert st == 0, st

        def fai_batch():
            return index.search(qs, K)[1]

        def np_batch():
            s = qs @ x.T
            return np.argpartition(-s, K, axis=1)[:, :K]

        faiss.omp_set_num_threads(threads)
        lat = {kal_batch: [], fai_batch: [], np_batch: []}
        # Rotating blocks with pauses, as in cross_process (the peers' thread pools keep spinning
        # after a call); the first call of each block is not counted.
        for r in range(3):
            for fn in (kal_batch, fai_batch, np_batch):
                time.sleep(0.25)
                for i in range(max(3, iters // 16) + 1):
                    t0 = time.perf_counter_ns()
                    fn()
                    if i:
                        lat[fn].append(time.perf_counter_ns() - t0)
        qps = {fn: B / (sorted(v)[len(v) // 2] / 1e9) for fn, v in lat.items()}
        bsame = np.array_equal(bids.reshape(B, K).astype(np.int64), fai_batch())
        batch = (f"| {tag} | x{threads} | {B} | {qps[kal_batch]:,.0f} | {qps[fai_batch]:,.0f} | {qps[np_batch]:,.0f} | "
                 f"{qps[kal_batch] / qps[fai_batch]:.2f} | {bsame} |")
        return single, batch
    finally:
        lib.kalos_close(h)


def cross_process(lib, faiss, kalosd, tag, x, qs, iters):
    """Kalos recalls from this process to a kalosd in another (default options, CPU engine),
    alternating call by call with numpy and faiss in this process (1 thread and every core):
    the comparison a service sees. Returns a markdown row of p50s (µs)."""
    import subprocess
    n, d = x.shape
    name = f"peers-xp-{os.getpid()}-{tag}"
    srv = subprocess.Popen([kalosd, "serve", "--name", name, "--dim", str(d), "--metric", "ip", "--backend", "cpu",
                            "--capacity", str(n)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    o = KalosOptions()
    lib.kalos_options_init(ctypes.byref(o), ctypes.sizeof(o))
    o.role, o.dim, o.metric, o.timeout_ms = 2, d, 0, 120000  # client, ip
    h = ctypes.c_void_p()
    try:
        st = -1
        for _ in range(200):
            st = lib.kalos_open(name.encode(), ctypes.byref(o), ctypes.byref(h))
            if st == 0:
                break
            time.sleep(0.05)
        if st != 0:
            return f"| {tag} | kalos_open (client of kalosd) failed: {st} |"
        st = upsert_all(lib, h, x)
        if st != 0:
            return f"| {tag} | kalos_upsert failed: {st} |"
        time.sleep(0.6)  # a housekeeping tick: the server's advice to clients follows the table
        out_ids = np.zeros(K, dtype=np.uint64)
        out_sc = np.zeros(K, dtype=np.float32)
        cnt = ctypes.c_size_t()
        qs = np.ascontiguousarray(qs, dtype=np.float32)
        index = faiss.IndexFlatIP(d)
        index.add(x)

        def kal(q):
            st = lib.kalos_recall(h, q.ctypes.data, d, K, None, out_ids.ctypes.data, K, out_sc.ctypes.data, K, ctypes.byref(cnt))
            assert st == 0, st

        def nump(q):
            s = x @ q
            return np.argpartition(-s, K)[:K]

        def fai(nt):
            def f(q):
                faiss.omp_set_num_threads(nt)
                index.search(q[None, :], K)
            return f

        fns = [kal, nump, fai(1), fai(os.cpu_count())]
        lat = [[] for _ in fns]
        for i in range(3):
            for f in fns:
                f(qs[i])
        # Blocks of calls in rotation, not single calls, with a pause between blocks: numpy's
        # BLAS and faiss' OpenMP threads keep spinning for up to ~0.1 s after a call and would
        # take the cores from whatever ran next. The first calls of each block are not counted.
        block = max(8, iters // 8)
        for b in range(8 * len(fns)):
            j = b % len(fns)
            time.sleep(0.25)
            for i in range(block + 2):
                q = qs[(b * block + i) % len(qs)]
                t0 = time.perf_counter_ns()
                fns[j](q)
                if i >= 2:
                    lat[j].append(time.perf_counter_ns() - t0)
        p50 = [sorted(v)[len(v) // 2] / 1e3 for v in lat]
        p99 = sorted(lat[0])[min(len(lat[0]) - 1, int(round((len(lat[0]) - 1) * 0.99)))] / 1e3
        best = min(p50[1:])
        return (f"| {tag} | {p50[0]:.1f} | {p99:.1f} | {p50[1]:.1f} | {p50[2]:.1f} | {p50[3]:.1f} | "
                f"{p50[0] / best:.2f} |")
    finally:
        if h:
            lib.kalos_close(h)
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()


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
    lib_path = os.environ.get("KALOS_LIB")
    if not (lib_path and faiss is not None):
        return
    lib = ctypes.CDLL(lib_path)
    bind(lib)
    lib.kalos_recall_batch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.c_size_t]
    print()
    print("Head-to-head, same process, alternating queries (µs): Kalos recall through its server thread vs faiss IndexFlatIP")
    print()
    print("| table | threads | kalos p50 | kalos p99 | kalos min | faiss p50 | faiss p99 | faiss min | kalos/faiss p50 | same top-10 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    batches = []
    for arg in sys.argv[2:]:
        tag, iters = arg.split(":")
        x = np.load(os.path.join(d, f"{tag}_x.npy"))
        qs = np.load(os.path.join(d, f"{tag}_q.npy"))
        for nt in sorted({1, ncpu}):
            r = head_to_head(lib, faiss, tag, x, qs, int(iters), nt)
            if isinstance(r, str):
                print(r)
                continue
            print(r[0])
            batches.append(r[1])
            sys.stdout.flush()
        del x
    print()
    print("Batches, same process, in rotating blocks of calls (queries/s from the median call): Kalos "
          "kalos_recall_batch through its server thread, faiss IndexFlatIP.search, numpy argpartition(Q@M.T) "
          "(faiss with the row's thread count; numpy's BLAS uses every core whatever the row's)")
    print()
    print("| table | threads | batch | kalos q/s | faiss q/s | numpy q/s | kalos/faiss | same top-10 as faiss |")
    print("|---|---|---|---|---|---|---|---|")
    for b in batches:
        print(b)
    kalosd = os.path.join(os.path.dirname(lib_path), "kalosd")
    if os.path.exists(kalosd):
        print()
        print("Cross-process: a client in this process recalls from kalosd (CPU engine, default options) in "
              "another, in rotating blocks of calls with the in-process peers (p50 µs)")
        print()
        print(f"| table | kalos p50 | kalos p99 | numpy | faiss 1 thread | faiss {os.cpu_count()} threads | kalos / best peer |")
        print("|---|---|---|---|---|---|---|")
        for arg in sys.argv[2:]:
            tag, iters = arg.split(":")
            x = np.load(os.path.join(d, f"{tag}_x.npy"))
            qs = np.load(os.path.join(d, f"{tag}_q.npy"))
            print(cross_process(lib, faiss, kalosd, tag, x, qs, int(iters)))
            sys.stdout.flush()
            del x


def cross_only(specs):
    """`peers.py --cross N:DIM:ITERS ...` (KALOS_LIB set, kalosd beside it): only the
    cross-process comparison, on random f32 rows and queries drawn here (no .npy files)."""
    import faiss
    lib = ctypes.CDLL(os.environ["KALOS_LIB"])
    bind(lib)
    kalosd = os.path.join(os.path.dirname(os.environ["KALOS_LIB"]), "kalosd")
    rng = np.random.default_rng()
    print(f"| table | kalos p50 | kalos p99 | numpy | faiss 1 thread | faiss {os.cpu_count()} threads | kalos / best peer |")
    print("|---|---|---|---|---|---|---|")
    for spec in specs:
        n, d, iters = (int(v) for v in spec.split(":"))
        x = rng.standard_normal((n, d), dtype=np.float32)
        qs = rng.standard_normal((64, d), dtype=np.float32)
        print(cross_process(lib, faiss, kalosd, f"{n // 1000}k_{d}" if n < 1_000_000 else f"{n // 1_000_000}M_{d}", x, qs, iters), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cross"]:
        cross_only(sys.argv[2:])
    else:
        main()

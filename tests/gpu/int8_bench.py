#!/usr/bin/env python3
"""The int8 scan on the GPU against the exact scan and torch, in one run (docs/BENCHMARKS.md,
"8-bit scan"): single-query p50/p99 through the C API (server in this process, requests
through shared memory), recall@10 against an exact float64 reference, the re-rank count R
swept for the recall-latency curve, batch-1024 throughput of both modes, and the device bytes
a row costs in each.

Rows are clustered (centres plus noise, so near neighbours crowd together as in real
embeddings, a harder case for 8-bit scores than isotropic noise); queries are perturbed rows.

  KALOS_LIB=.gpu/libkalos.so python3 .gpu/int8_bench.py --n 1000000 --dim 768
Writes $OUT/int8_bench_<n>.json and prints a table.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kalos_ct import CUDA, F16, IP, Store, load  # noqa: E402

K = 10


def pct(ts):
    a = np.sort(np.array(ts)) * 1e6
    return float(a[len(a) // 2]), float(a[min(len(a) - 1, int(len(a) * 0.99))])


def timed(fn, qs, reps):
    for q in qs[:20]:
        fn(q)
    t = []
    for i in range(reps):
        q = qs[i % len(qs)]
        t0 = time.perf_counter()
        fn(q)
        t.append(time.perf_counter() - t0)
    return pct(t)


def fill(st, X, chunk):
    """Loads X by chunks; returns the load's seconds and its slowest chunks [(seconds, first
    row)] (a chunk that stalls the server thread, e.g. while a table grows, shows here). A
    failed chunk is reported with the row it started at."""
    t_all, worst = time.perf_counter(), []
    for s in range(0, len(X), chunk):
        t0 = time.perf_counter()
        try:
            st.upsert(np.arange(s, min(s + chunk, len(X)), dtype=np.uint64), X[s:s + chunk])
        except Exception as e:
            raise RuntimeError("upsert of rows %d.. failed after %.1f s (slowest chunks so far: %s)" % (
                s, time.perf_counter() - t0, sorted(worst, reverse=True)[:5])) from e
        worst.append((round(time.perf_counter() - t0, 4), s))
        worst = sorted(worst, reverse=True)[:5]
    return time.perf_counter() - t_all, worst


def gpu_used():
    try:
        import torch
        free, total = torch.cuda.mem_get_info()
        return total - free
    except Exception:
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=1000, help="single queries timed (and checked) per store")
    ap.add_argument("--recall-queries", type=int, default=500)
    ap.add_argument("--rerank", default="0,16,32,48,64,128,256", help="R values swept (0 = the default, max(8k, 64))")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact store (large n: host memory)")
    ap.add_argument("--no-batch", action="store_true")
    ap.add_argument("--seed", type=int, default=int(time.time()) & 0xFFFF)
    a = ap.parse_args()
    n, dim = a.n, a.dim
    # Drawn on the GPU (numpy's generator takes minutes for 10M x 768), copied to the host.
    import torch
    g = torch.Generator(device="cuda").manual_seed(a.seed)
    X = np.empty((n, dim), np.float32)
    C = torch.randn((max(1, n // 100), dim), generator=g, device="cuda")
    for s in range(0, n, 1 << 18):
        e = min(n, s + (1 << 18))
        pick = torch.randint(0, len(C), (e - s,), generator=g, device="cuda")
        X[s:e] = (C[pick] + 0.5 * torch.randn((e - s, dim), generator=g, device="cuda")).cpu().numpy()
    del C
    pick = torch.randint(0, n, (2000,), generator=g, device="cuda").cpu().numpy()
    Q = (torch.from_numpy(X[pick]).cuda() + 0.7 * torch.randn((2000, dim), generator=g, device="cuda")).cpu().numpy()
    lib = load(os.environ.get("KALOS_LIB"))
    chunk = max(1, (3 << 20) // (dim * 4 + 16))
    out = dict(n=n, dim=dim, dtype="f16", k=K, seed=a.seed, rows={})

    # The reference: exact float32 top-10 of the rows as written (TF32 off), on the GPU by
    # chunks of rows; the int8 scan re-ranks with these f32 rows, the exact scan with f16 ones.
    torch.backends.cuda.matmul.allow_tf32 = False
    tQr = torch.from_numpy(Q[:a.recall_queries]).to("cuda")
    best_s, best_i = None, None
    for j in range(0, n, 1 << 20):
        xc = torch.from_numpy(X[j:j + (1 << 20)]).to("cuda")
        sc, ix = torch.topk(tQr @ xc.T, min(K, len(xc)), dim=1)
        ix = ix + j
        if best_s is None:
            best_s, best_i = sc, ix
        else:
            cs, ci = torch.cat([best_s, sc], 1), torch.cat([best_i, ix], 1)
            best_s, o = torch.topk(cs, K, dim=1)
            best_i = torch.gather(ci, 1, o)
        del xc
    truth = best_i.cpu().numpy().tolist()
    del tQr, best_s, best_i
    tX = torch.from_numpy(X).to("cuda", torch.float16)
    tQ = torch.from_numpy(Q).to("cuda", torch.float16)
    tp50, tp99 = timed(lambda q: torch.topk(tX @ q, K).indices.cpu(), [tQ[i] for i in range(200)], a.queries)
    out["torch_single"] = dict(p50_us=tp50, p99_us=tp99)
    torch.cuda.synchronize()
    if not a.no_batch:
        tb = tQ[:1024]
        for _ in range(3):
            torch.topk(tb @ tX.T, K, dim=1).indices.cpu()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            torch.topk(tb @ tX.T, K, dim=1).indices.cpu()
        torch.cuda.synchronize()
        out["torch_batch1024_qps"] = 10 * 1024 / (time.perf_counter() - t0)
    del tQ, tX
    torch.cuda.empty_cache()

    def measure(label, scan, rerank, batch, nib=False):
        base = gpu_used()
        st = Store(lib, "i8b-%s-%d" % (label, os.getpid()), dim=dim, metric=IP, dtype=F16, backend=CUDA, capacity=n + 16,
                   scan=scan, rerank=rerank, slot_bytes=1 << 23)
        load_s, slow = fill(st, X, chunk)
        dev = gpu_used() - base
        p50, p99 = timed(lambda q: st.recall(q, K), Q, a.queries)
        s0 = st.stats()
        rec = []
        for i in range(a.recall_queries):
            got = st.recall(Q[i], K)[0]
            rec.append(len(set(got.tolist()) & set(truth[i])) / K)
        s1 = st.stats()
        row = dict(p50_us=p50, p99_us=p99, recall10=float(np.mean(rec)), recall10_min=float(np.min(rec)),
                   queries_at_1=float(np.mean(np.array(rec) == 1.0)), engine=s1.engine_name.decode(),
                   uncertain=int(s1.rerank_uncertain - s0.rerank_uncertain), reranked=int(s1.rerank_queries - s0.rerank_queries),
                   load_s=round(load_s, 1), slowest_chunks=slow,
                   device_bytes_per_row=dev / n if dev > 0 else None,
                   device_bytes_per_row_table=2 * dim + 36 + ((dim + 15) // 16 * 16 + 4 + (nib_bytes if nib else 0) if scan else 0))
        if batch:
            qb = np.ascontiguousarray(Q[:1024])
            for _ in range(2):
                st.recall_batch(qb, K)
            t0 = time.perf_counter()
            for _ in range(5):
                st.recall_batch(qb, K)
            row["batch1024_qps"] = 5 * 1024 / (time.perf_counter() - t0)
        st.close()
        out["rows"][label] = row
        print("%-12s %s" % (label, json.dumps(row)), flush=True)

    # The CUDA int8 scan's 4-bit first pass (KALOS_INT8_NIBBLE=<count>, read once per process;
    # off by default) takes the queries whose R is below its count, at dimensions up to 1024.
    nib_count = int(os.environ.get("KALOS_INT8_NIBBLE", "0"))
    nib_bytes = (dim + 31) // 32 * 16 if nib_count >= 2 and dim <= 1024 else 0
    if not a.no_exact:
        measure("exact", 0, 0, not a.no_batch)
    for i, r in enumerate(int(x) for x in a.rerank.split(",")):
        nib = nib_bytes > 0 and (r or max(8 * K, 64)) < nib_count
        measure("int8-R%s%s" % (r or "default", "-nib%d" % nib_count if nib else ""), 1, r, i == 0 and not a.no_batch, nib)
    print("int8 bench %d x %d f16, k=%d: torch single p50 %.1f us" % (n, dim, K, tp50))
    print("| mode | p50 us | p99 us | recall@10 | min | uncertain | batch-1024 q/s | device B/row (measured / columns) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, r in out["rows"].items():
        print("| %s | %.1f | %.1f | %.4f | %.1f | %d/%d | %s | %s |" % (
            label, r["p50_us"], r["p99_us"], r["recall10"], r["recall10_min"], r["uncertain"], r["reranked"],
            "%.0f" % r["batch1024_qps"] if "batch1024_qps" in r else "-",
            "%s / %d" % ("%.0f" % r["device_bytes_per_row"] if r["device_bytes_per_row"] else "-", r["device_bytes_per_row_table"])))
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "int8_bench_%d.json" % n), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

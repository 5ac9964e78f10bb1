#!/usr/bin/env python3
"""Device shards on the GPUs (issue #32), torch in the same run.

Stores, each f16, D dims, filled with the same kind of random rows:
  one    N rows on one GPU, one table (the reference figure);
  split  N rows in 2 shards on that one GPU (what sharding costs on one device);
  multi  G x N rows over the host's G GPUs (gpus = all), when G >= 2.
For each: single-query p50/p99 (SHB_SINGLES queries, one at a time, through the C API) and
batch-1024 q/s (SHB_BATCHES batches); top-10 of sample queries checked against torch f32 on the
same rows. torch beside them: f16 matmul + topk on one GPU over N rows, and over G GPUs (each
device its part, the parts' top-k merged) over G x N rows. Prints a table; writes
$OUT/shards.json. Settings: SHB_N (1000000), SHB_DIM (768), SHB_SINGLES (2000), SHB_BATCHES (8).
"""
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kalos_ct import *  # noqa

OUT = os.environ.get("OUT", ".")
N = int(os.environ.get("SHB_N", "1000000"))
DIM = int(os.environ.get("SHB_DIM", "768"))
SINGLES = int(os.environ.get("SHB_SINGLES", "2000"))
BATCHES = int(os.environ.get("SHB_BATCHES", "8"))
K = 10
G = torch.cuda.device_count()
rng = np.random.default_rng(int(time.time()))
lib = load()


def rows(n, seed):
    r = np.random.default_rng(seed)
    return r.standard_normal((n, DIM), dtype=np.float32)


def pct(v, p):
    return float(np.percentile(np.asarray(v) * 1e6, p))


def timed(single, batch):
    """SINGLES calls of `single(i)` one at a time and BATCHES calls of `batch()` (each warmed
    up first): p50 / p99 of the singles in us and the batch-1024 q/s, plus the last batch's
    result."""
    for i in range(50):
        single(i)
    lat = []
    for i in range(SINGLES):
        t = time.perf_counter()
        single(i)
        lat.append(time.perf_counter() - t)
    batch()
    bt = []
    for _ in range(BATCHES):
        t = time.perf_counter()
        res = batch()
        bt.append(time.perf_counter() - t)
    return dict(p50_us=pct(lat, 50), p99_us=pct(lat, 99), batch_qps=1024 / float(np.median(bt))), res


def bench_store(tag, parts, **kw):
    """`parts`: list of (ids, X) chunks that make the table."""
    total = sum(len(i) for i, _ in parts)
    st = Store(lib, "shb-%s-%d" % (tag, os.getpid()), dim=DIM, metric=IP, dtype=F16, backend=CUDA,
               capacity=total + 16, slot_bytes=1 << 24, **kw)
    t0 = time.time()
    step = max(1, (12 << 20) // (DIM * 4 + 16))
    for ids, X in parts:
        for s in range(0, len(ids), step):
            st.upsert(ids[s:s + step], X[s:s + step])
    load_s = time.time() - t0
    info = st.stats()
    Q = rng.standard_normal((max(SINGLES, 1024), DIM), dtype=np.float32)
    times, res = timed(lambda i: st.recall(Q[i], K), lambda: st.recall_batch(Q[:1024], K))
    out = dict(store=tag, rows=total, engine=info.engine_name.decode(), load_s=round(load_s, 1), **times)
    # Exactness: top-10 ids of sample queries against torch f32 over the same rows.
    Xt = torch.cat([torch.from_numpy(X) for _, X in parts]).to("cuda:0", torch.float16).float()
    It = torch.from_numpy(np.concatenate([i for i, _ in parts]).astype(np.int64)).to("cuda:0")
    hit = 0
    for qi in range(0, 1024, 64):
        s = Xt @ torch.from_numpy(Q[qi]).to("cuda:0")
        want = set(It[torch.topk(s, K).indices].tolist())
        hit += len(want & set(res[qi][0].astype(np.int64).tolist()))
    out["recall_at_10"] = hit / (K * 16)
    del Xt, It
    torch.cuda.empty_cache()
    st.close()
    return out


def bench_torch(tag, parts, devices):
    """f16 matmul + topk, each device its share of `parts`, the shares' top-k merged on the first."""
    shares = [[] for _ in devices]
    for j, (ids, X) in enumerate(parts):
        shares[j % len(devices)].append((ids, X))
    Xs = [torch.cat([torch.from_numpy(X) for _, X in sh]).to("cuda:%d" % d, torch.float16) for sh, d in zip(shares, devices)]
    Q = torch.from_numpy(rng.standard_normal((1024, DIM), dtype=np.float32)).half()
    Qs = [Q.to("cuda:%d" % d) for d in devices]

    def run(nq):
        vals, idx = [], []
        for X, q in zip(Xs, Qs):
            v, i = torch.topk(q[:nq] @ X.T, K, dim=1)
            vals.append(v.to("cuda:0", non_blocking=True))
            idx.append(i.to("cuda:0", non_blocking=True))
        v, i = torch.topk(torch.cat(vals, 1), K, dim=1)
        torch.cuda.synchronize("cuda:0")
        return v, i

    times, _ = timed(lambda i: run(1), lambda: run(1024))
    out = dict(store=tag, rows=sum(len(i) for i, _ in parts), engine="torch x%d" % len(devices), **times)
    del Xs
    torch.cuda.empty_cache()
    return out


def main():
    res = []
    base = [(np.arange(1, N + 1, dtype=np.uint64), rows(N, 1))]
    res.append(bench_torch("torch-1gpu", base, [0]))
    res.append(bench_store("one", base))
    res.append(bench_store("split", base, device_shards=2))
    if G >= 2:
        multi = base + [(np.arange(j * N + 1, (j + 1) * N + 1, dtype=np.uint64), rows(N, j + 1)) for j in range(1, G)]
        res.append(bench_torch("torch-%dgpu" % G, multi, list(range(G))))
        res.append(bench_store("multi", multi, gpus=GPUS_ALL))
    print("%-12s %10s %-34s %9s %9s %11s %8s" % ("store", "rows", "engine", "p50 us", "p99 us", "batch q/s", "rec@10"))
    for r in res:
        print("%-12s %10d %-34s %9.1f %9.1f %11.0f %8s" % (r["store"], r["rows"], r["engine"][:34], r["p50_us"], r["p99_us"],
                                                           r["batch_qps"], "%.4f" % r["recall_at_10"] if "recall_at_10" in r else "-"))
    one = next(r for r in res if r["store"] == "one")
    for r in res:
        if r["store"] in ("split", "multi"):
            print("%s / one: p50 %.2fx, batch q/s %.2fx" % (r["store"], r["p50_us"] / one["p50_us"], r["batch_qps"] / one["batch_qps"]))
    json.dump(dict(commit=os.environ.get("KALOS_COMMIT", ""), gpus=G, n=N, dim=DIM, results=res),
              open(os.path.join(OUT, "shards.json"), "w"), indent=1)
    bad = [r for r in res if r.get("recall_at_10", 1.0) < 0.99]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

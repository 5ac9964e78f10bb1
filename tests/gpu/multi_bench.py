#!/usr/bin/env python3
"""H200 benchmark of the multi-query pass: one client process sends batches of Q = 1, 2, 4, 8,
16, 32, 64 random queries (k = 10) to a server holding a 1M x 768 f16 table (env MB_N, MB_DIM,
MB_DTYPE: 1 f16, 2 bf16), p50 / p99 over MB_REPS calls per Q; the cost of each Q against one
query; and, in the same run, torch in-process on the same table (M @ Q^T then topk, queries from
host memory, ids and scores back on the host). Writes $OUT/multi_bench.json.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kalos_ct import *  # noqa

OUT = os.environ.get("OUT", ".")
N = int(os.environ.get("MB_N", "1000000"))
DIM = int(os.environ.get("MB_DIM", "768"))
DTYPE = int(os.environ.get("MB_DTYPE", str(F16)))
REPS = int(os.environ.get("MB_REPS", "300"))
QS = [int(x) for x in os.environ.get("MB_Q", "1,2,4,8,16,32,64").split(",")]
K = 10


def pct(a, p):
    return float(np.percentile(np.asarray(a), p))


def main():
    lib = load()
    name = "mbench-%d" % os.getpid()
    srv = subprocess.Popen([sys.executable, os.path.join(HERE, "bench.py"), "serve", name, str(N), str(DIM), str(DTYPE), str(CUDA)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = srv.stdout.readline()
    if not line.startswith("READY"):
        srv.kill()
        print("FAIL server: " + line, flush=True)
        return 1
    rows = []
    try:
        st = Store(lib, name, role=ROLE_CLIENT, client_spin_ns=1_000_000_000)
        rng = np.random.default_rng()
        for q in QS:
            Qs = [rng.standard_normal((q, DIM), dtype=np.float32) for _ in range(8)]
            lat = []
            for r in range(REPS + 10):
                Q = Qs[r % 8]
                t0 = time.perf_counter_ns()
                if q == 1:
                    st.recall(Q[0], K)
                else:
                    st.recall_batch(Q, K)
                t1 = time.perf_counter_ns()
                if r >= 10:
                    lat.append((t1 - t0) / 1000.0)
            rows.append(dict(q=q, p50_us=pct(lat, 50), p99_us=pct(lat, 99)))
            print("kalos Q=%-3d p50 %8.1f us  p99 %8.1f us" % (q, rows[-1]["p50_us"], rows[-1]["p99_us"]), flush=True)
        sts = st.stats()
        engine = sts.engine_name.decode()
        st.close()
    finally:
        try:  # communicate() closes the server's stdin, which stops it
            out, err = srv.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            out = ""
    for l in (out or "").splitlines():
        if "multi-query" in l:
            print(l.strip()[:300], flush=True)
    torch_rows = []
    try:
        import torch
        X = np.random.default_rng(N * 31 + DIM).standard_normal((N, DIM), dtype=np.float32)
        M = torch.from_numpy(X).to("cuda", dtype=torch.float16 if DTYPE == F16 else torch.bfloat16)
        del X
        rng = np.random.default_rng()
        for q in QS:
            Qs = [rng.standard_normal((q, DIM), dtype=np.float32) for _ in range(8)]
            lat = []
            for r in range(REPS + 10):
                t0 = time.perf_counter_ns()
                qt = torch.from_numpy(Qs[r % 8]).to("cuda", dtype=M.dtype)
                s, i = torch.topk((M @ qt.T).float(), K, dim=0)
                i.cpu(), s.cpu()
                t1 = time.perf_counter_ns()
                if r >= 10:
                    lat.append((t1 - t0) / 1000.0)
            torch_rows.append(dict(q=q, p50_us=pct(lat, 50), p99_us=pct(lat, 99)))
        del M
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        print("INFO torch peer not run: %r" % (e,), flush=True)
    one = rows[0]["p50_us"] if rows and rows[0]["q"] == 1 else float("nan")
    print("\n%-4s %12s %10s %12s %14s" % ("Q", "kalos_p50_us", "x_one_q", "torch_p50_us", "kalos/torch_qps"))
    for r in rows:
        t = next((x for x in torch_rows if x["q"] == r["q"]), None)
        print("%-4d %12.1f %10.2f %12s %14s" % (r["q"], r["p50_us"], r["p50_us"] / one, "%.1f" % t["p50_us"] if t else "-",
                                                  "%.2f" % (t["p50_us"] / r["p50_us"]) if t else "-"))
    json.dump(dict(commit=os.environ.get("KALOS_COMMIT", ""), n=N, dim=DIM, dtype=DTYPE, engine=engine, reps=REPS,
                   kalos=rows, torch=torch_rows, date=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())),
              open(os.path.join(OUT, "multi_bench.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Recall@10 of the int8 scan against exact search on real embeddings, and CPU latency of both.

Input: the embeddings of tests/quality/make_embeddings.py, or of make_bundle.py + embed_torch.py
on a GPU machine (the same file: float32, unit rows; see make_embeddings.py). The last
`--queries` rows (default 2000) are held out as queries, the rest is the table (>= 100k rows for
the documented run).

Parts (each optional):
  --simulate   numpy model of the int8 scan with per-vector and per-dimension scales (the same
               rounding as src/engine/quant.rs), recall@10 at several re-rank counts R: the
               measurement behind the choice of per-vector scales; and of the CUDA engine's 4-bit
               first pass (KALOS_INT8_NIBBLE: codes round(x * 7 / max|x|), its best R4 re-scored
               from the per-vector 8-bit codes into the R candidates), recall@10 at each R for
               R4 = 128 and 256.
  (default)    the real thing through the Python binding: an exact store and one int8 store per
               R (CPU engine, in-process server), recall@10 of every held-out query against the
               exact store's answer, its distribution, and the server's rerank_uncertain count.
  --latency    p50/p99 of single recalls, exact vs int8 (default R), at the table's size and
               tiled to --tile-to rows, with numpy (argpartition of M @ q) in the same run.

Run with the repository's Python binding on the path and libkalos.so built, e.g.
  PYTHONPATH=bindings/python KALOS_LIBRARY=$CARGO_TARGET_DIR/release/libkalos.so \\
      .venv-quality/bin/python tests/quality/int8_recall.py --simulate --latency
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
K = 10


def load(path, nq):
    x = np.load(path, mmap_mode="r")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if len(x) <= nq:
        sys.exit(f"{path} has {len(x)} rows: need more than --queries {nq}")
    return x[:-nq], x[-nq:]


def exact_topk(table, queries, k):
    out = np.empty((len(queries), k), np.int64)
    for i in range(0, len(queries), 256):
        s = queries[i : i + 256] @ table.T
        part = np.argpartition(-s, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(s, part, 1), axis=1, kind="stable")
        out[i : i + 256] = np.take_along_axis(part, order, 1)
    return out


def quantize(x, scale):
    """Symmetric 8-bit codes, round half away from zero (Rust's f32::round), as quant.rs."""
    scale = np.where(scale == 0, 1.0, scale)
    v = x / scale
    return np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -127, 127).astype(np.int8)


def simulate(table, queries, truth, rs):
    res = {}
    qs = np.abs(queries).max(1, keepdims=True) / 127.0
    qc = quantize(queries, qs).astype(np.float32)
    schemes = {}
    # per-vector: one scale a row
    s = np.abs(table).max(1, keepdims=True) / 127.0
    schemes["per-vector"] = (quantize(table, s).astype(np.float32), s.ravel(), None)
    # per-dimension: one scale a column (the query absorbs it before its own quantization)
    d = np.abs(table).max(0) / 127.0
    schemes["per-dimension"] = (quantize(table, d[None, :]).astype(np.float32), None, d)
    for name, (codes, rscale, dscale) in schemes.items():
        if dscale is None:
            qcodes, qscale = qc, qs
        else:
            qd = queries * dscale[None, :]
            qscale = np.abs(qd).max(1, keepdims=True) / 127.0
            qcodes = quantize(qd, qscale).astype(np.float32)
        recalls = {r: [] for r in rs}
        for i in range(0, len(queries), 256):
            approx = (qcodes[i : i + 256] @ codes.T) * qscale[i : i + 256]
            if rscale is not None:
                approx = approx * rscale[None, :]
            exact = queries[i : i + 256] @ table.T
            for r in rs:
                cand = np.argpartition(-approx, r, axis=1)[:, :r]
                ex = np.take_along_axis(exact, cand, 1)
                top = np.take_along_axis(cand, np.argsort(-ex, axis=1, kind="stable")[:, :K], 1)
                for a, b in zip(top, truth[i : i + 256]):
                    recalls[r].append(len(set(a) & set(b)) / K)
        res[name] = {r: float(np.mean(v)) for r, v in recalls.items()}
        print(f"simulate {name}: " + ", ".join(f"R={r}: {res[name][r]:.5f}" for r in rs), flush=True)
    # The 4-bit first pass: nibble codes with the 8-bit scale times 127 / 7, the query's 8-bit
    # codes; its best R4 ranked by the per-vector 8-bit score, the best R of those re-scored.
    s4 = np.abs(table).max(1, keepdims=True) / 7.0
    c4 = quantize(table, s4).astype(np.float32)  # |x / s4| <= 7
    s4 = s4.ravel()
    c8, s8 = schemes["per-vector"][0], schemes["per-vector"][1]
    for r4 in (128, 256):
        recalls = {r: [] for r in rs if r < r4}
        for i in range(0, len(queries), 256):
            a4 = (qc[i : i + 256] @ c4.T) * qs[i : i + 256] * s4[None, :]
            a8 = (qc[i : i + 256] @ c8.T) * qs[i : i + 256] * s8[None, :]
            exact = queries[i : i + 256] @ table.T
            c1 = np.argpartition(-a4, r4, axis=1)[:, :r4]
            o8 = np.argsort(-np.take_along_axis(a8, c1, 1), axis=1, kind="stable")
            for r in recalls:
                cand = np.take_along_axis(c1, o8[:, :r], 1)
                ex = np.take_along_axis(exact, cand, 1)
                top = np.take_along_axis(cand, np.argsort(-ex, axis=1, kind="stable")[:, :K], 1)
                for a, b in zip(top, truth[i : i + 256]):
                    recalls[r].append(len(set(a) & set(b)) / K)
        name = "4-bit first pass, R4=%d" % r4
        res[name] = {r: float(np.mean(v)) for r, v in recalls.items()}
        print(f"simulate {name}: " + ", ".join(f"R={r}: {res[name][r]:.5f}" for r in recalls), flush=True)
    return res


# Engine of the stores (--backend, --dtype): the CPU engine by default.
STORE = {"backend": "cpu", "dtype": "f32"}


def open_store(kalos, tag, dim, n, scan, rerank=None):
    name = f"q8-{tag}-{os.getpid()}"
    return kalos.open(name, dim=dim, metric="ip", role="server", backend=STORE["backend"], dtype=STORE["dtype"], scan=scan,
                      rerank=rerank, capacity=n + 16, ephemeral=True, timeout=60)


def fill(store, table):
    for i in range(0, len(table), 20000):
        store.upsert(np.arange(i, min(i + 20000, len(table)), dtype=np.uint64), table[i : i + 20000])


def ids_of(res):
    """Ids of a `Kalos.recall` answer (ids, scores)."""
    return res[0].tolist()


def distribution(recalls):
    r = np.asarray(recalls)
    return {
        "mean": float(r.mean()),
        "min": float(r.min()),
        "p1": float(np.percentile(r, 1)),
        "p5": float(np.percentile(r, 5)),
        "queries_at_1.0": float((r == 1.0).mean()),
        "histogram": {f"{v:.1f}": int((np.round(r, 1) == round(v, 1)).sum()) for v in np.unique(np.round(r, 1))},
    }


def binding_recall(kalos, table, queries, rs):
    dim = table.shape[1]
    if STORE["backend"] == "cpu":
        ex = open_store(kalos, "exact", dim, len(table), "exact")
        fill(ex, table)
        truth = [ids_of(ex.recall(q, K)) for q in queries]
        ex.close()
    else:
        # A GPU store's exact scan scores its f16 / bf16 copy; the int8 scan re-ranks with the
        # f32 rows: the reference is the f32 top-k (numpy).
        truth = exact_topk(table, queries, K).tolist()
    out = {}
    for r in rs:
        st = open_store(kalos, f"int8-{r}", dim, len(table), "int8", rerank=r)
        fill(st, table)
        recalls = []
        for q, t in zip(queries, truth):
            got = ids_of(st.recall(q, K))
            recalls.append(len(set(got) & set(t)) / K)
        s = st.stats()
        st.close()
        d = distribution(recalls)
        d["rerank_uncertain"] = int(s["rerank_uncertain"])
        d["rerank_queries"] = int(s["rerank_queries"])
        d["engine"] = s["engine_name"]
        out["default" if r is None else r] = d
        print(f"binding R={r or 'default'}: {json.dumps(d)}", flush=True)
    return out


def lat(fn, qs, reps):
    for q in qs[:20]:
        fn(q)
    ts = []
    for i in range(reps):
        q = qs[i % len(qs)]
        t0 = time.perf_counter_ns()
        fn(q)
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return ts[len(ts) // 2] / 1e3, ts[int(len(ts) * 0.99)] / 1e3


def latency(kalos, table, queries, tile_to, reps):
    rows = []
    sizes = [len(table)] + ([tile_to] if tile_to > len(table) else [])
    for n in sizes:
        if n == len(table):
            m = table
        else:
            # Tiled: copies of the table, each with independent noise (σ = 0.01 a coordinate)
            # and renormalised, so rows stay distinct unit vectors (latency only).
            rng = np.random.default_rng(0)
            reps_ = -(-n // len(table))
            m = np.concatenate([table] + [table + rng.normal(0, 0.01, table.shape).astype(np.float32) for _ in range(reps_ - 1)])[:n]
            m /= np.linalg.norm(m, axis=1, keepdims=True)
        row = {"rows": n, "dim": m.shape[1]}
        p50, p99 = lat(lambda q: np.argpartition(-(m @ q), K)[:K], queries, reps)
        row["numpy"] = (p50, p99)
        for scan in ("exact", "int8"):
            st = open_store(kalos, f"lat-{scan}-{n}", m.shape[1], n, scan)
            fill(st, m)
            row[scan] = lat(lambda q: st.recall(q, K), queries, reps)
            row[scan + "_engine"] = st.stats()["engine_name"]
            st.close()
        print(f"latency {json.dumps(row)}", flush=True)
        rows.append(row)
        del m
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--npy", default=os.path.join(HERE, ".cache", "minilm_manpages.npy"))
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--rerank", default="10,20,40,64,80,160", help="re-rank counts to measure")
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--no-binding", action="store_true", help="skip the recall measurement through the binding")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--tile-to", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--latency-random", type=int, default=0, metavar="N", help="time on N random unit vectors (dim of --npy) instead of the embeddings")
    ap.add_argument("--out", default=os.path.join(HERE, ".cache", "int8_recall.json"))
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu", help="engine of the stores (cuda: the GPU's int8 scan)")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32", help="the stores' dtype (the GPU table's storage)")
    args = ap.parse_args()
    STORE.update(backend=args.backend, dtype=args.dtype)

    table, queries = load(args.npy, args.queries)
    print(f"table {table.shape}, {len(queries)} held-out queries", flush=True)
    rs = [int(r) for r in args.rerank.split(",")]
    report = {"npy": args.npy, "table": list(table.shape), "queries": len(queries)}
    if args.simulate:
        truth = exact_topk(table, queries, K)
        report["simulate"] = simulate(table, queries, truth, rs)
    import kalos

    if not args.no_binding:
        report["binding"] = binding_recall(kalos, table, queries, [None] + rs)
    if args.latency:
        m, qs = table, queries
        if args.latency_random:
            rng = np.random.default_rng(1)
            m = rng.standard_normal((args.latency_random, table.shape[1]), dtype=np.float32)
            m /= np.linalg.norm(m, axis=1, keepdims=True)
            report["latency_table"] = f"{args.latency_random} random unit vectors"
        report["latency"] = latency(kalos, m, qs, args.tile_to, args.reps)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""GPU correctness suite: the CUDA engine (through libkalos.so's C API) against a float64 numpy
reference on fresh random data. Every metric; k in {1, 10, 100, 1024}; tables from 1 to 2M rows;
exact ties; deletes and upserts between queries; namespace filters; expiry; recency; batches;
f16/bf16 recall bars; GPU out-of-memory; injected faults -> CPU fallback; auto engine choice.

Writes a JSON log to $OUT/correctness.json (or ./correctness.json) and prints PASS/FAIL lines.
Exit status 1 if any check failed.
"""
import json
import re
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kalos_ct import *  # noqa

OUT = os.environ.get("OUT", ".")
lib = load()
LOG = []
FAILS = 0
SEED = int(os.environ.get("SEED", str(int(time.time()) & 0xFFFF)))
rng = np.random.default_rng(SEED)
uniq = [0]


def name():
    uniq[0] += 1
    return "gpucheck-%d-%d" % (os.getpid(), uniq[0])


def record(test, ok, **kw):
    global FAILS
    if not ok:
        FAILS += 1
    kw.update(test=test, ok=bool(ok))
    LOG.append(kw)
    if not ok:
        print("FAIL", test, json.dumps({k: v for k, v in kw.items() if k not in ("test", "ok")}, default=str)[:1500], flush=True)


def record_nibble_scores(test, got, want, atol, l2=False):
    """A 4-bit first pass answer (KALOS_INT8_NIBBLE) against the CPU engine's int8 answer `want`:
    distinct ids ranked by score, and the same score wherever the ids agree. Returns the count of
    agreeing ids."""
    _, gi, wi = np.intersect1d(got[0], want[0], return_indices=True)
    gkey = -got[1] if l2 else got[1]
    record(test + "/nibble-scores", len(set(got[0].tolist())) == len(got[0]) and bool(np.all(np.diff(gkey) <= 0))
           and np.allclose(got[1][gi], want[1][wi], rtol=0, atol=atol), got=got[0][:5].tolist(), want=want[0][:5].tolist())
    return len(gi)


def on_gpu(sts):
    """Whether a store's stats show it served from the GPU (always true off the CUDA backend): a
    GPU failure would be answered by the CPU engine (exact f32), passing the bars untested."""
    return BACKEND != CUDA or (sts.engine == CUDA and sts.engine_fallbacks == 0)


def lowp_tol(dtype, xm, q):
    """The score bar for f16 / bf16 storage (xm: the largest stored row norm): the stored values
    are exact in the reference and the low-precision paths sum in lower precision, so the error
    scales with max|x| and |q|."""
    return {F16: 2e-3, BF16: 1.6e-2}[dtype] * xm * float(np.linalg.norm(q))


class Ref:
    """The table as the client knows it, with a float64 reference search."""

    def __init__(self, dim, metric):
        self.dim, self.metric = dim, metric
        self.ids = np.zeros(0, np.uint64)
        self.X = np.zeros((0, dim), np.float32)
        self.ns = np.zeros(0, np.uint64)
        self.created = np.zeros(0, np.float64)
        self._xd = None  # X as float64 and its largest row norm, computed once per table state
        self._xm = None

    def _changed(self):
        self._xd = self._xm = None

    def xd(self):
        if self._xd is None:
            self._xd = self.X.astype(np.float64)
        return self._xd

    def xmax(self):
        if self._xm is None:
            self._xm = float(np.sqrt((self.xd() ** 2).sum(1).max())) if len(self.X) else 1.0
        return self._xm

    def upsert(self, ids, X, ns=None, t=0.0):
        ns = np.zeros(len(ids), np.uint64) if ns is None else np.asarray(ns, np.uint64)
        keep = ~np.isin(self.ids, np.asarray(ids, np.uint64))
        self.ids = np.concatenate([self.ids[keep], np.asarray(ids, np.uint64)])
        self.X = np.concatenate([self.X[keep], X.astype(np.float32)])
        self.ns = np.concatenate([self.ns[keep], ns])
        self.created = np.concatenate([self.created[keep], np.full(len(ids), t)])
        self._changed()

    def delete(self, ids):
        keep = ~np.isin(self.ids, np.asarray(ids, np.uint64))
        self.ids, self.X, self.ns, self.created = self.ids[keep], self.X[keep], self.ns[keep], self.created[keep]
        self._changed()

    def scores(self, q, X=None):
        Xd = self.xd() if X is None else X.astype(np.float64)
        qd = q.astype(np.float64)
        if self.metric == IP:
            return Xd @ qd
        if self.metric == COSINE:
            return (Xd @ qd) / (np.linalg.norm(Xd, axis=1) * np.linalg.norm(qd))
        return ((Xd - qd) ** 2).sum(1)

    def tol(self, q):
        xm = self.xmax()
        qm = float(np.linalg.norm(q))
        d = self.dim
        if self.metric == IP:
            return 4e-7 * np.sqrt(d) * xm * qm + 1e-7
        if self.metric == COSINE:
            return 4e-7 * np.sqrt(d) + 1e-7
        return 2e-6 * (xm * xm + qm * qm) + 1e-6


def check(test, ref, q, got, k, mask=None, s=None, tol=None, exact_order=True, **extra):
    gids, gsc = got
    if s is None:
        s = ref.scores(q)
    ids = ref.ids
    if mask is not None:
        s, ids = s[mask], ids[mask]
    tol = ref.tol(q) if tol is None else tol
    key = -s if ref.metric == L2 else s
    kk = min(k, len(ids))
    detail = dict(k=k, n=len(ref.ids), valid=len(ids), got=len(gids), **extra)
    if len(gids) != kk:
        record(test, False, why="count", **detail)
        return 0.0
    if kk == 0:
        record(test, True, **detail)
        return 1.0
    order = np.lexsort((ids, -key))
    topk = order[:kk]
    kth = key[topk[-1]]
    srt = np.argsort(ids)
    loc = np.searchsorted(ids[srt], gids)
    loc = np.minimum(loc, len(ids) - 1)
    found = ids[srt][loc] == gids
    if not found.all():
        record(test, False, why="returned id not in the allowed set", bad=gids[~found][:5].tolist(), **detail)
        return 0.0
    gkey = key[srt][loc]
    gref = s[srt][loc]
    err = float(np.abs(gref - gsc.astype(np.float64)).max())
    must = set(ids[key > kth + tol].tolist())
    gotset = set(gids.tolist())
    recall = len(gotset & set(ids[topk].tolist())) / kk
    ok = True
    why = []
    if (gkey < kth - tol).any():
        ok = False
        why.append("returned a row below the k-th score")
    if not must.issubset(gotset):
        ok = False
        why.append("missed %d rows clearly above the k-th score" % len(must - gotset))
    if err > tol:
        ok = False
        why.append("score error %.3g > tol %.3g" % (err, tol))
    if len(set(gids.tolist())) != len(gids):
        ok = False
        why.append("duplicate ids")
    gk = -gsc if ref.metric == L2 else gsc
    if exact_order:
        bad = (gk[1:] > gk[:-1]) | ((gk[1:] == gk[:-1]) & (gids[1:] < gids[:-1]))
        if bad.any():
            ok = False
            why.append("not sorted best first / ties by lower id")
    record(test, ok, why=";".join(why), recall=recall, max_err=err, tol=tol, **detail)
    return recall


BACKEND = int(os.environ.get("GPUCHECK_BACKEND", str(CUDA)))  # 1 = CPU: runs the checks here, without a GPU


def open_store(dim, metric, dtype=F32, backend=BACKEND, capacity=1 << 22, **kw):
    return Store(lib, name(), dim=dim, metric=metric, dtype=dtype, backend=backend, capacity=capacity, **kw)


def load_rows(st, ref, ids, X, ns=None, batch=None):
    batch = batch or max(1, (3 << 20) // (X.shape[1] * 4 + 16))
    for s in range(0, len(ids), batch):
        st.upsert(ids[s:s + batch], X[s:s + batch], None if ns is None else ns[s:s + batch])
    ref.upsert(ids, X, ns, t=time.time() * 1000)


def suite_exact(metric, n, dim, ks=(1, 10, 100, 1024), mutate=True, nqueries=2, store_kw=None, dtype=F32):
    tag = "exact/%s/n=%d/d=%d" % (["ip", "cos", "l2"][metric], n, dim)
    if store_kw:
        tag += "/" + ",".join("%s=%s" % (k, "all" if v == GPUS_ALL else v) for k, v in sorted(store_kw.items()))
    if dtype != F32:
        tag += "/" + ["f32", "f16", "bf16"][dtype]
    t0 = time.time()
    st = open_store(dim, metric, dtype=dtype, **(store_kw or {}))
    ref = Ref(dim, metric)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    ids = rng.permutation(np.arange(1, 4 * n + 1, dtype=np.uint64))[:n]
    ns = rng.integers(0, 1000, n).astype(np.uint64)
    load_rows(st, ref, ids, X, ns)
    sinfo = st.stats()
    record(tag + "/engine", sinfo.engine == BACKEND, engine=sinfo.engine_name.decode())
    want_shards = (store_kw or {}).get("device_shards", 0)
    if want_shards > 1:
        name_ = sinfo.engine_name.decode()
        record(tag + "/sharded", name_.startswith("shards%dx[" % want_shards) and (BACKEND != CUDA or "[cuda" in name_), engine=name_)

    def queries():
        qs = [rng.standard_normal(dim).astype(np.float32) for _ in range(nqueries)]
        if len(ref.X):
            qs.append(ref.X[rng.integers(0, len(ref.X))].copy())  # a stored row: exact self match
        return qs

    def round_(phase):
        for q in queries():
            s = ref.scores(q)
            for k in ks:
                check("%s/%s/single/k=%d" % (tag, phase, k), ref, q, st.recall(q, k), k, s=s)
            # namespace filters: one namespace (0.1% of rows), and 64 namespaces
            one = [int(ref.ns[0])] if len(ref.ns) else [1]
            check("%s/%s/ns1/k=10" % (tag, phase), ref, q, st.recall(q, 10, namespaces=one), 10,
                  mask=np.isin(ref.ns, one), s=s)
            many = list(range(100, 164))
            check("%s/%s/ns64/k=100" % (tag, phase), ref, q, st.recall(q, 100, namespaces=many), 100,
                  mask=np.isin(ref.ns, many), s=s)
            # 4 namespaces: the most the compact single-query argument carries; 5: one more
            for m in (4, 5):
                first = int(ref.ns[0]) if len(ref.ns) else 1
                few = [first] + [x for x in range(200, 210) if x != first][:m - 1]
                check("%s/%s/ns%d/k=10" % (tag, phase, m), ref, q, st.recall(q, 10, namespaces=few), 10,
                      mask=np.isin(ref.ns, few), s=s)
        nq = 33
        Q = rng.standard_normal((nq, dim)).astype(np.float32)
        for k in (10, 1024 if n <= 300_000 else 100):
            res = st.recall_batch(Q, k)
            for i in range(0, nq, 8):
                check("%s/%s/batch/k=%d" % (tag, phase, k), ref, Q[i], res[i], k)
        if n >= 65_536:
            # a large batch: one filter block per query, which also cuts its own candidate buffer
            Q2 = rng.standard_normal((600, dim)).astype(np.float32)
            for k in (10, 100):
                res = st.recall_batch(Q2, k)
                for i in range(0, len(Q2), 75):
                    check("%s/%s/batch600/k=%d" % (tag, phase, k), ref, Q2[i], res[i], k)
        # batched path under a namespace filter (64 namespaces, ~6% of rows)
        many = list(range(100, 164))
        res = st.recall_batch(Q, 100, namespaces=many)
        for i in range(0, nq, 8):
            check("%s/%s/batch-ns64/k=100" % (tag, phase), ref, Q[i], res[i], 100, mask=np.isin(ref.ns, many))

    round_("fresh")
    if mutate and n >= 2:
        # delete 10%, replace 5%, add 5% new
        dele = rng.choice(ref.ids, size=max(1, len(ref.ids) // 10), replace=False)
        st.delete(dele)
        ref.delete(dele)
        rep = rng.choice(ref.ids, size=max(1, len(ref.ids) // 20), replace=False)
        Xr = rng.standard_normal((len(rep), dim)).astype(np.float32)
        newi = np.arange(10 * n + 1, 10 * n + 1 + max(1, n // 20), dtype=np.uint64)
        Xn = rng.standard_normal((len(newi), dim)).astype(np.float32)
        load_rows(st, ref, rep, Xr, rng.integers(0, 1000, len(rep)).astype(np.uint64))
        load_rows(st, ref, newi, Xn, rng.integers(0, 1000, len(newi)).astype(np.uint64))
        round_("mutated")
    st.close()
    LOG.append(dict(test=tag + "/time", ok=True, seconds=time.time() - t0))


def suite_ties(n=200_000, dim=64, dups=3000, dtype=F32):
    tag = "ties/cos/%s/n=%d" % (["f32", "f16", "bf16"][dtype], n)
    st = open_store(dim, COSINE, dtype=dtype)
    ref = Ref(dim, COSINE)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64) * 7
    load_rows(st, ref, ids, X)
    v = rng.standard_normal(dim).astype(np.float32)
    dup_ids = rng.permutation(np.arange(10_000_000, 10_000_000 + 3 * dups, dtype=np.uint64))[:dups]
    load_rows(st, ref, dup_ids, np.tile(v, (dups, 1)))
    want = np.sort(dup_ids)
    for k in (1, 10, 100, 1024):
        gi, gs = st.recall(v, k)
        ok = len(gi) == k and (gi == want[:k]).all() and (gs == gs[0]).all()
        record("%s/single/k=%d" % (tag, k), ok, first=gi[:5].tolist(), want=want[:5].tolist())
        res = st.recall_batch(np.stack([v, v]), k)
        ok = all(len(r[0]) == k and (r[0] == want[:k]).all() for r in res)
        record("%s/batch/k=%d" % (tag, k), ok, first=res[0][0][:5].tolist())
    # delete the lowest duplicates: the next ones must take their place
    st.delete(want[:50])
    gi, _ = st.recall(v, 100)
    record(tag + "/after-delete", (gi == want[50:150]).all(), first=gi[:5].tolist(), want=want[50:55].tolist())
    st.close()


def suite_expiry_recency(dim=32):
    tag = "lifecycle"
    st = open_store(dim, COSINE)
    ref = Ref(dim, COSINE)
    X = rng.standard_normal((20_000, dim)).astype(np.float32)
    ids = np.arange(1, 20_001, dtype=np.uint64)
    load_rows(st, ref, ids, X)
    q = rng.standard_normal(dim).astype(np.float32)
    near = q[None, :] + 0.01 * rng.standard_normal((100, dim)).astype(np.float32)
    eids = np.arange(900_001, 900_101, dtype=np.uint64)
    st.upsert(eids, near, ttl_ms=300)
    gi, _ = st.recall(q, 10)
    record(tag + "/ttl-before-expiry", np.isin(gi, eids).all(), got=gi[:5].tolist())
    time.sleep(0.6)
    gi, _ = st.recall(q, 10)
    record(tag + "/ttl-after-expiry", not np.isin(gi, eids).any(), got=gi[:5].tolist())
    check(tag + "/ttl-after-expiry-exact", ref, q, (gi, st.recall(q, 10)[1]), 10)
    # recency: a second batch 2 s later; half-life 50 s, w = 0.9. Creation times are stamped by
    # the server; the reference uses the midpoint of each upsert call (error ~1 ms).
    def stamped(idsx, Xx):
        for s in range(0, len(idsx), 1000):
            a = time.time() * 1000
            st.upsert(idsx[s:s + 1000], Xx[s:s + 1000])
            b = time.time() * 1000
            ref.upsert(idsx[s:s + 1000], Xx[s:s + 1000], t=(a + b) / 2)
    stamped(ids, X)
    time.sleep(2.0)
    Y = rng.standard_normal((20_000, dim)).astype(np.float32)
    yids = np.arange(100_001, 120_001, dtype=np.uint64)
    stamped(yids, Y)
    w, hl = 0.9, 50000.0
    for k in (10, 100):
        qq = rng.standard_normal(dim).astype(np.float32)
        s = ref.scores(qq)
        now = time.time() * 1000
        boost = np.exp2(-np.maximum(0, now - ref.created) / hl)
        sr = (1 - w) * s + w * boost
        got = st.recall(qq, k, recency=(w, hl))
        check("%s/recency/k=%d" % (tag, k), ref, qq, got, k, s=sr, tol=2e-3, exact_order=True)
        got = st.recall_batch(np.stack([qq, qq]), k, recency=(w, hl))[1]
        check("%s/recency-batch/k=%d" % (tag, k), ref, qq, got, k, s=sr, tol=2e-3)
    st.close()


def suite_lowp(dtype, n=200_000, dim=768, nq=100):
    tag = "lowp/%s/n=%d/d=%d" % (["f32", "f16", "bf16"][dtype], n, dim)
    st = open_store(dim, COSINE, dtype=dtype)
    ref = Ref(dim, COSINE)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    load_rows(st, ref, ids, X)
    Xn = ref.X.astype(np.float64)
    Xn /= np.linalg.norm(Xn, axis=1, keepdims=True)
    out = {}
    for kind in ("random", "near-row"):
        rec, errs, brec, berrs = [], [], [], []
        Q = rng.standard_normal((nq, dim)).astype(np.float32)
        if kind == "near-row":
            Q = ref.X[rng.integers(0, n, nq)] + 0.8 * rng.standard_normal((nq, dim)).astype(np.float32)
        S = (Xn @ (Q.astype(np.float64) / np.linalg.norm(Q, axis=1, keepdims=True)).T).T
        bres = st.recall_batch(Q, 10)
        for i in range(nq):
            top = np.argsort(-S[i], kind="stable")[:10]
            gi, gs = st.recall(Q[i], 10)
            rec.append(len(set(gi.tolist()) & set(ids[top].tolist())) / 10)
            errs.append(float(np.abs(S[i][gi.astype(np.int64) - 1] - gs).max()))
            brec.append(len(set(bres[i][0].tolist()) & set(ids[top].tolist())) / 10)
            berrs.append(float(np.abs(S[i][bres[i][0].astype(np.int64) - 1] - bres[i][1]).max()))
        out[kind] = dict(recall10=float(np.mean(rec)), batch_recall10=float(np.mean(brec)), max_score_err=float(np.max(errs)),
                         p99_score_err=float(np.quantile(errs, 0.99)), batch_max_score_err=float(np.max(berrs)))
    tol = {F32: 1e-5, F16: 2e-3, BF16: 1.6e-2}[dtype]
    # A GPU failure would be answered by the CPU engine (exact f32): the bars would pass without
    # testing the GPU at all, so the store must still be on it.
    sts = st.stats()
    out["engine"], out["engine_fallbacks"] = sts.engine_name.decode(), int(sts.engine_fallbacks)
    gpu_ok = on_gpu(sts)
    ok = gpu_ok and all(v["recall10"] >= 0.99 and v["batch_recall10"] >= 0.99 and v["max_score_err"] <= tol and v["batch_max_score_err"] <= tol
                        for v in out.values() if isinstance(v, dict))
    record(tag, ok, tol=tol, **out)
    print("INFO", tag, json.dumps(out), flush=True)
    st.close()
    return out


def as_stored(X, dtype):
    """X rounded to the storage type (so the float64 reference scores exactly what is stored)."""
    if dtype == F16:
        return X.astype(np.float16).astype(np.float32)
    if dtype == BF16:
        u = X.astype(np.float32).view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.astype(np.uint32).view(np.float32)
    return X


MULTI_MAXQ = int(os.environ.get("KALOS_MULTI_MAXQ", "16"))  # the engine's cap on a multi-query pass


def suite_multi(dtype, metric, n=150_000, dim=768):
    """Batches of 2..32 queries on f16 / bf16 storage: the multi-query pass (one scan for all the
    queries, tensor-core scoring, per-query candidates), against the float64 reference of the
    stored values: every k it takes (up to 128) and one past it, a namespace filter, exact
    duplicate rows (ties by the lower id), a dimension that is not a multiple of 32, deletes."""
    tag = "multi/%s/%s/n=%d/d=%d" % (["f32", "f16", "bf16"][dtype], ["ip", "cos", "l2"][metric], n, dim)
    st = open_store(dim, metric, dtype=dtype)
    ref = Ref(dim, metric)
    X = as_stored(rng.standard_normal((n, dim)).astype(np.float32), dtype)
    X[n - 300:] = X[:300]  # duplicates: equal scores, ranked by the lower id
    ids = rng.permutation(np.arange(1, 4 * n, dtype=np.uint64))[:n]
    ns = rng.integers(0, 5, n).astype(np.uint64)
    load_rows(st, ref, ids, X, ns)
    # The query is split into two parts of the storage type: scores carry about 22 (f16) or 16
    # (bf16) bits of the query, not f32's 24.
    slack = {F16: 2.0, BF16: 8.0}[dtype]
    xm = ref.xmax()
    for step in range(2):
        for nq in (2, 8, 9, 17, 32):
            Q = rng.standard_normal((nq, dim)).astype(np.float32)
            Q[0] = ref.X[rng.integers(0, len(ref.X))]  # a stored row (its duplicates tie)
            S = [ref.scores(q) for q in Q]
            for k in (1, 10, 128, 129):
                res = st.recall_batch(Q, k)
                for i in range(nq):
                    # Past the pass (k > 128, or more queries than KALOS_MULTI_MAXQ) the batch
                    # path answers, at the lowp suite's bars.
                    tol = slack * ref.tol(Q[i]) if k <= 128 and nq <= MULTI_MAXQ else lowp_tol(dtype, xm, Q[i])
                    check("%s/step=%d/nq=%d/k=%d/q=%d" % (tag, step, nq, k, i), ref, Q[i], res[i], k, s=S[i], tol=tol)
            res = st.recall_batch(Q, 10, namespaces=[1, 3])
            mask = np.isin(ref.ns, [1, 3])
            for i in range(nq):
                tol = slack * ref.tol(Q[i]) if nq <= MULTI_MAXQ else lowp_tol(dtype, xm, Q[i])
                check("%s/step=%d/nq=%d/ns/q=%d" % (tag, step, nq, i), ref, Q[i], res[i], 10, mask=mask, s=S[i], tol=tol)
        gone = ref.ids[rng.choice(len(ref.ids), 5000, replace=False)]
        st.delete(gone)
        ref.delete(gone)
    sts = st.stats()
    record(tag + "/on-gpu", on_gpu(sts), engine=sts.engine_name.decode())
    st.close()


def suite_score16(n=100_000, dim=256, nq=64):
    """f16 score tiles (the default for f16 storage with ip/cosine, no recency, k <= 256): the
    batch must give the answers of f32 tiles, i.e. the float64 ranking of the stored table (the
    queries are exact in f16, as the GEMM takes them), on
    - ordinary data (every query whose 10th and 11th scores are not within f32 noise: exact set
      and order),
    - a tie group: 15 rows whose scores differ by 2^-12 but round to the same f16 score, the
      highest scores on the highest ids (a cut by id, as f32 scores allow, would keep the wrong
      10),
    - a tie group of 200 such rows (more than a cut keeps: the batch is answered again from f32
      tiles),
    - vectors whose products overflow the f16 range (answered again from f32 tiles).
    The store must stay on the GPU with no fallback."""
    def f16(a):
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

    def finish(tag, st, ok, **out):
        sts = st.stats()
        out.update(engine=sts.engine_name.decode(), engine_fallbacks=int(sts.engine_fallbacks))
        ok = ok and on_gpu(sts)
        record("score16/%s/n=%d/d=%d" % (tag, n, dim), ok, **out)
        print("INFO score16", tag, json.dumps(out, default=str)[:600], flush=True)
        st.close()

    for scale, tag in ((1.0, "normal"), (300.0, "overflow")):
        st = open_store(dim, IP, dtype=F16)
        ref = Ref(dim, IP)
        X = f16(rng.standard_normal((n, dim)) * scale)
        ids = np.arange(1, n + 1, dtype=np.uint64)
        load_rows(st, ref, ids, X)
        # Queries exact in f16: the GEMM's f16 query is then the query itself, on either engine.
        Q = f16(rng.standard_normal((nq, dim)) * scale)
        S = Q.astype(np.float64) @ X.astype(np.float64).T
        res = st.recall_batch(Q, 10)
        checked, bad, rel = 0, [], []
        for i in range(nq):
            order = np.argsort(-S[i], kind="stable")
            s10, s11 = S[i][order[9]], S[i][order[10]]
            gi, gs = res[i]
            rel.append(float(np.abs(S[i][gi.astype(np.int64) - 1] - gs).max() / abs(S[i][order[0]])))
            if s10 - s11 <= 1e-5 * abs(S[i][order[0]]):
                continue  # 10th and 11th within f32 noise of each other: either may be returned
            checked += 1
            if not (gi == ids[order[:10]]).all():
                bad.append(i)
        finish(tag, st, checked >= nq // 2 and not bad and max(rel) <= 1e-5, checked=checked, wrong_queries=bad[:5],
               max_rel_score_err=max(rel))

    for group, step, x0 in ((15, 2.0 ** -12, 0.25), (200, 2.0 ** -16, 2.0 ** -6)):
        tag = "ties%d" % group
        st = open_store(dim, IP, dtype=F16)
        ref = Ref(dim, IP)
        X = f16(rng.standard_normal((n, dim)) * 0.01)
        ids = np.arange(1, n + 1, dtype=np.uint64)
        # The group: x[0] = x0 + j * step (exact in f16), x[1] = 0.25, the rest 0; with q[0] = 1 and
        # q[1] = 32 the score is 8 + x0 + j * step, every one rounding to the same f16 score.
        G = np.zeros((group, dim), np.float32)
        G[:, 0] = x0 + np.arange(group) * step
        G[:, 1] = 0.25
        assert (f16(G) == G).all()
        at = int(rng.integers(0, n - group))
        X[at:at + group] = G
        gids = ids[at:at + group]
        load_rows(st, ref, ids, X)
        q = f16(rng.standard_normal(dim))
        q[0], q[1] = 1.0, 32.0
        Q = np.stack([q, f16(rng.standard_normal(dim)), q, f16(rng.standard_normal(dim))])
        res = st.recall_batch(Q, 10)
        want = gids[::-1][:10]  # highest scores first: the highest ids of the group
        wants = 8.0 + x0 + (group - 1 - np.arange(10)) * step
        ok = all((res[i][0] == want).all() and np.allclose(res[i][1], wants, rtol=0, atol=1e-6) for i in (0, 2))
        finish(tag, st, ok, got=res[0][0].tolist(), want=want.tolist(), scores=res[0][1].tolist())


def engine_report(st):
    """Closes the store and returns what its CUDA engine printed on stderr (KALOS_CUDA_REPORT)."""
    import tempfile
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            st.close()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    sys.stderr.write(text)
    return text


def suite_gated(n=400_000, dim=96, nq=1024):
    """Gated tiles (kernels/batch.cu, "Gated tiles"): a 1024-query batch on an f16 ip table of
    several score tiles, with no filter, scores every tile after the first with a cuBLASLt GEMM
    whose epilogue zeroes the rows below each query's bound, and collects the rest. It must give
    the float64 ranking of the stored table (queries exact in f16, as the GEMM takes them) for k
    1, 10, 100, 256, also after deletes and upserts; rows whose scores rise along the table (the
    first tile's bounds are low, the candidate buffers overflow: answered again from f32 tiles)
    and fall along it; and under a namespace filter (not gated). The engine report must count
    the gated batches, with the store on the GPU and no fallback. Also a cosine f16 store: its
    large batches stay in the client's slot and are normalised on the device (an all-zero query
    is an INVALID_ARGUMENT that leaves the server serving)."""
    def f16(a):
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

    st = open_store(dim, IP, dtype=F16)
    ref = Ref(dim, IP)
    X = f16(rng.standard_normal((n, dim)) * 0.3)
    ids = rng.permutation(np.arange(1, 4 * n + 1, dtype=np.uint64))[:n]
    ns = rng.integers(0, 50, n).astype(np.uint64)
    load_rows(st, ref, ids, X, ns)
    want_gated = 0
    for phase in ("fresh", "mutated"):
        if phase == "mutated":
            gone = rng.choice(ref.ids, 20_000, replace=False)
            st.delete(gone)
            ref.delete(gone)
            new_ids = np.arange(4 * n + 1, 4 * n + 30_001, dtype=np.uint64)
            load_rows(st, ref, new_ids, f16(rng.standard_normal((30_000, dim)) * 0.3), rng.integers(0, 50, 30_000).astype(np.uint64))
        Q = f16(rng.standard_normal((nq, dim)))
        for k in (1, 10, 100, 256):
            res = st.recall_batch(Q, k)
            want_gated += 1
            for i in rng.choice(nq, 24, replace=False):
                check("gated/%s/batch%d/k=%d/q%d" % (phase, nq, k, i), ref, Q[i], res[i], k)
    # a non-finite value: the request's NON_FINITE (the client library refuses it before the
    # server sees it; tests/protocol.rs sends one raw), and the next batch is gated as before
    Qn = Q.copy()
    Qn[100, 5] = np.nan
    try:
        st.recall_batch(Qn, 10)
        record("gated/nan-query", False, why="no error")
    except KalosError as e:
        record("gated/nan-query", e.status == 5, error=str(e)[:200])
    res = st.recall_batch(Q, 10)
    want_gated += 1
    for i in rng.choice(nq, 4, replace=False):
        check("gated/after-nan/k=10/q%d" % i, ref, Q[i], res[i], 10)
    # not gated: a namespace filter
    res = st.recall_batch(Q, 10, namespaces=[3, 7])
    for i in rng.choice(nq, 8, replace=False):
        check("gated/ns-filter/k=10/q%d" % i, ref, Q[i], res[i], 10, mask=np.isin(ref.ns, [3, 7]))
    sts = st.stats()
    gpu = on_gpu(sts)
    rep = engine_report(st)
    m = re.search(r"(\d+) gated batch", rep)
    got = int(m.group(1)) if m else -1
    record("gated/random/engine", gpu and (BACKEND != CUDA or (got == want_gated and "gating off" not in rep)), engine=sts.engine_name.decode(),
           gated_batches=got, want=want_gated, report=[l for l in rep.splitlines() if "gated" in l][:2])

    # tiny scores (f16 subnormal outputs near the bound): gated or answered from f32 tiles, the
    # answers must be exact
    st = open_store(dim, IP, dtype=F16)
    ref = Ref(dim, IP)
    Xt = f16(rng.standard_normal((n, dim)) * 3e-4)
    load_rows(st, ref, np.arange(1, n + 1, dtype=np.uint64), Xt)
    Qt = f16(rng.standard_normal((nq, dim)) * 1e-3)
    res = st.recall_batch(Qt, 10)
    for i in rng.choice(nq, 16, replace=False):
        check("gated/tiny/k=10/q%d" % i, ref, Qt[i], res[i], 10)
    rep = engine_report(st)
    record("gated/tiny/engine", True, report=[l for l in rep.splitlines() if "gated" in l][:2])

    # cosine: the server leaves large batches in the slot and the engine normalises them on the
    # device (check_queries / convert_queries), gated as well. Reference: the rows as stored
    # (normalised as the server does, f64 norm and one f32 factor, then f16) against the query
    # the GEMM takes (normalised the same way, then f16).
    def unit16(A):
        inv = (1.0 / np.sqrt((A.astype(np.float64) ** 2).sum(1))).astype(np.float32)
        u = A.astype(np.float32) * inv[:, None]
        # The CPU engine (GPUCHECK_BACKEND=1) keeps and scores f32 rows and queries.
        return f16(u) if BACKEND == CUDA else u

    st = open_store(dim, COSINE, dtype=F16)
    ref = Ref(dim, IP)
    Xc = rng.standard_normal((n, dim)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    b = (3 << 20) // (dim * 4 + 16)
    for s0 in range(0, n, b):
        st.upsert(ids[s0:s0 + b], Xc[s0:s0 + b])
    ref.upsert(ids, unit16(Xc))
    Qc = (rng.standard_normal((nq, dim)) * rng.uniform(0.1, 10.0, (nq, 1))).astype(np.float32)
    Q16 = unit16(Qc)
    res = st.recall_batch(Qc, 10)
    for i in rng.choice(nq, 24, replace=False):
        check("gated/cosine-slot/k=10/q%d" % i, ref, Q16[i], res[i], 10)
    Qz = Qc.copy()
    Qz[333] = 0.0
    try:
        st.recall_batch(Qz, 10)
        record("gated/cosine-slot/zero-query", False, why="no error")
    except KalosError as e:
        record("gated/cosine-slot/zero-query", e.status == 1 and "all zeros" in str(e), error=str(e)[:200])
    res2 = st.recall_batch(Qc, 10)  # still serving, same answers
    record("gated/cosine-slot/after-error", all((a[0] == b[0]).all() for a, b in zip(res, res2)))
    sts = st.stats()
    gpu = on_gpu(sts)
    rep = engine_report(st)
    m = re.search(r"(\d+) batch\(es\) copied to the device from the client's slot", rep)
    record("gated/cosine-slot/engine", gpu and (BACKEND != CUDA or (m is not None and int(m.group(1)) >= 3)), engine=sts.engine_name.decode(),
           report=[l for l in rep.splitlines() if "slot" in l][:2])

    # rising and falling scores along the table (as suite_cruise)
    st = open_store(dim, IP, dtype=F16)
    ref = Ref(dim, IP)
    v = rng.standard_normal(dim)
    v /= np.linalg.norm(v)
    N = rng.standard_normal((n, dim))
    N -= np.outer(N @ v, v)
    N *= 0.5 / np.linalg.norm(N, axis=1, keepdims=True)
    X = f16(N + np.outer(4.0 * np.arange(n) / n, v))
    ids = rng.permutation(np.arange(1, 2 * n + 1, dtype=np.uint64))[:n]
    load_rows(st, ref, ids, X)
    R = f16(rng.standard_normal((nq, dim)))
    for tag, qv in (("rising", 4.0 * v), ("falling", -4.0 * v)):
        Q = R.copy()
        Q[::64] = f16(qv)
        res = st.recall_batch(Q, 10)
        for i in list(range(0, nq, 256)) + list(rng.choice(nq, 8, replace=False)):
            check("gated/%s/k=10/q%d" % (tag, i), ref, Q[i], res[i], 10)
    sts = st.stats()
    gpu = on_gpu(sts)
    rep = engine_report(st)
    record("gated/ordered/engine", gpu, engine=sts.engine_name.decode(), report=[l for l in rep.splitlines() if "gated" in l][:2])


def suite_cruise(n=300_000, dim=64):
    """The batch filter's cruise segments (kernels/batch.cu, batch_filter_body: several steps with
    no barrier once a query's bound is known). Rows whose scores rise strictly along the table
    make nearly every row pass the bound, so a segment's survivors outgrow its free slots and it
    is redone step by step; scores falling along the table make every segment reject all rows.
    Both, and random queries, must give the float64 ranking (f32 and f16 storage, ip and l2), with
    the store on the GPU and no fallback."""
    for dtype, metric in ((F32, IP), (F16, IP), (F32, L2)):
        tag = "cruise/%s/%s" % (["f32", "f16", "bf16"][dtype], ["ip", "cos", "l2"][metric])
        st = open_store(dim, metric, dtype=dtype)
        ref = Ref(dim, metric)
        v = rng.standard_normal(dim)
        v /= np.linalg.norm(v)
        N = rng.standard_normal((n, dim))
        N -= np.outer(N @ v, v)  # noise orthogonal to v: no effect on the score against v
        N *= 0.5 / np.linalg.norm(N, axis=1, keepdims=True)  # constant norm: none on l2 either
        X = (N + np.outer(4.0 * np.arange(n) / n, v)).astype(np.float32)
        if dtype == F16:
            X = X.astype(np.float16).astype(np.float32)
        ids = rng.permutation(np.arange(1, 2 * n + 1, dtype=np.uint64))[:n]  # row order is not id order
        load_rows(st, ref, ids, X)
        qv = (8.0 if metric == L2 else 4.0) * v
        Q = np.stack([qv, -qv, qv + 0.01 * rng.standard_normal(dim)] + [rng.standard_normal(dim) for _ in range(5)])
        Q = Q.astype(np.float32)
        if dtype == F16:
            Q = Q.astype(np.float16).astype(np.float32)  # exact in f16, as the GEMM takes them
        for k in (10, 100):
            res = st.recall_batch(Q, k)
            for i in range(len(Q)):
                check("%s/batch/k=%d/q%d" % (tag, k, i), ref, Q[i], res[i], k)
        sts = st.stats()
        record(tag + "/engine", on_gpu(sts),
               engine=sts.engine_name.decode(), fallbacks=int(sts.engine_fallbacks))
        st.close()


def suite_oom():
    dim = 128
    st = open_store(dim, IP, gpu_memory_bytes=4 << 20)
    X = rng.standard_normal((20_000, dim)).astype(np.float32)
    last_ok = 0
    status = None
    for s in range(0, 20_000, 1000):
        try:
            st.upsert(np.arange(s + 1, s + 1001, dtype=np.uint64), X[s:s + 1000])
            last_ok = s + 1000
        except KalosError as e:
            status = e.status
            break
    cnt = st.stats().count
    gi, _ = st.recall(X[0], 5)
    record("oom/store-full", status == STORE_FULL and cnt == last_ok and st.stats().engine == CUDA and len(gi) == 5,
           status=status, count=cnt, loaded=last_ok)
    st.close()


FAULT_CHILD = r'''
import os, sys, numpy as np
sys.path.insert(0, %r)
from kalos_ct import *
lib = load()
st = Store(lib, "gpufault-%%d" %% os.getpid(), dim=16, metric=IP, backend=%d, device_shards=%d)
X = np.random.default_rng(1).standard_normal((5000, 16)).astype(np.float32)
st.upsert(np.arange(1, 5001, dtype=np.uint64), X)
a = st.recall(X[3], 5)
b = st.recall(X[3], 5)
s = st.stats()
print("RESULT", s.engine, s.engine_fallbacks, s.engine_name.decode(), int(a[0][0]), int(b[0][0]), len(b[0]), flush=True)
print("REASON", s.fallback_reason.decode(), flush=True)
st.close()
print("CLOSED", flush=True)
'''


def fault_child(backend, shards=0, **env_set):
    """Runs FAULT_CHILD (a store of 5000 rows, two recalls of row 3, stats, close) in a fresh
    process under faulthandler with the environment changed by `env_set` (None removes a
    variable). Returns (RESULT fields or [], REASON line, completed process): the fields are
    engine, fallbacks, engine name, the two recalls' first ids and the second's length."""
    code = FAULT_CHILD % (os.path.dirname(os.path.abspath(__file__)), backend, shards)
    env = dict(os.environ)
    for k, v in env_set.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    line = [l for l in r.stdout.splitlines() if l.startswith("RESULT")]
    reason = [l for l in r.stdout.splitlines() if l.startswith("REASON")]
    return (line[0].split()[1:] if line else []), (reason[0] if reason else ""), r


def suite_fault_and_auto():
    # Injected CUDA fault: the request still succeeds (CPU fallback) and stats say so.
    f, reason, r = fault_child(CUDA, KALOS_CUDA_FAULT_AFTER="1")
    ok = bool(f) and f[0] == "1" and f[1] == "1" and f[3] == f[4]
    record("fault/cpu-fallback", ok, rc=r.returncode, out=r.stdout[-500:], err=r.stderr[-800:])
    record("fault/fallback-reason", "injected fault" in reason, out=r.stdout[-500:])
    # A GPU engine that cannot start under auto (dimension beyond the kernels' limit): the CPU
    # serves and stats say why.
    st = open_store(9000, IP, backend=AUTO, capacity=1024)
    s = st.stats()
    record("auto/fallback-reason", s.engine == 1 and b"dim <= 8192" in s.fallback_reason, reason=s.fallback_reason.decode())
    st.close()
    # Auto: tiny table answered on the CPU, large on the GPU; KALOS_BACKEND=cpu forces the CPU.
    st = open_store(64, IP, backend=AUTO)
    X = rng.standard_normal((100, 64)).astype(np.float32)
    st.upsert(np.arange(1, 101, dtype=np.uint64), X)
    st.recall(X[0], 5)
    n1 = st.stats().engine_name.decode()
    Y = rng.standard_normal((50_000, 64)).astype(np.float32)
    for s in range(0, 50_000, 10_000):
        st.upsert(np.arange(1000 + s, 1000 + s + 10_000, dtype=np.uint64), Y[s:s + 10_000])
    st.recall(X[0], 5)
    n2 = st.stats().engine_name.decode()
    record("auto/cost-model", "last:cpu" in n1 and "last:gpu" in n2, small=n1, large=n2)
    st.close()
    f, _, r = fault_child(AUTO, KALOS_BACKEND="cpu", KALOS_CUDA_FAULT_AFTER=None)
    record("env/KALOS_BACKEND=cpu", bool(f) and f[0] == "1", out=r.stdout[-300:], err=r.stderr[-300:])


def gpu_count():
    """CUDA devices on this host (0 without a driver)."""
    try:
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        if cu.cuInit(0) != 0 or cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
        return n.value
    except OSError:
        return 0


def suite_shards():
    """Device shards: several shards on one GPU, every GPU of the host, placement by namespace;
    every answer against the float64 reference (suite_exact), f16 storage against the unsharded
    store; a device that does not exist; a shard whose GPU search fails (the store falls back to
    the CPU engine and still answers exactly)."""
    ndev = gpu_count() if BACKEND == CUDA else 0
    suite_exact(IP, 65_537, 128, store_kw=dict(device_shards=3))
    suite_exact(L2, 300_000, 64, nqueries=1, store_kw=dict(device_shards=2, placement=PLACEMENT_NAMESPACE))
    suite_exact(COSINE, 200_000, 96, nqueries=1, store_kw=dict(gpus=GPUS_ALL, device_shards=max(2, ndev)))
    # f16 storage: the sharded store answers as the unsharded one does, query for query.
    n, dim = 300_000, 256
    X = rng.standard_normal((n, dim)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    one = open_store(dim, IP, dtype=F16)
    two = open_store(dim, IP, dtype=F16, device_shards=max(2, ndev), gpus=GPUS_ALL)
    for st in (one, two):
        for s0 in range(0, n, 8192):
            st.upsert(ids[s0:s0 + 8192], X[s0:s0 + 8192])
    Q = rng.standard_normal((1024, dim)).astype(np.float32)
    same = 0
    for q in Q[:20]:
        a, b = one.recall(q, 10), two.recall(q, 10)
        same += int(np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], rtol=1e-6, atol=1e-6))
    record("shards/f16/single-equal-unsharded", same == 20, same=same, of=20)
    ra, rb = one.recall_batch(Q, 10), two.recall_batch(Q, 10)
    overlap = np.mean([len(set(x[0].tolist()) & set(y[0].tolist())) / 10 for x, y in zip(ra, rb)])
    scores_close = all(np.allclose(np.sort(x[1]), np.sort(y[1]), rtol=2e-3, atol=2e-3) for x, y in zip(ra, rb))
    record("shards/f16/batch1024-equal-unsharded", overlap >= 0.999 and scores_close, overlap=float(overlap))
    one.close()
    two.close()
    # A device the host lacks.
    if BACKEND == CUDA:
        try:
            open_store(16, IP, gpus=1 << max(ndev, 1) | 1, capacity=1024).close()
            record("shards/missing-device", False, why="opened")
        except KalosError as e:
            record("shards/missing-device", e.status == INVALID_ARGUMENT, status=e.status, msg=str(e))
    # Injected fault on the shards' GPU searches: the store falls back to the CPU engine.
    if BACKEND == CUDA:
        for attempt in range(3):
            f, _, r = fault_child(CUDA, shards=3, KALOS_CUDA_FAULT_AFTER="1")
            ok = bool(f) and f[0] == "1" and f[1] == "1" and f[3] == f[4] and f[5] == "5"
            ok = ok and r.returncode == 0 and "CLOSED" in r.stdout
            record("shards/fault/cpu-fallback/%d" % attempt, ok, rc=r.returncode, out=r.stdout[-500:], err=r.stderr[-3000:])


def _filters_module():
    """bindings/python/kalos/filters.py (pure Python), from the staged .gpu/python or the repo."""
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "python", "kalos", "filters.py"), os.path.join(here, "..", "..", "bindings", "python", "kalos", "filters.py")):
        if os.path.isfile(p):
            spec = importlib.util.spec_from_file_location("kalos_filters", p)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            return m
    raise FileNotFoundError("kalos/filters.py")


def suite_filter(n=200_000, dim=64, nexpr=60, dtype=F32, metrics=(IP, COSINE, L2)):
    """Metadata filters on a store of the engine under test (docs/GPU.md, "Metadata filters"):
    random expressions from 50% of rows down to one row, single queries and batches, against
    a numpy mask of the same expression. The scans skip the rows the mask leaves out; f16
    storage takes the wide-row layout of the single-query scan and, for the batches of 4, the
    multi-query pass."""
    F = _filters_module()
    users = np.array(["u%d" % i for i in range(100)])
    for metric in metrics:
        tag = "filter/%s/n=%d/d=%d" % (["ip", "cos", "l2"][metric], n, dim)
        if dtype != F32:
            tag += "/" + ["f32", "f16", "bf16"][dtype]
        st = open_store(dim, metric, dtype=dtype)
        ref = Ref(dim, metric)
        X = as_stored(rng.standard_normal((n, dim)).astype(np.float32), dtype)
        ids = rng.permutation(np.arange(1, 4 * n + 1, dtype=np.uint64))[:n]
        u = rng.integers(0, 100, n)
        num = rng.integers(0, 10_000, n)
        flag = rng.random(n) < 0.5
        batch = 20_000
        for s0 in range(0, n, batch):
            sl = slice(s0, s0 + batch)
            metas = [{"user": users[a], "n": int(b), "flag": bool(c), "doc": int(d)} for a, b, c, d in zip(u[sl], num[sl], flag[sl], ids[sl])]
            st.upsert(ids[sl], X[sl], fields=F.encode_fields(metas))
        ref.upsert(ids, X, t=time.time() * 1000)
        cases = [
            ("50%", F.eq("flag", True), flag),
            ("10%", F.lt("n", 1000), num < 1000),
            ("1%", F.eq("user", "u7"), u == 7),
            ("1%-and", F.eq("user", "u7") & F.gte("n", 5000), (u == 7) & (num >= 5000)),
            ("0.01%", F.lt("n", 1), num < 1),
            ("one", F.eq("doc", int(ids[n // 2])), ids == ids[n // 2]),
            ("or-not", F.in_("user", ["u1", "u2"]) | ~F.eq("flag", True), np.isin(u, [1, 2]) | ~flag),
            # Programs past the by-value launch parameters (FPROG_MAX bytes): uploaded first.
            ("in-60-users", F.in_("user", [str(x) for x in users[:60]]), u < 60),
            ("in-40-docs", F.in_("doc", [int(x) for x in ids[:40]]), np.isin(ids, ids[:40])),
        ]
        for _ in range(nexpr):
            a, b = rng.integers(0, 10_000, 2)
            lo, hi = min(a, b), max(a, b)
            cases.append(("range", F.gte("n", int(lo)) & F.lt("n", int(hi)), (num >= lo) & (num < hi)))
        tol = (lambda q: None) if dtype == F32 else (lambda q: lowp_tol(dtype, ref.xmax(), q))
        for cname, expr, mask in cases:
            fb = expr.encode()
            q = rng.standard_normal(dim).astype(np.float32)
            for k in (1, 10, 100, 1024):
                check("%s/%s/single/k=%d" % (tag, cname, k), ref, q, st.recall(q, k, filter=fb), k, mask=mask, tol=tol(q))
            qs = rng.standard_normal((4, dim)).astype(np.float32)
            for qi, got in enumerate(st.recall_batch(qs, 10, filter=fb)):
                check("%s/%s/batch/q%d" % (tag, cname, qi), ref, qs[qi], got, 10, mask=mask, tol=tol(qs[qi]))
        sts = st.stats()
        record(tag + "/on-gpu", on_gpu(sts), engine=sts.engine_name.decode())
        st.close()


def suite_filter_drift(n=300_000, dim=16):
    """One filter asked again and again while its count changes under it (docs/GPU.md, "Metadata
    filters": a single query with a filter seen before is planned from the filter's last count,
    without waiting for the new one). Each step rewrites the field so the filter matches m rows:
    sparse (m <= n / 1000) to more rows than the compact table guessed for (scanned again with
    the mask), to dense, back to sparse, to none, to one. Every answer must be exact."""
    F = _filters_module()
    st = open_store(dim, IP)
    ref = Ref(dim, IP)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    val = np.zeros(n, dtype=np.int64)

    def put(rows):
        for s0 in range(0, len(rows), 20_000):
            r = rows[s0:s0 + 20_000]
            st.upsert(ids[r], X[r], fields=F.encode_fields([{"v": int(val[i])} for i in r]))

    put(np.arange(n))
    ref.upsert(ids, X)
    fb = F.eq("v", 1).encode()
    steps = [("sparse", 100), ("sparse", 100), ("past-compact", 290), ("past-compact", 290), ("dense", 30_000),
             ("dense", 30_000), ("sparse-after-dense", 5), ("none", 0), ("sparse-again", 200), ("one", 1),
             ("dense-after-one", 3_000)]
    for si, (sname, m) in enumerate(steps):
        new = np.zeros(n, dtype=np.int64)
        new[rng.choice(n, m, replace=False)] = 1
        changed = np.nonzero(new != val)[0]
        val = new
        if len(changed):
            put(changed)
        for k in (1, 10, 100):
            for rep in range(3):
                q = rng.standard_normal(dim).astype(np.float32)
                check("filter-drift/%d-%s/m=%d/k=%d/r%d" % (si, sname, m, k, rep), ref, q, st.recall(q, k, filter=fb), k, mask=val == 1)
    st.close()


def suite_int8(n=100_000, nq=8):
    """The int8 scan (scan = "int8"): the GPU's answers against the CPU engine's int8 scan of the
    same rows (the same candidates, re-ranked by the same code: identical ids and scores), and
    against the float64 reference whenever the server counted the answer certain (the k-th
    exact score clears the 8-bit error bound of every row left out: provably the exact top-k).
    Upserts and deletes between queries keep the device codes in step; namespaces, a metadata
    filter (the scan's mask) and k above the int8 kernel's reach (R > 1024: the GPU's exact scan
    answers, checked against the stored f16 / f32 values).

    With the 4-bit first pass (KALOS_INT8_NIBBLE=<count> in the environment: dimensions up to
    1024 and R below the count), the candidates come from another selection than the CPU engine's, so a query
    that took it is checked for exact scores (every id the CPU engine also returned carries the
    same score, ids distinct and ranked by score), for the exact answer when the server counted
    it certain, and, over all of them, for recall@k against the exact answer and agreement with
    the CPU engine."""
    F = _filters_module()
    nib_count = int(os.environ.get("KALOS_INT8_NIBBLE", "0"))
    for metric, dim, dtype in ((IP, 768, F16), (COSINE, 96, F32), (L2, 200, F16), (COSINE, 1536, F16)):
        tag = "int8/%s/%s/d=%d" % (["ip", "cos", "l2"][metric], ["f32", "f16", "bf16"][dtype], dim)
        st = open_store(dim, metric, dtype=dtype, scan=1)
        cpu = open_store(dim, metric, dtype=dtype, scan=1, backend=CPU)
        ref = Ref(dim, metric)
        m = n if dim < 1000 else n // 4
        # Clustered rows (near-duplicates are where an 8-bit score ranks a neighbour wrongly).
        C = rng.standard_normal((m // 50, dim)).astype(np.float32)
        X = C[rng.integers(0, len(C), m)] + 0.3 * rng.standard_normal((m, dim)).astype(np.float32)
        ids = rng.permutation(np.arange(1, 3 * m + 1, dtype=np.uint64))[:m]
        ns = rng.integers(1, 5, m).astype(np.uint64)
        num = rng.integers(0, 1000, m)
        batch = max(1, (3 << 20) // (dim * 4 + 64))
        for s0 in range(0, m, batch):
            sl = slice(s0, s0 + batch)
            fb = F.encode_fields([{"n": int(v)} for v in num[sl]])
            st.upsert(ids[sl], X[sl], ns[sl], fields=fb)
            cpu.upsert(ids[sl], X[sl], ns[sl], fields=fb)
        ref.upsert(ids, X, ns, t=time.time() * 1000)
        sts = st.stats()
        name = sts.engine_name.decode()
        record(tag + "/engine", sts.engine == CUDA and ("int8" in name) == (dim <= 1536), engine=name)
        certain = uncertain = 0
        nib_same = nib_total = 0
        nib_recall = []
        for round_ in range(3):
            for qi in range(nq):
                q = (X[rng.integers(0, m)] + 0.5 * rng.standard_normal(dim)).astype(np.float32)
                for k, nsf, filt, mask in ((10, None, None, None), (1, None, None, None), (100, None, None, None),
                                           (10, [2, 3], None, np.isin(ref.ns, [2, 3])),
                                           (10, None, F.lt("n", 100), None), (1024, None, None, None)):
                    fbytes = None if filt is None else filt.encode()
                    if filt is not None:
                        order = np.argsort(ids)
                        mask = num[order][np.searchsorted(ids[order], ref.ids)] < 100
                    before = st.stats()
                    got = st.recall(q, k, namespaces=nsf, filter=fbytes)
                    after = st.stats()
                    want = cpu.recall(q, k, namespaces=nsf, filter=fbytes)
                    t = "%s/r%d/q%d/k=%d%s%s" % (tag, round_, qi, k, "/ns" if nsf else "", "/filter" if filt is not None else "")
                    du = after.rerank_uncertain - before.rerank_uncertain
                    dq = after.rerank_queries - before.rerank_queries
                    if k == 1024:
                        # R = 8192: the exact scan of the GPU's table answers (the CPU engine's
                        # int8 scan has no such limit, so the two differ by design).
                        record(t + "/exact-path", dq == 0, reranked=int(dq))
                        check(t + "/exact", ref, q, got, k, mask=mask, s=ref.scores(q, as_stored(ref.X, dtype)),
                              tol=None if dtype == F32 else 2e-3 * (1 + float(np.abs(got[1]).max(initial=0))))
                        continue
                    atol = 1e-6 * (1 + np.abs(want[1]).max(initial=0))
                    same = np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1], rtol=0, atol=atol)
                    record(t + "/int8-path", dq == 1, reranked=int(dq))
                    r = max(8 * k, 64)
                    if sts.engine == CUDA and 2 <= nib_count and r < nib_count and dim <= 1024:
                        nib_total += 1
                        nib_same += same
                        record_nibble_scores(t, got, want, atol, l2=metric == L2)
                        sc, rid = ref.scores(q), ref.ids
                        if mask is not None:
                            sc, rid = sc[mask], rid[mask]
                        truth = rid[np.lexsort((rid, sc if metric == L2 else -sc))[:k]]
                        nib_recall.append(len(np.intersect1d(got[0], truth)) / max(1, len(truth)))
                        if du == 0:
                            check(t + "/exact", ref, q, got, k, mask=mask)
                        continue
                    record(t + "/same-as-cpu", same, got=got[0][:5].tolist(), want=want[0][:5].tolist())
                    if du == 0:
                        certain += 1
                        check(t + "/exact", ref, q, got, k, mask=mask)
                    else:
                        uncertain += 1
            # Writes between rounds: replace a tenth of the rows, delete a few, add new ones.
            sel = rng.choice(len(ref.ids), len(ref.ids) // 10, replace=False)
            up = ref.ids[sel]
            Xu = (ref.X[sel] + 0.5 * rng.standard_normal((len(sel), dim))).astype(np.float32)
            nsu = ref.ns[sel]
            for s0 in range(0, len(up), batch):
                sl = slice(s0, s0 + batch)
                fb = F.encode_fields([{"n": 5}] * len(up[sl]))
                st.upsert(up[sl], Xu[sl], nsu[sl], fields=fb)
                cpu.upsert(up[sl], Xu[sl], nsu[sl], fields=fb)
            ref.upsert(up, Xu, nsu, t=time.time() * 1000)
            num[np.isin(ids, up)] = 5
            gone = ref.ids[rng.choice(len(ref.ids), 50, replace=False)]
            st.delete(gone)
            cpu.delete(gone)
            ref.delete(gone)
        if not nib_total:
            record(tag + "/certain-share", certain >= 0.5 * (certain + uncertain), certain=certain, uncertain=uncertain)
        else:
            rec = float(np.mean(nib_recall))
            record(tag + "/nibble-recall", rec >= 0.95, recall=rec, queries=nib_total)
            record(tag + "/nibble-same-as-cpu", nib_same >= 0.8 * nib_total, same=nib_same, queries=nib_total)
        print("INFO", tag, json.dumps(dict(certain=certain, uncertain=uncertain, engine=name)), flush=True)
        st.close()
        cpu.close()
    suite_int8_cut()


def suite_int8_cut(n=60_000, dim=128, run=400, nq=6):
    """The int8 scan's cut (each block keeps 16 candidates when every block's R would overflow
    the merge): a run of consecutive near-duplicates of the query puts the R candidates in one or
    two blocks, so the cut drops some of them and the kernel must flag the answer for a scan
    without the cut. The answers equal the CPU engine's, with rows in a random order beside.
    A query the 4-bit first pass takes (KALOS_INT8_NIBBLE) ranks the near-duplicates from other
    candidates than the CPU engine's: its scores must be exact where ids agree, and its ids must
    agree with the CPU engine's on at least 90% of the positions over the suite."""
    nib_count = int(os.environ.get("KALOS_INT8_NIBBLE", "0"))
    for dtype in (F16, F32):
        tag = "int8cut/%s" % ["f32", "f16", "bf16"][dtype]
        st = open_store(dim, IP, dtype=dtype, scan=1)
        cpu = open_store(dim, IP, dtype=dtype, scan=1, backend=CPU)
        agree = []
        X = rng.standard_normal((n, dim)).astype(np.float32)
        c = rng.standard_normal(dim).astype(np.float32)
        at = int(rng.integers(0, n - run))
        X[at:at + run] = 3 * c + 0.2 * rng.standard_normal((run, dim)).astype(np.float32)
        ids = np.arange(1, n + 1, dtype=np.uint64)
        for s0 in range(0, n, 8192):  # in row order: the run stays consecutive in the table
            st.upsert(ids[s0:s0 + 8192], X[s0:s0 + 8192])
            cpu.upsert(ids[s0:s0 + 8192], X[s0:s0 + 8192])
        nibble = st.stats().engine == CUDA and 2 <= nib_count and dim <= 1024
        for qi in range(nq):
            near = qi % 2 == 0  # a query inside the run (cut flagged) or a random one (cut held)
            q = (c if near else rng.standard_normal(dim)).astype(np.float32) + 0.3 * rng.standard_normal(dim).astype(np.float32)
            for k in (1, 10, 50):
                before = st.stats()
                got = st.recall(q, k)
                after = st.stats()
                want = cpu.recall(q, k)
                t = "%s/q%d%s/k=%d" % (tag, qi, "/near" if near else "", k)
                atol = 1e-6 * (1 + np.abs(want[1]).max(initial=0))
                if nibble and max(8 * k, 64) < nib_count:
                    agree.append(record_nibble_scores(t, got, want, atol) / max(1, len(want[0])))
                else:
                    same = np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1], rtol=0, atol=atol)
                    record(t + "/same-as-cpu", same, got=got[0][:5].tolist(), want=want[0][:5].tolist())
                record(t + "/int8-path", after.rerank_queries - before.rerank_queries == 1)
                if near:
                    record(t + "/in-run", bool(np.all((got[0] > at) & (got[0] <= at + run))), got=got[0][:5].tolist())
        if agree:
            record(tag + "/nibble-agreement", float(np.mean(agree)) >= 0.9, agreement=float(np.mean(agree)), queries=len(agree))
        st.close()
        cpu.close()


def main():
    which = sys.argv[1:] or ["all"]
    t0 = time.time()
    print("seed", SEED, flush=True)
    steps = [
        ("small", lambda: [suite_exact(IP, 1, 128), suite_exact(IP, 5, 3), suite_exact(L2, 1000, 100),
                           suite_exact(COSINE, 1000, 768, nqueries=1)]),
        ("mid", lambda: [suite_exact(IP, 65_537, 128), suite_exact(COSINE, 300_000, 96, nqueries=1),
                         suite_exact(L2, 300_000, 64, nqueries=1)]),
        ("big", lambda: [suite_exact(COSINE, 2_000_000, 64, ks=(1, 10, 100, 1024), nqueries=1)]),
        # a big table, and a small one (blocks of at most 256 rows select by rank)
        # f16: exact duplicates in a batch outgrow the f16 tiles' tie room (answered from f32 tiles)
        ("ties", lambda: [suite_ties(), suite_ties(n=3000, dim=16, dups=1500), suite_ties(n=100_000, dtype=F16)]),
        ("lifecycle", suite_expiry_recency),
        ("lowp", lambda: [suite_lowp(F16), suite_lowp(BF16), suite_lowp(F32, n=100_000)]),
        ("multi", lambda: [suite_multi(F16, IP), suite_multi(BF16, L2, dim=100), suite_multi(F16, L2, n=40_000, dim=100),
                           suite_multi(BF16, IP, n=40_000, dim=1536)]),
        ("score16", suite_score16),
        ("cruise", suite_cruise),
        ("gated", suite_gated),
        ("oom", suite_oom),
        ("fault", suite_fault_and_auto),
        ("filter", lambda: [suite_filter(), suite_filter(n=100_000, dim=768, nexpr=8, dtype=F16, metrics=(IP, L2)),
                            suite_filter_drift()]),
        ("int8", suite_int8),
        ("shards", suite_shards),
    ]
    for nm, fn in steps:
        if "all" in which or nm in which:
            ts = time.time()
            try:
                fn()
            except Exception as e:  # a crash of one suite is a failure, the rest still run
                import traceback
                record("suite/" + nm, False, error=repr(e), tb=traceback.format_exc()[-1500:])
            print("suite %-9s %6.1fs  failures so far %d" % (nm, time.time() - ts, FAILS), flush=True)
    n_ok = sum(1 for r in LOG if r.get("ok"))
    json.dump(dict(seed=SEED, failures=FAILS, checks=len(LOG), log=LOG), open(os.path.join(OUT, "correctness.json"), "w"), default=str)
    print("CORRECTNESS: %d checks, %d failures, %.0fs (seed %d)" % (len(LOG), FAILS, time.time() - t0, SEED), flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

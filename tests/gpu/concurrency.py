#!/usr/bin/env python3
"""Concurrency benchmark: P client processes recalling single queries from one Kalos server,
next to in-process torch answering the same P queries as one batch, on the same GPU and table.

  python3 concurrency.py            run it; writes $OUT/concurrency.json and $OUT/concurrency.png
  python3 concurrency.py serve ...  (internal) the server process of one table

Per table (default 1,000,000 x 768, f16 on the GPU, metric ip, k=10):
- A server process (role server, backend cuda, like bench.py's `serve`) loads a random normal
  table through kalos_upsert (seed as bench.py) and serves until its stdin closes.
- For each P (default 1, 2, 4, 8, 16, 32, 64): P processes of conc_client (tests/gpu/conc_client.c,
  C through include/kalos.h) attach as clients, wait for a common CLOCK_MONOTONIC start time and
  call kalos_recall with one fresh random query at a time, back to back, for CONC_WARM s of
  warm-up and CONC_SECS s measured. Each writes the latency (ns) of every request that completed
  in the measured window to a file; this process merges all of them: aggregate q/s = all
  requests / CONC_SECS; p50 / p99 / p99.9 over every request of every client.
- Right after Kalos's P, the torch peer in this process with the same table (torch tensor of the
  same dtype on the GPU): batches of B = P host (numpy f32) queries, bench.py's batch form
  `torch.topk(qb @ M.T, k, dim=1)` with the queries copied to the GPU and ids and scores copied
  back (synchronised), timed back to back for CONC_SECS s after CONC_WARM s: q/s = B / batch p50.
- Kalos p99 at P over Kalos p50 at P=1 (the single-query latency of this same run).

Environment (all optional):
  CONC_TABLES   "NxDIMxDTYPE,..." (N may end in k or M), e.g. "1Mx768xf16,100kx768xf16";
                default one table from CONC_N (1000000), CONC_DIM (768), CONC_DTYPE (f16)
  CONC_P        comma list of client counts (default 1,2,4,8,16,32,64; 1 is always measured)
  CONC_SECS     measured seconds per point (default 3);  CONC_WARM  warm-up seconds (default 0.5)
  CONC_BACKEND  cuda | cpu | auto (default cuda);  CONC_K  (default 10)
  CONC_SLOTS    server request slots (default max(80, max P + 16));  CONC_SLOT_BYTES (default 256 KiB)
  CONC_CLIENT_SPIN_NS  client busy-wait (kalos_options.client_spin_ns; default: the library's)
  CONC_TIMEOUT_MS      per-call deadline of the clients (default 5000)
  CONC_CLIENT   path of the conc_client binary (default: next to this script)
  CONC_NO_TORCH=1      skip the torch peer;  CONC_LOAD_TIMEOUT  server load timeout, s (default 300)
Exit status: 0 when every point ran without an error, 1 otherwise (a FAIL line says why).
"""
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kalos_ct import AUTO, BF16, CPU, CUDA, F16, F32, IP, ROLE_CLIENT, Store, load  # noqa: E402

OUT = os.environ.get("OUT", ".")
DTYPES = {"f32": F32, "f16": F16, "bf16": BF16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
BACKENDS = {"cuda": CUDA, "cpu": CPU, "auto": AUTO}


def env_float(name, default):
    return float(os.environ.get(name, "") or default)


SECS = env_float("CONC_SECS", 3.0)
WARM = env_float("CONC_WARM", 0.5)
K = int(env_float("CONC_K", 10))
PS = sorted({int(p) for p in os.environ.get("CONC_P", "1,2,4,8,16,32,64").split(",") if p.strip()})
BACKEND_NAME = os.environ.get("CONC_BACKEND", "cuda").strip().lower()
SLOTS = int(env_float("CONC_SLOTS", max(80, max(PS) + 16)))
SLOT_BYTES = int(env_float("CONC_SLOT_BYTES", 256 << 10))
TIMEOUT_MS = int(env_float("CONC_TIMEOUT_MS", 5000))
LOAD_TIMEOUT = env_float("CONC_LOAD_TIMEOUT", 300)
CLIENT = os.environ.get("CONC_CLIENT") or os.path.join(HERE, "conc_client")
SPIN = os.environ.get("CONC_CLIENT_SPIN_NS")


class Fail(Exception):
    pass


def data(n, dim, seed):
    # As bench.py: the server and this process make the same table from the same seed.
    return np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)


def seed_of(n, dim):
    return n * 31 + dim


def parse_n(s):
    s = s.strip()
    mult = {"k": 1000, "K": 1000, "M": 1000_000}.get(s[-1:], 1)
    return int(float(s.rstrip("kKM")) * mult)


def tables():
    spec = os.environ.get("CONC_TABLES")
    if not spec:
        spec = "%sx%sx%s" % (os.environ.get("CONC_N", "1000000"), os.environ.get("CONC_DIM", "768"),
                             os.environ.get("CONC_DTYPE", "f16"))
    out = []
    for t in spec.split(","):
        w = t.strip().lower().split("x")
        if len(w) != 3 or w[2] not in DTYPES:
            raise SystemExit("CONC_TABLES entry %r: want NxDIMxDTYPE (dtype f32, f16 or bf16)" % t)
        out.append((parse_n(w[0].replace("m", "M")), int(w[1]), DTYPES[w[2]]))
    return out


# ---------------------------------------------------------------- server process (internal)

def serve(name, n, dim, dtype, backend, slots, slot_bytes):
    lib = load()
    try:
        st = Store(lib, name, dim=dim, metric=IP, dtype=dtype, backend=backend, capacity=max(n, 1024), slots=slots,
                   slot_bytes=slot_bytes, server_spin_ns=1_000_000_000)
        X = data(n, dim, seed_of(n, dim))
        b = max(1, (slot_bytes - 4096) // (dim * 4 + 20))
        t0 = time.time()
        for s in range(0, n, b):
            st.upsert(np.arange(s, min(n, s + b), dtype=np.uint64), X[s:s + b])
        del X
        s = st.stats()
        print("READY load_s=%.2f engine=%s count=%d" % (time.time() - t0, s.engine_name.decode(), s.count), flush=True)
    except Exception as e:  # noqa: BLE001
        print("SERVER_FAIL %r" % (e,), flush=True)
        sys.exit(2)
    sys.stdin.read()  # until the driver closes our stdin (or dies)
    s = st.stats()
    print("server final: requests=%d queries=%d batches=%d errors=%d fallbacks=%d engine=%s fallback_reason=%r" % (
        s.requests, s.queries, s.batches, s.errors, s.engine_fallbacks, s.engine_name.decode(),
        s.fallback_reason.decode(errors="replace")), flush=True)
    st.close()


# ---------------------------------------------------------------- driver

LIVE = []  # client processes not yet reaped


def kill_leftovers():
    for p in LIVE:
        if p.poll() is None:
            p.kill()
    for p in LIVE:
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
    LIVE.clear()


def start_server(name, n, dim, dtype, backend, log_path):
    log = open(log_path, "w")
    srv = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", name, str(n), str(dim), str(dtype),
                            str(backend), str(SLOTS), str(SLOT_BYTES)], stdin=subprocess.PIPE, stdout=log,
                           stderr=subprocess.STDOUT, text=True)
    log.close()
    return srv


def wait_ready(srv, log_path, timeout):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        txt = open(log_path).read()
        for line in txt.splitlines():
            if line.startswith("READY"):
                return line
            if line.startswith("SERVER_FAIL"):
                raise Fail("server failed to start: " + line + " | " + txt[-800:].replace("\n", " | "))
        if srv.poll() is not None:
            raise Fail("server exited rc=%s before READY: %s" % (srv.returncode, txt[-800:].replace("\n", " | ")))
        time.sleep(0.1)
    raise Fail("server not READY after %.0f s" % timeout)


def stop_server(srv, name):
    try:
        srv.stdin.close()
    except Exception:  # noqa: BLE001
        pass
    try:
        srv.wait(timeout=60)
    except Exception:  # noqa: BLE001
        srv.kill()
        srv.wait()
    if srv.returncode != 0:  # a server that did not stop cleanly leaves its segment behind
        for f in ("/dev/shm/kalos." + name, "/dev/shm/kalos." + name + ".lock"):
            try:
                os.unlink(f)
            except OSError:
                pass


def stats_dict(kc):
    s = kc.stats()
    return dict(requests=s.requests, queries=s.queries, batches=s.batches, errors=s.errors, p50_ns=s.p50_ns,
                p99_ns=s.p99_ns, engine=s.engine_name.decode(), fallbacks=s.engine_fallbacks,
                fallback_reason=s.fallback_reason.decode(errors="replace"))


def kalos_point(name, P, srv, kc):
    """P client processes for WARM + SECS s; returns the merged numbers. Raises Fail when a client
    cannot open or dies, or the server is gone."""
    tmpd = tempfile.mkdtemp(prefix="kalos-conc-")
    try:
        margin = 0.5 + 0.025 * P  # time to spawn P processes and open P handles (16 cores)
        start = time.monotonic_ns() + int(margin * 1e9)
        warm_ms, secs_ms = int(WARM * 1000), int(SECS * 1000)
        env = dict(os.environ, CONC_TIMEOUT_MS=str(TIMEOUT_MS))
        s0 = stats_dict(kc)
        files = []
        for i in range(P):
            f = os.path.join(tmpd, "lat.%d" % i)
            files.append(f)
            seed = 1_000_003 * P + 7919 * i + 1
            LIVE.append(subprocess.Popen([CLIENT, name, str(start), str(warm_ms), str(secs_ms), str(seed), f, str(K)],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        procs = list(LIVE)
        deadline = start / 1e9 + WARM + SECS + TIMEOUT_MS / 1000.0 + 20
        outs = []
        for i, p in enumerate(procs):
            try:
                o, e = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                outs.append((p.returncode, o, e, False))
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
                outs.append((p.returncode, o, e, True))
        LIVE.clear()
        s1 = stats_dict(kc) if srv.poll() is None else None
        res = []
        for i, (rc, o, e, timed_out) in enumerate(outs):
            line = (o or "").strip().splitlines()[-1:] or [""]
            try:
                j = json.loads(line[0])
            except ValueError:
                j = None
            if timed_out:
                raise Fail("P=%d: client %d did not finish by its deadline (killed); stderr: %s" % (P, i, (e or "")[-300:]))
            if j is not None and "open_status" in j:
                raise Fail("P=%d: client %d could not open the store: %s %s" % (P, i, j.get("open_status_name", j["open_status"]), j.get("error")))
            if j is None or rc not in (0, 3):
                raise Fail("P=%d: client %d exited rc=%s without a result; stdout %r stderr %r" % (P, i, rc, (o or "")[-300:], (e or "")[-300:]))
            if "SERVER_GONE" in j["errors_by_status"]:
                raise Fail("P=%d: the server is gone (client %d: %s)" % (P, i, j["first_error"]))
            res.append(j)
        if srv.poll() is not None:
            raise Fail("P=%d: the server process died (rc=%s)" % (P, srv.returncode))
        lat = []
        for i, f in enumerate(files):
            a = np.fromfile(f, dtype="<u8")
            if len(a) != res[i]["n"]:
                raise Fail("P=%d: client %d wrote %d latencies, reported %d" % (P, i, len(a), res[i]["n"]))
            lat.append(a)
        lat = np.concatenate(lat).astype(np.float64) / 1e3 if lat else np.zeros(0)
        if len(lat) == 0:
            raise Fail("P=%d: no request completed in the measured window" % P)
        errs = {}
        for j in res:
            for k_, v in j["errors_by_status"].items():
                errs[k_] = errs.get(k_, 0) + v
        ns = [j["n"] for j in res]
        late = max(j["late_ns"] for j in res) / 1e6
        out = dict(
            P=P, n=int(len(lat)), qps=len(lat) / SECS,
            p50_us=float(np.percentile(lat, 50)), p99_us=float(np.percentile(lat, 99)),
            p999_us=float(np.percentile(lat, 99.9)), max_us=float(lat.max()), mean_us=float(lat.mean()),
            per_client_n_min=int(min(ns)), per_client_n_max=int(max(ns)),
            per_client_p50_us=[j["p50_ns"] / 1e3 for j in res], per_client_p99_us=[j["p99_ns"] / 1e3 for j in res],
            errors=int(sum(j["errors"] for j in res)), errors_in_window=int(sum(j["errors_in_window"] for j in res)),
            errors_by_status=errs, first_errors=[j["first_error"] for j in res if j["first_error"]][:3],
            hits_short=int(sum(j["hits_short"] for j in res)),
            query_gen_ns_mean=float(np.mean([j["gen_ns_mean"] for j in res])),
            max_client_late_ms=late, start_margin_s=margin,
        )
        if s1 is not None:
            db, dq, dr = s1["batches"] - s0["batches"], s1["queries"] - s0["queries"], s1["requests"] - s0["requests"]
            out["server"] = dict(requests=dr, queries=dq, batches=db, queries_per_batch=dq / db if db else float("nan"),
                                 errors=s1["errors"] - s0["errors"], p50_us_last4096=s1["p50_ns"] / 1e3,
                                 p99_us_last4096=s1["p99_ns"] / 1e3, engine=s1["engine"],
                                 fallbacks=s1["fallbacks"] - s0["fallbacks"], fallback_reason=s1["fallback_reason"])
            if out["server"]["fallbacks"]:
                print("WARN P=%d: the GPU engine fell back to the CPU: %s" % (P, s1["fallback_reason"]), flush=True)
        if late > 0:
            print("WARN P=%d: a client was ready %.1f ms after the common start%s" % (
                P, late, " (after the warm-up: its window was short)" if late > WARM * 1e3 else ""), flush=True)
        return out
    finally:
        kill_leftovers()
        shutil.rmtree(tmpd, ignore_errors=True)


def torch_point(torch, M, B, dim, rng):
    dev = M.device
    tdt = M.dtype
    Qs = [rng.standard_normal((B, dim), dtype=np.float32) for _ in range(8)]

    def one(r):
        qb = torch.from_numpy(Qs[r % 8]).to(dev).to(tdt)
        v, idx = torch.topk(qb @ M.T, K, dim=1)
        ids = idx.cpu().numpy()
        sc = v.float().cpu().numpy()
        return ids, sc

    r = 0
    t_end = time.perf_counter() + WARM
    while r < 3 or time.perf_counter() < t_end:
        one(r)
        r += 1
    ts = []
    t_start = time.perf_counter()
    t_end = t_start + SECS
    while len(ts) < 20 or (time.perf_counter() < t_end and len(ts) < 200_000):
        t0 = time.perf_counter()
        one(r)
        ts.append(time.perf_counter() - t0)
        r += 1
    total = time.perf_counter() - t_start
    ts = np.asarray(ts)
    p50 = float(np.percentile(ts, 50))
    return dict(B=B, batches=int(len(ts)), batch_p50_us=p50 * 1e6, batch_p99_us=float(np.percentile(ts, 99)) * 1e6,
                batch_max_us=float(ts.max()) * 1e6, qps=B / p50, qps_mean=B * len(ts) / total,
                form="torch.topk(torch.from_numpy(q).to(dev).to(dtype) @ M.T, k, dim=1); ids and scores .cpu()")


def gpu_name(torch):
    try:
        o = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True,
                           text=True, timeout=30)
        if o.returncode == 0 and o.stdout.strip():
            return o.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        pass
    if torch is not None:
        try:
            return torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            pass
    return "none (no nvidia-smi)"


def run_table(lib, torch, n, dim, dtype, idx, done):
    name = "kconc-%d-%d" % (os.getpid(), idx)
    label = "%d x %d %s" % (n, dim, DTYPE_NAMES[dtype])
    log_path = os.path.join(OUT, "concurrency_server_%d.log" % idx)
    t = dict(label=label, n=n, dim=dim, dtype=DTYPE_NAMES[dtype], metric="ip", k=K, backend=BACKEND_NAME, points=[])
    done.append(t)  # partial results reach the JSON when a point fails
    print("== table %s: starting the server (%s)" % (label, name), flush=True)
    srv = start_server(name, n, dim, dtype, BACKENDS[BACKEND_NAME], log_path)
    kc = M = None
    try:
        t0 = time.time()
        X = data(n, dim, seed_of(n, dim))  # while the server makes and loads its own copy
        ready = wait_ready(srv, log_path, LOAD_TIMEOUT)
        t["server_ready"] = ready
        t["ready_after_s"] = time.time() - t0
        print("  server: %s (%.1f s after start)" % (ready, t["ready_after_s"]), flush=True)
        kc = Store(lib, name, role=ROLE_CLIENT)
        st0 = stats_dict(kc)
        t["engine"] = st0["engine"]
        if st0["fallback_reason"]:
            print("WARN %s: fallback_reason %r" % (label, st0["fallback_reason"]), flush=True)
        if BACKEND_NAME == "cuda" and not st0["engine"].startswith("cuda"):
            raise Fail("%s: backend cuda asked, engine %r serves" % (label, st0["engine"]))
        # Spot check: Kalos (and torch) top-k against exact f32 numpy on a few queries.
        rng = np.random.default_rng(11)
        Q3 = rng.standard_normal((3, dim), dtype=np.float32)
        S = X @ Q3.T
        exact = [set(np.argsort(-S[:, i])[:K].tolist()) for i in range(3)]
        rk = [len(set(kc.recall(Q3[i], K)[0].tolist()) & exact[i]) / K for i in range(3)]
        t["spot_recall_kalos_vs_f32"] = float(np.mean(rk))
        if torch is not None:
            dev = torch.device("cuda")
            tdt = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[dtype]
            M = torch.from_numpy(X).to(dev).to(tdt)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            _, ti = torch.topk(torch.from_numpy(Q3).to(dev).to(tdt) @ M.T, K, dim=1)
            ti = ti.cpu().numpy()
            t["spot_recall_torch_vs_f32"] = float(np.mean([len(set(ti[i].tolist()) & exact[i]) / K for i in range(3)]))
        del X, S
        print("  spot check recall@%d vs exact f32 (3 queries): kalos %.2f%s" % (
            K, t["spot_recall_kalos_vs_f32"],
            ", torch %.2f" % t["spot_recall_torch_vs_f32"] if "spot_recall_torch_vs_f32" in t else ""), flush=True)
        if t["spot_recall_kalos_vs_f32"] < 0.9:
            print("WARN %s: Kalos recall@%d %.2f against exact f32" % (label, K, t["spot_recall_kalos_vs_f32"]), flush=True)
        trng = np.random.default_rng(23)
        for P in PS:
            kr = kalos_point(name, P, srv, kc)
            pt = dict(P=P, kalos=kr)
            line = "  P=%-3d kalos %10.0f q/s  p50 %9.1f  p99 %9.1f  p99.9 %9.1f  max %9.1f us  n=%d (per client %d..%d)" % (
                P, kr["qps"], kr["p50_us"], kr["p99_us"], kr["p999_us"], kr["max_us"], kr["n"], kr["per_client_n_min"],
                kr["per_client_n_max"])
            if "server" in kr:
                line += "  server: %.2f queries/batch" % kr["server"]["queries_per_batch"]
            print(line, flush=True)
            if kr["errors"]:
                print("FAIL %s P=%d: %d recall errors %s; first: %s" % (label, P, kr["errors"], kr["errors_by_status"],
                                                                       kr["first_errors"]), flush=True)
            if M is not None:
                tr = torch_point(torch, M, P, dim, trng)
                pt["torch"] = tr
                print("  P=%-3d torch B=%-3d %8.0f q/s (B / batch p50; mean-based %.0f)  batch p50 %9.1f  p99 %9.1f us  %d batches" % (
                    P, P, tr["qps"], tr["qps_mean"], tr["batch_p50_us"], tr["batch_p99_us"], tr["batches"]), flush=True)
            t["points"].append(pt)
            ratios(t)
        return t
    finally:
        if M is not None:
            del M
            torch.cuda.empty_cache()
        if kc is not None:
            kc.close()
        stop_server(srv, name)
        try:
            tail = open(log_path).read().strip().splitlines()
            # The server's pass report (KALOS_SERVER_REPORT=1) whole, then the log's last lines.
            keep = [ln for ln in tail if ln.startswith("kalos server:")]
            keep += [ln for ln in tail[-6:] if ln not in keep]
            for line in keep:
                if not line.startswith("READY"):
                    print("  server log: " + line[:400], flush=True)
        except OSError:
            pass


def ratios(t):
    one = [p for p in t["points"] if p["P"] == 1]
    if one:
        base = one[0]["kalos"]["p50_us"]
        t["kalos_single_p50_us"] = base
        for p in t["points"]:
            p["kalos_p99_over_single_p50"] = p["kalos"]["p99_us"] / base
    for p in t["points"]:
        if "torch" in p:
            p["kalos_over_torch_qps"] = p["kalos"]["qps"] / p["torch"]["qps"]


def table_text(t):
    hdr = "%-4s %11s %13s %13s %14s %12s %13s %8s %7s" % (
        "P", "kalos_qps", "kalos_p50_us", "kalos_p99_us", "torch_B=P_qps", "kalos/torch", "p99/p50(P=1)", "q/batch", "errors")
    rows = ["== concurrency table: %s, ip, k=%d, backend %s, engine %s, %g s per point after %g s warm-up; "
            "Kalos P=1 p50 %.1f us ==" % (t["label"], t["k"], t["backend"], t.get("engine", "?"), SECS, WARM,
                                          t.get("kalos_single_p50_us", float("nan"))), hdr]
    for p in t["points"]:
        k, tr = p["kalos"], p.get("torch")
        rows.append("%-4d %11.0f %13.1f %13.1f %14s %12s %13.2f %8s %7d" % (
            p["P"], k["qps"], k["p50_us"], k["p99_us"], "%.0f" % tr["qps"] if tr else "n/a",
            "%.2f" % p["kalos_over_torch_qps"] if tr else "n/a", p.get("kalos_p99_over_single_p50", float("nan")),
            "%.2f" % k["server"]["queries_per_batch"] if "server" in k else "?", k["errors"]))
    return "\n".join(rows)


def plot(result):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print("INFO matplotlib not importable (%r): no plot" % (e,), flush=True)
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, t in enumerate(result["tables"]):
        pts = t["points"]
        if not pts:
            continue
        c = "C%d" % i
        P = [p["P"] for p in pts]
        a1.plot(P, [p["kalos"]["qps"] for p in pts], "-o", color=c, label="Kalos, P client processes (%s)" % t["label"])
        tp = [p for p in pts if "torch" in p]
        if tp:
            a1.plot([p["P"] for p in tp], [p["torch"]["qps"] for p in tp], "--s", color=c,
                    label="torch in-process, batch B=P (%s)" % t["label"])
            a2.plot([p["P"] for p in tp], [p["torch"]["batch_p50_us"] for p in tp], ":s", color=c,
                    label="torch batch p50 (%s)" % t["label"])
        a2.plot(P, [p["kalos"]["p50_us"] for p in pts], "-o", color=c, label="Kalos p50 (%s)" % t["label"])
        a2.plot(P, [p["kalos"]["p99_us"] for p in pts], "--^", color=c, label="Kalos p99 (%s)" % t["label"])
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xticks(PS)
        a.set_xticklabels([str(p) for p in PS])
        a.set_xlabel("concurrent clients P (torch: batch size B = P)")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    a1.set_ylabel("aggregate queries/s")
    a1.set_title("throughput, top-%d, %s" % (K, result["gpu"]))
    a2.set_ylabel("latency per request (us)")
    a2.set_title("Kalos latency under P concurrent clients")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "concurrency.png"), dpi=120)
    print("INFO plot: %s" % os.path.join(OUT, "concurrency.png"), flush=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda sig, frm: (_ for _ in ()).throw(SystemExit(128 + sig)))
    global PS
    if 1 not in PS:
        print("INFO P=1 added: the single-query baseline", flush=True)
        PS = [1] + PS
    if BACKEND_NAME not in BACKENDS:
        raise SystemExit("CONC_BACKEND must be cuda, cpu or auto")
    if not (os.path.isfile(CLIENT) and os.access(CLIENT, os.X_OK)):
        print("FAIL conc_client not found at %s (tests/gpu/stage.sh builds it; or set CONC_CLIENT)" % CLIENT, flush=True)
        print("CONCURRENCY FAIL: no conc_client", flush=True)
        return 1
    torch = None
    if os.environ.get("CONC_NO_TORCH"):
        print("INFO CONC_NO_TORCH set: no torch peer", flush=True)
    else:
        try:
            import torch as _t
            if _t.cuda.is_available():
                torch = _t
            else:
                print("INFO torch has no CUDA device: no torch peer", flush=True)
        except Exception as e:  # noqa: BLE001
            print("INFO torch not importable (%r): no torch peer" % (e,), flush=True)
    lib = load()
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        nproc = "?"
    result = dict(
        benchmark="concurrency", commit=os.environ.get("KALOS_COMMIT", "?").strip(), gpu=gpu_name(torch),
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), host=platform.node(), nproc=nproc,
        cpu_count=os.cpu_count(), affinity=len(os.sched_getaffinity(0)), python=platform.python_version(),
        numpy=np.__version__, torch=getattr(torch, "__version__", None),
        settings=dict(secs=SECS, warm=WARM, P=PS, k=K, metric="ip", backend=BACKEND_NAME, slots=SLOTS,
                      slot_bytes=SLOT_BYTES, server_spin_ns=1_000_000_000,
                      client_spin_ns=int(SPIN) if SPIN else "library default", client_timeout_ms=TIMEOUT_MS,
                      client=CLIENT, kalos_cuda_report=os.environ.get("KALOS_CUDA_REPORT")),
        method=("Kalos: P conc_client processes (C, kalos_recall, one fresh random query per call, back to back) "
                "against one server process; every request completing in the measured window is kept; q/s = "
                "all of them / secs; percentiles over all requests of all clients. torch: this process, same "
                "table and dtype on the GPU, batches of B=P host queries, copied in, topk, ids and scores copied "
                "out; q/s = B / batch p50. Each P: Kalos first, then torch."),
        tables=[], fail=None)
    print("GPU %s, nproc %s, P %s, %g s per point after %g s warm-up, backend %s" % (
        result["gpu"], nproc, PS, SECS, WARM, BACKEND_NAME), flush=True)
    rc = 0
    t_run = time.time()
    try:
        for i, (n, dim, dtype) in enumerate(tables()):
            t = run_table(lib, torch, n, dim, dtype, i, result["tables"])
            if any(p["kalos"]["errors"] for p in t["points"]):
                rc = 1
    except Fail as e:
        result["fail"] = str(e)
        print("FAIL %s" % e, flush=True)
        rc = 1
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        result["fail"] = repr(e)
        print("FAIL %r" % (e,), flush=True)
        rc = 1
    finally:
        kill_leftovers()
        result["wall_s"] = time.time() - t_run
        json.dump(result, open(os.path.join(OUT, "concurrency.json"), "w"), indent=1)
    if result["tables"]:
        plot(result)
    print()
    for t in result["tables"]:
        print(table_text(t))
    summary = []
    for t in result["tables"]:
        pts = t["points"]
        if pts:
            a, b = pts[0], pts[-1]
            s = "%s: P=%d %.0f q/s p50 %.1f us; P=%d %.0f q/s p50 %.1f p99 %.1f us" % (
                t["label"], a["P"], a["kalos"]["qps"], a["kalos"]["p50_us"], b["P"], b["kalos"]["qps"], b["kalos"]["p50_us"],
                b["kalos"]["p99_us"])
            if "torch" in b:
                s += "; torch B=%d %.0f q/s" % (b["P"], b["torch"]["qps"])
            summary.append(s)
    print("CONCURRENCY %s: %s" % ("ok" if rc == 0 else "FAIL" + (" (%s)" % result["fail"][:200] if result["fail"] else " (recall errors)"),
                                  " | ".join(summary) or "no table measured"), flush=True)
    return rc


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], *(int(a) for a in sys.argv[3:9]))
    else:
        sys.exit(main())

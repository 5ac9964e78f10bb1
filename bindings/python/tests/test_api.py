"""Every method of kalos.Kalos, checked against numpy."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import kalos
from conftest import ref_topk, unique_name


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_recall_matches_numpy(name, metric):
    rng = np.random.default_rng(1)
    n, d = 500, 24
    table = rng.standard_normal((n, d)).astype(np.float32)
    ids = rng.permutation(10_000)[:n].astype(np.uint64)
    with kalos.open(name, dim=d, metric=metric, role="server") as kv:
        assert kv.dim == d and kv.name == name
        kv.upsert(ids, table)
        assert len(kv) == n
        for _ in range(20):
            q = rng.standard_normal(d).astype(np.float32)
            got_ids, got_scores = kv.recall(q, k=10)
            assert got_ids.dtype == np.uint64 and got_scores.dtype == np.float32
            want_ids, want_scores = ref_topk(table, ids, q, 10, metric)
            np.testing.assert_allclose(got_scores, want_scores, rtol=1e-4, atol=1e-4)
            assert list(got_ids) == list(want_ids)
        # batch recall == single recalls
        qs = rng.standard_normal((7, d)).astype(np.float32)
        b_ids, b_scores, counts = kv.recall_batch(qs, k=5)
        assert b_ids.shape == (7, 5) and b_scores.shape == (7, 5) and list(counts) == [5] * 7
        for i in range(7):
            s_ids, s_scores = kv.recall(qs[i], k=5)
            assert list(b_ids[i]) == list(s_ids)
            np.testing.assert_allclose(b_scores[i], s_scores, rtol=1e-5)


def test_conversions_and_zero_copy(kv):
    rng = np.random.default_rng(2)
    table = rng.standard_normal((50, 16))
    kv.upsert(list(range(50)), table)  # float64 + list ids: converted once
    q64 = rng.standard_normal(16)
    a = kv.recall(q64, k=5)
    b = kv.recall(q64.astype(np.float32), k=5)
    c = kv.recall(q64.tolist(), k=5)
    strided = np.repeat(q64.astype(np.float32), 2)[::2]  # non-contiguous view
    d = kv.recall(strided, k=5)
    e = kv.recall(q64.astype(np.float32).reshape(1, 16), k=5)
    for x in (b, c, d, e):
        assert list(x[0]) == list(a[0])
        np.testing.assert_array_equal(x[1], a[1])
    f32 = kalos._f32_1d(q64.astype(np.float32))
    assert np.shares_memory(f32, f32)  # fast path returns the very object
    src = q64.astype(np.float32)
    assert kalos._f32_1d(src) is src
    assert kalos._f32_1d(q64) is not q64
    u = np.arange(4, dtype=np.uint64)
    assert kalos._u64_1d(u) is u
    # get returns the vectors as written (float32 of the float64 input). The cosine store
    # currently returns them within 1 ulp (it keeps a normalised copy; reported to the core).
    np.testing.assert_allclose(kv.get([3]).vectors[0], table[3].astype(np.float32), rtol=1e-6)


def test_get_returns_vectors_exactly_for_ip(name):
    v = np.random.default_rng(9).standard_normal((3, 8)).astype(np.float32)
    with kalos.open(name, dim=8, metric="ip", role="server") as kv:
        kv.upsert([1, 2, 3], v)
        np.testing.assert_array_equal(kv.get([1, 2, 3]).vectors, v)


def test_fewer_hits_than_k(kv):
    kv.upsert([1, 2, 3], np.eye(3, 16, dtype=np.float32))
    ids, scores = kv.recall(np.eye(1, 16, dtype=np.float32)[0], k=10)
    assert len(ids) == 3 and ids[0] == 1
    b_ids, b_scores, counts = kv.recall_batch(np.eye(2, 16), k=10)
    assert list(counts) == [3, 3]
    assert (b_ids[:, 3:] == kalos.NO_ID).all() and np.isnan(b_scores[:, 3:]).all()
    assert kv.recall(np.ones(16), k=1024)[0].shape == (3,)


def test_recall_results_outlive_later_calls(kv):
    """The fast path reuses per-thread result buffers: what it returns must be fresh arrays that
    no later recall (another query, another k, fewer hits) overwrites or aliases."""
    kv.upsert(np.arange(1, 9), np.eye(8, 16, dtype=np.float32) + 0.01)
    q1, q2 = np.eye(2, 16, dtype=np.float32)
    ids1, sc1 = kv.recall(q1, k=5)
    want1 = (ids1.copy(), sc1.copy())
    assert ids1[0] == 1 and len(ids1) == 5
    ids2, sc2 = kv.recall(q2, k=5)  # same k, other hits
    assert ids2[0] == 2
    ids3, sc3 = kv.recall(q1, k=2)  # other count
    kv.delete(np.arange(4, 9))
    ids4, sc4 = kv.recall(q2, k=10)  # fewer hits than k
    assert len(ids4) == 3 and ids4[0] == 2
    ids5, sc5 = kv.recall(q1, k=5)  # the earlier count again
    np.testing.assert_array_equal(ids1, want1[0])
    np.testing.assert_array_equal(sc1, want1[1])
    assert list(ids3) == list(ids1[:2]) and list(ids5) == [1, 2, 3]
    results = [ids1, sc1, ids2, sc2, ids3, sc3, ids4, sc4, ids5, sc5]
    for i, a in enumerate(results):
        assert a.flags.owndata and a.flags.writeable and a.flags.c_contiguous
        for b in results[i + 1:]:
            assert not np.shares_memory(a, b)
    ids1[:] = 0
    sc1[:] = np.nan
    assert kv.recall(q1, k=5)[0].tolist() == [1, 2, 3]


def test_recall_reentered_on_the_same_thread(kv, monkeypatch):
    """A recall run on the same thread while another is between its C call and its copy-out (a
    signal handler or a finalizer could do that) must not clobber the outer call's results.
    The ctypes fast path here; test_fastcall.py has the C extension's."""
    monkeypatch.setattr(kalos, "_FASTCALL", None)
    kv.upsert([1, 2], np.eye(2, 16, dtype=np.float32))
    q1, q2 = np.eye(2, 16, dtype=np.float32)
    real, inner = kalos._recall_with_raw, []

    def reentering(*args):
        rc = real(*args)
        if not inner:
            inner.append(None)
            inner[0] = kv.recall(q2, k=1)
        return rc

    monkeypatch.setattr(kalos, "_recall_with_raw", reentering)
    ids, _ = kv.recall(q1, k=1)
    assert ids.tolist() == [1] and inner[0][0].tolist() == [2]
    monkeypatch.setattr(kalos, "_recall_with_raw", real)
    assert kv.recall(q1, k=1)[0].tolist() == [1]  # the frame is free again
    assert kv.recall(q2, k=1)[0].tolist() == [2]


def test_empty_store(kv):
    ids, scores = kv.recall(np.ones(16, np.float32), k=4)
    assert ids.shape == (0,) and scores.shape == (0,)
    assert kv.recall(np.ones(16), k=4, payloads=True)[2] == []
    assert len(kv) == 0


def test_payloads_namespaces_get(kv):
    v = np.eye(6, 16, dtype=np.float32) + 0.01
    kv.upsert([10, 11, 12], v[:3], namespace=1, payloads=[b"alpha", "béta", None])
    kv.upsert([20, 21, 22], v[3:], namespaces=[2, 2, 3], payloads=[b"", b"x" * 1000, b"\x00\xff"])
    ids, scores, pl = kv.recall(v[0], k=6, payloads=True)
    by_id = dict(zip(ids.tolist(), pl))
    assert by_id == {10: b"alpha", 11: "béta".encode(), 12: None, 20: b"", 21: b"x" * 1000, 22: b"\x00\xff"}
    assert ids[0] == 10
    # namespace filters
    assert sorted(kv.recall(v[0], k=6, namespace=1)[0].tolist()) == [10, 11, 12]
    assert sorted(kv.recall(v[0], k=6, namespace=2)[0].tolist()) == [20, 21]
    assert sorted(kv.recall(v[0], k=6, namespaces=[1, 3])[0].tolist()) == [10, 11, 12, 22]
    assert kv.recall(v[0], k=6, namespace=99)[0].tolist() == []
    b_ids, _, counts = kv.recall_batch(v[:2], k=6, namespace=2)
    assert list(counts) == [2, 2]
    # get
    r = kv.get([22, 10, 12])
    assert r.ids.tolist() == [22, 10, 12]
    assert r.namespaces.tolist() == [3, 1, 1]
    assert r.payloads == [b"\x00\xff", b"alpha", None]
    np.testing.assert_allclose(r.vectors, v[[5, 0, 2]], rtol=1e-6)  # cosine: within 1 ulp
    r2 = kv.get(21, vectors=False, namespaces=False)
    assert r2.vectors is None and r2.namespaces is None and r2.payloads == [b"x" * 1000]
    r3 = kv.get([20], payloads=False)
    assert r3.payloads is None and r3.vectors.shape == (1, 16)
    # replace: upsert changes the payload, namespace and vector
    kv.upsert([10], v[5], namespace=7, payloads=["new"])
    r = kv.get([10])
    assert r.payloads == [b"new"] and r.namespaces.tolist() == [7]
    assert kv.stats()["payload_bytes"] > 0


def test_large_payloads_grow_buffer(name):
    with kalos.open(name, dim=4, role="server", max_payload_bytes=60_000) as kv:
        big = [bytes([i]) * 50_000 for i in range(5)]  # 250 KB total > the 64 KiB scratch buffer
        kv.upsert(np.arange(5), np.ones((5, 4)) + np.arange(5)[:, None], payloads=big)
        ids, _, pl = kv.recall(np.ones(4), k=5, payloads=True)
        assert {i: p for i, p in zip(ids.tolist(), pl)} == dict(enumerate(big))
        assert kv.get(np.arange(5)).payloads == big


def test_delete_delete_namespace_clear(kv):
    v = np.random.default_rng(3).standard_normal((30, 16)).astype(np.float32)
    kv.upsert(np.arange(10), v[:10], namespace=1)
    kv.upsert(np.arange(10, 30), v[10:], namespace=2)
    assert kv.delete([0, 1, 2]) == 3
    assert kv.delete(np.array([3], dtype=np.uint64)) == 1
    assert kv.delete(4) == 1
    assert len(kv) == 25
    with pytest.raises(kalos.NotFoundError):
        kv.delete([5, 12345])  # all or nothing
    assert len(kv) == 25
    assert kv.delete_namespace(2) == 20
    assert kv.delete_namespace(2) == 0
    assert sorted(kv.recall(v[5], k=100)[0].tolist()) == [5, 6, 7, 8, 9]
    assert kv.clear() == 5
    assert len(kv) == 0


def test_ttl_and_expiry(kv):
    kv.upsert([1], np.ones(16), ttl=0.2)
    kv.upsert([2], np.ones(16), expires_at=time.time() + 0.2)
    kv.upsert([3], np.ones(16))
    assert sorted(kv.recall(np.ones(16), k=5)[0].tolist()) == [1, 2, 3]
    time.sleep(0.5)
    assert kv.recall(np.ones(16), k=5)[0].tolist() == [3]


def test_recency_and_timeout_params(kv):
    a = np.eye(1, 16, dtype=np.float32)[0]
    b = a.copy()
    b[1] = 0.2  # b is slightly less similar to a, but newer
    kv.upsert([1], a)
    time.sleep(0.3)
    kv.upsert([2], b)
    assert kv.recall(a, k=2)[0].tolist() == [1, 2]
    assert kv.recall(a, k=2, recency_weight=0.5, half_life=0.1)[0].tolist() == [2, 1]
    assert kv.recall(a, k=2, timeout=2.0)[0].tolist() == [1, 2]
    assert kv.recall_batch([a], k=2, recency_weight=0.5, half_life=0.1, timeout=1)[0][0].tolist() == [2, 1]


def test_stats(kv):
    kv.upsert([1, 2], np.ones((2, 16)))
    kv.recall(np.ones(16), k=1)
    s = kv.stats()
    assert s["count"] == 2 and s["dim"] == 16 and s["metric"] == "cosine" and s["dtype"] == "f32"
    assert s["engine"] in ("cpu", "cuda") and s["engine_name"]
    # Backend auto: either the GPU serves, or stats say why it does not.
    assert s["engine"] == "cuda" or s["fallback_reason"], s
    assert s["requests"] >= 2 and s["queries"] >= 1 and s["capacity"] == 1 << 20
    import os

    assert s["server_pid"] == os.getpid() and kv.is_server
    for key in ("p50_ns", "p99_ns", "epoch", "uptime_ms", "batches", "errors", "queue_depth", "payload_bytes", "engine_fallbacks"):
        assert key in s


def test_stats_counts_requests_by_op_and_status(kv):
    kv.upsert([1, 2], np.ones((2, 16)))
    kv.upsert([3], np.ones((1, 16)))
    for _ in range(3):
        kv.recall(np.ones(16), k=1)
    with pytest.raises(kalos.NotFoundError):
        kv.get([99])
    by = {(c["op"], c["status"]): c["count"] for c in kv.stats()["requests_by"]}
    assert by[("upsert", "OK")] == 2 and by[("recall", "OK")] == 3, by
    assert by[("get", "NOT_FOUND")] == 1, by
    # The first stats request of the call is counted by the time the counters are read.
    assert by[("stats", "OK")] == 1, by
    assert all(c > 0 for c in by.values())
    assert kv.stats()["requests_by"][-1] == {"op": "stats", "status": "OK", "count": 3}


def test_roles_and_attach(name):
    with kalos.open(name, dim=8, role="server") as server:
        with kalos.open(name, role="client") as client:  # dim 0: take the server's
            assert client.dim == 8
            client.upsert([5], np.ones(8))
            assert server.recall(np.ones(8), k=1)[0].tolist() == [5]
            assert client.is_server  # same process owns the server
        with kalos.open(name, dim=8) as auto:  # role auto attaches to the live server
            assert auto.recall(np.ones(8), k=1)[0].tolist() == [5]
    # role auto with nothing running becomes the server (embedded default)
    with kalos.open(name, dim=8) as kv:
        assert len(kv) == 0 and kv.is_server


def test_open_options(name, tmp_path):
    with kalos.open(
        name, dim=4, metric=kalos._ffi.KALOS_METRIC_IP, role="auto", dtype="f32", backend="cpu",
        capacity=100, timeout=1.5, sync="never", sync_interval=0.2, max_payload_bytes=128, slots=4,
        slot_bytes=65536, mode=0o600, threads=1, client_spin_ns=0, server_spin_ns=0,
        heartbeat_timeout=3, gpu_memory_bytes=0,
    ) as kv:
        kv.upsert([1], np.ones(4))
        s = kv.stats()
        assert s["metric"] == "ip" and s["capacity"] == 100 and s["engine"] == "cpu"
        assert kv.recall(np.ones(4), k=1)[0].tolist() == [1]  # park/futex path (no spinning)
    for bad in (dict(metric="hamming"), dict(role="boss"), dict(dtype="f8"), dict(backend="tpu"), dict(sync="sometimes")):
        with pytest.raises(ValueError):
            kalos.open(name, dim=4, **bad)
    with pytest.raises(TypeError):
        kalos.open(b"bytes-name", dim=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        kalos.open(name, dim=4, timeout=-1)


def test_close_semantics(name):
    kv = kalos.open(name, dim=4, role="server")
    assert "open" in repr(kv)
    kv.upsert([1], np.ones(4))
    kv.close()
    kv.close()  # idempotent
    assert kv.closed and "closed" in repr(kv)
    calls = [
        lambda: kv.recall(np.ones(4), k=1),
        lambda: kv.recall(np.ones(4), k=1, payloads=True),
        lambda: kv.recall_batch(np.ones((2, 4)), k=1),
        lambda: kv.upsert([2], np.ones(4)),
        lambda: kv.delete([1]),
        lambda: kv.delete_namespace(0),
        lambda: kv.clear(),
        lambda: kv.get([1]),
        lambda: kv.stats(),
        lambda: len(kv),
    ]
    for c in calls:
        with pytest.raises(kalos.ClosedError) as ei:
            c()
        assert ei.value.status == kalos._ffi.STATUS_CODES["CLOSED"]
    # the name is free again once the server handle is closed
    with kalos.open(name, dim=4, role="server"):
        pass
    # context manager closes; a dropped handle is closed by the garbage collector
    with kalos.open(name, dim=4, role="server") as kv2:
        pass
    assert kv2.closed
    kv3 = kalos.open(name, dim=4, role="server")
    del kv3
    gc.collect()
    with kalos.open(name, dim=4, role="server"):
        pass


def test_not_picklable(kv):
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(kv)


def test_library_discovery(monkeypatch, tmp_path):
    from kalos import _ffi

    monkeypatch.delenv("KALOS_LIBRARY", raising=False)
    paths = [str(p) for p in _ffi.candidate_paths()]
    assert paths[0].endswith("kalos/libkalos.so")  # bundled first without KALOS_LIBRARY
    assert any("target/release/libkalos.so" in p for p in paths)
    monkeypatch.setenv("KALOS_LIBRARY", kalos.library_path)
    assert _ffi.candidate_paths()[0] == _ffi.Path(kalos.library_path)  # KALOS_LIBRARY first
    assert str(_ffi.find_library()) == kalos.library_path
    monkeypatch.setenv("KALOS_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(OSError, match="KALOS_LIBRARY"):
        _ffi.find_library()
    assert kalos.version() and kalos.status_name(12) == "SERVER_GONE" and kalos.status_name(999) == "UNKNOWN"


def test_discovery_order_in_subprocesses(tmp_path):
    """KALOS_LIBRARY > bundled > cargo target dir, each checked in a fresh interpreter."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    real = Path(kalos.library_path).resolve()
    pkg_src = Path(kalos.__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k not in ("KALOS_LIBRARY", "CARGO_TARGET_DIR", "PYTHONPATH")}

    def loaded(pythonpath, cwd, **extra):
        out = subprocess.run([sys.executable, "-c", "import kalos; print(kalos.library_path)"], cwd=cwd,
                             env={**env, "PYTHONPATH": str(pythonpath), **extra}, capture_output=True, text=True)
        return out.stdout.strip() or out.stderr.strip().splitlines()[-1]

    plain = tmp_path / "plain"
    shutil.copytree(pkg_src, plain / "kalos", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    other = tmp_path / "other" / "libkalos.so"
    other.parent.mkdir()
    shutil.copy(real, other)
    repo = Path(__file__).resolve().parents[3]
    # 3. cargo target dir of the checkout (found from the working directory), release first
    built = [p for p in (repo / "target" / "release" / "libkalos.so", repo / "target" / "debug" / "libkalos.so") if p.is_file()]
    if built:
        assert loaded(plain, repo) == str(built[0])
    # nothing anywhere: a clear error
    assert "libkalos.so not found" in loaded(plain, tmp_path)
    # 2. KALOS_LIBRARY beats the target dir
    assert loaded(plain, repo, KALOS_LIBRARY=str(other)) == str(other)
    assert "does not name an existing file" in loaded(plain, repo, KALOS_LIBRARY=str(tmp_path / "nope.so"))
    # bundled beats the target dir; 1. KALOS_LIBRARY beats the bundled library
    bundled = tmp_path / "bundled"
    shutil.copytree(plain, bundled)
    shutil.copy(real, bundled / "kalos" / "libkalos.so")
    assert loaded(bundled, repo) == str(bundled / "kalos" / "libkalos.so")
    assert loaded(bundled, repo, KALOS_LIBRARY=str(other)) == str(other)


def test_version_and_star_import():
    import re

    from conftest import REPO

    crate = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
    assert kalos.__version__ == crate == kalos.version()
    # `from kalos import *` exports the API but never shadows the builtin open().
    assert "open" not in kalos.__all__
    ns = {}
    exec("from kalos import *", ns)
    assert "open" not in ns and {"Kalos", "KalosError", "NotFoundError", "__version__"} <= set(ns)
    assert all(hasattr(kalos, n) for n in kalos.__all__)

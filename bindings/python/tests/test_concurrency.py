"""Many threads on one handle; close racing calls; two processes (one writes, one reads)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kalos
from conftest import PY, child_env, ref_topk


def test_many_threads_one_handle(name):
    rng = np.random.default_rng(5)
    n, d = 2000, 32
    table = rng.standard_normal((n, d)).astype(np.float32)
    ids = np.arange(n, dtype=np.uint64)
    queries = rng.standard_normal((64, d)).astype(np.float32)
    want = [ref_topk(table, ids, q, 5)[0].tolist() for q in queries]
    errors = []
    with kalos.open(name, dim=d, role="server") as kv:
        kv.upsert(ids, table)

        def reader(t):
            try:
                for i in range(150):
                    j = (t * 7 + i) % len(queries)
                    if i % 10 == 0:
                        got = kv.recall_batch(queries[j : j + 2], k=5)[0][0].tolist()
                    elif i % 10 == 1:
                        got = kv.recall(queries[j], k=5, payloads=True)[0].tolist()
                    else:
                        got = kv.recall(queries[j], k=5)[0].tolist()
                    if got != want[j]:
                        errors.append((t, j, got, want[j]))
            except Exception as e:  # pragma: no cover
                errors.append(e)

        def writer(t):
            try:
                base = 1_000_000 + t * 1000
                for i in range(100):
                    # far-away vectors in their own namespace: never in the readers' top-5
                    kv.upsert([base + i], np.full(d, -1.0 if i % 2 else -2.0), namespace=9 + t, payloads=[b"w"])
                    assert kv.get([base + i]).payloads == [b"w"]
                assert kv.delete_namespace(9 + t) == 100
            except Exception as e:  # pragma: no cover
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(t,)) for t in range(8)]
        threads += [threading.Thread(target=writer, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        assert kv.stats()["queries"] >= 8 * 150


def test_close_while_threads_run(name):
    kv = kalos.open(name, dim=8, role="server")
    kv.upsert(np.arange(100), np.random.default_rng(1).random((100, 8)))
    stop = threading.Event()
    outcomes = {"ok": 0, "closed": 0, "other": []}
    lock = threading.Lock()

    def spin():
        while not stop.is_set():
            try:
                kv.recall(np.ones(8, np.float32), k=3)
                with lock:
                    outcomes["ok"] += 1
            except kalos.ClosedError:
                with lock:
                    outcomes["closed"] += 1
                return
            except Exception as e:  # pragma: no cover
                with lock:
                    outcomes["other"].append(e)
                return

    threads = [threading.Thread(target=spin) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    kv.close()  # waits for in-flight calls, then frees the handle: no use-after-free
    stop.set()
    for t in threads:
        t.join(5)
    assert outcomes["other"] == [] and outcomes["ok"] > 0 and outcomes["closed"] == 6


@pytest.mark.parametrize("path", ["general", "fast"])
def test_gil_released_during_wait(name, path):
    """A recall blocked on a stopped server does not stall other Python threads: ctypes.CDLL
    drops the GIL around each foreign call, and so does kalos._fastcall (the fast path: a
    float32 query, the handle's timeout)."""
    import os
    import signal

    from test_errors import _serve

    p = _serve(name)
    try:
        with kalos.open(name, role="client", heartbeat_timeout=30, timeout=2.0) as kv:
            kv.upsert([1], np.ones(4))
            os.kill(p.pid, signal.SIGSTOP)
            time.sleep(0.1)  # let the stop take effect
            result = []

            def blocked():
                try:
                    if path == "fast":
                        kv.recall(np.ones(4, np.float32), k=1)
                    else:
                        kv.recall(np.ones(4), k=1, timeout=2.0)
                except kalos.KalosTimeoutError as e:
                    result.append(e)

            t = threading.Thread(target=blocked)
            t.start()
            time.sleep(0.05)
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < 0.4:  # runs only if the blocked thread dropped the GIL
                n += 1
            assert t.is_alive(), result
            assert n > 1000, n
            t.join(5)
            assert len(result) == 1
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.wait(10)


WRITER = textwrap.dedent(
    """
    import sys, numpy as np, kalos
    name, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(11)
    table = rng.standard_normal((n, d)).astype(np.float32)
    role = sys.argv[4]
    kv = kalos.open(name, dim=d, role=role)
    for start in range(0, n, 100):
        kv.upsert(np.arange(start, min(n, start + 100)), table[start:start + 100],
                  namespace=3, payloads=[f"row {i}" for i in range(start, min(n, start + 100))])
    print("WROTE", flush=True)
    sys.stdin.read()  # keep serving until the test closes our stdin
    kv.close()
    """
)


@pytest.mark.parametrize("writer_role", ["server", "client"])
def test_two_processes_writer_and_reader(name, writer_role):
    n, d = 1000, 16
    table = np.random.default_rng(11).standard_normal((n, d)).astype(np.float32)
    ids = np.arange(n, dtype=np.uint64)
    server = None
    if writer_role == "client":  # this process serves; the child writes as a client
        server = kalos.open(name, dim=d, role="server")
    p = subprocess.Popen([PY, "-c", WRITER, name, str(n), str(d), writer_role], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert p.stdout.readline().strip() == "WROTE"
        with kalos.open(name, role="client") as kv:
            assert len(kv) == n
            rng = np.random.default_rng(12)
            for _ in range(20):
                q = rng.standard_normal(d).astype(np.float32)
                got, scores, pl = kv.recall(q, k=8, namespace=3, payloads=True)
                want, want_s = ref_topk(table, ids, q, 8)
                assert got.tolist() == want.tolist()
                np.testing.assert_allclose(scores, want_s, rtol=1e-4, atol=1e-5)
                assert pl == [f"row {i}".encode() for i in got.tolist()]
    finally:
        p.stdin.close()
        assert p.wait(20) == 0
        if server is not None:
            server.close()


def test_fork_child_cannot_use_or_close_parent_handle(name):
    import gc
    import os

    kv = kalos.open(name, dim=4, role="server")
    kv.upsert([1], np.ones(4))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited handle is disowned, and dropping it must not close the store
        code = 1
        try:
            try:
                kv.recall(np.ones(4, np.float32), k=1)
            except kalos.ClosedError as e:
                if "fork" in str(e):
                    code = 0
            kv.close()  # a no-op in the child
        finally:
            gc.collect()
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00" and status == 0
    # the parent's store is intact and served
    assert kv.recall(np.ones(4, np.float32), k=1)[0].tolist() == [1]
    with kalos.open(name, role="client") as c:
        assert len(c) == 1
    kv.close()


def test_numpy_integer_arguments(kv):
    kv.upsert(np.array([1, 2], np.int32), np.ones((2, 16)), namespace=np.uint64(3))
    assert kv.recall(np.ones(16, np.float32), np.int64(2))[0].tolist() == [1, 2]
    assert kv.recall(np.ones(16), np.uint32(1), namespace=np.int64(3))[0].tolist() == [1]
    assert kv.recall_batch(np.ones((1, 16)), np.int16(2))[2].tolist() == [2]
    assert kv.delete_namespace(np.uint64(3)) == 2
    with pytest.raises(OverflowError):
        kv.delete_namespace(-1)
    with pytest.raises(OverflowError):
        kv.upsert([1], np.ones(16), namespace=2**64)

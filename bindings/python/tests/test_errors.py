"""Every error status the binding can trigger, each raised as its own KalosError subclass."""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

import kalos
from kalos import _ffi
from conftest import kalosd_path, unique_name

S = _ffi.STATUS_CODES


def raises(cls, fn, *a, **kw):
    with pytest.raises(cls) as ei:
        fn(*a, **kw)
    e = ei.value
    assert isinstance(e, kalos.KalosError)
    assert e.status == cls.status and str(e).startswith(cls.status_name), str(e)
    return e


def test_argument_errors(kv):
    kv.upsert([1], np.ones(16))
    raises(kalos.DimensionMismatchError, kv.recall, np.ones(15), k=1)
    raises(kalos.DimensionMismatchError, kv.recall_batch, np.ones((2, 15)), k=1)
    raises(kalos.DimensionMismatchError, kv.upsert, [2], np.ones(15))
    raises(kalos.DimensionMismatchError, kv.upsert, [2, 3], np.ones(16))
    nan = np.ones(16, np.float32)
    nan[3] = np.nan
    raises(kalos.NonFiniteError, kv.recall, nan, k=1)
    raises(kalos.NonFiniteError, kv.recall_batch, np.stack([np.ones(16), nan]), k=1)
    raises(kalos.NonFiniteError, kv.upsert, [2], np.full(16, np.inf))
    for k in (0, 1025, 2**32 - 1):
        raises(kalos.KOutOfRangeError, kv.recall, np.ones(16), k=k)
        raises(kalos.KOutOfRangeError, kv.recall_batch, np.ones((1, 16)), k=k)
        raises(kalos.KOutOfRangeError, kv.recall, np.ones(16), k=k, payloads=True)
    raises(kalos.KOutOfRangeError, kv.recall, np.ones(16), k=-1)
    raises(kalos.KOutOfRangeError, kv.recall, np.ones(16), k=2**32)
    with pytest.raises(TypeError):
        kv.recall(np.ones(16), k=1.5)
    raises(kalos.InvalidArgumentError, kv.recall, np.ones(16), k=1, namespaces=list(range(65)))
    raises(kalos.InvalidArgumentError, kv.recall, np.ones(16), k=1, recency_weight=2.0, half_life=1)
    raises(kalos.InvalidArgumentError, kv.recall, np.ones(16), k=1, recency_weight=0.5)
    raises(kalos.InvalidArgumentError, kv.upsert, [2, 3], np.ones((2, 16)), payloads=[b"a"])
    raises(kalos.InvalidArgumentError, kv.upsert, [2], np.ones(16), expires_at=1.0)
    with pytest.raises(OverflowError):
        kv.upsert([-1], np.ones(16))
    with pytest.raises(TypeError):
        kv.upsert(["a"], np.ones(16))
    with pytest.raises(TypeError):
        kv.upsert([2], np.ones(16), payloads=b"abc")
    # argument errors are ValueErrors too
    assert issubclass(kalos.DimensionMismatchError, ValueError)
    assert issubclass(kalos.NotFoundError, LookupError)
    assert issubclass(kalos.KalosTimeoutError, TimeoutError)


def test_open_errors(name):
    raises(kalos.InvalidNameError, kalos.open, "bad/name", dim=4)
    raises(kalos.InvalidNameError, kalos.open, "", dim=4)
    raises(kalos.InvalidNameError, kalos.open, "x" * 201, dim=4)
    raises(kalos.InvalidNameError, kalos.open, "nul\x00name", dim=4)
    raises(kalos.InvalidArgumentError, kalos.open, name, dim=0)  # creating needs a dim
    raises(kalos.NotFoundError, kalos.open, name, role="client")
    with kalos.open(name, dim=4, role="server"):
        raises(kalos.AlreadyExistsError, kalos.open, name, dim=4, role="server")
        raises(kalos.DimensionMismatchError, kalos.open, name, dim=5, role="client")
    try:
        kalos.open(unique_name("cuda"), dim=4, backend="cuda").close()
    except kalos.BackendUnavailableError as e:
        assert e.status == S["BACKEND_UNAVAILABLE"]


def test_store_full_and_payload_too_large(name):
    with kalos.open(name, dim=4, role="server", capacity=3, max_payload_bytes=8) as kv:
        kv.upsert([1, 2], np.ones((2, 4)))
        raises(kalos.StoreFullError, kv.upsert, [3, 4], np.ones((2, 4)))
        assert len(kv) == 2  # nothing was written
        kv.upsert([3], np.ones(4))
        kv.upsert([3], np.ones(4) * 2)  # replacing does not need room
        raises(kalos.StoreFullError, kv.upsert, [4], np.ones(4))
        raises(kalos.PayloadTooLargeError, kv.upsert, [1], np.ones(4), payloads=[b"123456789"])
        kv.upsert([1], np.ones(4), payloads=[b"12345678"])


def test_not_found(kv):
    kv.upsert([1], np.ones(16))
    raises(kalos.NotFoundError, kv.delete, [2])
    raises(kalos.NotFoundError, kv.get, [1, 2])
    assert kv.get([1]).ids.tolist() == [1]


def test_too_large(name):
    with kalos.open(name, dim=4, role="server", slot_bytes=4096, max_payload_bytes=1024) as kv:
        kv.upsert(np.arange(600), np.random.default_rng(0).random((600, 4)))
        raises(kalos.TooLargeError, kv.recall, np.ones(4), k=1024)


def test_raw_null_pointer_and_buffer_too_small(kv):
    # The wrapper never passes NULL or short buffers; drive the C API directly to check that
    # those statuses map to their classes through the same error path.
    lib = _ffi.lib
    cnt = ctypes.c_size_t()
    rc = lib.kalos_recall(None, None, 0, 1, None, None, 0, None, 0, ctypes.addressof(cnt))
    assert rc == S["NULL_POINTER"]
    raises(kalos.NullPointerError, kalos._check, rc)
    q = np.ones(16, np.float32)
    ids = np.empty(4, np.uint64)
    sc = np.empty(4, np.float32)
    rc = lib.kalos_recall(kv._h, q.ctypes.data, 16, 8, None, ids.ctypes.data, 4, sc.ctypes.data, 4, ctypes.addressof(cnt))
    assert rc == S["BUFFER_TOO_SMALL"]
    raises(kalos.BufferTooSmallError, kalos._check, rc)


def _serve(name, dim=4, extra=()):
    """Starts kalosd serving `name` with a tiny table; returns the process once it serves."""
    p = subprocess.Popen(
        [str(kalosd_path()), "serve", "--name", name, "--dim", str(dim), "--server-spin-us", "100", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    line = p.stdout.readline()
    assert "serving" in line, line + p.stdout.read() if p.poll() is not None else line
    return p


def test_server_gone_after_kill(name):
    p = _serve(name)
    try:
        with kalos.open(name, role="client", timeout=3, heartbeat_timeout=1) as kv:
            kv.upsert([1], np.ones(4))
            assert kv.recall(np.ones(4), k=1)[0].tolist() == [1]
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            t0 = time.monotonic()
            raises(kalos.ServerGoneError, kv.recall, np.ones(4), k=1)
            assert time.monotonic() - t0 < 3.5
            raises(kalos.ServerGoneError, kv.upsert, [2], np.ones(4))
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    # a new server can take the name over (role auto cleans up the dead segment)
    with kalos.open(name, dim=4) as kv:
        assert len(kv) == 0


def test_server_gone_after_clean_stop(name):
    p = _serve(name)
    try:
        kv = kalos.open(name, role="client", timeout=3)
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        raises(kalos.ServerGoneError, kv.recall, np.ones(4), k=1)
        kv.close()
    finally:
        if p.poll() is None:
            p.kill()


def test_server_gone_in_process(name):
    server = kalos.open(name, dim=4, role="server")
    client = kalos.open(name, role="client", timeout=2)
    server.close()
    raises(kalos.ServerGoneError, client.recall, np.ones(4), k=1)
    client.close()


def test_timeout_when_server_is_stopped(name):
    p = _serve(name)
    try:
        with kalos.open(name, role="client", timeout=5, heartbeat_timeout=30) as kv:
            kv.upsert([1], np.ones(4))
            os.kill(p.pid, signal.SIGSTOP)
            time.sleep(0.05)
            t0 = time.monotonic()
            raises(kalos.KalosTimeoutError, kv.recall, np.ones(4), k=1, timeout=0.3)
            assert 0.25 < time.monotonic() - t0 < 2.0
            raises(kalos.KalosTimeoutError, kv.upsert, [2], np.ones(4), timeout=0.3)
            os.kill(p.pid, signal.SIGCONT)
            deadline = time.monotonic() + 5
            while True:  # the server recovers and answers again
                try:
                    assert kv.recall(np.ones(4), k=1)[0][0] == 1
                    break
                except kalos.KalosTimeoutError:
                    assert time.monotonic() < deadline
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.wait(10)


def _fake_segment(name, payload: bytes):
    path = f"/dev/shm/kalos.{name}"
    with open(path, "wb") as f:
        f.write(payload.ljust(8192, b"\0"))
    os.chmod(path, 0o600)
    return path


def test_hostile_segments(name):
    # Not a Kalos segment: CORRUPT
    path = _fake_segment(name, b"NOTKALOS" + struct.pack("<I", 1))
    try:
        raises(kalos.CorruptError, kalos.open, name, role="client")
    finally:
        os.unlink(path)
    # A Kalos segment of another layout version: VERSION_MISMATCH
    path = _fake_segment(name, b"KALOSSHM" + struct.pack("<I", 999))
    try:
        raises(kalos.VersionMismatchError, kalos.open, name, role="client")
    finally:
        os.unlink(path)
    # A segment owned by another user: PERMISSION_DENIED (needs root to chown)
    if os.geteuid() == 0:
        path = _fake_segment(name, b"KALOSSHM" + struct.pack("<I", 1))
        os.chown(path, 12345, 12345)
        try:
            raises(kalos.PermissionDeniedError, kalos.open, name, role="client")
        finally:
            os.unlink(path)


def test_persistence_errors(name, tmp_path):
    """LOCKED: two servers on one data directory (skipped while persistence is not built)."""
    try:
        a = kalos.open(name, dim=4, role="server", data_dir=tmp_path)
    except kalos.InvalidArgumentError as e:
        if "not implemented" in str(e):
            pytest.skip(f"core: {e}")
        raise
    with a:
        raises(kalos.LockedError, kalos.open, unique_name("locked"), dim=4, role="server", data_dir=tmp_path)


def test_persistence_round_trip(name, tmp_path):
    """With a data directory, acknowledged writes survive a restart (skipped until built)."""
    try:
        kv = kalos.open(name, dim=4, role="server", data_dir=str(tmp_path), sync="always")
    except kalos.InvalidArgumentError as e:
        if "not implemented" in str(e):
            pytest.skip(f"core: {e}")
        raise
    with kv:
        kv.upsert([1, 2], np.eye(2, 4), namespace=5, payloads=[b"one", None])
        kv.delete([2])
    with kalos.open(name, dim=4, role="server", data_dir=str(tmp_path)) as kv:
        r = kv.get([1])
        assert r.payloads == [b"one"] and r.namespaces.tolist() == [5]
        raises(kalos.NotFoundError, kv.get, [2])

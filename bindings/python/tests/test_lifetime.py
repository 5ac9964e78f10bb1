"""Store lifetime under role auto: a store outlives the process that opened it first.

Every process here opens with role auto and no data_dir, so the store lives in
$XDG_DATA_HOME/kalos/<name>, with XDG_DATA_HOME set to a temporary directory.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import kalos
from conftest import PY, child_env

N, D = 300, 8

# Opens the store (role auto), writes N memories, says "ready", holds it until stdin closes.
HOLDER = r"""
import sys, numpy as np, kalos
name, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with kalos.open(name, dim=d, metric="l2") as kv:
    ids = np.arange(n, dtype=np.uint64)
    kv.upsert(ids, (ids[:, None] + np.arange(d)[None, :]).astype(np.float32),
              payloads=[f"memory {i}".encode() for i in range(n)])
    print("ready", kv.is_server, flush=True)
    sys.stdin.read()
"""

# Opens the store (role auto) in a new process and checks every memory.
READER = r"""
import sys, numpy as np, kalos
name, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with kalos.open(name, dim=d, metric="l2") as kv:
    ids = np.arange(n, dtype=np.uint64)
    got = kv.get(ids)
    assert len(kv) == n, len(kv)
    np.testing.assert_array_equal(got.vectors, (ids[:, None] + np.arange(d)[None, :]).astype(np.float32))
    assert list(got.payloads) == [f"memory {i}".encode() for i in range(n)]
    print("read", len(kv), flush=True)
"""


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    return tmp_path


def _expected():
    ids = np.arange(N, dtype=np.uint64)
    return ids, (ids[:, None] + np.arange(D)[None, :]).astype(np.float32)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_two_auto_processes_keep_their_data_after_the_first_exits(name, data_home, how):
    a = subprocess.Popen([PY, "-c", HOLDER, name, str(N), str(D)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert a.stdout.readline().split() == ["ready", "True"]
        with kalos.open(name, dim=D, metric="l2", timeout=10) as kv:
            assert not kv.is_server
            assert len(kv) == N
            if how == "exit":
                a.stdin.close()
                assert a.wait(timeout=30) == 0
            else:
                a.kill()
                a.wait(timeout=30)
            # The first process is gone: this one takes the store over and keeps every memory.
            ids, vecs = _expected()
            got = kv.get(ids)
            np.testing.assert_array_equal(got.vectors, vecs)
            assert kv.is_server
            hit_ids, _ = kv.recall(vecs[42], k=1)
            assert hit_ids.tolist() == [42]
            kv.upsert([N], np.zeros((1, D), dtype=np.float32) + 0.5)
        assert (data_home / "kalos" / name).is_dir()
        # The write made after the takeover is durable too.
        with kalos.open(name, dim=D, metric="l2") as kv:
            assert len(kv) == N + 1
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()


def test_a_writes_and_exits_then_b_reads_every_memory(name, data_home):
    a = subprocess.Popen([PY, "-c", HOLDER, name, str(N), str(D)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=child_env())
    assert a.stdout.readline().split() == ["ready", "True"]
    a.stdin.close()
    assert a.wait(timeout=30) == 0
    r = subprocess.run([PY, "-c", READER, name, str(N), str(D)], capture_output=True, text=True,
                       env=child_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["read", str(N)]


def test_ephemeral_auto_store_ends_with_its_server(name, data_home):
    with kalos.open(name, dim=D, ephemeral=True) as kv:
        kv.upsert([1], np.ones((1, D), dtype=np.float32))
    assert not (data_home / "kalos").exists()
    with kalos.open(name, dim=D, ephemeral=True) as kv:
        assert len(kv) == 0

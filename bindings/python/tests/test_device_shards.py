"""Device shards (``kalos.open(device_shards=N, placement=...)``): a sharded store answers every
recall exactly like an unsharded one holding the same memories: same ids, same scores, same
order, with and without namespace filters, single and batched. Vectors and queries hold small
integers, so every ip and l2 score is exact in float32 whatever the summation order and ties are
common: both stores must break them the same way (lower id first).

The cross-language test serves a sharded store with ``kalosd serve --device-shards 3
--placement namespace``; Python and Go (conftest's ``go_peer``) write into it and Go reads it.

The seed is printed; ``KALOS_TEST_SEED=n`` replays a run.
"""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import pytest

import kalos
from conftest import kalosd_path, unique_name

DIM = 16
ROWS = 4000
NAMESPACES = 12


def seeded(test: str) -> np.random.Generator:
    seed = int(os.environ.get("KALOS_TEST_SEED") or random.getrandbits(63))
    print(f"{test}: seed {seed} (KALOS_TEST_SEED={seed} to replay)")
    return np.random.default_rng(seed)


def int_vectors(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    return rng.integers(-3, 4, size=(n, dim)).astype(np.float32)


def write_same(stores, rng: np.random.Generator, rows: int = ROWS, dim: int = DIM) -> int:
    """Applies one random history of writes to every store; returns the live count."""
    ids = rng.choice(1 << 40, size=rows, replace=False).astype(np.uint64)
    vecs = int_vectors(rng, rows, dim)
    ns = rng.integers(0, NAMESPACES, size=rows).astype(np.uint64)
    payloads = [f"memory {i}" for i in ids]
    # A tenth replaced with new vectors and namespaces (under namespace placement they move
    # between shards), 300 deleted by id, one namespace deleted.
    again = rng.choice(rows, rows // 10, replace=False)
    again_vecs = int_vectors(rng, again.size, dim)
    again_ns = rng.integers(0, NAMESPACES, size=again.size).astype(np.uint64)
    gone = ids[rng.choice(rows, 300, replace=False)]
    for s in stores:
        s.upsert(ids, vecs, namespaces=ns, payloads=payloads)
        s.upsert(ids[again], again_vecs, namespaces=again_ns)
        s.delete(gone)
        s.delete_namespace(5)
    counts = {len(s) for s in stores}
    assert len(counts) == 1, counts
    return counts.pop()


def random_namespaces(rng: np.random.Generator):
    """None (every namespace) or 1 to 3 namespaces, sometimes the deleted one or one never used."""
    if rng.random() < 0.4:
        return None
    return [int(x) for x in rng.integers(0, NAMESPACES + 2, size=int(rng.integers(1, 4)))]


def assert_same_answers(sharded: kalos.Kalos, plain: kalos.Kalos, live: int, rng: np.random.Generator) -> None:
    full = 0
    for t in range(300):
        q = int_vectors(rng, 1)[0]
        k = int(rng.integers(1, 51))
        nss = random_namespaces(rng)
        a_ids, a_scores = sharded.recall(q, k, namespaces=nss)
        b_ids, b_scores = plain.recall(q, k, namespaces=nss)
        assert a_ids.tolist() == b_ids.tolist(), (t, k, nss)
        assert a_scores.tobytes() == b_scores.tobytes(), (t, k, nss, a_scores, b_scores)
        if nss is None:
            assert len(a_ids) == min(k, live)
            full += 1
    assert full > 0
    for t in range(20):
        q = int_vectors(rng, 1)[0]
        k = int(rng.integers(1, 51))
        nss = random_namespaces(rng)
        a = sharded.recall(q, k, namespaces=nss, payloads=True)
        b = plain.recall(q, k, namespaces=nss, payloads=True)
        assert a[0].tolist() == b[0].tolist() and a[1].tobytes() == b[1].tobytes() and a[2] == b[2], (t, k, nss)
    for t in range(20):
        qs = int_vectors(rng, int(rng.integers(2, 40)))
        k = int(rng.integers(1, 51))
        nss = random_namespaces(rng)
        a_ids, a_scores, a_counts = sharded.recall_batch(qs, k, namespaces=nss)
        b_ids, b_scores, b_counts = plain.recall_batch(qs, k, namespaces=nss)
        assert a_counts.tolist() == b_counts.tolist(), (t, k, nss)
        assert a_ids.tolist() == b_ids.tolist(), (t, k, nss)
        assert a_scores.tobytes() == b_scores.tobytes(), (t, k, nss)
        assert a_counts.sum() > 0 or nss is not None


@pytest.mark.parametrize("placement,metric", [("id", "ip"), ("namespace", "l2")])
def test_a_sharded_store_answers_like_an_unsharded_one(placement, metric):
    rng = seeded(f"test_a_sharded_store_answers_like_an_unsharded_one[{placement}]")
    common = dict(dim=DIM, metric=metric, role="server", backend="cpu", capacity=20_000)
    with kalos.open(unique_name("shards3"), device_shards=3, placement=placement, **common) as sharded, \
            kalos.open(unique_name("plain"), **common) as plain:
        assert sharded.stats()["engine_name"].startswith("shards3x["), sharded.stats()["engine_name"]
        assert not plain.stats()["engine_name"].startswith("shards"), plain.stats()["engine_name"]
        live = write_same([sharded, plain], rng)
        assert live > ROWS // 2
        assert_same_answers(sharded, plain, live, rng)


def test_device_shards_options_are_checked():
    common = dict(dim=4, role="server", backend="cpu")
    with pytest.raises(kalos.InvalidArgumentError, match="device_shards = 65"):
        kalos.open(unique_name("shards65"), device_shards=kalos._ffi.KALOS_MAX_DEVICE_SHARDS + 1, **common)
    with pytest.raises(kalos.InvalidArgumentError, match="placement"):
        kalos.open(unique_name("place7"), device_shards=2, placement=7, **common)
    with pytest.raises(ValueError, match="placement"):
        kalos.open(unique_name("placex"), device_shards=2, placement="shard", **common)
    with pytest.raises(ValueError, match="device_shards"):
        kalos.open(unique_name("shardsneg"), device_shards=-1, **common)
    # A sharded CUDA store: one CUDA engine a shard where there is a GPU, else a clear error.
    try:
        with kalos.open(unique_name("shardscuda"), device_shards=2, **dict(common, backend="cuda")) as g:
            assert g.stats()["engine_name"].startswith("shards2x[cuda"), g.stats()["engine_name"]
    except kalos.BackendUnavailableError as e:
        assert "CUDA" in str(e)
    # gpus: "all" or ordinals, checked here; ignored by the CPU backend.
    for bad in ("some", [64], [-1], [True], ["0"]):
        with pytest.raises(ValueError, match="gpus"):
            kalos.open(unique_name("gpusbad"), gpus=bad, **common)
    for ok in ("all", "ALL", [0], [0, 1, 63], range(2)):
        with kalos.open(unique_name("gpusok"), gpus=ok, device_shards=2, **common) as g:
            assert g.stats()["engine_name"].startswith("shards2x[cpu"), g.stats()["engine_name"]
    # On CUDA, device 63 exists on no host: a clear error (or no CUDA at all).
    with pytest.raises((kalos.InvalidArgumentError, kalos.BackendUnavailableError)):
        kalos.open(unique_name("gpus63"), gpus=[63], **dict(common, backend="cuda"))
    # One shard is one table; the largest count opens.
    with kalos.open(unique_name("shards1"), device_shards=1, **common) as one:
        assert not one.stats()["engine_name"].startswith("shards")
    with kalos.open(unique_name("shards64"), device_shards=64, placement="NAMESPACE", **common) as many:
        assert many.stats()["engine_name"].startswith("shards64x[")


def go_line(queries) -> str:
    return ";".join(",".join(str(int(x)) for x in q) for q in queries)


def test_go_reads_and_writes_a_sharded_kalosd(go_peer):
    """Python and Go write into a sharded kalosd; Go's recalls (single and batched) equal those of
    an unsharded Python store that got the same writes."""
    rng = seeded("test_go_reads_and_writes_a_sharded_kalosd")
    dim, name = 8, unique_name("kalosd-shards")
    p = subprocess.Popen(
        [str(kalosd_path()), "serve", "--name", name, "--dim", str(dim), "--metric", "l2", "--backend", "cpu",
         "--capacity", "10000", "--device-shards", "3", "--placement", "namespace"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = p.stdout.readline()
        assert "serving" in line, (line, p.stderr.read() if p.poll() is not None else "")
        with kalos.open(name, role="client", timeout=10) as sharded, \
                kalos.open(unique_name("kalosd-plain"), dim=dim, metric="l2", role="server", backend="cpu") as plain:
            assert sharded.stats()["engine_name"].startswith("shards3x["), sharded.stats()["engine_name"]
            write_same([sharded, plain], rng, rows=2000, dim=dim)
            # Go writes new memories, and moves an existing one into namespace 13, used by no
            # other memory.
            moved = int(sharded.list()[0])
            for mid, ns in ((1, 3), (2, 5), (3, 11), (moved, 13)):
                v = int_vectors(rng, 1, dim)
                r = subprocess.run([*go_peer, "write", name, str(mid), str(ns), go_line(v)],
                                   capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, r.stderr
                plain.upsert([mid], v, namespace=ns)
            assert len(sharded) == len(plain)

            # Go reads: single recalls and batches, with and without namespaces.
            requests, want, in_13 = [], [], []
            for t in range(60):
                qs = int_vectors(rng, 1 if t % 3 else int(rng.integers(2, 9)), dim)
                k = int(rng.integers(1, 51))
                nss = [13] if t < 4 else random_namespaces(rng)
                requests.append(f"{k} {','.join(map(str, nss)) if nss else '-'} {go_line(qs)}")
                ids, scores, counts = plain.recall_batch(qs, k, namespaces=nss)
                if nss == [13]:
                    in_13 += range(len(want), len(want) + len(qs))
                want += [[(int(i), float(s)) for i, s in zip(ids[j, :c], scores[j, :c])] for j, c in enumerate(counts)]
            r = subprocess.run([*go_peer, "recall", name], input="\n".join(requests) + "\n",
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            got = [[(int(h.split(":")[0]), float(np.float32(h.split(":")[1]))) for h in ln.split()]
                   for ln in r.stdout.split("\n")[:-1]]
            assert len(got) == len(want)
            for j, (g, w) in enumerate(zip(got, want)):
                assert g == w, j
            assert in_13 and all([i for i, _ in got[j]] == [moved] for j in in_13)
            assert sum(map(len, got)) > 5 * len(got)
        p.terminate()
        out, err = p.communicate(timeout=20)
        assert p.returncode == 0, (out, err)
    finally:
        # SIGTERM first, also after a failure: kalosd then removes its segment.
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

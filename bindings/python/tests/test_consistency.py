"""The cluster options of a recall (docs/CLUSTER.md) on a single host: read-your-writes, a write
token (``min_seqs``) and stale reads are accepted and satisfied at once, the token is empty and
the lag is zero; bad tokens are refused. tests/test_cluster.py runs them against a cluster."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kalos


@pytest.fixture
def filled(kv):
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((30, kv.dim)).astype(np.float32)
    kv.upsert(np.arange(1, 31), vecs, payloads=[f"m{i}" for i in range(30)])
    return kv, vecs


# Sequences no log has reached: a recall that waited for them would fail with TIMEOUT.
FAR = [1 << 62, 1 << 62, 1 << 62]


@pytest.mark.parametrize("opts", [
    {"read_your_writes": True},
    {"min_seqs": FAR},
    {"min_seqs": np.array(FAR, np.uint64)},
    {"min_seqs": []},
    {"allow_stale": True},
    {"read_your_writes": True, "allow_stale": True, "min_seqs": FAR, "namespace": 0},
], ids=["ryw", "token", "token-array", "empty-token", "stale", "all"])
def test_options_are_satisfied_at_once_on_a_single_host(filled, opts):
    kv, vecs = filled
    q = vecs[4]
    want_ids, want_scores = kv.recall(q, k=5)
    assert want_ids[0] == 5
    ids, scores = kv.recall(q, k=5, timeout=2, **opts)
    assert ids.tolist() == want_ids.tolist() and scores.tolist() == want_scores.tolist()
    ids, scores, payloads = kv.recall(q, k=5, payloads=True, timeout=2, **opts)
    assert ids.tolist() == want_ids.tolist() and payloads[0] == b"m4"
    b_ids, _, counts = kv.recall_batch(vecs[:3], k=5, timeout=2, **opts)
    assert counts.tolist() == [5, 5, 5] and b_ids[:, 0].tolist() == [1, 2, 3]


def test_write_token_is_empty_on_a_single_host(filled):
    kv, _ = filled
    assert kv.write_seqs() == []
    kv.delete([1])
    assert kv.write_seqs() == []
    kv.close()
    with pytest.raises(kalos.ClosedError):
        kv.write_seqs()


def test_last_lag_is_per_thread_and_zero_on_a_single_host(filled):
    kv, vecs = filled
    assert kv.last_lag is None
    kv.recall(vecs[0], k=3)
    assert kv.last_lag is None, "a recall without allow_stale reports no lag"
    kv.recall(vecs[0], k=3, allow_stale=True)
    assert kv.last_lag == kalos.Lag(entries=0, ms=0)
    kv.recall(vecs[0], k=3)
    assert kv.last_lag == kalos.Lag(0, 0), "a recall without allow_stale leaves it as it is"
    seen = []
    t = threading.Thread(target=lambda: seen.append(kv.last_lag))
    t.start()
    t.join()
    assert seen == [None], "another thread's lag is its own"
    # Payload and batch recalls report no lag: it becomes None rather than stale.
    kv.recall(vecs[0], k=3, allow_stale=True, payloads=True)
    assert kv.last_lag is None
    kv.recall(vecs[0], k=3, allow_stale=True)
    kv.recall_batch(vecs[:2], k=3, allow_stale=True)
    assert kv.last_lag is None


def test_bad_tokens_are_refused(filled):
    kv, vecs = filled
    q = vecs[0]
    for call in (
        lambda t: kv.recall(q, k=3, min_seqs=t),
        lambda t: kv.recall(q, k=3, min_seqs=t, payloads=True),
        lambda t: kv.recall_batch(vecs[:2], k=3, min_seqs=t),
    ):
        with pytest.raises(kalos.InvalidArgumentError, match="min_seqs has 4097 entries; at most 4096"):
            call([0] * 4097)
        with pytest.raises(OverflowError, match="min_seqs"):
            call([3, -1])
        with pytest.raises(OverflowError, match="min_seqs"):
            call([1 << 64])
        with pytest.raises(TypeError, match="min_seqs"):
            call([1.5])
        with pytest.raises(TypeError, match="min_seqs"):
            call("1,2,3")
    # The largest token a store can have is accepted.
    assert kv.recall(q, k=3, min_seqs=[0] * 4096)[0][0] == 1


def test_cluster_statuses_are_typed_errors():
    for name, cls in (("UNAVAILABLE", kalos.UnavailableError), ("STALE", kalos.StaleError)):
        code = kalos._ffi.STATUS_CODES[name]
        assert kalos.ERRORS_BY_STATUS[code] is cls and issubclass(cls, kalos.KalosError)
        assert kalos.status_name(code) == name and cls.status == code
        e = kalos.errors.error_for(code, f"{name}: shard 1")
        assert type(e) is cls and str(e) == f"{name}: shard 1"

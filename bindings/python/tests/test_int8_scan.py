"""The int8 scan through the Python binding: the open options, answers equal to an exact store's
(ids and scores), the stats counters, and bad values refused."""

import numpy as np
import pytest

import kalos

from conftest import unique_name


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
def test_int8_store_answers_like_an_exact_store(metric):
    rng = np.random.default_rng(5)
    dim, n = 24, 3000
    table = rng.standard_normal((n, dim)).astype(np.float32)
    ids = np.arange(n, dtype=np.uint64) * 3
    ns = (ids % 4).astype(np.uint64)
    with kalos.open(unique_name("exact"), dim=dim, metric=metric, role="server", backend="cpu") as ex, kalos.open(
        unique_name("int8"), dim=dim, metric=metric, role="server", backend="cpu", scan="int8", rerank=128
    ) as q8:
        for s in (ex, q8):
            s.upsert(ids, table, namespaces=ns)
            s.delete(ids[::7])
        for i in range(20):
            q = rng.standard_normal(dim).astype(np.float32)
            for k, kw in ((1, {}), (10, {"namespaces": [1, 2]}), (60, {})):
                a_ids, a_sc = ex.recall(q, k, **kw)
                b_ids, b_sc = q8.recall(q, k, **kw)
                np.testing.assert_array_equal(a_ids, b_ids)
                np.testing.assert_array_equal(a_sc, b_sc)
        st = q8.stats()
        assert "int8" in st["engine_name"]
        assert st["rerank_queries"] == 60
        assert 0 <= st["rerank_uncertain"] <= st["rerank_queries"]
        assert ex.stats()["rerank_queries"] == 0


def test_bad_scan_options_are_refused():
    with pytest.raises(ValueError, match="scan"):
        kalos.open(unique_name("bad"), dim=4, role="server", scan="int4")
    with pytest.raises(kalos.InvalidArgumentError, match="rerank"):
        kalos.open(unique_name("bad"), dim=4, role="server", scan="int8", rerank=1 << 20)

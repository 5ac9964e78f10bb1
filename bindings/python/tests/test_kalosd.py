"""Cross-language: the Rust daemon `kalosd` serves a table written by numpy; Python recalls it."""

from __future__ import annotations

import signal
import subprocess

import numpy as np
import pytest

import kalos
from conftest import kalosd_path, ref_topk


@pytest.mark.parametrize("metric,ids_dtype", [("cosine", np.uint64), ("l2", np.int64), ("ip", np.uint64)])
def test_kalosd_serves_numpy_table(name, tmp_path, metric, ids_dtype):
    rng = np.random.default_rng(21)
    n, d = 3000, 48
    table = rng.standard_normal((n, d)).astype(np.float32)
    ids = (rng.permutation(1 << 20)[:n] + 7).astype(ids_dtype)
    nss = (np.arange(n) % 5).astype(np.uint64)
    np.save(tmp_path / "v.npy", table)
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "ns.npy", nss)
    p = subprocess.Popen(
        [str(kalosd_path()), "serve", "--name", name, "--dim", str(d), "--metric", metric,
         "--load", str(tmp_path / "v.npy"), "--ids", str(tmp_path / "ids.npy"),
         "--namespaces", str(tmp_path / "ns.npy"), "--backend", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = p.stdout.readline()
        while line and "serving" not in line:
            line = p.stdout.readline()
        assert "serving" in line and f"count={n}" in line, line
        uids = ids.astype(np.uint64)
        with kalos.open(name, role="client") as kv:
            assert kv.dim == d and len(kv) == n and not kv.is_server
            assert kv.stats()["metric"] == metric
            qs = rng.standard_normal((16, d)).astype(np.float32)
            for q in qs:
                got, scores = kv.recall(q, k=10)
                want, want_s = ref_topk(table, uids, q, 10, metric)
                assert got.tolist() == want.tolist()
                np.testing.assert_allclose(scores, want_s, rtol=1e-4, atol=1e-3)
                # namespace filter inside the scan == numpy on the filtered table
                m = nss == 2
                got2, _ = kv.recall(q, k=10, namespace=2)
                assert got2.tolist() == ref_topk(table[m], uids[m], q, 10, metric)[0].tolist()
            b_ids, _, _ = kv.recall_batch(qs, k=10)
            for i, q in enumerate(qs):
                assert b_ids[i].tolist() == ref_topk(table, uids, q, 10, metric)[0].tolist()
            np.testing.assert_allclose(kv.get(uids[:5]).vectors, table[:5], rtol=1e-6)
            assert kv.get(uids[:5]).namespaces.tolist() == nss[:5].tolist()
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=10)[0]
        assert p.returncode == 0, out
        assert "stopped" in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()

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


def _serve(args, name):
    """Starts `kalosd serve` and returns (process, its stderr lines so far) once it serves."""
    p = subprocess.Popen(
        [str(kalosd_path()), "serve", "--name", name, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = p.stdout.readline()
    assert "serving" in line, (line, p.stderr.read() if p.poll() is not None else "")
    return p


def _stop(p):
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, (out, err)
    return out, err


def test_kalosd_metrics_endpoint_scrapes_and_parses(name, tmp_path):
    """`--metrics`: Prometheus text that the reference parser reads, with the server's counts."""
    import re
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    p = _serve(["--dim", "8", "--backend", "cpu", "--capacity", "10", "--data-dir", str(tmp_path / "d"),
                "--metrics", "127.0.0.1:0"], name)
    try:
        # The bound address (port 0: the kernel's choice) is in the log line on stderr.
        addr = None
        while addr is None:
            line = p.stderr.readline()
            assert line, "kalosd exited before logging the metrics address"
            m = re.search(r"metrics at http://([0-9.]+:[0-9]+)/metrics", line)
            addr = m and m.group(1)
        rng = np.random.default_rng(5)
        with kalos.open(name, role="client") as kv:
            kv.upsert(np.arange(6), rng.standard_normal((6, 8)).astype(np.float32))
            for _ in range(7):
                kv.recall(rng.standard_normal(8).astype(np.float32), k=3)
            with pytest.raises(kalos.StoreFullError):
                kv.upsert(np.arange(100, 120), rng.standard_normal((20, 8)).astype(np.float32))
            with pytest.raises(kalos.NotFoundError):
                kv.delete([999])
        body = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        val = {}
        for f in fams.values():
            for s in f.samples:
                val[(s.name, tuple(sorted(s.labels.items())))] = s.value
        assert val[("kalos_requests_total", (("op", "recall"), ("status", "OK")))] == 7
        assert val[("kalos_requests_total", (("op", "upsert"), ("status", "OK")))] == 1
        assert val[("kalos_errors_total", (("op", "upsert"), ("status", "STORE_FULL")))] == 1
        assert val[("kalos_errors_total", (("op", "delete"), ("status", "NOT_FOUND")))] == 1
        assert ("kalos_errors_total", (("op", "recall"), ("status", "OK"))) not in val
        assert fams["kalos_request_duration_seconds"].type == "histogram"
        assert val[("kalos_request_duration_seconds_count", (("op", "recall"),))] == 7
        assert val[("kalos_request_duration_seconds_bucket", (("le", "+Inf"), ("op", "recall")))] == 7
        assert val[("kalos_request_duration_seconds_sum", (("op", "recall"),))] > 0
        assert val[("kalos_rows", ())] == 6
        assert val[("kalos_capacity_rows", ())] == 10
        assert val[("kalos_wal_bytes", ())] > 0
        engine = [s for f in fams.values() for s in f.samples if s.name == "kalos_engine_info"][0]
        assert "cpu" in engine.labels["engine"] and engine.value == 1
        # Anything but GET /metrics is refused, and the server keeps serving.
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{addr}/other", timeout=10)
        assert e.value.code == 404
        stats = subprocess.run([str(kalosd_path()), "stats", "--name", name, "--json"],
                               capture_output=True, text=True, timeout=30)
        assert stats.returncode == 0, stats.stderr
        import json
        js = json.loads(stats.stdout)
        assert js["count"] == 6 and js["capacity"] == 10 and js["errors"] == 2
        assert {"op": "upsert", "status": "STORE_FULL", "count": 1} in js["requests_by"]
    finally:
        if p.poll() is None:
            _stop(p)


def test_kalosd_options_are_strict():
    """An unknown or malformed option exits 2 with a message; --help works on every command."""
    k = str(kalosd_path())
    r = subprocess.run([k, "serve", "--name", "x", "--dim", "4", "--capacty", "10"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--capacty" in r.stderr and "--capacity" in r.stderr, r.stderr
    r = subprocess.run([k, "serve", "--name", "x", "--dim", "four"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--dim" in r.stderr, r.stderr
    r = subprocess.run([k, "serve", "--name", "x", "--dim", "4", "--metric", "hamming"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "hamming" in r.stderr, r.stderr
    r = subprocess.run([k, "frobnicate"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    import re
    from conftest import REPO
    version = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
    r = subprocess.run([k, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == f"kalosd {version}", r.stdout
    for cmd in ("serve", "stats", "import", "export", "repair", "doctor", "query"):
        r = subprocess.run([k, cmd, "--help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "Usage: kalosd " + cmd in r.stdout, (cmd, r.stdout, r.stderr)

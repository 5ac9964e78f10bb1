"""`kalosd query` (JSON filters translated by kalosd) against the Python builders, and metadata
fields through `kalosd export` / `import`."""

from __future__ import annotations

import datetime as dt
import json
import subprocess

import numpy as np

import kalos
from kalos import filters as F
from conftest import kalosd_path
from test_kalosd import _serve as serve_kalosd, _stop
from test_filter_vectors import load as load_vectors

D = 4


def _serve(name, *extra):
    return serve_kalosd(["--dim", str(D), "--metric", "ip", "--backend", "cpu", *extra], name)


def _query(name, requests):
    r = subprocess.run([str(kalosd_path()), "query", "--name", name], input="\n".join(json.dumps(q) for q in requests),
                       capture_output=True, text=True, timeout=60)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()]


def _rows(n):
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((n, D)).astype(np.float32)
    fields = []
    for i in range(n):
        f = {"user": ["ann", "bob", "cy"][i % 3], "n": i - 20, "score": i / 4, "done": i % 2 == 0,
             "tags": ["urgent", "x"] if i % 5 == 0 else ["y"], "kind": ["fact", "pref"][i % 2],
             "at": {"$date": 1704164645000 + i}, "a": i % 4, "b": 2, "c": 3, "agent": "x" if i % 7 == 0 else "z"}
        if i % 3:
            f["archived"] = True
        fields.append(f)
    return vecs, fields


def test_query_filters_match_the_python_builders(name):
    p = _serve(name)
    try:
        n = 60
        vecs, fields = _rows(n)
        ids = list(range(1, n + 1))
        rc, out = _query(name, [{"op": "upsert", "ids": ids, "vectors": vecs.tolist(), "fields": fields,
                                 "payloads": [f"m{i}" for i in ids]}])
        assert rc == 0 and out == [{"ok": True, "upserted": n}], out
        q = [0.3, -0.2, 0.9, 0.1]
        vectors = [v for v in load_vectors() if v["filter"] is not None]
        rc, out = _query(name, [{"op": "recall", "query": q, "k": n, "filter": v["filter"]} for v in vectors])
        assert rc == 0, out
        with kalos.open(name, role="client") as kv:
            for v, resp in zip(vectors, out):
                want = kv.recall(np.asarray(q, np.float32), n, filter=bytes.fromhex(v["hex"]))[0]
                assert [h["id"] for h in resp["hits"]] == [int(i) for i in want], v["name"]
            assert any(len(r["hits"]) not in (0, n) for r in out)  # the filters do select
            # Bad requests are answered and the next line still runs; exit status 1.
            rc, out = _query(name, [
                {"op": "recall", "query": q, "filter": {"n": {"$regex": "x"}}},
                {"op": "recall", "query": q, "filter": {"$and": []}},
                {"op": "delete", "ids": [1], "filter": {"n": 1}},
                {"op": "fly"},
                {"op": "recall", "query": q, "k": 3, "filter": {"user": "ann", "n": {"$gte": 10}}},
            ])
            assert rc == 1
            assert out[0] == {"ok": False, "status": "INVALID_ARGUMENT",
                              "error": 'filter: unknown filter operator "$regex" on field "n"'}, out[0]
            assert "$and takes a non-empty list" in out[1]["error"] and "either" in out[2]["error"]
            assert "unknown op" in out[3]["error"]
            assert out[4]["ok"] and len(out[4]["hits"]) == 3
            assert all((h["id"] - 1) % 3 == 0 and h["id"] - 21 >= 10 for h in out[4]["hits"])
            # delete by filter on the server, then get with fields.
            rc, out = _query(name, [{"op": "delete", "filter": {"user": "bob"}},
                                    {"op": "get", "ids": [1]}])
            assert rc == 0 and out[0] == {"ok": True, "deleted": n // 3}
            got = out[1]["memories"][0]
            assert got["payload"] == "m1" and got["fields"]["at"] == {"$date": 1704164645000}
            assert got["fields"]["tags"] == ["urgent", "x"] and got["fields"]["n"] == -20
            assert kv.recall(np.asarray(q, np.float32), n, filter=F.eq("user", "bob"))[0].size == 0
            assert kv.get_metadata([1])[0]["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
            # list: the ids a filter selects, ascending, from a cursor, with what remains.
            rc, out = _query(name, [{"op": "list", "filter": {"user": "ann"}},
                                    {"op": "list", "filter": {"user": "ann"}, "after": 10, "limit": 3},
                                    {"op": "list", "namespaces": [5]},
                                    {"op": "list", "after": -1}])
            ann = [i for i in ids if (i - 1) % 3 == 0]
            assert out[0] == {"ok": True, "ids": ann, "remaining": 0}
            after = [i for i in ann if i > 10]
            assert out[1] == {"ok": True, "ids": after[:3], "remaining": len(after) - 3}
            assert out[2] == {"ok": True, "ids": [], "remaining": 0}
            assert rc == 1 and "after must be an unsigned integer" in out[3]["error"]
            assert kv.list(F.eq("user", "ann")).tolist() == ann
    finally:
        _stop(p)


def test_fields_round_trip_through_export_and_import(name, tmp_path):
    data = tmp_path / "data"
    p = _serve(name, "--data-dir", str(data))
    try:
        vecs, fields = _rows(12)
        rc, out = _query(name, [{"op": "upsert", "ids": list(range(12)), "vectors": vecs.tolist(), "fields": fields}])
        assert rc == 0, out
    finally:
        _stop(p)
    k = str(kalosd_path())
    files = lambda tag: [f"--vectors={tmp_path / (tag + 'v.npy')}", f"--ids={tmp_path / (tag + 'i.npy')}",  # noqa: E731
                         f"--payloads={tmp_path / (tag + 'p.jsonl')}"]
    r = subprocess.run([k, "export", "--data-dir", str(data), *files("a")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (tmp_path / "ap.jsonl").read_text().splitlines()]
    assert {x["id"]: x["fields"] for x in lines} == dict(enumerate(fields))
    r = subprocess.run([k, "import", "--data-dir", str(tmp_path / "data2"), "--dim", str(D), "--metric", "ip",
                        *files("a")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([k, "export", "--data-dir", str(tmp_path / "data2"), *files("b")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "bp.jsonl").read_text() == (tmp_path / "ap.jsonl").read_text()
    # A field typed differently by two lines fails the import, naming it.
    (tmp_path / "ap.jsonl").write_text("\n".join(json.dumps({**x, "fields": {"n": "str"}} if x["id"] == 3 else x)
                                                 for x in lines))
    r = subprocess.run([k, "import", "--data-dir", str(tmp_path / "data3"), "--dim", str(D), "--metric", "ip",
                        *files("a")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and 'field \\"n\\" of id 3 is keyword' in r.stderr, r.stderr

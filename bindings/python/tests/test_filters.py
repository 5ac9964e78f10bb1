"""Metadata fields and filters from Python: builders, dict form, exactness against a numpy
reference over random data and random expressions, errors, delete_where, get_metadata."""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pytest

import kalos
from kalos import filters as F

USERS = ["ann", "bob", "cyd", "dee"]
TAGS = ["a", "b", "c", "d", "e"]


def _meta(r: random.Random, i: int, full: bool) -> dict:
    m = {"doc": f"d{i}"}
    if full or r.random() < 0.9:
        m["user"] = r.choice(USERS)
    if full or r.random() < 0.7:
        m["tags"] = r.sample(TAGS, r.randint(0 if not full else 1, 3))
    if full or r.random() < 0.8:
        m["n"] = r.randint(-5, 5)
    if full or r.random() < 0.6:
        m["x"] = r.randint(-6, 6) * 0.5
    if full or r.random() < 0.5:
        m["ok"] = r.random() < 0.5
    return m


def _eq(m: dict, f: str, v) -> bool:
    if f not in m:
        return False
    a = m[f]
    if isinstance(a, list):
        return isinstance(v, str) and v in a
    if isinstance(a, bool) or isinstance(v, bool):
        return isinstance(a, bool) and isinstance(v, bool) and a == v
    if isinstance(a, str) or isinstance(v, str):
        return isinstance(a, str) and isinstance(v, str) and a == v
    return float(a) == float(v)


def _ord(m: dict, f: str, v, op: str) -> bool:
    if f not in m or isinstance(m[f], list):
        return False
    a = m[f]
    kind = lambda x: "b" if isinstance(x, bool) else "s" if isinstance(x, str) else "n"  # noqa: E731
    if kind(a) != kind(v):
        return False
    if kind(a) == "s":
        a, v = a.encode(), v.encode()
    return {"$gt": a > v, "$gte": a >= v, "$lt": a < v, "$lte": a <= v}[op]


def ref_match(d: dict, m: dict) -> bool:
    """The documented semantics of the dict form, evaluated in Python."""
    for k, c in d.items():
        if k == "$and":
            ok = all(ref_match(x, m) for x in c)
        elif k == "$or":
            ok = any(ref_match(x, m) for x in c)
        elif k == "$not":
            ok = not ref_match(c, m)
        elif isinstance(c, dict):
            ok = True
            for op, v in c.items():
                if op in ("$eq", "$contains"):
                    ok &= _eq(m, k, v)
                elif op == "$ne":
                    ok &= not _eq(m, k, v)
                elif op == "$in":
                    ok &= any(_eq(m, k, x) for x in v)
                elif op == "$nin":
                    ok &= not any(_eq(m, k, x) for x in v)
                elif op == "$exists":
                    present = k in m and m[k] != []
                    ok &= present == bool(v)
                else:
                    ok &= _ord(m, k, v, op)
        else:
            ok = _eq(m, k, c)
        if not ok:
            return False
    return True


def _value(r: random.Random):
    return r.choice([r.choice(USERS), r.choice(TAGS), r.randint(-6, 6), r.randint(-12, 12) * 0.25, r.random() < 0.5, "zz"])


def _leaf(r: random.Random) -> dict:
    f = r.choice(["user", "tags", "n", "x", "ok", "nope"])
    op = r.choice(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$contains", None])
    if op is None:
        return {f: _value(r)}
    if op in ("$in", "$nin"):
        return {f: {op: [_value(r) for _ in range(r.randint(1, 4))]}}
    if op == "$exists":
        return {f: {op: r.random() < 0.5}}
    return {f: {op: _value(r)}}


def _expr(r: random.Random, depth: int) -> dict:
    if depth == 0 or r.random() < 0.35:
        return _leaf(r)
    kind = r.choice(["$and", "$or", "$not"])
    if kind == "$not":
        return {"$not": _expr(r, depth - 1)}
    return {kind: [_expr(r, depth - 1) for _ in range(r.randint(1, 3))]}


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_random_dict_filters_are_exact(name, metric):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    r = random.Random(seed)
    rng = np.random.default_rng(seed)
    n, dim = 1200, 8
    with kalos.open(name, dim=dim, metric=metric, role="server", backend="cpu") as kv:
        vecs = rng.integers(-3, 4, size=(n, dim)).astype(np.float32)
        ids = np.arange(n, dtype=np.uint64) * 3 + 1
        metas = [_meta(r, int(i), j == 0) for j, i in enumerate(ids)]
        kv.upsert(ids, vecs, metadata=metas)
        for case in range(400):
            d = _expr(r, 3)
            q = rng.integers(-3, 4, size=dim).astype(np.float32)
            k = r.choice([1, 5, 20, 100])
            mask = np.array([ref_match(d, m) for m in metas])
            if case < 100:  # kalos.filters.matches (the adapters' reference) agrees with this one
                expr = F.from_dict(d)
                assert [F.matches(expr, m) for m in metas] == mask.tolist(), (case, d)
            s = vecs.astype(np.float64) @ q if metric == "ip" else ((vecs - q) ** 2).sum(axis=1).astype(np.float64)
            cand = np.nonzero(mask)[0]
            order = np.lexsort((ids[cand], -s[cand] if metric == "ip" else s[cand]))[:k]
            want_ids, want_scores = ids[cand][order], s[cand][order]
            got_ids, got_scores = kv.recall(q, k, filter=d)
            assert list(got_ids) == list(want_ids), (case, d)
            np.testing.assert_array_equal(got_scores, want_scores.astype(np.float32))
            # The builder form gives the same answer.
            assert list(kv.recall(q, k, filter=F.from_dict(d))[0]) == list(want_ids)


def test_builders_and_operators(kv):
    v = np.eye(16, dtype=np.float32)[:4]
    kv.upsert([1, 2, 3, 4], v, metadata=[
        {"user": "ann", "tags": ["x", "y"], "n": 1, "when": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)},
        {"user": "bob", "tags": ["y"], "n": 5},
        {"user": "ann", "n": 9, "score": 0.5},
        None,
    ])
    q = np.ones(16, np.float32)

    def ids(f):
        return sorted(int(i) for i in kv.recall(q, 10, filter=f)[0])

    assert ids(F.eq("user", "ann")) == [1, 3]
    assert ids(F.contains("tags", "y")) == [1, 2]
    assert ids(F.eq("tags", "x")) == [1]
    assert ids(F.ne("user", "ann")) == [2, 4]
    assert ids(F.gte("n", 5)) == [2, 3]
    assert ids(F.gt("n", 4.5) & F.lt("n", 9)) == [2]
    assert ids(F.in_("user", ["bob", "zed"]) | F.exists("score")) == [2, 3]
    assert ids(~F.exists("tags")) == [3, 4]
    assert ids(F.nin("n", [1, 9])) == [2, 4]
    assert ids(F.lt("when", dt.datetime(2026, 6, 1))) == [1]
    assert ids({"user": ["ann", "bob"], "n": {"$lte": 5}}) == [1, 2]
    assert ids({"$or": [{"user": "bob"}, {"n": {"$exists": False}}]}) == [2, 4]
    assert ids(F.in_("user", [])) == []
    assert ids(F.nin("user", [])) == [1, 2, 3, 4]
    md = kv.get_metadata([1, 3, 4])
    assert md[0]["user"] == "ann" and md[0]["tags"] == ["x", "y"] and md[0]["n"] == 1
    assert md[0]["when"] == dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert md[1] == {"user": "ann", "n": 9, "score": 0.5}
    assert md[2] == {}
    # Batches and payload recalls take the filter too.
    ids_b, _, counts = kv.recall_batch(np.stack([q, q]), 10, filter=F.eq("user", "ann"))
    assert list(counts) == [2, 2] and sorted(ids_b[0][:2]) == [1, 3]
    assert sorted(kv.recall(q, 10, filter={"user": "bob"}, payloads=True)[0]) == [2]
    assert kv.delete_where({"user": "ann"}) == 2
    assert len(kv) == 2


def test_bad_filters_and_metadata_raise_clear_errors(kv):
    kv.upsert([1], np.ones((1, 16), np.float32), metadata=[{"n": 1}])
    q = np.ones(16, np.float32)
    for bad in [{"$bogus": 1}, {"n": {"$near": 1}}, {"$and": []}, {"n": None}, {"n": {"$in": "abc"}}, {"n": float("nan")}]:
        with pytest.raises(kalos.InvalidArgumentError):
            kv.recall(q, 1, filter=bad)
    with pytest.raises(kalos.InvalidArgumentError, match="filter"):
        kv.recall(q, 1, filter=b"\x01\x63")  # unknown operator 99: refused by the library
    deep = F.exists("n")
    for _ in range(40):
        deep = ~deep
    with pytest.raises(kalos.InvalidArgumentError, match="deeper"):
        kv.recall(q, 1, filter=deep)
    with pytest.raises(kalos.InvalidArgumentError, match='"n"'):
        kv.upsert([2], np.ones((1, 16), np.float32), metadata=[{"n": "one"}])
    with pytest.raises(kalos.InvalidArgumentError):
        kv.upsert([2], np.ones((1, 16), np.float32), metadata=[{"n": object()}])
    with pytest.raises(ValueError):
        kv.upsert([2, 3], np.ones((2, 16), np.float32), metadata=[{"n": 2}])
    assert len(kv) == 1, "a refused write writes nothing"


def test_list_matches_a_reference_in_pages(name):
    """Kalos.list / list_pages against a Python reference: random dict filters and namespaces,
    pages of several sizes, limits, the cursor, deletes and new rows between pages."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    r = random.Random(seed)
    n = 3000
    with kalos.open(name, dim=4, metric="ip", role="server", backend="cpu", slot_bytes=8192,
                    max_payload_bytes=1024) as kv:
        ids = [r.randrange(1 << 64) for _ in range(n)] + [0, (1 << 64) - 1]
        ids = sorted(set(ids))
        metas = {i: _meta(r, i, j == 0) for j, i in enumerate(ids)}
        nss = {i: r.randrange(3) for i in ids}
        kv.upsert(ids, np.ones((len(ids), 4), np.float32), metadata=[metas[i] for i in ids],
                  namespaces=[nss[i] for i in ids])
        assert kv.list().tolist() == ids
        for case in range(60):
            d = _expr(r, 3) if case % 4 else None
            ns = [r.randrange(3)] if r.random() < 0.3 else None
            want = [i for i in ids if (d is None or ref_match(d, metas[i])) and (ns is None or nss[i] in ns)]
            got = kv.list(d, namespaces=ns)
            assert got.dtype == np.uint64 and got.tolist() == want, (case, d, ns)
            size = r.choice([1, 7, 100, 5000])
            pages = list(kv.list_pages(d, namespaces=ns, page_size=size))
            assert all(0 < len(p) <= size for p in pages)
            assert [int(i) for p in pages for i in p] == want, (case, size)
            lim = r.randrange(0, 40)
            assert kv.list(d, namespaces=ns, limit=lim).tolist() == want[:lim]
            if want:
                mid = want[len(want) // 2]
                assert kv.list(d, namespaces=ns, after=mid).tolist() == [i for i in want if i > mid]
        # Writes between pages: deleted ids ahead of the cursor are not listed, new ones are.
        it = kv.list_pages(page_size=500)
        first = next(it)
        ahead = [i for i in ids if i > int(first[-1])][::3]
        kv.delete(ahead)
        new = [int(first[-1]) + 1 + 2 * j for j in range(5) if int(first[-1]) + 1 + 2 * j not in metas]
        kv.upsert(new, np.ones((len(new), 4), np.float32))
        rest = [int(i) for p in it for i in p]
        assert rest == sorted((set(ids) - set(ahead) | set(new)) - set(first.tolist()) - {i for i in ids if i <= int(first[-1])})
        with pytest.raises(kalos.InvalidArgumentError, match="unknown operator 99"):
            kv.list(b"\x01\x63")
        with pytest.raises(kalos.InvalidArgumentError):
            kv.list({"$bogus": 1})
        with pytest.raises(ValueError):
            next(kv.list_pages(page_size=0))
        with pytest.raises(ValueError):
            kv.list(limit=-1)
        assert any(c["op"] == "list" and c["status"] == "OK" for c in kv.stats()["requests_by"])


def test_adapter_helpers_skip_ids_deleted_since_they_were_listed(kv):
    """get / delete are all or nothing: the adapters' helpers drop an id deleted (or expired)
    between its listing and the call, and fetch or delete the rest."""
    from kalos._adapter import delete_present, get_present

    kv.upsert([1, 2, 3, 4], np.eye(16, dtype=np.float32)[:4], payloads=[b"a", b"b", b"c", b"d"])
    listed = kv.list().tolist()
    kv.delete([2])
    keys, recs = get_present(kv, listed, vectors=False, namespaces=False)
    assert keys == [1, 3, 4] and recs.payloads == [b"a", b"c", b"d"]
    assert get_present(kv, [2], vectors=False) == ([], None)
    assert delete_present(kv, listed + [99]) == 3
    assert len(kv) == 0

"""kalos.mem0.KalosMem0Store: its own contract, then mem0's Memory flow against it (stub LLM and
embedder, no network)."""

from __future__ import annotations

import hashlib
import json
import os
import atexit
import re
import shutil
import tempfile

import numpy as np
import pytest

os.environ.setdefault("MEM0_TELEMETRY", "False")
if "MEM0_DIR" not in os.environ:  # mem0 writes its config there: not ~/.mem0
    os.environ["MEM0_DIR"] = tempfile.mkdtemp(prefix="kalos-mem0-")
    atexit.register(shutil.rmtree, os.environ["MEM0_DIR"], True)
os.environ.setdefault("OPENAI_API_KEY", "sk-unused")  # mem0 builds its default clients; none is called
pytest.importorskip("mem0")

from mem0 import Memory  # noqa: E402

import kalos  # noqa: E402
import kalos.mem0 as km  # noqa: E402
from conftest import unique_name  # noqa: E402

D = 32


def embed(text: str) -> list:
    """A bag-of-words embedding: texts sharing words are near."""
    v = np.zeros(D, np.float32)
    for w in re.findall(r"[a-z]+", text.lower()):
        v[int(hashlib.md5(w.encode()).hexdigest(), 16) % D] += 1.0
    n = float(np.linalg.norm(v))
    return (v / n if n else v + 1.0 / np.sqrt(D)).tolist()


class StubEmbedder:
    def embed(self, text, memory_action=None):
        return embed(text if isinstance(text, str) else json.dumps(text))

    def embed_batch(self, texts, memory_action=None):
        return [self.embed(t) for t in texts]


class StubLLM:
    """Extracts one memory per user line of the conversation, as mem0's prompt asks."""

    def generate_response(self, messages, response_format=None, **kw):
        prompt = messages[-1]["content"]
        facts = re.findall(r"(?im)^\s*user:\s*(.+)$", prompt)
        return json.dumps({"memory": [{"text": f.strip()} for f in facts]})


@pytest.fixture
def store():
    s = km.KalosMem0Store(collection_name=unique_name("m0"), embedding_model_dims=D,
                          open_kwargs={"role": "server"})
    yield s
    s.client.close()


def test_store_contract_and_filters(store):
    ids = [f"id-{i}" for i in range(30)]
    payloads = [{"data": f"memory {i} about {'tea' if i % 2 else 'coffee'}", "user_id": f"u{i % 3}",
                 "agent_id": "a1" if i < 10 else "a2", "run_id": f"r{i % 5}", "n": i} for i in range(30)]
    store.insert([embed(p["data"]) for p in payloads], payloads, ids)
    q = embed("tea")
    hits = store.search("tea", q, top_k=5, filters={"user_id": "u1"})
    assert len(hits) == 5 and all(h.payload["user_id"] == "u1" for h in hits)
    assert hits[0].score >= hits[-1].score and hits[0].id.startswith("id-")
    # Exact scope: every u1/a2 memory is found, however few they are among 30.
    scoped = store.search("x", q, top_k=100, filters={"user_id": "u1", "agent_id": "a2"})
    assert sorted(h.id for h in scoped) == sorted(i for i, p in zip(ids, payloads) if p["user_id"] == "u1" and p["agent_id"] == "a2")
    cases = {
        "ops": ({"n": {"gte": 10, "lt": 14}}, lambda p: 10 <= p["n"] < 14),
        "in": ({"run_id": {"in": ["r1", "r2"]}, "user_id": {"ne": "u0"}}, lambda p: p["run_id"] in ("r1", "r2") and p["user_id"] != "u0"),
        "nin": ({"user_id": {"nin": ["u0", "u1"]}}, lambda p: p["user_id"] == "u2"),
        "wild": ({"agent_id": "*"}, lambda p: True),
        "or": ({"$or": [{"user_id": "u0"}, {"n": {"gt": 27}}]}, lambda p: p["user_id"] == "u0" or p["n"] > 27),
        "OR": ({"OR": [{"run_id": "r0"}, {"run_id": "r4"}]}, lambda p: p["run_id"] in ("r0", "r4")),
        "not": ({"$not": [{"user_id": "u0"}, {"agent_id": "a1"}]}, lambda p: p["user_id"] != "u0" and p["agent_id"] != "a1"),
        "AND": ({"AND": [{"user_id": "u2"}, {"n": {"lte": 5}}]}, lambda p: p["user_id"] == "u2" and p["n"] <= 5),
        "contains": ({"data": {"contains": "tea"}, "user_id": "u1"}, lambda p: "tea" in p["data"] and p["user_id"] == "u1"),
        "icontains": ({"data": {"icontains": "MEMORY 1"}}, lambda p: "memory 1" in p["data"]),
        "or_contains": ({"$or": [{"data": {"contains": "coffee"}}, {"n": 3}]}, lambda p: "coffee" in p["data"] or p["n"] == 3),
        "not_contains": ({"$not": [{"data": {"contains": "coffee"}}]}, lambda p: "coffee" not in p["data"]),
    }
    for name, (flt, ref) in cases.items():
        want = sorted(i for i, p in zip(ids, payloads) if ref(p))
        got = store.search("x", q, top_k=30, filters=flt)
        assert sorted(h.id for h in got) == want, name
        listed = store.list(filters=flt)[0]
        assert sorted(r.id for r in listed) == want, name
    for bad in ({"n": {"regex": "1"}}, {"OR": []}, {"$not": [{}]}, {"n": {"in": 3}}):
        with pytest.raises(ValueError):
            store.search("x", q, filters=bad)
    # get / update / delete
    got = store.get("id-4")
    assert got.payload == payloads[4] and got.score is None
    assert store.get("nope") is None
    store.update("id-4", payload={**payloads[4], "data": "changed", "user_id": "u9"})
    assert store.get("id-4").payload["data"] == "changed"
    assert [h.id for h in store.search("x", q, top_k=3, filters={"user_id": "u9"})] == ["id-4"]
    store.update("id-4", vector=embed("zebra"))
    assert store.search("x", embed("zebra"), top_k=1)[0].id == "id-4"
    assert store.get("id-4").payload["data"] == "changed"
    store.delete("id-4")
    store.delete("id-4")  # unknown: ignored
    assert store.get("id-4") is None
    assert store.col_info()["count"] == 29 and store.list_cols() == [store.collection_name]
    store.reset()
    assert store.list()[0] == []


def test_list_and_substring_search_beyond_1024(store):
    """list honours top_k beyond 1024 and reaches every match; a substring filter whose matches
    all rank beyond the best 1024 candidates still gets top_k results, exactly ranked."""
    n = 2200
    vecs, payloads, ids = [], [], []
    for i in range(n):
        v = np.zeros(D, np.float32)
        v[0], v[1] = np.cos(i * np.pi / (n + 1)), np.sin(i * np.pi / (n + 1))
        vecs.append(v.tolist())
        payloads.append({"data": ("needle " if i >= 1800 and i % 7 == 0 else "hay ") + str(i), "user_id": "u",
                         "i": i})
        ids.append(f"m{i}")
    store.insert(vecs, payloads, ids)
    assert len(store.list()[0]) == 100  # mem0's default top_k
    every = store.list(filters={"user_id": "u"}, top_k=5000)[0]
    assert sorted(r.payload["i"] for r in every) == list(range(n)) and all(r.score is None for r in every)
    assert len(store.list(top_k=1500)[0]) == 1500
    needles = [i for i in range(n) if i >= 1800 and i % 7 == 0]
    listed = store.list(filters={"data": {"contains": "needle"}}, top_k=5000)[0]
    assert sorted(r.payload["i"] for r in listed) == needles
    q = [1.0] + [0.0] * (D - 1)
    hits = store.search("x", q, top_k=3, filters={"data": {"contains": "needle"}, "user_id": "u"})
    assert [h.id for h in hits] == [f"m{i}" for i in needles[:3]]
    assert [h.score for h in hits] == pytest.approx([np.cos(i * np.pi / (n + 1)) for i in needles[:3]], abs=1e-5)
    hits = store.search("x", q, top_k=2000, filters={"data": {"icontains": "HAY"}})
    assert [h.payload["i"] for h in hits] == [i for i in range(n) if i not in needles][:2000]


def test_mem0_memory_flow_against_kalos(tmp_path):
    km.register()
    col = unique_name("m0flow")
    m = Memory.from_config({
        "vector_store": {"provider": "kalos", "config": {"collection_name": col, "embedding_model_dims": D,
                                                          "open_kwargs": {"ephemeral": True}}},
        "history_db_path": str(tmp_path / "history.db"),
    })
    assert isinstance(m.vector_store, km.KalosMem0Store)
    m.embedding_model = StubEmbedder()
    m.llm = StubLLM()
    try:
        m.add([{"role": "user", "content": "I like green tea"}, {"role": "assistant", "content": "noted"}],
              user_id="alice")
        m.add([{"role": "user", "content": "I drink black coffee"}], user_id="bob")
        m.add([{"role": "user", "content": "I like jasmine tea"}], user_id="alice", agent_id="helper",
              metadata={"topic": "drinks"})
        m.add("raw note about tea", user_id="carol", infer=False)
        res = m.search("tea", filters={"user_id": "alice"}, threshold=0.0)["results"]
        assert res and all(r["user_id"] == "alice" for r in res)
        assert {r["memory"] for r in res} == {"I like green tea", "I like jasmine tea"}
        res = m.search("tea", filters={"user_id": "alice", "agent_id": "helper"}, threshold=0.0)["results"]
        assert [r["memory"] for r in res] == ["I like jasmine tea"]
        res = m.search("tea", filters={"user_id": "alice", "topic": {"eq": "drinks"}}, threshold=0.0)["results"]
        assert [r["memory"] for r in res] == ["I like jasmine tea"]
        bob = m.get_all(filters={"user_id": "bob"})["results"]
        assert [r["memory"] for r in bob] == ["I drink black coffee"]
        mid = bob[0]["id"]
        m.update(mid, "I drink white coffee")
        assert m.get(mid)["memory"] == "I drink white coffee"
        assert m.search("coffee", filters={"user_id": "bob"}, threshold=0.0)["results"][0]["memory"] == "I drink white coffee"
        m.delete(mid)
        assert m.get(mid) is None and m.get_all(filters={"user_id": "bob"})["results"] == []
        m.delete_all(user_id="alice")
        assert m.get_all(filters={"user_id": "alice"})["results"] == []
        assert [r["memory"] for r in m.get_all(filters={"user_id": "carol"})["results"]] == ["raw note about tea"]
        m.reset()
        assert m.get_all(filters={"user_id": "carol"})["results"] == []
    finally:
        m.vector_store.client.close()
        m.close()

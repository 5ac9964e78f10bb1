"""kalos.llama_index.KalosVectorStore against llama-index-core."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import MockEmbedding, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

import kalos  # noqa: E402
from kalos.llama_index import KalosVectorStore  # noqa: E402
from conftest import unique_name  # noqa: E402

D = 8


def node(i, user, ref="doc-a", text=None):
    v = np.zeros(D, np.float32)
    v[i % D] = 1.0
    v[(i + 1) % D] = 0.1 * (i // D + 1)
    n = TextNode(id_=f"node-{i}", text=text or f"text {i}", embedding=v.tolist(), metadata={"user": user, "i": i})
    n.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=ref)
    return n


@pytest.fixture
def store():
    s = KalosVectorStore(unique_name("li"), dim=D, namespace_key="user", role="server")
    yield s
    s.close()


def q(i, k=3, filters=None):
    v = np.zeros(D, np.float32)
    v[i % D] = 1.0
    return VectorStoreQuery(query_embedding=v.tolist(), similarity_top_k=k, filters=filters)


def test_add_query_filters(store):
    assert isinstance(store, BasePydanticVectorStore) and store.stores_text
    nodes = [node(i, "alice" if i < 4 else "bob") for i in range(8)]
    assert store.add(nodes) == [n.node_id for n in nodes]
    r = store.query(q(2, k=1))
    assert r.ids == ["node-2"] and r.nodes[0].get_content() == "text 2"
    assert r.nodes[0].metadata == {"user": "alice", "i": 2} and r.nodes[0].ref_doc_id == "doc-a"
    assert r.similarities[0] > 0.99
    eq_bob = MetadataFilters(filters=[MetadataFilter(key="user", value="bob")])
    r = store.query(q(2, k=8, filters=eq_bob))
    assert sorted(r.ids) == [f"node-{i}" for i in range(4, 8)]
    in_both = MetadataFilters(filters=[MetadataFilter(key="user", value=["alice", "bob"], operator=FilterOperator.IN)])
    assert len(store.query(q(2, k=8, filters=in_both)).ids) == 8
    either = MetadataFilters(
        filters=[MetadataFilter(key="user", value="alice"), MetadataFilter(key="user", value="bob")],
        condition=FilterCondition.OR,
    )
    assert len(store.query(q(2, k=8, filters=either)).ids) == 8
    both = MetadataFilters(filters=[MetadataFilter(key="user", value="alice"), MetadataFilter(key="user", value="bob")])
    assert store.query(q(2, k=8, filters=both)).ids == []  # AND of two namespaces: nothing
    assert store.query(q(2, filters=MetadataFilters(filters=[MetadataFilter(key="i", value=1)]))).ids == ["node-1"]
    with pytest.raises(ValueError):
        store.query(VectorStoreQuery(query_embedding=None, similarity_top_k=1))
    assert [n.node_id for n in store.get_nodes(["node-5", "nope", "node-1"])] == ["node-5", "node-1"]


def test_delete_delete_nodes_clear(store):
    store.add([node(i, "alice", ref="doc-a") for i in range(3)] + [node(i, "bob", ref="doc-b") for i in range(3, 6)])
    store.delete("doc-a")
    assert sorted(store.query(q(0, k=10)).ids) == ["node-3", "node-4", "node-5"]
    store.delete("doc-unknown")
    store.delete_nodes(["node-3", "missing"])
    assert sorted(store.query(q(0, k=10)).ids) == ["node-4", "node-5"]
    store.add([node(9, "carol")])
    store.delete_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="user", value="bob")]))
    assert store.query(q(0, k=10)).ids == ["node-9"]
    with pytest.raises(ValueError):
        store.delete_nodes()
    store.clear()
    assert store.query(q(0, k=10)).ids == []
    assert len(store.client) == 0


def mf(*fs, condition=FilterCondition.AND):
    return MetadataFilters(filters=list(fs), condition=condition)


def f(key, op, value=None):
    return MetadataFilter(key=key, operator=getattr(FilterOperator, op), value=value)


def doc_node(i):
    """Node i of a small corpus with every kind of metadata value."""
    md = {"user": ["ann", "bob", "cy"][i % 3], "n": i, "score": i / 4, "tags": ["t%d" % (i % 4), "all"],
          "title": f"Report number {i}" if i % 2 else f"memo {i}"}
    if i % 5:
        md["kind"] = "fact" if i % 5 < 3 else ""
    v = np.random.default_rng(i).standard_normal(D).astype(np.float32)
    n = TextNode(id_=f"n{i}", text=f"text {i}", embedding=v.tolist(), metadata=md)
    n.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=f"doc-{i % 4}")
    return n


# Each case: (filters, the same test on the metadata written in Python).
CASES = {
    "EQ": (mf(f("user", "EQ", "ann")), lambda m: m["user"] == "ann"),
    "NE": (mf(f("user", "NE", "ann")), lambda m: m["user"] != "ann"),
    "GT": (mf(f("n", "GT", 30)), lambda m: m["n"] > 30),
    "GTE": (mf(f("score", "GTE", 5.5)), lambda m: m["score"] >= 5.5),
    "LT": (mf(f("n", "LT", 7)), lambda m: m["n"] < 7),
    "LTE": (mf(f("score", "LTE", 1.0)), lambda m: m["score"] <= 1.0),
    "IN": (mf(f("n", "IN", [1, 5, 40])), lambda m: m["n"] in (1, 5, 40)),
    "NIN": (mf(f("user", "NIN", ["ann", "bob"])), lambda m: m["user"] not in ("ann", "bob")),
    "ANY": (mf(f("tags", "ANY", ["t1", "t2"])), lambda m: bool({"t1", "t2"} & set(m["tags"]))),
    "ALL": (mf(f("tags", "ALL", ["t3", "all"])), lambda m: {"t3", "all"} <= set(m["tags"])),
    "CONTAINS": (mf(f("tags", "CONTAINS", "t0")), lambda m: "t0" in m["tags"]),
    "TEXT_MATCH": (mf(f("title", "TEXT_MATCH", "Report")), lambda m: "Report" in m["title"]),
    "TEXT_MATCH_INSENSITIVE": (mf(f("title", "TEXT_MATCH_INSENSITIVE", "report number 1")),
                               lambda m: "report number 1" in m["title"].lower()),
    "IS_EMPTY": (mf(f("kind", "IS_EMPTY")), lambda m: not m.get("kind")),
    "OR": (mf(f("n", "LT", 3), f("user", "EQ", "cy"), condition=FilterCondition.OR),
           lambda m: m["n"] < 3 or m["user"] == "cy"),
    "NOT": (mf(f("user", "EQ", "ann"), f("n", "GT", 40), condition=FilterCondition.NOT),
            lambda m: not (m["user"] == "ann" or m["n"] > 40)),
    "nested": (mf(mf(f("user", "EQ", "bob"), f("tags", "CONTAINS", "t2"), condition=FilterCondition.OR),
                  mf(f("kind", "IS_EMPTY"), condition=FilterCondition.NOT)),
               lambda m: (m["user"] == "bob" or "t2" in m["tags"]) and bool(m.get("kind"))),
    "nested_text": (mf(mf(f("title", "TEXT_MATCH", "memo"), f("n", "GTE", 45), condition=FilterCondition.OR),
                       mf(f("title", "TEXT_MATCH", "1"), condition=FilterCondition.NOT)),
                    lambda m: ("memo" in m["title"] or m["n"] >= 45) and "1" not in m["title"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_operator_is_exact(name):
    filters, ref = CASES[name]
    nodes = [doc_node(i) for i in range(48)]
    with kalos.open(unique_name("li-op"), dim=D, role="server", metric="ip") as kv:
        store = KalosVectorStore(kalos_client=kv)
        store.add(nodes)
        qv = np.random.default_rng(99).standard_normal(D).astype(np.float32)
        want = [n for n in nodes if ref(n.metadata)]
        assert want, name
        want.sort(key=lambda n: -float(np.dot(qv, np.asarray(n.embedding, np.float32))))
        for k in (1, 5, 48):
            r = store.query(VectorStoreQuery(query_embedding=qv.tolist(), similarity_top_k=k, filters=filters))
            assert r.ids == [n.node_id for n in want[:k]], (name, k)
        got = store.get_nodes(filters=filters)
        assert sorted(n.node_id for n in got) == sorted(n.node_id for n in want)
        assert [n.node_id for n in store.get_nodes(["n3", "n1", "nope", "n2"], filters=filters)] == [
            i for i in ("n3", "n1", "n2") if ref(nodes[int(i[1:])].metadata)]
        store.delete_nodes(filters=filters)
        assert sorted(n.node_id for n in store.get_nodes([n.node_id for n in nodes])) == sorted(
            n.node_id for n in nodes if not ref(n.metadata))


def test_node_ids_doc_ids_and_delete_ref_doc_from_another_process():
    import subprocess
    import sys

    name = unique_name("li-ref")
    nodes = [doc_node(i) for i in range(12)]
    with kalos.open(name, dim=D, role="server", metric="ip") as kv:
        store = KalosVectorStore(kalos_client=kv)
        store.add(nodes)
        qv = [1.0] * D
        r = store.query(VectorStoreQuery(query_embedding=qv, similarity_top_k=10, node_ids=["n1", "n4", "n7"]))
        assert sorted(r.ids) == ["n1", "n4", "n7"]
        r = store.query(VectorStoreQuery(query_embedding=qv, similarity_top_k=10, doc_ids=["doc-1"]))
        assert sorted(r.ids) == ["n1", "n5", "n9"]
        r = store.query(VectorStoreQuery(query_embedding=qv, similarity_top_k=10, doc_ids=["doc-1"], node_ids=["n5", "n4"],
                                         filters=mf(f("n", "GT", 1))))
        assert r.ids == ["n5"]
        assert len(store.query(VectorStoreQuery(query_embedding=qv, similarity_top_k=3, node_ids=[])).ids) == 3
        # Another process, its own store object: delete(ref_doc_id) deletes on the server.
        code = (
            "import sys; from kalos.llama_index import KalosVectorStore as S; "
            "s = S(sys.argv[1], role='client'); s.delete('doc-2'); s.close()"
        )
        subprocess.run([sys.executable, "-c", code, name], check=True, timeout=60)
        left = store.get_nodes([n.node_id for n in nodes])
        assert sorted(n.node_id for n in left) == sorted(f"n{i}" for i in range(12) if i % 4 != 2)
        store.delete_nodes(["n1", "n3", "nope"], filters=mf(f("user", "EQ", "bob")))
        assert "n1" not in {n.node_id for n in store.get_nodes([n.node_id for n in nodes])}
        assert "n3" in {n.node_id for n in store.get_nodes(["n3"])}  # n3 is cy's: not deleted
        with pytest.raises(ValueError):
            store.get_nodes()
        store.clear()
        assert store.get_nodes(filters=mf(f("n", "GTE", 0))) == []


def test_listing_and_text_match_beyond_1024_nodes():
    """get_nodes / delete_nodes over more than 1024 matches (listed with kalos_list), and a
    TEXT_MATCH query whose matches all rank beyond the best 1024: exact whatever the store size."""
    n = 2500
    # Node i at angle i·π/(n+1): the query (1, 0, ...) ranks them by i.
    nodes = []
    for i in range(n):
        v = np.zeros(D, np.float32)
        v[0], v[1] = np.cos(i * np.pi / (n + 1)), np.sin(i * np.pi / (n + 1))
        title = f"rare {i}" if i >= 2000 and i % 9 == 0 else f"common {i}"
        nodes.append(TextNode(id_=f"n{i}", text=f"t{i}", embedding=v.tolist(), metadata={"i": i, "title": title}))
    with kalos.open(unique_name("li-big"), dim=D, role="server", metric="cosine") as kv:
        store = KalosVectorStore(kalos_client=kv)
        store.add(nodes)
        big = mf(f("i", "GTE", 100))
        assert sorted(int(x.node_id[1:]) for x in store.get_nodes(filters=big)) == list(range(100, n))
        rare = mf(f("title", "TEXT_MATCH", "rare"))
        want = [i for i in range(n) if i >= 2000 and i % 9 == 0]
        qv = [1.0] + [0.0] * (D - 1)
        r = store.query(VectorStoreQuery(query_embedding=qv, similarity_top_k=4, filters=rare))
        assert r.ids == [f"n{i}" for i in want[:4]]
        assert r.similarities == pytest.approx([np.cos(i * np.pi / (n + 1)) for i in want[:4]], abs=1e-5)
        assert sorted(int(x.node_id[1:]) for x in store.get_nodes(filters=rare)) == want
        # TEXT_MATCH matching more than 1024 nodes, deleted in one call.
        common = mf(f("title", "TEXT_MATCH", "common"))
        store.delete_nodes(filters=common)
        assert len(kv) == len(want)
        assert sorted(int(x.node_id[1:]) for x in store.get_nodes(filters=mf(f("i", "GTE", 0)))) == want


def test_vector_store_index_end_to_end():
    with kalos.open(unique_name("li-idx"), dim=D, role="server") as kv:
        store = KalosVectorStore(kalos_client=kv)
        embed = MockEmbedding(embed_dim=D)
        docs = [TextNode(id_=f"n{i}", text=f"fact {i}") for i in range(5)]
        index = VectorStoreIndex(docs, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed)
        res = index.as_retriever(similarity_top_k=3).retrieve("fact 1")
        assert len(res) == 3 and all(r.node.get_content().startswith("fact") for r in res)
        store.close()  # not owned: stays open
        assert not kv.closed
    with pytest.raises(ValueError):
        KalosVectorStore()

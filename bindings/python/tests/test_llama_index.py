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
    with pytest.raises(NotImplementedError):
        store.query(q(2, filters=MetadataFilters(filters=[MetadataFilter(key="i", value=1)])))
    with pytest.raises(NotImplementedError):
        store.query(q(2, filters=MetadataFilters(filters=[MetadataFilter(key="user", value="a", operator=FilterOperator.NE)])))
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

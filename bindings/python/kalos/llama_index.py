"""LlamaIndex vector store backed by Kalos (``pip install "kalos[llama-index]"``).

    from kalos.llama_index import KalosVectorStore
    from llama_index.core import StorageContext, VectorStoreIndex
    store = KalosVectorStore(name="docs", dim=384, namespace_key="user")
    index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store))

Storage layout: each node is one Kalos memory; its id is the node id mapped to a ``u64`` by
:func:`kalos._ids.str_to_u64`; its payload is the JSON of
``llama_index.core.vector_stores.utils.node_to_metadata_dict`` (text, metadata, relationships),
so queries return full nodes; its namespace is ``node.metadata[namespace_key]`` through
:func:`kalos._ids.namespace_of` (``default_namespace`` when absent).

Filters: ``MetadataFilters`` with ``EQ`` or ``IN`` on ``namespace_key`` only (joined by OR
into one namespace set, ≤ 64 values); they run inside the Kalos scan, so results are exact.
Other keys or operators raise ``NotImplementedError``.

``delete(ref_doc_id)``: Kalos has no metadata index, so the ref-doc → node-ids map is kept by
this object for the nodes it added (in this process). Nodes added by another process can be
deleted with :meth:`KalosVectorStore.delete_nodes` by node id, or by namespace filter.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Optional, Sequence, Set

import numpy as np
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterOperator,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

import kalos
from kalos._ids import namespace_of, str_to_u64

__all__ = ["KalosVectorStore"]


class KalosVectorStore(BasePydanticVectorStore):
    """A llama-index-core :class:`BasePydanticVectorStore` over a Kalos store.

    Args:
        name: Kalos store name, opened with ``kalos.open(name, dim=dim, **open_kwargs)``.
        dim: embedding dimension (needed to create the store).
        kalos_client: an open :class:`kalos.Kalos` to use instead of ``name``.
        namespace_key: node metadata key that selects the namespace (default ``"namespace"``).
        default_namespace: namespace of nodes without the key.
    """

    stores_text: bool = True
    is_embedding_query: bool = True
    flat_metadata: bool = False
    namespace_key: str = "namespace"
    default_namespace: int = 0

    _client: kalos.Kalos = PrivateAttr()
    _owns: bool = PrivateAttr(default=False)
    _ref_docs: Dict[str, Set[str]] = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def __init__(
        self,
        name: Optional[str] = None,
        dim: int = 0,
        *,
        kalos_client: Optional[kalos.Kalos] = None,
        namespace_key: str = "namespace",
        default_namespace: int = 0,
        **open_kwargs: Any,
    ) -> None:
        super().__init__(namespace_key=namespace_key, default_namespace=default_namespace)  # type: ignore[call-arg]
        if kalos_client is None:
            if name is None:
                raise ValueError("pass a store name (and dim) or an open kalos_client")
            kalos_client = kalos.open(name, dim=dim, **open_kwargs)
            self._owns = True
        self._client = kalos_client

    @property
    def client(self) -> kalos.Kalos:
        """The underlying :class:`kalos.Kalos` handle."""
        return self._client

    def close(self) -> None:
        """Closes the Kalos handle if this store opened it."""
        if self._owns:
            self._client.close()

    # -- helpers --------------------------------------------------------------------------------

    def _namespace(self, node: BaseNode) -> int:
        md = node.metadata or {}
        if self.namespace_key in md:
            return namespace_of(md[self.namespace_key])
        return self.default_namespace

    def _filter_namespaces(self, filters: Optional[MetadataFilters]) -> Optional[List[int]]:
        """Namespace set of a filter tree (None = no filter; [] = matches nothing)."""
        if filters is None or not filters.filters:
            return None
        sets: List[Set[int]] = []
        for f in filters.filters:
            if isinstance(f, MetadataFilters):
                sub = self._filter_namespaces(f)
                if sub is None:
                    continue
                sets.append(set(sub))
                continue
            if f.key != self.namespace_key:
                raise NotImplementedError(
                    f"Kalos filters only on the namespace key {self.namespace_key!r}, not {f.key!r}"
                )
            if f.operator == FilterOperator.EQ:
                sets.append({namespace_of(f.value)})
            elif f.operator == FilterOperator.IN:
                sets.append({namespace_of(v) for v in f.value})  # type: ignore[union-attr]
            else:
                raise NotImplementedError(f"Kalos supports EQ and IN filters, not {f.operator}")
        if not sets:
            return None
        cond = str(getattr(filters.condition, "value", filters.condition) or "and").lower()
        if cond == "or":
            out = set().union(*sets)
        elif cond == "and":
            out = set.intersection(*sets)
        else:
            raise NotImplementedError(f"unsupported filter condition {cond!r}")
        return sorted(out)

    # -- writes ---------------------------------------------------------------------------------

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> List[str]:
        """Upserts nodes (with their embeddings); returns their node ids."""
        if not nodes:
            return []
        vecs = np.asarray([n.get_embedding() for n in nodes], dtype=np.float32)
        payloads = [
            json.dumps(
                node_to_metadata_dict(n, remove_text=False, flat_metadata=self.flat_metadata), default=str
            ).encode("utf-8")
            for n in nodes
        ]
        self._client.upsert(
            [str_to_u64(n.node_id) for n in nodes],
            vecs,
            namespaces=[self._namespace(n) for n in nodes],
            payloads=payloads,
            ttl=add_kwargs.get("ttl"),
        )
        with self._lock:
            for n in nodes:
                if n.ref_doc_id:
                    self._ref_docs.setdefault(n.ref_doc_id, set()).add(n.node_id)
        return [n.node_id for n in nodes]

    def _delete_keys(self, keys: List[int]) -> None:
        if not keys:
            return
        try:
            self._client.delete(keys)
        except kalos.NotFoundError:
            for k in keys:
                try:
                    self._client.delete([k])
                except kalos.NotFoundError:
                    pass

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Deletes the nodes of a ref doc that this store added (see the module docstring)."""
        with self._lock:
            node_ids = self._ref_docs.pop(ref_doc_id, set())
        self._delete_keys([str_to_u64(i) for i in node_ids])

    def delete_nodes(
        self,
        node_ids: Optional[List[str]] = None,
        filters: Optional[MetadataFilters] = None,
        **delete_kwargs: Any,
    ) -> None:
        """Deletes nodes by id (unknown ids are ignored), or every node of the namespaces in
        ``filters`` when no ids are given."""
        if node_ids is not None:
            self._delete_keys([str_to_u64(i) for i in node_ids])
            return
        ns = self._filter_namespaces(filters)
        if ns is None:
            raise ValueError("delete_nodes needs node_ids or a namespace filter (use clear() to delete all)")
        for n in set(ns):
            self._client.delete_namespace(n)

    def clear(self) -> None:
        """Deletes every node of the store."""
        self._client.clear()
        with self._lock:
            self._ref_docs.clear()

    # -- reads ----------------------------------------------------------------------------------

    def get_nodes(
        self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None
    ) -> List[BaseNode]:
        """Nodes by id (missing ids skipped). Filters are not supported without ids."""
        if node_ids is None:
            raise NotImplementedError("Kalos cannot list nodes without ids")
        out: List[BaseNode] = []
        for nid in node_ids:
            try:
                p = self._client.get([str_to_u64(nid)], vectors=False, namespaces=False).payloads[0]  # type: ignore[index]
            except kalos.NotFoundError:
                continue
            if p is not None:
                node = metadata_dict_to_node(json.loads(p))
                if node.node_id == nid:
                    out.append(node)
        return out

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Top ``similarity_top_k`` nodes for ``query.query_embedding``, exact within the
        namespace filter."""
        if query.query_embedding is None:
            raise ValueError("KalosVectorStore needs query.query_embedding")
        k = max(1, min(int(query.similarity_top_k or 1), kalos.MAX_K))
        ns = self._filter_namespaces(query.filters)
        if ns == []:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        ids, scores, payloads = self._client.recall(
            np.asarray(query.query_embedding, dtype=np.float32), k, namespaces=ns, payloads=True
        )
        nodes: List[BaseNode] = []
        sims: List[float] = []
        out_ids: List[str] = []
        for s, p in zip(scores.tolist(), payloads):
            if p is None:
                continue
            node = metadata_dict_to_node(json.loads(p))
            nodes.append(node)
            sims.append(float(s))
            out_ids.append(node.node_id)
        return VectorStoreQueryResult(nodes=nodes, similarities=sims, ids=out_ids)

"""LlamaIndex vector store backed by Kalos (``pip install "kalos[llama-index]"``).

    from kalos.llama_index import KalosVectorStore
    store = KalosVectorStore("docs", dim=384, namespace_key="user")

Each node is one Kalos memory: its id is the node id mapped to a ``u64`` by
:func:`kalos._ids.str_to_u64`, its payload the JSON of ``node_to_metadata_dict`` (the whole
node), its namespace ``metadata[namespace_key]``; the metadata values Kalos can type, the node
id (``_node_id``) and the ref doc id (``_ref_doc_id``) are metadata fields.

``MetadataFilters`` (every ``FilterOperator``, nested AND/OR/NOT), ``node_ids`` and ``doc_ids``
run inside the scan, so a query is exact. ``TEXT_MATCH`` and ``TEXT_MATCH_INSENSITIVE`` (a
substring) cannot: the rest of the filter narrows the candidates in the scan and the substring
test runs here, on candidates in growing rounds and, when the best 1024 hold fewer than k
matches, on every other candidate, listed with ``kalos_list`` and scored exactly from its stored
vector (:func:`kalos._adapter.top_k_accepted`): exact too, and slower. ``get_nodes`` and
``delete_nodes`` list every match, however many.
"""

from __future__ import annotations

import json
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

import kalos
from kalos import filters as F
from kalos._adapter import accepted, delete_present, top_k_accepted, typed_fields, upsert_lenient
from kalos._ids import namespace_of, str_to_u64

__all__ = ["KalosVectorStore"]

NODE_ID = "_node_id"
REF_DOC_ID = "_ref_doc_id"

Pred = Callable[[dict], bool]

_CMP = {FilterOperator.EQ: F.eq, FilterOperator.NE: F.ne, FilterOperator.GT: F.gt, FilterOperator.GTE: F.gte,
        FilterOperator.LT: F.lt, FilterOperator.LTE: F.lte, FilterOperator.CONTAINS: F.contains}
_TEXT = (FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE)


def _values(f: MetadataFilter) -> List[Any]:
    if not isinstance(f.value, (list, tuple)):
        raise ValueError(f"{f.operator.name} on {f.key!r} takes a list of values, got {f.value!r}")
    return list(f.value)


def _leaf(f: MetadataFilter) -> Tuple[Optional[F.Expr], bool]:
    """(expression, exact) of one filter; inexact: the expression is a superset."""
    op = f.operator
    if op in _CMP:
        return _CMP[op](f.key, f.value), True
    if op in (FilterOperator.IN, FilterOperator.ANY):
        return F.in_(f.key, _values(f)), True
    if op == FilterOperator.NIN:
        return F.nin(f.key, _values(f)), True
    if op == FilterOperator.ALL:
        vals = _values(f)
        return (F.and_(*[F.contains(f.key, v) for v in vals]) if vals else F.nin(f.key, [])), True
    if op == FilterOperator.IS_EMPTY:
        return F.or_(~F.exists(f.key), F.eq(f.key, "")), True
    if op in _TEXT:
        if not isinstance(f.value, str):
            raise ValueError(f"{op.name} on {f.key!r} takes a string, got {f.value!r}")
        return F.exists(f.key), False
    raise ValueError(f"unknown filter operator {op!r}")


def _translate(fs: MetadataFilters) -> Tuple[Optional[F.Expr], bool]:
    """(expression, exact) of a filter tree. An inexact expression is a superset of the tree's
    matches (None: every node) and :func:`_predicate` decides."""
    parts = [_translate(x) if isinstance(x, MetadataFilters) else _leaf(x) for x in fs.filters]
    if not parts:
        return None, True
    exact = all(e for _, e in parts)
    exprs = [x for x, _ in parts]
    cond = fs.condition or FilterCondition.AND
    if cond == FilterCondition.AND:
        known = [x for x in exprs if x is not None]
        return (F.and_(*known) if known else None), exact
    if cond == FilterCondition.OR:
        return (None if any(x is None for x in exprs) else F.or_(*exprs)), exact
    if cond == FilterCondition.NOT:
        if not exact:
            return None, False
        return ~F.or_(*exprs), True
    raise ValueError(f"unknown filter condition {cond!r}")


def _predicate(fs: MetadataFilters) -> Pred:
    """The whole tree as a test of node metadata: Kalos semantics (:func:`kalos.filters.matches`
    on the typed fields) for the operators the scan runs, substring for TEXT_MATCH."""
    subs: List[Pred] = []
    for f in fs.filters:
        if isinstance(f, MetadataFilters):
            subs.append(_predicate(f))
        elif f.operator in _TEXT:
            needle, key, fold = str(f.value), f.key, f.operator == FilterOperator.TEXT_MATCH_INSENSITIVE
            subs.append(lambda md, n=needle, k=key, c=fold: isinstance(md.get(k), str)
                        and ((n.lower() in md[k].lower()) if c else (n in md[k])))
        else:
            e = _leaf(f)[0]
            subs.append(lambda md, e=e: F.matches(e, typed_fields(md)))
    cond = fs.condition or FilterCondition.AND
    if cond == FilterCondition.OR:
        return lambda md: any(p(md) for p in subs)
    if cond == FilterCondition.NOT:
        return lambda md: not any(p(md) for p in subs)
    return lambda md: all(p(md) for p in subs)


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
    _metric_name: Optional[str] = PrivateAttr(default=None)

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

    @staticmethod
    def _scope(filters: Optional[MetadataFilters], node_ids: Optional[Sequence[str]] = None,
               doc_ids: Optional[Sequence[str]] = None) -> Tuple[Optional[F.Expr], Optional[Pred]]:
        """(expression for the scan, test the candidates still need or None)."""
        parts: List[F.Expr] = []
        pred: Optional[Pred] = None
        if filters is not None and filters.filters:
            expr, exact = _translate(filters)
            if expr is not None:
                parts.append(expr)
            if not exact:
                pred = _predicate(filters)
        if node_ids is not None:
            parts.append(F.in_(NODE_ID, list(node_ids)))
        if doc_ids is not None:
            parts.append(F.in_(REF_DOC_ID, list(doc_ids)))
        return (F.and_(*parts) if parts else None), pred

    @staticmethod
    def _accept(pred: Optional[Pred]) -> Callable[[Optional[bytes]], Optional[BaseNode]]:
        """A payload's node when it passes ``pred`` (every node when None), else None."""

        def accept(p: Optional[bytes]) -> Optional[BaseNode]:
            if p is None:
                return None
            node = metadata_dict_to_node(json.loads(p))
            return node if pred is None or pred(node.metadata or {}) else None

        return accept

    def _metric(self) -> str:
        """The store's metric (stats), read once."""
        if self._metric_name is None:
            self._metric_name = self._client.stats()["metric"]
        return self._metric_name

    def _search(self, q: np.ndarray, k: int, expr: Optional[F.Expr], pred: Optional[Pred]) -> List[Tuple[BaseNode, float]]:
        """Top-k nodes of the scan under ``expr``; with ``pred`` (TEXT_MATCH), the best k that
        pass it, exact: candidates in growing rounds, then every candidate
        (:func:`kalos._adapter.top_k_accepted`)."""
        if pred is not None:
            return top_k_accepted(self._client, q, k, self._metric(), self._accept(pred), filter=expr)
        ids, scores, payloads = self._client.recall(q, k, filter=expr, payloads=True)
        accept = self._accept(None)
        return [(n, float(s)) for s, p in zip(scores.tolist(), payloads) if (n := accept(p)) is not None]

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
        fields = []
        for n in nodes:
            f = typed_fields(n.metadata)
            f[NODE_ID] = n.node_id
            if n.ref_doc_id:
                f[REF_DOC_ID] = n.ref_doc_id
            fields.append(f)
        upsert_lenient(
            self._client,
            [str_to_u64(n.node_id) for n in nodes],
            vecs,
            fields,
            namespaces=[self._namespace(n) for n in nodes],
            payloads=payloads,
            ttl=add_kwargs.get("ttl"),
        )
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Deletes every node of ``ref_doc_id``, whichever process added it (the server
        evaluates the ``_ref_doc_id`` field)."""
        self._client.delete_where(F.eq(REF_DOC_ID, ref_doc_id))

    def delete_nodes(
        self,
        node_ids: Optional[List[str]] = None,
        filters: Optional[MetadataFilters] = None,
        **delete_kwargs: Any,
    ) -> None:
        """Deletes the nodes among ``node_ids`` (unknown ids are ignored) that match ``filters``
        (either may be None, not both): on the server, or with TEXT_MATCH every node that
        passes it, listed (``kalos_list``) and tested here."""
        if node_ids is None and (filters is None or not filters.filters):
            raise ValueError("delete_nodes needs node_ids or filters (use clear() to delete all)")
        expr, pred = self._scope(filters, node_ids)
        if pred is None:
            if expr is not None:
                self._client.delete_where(expr)
            return
        delete_present(self._client, [key for key, _ in accepted(self._client, self._accept(pred), filter=expr)])

    def clear(self) -> None:
        """Deletes every node of the store."""
        self._client.clear()

    # -- reads ----------------------------------------------------------------------------------

    def _list(self, expr: Optional[F.Expr], pred: Optional[Pred]) -> List[BaseNode]:
        """Every node under ``expr`` (and ``pred``), listed with ``kalos_list``: no cap."""
        return [node for _, node in accepted(self._client, self._accept(pred), filter=expr)]

    def get_nodes(
        self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None
    ) -> List[BaseNode]:
        """Nodes by id (missing ids skipped, in the order asked) and/or by filters: every node
        that matches, however many."""
        if node_ids is None and (filters is None or not filters.filters):
            raise ValueError("get_nodes needs node_ids or filters")
        if node_ids is None:
            return self._list(*self._scope(filters))
        found = {}
        for i in range(0, len(node_ids), 256):  # 256 ids of ordinary length stay inside 64 KiB
            chunk = list(node_ids[i:i + 256])
            for n in self._list(*self._scope(filters, chunk)):
                found[n.node_id] = n
        return [found[i] for i in node_ids if i in found]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Top ``similarity_top_k`` nodes for ``query.query_embedding`` under ``filters``,
        ``node_ids`` and ``doc_ids``, exact (see the module docs for TEXT_MATCH)."""
        if query.query_embedding is None:
            raise ValueError("KalosVectorStore needs query.query_embedding")
        k = max(1, min(int(query.similarity_top_k or 1), kalos.MAX_K))
        # An empty node_ids/doc_ids list means no restriction, as in the other LlamaIndex stores
        # (VectorStoreIndex.as_retriever passes [] for stores that keep the text).
        expr, pred = self._scope(query.filters, query.node_ids or None, query.doc_ids or None)
        hits = self._search(np.asarray(query.query_embedding, dtype=np.float32), k, expr, pred)
        return VectorStoreQueryResult(
            nodes=[n for n, _ in hits], similarities=[s for _, s in hits], ids=[n.node_id for n, _ in hits]
        )

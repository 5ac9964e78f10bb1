"""LangChain vector store backed by Kalos (``pip install "kalos[langchain]"``).

    from kalos.langchain import KalosVectorStore
    store = KalosVectorStore(embeddings, name="chat", namespace_key="user")
    store.add_texts(["likes tea"], metadatas=[{"user": "alice"}])
    store.similarity_search("what does alice drink?", k=3, filter={"user": "alice"})

Storage layout: each LangChain document is one Kalos memory.

* id: LangChain's string id mapped to a ``u64`` by :func:`kalos._ids.str_to_u64` (blake2b);
  ids are generated (uuid4) when none are given.
* payload: UTF-8 JSON ``{"id": <string id>, "text": <page_content>, "metadata": {...}}``
  (``metadata`` is omitted with ``store_metadata=False``). Payload size is bounded by the
  store's ``max_payload_bytes`` (default 64 KiB).
* namespace: ``metadata[namespace_key]`` (default key ``"namespace"``) through
  :func:`kalos._ids.namespace_of`; documents without the key go to ``default_namespace``.

* fields: the metadata values Kalos can type (str, int, float, bool, datetime, list of str)
  are also written as metadata fields, which filters test; other values (dicts, None, mixed
  lists), and a value whose type differs from the one the field got at its first write, stay
  in the payload only (a filter on them does not match that document).

Filters:

* a dict in the Mongo style (``{"user": "alice"}``, ``{"year": {"$gte": 2020}}``,
  ``{"$and": [...]}``, ``{"$or": [...]}``, ``{"$not": {...}}``; operators ``$eq $ne $gt $gte
  $lt $lte $in $nin $exists $contains``): evaluated inside the Kalos scan, so the top-k is
  exact (k documents whenever k match). A dict on the namespace key alone (a value, ``$eq``
  or ``$in``) is a namespace filter.
* a callable ``f(Document) -> bool``: cannot run inside the scan. It is applied to candidates
  fetched in growing rounds (4k, 16k, ... up to 1024) until k pass; when the best 1024 hold
  fewer than k, every other document (in the ``namespace`` given) is listed, tested, and those
  that pass are scored exactly here from their stored vectors
  (:func:`kalos._adapter.top_k_accepted`). The result is exact whatever the store size (k
  documents whenever k pass): the slower path, the more so the rarer the callable passes.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

import kalos
from kalos import filters as _filters
from kalos._adapter import top_k_accepted, typed_fields, upsert_lenient
from kalos._ids import namespace_of, str_to_u64

__all__ = ["KalosVectorStore"]


class KalosVectorStore(VectorStore):
    """A langchain-core :class:`VectorStore` over a Kalos store.

    Args:
        embedding: the LangChain embeddings model.
        name: Kalos store name (opened with ``kalos.open(name, dim=..., **open_kwargs)``;
            role auto by default, so the first user in a machine becomes the server).
        client: an already open :class:`kalos.Kalos` to use instead of ``name`` (not closed by
            :meth:`close` unless ``owns_client=True``).
        namespace_key: metadata key whose value selects the Kalos namespace.
        default_namespace: namespace of documents without ``namespace_key``.
        store_metadata: keep the metadata in the payload JSON (default True).
        **open_kwargs: passed to :func:`kalos.open` (``metric``, ``capacity``, ``role``, ...);
            ``dim`` defaults to the length of an embedded probe string.
    """

    def __init__(
        self,
        embedding: Embeddings,
        name: Optional[str] = None,
        *,
        client: Optional[kalos.Kalos] = None,
        namespace_key: str = "namespace",
        default_namespace: int = 0,
        store_metadata: bool = True,
        owns_client: Optional[bool] = None,
        **open_kwargs: Any,
    ) -> None:
        self._embedding = embedding
        if client is None:
            if name is None:
                name = f"langchain-{uuid.uuid4().hex[:16]}"  # a private store of this process
            if not open_kwargs.get("dim"):
                open_kwargs["dim"] = len(embedding.embed_query("kalos dimension probe"))
            client = kalos.open(name, **open_kwargs)
            owns = True if owns_client is None else owns_client
        else:
            owns = bool(owns_client)
        self.client = client
        self._owns = owns
        self.namespace_key = namespace_key
        self.default_namespace = default_namespace
        self.store_metadata = store_metadata
        self._metric = client.stats()["metric"]

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def embeddings(self) -> Embeddings:
        return self._embedding

    def close(self) -> None:
        """Closes the Kalos handle if this store opened it."""
        if self._owns:
            self.client.close()

    def __enter__(self) -> "KalosVectorStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _namespace(self, metadata: Optional[Dict[str, Any]]) -> int:
        if metadata and self.namespace_key in metadata:
            return namespace_of(metadata[self.namespace_key])
        return self.default_namespace

    def _is_namespace_filter(self, filter: Any) -> bool:
        if not isinstance(filter, dict) or set(filter) != {self.namespace_key}:
            return False
        v = filter[self.namespace_key]
        return not isinstance(v, dict) or set(v) in ({"$in"}, {"$eq"})

    def _filter_namespaces(self, filter: Optional[Dict[str, Any]], namespace: Any) -> Optional[List[int]]:
        ns: Optional[List[int]] = None
        if namespace is not None:
            ns = [namespace_of(namespace)]
        if filter and self._is_namespace_filter(filter):
            v = filter[self.namespace_key]
            vals = v.get("$in", [v.get("$eq")]) if isinstance(v, dict) else [v]
            ns = (ns or []) + [namespace_of(x) for x in vals]
        return ns

    def _scope(self, filter: Any, namespace: Any) -> Tuple[Optional[List[int]], Any]:
        """(namespaces, metadata filter) of a dict filter."""
        if filter is None or self._is_namespace_filter(filter):
            return self._filter_namespaces(filter, namespace), None
        if not isinstance(filter, dict):
            raise TypeError(f"filter must be a dict or a callable, got {type(filter).__name__}")
        return self._filter_namespaces(None, namespace), _filters.from_dict(filter)

    def _payload(self, text: str, metadata: Optional[Dict[str, Any]], sid: str) -> bytes:
        d: Dict[str, Any] = {"id": sid, "text": text}
        if self.store_metadata:
            d["metadata"] = metadata or {}
        return json.dumps(d, ensure_ascii=False, default=str).encode("utf-8")

    @staticmethod
    def _document(payload: Optional[bytes], expect_id: Optional[str] = None) -> Optional[Document]:
        if payload is None:
            return None
        d = json.loads(payload)
        if expect_id is not None and d.get("id") != expect_id:
            return None  # 64-bit hash collision with another string id: not ours
        return Document(page_content=d.get("text", ""), metadata=d.get("metadata", {}), id=d.get("id"))

    # -- writes ---------------------------------------------------------------------------------

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: Optional[List[Dict[str, Any]]] = None,
        *,
        ids: Optional[List[str]] = None,
        ttl: Optional[float] = None,
        **kwargs: Any,
    ) -> List[str]:
        """Embeds and upserts texts; returns their string ids (generated when missing).

        ``ttl`` (seconds) makes the memories expire."""
        texts = list(texts)
        if not texts:
            return []
        metas = list(metadatas) if metadatas is not None else [{} for _ in texts]
        given: List[Optional[str]] = list(ids) if ids is not None else [None] * len(texts)
        sids = [i if i else str(uuid.uuid4()) for i in given]
        if len(metas) != len(texts) or len(sids) != len(texts):
            raise ValueError("texts, metadatas and ids must have the same length")
        vectors = np.asarray(self._embedding.embed_documents(texts), dtype=np.float32)
        # Chunk so that one request stays well inside a 1 MiB shared-memory slot.
        payloads = [self._payload(t, m, s) for t, m, s in zip(texts, metas, sids)]
        start = 0
        while start < len(texts):
            end, size = start, 0
            while end < len(texts) and (end == start or size + vectors.shape[1] * 4 + len(payloads[end]) + 32 < 512 * 1024):
                size += vectors.shape[1] * 4 + len(payloads[end]) + 32
                end += 1
            keys = [str_to_u64(s) for s in sids[start:end]]
            fields = [typed_fields(m) for m in metas[start:end]]
            try:
                upsert_lenient(
                    self.client,
                    keys,
                    vectors[start:end],
                    fields,
                    namespaces=[self._namespace(m) for m in metas[start:end]],
                    payloads=payloads[start:end],
                    ttl=ttl,
                )
            except kalos.PayloadTooLargeError as e:
                # Name the caller's own id (the library only knows the 64-bit key) and the limit.
                m = re.search(r"the limit is (\d+)", str(e))
                limit = int(m.group(1)) if m else None
                i = max(range(start, end), key=lambda j: len(payloads[j]))
                raise kalos.PayloadTooLargeError(
                    f"PAYLOAD_TOO_LARGE: document {sids[i]!r} takes {len(payloads[i])} bytes as a Kalos payload"
                    f" (its text, metadata and id as JSON); the store's limit is {limit} bytes (max_payload_bytes)",
                    e.status,
                ) from e
            start = end
        return sids

    def delete(self, ids: Optional[List[str]] = None, **kwargs: Any) -> Optional[bool]:
        """Deletes by string id (unknown ids are ignored). With ``ids=None``: deletes the
        namespace given as ``namespace=``/``filter={key: value}``, else every memory."""
        if ids is None:
            ns, expr = self._scope(kwargs.get("filter"), kwargs.get("namespace"))
            if expr is not None:
                self.client.delete_where(expr, namespaces=ns)
                return True
            if ns:
                for n in ns:
                    self.client.delete_namespace(n)
            else:
                self.client.clear()
            return True
        keys = list(dict.fromkeys(str_to_u64(i) for i in ids))
        if not keys:
            return True
        try:
            self.client.delete(keys)
        except kalos.NotFoundError:
            # Kalos deletes all-or-nothing; drop the unknown ids and delete the rest.
            for key in keys:
                try:
                    self.client.delete([key])
                except kalos.NotFoundError:
                    pass
        return True

    # -- reads ----------------------------------------------------------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> List[Document]:
        """Documents for the ids that exist, in request order (missing ids are skipped)."""
        out: List[Document] = []
        keys = [str_to_u64(i) for i in ids]
        try:
            recs = self.client.get(keys, vectors=False, namespaces=False).payloads or []
            pairs = list(zip(ids, recs))
        except kalos.NotFoundError:
            pairs = []
            for sid, key in zip(ids, keys):
                try:
                    pairs.append((sid, (self.client.get([key], vectors=False, namespaces=False).payloads or [None])[0]))
                except kalos.NotFoundError:
                    continue
        for sid, p in pairs:
            doc = self._document(p, sid)
            if doc is not None:
                out.append(doc)
        return out

    def similarity_search_with_score_by_vector(
        self,
        embedding: List[float],
        k: int = 4,
        filter: Optional[Dict[str, Any]] = None,
        namespace: Any = None,
        **kwargs: Any,
    ) -> List[Tuple[Document, float]]:
        """Top-k documents and Kalos scores (cosine/ip: higher is better; l2: lower).

        ``filter``: a dict (inside the scan, exact) or a callable on the Document (the slower
        path, exact too: candidates in growing rounds, then every candidate; see the module
        docs)."""
        if k <= 0:
            return []
        q = np.asarray(embedding, dtype=np.float32)
        if callable(filter):
            test = filter

            def accept(p: Optional[bytes]) -> Optional[Document]:
                doc = self._document(p)
                return doc if doc is not None and test(doc) else None

            ns = self._filter_namespaces(None, namespace)
            return top_k_accepted(self.client, q, k, self._metric, accept, namespaces=ns)
        ns, expr = self._scope(filter, namespace)
        ids, scores, payloads = self.client.recall(q, min(k, kalos.MAX_K), namespaces=ns, filter=expr, payloads=True)
        out = []
        for s, p in zip(scores.tolist(), payloads):
            doc = self._document(p)
            if doc is not None:
                out.append((doc, float(s)))
        return out

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: Optional[Dict[str, Any]] = None, **kwargs: Any
    ) -> List[Tuple[Document, float]]:
        return self.similarity_search_with_score_by_vector(self._embedding.embed_query(query), k, filter, **kwargs)

    def similarity_search_by_vector(
        self, embedding: List[float], k: int = 4, filter: Optional[Dict[str, Any]] = None, **kwargs: Any
    ) -> List[Document]:
        return [d for d, _ in self.similarity_search_with_score_by_vector(embedding, k, filter, **kwargs)]

    def similarity_search(
        self, query: str, k: int = 4, filter: Optional[Dict[str, Any]] = None, **kwargs: Any
    ) -> List[Document]:
        return self.similarity_search_by_vector(self._embedding.embed_query(query), k, filter, **kwargs)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        # LangChain wants [0, 1]. A vector's score against itself can be 1 + 6e-8 (f32 rounding:
        # the SIMD and GPU kernels sum in different orders) and unnormalised vectors leave the
        # nominal ranges altogether, so the mappings are clamped.
        def clamp(x: float) -> float:
            return min(1.0, max(0.0, x))

        if self._metric == "l2":
            return lambda d: clamp(1.0 - float(np.sqrt(max(d, 0.0))) / float(np.sqrt(2.0)))
        if self._metric == "cosine":
            return lambda s: clamp(s)  # LangChain's _cosine_relevance_score_fn: 1 - (1 - cos) = cos
        # LangChain's _max_inner_product_relevance_score_fn takes the distance -ip.
        return lambda s: clamp(self._max_inner_product_relevance_score_fn(-s))

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: List[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> List[Document]:
        ns, expr = self._scope(filter, kwargs.get("namespace"))
        q = np.asarray(embedding, dtype=np.float32)
        ids, _, payloads = self.client.recall(q, min(max(fetch_k, k), kalos.MAX_K), namespaces=ns, filter=expr, payloads=True)
        if len(ids) == 0:
            return []
        vecs = self.client.get(ids, namespaces=False, payloads=False).vectors
        assert vecs is not None
        picked = maximal_marginal_relevance(q, list(vecs), lambda_mult=lambda_mult, k=k)
        docs = [self._document(payloads[i]) for i in picked]
        return [d for d in docs if d is not None]

    def max_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> List[Document]:
        return self.max_marginal_relevance_search_by_vector(
            self._embedding.embed_query(query), k, fetch_k, lambda_mult, **kwargs
        )

    @classmethod
    def from_texts(
        cls,
        texts: List[str],
        embedding: Embeddings,
        metadatas: Optional[List[Dict[str, Any]]] = None,
        *,
        ids: Optional[List[str]] = None,
        **kwargs: Any,
    ) -> "KalosVectorStore":
        """Creates a store (kwargs as in the constructor; without ``name`` a private store with
        a generated name) and adds the texts."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

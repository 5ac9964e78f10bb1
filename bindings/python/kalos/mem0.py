"""mem0 vector store backed by Kalos (``pip install "kalos[mem0]"``).

    import kalos.mem0
    from mem0 import Memory
    kalos.mem0.register()          # adds the provider "kalos" to mem0's factories
    m = Memory.from_config({"vector_store": {"provider": "kalos",
                                             "config": {"collection_name": "mem0", "embedding_model_dims": 384}}})

Each mem0 collection is one Kalos store named ``collection_name`` (opened with role auto, so
the first process serves it and the others attach; ``open_kwargs`` go to :func:`kalos.open`).
Each memory is one Kalos memory: its id is mem0's string id mapped to a ``u64`` by
:func:`kalos._ids.str_to_u64`, its payload is the JSON of mem0's payload (plus the string id),
and the payload values Kalos can type (``user_id``, ``agent_id``, ``run_id``, ``actor_id``,
``role``, ``hash``, the caller's metadata, ...) are metadata fields.

Filters, as mem0 hands them to a vector store, run inside the Kalos scan, so a scoped search is
exact (mem0's over-fetch of ``top_k`` gets ``top_k`` scoped results whenever that many exist):
``{"user_id": "u1"}``; ``{"key": "*"}`` (the key is set); ``{"key": {"eq"|"ne"|"gt"|"gte"|
"lt"|"lte"|"in"|"nin": v}}``; ``"AND"``/``"$and"``, ``"OR"``/``"$or"`` and ``"NOT"``/``"$not"``
(none of the conditions) with a list of conditions. ``contains`` and ``icontains`` (a
substring of a string value) cannot run in the scan: the rest of the filter narrows the
candidates there and the substring test is applied to them in growing rounds and, when the best
1024 hold fewer than ``top_k`` matches, to every other candidate, listed with ``kalos_list`` and
scored exactly from its stored vector (:func:`kalos._adapter.top_k_accepted`): exact, and the
slower path. ``list`` returns ``top_k`` memories (default 100) however many match.

Scores are Kalos's: cosine similarity for the default metric (higher is better, as mem0
expects), inner product for ``"ip"``, and ``1 / (1 + distance)`` for ``"l2"``.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import kalos
from kalos import filters as F
from kalos._adapter import accepted, top_k_accepted, typed_fields, upsert_lenient
from kalos._ids import str_to_u64

try:
    from mem0.vector_stores.base import VectorStoreBase
except ImportError as e:  # pragma: no cover - exercised only without mem0ai
    raise ImportError('kalos.mem0 needs the mem0ai package: pip install "kalos[mem0]"') from e

__all__ = ["KalosMem0Store", "KalosMem0Config", "OutputData", "register"]

_ID = "_mem0_id"
Pred = Callable[[Dict[str, Any]], bool]


class OutputData(BaseModel):
    """One result, in the shape mem0's stores return."""

    id: Optional[str]
    score: Optional[float]
    payload: Optional[Dict]


class KalosMem0Config(BaseModel):
    """The ``vector_store.config`` of provider ``"kalos"``."""

    collection_name: str = Field("mem0", description="Kalos store name of the collection")
    embedding_model_dims: int = Field(1536, description="Dimension of the embedding vectors")
    metric: str = Field("cosine", description="cosine, ip or l2")
    open_kwargs: Dict[str, Any] = Field(default_factory=dict, description="More keyword arguments of kalos.open")

    model_config = ConfigDict(extra="forbid")


_CMP = {"eq": F.eq, "ne": F.ne, "gt": F.gt, "gte": F.gte, "lt": F.lt, "lte": F.lte}


def _condition(key: str, cond: Any) -> Tuple[F.Expr, Optional[Pred]]:
    """(expression, substring test or None) of one key's condition. With a test, the
    expression is a superset (the key exists) and the test decides."""
    if isinstance(cond, dict):
        parts: List[F.Expr] = []
        tests: List[Pred] = []
        for op, v in cond.items():
            if op in _CMP:
                parts.append(_CMP[op](key, v))
            elif op in ("in", "nin"):
                if not isinstance(v, (list, tuple)):
                    raise ValueError(f"filter {op!r} on {key!r} takes a list, got {v!r}")
                parts.append((F.in_ if op == "in" else F.nin)(key, list(v)))
            elif op in ("contains", "icontains"):
                needle = str(v) if op == "contains" else str(v).lower()
                fold = op == "icontains"
                parts.append(F.exists(key))
                tests.append(lambda p, n=needle, c=fold: isinstance(p.get(key), str)
                             and n in (p[key].lower() if c else p[key]))
            else:
                raise ValueError(f"unsupported filter operator {op!r} on {key!r}")
        if not parts:
            raise ValueError(f"empty condition on {key!r}")
        return F.and_(*parts), (lambda p: all(t(p) for t in tests)) if tests else None
    if cond == "*":
        return F.exists(key), None
    if isinstance(cond, (list, tuple)):
        return F.in_(key, list(cond)), None
    return F.eq(key, cond), None


_LOGIC = {"AND": all, "$and": all, "OR": any, "$or": any, "NOT": None, "$not": None}


def translate(filters: Optional[Dict[str, Any]]) -> Tuple[Optional[F.Expr], Optional[Pred]]:
    """A mem0 filter dict as (expression for the scan, payload test still needed or None). The
    filter holds exactly when the expression and the test both do."""
    if not filters:
        return None, None
    parts: List[F.Expr] = []
    preds: List[Pred] = []
    for key, value in filters.items():
        if key not in _LOGIC:
            e, t = _condition(key, value)
            parts.append(e)
            if t is not None:
                preds.append(t)
            continue
        if not isinstance(value, list) or not value or not all(isinstance(c, dict) and c for c in value):
            raise ValueError(f"{key} takes a non-empty list of non-empty conditions, got {value!r}")
        subs = [translate(c) for c in value]
        exprs = [e for e, _ in subs]
        combine = _LOGIC[key]
        if all(t is None for _, t in subs):  # exact in the scan
            parts.append(F.and_(*exprs) if combine is all else F.or_(*exprs) if combine is any else ~F.or_(*exprs))
            continue
        # A superset in the scan where one exists, then the exact test per candidate.
        if combine is all:
            parts.extend(e for e in exprs if e is not None)
        elif combine is any and all(e is not None for e in exprs):
            parts.append(F.or_(*exprs))
        test = combine or (lambda it: not any(it))
        preds.append(lambda p, s=subs, f=test: f(_holds(e, t, p) for e, t in s))
    return (F.and_(*parts) if parts else None), ((lambda p: all(t(p) for t in preds)) if preds else None)


def _holds(expr: Optional[F.Expr], test: Optional[Pred], payload: Dict[str, Any]) -> bool:
    """One translated condition evaluated on a payload (the slower path)."""
    return (expr is None or F.matches(expr, typed_fields(payload))) and (test is None or test(payload))


class KalosMem0Store(VectorStoreBase):
    """A mem0 ``VectorStoreBase`` over one Kalos store per collection."""

    def __init__(self, collection_name: str = "mem0", embedding_model_dims: int = 1536, metric: str = "cosine",
                 open_kwargs: Optional[Dict[str, Any]] = None, **_: Any) -> None:
        self.collection_name = collection_name
        self.embedding_model_dims = embedding_model_dims
        self.metric = metric
        self._open_kwargs = dict(open_kwargs or {})
        self.client: Optional[kalos.Kalos] = None
        self._metric_name: Optional[str] = None
        self.create_col(collection_name, embedding_model_dims, metric)

    # -- collections ------------------------------------------------------------------------------

    def create_col(self, name: str, vector_size: Optional[int] = None, distance: Optional[str] = None) -> None:
        """Opens (or creates) the Kalos store ``name``."""
        if self.client is not None and not self.client.closed and name == self.collection_name:
            return
        self.collection_name = name
        self._metric_name = None
        self.client = kalos.open(name, dim=int(vector_size or self.embedding_model_dims),
                                 metric=distance or self.metric, **self._open_kwargs)

    def list_cols(self) -> List[str]:
        return [self.collection_name]

    def delete_col(self) -> None:
        """Deletes every memory of the collection (the store itself stays open)."""
        self._kv.clear()

    def col_info(self) -> Dict[str, Any]:
        s = self._kv.stats()
        return {"name": self.collection_name, "count": s["count"], "dim": s["dim"], "metric": self.metric}

    def reset(self) -> None:
        self._kv.clear()

    @property
    def _kv(self) -> kalos.Kalos:
        assert self.client is not None
        return self.client

    # -- writes -----------------------------------------------------------------------------------

    def insert(self, vectors: List[List[float]], payloads: Optional[List[Dict]] = None,
               ids: Optional[List[str]] = None) -> None:
        if not vectors:
            return
        n = len(vectors)
        payloads = list(payloads) if payloads is not None else [{} for _ in range(n)]
        if ids is None:
            import uuid

            ids = [str(uuid.uuid4()) for _ in range(n)]
        if len(payloads) != n or len(ids) != n:
            raise ValueError(f"{n} vectors, {len(payloads)} payloads and {len(ids)} ids")
        fields = []
        blobs = []
        for sid, p in zip(ids, payloads):
            f = typed_fields(p)
            f[_ID] = sid
            fields.append(f)
            blobs.append(json.dumps({**p, _ID: sid}, ensure_ascii=False, default=str).encode("utf-8"))
        upsert_lenient(self._kv, [str_to_u64(i) for i in ids], np.asarray(vectors, dtype=np.float32), fields,
                       payloads=blobs)

    def update(self, vector_id: str, vector: Optional[List[float]] = None, payload: Optional[Dict] = None) -> None:
        if vector is None or payload is None:
            old = self._fetch(vector_id, vectors=vector is None)
            if old is None:
                raise KeyError(f"no memory {vector_id!r} in collection {self.collection_name!r}")
            if payload is None:
                payload = old[1]
            if vector is None:
                vector = old[0]
        self.insert([list(np.asarray(vector, np.float32))], [payload], [vector_id])

    def delete(self, vector_id: str) -> None:
        """Deletes one memory; an unknown id is ignored."""
        self._kv.delete_where(F.eq(_ID, vector_id))

    # -- reads ------------------------------------------------------------------------------------

    @staticmethod
    def _decode(blob: Optional[bytes]) -> Optional[Dict[str, Any]]:
        if blob is None:
            return None
        d = json.loads(blob)
        return d if isinstance(d, dict) else None

    def _fetch(self, vector_id: str, vectors: bool = False) -> Optional[Tuple[Any, Dict[str, Any]]]:
        try:
            r = self._kv.get([str_to_u64(vector_id)], vectors=vectors, namespaces=False)
        except kalos.NotFoundError:
            return None
        p = self._decode((r.payloads or [None])[0])
        if p is None or p.get(_ID) != vector_id:
            return None  # a 64-bit hash collision with another id: not this memory
        p.pop(_ID, None)
        return (r.vectors[0] if vectors and r.vectors is not None else None), p

    def get(self, vector_id: str) -> Optional[OutputData]:
        got = self._fetch(vector_id)
        return None if got is None else OutputData(id=vector_id, score=None, payload=got[1])

    def _score(self, s: float) -> float:
        return 1.0 / (1.0 + max(float(s), 0.0) ** 0.5) if self.metric == "l2" else float(s)

    def _accept(self, pred: Optional[Pred]) -> Callable[[Optional[bytes]], Optional[Tuple[Optional[str], Dict[str, Any]]]]:
        """A blob's (mem0 id, payload) when the payload passes ``pred`` (every one when None)."""

        def accept(blob: Optional[bytes]) -> Optional[Tuple[Optional[str], Dict[str, Any]]]:
            p = self._decode(blob)
            if p is None:
                return None
            sid = p.pop(_ID, None)
            return (sid, p) if pred is None or pred(p) else None

        return accept

    def _metric(self) -> str:
        """The store's own metric (a store opened before keeps the one it was created with)."""
        if self._metric_name is None:
            self._metric_name = self._kv.stats()["metric"]
        return self._metric_name

    def _recall(self, q: np.ndarray, k: int, filters: Optional[Dict[str, Any]]) -> List[OutputData]:
        expr, pred = translate(filters)
        k = max(1, int(k))
        if pred is None:
            _, scores, blobs = self._kv.recall(q, min(k, kalos.MAX_K), filter=expr, payloads=True)
            accept = self._accept(None)
            hits = [(item, s) for s, b in zip(scores.tolist(), blobs) if (item := accept(b)) is not None]
        else:
            hits = top_k_accepted(self._kv, q, k, self._metric(), self._accept(pred), filter=expr)
        return [OutputData(id=sid, score=self._score(s), payload=p) for (sid, p), s in hits]

    def search(self, query: str, vectors: List[float], top_k: int = 5,
               filters: Optional[Dict[str, Any]] = None) -> List[OutputData]:
        """Top-k memories for the query vector under ``filters`` (exact: see the module docs)."""
        return self._recall(np.asarray(vectors, dtype=np.float32), top_k, filters)

    def list(self, filters: Optional[Dict[str, Any]] = None, top_k: Optional[int] = None) -> List[List[OutputData]]:
        """``top_k`` (default 100) memories under ``filters`` (fewer when fewer match), in
        ascending Kalos id order, as ``[[OutputData, ...]]`` like mem0's other stores; scores
        are None. Every match is reachable: the candidates are listed with ``kalos_list``."""
        limit = 100 if top_k is None else int(top_k)
        rows: List[OutputData] = []
        if limit <= 0:
            return [rows]
        expr, pred = translate(filters)
        for _, (sid, p) in accepted(self._kv, self._accept(pred), filter=expr):
            rows.append(OutputData(id=sid, score=None, payload=p))
            if len(rows) >= limit:
                break
        return [rows]


def register() -> None:
    """Adds the provider ``"kalos"`` to mem0's ``VectorStoreConfig`` and ``VectorStoreFactory``,
    so ``Memory.from_config({"vector_store": {"provider": "kalos", "config": {...}}})`` works.
    Idempotent."""
    from mem0.utils.factory import VectorStoreFactory
    from mem0.vector_stores.configs import VectorStoreConfig

    mod = "mem0.configs.vector_stores.kalos"
    if mod not in sys.modules:
        m = types.ModuleType(mod)
        m.KalosMem0Config = KalosMem0Config  # type: ignore[attr-defined]
        sys.modules[mod] = m
    # `_provider_configs` is a pydantic private attribute; its default dict is the table the
    # config validator reads.
    VectorStoreConfig.__private_attributes__["_provider_configs"].default["kalos"] = "KalosMem0Config"
    VectorStoreFactory.provider_to_class["kalos"] = "kalos.mem0.KalosMem0Store"

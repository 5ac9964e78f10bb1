"""Helpers shared by the framework adapters (LangChain, LlamaIndex, mem0)."""

from __future__ import annotations

import datetime as _dt
import heapq
import re
from typing import Any, Callable, Collection, Dict, Iterator, List, Mapping, Optional, Tuple, TypeVar

import numpy as np

import kalos

_CONFLICT = re.compile(r'field "(.+?)" of id (\d+) is')


def typed_fields(metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The metadata values Kalos can store as typed fields: str, bool, int (int64), finite float,
    datetime and non-empty lists of str. Other values (dicts, None, mixed lists) are left out:
    they stay in the adapter's payload JSON only, and a filter on them matches nothing."""
    out: Dict[str, Any] = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not 1 <= len(k.encode("utf-8")) <= 64:
            continue
        if isinstance(v, (str, bool, int, float, _dt.datetime)) and not (isinstance(v, float) and v != v):
            if isinstance(v, int) and not isinstance(v, bool) and not -(1 << 63) <= v < (1 << 63):
                continue
            if isinstance(v, float) and v in (float("inf"), float("-inf")):
                continue
            out[k] = v
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
            out[k] = list(v)
    return out


def upsert_lenient(client: "kalos.Kalos", keys: List[int], vectors: Any, fields: List[Dict[str, Any]],
                   **kwargs: Any) -> None:
    """``client.upsert(keys, vectors, metadata=fields, **kwargs)``; a field whose value has another
    type than the one the store's field got at its first write is dropped from that memory's
    fields (it stays in the payload) and the upsert is retried. Other errors propagate."""
    while True:
        try:
            client.upsert(keys, vectors, metadata=fields, **kwargs)
            return
        except kalos.InvalidArgumentError as e:
            m = _CONFLICT.search(str(e))
            item = fields[keys.index(int(m.group(2)))] if m and int(m.group(2)) in keys else None
            if item is None or item.pop(m.group(1), None) is None:
                raise


_MISSING = re.compile(r"id (\d+) (?:is not in the store|has expired)")

#: Ids listed per ``kalos_list`` page when an adapter walks every candidate.
LIST_PAGE = 4096

T = TypeVar("T")


def get_present(client: "kalos.Kalos", keys: List[int], **kwargs: Any) -> Tuple[List[int], Optional["kalos.Records"]]:
    """``client.get(keys, **kwargs)`` for the keys still stored: ``get`` is all or nothing, so a
    key deleted (or expired) since it was listed is dropped and the rest fetched again. Returns
    (the keys fetched, their records; None when none is left)."""
    keys = list(keys)
    while keys:
        try:
            return keys, client.get(keys, **kwargs)
        except kalos.NotFoundError as e:
            m = _MISSING.search(str(e))
            if m is None or int(m.group(1)) not in keys:
                raise
            keys.remove(int(m.group(1)))
    return [], None


def delete_present(client: "kalos.Kalos", keys: List[int]) -> int:
    """Deletes the keys still stored (``delete`` is all or nothing: a key deleted meanwhile is
    dropped and the rest deleted); returns how many were deleted."""
    keys = list(dict.fromkeys(keys))
    n = 0
    for i in range(0, len(keys), LIST_PAGE):
        chunk = keys[i:i + LIST_PAGE]
        while chunk:
            try:
                n += client.delete(chunk)
                break
            except kalos.NotFoundError as e:
                m = _MISSING.search(str(e))
                if m is None or int(m.group(1)) not in chunk:
                    raise
                chunk.remove(int(m.group(1)))
    return n


def accepted(client: "kalos.Kalos", accept: Callable[[Optional[bytes]], Optional[T]], *, filter: Any = None,
             namespaces: Optional[List[int]] = None, skip: Collection[int] = ()) -> Iterator[Tuple[int, T]]:
    """(key, item) for every stored memory under ``filter`` and ``namespaces`` (ascending key
    order; keys in ``skip`` left out) whose payload ``accept`` turns into an item (None: not
    taken). Every candidate is listed (``kalos_list``) and its payload fetched: no cap."""
    for page in client.list_pages(filter, namespaces=namespaces, page_size=LIST_PAGE):
        keys = [i for i in page.tolist() if i not in skip]
        keys, recs = get_present(client, keys, vectors=False, namespaces=False)
        if recs is None:
            continue
        for key, p in zip(keys, recs.payloads or []):
            item = accept(p)
            if item is not None:
                yield key, item


def exact_scores(vectors: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """The store's score of each row of ``vectors`` for the query ``q``, in float64: cosine
    similarity, inner product, or squared L2 distance (``metric``: cosine, ip, l2)."""
    x = np.asarray(vectors, np.float64)
    qq = np.asarray(q, np.float64)
    if metric == "l2":
        return ((x - qq) ** 2).sum(axis=1)
    s = x @ qq
    if metric == "cosine":
        s = s / (np.linalg.norm(x, axis=1) * np.linalg.norm(qq))
    return s


def top_k_accepted(client: "kalos.Kalos", q: np.ndarray, k: int, metric: str,
                   accept: Callable[[Optional[bytes]], Optional[T]], *, filter: Any = None,
                   namespaces: Optional[List[int]] = None) -> List[Tuple[T, float]]:
    """The best ``k`` memories under ``filter`` and ``namespaces`` whose payload ``accept`` turns
    into an item, best first, with their scores: for a test the scan cannot run (a Python
    callable, a substring match).

    Candidates come from recalls in growing rounds (4k, 16k, ... up to MAX_K); when the last
    round holds MAX_K candidates and fewer than k pass, every other candidate is listed
    (``kalos_list``), its payload tested, and the vectors of those that pass fetched and scored
    here (:func:`exact_scores`, ties by lower id). So the result is exact whatever the store
    size, and slower the rarer the test passes. Scores of that last step are computed in
    float64 from the stored vectors, so they may differ from the engine's in the last bits."""
    q = np.asarray(q, np.float32)
    fetch = min(4 * k, kalos.MAX_K)
    while True:
        ids, scores, payloads = client.recall(q, fetch, namespaces=namespaces, filter=filter, payloads=True)
        out: List[Tuple[T, float]] = []
        for s, p in zip(scores.tolist(), payloads):
            item = accept(p)
            if item is not None:
                out.append((item, float(s)))
        if len(out) >= k or len(ids) < fetch:
            return out[:k]
        if fetch >= kalos.MAX_K:
            break
        fetch = min(4 * fetch, kalos.MAX_K)
    # Every candidate ranked below the last round's: keep the best `need` of those that pass.
    need = k - len(out)
    sign = -1.0 if metric == "l2" else 1.0
    heap: List[Tuple[float, int, T]] = []  # (sign * score, -key, item): the worst kept on top
    batch: List[Tuple[int, T]] = []

    def flush() -> None:
        keys, recs = get_present(client, [key for key, _ in batch], namespaces=False, payloads=False)
        if recs is not None and recs.vectors is not None:
            items = dict(batch)
            for key, s in zip(keys, exact_scores(recs.vectors, q, metric).tolist()):
                entry = (sign * s, -key, items[key])
                if len(heap) < need:
                    heapq.heappush(heap, entry)
                elif entry[:2] > heap[0][:2]:
                    heapq.heapreplace(heap, entry)
        batch.clear()

    for key, item in accepted(client, accept, filter=filter, namespaces=namespaces, skip=set(ids.tolist())):
        batch.append((key, item))
        if len(batch) >= LIST_PAGE:
            flush()
    if batch:
        flush()
    rest = sorted(heap, key=lambda e: (-e[0], -e[1]))
    return out + [(item, sign * s) for s, _, item in rest]

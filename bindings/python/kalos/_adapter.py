"""Helpers shared by the framework adapters (LangChain, LlamaIndex, mem0)."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Dict, List, Mapping, Optional

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

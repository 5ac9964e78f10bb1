"""Metadata fields and filter expressions: builders and the binary forms of the C ABI.

Fields (``Kalos.upsert(..., metadata=[...])``) are a dict per memory. A value's Python type picks
the field type: ``str`` keyword, ``list``/``tuple``/``set`` of ``str`` tags, ``bool`` bool, ``int``
int64, ``float`` float64, ``datetime.datetime`` timestamp (unix ms, rounded down; naive datetimes
are taken as UTC). ``None`` values are left out. A field is typed by the first write that sets it;
a later write of another type raises :class:`kalos.InvalidArgumentError`.

Filters (``Kalos.recall(..., filter=...)``) are built with the functions below, combined with
``&``, ``|`` and ``~``, or written as a Mongo-style dict (:func:`from_dict`)::

    from kalos import filters as F
    f = (F.eq("user", "ann") | F.contains("tags", "urgent")) & ~F.exists("archived")
    f = F.from_dict({"$and": [{"user": "ann"}, {"n": {"$gte": 3}}]})

Semantics (docs/FORMATS.md, "Filter expressions"): ``eq``/``in``/``contains`` on a tags field
match when any tag does; ``ne`` and ``nin`` match memories that lack the field; orderings
compare numbers with numbers (int, float and timestamp exactly), strings bytewise and bools; a
value of another kind than the field matches nothing.
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

__all__ = [
    "Expr", "eq", "ne", "gt", "gte", "lt", "lte", "in_", "nin", "exists", "contains",
    "and_", "or_", "not_", "from_dict", "matches", "encode_fields", "decode_fields", "MAX_DEPTH",
]

FILTER_VERSION = 1
FIELDS_VERSION = 1
#: Deepest nesting the library accepts (the root is depth 1).
MAX_DEPTH = 32

_AND, _OR, _NOT, _EQ, _NE, _GT, _GTE, _LT, _LTE, _IN, _NIN, _EXISTS, _CONTAINS = range(1, 14)
_T_KEYWORD, _T_TAGS, _T_INT, _T_FLOAT, _T_BOOL, _T_TIMESTAMP = range(1, 7)

Scalar = Union[str, int, float, bool, _dt.datetime]


def _name(b: bytearray, name: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"a field name must be a str, got {type(name).__name__}")
    raw = name.encode("utf-8")
    if not 1 <= len(raw) <= 64:
        raise ValueError(f"field name {name!r} has {len(raw)} bytes (1 to 64)")
    b.append(len(raw))
    b += raw


def _str(b: bytearray, s: str) -> None:
    raw = s.encode("utf-8")
    if len(raw) > 1024:
        raise ValueError(f"string of {len(raw)} bytes (at most 1024)")
    b += struct.pack("<H", len(raw))
    b += raw


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MS = _dt.timedelta(milliseconds=1)


def _ms(t: _dt.datetime) -> int:
    """Unix milliseconds, rounded down (as Go's UnixMilli and Java's toEpochMilli)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return (t - _EPOCH) // _MS


def _date(v: Any) -> Any:
    """``{"$date": unix ms}`` (the JSON form of a timestamp) as a datetime; anything else as is."""
    if isinstance(v, Mapping) and len(v) == 1 and "$date" in v:
        ms = v["$date"]
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise TypeError(f'{{"$date": ...}} takes integer unix milliseconds, got {ms!r}')
        return _EPOCH + ms * _MS
    return v


def _value(b: bytearray, v: Any, tags_ok: bool) -> None:
    if isinstance(v, bool):
        b.append(_T_BOOL)
        b.append(int(v))
    elif isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"int {v} does not fit int64")
        b.append(_T_INT)
        b += struct.pack("<q", v)
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"float {v} is not finite")
        b.append(_T_FLOAT)
        b += struct.pack("<d", v)
    elif isinstance(v, str):
        b.append(_T_KEYWORD)
        _str(b, v)
    elif isinstance(v, _dt.datetime):
        b.append(_T_TIMESTAMP)
        b += struct.pack("<q", _ms(v))
    elif isinstance(v, (list, tuple, set, frozenset)) and tags_ok:
        tags = sorted(v) if isinstance(v, (set, frozenset)) else list(v)
        if not all(isinstance(t, str) for t in tags):
            raise TypeError("a tags value holds strings only")
        if len(tags) > 256:
            raise ValueError(f"{len(tags)} tags (at most 256)")
        b.append(_T_TAGS)
        b += struct.pack("<H", len(tags))
        for t in tags:
            _str(b, t)
    else:
        raise TypeError(f"unsupported metadata value {v!r} ({type(v).__name__})")


class Expr:
    """A filter expression. Combine with ``&`` (and), ``|`` (or), ``~`` (not)."""

    __slots__ = ("op", "field", "value", "children")

    def __init__(self, op: int, field: Optional[str] = None, value: Any = None, children: Sequence["Expr"] = ()):
        self.op, self.field, self.value, self.children = op, field, value, list(children)

    def __and__(self, other: "Expr") -> "Expr":
        return and_(self, other)

    def __or__(self, other: "Expr") -> "Expr":
        return or_(self, other)

    def __invert__(self) -> "Expr":
        return not_(self)

    def __repr__(self) -> str:
        names = {_AND: "and", _OR: "or", _NOT: "not", _EQ: "eq", _NE: "ne", _GT: "gt", _GTE: "gte", _LT: "lt",
                 _LTE: "lte", _IN: "in", _NIN: "nin", _EXISTS: "exists", _CONTAINS: "contains"}
        if self.children:
            return f"{names[self.op]}({', '.join(map(repr, self.children))})"
        return f"{names[self.op]}({self.field!r}{'' if self.op == _EXISTS else ', ' + repr(self.value)})"

    def _put(self, b: bytearray, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ValueError(f"filter nested deeper than {MAX_DEPTH} levels")
        b.append(self.op)
        if self.op in (_AND, _OR):
            b += struct.pack("<H", len(self.children))
            for c in self.children:
                c._put(b, depth + 1)
        elif self.op == _NOT:
            self.children[0]._put(b, depth + 1)
        elif self.op in (_IN, _NIN):
            _name(b, self.field)
            b += struct.pack("<H", len(self.value))
            for v in self.value:
                _value(b, v, False)
        elif self.op == _EXISTS:
            _name(b, self.field)
        else:
            _name(b, self.field)
            _value(b, self.value, False)

    def encode(self) -> bytes:
        """The binary form (docs/FORMATS.md) that ``kalos_recall_params.filter`` takes."""
        b = bytearray([FILTER_VERSION])
        self._put(b, 1)
        return bytes(b)


def _kind(v: Any) -> Any:
    """(kind, comparable value) with docs/FORMATS.md's ordering: numbers (int, float and
    timestamp as exact numbers), strings, bools."""
    if isinstance(v, bool):
        return "bool", v
    if isinstance(v, _dt.datetime):
        return "num", _ms(v)
    if isinstance(v, (int, float)):
        return "num", v
    return "str", v.encode("utf-8") if isinstance(v, str) else v


def matches(expr: Expr, fields: Mapping[str, Any]) -> bool:
    """Whether one memory's fields (a dict as written or as :func:`decode_fields` reads it)
    match ``expr``, with the library's semantics. The library evaluates filters itself; this is
    the reference that tests and the adapters' slower paths use."""
    op = expr.op
    if op == _AND:
        return all(matches(c, fields) for c in expr.children)
    if op == _OR:
        return any(matches(c, fields) for c in expr.children)
    if op == _NOT:
        return not matches(expr.children[0], fields)
    have = fields.get(expr.field)
    if op == _EXISTS:
        return have is not None and have != []
    if op in (_NE, _NIN):
        return not matches(Expr(_EQ if op == _NE else _IN, expr.field, expr.value), fields)
    if have is None:
        return False
    tags = isinstance(have, (list, tuple, set, frozenset))
    values = [_kind(v) for v in (have if tags else [have])]
    if op in (_EQ, _CONTAINS, _IN):
        wanted = [_kind(v) for v in (expr.value if op == _IN else [expr.value])]
        return any(v == w for v in values for w in wanted)
    if tags:
        return False
    (k, v), (wk, w) = values[0], _kind(expr.value)
    if k != wk:
        return False
    return {_GT: v > w, _GTE: v >= w, _LT: v < w, _LTE: v <= w}[op]


def _cmp(op: int, field: str, value: Scalar) -> Expr:
    if isinstance(value, (list, tuple, set, frozenset, dict)) or value is None:
        raise TypeError(f"a comparison takes one scalar value, got {value!r}")
    return Expr(op, field, value)


def _comparison(op: int, name: str, doc: str) -> Callable[[str, Scalar], Expr]:
    def build(field: str, value: Scalar) -> Expr:
        return _cmp(op, field, value)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = doc
    return build


eq = _comparison(_EQ, "eq", "The field equals ``value`` (a tags field: holds it).")
ne = _comparison(_NE, "ne", "Not ``eq``: also matches memories without the field.")
gt = _comparison(_GT, "gt", "The field is greater than ``value`` (numbers with numbers, strings bytewise).")
gte = _comparison(_GTE, "gte", "The field is at least ``value``.")
lt = _comparison(_LT, "lt", "The field is less than ``value``.")
lte = _comparison(_LTE, "lte", "The field is at most ``value``.")
contains = _comparison(_CONTAINS, "contains", "A tags field holds ``value`` (a keyword field: equals it).")


def _values(values: Iterable[Scalar]) -> List[Scalar]:
    if isinstance(values, (str, bytes)):
        raise TypeError("in/nin take a list of values, not a string")
    v = list(values)
    for x in v:
        _cmp(_EQ, "x", x)
    return v


def in_(field: str, values: Iterable[Scalar]) -> Expr:
    """Matches when the field equals one of ``values``. An empty list matches nothing."""
    v = _values(values)
    return Expr(_IN, field, v) if v else not_(Expr(_EXISTS, field)) & Expr(_EXISTS, field)


def nin(field: str, values: Iterable[Scalar]) -> Expr:
    """Matches when the field equals none of ``values`` (or is absent). Empty: every memory."""
    v = _values(values)
    return Expr(_NIN, field, v) if v else not_(in_(field, v))


def exists(field: str) -> Expr:
    return Expr(_EXISTS, field)


def and_(*exprs: Expr) -> Expr:
    if not exprs:
        raise ValueError("and_ needs at least one expression")
    flat: List[Expr] = []
    for e in exprs:
        flat.extend(e.children if e.op == _AND else [e])
    return flat[0] if len(flat) == 1 else Expr(_AND, children=flat)


def or_(*exprs: Expr) -> Expr:
    if not exprs:
        raise ValueError("or_ needs at least one expression")
    flat: List[Expr] = []
    for e in exprs:
        flat.extend(e.children if e.op == _OR else [e])
    return flat[0] if len(flat) == 1 else Expr(_OR, children=flat)


def not_(expr: Expr) -> Expr:
    return Expr(_NOT, children=[expr])


_OPS = {"$eq": eq, "$ne": ne, "$gt": gt, "$gte": gte, "$lt": lt, "$lte": lte, "$in": in_, "$nin": nin,
        "$contains": contains}


def _field_cond(field: str, cond: Any) -> Expr:
    cond = _date(cond)
    if isinstance(cond, Mapping):
        parts: List[Expr] = []
        for op, v in cond.items():
            v = [_date(x) for x in v] if op in ("$in", "$nin") and isinstance(v, (list, tuple)) else _date(v)
            if op == "$exists":
                parts.append(exists(field) if v else not_(exists(field)))
            elif op == "$not":
                parts.append(not_(_field_cond(field, v)))
            elif op in _OPS:
                parts.append(_OPS[op](field, v))
            else:
                raise ValueError(f"unknown filter operator {op!r} on field {field!r}")
        if not parts:
            raise ValueError(f"empty condition on field {field!r}")
        return and_(*parts)
    if isinstance(cond, (list, tuple, set)):
        return in_(field, [_date(x) for x in cond])
    return eq(field, cond)


def from_dict(d: Mapping[str, Any]) -> Expr:
    """A Mongo / Chroma / Qdrant style filter dict as an :class:`Expr`.

    ``{"user": "ann"}`` is eq; ``{"n": {"$gte": 3, "$lt": 9}}`` and of both; ``{"$and": [...]}``,
    ``{"$or": [...]}``, ``{"$not": {...}}``; ``{"$date": unix ms}`` is a timestamp value;
    field operators ``$eq $ne $gt $gte $lt $lte $in
    $nin $exists $contains $not``. Several keys in one dict are and-ed.
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"a filter dict must be a mapping, got {type(d).__name__}")
    parts: List[Expr] = []
    for k, v in d.items():
        if k in ("$and", "$or"):
            if not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"{k} takes a non-empty list of filters")
            subs = [from_dict(x) for x in v]
            parts.append(and_(*subs) if k == "$and" else or_(*subs))
        elif k == "$not":
            parts.append(not_(from_dict(v)))
        elif k.startswith("$"):
            raise ValueError(f"unknown filter operator {k!r}")
        else:
            parts.append(_field_cond(k, v))
    if not parts:
        raise ValueError("an empty filter dict")
    return and_(*parts)


def as_bytes(f: Union[Expr, Mapping[str, Any], bytes, None]) -> Optional[bytes]:
    """A filter argument (Expr, dict or its binary form) as bytes; None for no filter."""
    if f is None:
        return None
    if isinstance(f, Expr):
        return f.encode()
    if isinstance(f, (bytes, bytearray, memoryview)):
        return bytes(f)
    return from_dict(f).encode()


def encode_item(b: bytearray, meta: Optional[Mapping[str, Any]]) -> None:
    items = [(k, v) for k, v in (meta or {}).items() if v is not None]
    b += struct.pack("<H", len(items))
    for k, v in items:
        _name(b, k)
        _value(b, v, True)


def encode_fields(metas: Sequence[Optional[Mapping[str, Any]]]) -> bytes:
    """One fields block (``kalos_upsert_params.fields``) for len(metas) memories."""
    b = bytearray([FIELDS_VERSION])
    b += struct.pack("<I", len(metas))
    for m in metas:
        encode_item(b, m)
    return bytes(b)


def decode_fields(buf: bytes) -> Dict[str, Any]:
    """One memory's fields (``count u16 | (name, value)*``) as a dict. Timestamps come back as
    UTC datetimes, tags as sorted lists."""
    out: Dict[str, Any] = {}
    (n,) = struct.unpack_from("<H", buf, 0)
    o = 2
    for _ in range(n):
        ln = buf[o]
        name = bytes(buf[o + 1:o + 1 + ln]).decode("utf-8")
        o += 1 + ln
        t = buf[o]
        o += 1
        if t == _T_KEYWORD:
            (sl,) = struct.unpack_from("<H", buf, o)
            v: Any = bytes(buf[o + 2:o + 2 + sl]).decode("utf-8")
            o += 2 + sl
        elif t == _T_TAGS:
            (c,) = struct.unpack_from("<H", buf, o)
            o += 2
            v = []
            for _ in range(c):
                (sl,) = struct.unpack_from("<H", buf, o)
                v.append(bytes(buf[o + 2:o + 2 + sl]).decode("utf-8"))
                o += 2 + sl
        elif t == _T_INT:
            (v,) = struct.unpack_from("<q", buf, o)
            o += 8
        elif t == _T_FLOAT:
            (v,) = struct.unpack_from("<d", buf, o)
            o += 8
        elif t == _T_BOOL:
            v = bool(buf[o])
            o += 1
        elif t == _T_TIMESTAMP:
            (ms,) = struct.unpack_from("<q", buf, o)
            v = _dt.datetime.fromtimestamp(ms / 1000.0, tz=_dt.timezone.utc)
            o += 8
        else:  # pragma: no cover - the library writes only the types above
            raise ValueError(f"unknown field type {t}")
        out[name] = v
    return out

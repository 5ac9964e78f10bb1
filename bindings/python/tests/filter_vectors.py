"""The cross-language filter vectors: tests/data/filter_vectors.jsonl.

Each line is ``{"name", "filter", "hex"}``: ``filter`` is the JSON form (Mongo / Chroma / Qdrant
style, docs/FORMATS.md) and ``hex`` the binary expression that the Python builders in
:data:`CASES` produce. The Go and Java tests build the same filters by name with their own
builders, kalosd's tests translate ``filter``, and all of them must produce ``hex`` exactly.

Regenerate (only when the format changes on purpose)::

    python3 bindings/python/tests/filter_vectors.py > tests/data/filter_vectors.jsonl
"""

import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kalos import filters as F  # noqa: E402

AT = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)

# name -> (builder expression, JSON form)
CASES = {
    "eq_keyword": (F.eq("user", "ann"), {"user": "ann"}),
    "eq_int": (F.eq("n", 42), {"n": {"$eq": 42}}),
    "eq_negative_int": (F.eq("n", -7), {"n": -7}),
    "eq_float": (F.eq("score", 0.5), {"score": 0.5}),
    "eq_bool": (F.eq("done", True), {"done": True}),
    "eq_timestamp": (F.eq("at", AT), {"at": {"$date": 1704164645000}}),
    "lt_timestamp_before_1970": (F.lt("at", dt.datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=dt.timezone.utc)),
                                 {"at": {"$lt": {"$date": -1}}}),
    "ne": (F.ne("user", "bob"), {"user": {"$ne": "bob"}}),
    "gt_float": (F.gt("score", 1.25), {"score": {"$gt": 1.25}}),
    "lte_int": (F.lte("n", -3), {"n": {"$lte": -3}}),
    "range": (F.gte("n", 3) & F.lt("n", 9), {"n": {"$gte": 3, "$lt": 9}}),
    "in": (F.in_("kind", ["fact", "pref"]), {"kind": {"$in": ["fact", "pref"]}}),
    "in_list_shorthand": (F.in_("n", [1, 2]), {"n": [1, 2]}),
    "nin": (F.nin("n", [1, 2, 3]), {"n": {"$nin": [1, 2, 3]}}),
    "in_empty": (F.in_("kind", []), {"kind": {"$in": []}}),
    "nin_empty": (F.nin("kind", []), {"kind": {"$nin": []}}),
    "exists": (F.exists("archived"), {"archived": {"$exists": True}}),
    "not_exists": (~F.exists("archived"), {"archived": {"$exists": False}}),
    "contains": (F.contains("tags", "urgent"), {"tags": {"$contains": "urgent"}}),
    "field_not": (~F.eq("user", "ann"), {"user": {"$not": {"$eq": "ann"}}}),
    "and_flat": (F.and_(F.eq("a", 1), F.eq("b", 2), F.eq("c", 3)),
                 {"$and": [{"a": 1}, {"$and": [{"b": 2}, {"c": 3}]}]}),
    "or": (F.or_(F.eq("user", "ann"), F.eq("agent", "x")), {"$or": [{"user": "ann"}, {"agent": "x"}]}),
    "nested": ((F.eq("user", "ann") | F.contains("tags", "urgent")) & ~F.exists("archived"),
               {"$and": [{"$or": [{"user": "ann"}, {"tags": {"$contains": "urgent"}}]},
                         {"$not": {"archived": {"$exists": True}}}]}),
    "unicode": (F.eq("名前", "ünï"), {"名前": "ünï"}),
}


def lines():
    for name, (expr, js) in CASES.items():
        yield json.dumps({"name": name, "filter": js, "hex": expr.encode().hex()}, ensure_ascii=False)


if __name__ == "__main__":
    for line in lines():
        print(line)

"""The shared filter vectors (tests/data/filter_vectors.jsonl) against the Python builders and
kalos.filters.from_dict. The Go, Java and kalosd tests check the same file."""

import json
import os

from kalos import filters as F

from filter_vectors import CASES

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "data",
                       "filter_vectors.jsonl")


def load():
    with open(VECTORS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_builders_match_the_vectors():
    rows = load()
    assert [r["name"] for r in rows] == list(CASES)
    for r in rows:
        assert CASES[r["name"]][0].encode().hex() == r["hex"], r["name"]


def test_json_form_matches_the_vectors():
    for r in load():
        if r["filter"] is not None:
            assert F.from_dict(r["filter"]).encode().hex() == r["hex"], r["name"]

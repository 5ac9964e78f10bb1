"""Shared fixtures: unique store names, an open server-role store, numpy reference top-k."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import kalos

REPO = Path(__file__).resolve().parents[3]
HEADER = REPO / "include" / "kalos.h"
_counter = itertools.count()


def unique_name(tag: str = "t") -> str:
    return f"pytest-{tag}-{os.getpid()}-{next(_counter)}"


@pytest.fixture
def name(request) -> str:
    return unique_name(request.node.name[:40].replace("[", "_").replace("]", "_"))


@pytest.fixture
def kv(name):
    with kalos.open(name, dim=16, role="server", timeout=5) as h:
        yield h


def kalosd_path() -> Path:
    lib = Path(kalos.library_path).resolve()
    for p in (lib.parent / "kalosd", REPO / "target" / "release" / "kalosd", REPO / "target" / "debug" / "kalosd"):
        if p.is_file():
            return p
    pytest.skip("kalosd binary not built (cargo build --release)")


def ref_topk(table: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int, metric: str = "cosine"):
    """Reference top-k in float64: (ids, scores), ties broken by lower id."""
    t = table.astype(np.float64)
    qq = q.astype(np.float64)
    if metric == "cosine":
        s = (t @ qq) / (np.linalg.norm(t, axis=1) * np.linalg.norm(qq))
        order = np.lexsort((ids, -s))
    elif metric == "ip":
        s = t @ qq
        order = np.lexsort((ids, -s))
    else:
        s = ((t - qq) ** 2).sum(axis=1)
        order = np.lexsort((ids, s))
    order = order[:k]
    return ids[order], s[order]


def child_env() -> dict:
    env = dict(os.environ)
    src = str(Path(kalos.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["KALOS_LIBRARY"] = str(Path(kalos.library_path).resolve())
    return env


PY = sys.executable


def pytest_report_header(config):
    return f"kalos {kalos.version()}: package {Path(kalos.__file__).parent}, library {kalos.library_path}"

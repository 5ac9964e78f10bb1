"""Shared fixtures: unique store names, an open server-role store, numpy reference top-k."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
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


def require(what: str, path, test: str, hint: str = "") -> str:
    """``path`` as a str; without it, skips ``test`` because ``what`` is missing, or fails it
    under CI (``CI`` set), which installs every tool the tests use (``hint`` says how)."""
    if path:
        return str(path)
    msg = f"{test}: {what} not found"
    if os.environ.get("CI"):
        pytest.fail(msg + (f" ({hint})" if hint else ""))
    pytest.skip(msg)


@pytest.fixture(scope="session")
def go_peer(tmp_path_factory):
    """The argv of bindings/go/testdata/clusterpeer, built here with ``go build`` against this
    library: the Go writer and reader of the cross-language tests."""
    go = require("go", shutil.which("go"), "cross-language test")
    out = tmp_path_factory.mktemp("gopeer")
    lib = Path(kalos.library_path).resolve()
    # The Go package takes its cgo flags from pkg-config: a kalos.pc for include/ and this library.
    pc = subprocess.run([str(REPO / "bindings/go/gen-pc.sh"), str(REPO / "include"), str(lib.parent)],
                        check=True, capture_output=True, text=True).stdout
    (out / "kalos.pc").write_text(pc)
    env = dict(os.environ, PKG_CONFIG_PATH=str(out), CGO_ENABLED="1", GOTOOLCHAIN="local")
    r = subprocess.run([go, "build", "-o", str(out / "clusterpeer"), "./testdata/clusterpeer"],
                       cwd=REPO / "bindings/go", env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"go build of the Go peer failed:\n{r.stdout}{r.stderr}"
    return [str(out / "clusterpeer")]


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

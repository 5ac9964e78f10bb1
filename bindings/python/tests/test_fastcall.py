"""The C fast path of Kalos.recall (kalos._fastcall): installed, and indistinguishable from the
ctypes fast path (kalos._FASTCALL = None, what runs without the extension) in results, errors,
threads and close."""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import kalos
from kalos import _fastpath, _ffi
from conftest import PY, child_env

FORCED_OFF = os.environ.get("KALOS_PY_FASTCALL") == "0"
needs_fastcall = pytest.mark.skipif(FORCED_OFF, reason="KALOS_PY_FASTCALL=0")


def test_extension_is_in_use():
    """The install under test has the extension and uses it: a build that silently fell back to
    the ctypes path (setup.py builds the extension as optional) fails here."""
    if FORCED_OFF:
        assert kalos._FASTCALL is None and _fastpath.disabled_reason == "KALOS_PY_FASTCALL=0"
        return
    assert kalos._FASTCALL is not None, _fastpath.disabled_reason
    from kalos import _fastcall

    assert _fastcall.__file__.endswith(".abi3.so"), _fastcall.__file__
    assert _fastpath.disabled_reason == ""


def test_env_switch_forces_the_ctypes_path(name, tmp_path):
    code = (
        "import sys, numpy as np, kalos\n"
        "assert kalos._FASTCALL is None, kalos._fastpath.disabled_reason\n"
        "print(kalos._fastpath.disabled_reason)\n"
        "with kalos.open(sys.argv[1], dim=4, role='server', backend='cpu') as kv:\n"
        "    kv.upsert([1, 2], np.eye(2, 4))\n"
        "    assert kv.recall(np.array([0, 1, 0, 0], np.float32), 1)[0].tolist() == [2]\n"
        "    assert not hasattr(kv._tls, 'fastcall') and hasattr(kv._tls, 'frame')\n"
    )
    env = dict(child_env(), KALOS_PY_FASTCALL="0")
    out = subprocess.run([PY, "-c", code, name], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "KALOS_PY_FASTCALL=0"


def test_package_without_the_extension_falls_back(name, tmp_path):
    """A package installed where the extension could not be compiled (setup.py builds it as
    optional) imports and recalls through ctypes, and says why."""
    src = Path(kalos.__file__).parent
    shutil.copytree(src, tmp_path / "kalos", ignore=shutil.ignore_patterns("_fastcall*", "__pycache__", "libkalos.so"))
    code = (
        "import sys, numpy as np, kalos\n"
        "assert kalos.__file__.startswith(sys.argv[2]), kalos.__file__\n"
        "assert kalos._FASTCALL is None\n"
        "print(kalos._fastpath.disabled_reason)\n"
        "with kalos.open(sys.argv[1], dim=4, role='server', backend='cpu') as kv:\n"
        "    kv.upsert([1, 2], np.eye(2, 4))\n"
        "    assert kv.recall(np.array([0, 1, 0, 0], np.float32), 1)[0].tolist() == [2]\n"
    )
    env = dict(child_env(), PYTHONPATH=str(tmp_path))
    env.pop("KALOS_PY_FASTCALL", None)
    out = subprocess.run([PY, "-c", code, name, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("kalos._fastcall is not installed"), out.stdout


def _ctypes_path(kv, *args, **kw):
    saved = kalos._FASTCALL
    kalos._FASTCALL = None
    try:
        return kv.recall(*args, **kw)
    finally:
        kalos._FASTCALL = saved


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:
        return ("raised", type(e), str(e))


def _same(a, b, messages=True, score_rtol=0):
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        (ia, sa), (ib, sb) = a[1], b[1]
        assert ia.dtype == ib.dtype == np.uint64 and sa.dtype == sb.dtype == np.float32
        np.testing.assert_array_equal(ia, ib)
        if score_rtol:
            # Recency-weighted scores move with the clock between the two calls: relative to
            # the score, or absolutely for a score near 0.
            np.testing.assert_allclose(sa, sb, rtol=score_rtol, atol=1e-5)
        else:
            np.testing.assert_array_equal(sa, sb)
    else:
        assert a[1] is b[1], (a, b)
        if messages:
            assert a[2] == b[2], (a, b)


@needs_fastcall
def test_results_equal_the_ctypes_path(name):
    rng = np.random.default_rng(29)
    d = 16
    with kalos.open(name, dim=d, role="server", backend="cpu") as kv:
        kv.upsert(np.arange(1, 1201), rng.standard_normal((1200, d)))
        ks = [1, 2, 3, 10, 64, 999, 1000, 1023, 1024] + rng.integers(1, 1025, 12).tolist()

        def compare(rounds):
            for i in range(rounds):
                q = rng.standard_normal(d).astype(np.float32)
                k = ks[i % len(ks)]
                fast = kv.recall(q, k)
                fc = kv._tls.fastcall
                direct = fc(kv, q, k)  # the C frame itself answers (no fall-back to the general path)
                assert type(direct) is tuple
                slow = _ctypes_path(kv, q, k)
                general = kv.recall(q.tolist(), k)
                for other in (direct, slow, general):
                    _same(("ok", fast), ("ok", other))
                assert len(fast[0]) == min(k, len(kv))
                for a in fast:
                    assert a.flags.owndata and a.flags.writeable and a.flags.c_contiguous

        compare(40)
        # after writes: new rows, deletions, overwritten vectors
        kv.upsert(np.arange(2000, 2300), rng.standard_normal((300, d)))
        kv.delete(np.arange(1, 400))
        kv.upsert(np.arange(500, 600), rng.standard_normal((100, d)))
        compare(40)
        kv.clear()
        q = rng.standard_normal(d).astype(np.float32)
        _same(("ok", kv.recall(q, 5)), ("ok", _ctypes_path(kv, q, 5)))
        assert kv.recall(q, 5)[0].shape == (0,)


@needs_fastcall
def test_writes_the_struct_fields_the_header_declares(name):
    """The frame stores the query's data pointer, its length and k at the offsets of the ctypes
    struct (which tests/test_header_drift.py checks against include/kalos.h)."""
    q = np.ones(8, np.float32)
    with kalos.open(name, dim=8, role="server", backend="cpu") as kv:
        kv.upsert([1, 2], np.eye(2, 8))
        assert kv.recall(q, 3)[0].tolist() in ([1, 2], [2, 1])
        fc = kv._tls.fastcall
        st = _ffi.kalos_recall_args.from_address(fc.args)
        assert (st.query, st.query_len, st.k, st.count) == (q.ctypes.data, 8, 3, 2)
        assert st.handle == kv._h and st.struct_size == ctypes.sizeof(_ffi.kalos_recall_args)
        q2 = np.ones(16, np.float32)[::2].copy()
        kv.recall(q2, 1)
        assert (st.query, st.query_len, st.k, st.count) == (q2.ctypes.data, 8, 1, 1)


class _Sub(np.ndarray):
    pass


BAD_K = [0, -1, 1025, 2**32, 2**64, 2**80, None, "3", 2.0, 2.5, np.int64(0), np.int64(5), np.uint32(7), True]


@needs_fastcall
def test_inputs_give_what_the_ctypes_path_gives(name):
    """Bad input raises the same exception (class and message) as the ctypes fast path; any
    query the C frame does not take (float64, strided, 2-D, lists, subclasses, byte-swapped)
    gives the same results through the general path."""
    rng = np.random.default_rng(4)
    d = 16
    with kalos.open(name, dim=d, role="server", backend="cpu") as kv:
        kv.upsert(np.arange(1, 301), rng.standard_normal((300, d)))
        q = rng.standard_normal(d).astype(np.float32)
        nan = q.copy()
        nan[3] = np.nan
        inf = q.copy()
        inf[0] = np.inf
        queries = [
            q,
            np.ones(8, np.float32),  # wrong dim
            np.ones(d + 1, np.float32),
            np.empty(0, np.float32),
            nan,
            inf,
            q.astype(np.float64),
            np.repeat(q, 2)[::2],  # strided
            q.reshape(1, d),
            np.tile(q, (2, 1)),  # 2 x dim: flattened, wrong dim
            np.asfortranarray(np.tile(q, (2, 1)).T)[:, 0],
            q.astype(">f4"),
            q.view(_Sub),
            q.tolist(),
            np.array(1.0, np.float32),  # 0-d
            "not a vector",
            None,
        ]
        for x in queries:
            _same(_outcome(lambda: kv.recall(x, 7)), _outcome(lambda: _ctypes_path(kv, x, 7)))
        for k in BAD_K:
            fast, slow = _outcome(lambda: kv.recall(q, k)), _outcome(lambda: _ctypes_path(kv, q, k))
            # A k that is not an integer: the ctypes path fails in its own comparison or ctypes
            # store ("'<' not supported ...", "int expected instead of float"), the C frame
            # leaves it to the general path ("k must be an int, got float"): both TypeError.
            _same(fast, slow, messages=isinstance(k, (int, np.integer)))
        assert kv._active == []


@needs_fastcall
def test_scoped_results_equal_the_general_path(name):
    """A recall scoped by one namespace, a list or tuple of them, a filter (bytes, Expr or dict)
    or both runs in the C frame (it answers directly, not through the general path) and returns
    what the general path returns; an unscoped call after a scoped one is unscoped again."""
    from kalos import filters as F

    rng = np.random.default_rng(31)
    d = 16
    n = 1500
    with kalos.open(name, dim=d, role="server", backend="cpu") as kv:
        nss = rng.integers(0, 5, n)
        for ns in range(5):
            sel = np.flatnonzero(nss == ns)
            kv.upsert(sel + 1, rng.standard_normal((len(sel), d)), namespace=ns,
                      metadata=[{"n": int(i % 100), "tag": "ab"[i % 2]} for i in sel])
        scopes = [
            (0, None),
            (3, None),
            (7, None),  # no memory in it
            (2**64 - 1, None),
            (None, F.lt("n", 30).encode()),
            (None, F.lt("n", 30)),
            (None, {"tag": "a", "n": {"$gte": 50}}),
            (None, F.eq("n", 1000).encode()),  # matches nothing
            (1, F.eq("tag", "b")),
            (4, {"n": {"$in": [1, 2, 3, 4, 5, 6, 7, 8, 9]}}),
            ([0, 2], None),
            ((4, 1, 7), None),
            ([3], F.lt("n", 50)),
            (list(range(64)), None),
            ([2**64 - 1, 0, 0], {"tag": "b"}),
        ]
        recency = [(0.0, None), (0.3, 600.0), (1, 3600), (0.9, 86400)]
        timeouts = [None, 5.0, 2, 0]
        fc = None
        for i in range(60):
            ns, flt = scopes[i % len(scopes)]
            q = rng.standard_normal(d).astype(np.float32)
            k = [1, 5, 10, 64, 1024][i % 5]
            kw = {"namespaces" if isinstance(ns, (list, tuple)) else "namespace": ns}
            w, hl = recency[i % len(recency)]
            if w:
                kw.update(recency_weight=w, half_life=hl)
            to = timeouts[i % len(timeouts)]
            if to is not None:
                kw.update(timeout=to)
            fast = kv.recall(q, k, filter=flt, **kw)
            fc = kv._tls.fastcall
            fb = None if flt is None else kalos._filter_bytes(flt)
            direct = fc(kv, q, k, ns, fb, w, hl, to)
            assert type(direct) is tuple, (ns, flt)
            general = _ctypes_path(kv, q, k, filter=flt, **kw)
            for other in (direct, general):
                # With recency the score moves with the clock between calls (hours of half-life:
                # by under 1e-6 here).
                _same(("ok", fast), ("ok", other), score_rtol=1e-4 if w else 0)
            plain = kv.recall(q, k)
            _same(("ok", plain), ("ok", _ctypes_path(kv, q, k)))
            assert len(plain[0]) == min(k, n)


def _same_with_payloads(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        _same(("ok", a[1][:2]), ("ok", b[1][:2]))
        assert type(a[1][2]) is list and a[1][2] == b[1][2]
        assert all(p is None or type(p) is bytes for p in a[1][2])
    else:
        assert a[1] is b[1] and a[2] == b[2], (a, b)


@needs_fastcall
def test_payload_recalls_equal_the_general_path(name):
    """recall(..., payloads=True) runs in the C frame (Frame.payloads answers directly) for the
    scopes a plain recall takes there, and returns what the general path returns: hits without
    a payload, empty ones, and answers larger than the frame's first 64 KiB buffer (which
    grows); errors, and inputs the frame leaves to the general path, give the same outcome."""
    from kalos import filters as F

    rng = np.random.default_rng(43)
    d, n = 8, 600
    sizes = [None, 0, 1, 100, 5000, 12_000]  # bytes (None: no payload)
    pl = [None if sizes[i % 6] is None else rng.integers(0, 256, sizes[i % 6], dtype=np.uint8).tobytes() for i in range(n)]
    with kalos.open(name, dim=d, role="server", backend="cpu") as kv:
        kv.upsert(np.arange(1, n + 1), rng.standard_normal((n, d)), namespaces=np.arange(n) % 3, payloads=pl,
                  metadata=[{"n": i % 100} for i in range(n)])
        scopes = [{}, {"namespace": 1}, {"namespaces": [0, 2]}, {"namespaces": (2,)}, {"filter": F.lt("n", 40)},
                  {"filter": {"n": {"$gte": 90}}, "namespace": 0}, {"filter": F.eq("n", 1000).encode()},
                  {"recency_weight": 0.3, "half_life": 600.0}, {"timeout": 5.0}]
        for i in range(40):
            q = rng.standard_normal(d).astype(np.float32)
            k = [1, 3, 10, 40, 60][i % 5]
            kw = scopes[i % len(scopes)]
            fast = kv.recall(q, k, payloads=True, **kw)
            fc = kv._tls.fastcall
            ns = kw.get("namespaces", kw.get("namespace"))
            flt = kw.get("filter")
            direct = fc.payloads(kv, q, k, ns, None if flt is None else kalos._filter_bytes(flt),
                                 kw.get("recency_weight", 0.0), kw.get("half_life"), kw.get("timeout"))
            assert type(direct) is tuple and len(direct) == 3, kw
            general = _ctypes_path(kv, q, k, payloads=True, **kw)
            rtol = 1e-4 if "recency_weight" in kw else 0
            for other in (direct, general):
                _same(("ok", fast[:2]), ("ok", other[:2]), score_rtol=rtol)
                assert fast[2] == other[2]
            assert fast[2] == [pl[int(i) - 1] for i in fast[0]]
        # 100 hits of 12 KB: over the response slot's 1 MiB, the same TooLargeError on both paths
        _same_with_payloads(_outcome(lambda: kv.recall(q, 1024, payloads=True)),
                            _outcome(lambda: _ctypes_path(kv, q, 1024, payloads=True)))
        for args, kw in [((np.ones(4, np.float32), 5), {}), ((q, 0), {}), ((q, 1025), {}), ((q, 5), {"namespace": -1}),
                         ((q, 5), {"namespaces": np.array([1], np.uint64)}), ((q, 5), {"filter": b"\x01"}),
                         ((q.astype(np.float64), 5), {}), ((q, 5), {"timeout": -1}), ((q, 5), {"allow_stale": True}),
                         ((np.full(d, np.nan, np.float32), 5), {})]:
            _same_with_payloads(_outcome(lambda: kv.recall(*args, payloads=True, **kw)),
                                _outcome(lambda: _ctypes_path(kv, *args, payloads=True, **kw)))
        assert kv._active == [] and not fc.busy
    with pytest.raises(kalos.ClosedError, match="CLOSED"):
        kv.recall(q, 5, payloads=True)
    assert kv._active == []


BAD_NAMESPACES = [-1, 2**64, 2**80, np.uint64(3), np.int64(2), True, 3.0, "3"]
# namespaces= values the C frame leaves to the general path (which converts or rejects them)
OTHER_NAMESPACE_LISTS = [[], list(range(65)), [1, -1], [3, 2**64], [np.uint64(3)], (True,), [3.0], np.array([3], np.uint64),
                         {3}, range(2, 4), "3", 3, [[3]]]
BAD_FILTERS = [b"", b"\x01", b"\x01\x02\x03", bytearray(b"\x01"), 5, {"$and": 3}, {"n": {"$frob": 1}}, [1]]


# timeouts, valid and not, that the frame takes or leaves to the general path
# (deadlines of a second or more: a recall under load must not time out here)
TIMEOUTS = [None, 0, 0.0, 1, 2.5, 1.0005, 2.0015, 3.0025, -0.0, -1, float("nan"), float("inf"), 1e300, 2**70,
            9007199254740.991, True, np.float64(1.0), "1", [1]]
# recency_weight / half_life pairs, valid and not, that the frame takes or leaves to the general path
BAD_RECENCY = [(np.float32(0.5), 60.0), (True, 60.0), ("0.3", 60), (0.3, "x"), (0.3, np.float64(60)), (float("nan"), 60.0),
               (-0.5, 60.0), (2.0, 60.0), (0.3, -1.0), (0.3, 0), (0.3, None), (0, "garbage"), (0.0, object()),
               (10**400, 60.0), (0.3, 10**400), (float("inf"), 1.0), (1e300, 1.0), (0.5, 1e-300), (-0.0, None), (1, 2**70)]


@needs_fastcall
def test_scope_inputs_give_what_the_general_path_gives(name):
    """Namespaces and filters the C frame does not take (out of range, numpy integers, bools,
    bytearrays, malformed expressions) give the same result or exception, class and message,
    as the general path."""
    from kalos import filters as F

    rng = np.random.default_rng(5)
    d = 8
    with kalos.open(name, dim=d, role="server", backend="cpu") as kv:
        kv.upsert(np.arange(1, 101), rng.standard_normal((100, d)), namespace=3,
                  metadata=[{"n": i} for i in range(100)])
        q = rng.standard_normal(d).astype(np.float32)
        for ns in BAD_NAMESPACES:
            _same(_outcome(lambda: kv.recall(q, 5, namespace=ns)), _outcome(lambda: _ctypes_path(kv, q, 5, namespace=ns)))
        for nss in OTHER_NAMESPACE_LISTS:
            _same(_outcome(lambda: kv.recall(q, 5, namespaces=nss)),
                  _outcome(lambda: _ctypes_path(kv, q, 5, namespaces=nss)))
        it = iter([3, 4])  # consumed once, by the general path
        assert kv.recall(q, 5, namespaces=it)[0].tolist() == _ctypes_path(kv, q, 5, namespaces=[3, 4])[0].tolist()
        _same(_outcome(lambda: kv.recall(q, 5, namespace=1, namespaces=[3])),
              _outcome(lambda: _ctypes_path(kv, q, 5, namespace=1, namespaces=[3])))
        for f in BAD_FILTERS + [bytearray(F.lt("n", 10).encode()), memoryview(F.lt("n", 10).encode())]:
            _same(_outcome(lambda: kv.recall(q, 5, filter=f)), _outcome(lambda: _ctypes_path(kv, q, 5, filter=f)))
            _same(_outcome(lambda: kv.recall(q, 5, namespace=3, filter=f)),
                  _outcome(lambda: _ctypes_path(kv, q, 5, namespace=3, filter=f)))
        _same(_outcome(lambda: kv.recall(np.ones(4, np.float32), 5, namespace=3)),
              _outcome(lambda: _ctypes_path(kv, np.ones(4, np.float32), 5, namespace=3)))
        _same(_outcome(lambda: kv.recall(q, 0, filter=F.lt("n", 10))),
              _outcome(lambda: _ctypes_path(kv, q, 0, filter=F.lt("n", 10))))
        for to in TIMEOUTS:
            for kw in ({}, {"namespace": 3}):
                _same(_outcome(lambda: kv.recall(q, 5, timeout=to, **kw)),
                      _outcome(lambda: _ctypes_path(kv, q, 5, timeout=to, **kw)))
        for w, hl in BAD_RECENCY:
            for kw in ({}, {"namespace": 3}):
                _same(_outcome(lambda: kv.recall(q, 5, recency_weight=w, half_life=hl, **kw)),
                      _outcome(lambda: _ctypes_path(kv, q, 5, recency_weight=w, half_life=hl, **kw)), score_rtol=1e-4)
        assert kv._active == []


@needs_fastcall
def test_scoped_call_writes_the_params_the_header_declares(name):
    """A scoped call points the args struct's params at the frame's kalos_recall_params, with
    the namespace and the filter's bytes; an unscoped call sets params back to NULL."""
    from kalos import filters as F

    q = np.ones(8, np.float32)
    fb = F.lt("n", 1).encode()
    with kalos.open(name, dim=8, role="server", backend="cpu") as kv:
        kv.upsert([1, 2], np.eye(2, 8), namespace=6, metadata=[{"n": 0}, {"n": 5}])
        assert kv.recall(q, 3, namespace=6, filter=fb)[0].tolist() == [1]
        fc = kv._tls.fastcall
        st = _ffi.kalos_recall_args.from_address(fc.args)
        p = _ffi.kalos_recall_params.from_address(st.params)
        assert p.struct_size == ctypes.sizeof(_ffi.kalos_recall_params)
        assert (p.namespaces_len, p.namespaces[0], p.filter_len) == (1, 6, len(fb))
        assert bytes(p.filter[: len(fb)]) == fb
        assert (p.recency_weight, p.timeout_ms, p.consistency, p.min_seqs_len) == (0, 0, 0, 0)
        assert kv.recall(q, 3, filter=fb)[0].tolist() == [1]
        assert st.params and not p.namespaces and (p.namespaces_len, p.filter_len) == (0, len(fb))
        assert kv.recall(q, 3, namespace=6)[0].tolist() in ([1, 2], [2, 1])
        assert st.params and (p.namespaces_len, p.namespaces[0], p.filter_len) == (1, 6, 0) and not p.filter
        assert kv.recall(q, 3, namespace=5)[0].tolist() == []
        assert kv.recall(q, 3, namespaces=(9, 6, 5), filter=fb)[0].tolist() == [1]
        assert (p.namespaces_len, p.namespaces[0], p.namespaces[1], p.namespaces[2]) == (3, 9, 6, 5)
        assert (p.recency_weight, p.recency_half_life_ms) == (0, 0)
        assert len(kv.recall(q, 3, recency_weight=0.25, half_life=1.5)[0]) == 2
        assert st.params and not p.namespaces and not p.filter
        assert (p.recency_weight, p.recency_half_life_ms) == (0.25, 1500.0)
        kv.recall(q, 3, namespace=6)
        assert (p.recency_weight, p.recency_half_life_ms, p.timeout_ms) == (0, 0, 0)
        # Sub-millisecond and rounding cases on a query the library refuses before sending
        # anything (the frame has written the struct by then), so no deadline can pass.
        wrong = np.ones(4, np.float32)
        for t, ms in ((2.5, 2500), (0.0025, 2), (0.0035, 4), (0.0005, 1), (1e-9, 1), (1.0005, 1000), (0, 0)):
            with pytest.raises(kalos.DimensionMismatchError):
                kv.recall(wrong, 3, namespace=6, timeout=t)
            assert st.params and p.timeout_ms == ms == kalos._ms(t, "timeout"), t
        kv.recall(q, 3, timeout=0.5)
        assert st.params and not p.namespaces and p.timeout_ms == 500
        assert kv.recall(q, 3)[0].tolist() in ([1, 2], [2, 1])
        assert st.params is None


@needs_fastcall
def test_busy_frame_takes_the_general_path(kv):
    """A recall re-entered on the same thread while the frame is in use (a finalizer or signal
    handler during the copy-out) gets None from the frame and answers through the general path,
    leaving the frame's buffers alone."""
    kv.upsert([1, 2], np.eye(2, 16, dtype=np.float32))
    q1, q2 = np.eye(2, 16, dtype=np.float32)
    ids1, sc1 = kv.recall(q1, k=1)
    fc = kv._tls.fastcall
    fc.busy = True
    try:
        assert fc(kv, q2, 1) is None
        assert kv.recall(q2, k=1)[0].tolist() == [2]
        st = _ffi.kalos_recall_args.from_address(fc.args)
        assert st.query == q1.ctypes.data  # not written by the re-entered call
    finally:
        fc.busy = False
    assert kv.recall(q1, k=1)[0].tolist() == [1] and ids1.tolist() == [1]


@needs_fastcall
def test_threads_share_a_handle(name):
    rng = np.random.default_rng(8)
    d = 32
    qs = rng.standard_normal((64, d)).astype(np.float32)
    errors, frames = [], []
    with kalos.open(name, dim=d, role="server", backend="cpu") as kv:
        kv.upsert(np.arange(1000), rng.standard_normal((1000, d)))
        want = [_ctypes_path(kv, q, 1 + i % 20) for i, q in enumerate(qs)]

        def reader(t):
            try:
                for i in range(400):
                    j = (t * 5 + i) % len(qs)
                    ids, sc = kv.recall(qs[j], 1 + j % 20)
                    if ids.tolist() != want[j][0].tolist() or not np.array_equal(sc, want[j][1]):
                        errors.append((t, j))
                frames.append(kv._tls.fastcall)
            except Exception as e:  # pragma: no cover
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[:3]
        assert len({id(f) for f in frames}) == 8  # one frame per thread
        assert kv._active == []


@needs_fastcall
def test_blocked_recall_holds_off_close(name):
    """A fast-path recall blocked on a stopped server counts as a call in flight (close() waits
    for it) and times out with KalosTimeoutError; then close() proceeds and later recalls raise
    ClosedError. (test_concurrency.py checks that other threads run meanwhile.)"""
    from test_errors import _serve

    p = _serve(name)
    try:
        kv = kalos.open(name, role="client", heartbeat_timeout=30, timeout=1.5)
        q = np.ones(4, np.float32)
        kv.upsert([1], q)
        assert kv.recall(q, 1)[0].tolist() == [1]
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.1)
        result = []

        def blocked():
            try:
                kv.recall(q, 1)
            except Exception as e:
                result.append(e)

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.3)
        assert t.is_alive() and len(kv._active) == 1, result
        with pytest.raises(kalos.KalosTimeoutError, match="in flight"):
            kv.close(timeout=0.1)
        assert kv.closed
        with pytest.raises(kalos.ClosedError):
            kv.recall(q, 1)  # refused at once while the other call is still in flight
        t.join(5)
        assert len(result) == 1 and type(result[0]) is kalos.KalosTimeoutError, result
        kv.close()
        with pytest.raises(kalos.ClosedError, match="closed"):
            kv.recall(q, 1)
        assert kv._active == []
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.wait(10)


@needs_fastcall
def test_closed_handle_raises_closed_error(name):
    kv = kalos.open(name, dim=4, role="server", backend="cpu")
    kv.upsert([1], np.ones(4))
    q = np.ones(4, np.float32)
    assert kv.recall(q, 1)[0].tolist() == [1]  # this thread's frame exists
    kv.close()
    for _ in range(3):
        with pytest.raises(kalos.ClosedError, match="CLOSED: the Kalos handle is closed"):
            kv.recall(q, 1)
    assert kv._active == []

    def other_thread():  # no frame yet on this thread
        try:
            kv.recall(q, 1)
        except kalos.ClosedError as e:
            errs.append(e)

    errs = []
    t = threading.Thread(target=other_thread)
    t.start()
    t.join(10)
    assert len(errs) == 1


@needs_fastcall
def test_forked_child_gets_the_fork_error(name):
    kv = kalos.open(name, dim=4, role="server", backend="cpu")
    kv.upsert([1], np.ones(4))
    q = np.ones(4, np.float32)
    assert kv.recall(q, 1)[0].tolist() == [1]  # the parent thread's frame exists before fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                kv.recall(q, 1)
            except kalos.ClosedError as e:
                code = 0 if "fork" in str(e) and kv._active == [] else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00"
    assert kv.recall(q, 1)[0].tolist() == [1]
    kv.close()


@needs_fastcall
def test_no_reference_leaks(kv):
    kv.upsert([1, 2, 3], np.eye(3, 16))
    q = np.ones(16, np.float32)
    for _ in range(100):
        kv.recall(q, 2)
    fc = kv._tls.fastcall
    gc.collect()
    kv.recall(q, 2, namespace=0, filter=kalos.filters.lt("n", 3).encode())
    gc.collect()
    before = (sys.getrefcount(q), sys.getrefcount(kv), sys.getrefcount(fc), sys.getrefcount(kv._active))
    for k in (1, 2, 3, 5, 2, 1024):
        for _ in range(300):
            ids, sc = kv.recall(q, k)
            del ids, sc
    for _ in range(300):  # the error path
        with pytest.raises(kalos.DimensionMismatchError):
            kv.recall(np.ones(4, np.float32), 2)
    fb = kalos.filters.lt("n", 3).encode()
    rf = sys.getrefcount(fb)
    for _ in range(300):  # scoped calls
        ids, sc = kv.recall(q, 2, namespace=0, filter=fb)
        del ids, sc
    assert sys.getrefcount(fb) == rf
    for _ in range(300):  # payload calls
        ids, sc, pls = kv.recall(q, 3, namespace=0, filter=fb, payloads=True)
        del ids, sc, pls
    assert sys.getrefcount(fb) == rf
    gc.collect()
    after = (sys.getrefcount(q), sys.getrefcount(kv), sys.getrefcount(fc), sys.getrefcount(kv._active))
    assert before == after
    ids, sc = kv.recall(q, 2)
    assert sys.getrefcount(ids) == sys.getrefcount(sc) == 2  # the caller's reference only


def test_unaligned_arrays_are_copied_not_passed(name):
    """A float32 query or uint64 ids at an odd offset into a byte buffer (np.frombuffer with an
    offset) are copied to aligned memory before the library sees them: the library refuses
    misaligned buffers (INVALID_ARGUMENT), so reaching it unaligned would fail the call."""
    rng = np.random.default_rng()
    x = rng.standard_normal((50, 8)).astype(np.float32)
    raw = bytearray(1 + x.nbytes)
    raw[1:] = x.tobytes()
    xu = np.frombuffer(raw, np.float32, offset=1).reshape(50, 8)
    ids = np.arange(1, 51, dtype=np.uint64)
    rawi = bytearray(3 + ids.nbytes)
    rawi[3:] = ids.tobytes()
    idsu = np.frombuffer(rawi, np.uint64, offset=3)
    assert not xu.flags.aligned and not idsu.flags.aligned
    with kalos.open(name, dim=8, metric="ip", role="server", backend="cpu") as kv:
        kv.upsert(idsu, xu)
        for i in (0, 17, 49):
            q = x[i]
            rq = bytearray(1 + q.nbytes)
            rq[1:] = q.tobytes()
            qu = np.frombuffer(rq, np.float32, offset=1)
            assert not qu.flags.aligned
            want = kv.recall(q, 5)
            for path in (kalos._FASTCALL, None):
                saved, kalos._FASTCALL = kalos._FASTCALL, path
                try:
                    got = kv.recall(qu, 5)
                    gotb = kv.recall_batch(np.frombuffer(rq, np.float32, offset=1)[None, :], 5)
                finally:
                    kalos._FASTCALL = saved
                assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
                assert gotb[0][0].tolist() == want[0].tolist()

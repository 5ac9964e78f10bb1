"""Loads ``kalos._fastcall``, the C extension that runs the recall fast path of
:meth:`kalos.Kalos.recall`, and checks that it reads this process's numpy arrays correctly.

:func:`load` returns a function that wraps a ``kalos._Frame`` (the thread's
``kalos_recall_args`` struct and result buffers) in a ``kalos._fastcall.Frame``, or None; then
:meth:`kalos.Kalos.recall` takes its ctypes fast path, which gives the same results and errors
about 0.6 µs slower per call. :data:`disabled_reason` says why it is None:

* ``KALOS_PY_FASTCALL=0`` in the environment;
* the extension is not installed (a source install where it could not be compiled: setup.py
  builds it as optional);
* the ``kalos_recall_args`` fields it writes or reads do not have the types it uses for them;
* it reads an ndarray's header differently from numpy's own attributes (a numpy whose array
  layout differs from the one ``_fastcall.c`` mirrors).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from typing import Any, Callable, Optional

import numpy as np

from . import _ffi

#: Why :func:`load` returned None ("" when it did not).
disabled_reason = ""

# The fields a Frame call writes or reads, with the C types _fastcall.c uses for them: of the
# args struct, and of the params struct (its scalars, and the two pointers: any ctypes pointer
# type).
_FIELDS = {
    "handle": ctypes.c_void_p,
    "query": ctypes.c_void_p,
    "query_len": ctypes.c_size_t,
    "k": ctypes.c_uint32,
    "params": ctypes.c_void_p,
    "count": ctypes.c_size_t,
}
_PARAMS_FIELDS = {
    "namespaces_len": ctypes.c_size_t,
    "filter_len": ctypes.c_size_t,
    "recency_weight": ctypes.c_float,
    "recency_half_life_ms": ctypes.c_double,
    "timeout_ms": ctypes.c_uint64,
}
_PARAMS_POINTERS = ("namespaces", "filter")


def _probes_agree(probe: Callable[..., Any]) -> bool:
    f32 = np.dtype(np.float32)
    m = np.zeros((4, 5), np.float32)
    arrays = [
        np.empty(3, np.float32),
        np.arange(10, dtype=np.float32)[3:],
        m[1],
        m[:, 1],  # strided
        m,
        np.empty(0, np.float32),
        np.array(1.5, np.float32),  # 0-d
        np.zeros(3, np.float64),
        np.zeros(3, ">f4"),  # byte-swapped float32
        np.asfortranarray(m),
    ]
    for a in arrays:
        got = probe(a, np.ndarray, f32)
        want = (a.ctypes.data, a.ndim, a.shape[0] if a.ndim else -1, a.flags.c_contiguous, a.dtype is f32)
        if got != want:
            return False
    return probe(np.float32(1.0), np.ndarray, f32) is None and probe([1.0], np.ndarray, f32) is None


def load() -> Optional[Callable[[Any], Any]]:
    """A function ``_Frame -> _fastcall.Frame``, or None (see :data:`disabled_reason`)."""
    global disabled_reason
    if os.environ.get("KALOS_PY_FASTCALL", "1") == "0":
        disabled_reason = "KALOS_PY_FASTCALL=0"
        return None
    if importlib.util.find_spec(__package__ + "._fastcall") is None:
        disabled_reason = "kalos._fastcall is not installed (no C compiler or Python.h when the package was built)"
        return None
    try:
        from . import _fastcall
    except ImportError as e:
        disabled_reason = f"kalos._fastcall does not load: {e}"
        return None
    A = _ffi.kalos_recall_args
    types = dict(A._fields_)
    P = _ffi.kalos_recall_params
    ptypes = dict(P._fields_)
    pointer = type(ctypes.POINTER(ctypes.c_uint8))
    if (
        any(types.get(n) is not t for n, t in _FIELDS.items())
        or any(ptypes.get(n) is not t for n, t in _PARAMS_FIELDS.items())
        or any(type(ptypes.get(n)) is not pointer for n in _PARAMS_POINTERS)
    ):
        disabled_reason = "kalos_recall_args or kalos_recall_params field types differ from those _fastcall.c writes"
        return None
    try:
        agree = _probes_agree(_fastcall.probe)
    except Exception as e:  # pragma: no cover
        agree = False
        disabled_reason = f"probe failed: {e!r}"
    if not agree:
        disabled_reason = disabled_reason or "numpy's array layout differs from the one _fastcall.c reads"
        return None

    fn = ctypes.cast(_ffi.lib_raw.kalos_recall_with, ctypes.c_void_p).value
    payloads_fn = ctypes.cast(_ffi.lib_raw.kalos_recall_payloads, ctypes.c_void_p).value
    too_small = _ffi.STATUS_CODES["BUFFER_TOO_SMALL"]
    offsets = (A.query.offset, A.query_len.offset, A.k.offset, A.count.offset)
    scope_offsets = (
        P.namespaces.offset, P.namespaces_len.offset, P.filter.offset, P.filter_len.offset,
        P.recency_weight.offset, P.recency_half_life_ms.offset, P.timeout_ms.offset,
    )
    f32 = np.dtype(np.float32)
    new = _fastcall.Frame
    cap = _ffi.KALOS_MAX_K

    empty = np.empty

    def wrap(frame: Any) -> Any:
        ids, scores = frame.ids, frame.scores
        assert ids.dtype == np.uint64 and scores.dtype == np.float32 and ids.shape == scores.shape == (cap,)
        assert ids.flags.c_contiguous and scores.flags.c_contiguous
        ns = frame.ns
        assert ns.dtype == np.uint64 and ns.ndim == 1 and ns.flags.c_contiguous
        return new(
            frame, ctypes.addressof(frame.a), fn, *offsets, ids, scores, cap, np.ndarray, f32, empty,
            A.params.offset, ctypes.addressof(frame.p), ns.ctypes.data, ns.shape[0], *scope_offsets,
            payloads_fn, A.handle.offset, too_small,
        )

    return wrap

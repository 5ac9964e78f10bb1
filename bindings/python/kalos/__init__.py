"""Kalos: a memory-recall sidecar for LLM applications (Python binding).

Quick start (the embedded default: with no server running, the first ``open`` becomes it)::

    import numpy as np, kalos

    with kalos.open("chat", dim=384) as kv:
        kv.upsert([1, 2], np.random.rand(2, 384), namespace=7, payloads=[b"a", "b"])
        ids, scores = kv.recall(np.random.rand(384), k=2, namespace=7)
        ids, scores, payloads = kv.recall(q, k=2, payloads=True)

Arrays: C-contiguous ``float32`` vectors (and ``uint64`` ids) are passed to the library by
pointer with no copy. Anything else (float64, lists, strided views, Fortran order) is converted
**once** per call with ``np.ascontiguousarray(x, dtype=np.float32)``.

Units: the Python API takes seconds (``ttl``, ``expires_at`` as unix seconds, ``timeout``,
``half_life``), like :mod:`time` and :mod:`threading`; they become milliseconds for the C API.

Threads: a :class:`Kalos` object may be used from many threads at once; every call releases the
GIL while it waits for the server. :meth:`Kalos.close` waits for calls in flight on other
threads and then frees the handle; any later call raises :class:`ClosedError`.

Errors: every failing C status raises its own :class:`KalosError` subclass (see
:mod:`kalos.errors`), with the library's message.
"""

from __future__ import annotations

import ctypes
import operator
import os
import sys
import threading
import time
import weakref
from ctypes import addressof, byref, c_size_t, c_uint32, c_uint64, c_void_p
from typing import (
    Any, Dict, Iterable, Iterator, List, Literal, Mapping, NamedTuple, Optional, Sequence, Tuple, Union, overload,
)

import numpy as np

from . import _fastpath, _ffi
from . import filters as _filters
from ._version import __version__
from ._ffi import (
    KALOS_MAX_FILTER_NAMESPACES,
    KALOS_MAX_K,
    KALOS_NO_PAYLOAD,
    STATUS_CODES,
    library_path,
)
from .errors import *  # noqa: F401,F403  (every KalosError subclass)
from .errors import ERRORS_BY_STATUS, ClosedError, InvalidArgumentError, KalosError, KOutOfRangeError, error_for

# `open` is deliberately absent: `from kalos import *` must not shadow the builtin. Use
# `kalos.open(...)`.
__all__ = [
    "__version__",
    "Kalos",
    "Lag",
    "Records",
    "KalosError",
    "ERRORS_BY_STATUS",
    "NO_ID",
    "MAX_K",
    "MAX_FILTER_NAMESPACES",
    "version",
    "library_path",
    "status_name",
] + [c.__name__ for c in ERRORS_BY_STATUS.values()]

_lib = _ffi.lib
_recall = _lib.kalos_recall
#: Wraps a _Frame for the C fast path of Kalos.recall (kalos._fastcall), or None: the ctypes
#: fast path (kalos._fastpath says when and why).
_FASTCALL = _fastpath.load()
_recall_with_raw = _ffi.lib_raw.kalos_recall_with
_last_error = _lib.kalos_last_error

MAX_K: int = KALOS_MAX_K
MAX_FILTER_NAMESPACES: int = KALOS_MAX_FILTER_NAMESPACES
#: Id used to pad rows of :meth:`Kalos.recall_batch` that have fewer than k hits.
NO_ID: int = 2**64 - 1

_F32 = np.dtype(np.float32)
_U64 = np.dtype(np.uint64)
_U32 = np.dtype(np.uint32)
_NDARRAY = np.ndarray

_ROLES = {"auto": _ffi.KALOS_ROLE_AUTO, "server": _ffi.KALOS_ROLE_SERVER, "client": _ffi.KALOS_ROLE_CLIENT}
_METRICS = {"ip": _ffi.KALOS_METRIC_IP, "cosine": _ffi.KALOS_METRIC_COSINE, "l2": _ffi.KALOS_METRIC_L2}
_DTYPES = {"f32": _ffi.KALOS_DTYPE_F32, "f16": _ffi.KALOS_DTYPE_F16, "bf16": _ffi.KALOS_DTYPE_BF16}
_BACKENDS = {"auto": _ffi.KALOS_BACKEND_AUTO, "cpu": _ffi.KALOS_BACKEND_CPU, "cuda": _ffi.KALOS_BACKEND_CUDA}
_SYNCS = {"always": _ffi.KALOS_SYNC_ALWAYS, "interval": _ffi.KALOS_SYNC_INTERVAL, "never": _ffi.KALOS_SYNC_NEVER}
_METRIC_NAMES = {v: k for k, v in _METRICS.items()}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_SCANS = {"exact": _ffi.KALOS_SCAN_EXACT, "int8": _ffi.KALOS_SCAN_INT8}
_PLACEMENTS = {"id": _ffi.KALOS_PLACEMENT_ID, "namespace": _ffi.KALOS_PLACEMENT_NAMESPACE}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}

ArrayLike = Any  # numpy.typing.ArrayLike without importing numpy.typing at run time
Payload = Union[bytes, bytearray, memoryview, str, None]


# --- fast data-pointer access --------------------------------------------------------------
#
# `ndarray.ctypes.data` builds a helper object per call (about 1 µs, more on a busy machine),
# which alone would eat a third of the 3 µs overhead budget. numpy's PyArrayObject starts with
# PyObject_HEAD followed by `char *data`, so the data pointer sits right after the object
# header. The offset is verified at import on several arrays; if it does not hold (a
# free-threaded or otherwise different build) the slow, always-correct path is used.

_from_address = c_void_p.from_address
_DATA_OFFSET = 2 * ctypes.sizeof(c_void_p)


def _verify_data_offset() -> bool:
    try:
        probes = [np.empty(3, _F32), np.arange(10, dtype=_U64)[3:], np.zeros((4, 5), _F32)[1]]
        return all(_from_address(id(a) + _DATA_OFFSET).value == a.ctypes.data for a in probes)
    except Exception:  # pragma: no cover
        return False


if _verify_data_offset():
    #: The recall fast path reads the query pointer as ``_from_address(id(query) +
    #: _DATA_OFFSET).value``, a c_void_p laid over the header field; it is taken for
    #: 0 < k <= this (0 when the offset does not hold: every recall then takes the general path).
    _FAST_MAX_K = KALOS_MAX_K

    def _addr(a: np.ndarray) -> int:
        return _from_address(id(a) + _DATA_OFFSET).value or 0

else:  # pragma: no cover
    _FAST_MAX_K = 0

    def _addr(a: np.ndarray) -> int:
        return a.ctypes.data


def _f32_1d(x: ArrayLike) -> np.ndarray:
    """A C-contiguous, aligned float32 1-D view of x: no copy when it already is one (the
    library reads float arrays at 4-byte alignment; an offset buffer is copied)."""
    if type(x) is _NDARRAY and x.dtype is _F32 and x.ndim == 1 and x.flags.c_contiguous and x.flags.aligned:
        return x
    return np.require(np.asarray(x, dtype=_F32), requirements="CA").reshape(-1)


def _f32_c(x: ArrayLike) -> np.ndarray:
    if type(x) is _NDARRAY and x.dtype is _F32 and x.flags.c_contiguous and x.flags.aligned:
        return x
    return np.require(np.asarray(x, dtype=_F32), requirements="CA")


def _u64_1d(x: ArrayLike) -> np.ndarray:
    if type(x) is _NDARRAY and x.dtype is _U64 and x.ndim == 1 and x.flags.c_contiguous and x.flags.aligned:
        return x
    if type(x) is list and len(x) <= 64 and all(type(v) is int and 0 <= v < 1 << 64 for v in x):
        return np.array(x, dtype=_U64)  # a few Python ints (namespaces): exact, no dtype inference
    a = np.asarray(x)
    if a.dtype.kind in "fO" and not isinstance(x, np.ndarray):
        # Python ints >= 2**63 make numpy infer float64 or object: convert them exactly.
        vals = [operator.index(v) for v in np.ravel(np.array(x, dtype=object))]
        if any(v < 0 or v >= 1 << 64 for v in vals):
            raise OverflowError("ids and namespaces are unsigned 64-bit integers (0 <= v < 2**64)")
        return np.array(vals, dtype=_U64)
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        raise OverflowError("ids and namespaces are unsigned 64-bit integers; got a negative value")
    if a.dtype.kind not in "iub" and a.size:
        raise TypeError(f"ids and namespaces must be integers, got dtype {a.dtype}")
    return np.require(np.asarray(a, dtype=_U64), requirements="CA").reshape(-1)


def _index(v: Any, what: str) -> int:
    """An int from an int-like (numpy integers included); TypeError for floats and bools."""
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, got bool")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(v).__name__}") from None


def _u64(v: Any, what: str) -> int:
    i = _index(v, what)
    if not 0 <= i < 1 << 64:
        raise OverflowError(f"{what} must be in 0..2**64-1, got {i}")
    return i


def _check(rc: int) -> None:
    if rc:
        raise error_for(rc, _last_error().decode("utf-8", "replace"))


def _ms(seconds: Optional[float], what: str) -> int:
    """Seconds -> whole milliseconds (>= 1 for any positive value); None -> 0 (the default)."""
    if seconds is None:
        return 0
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{what} must be a non-negative number of seconds, got {seconds!r}")
    ms = int(round(seconds * 1000.0))
    return max(ms, 1) if seconds > 0 else 0


def _filter_bytes(f: Any) -> Optional[bytes]:
    """A filter argument's binary form; a malformed one is :class:`InvalidArgumentError`."""
    try:
        return _filters.as_bytes(f)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"INVALID_ARGUMENT: filter: {e}", STATUS_CODES["INVALID_ARGUMENT"]) from e


_P_U64 = ctypes.POINTER(c_uint64)


def _scope_params(p: Any, fb: Optional[bytes], namespace: Optional[int], namespaces: Optional[Iterable[int]]) -> List[Any]:
    """Sets the filter and namespace fields of a ``kalos_recall_params`` or ``kalos_list_params``;
    returns the buffers they point into, which must stay alive while ``p`` is used."""
    keep: List[Any] = []
    if fb is not None:
        fbuf = (ctypes.c_uint8 * max(len(fb), 1)).from_buffer_copy(fb or b"\0")
        keep.append(fbuf)
        p.filter = ctypes.cast(fbuf, ctypes.POINTER(ctypes.c_uint8))
        p.filter_len = len(fb)
    if namespace is not None or namespaces is not None:
        ns = [namespace] if namespace is not None else []
        if namespaces is not None:
            ns.extend(namespaces)
        nsa = _u64_1d(ns)
        keep.append(nsa)
        p.namespaces = ctypes.cast(_addr(nsa), _P_U64)
        p.namespaces_len = nsa.shape[0]
    return keep


def status_name(status: int) -> str:
    """The stable name of a status code (``kalos_status_str``), e.g. ``"SERVER_GONE"``."""
    return _lib.kalos_status_str(status).decode()


def version() -> str:
    """The version of the loaded ``libkalos.so``."""
    return _lib.kalos_version().decode()


class Records(NamedTuple):
    """Result of :meth:`Kalos.get`: one row per requested id, in request order."""

    ids: np.ndarray  #: uint64, shape (n,)
    vectors: Optional[np.ndarray]  #: float32, shape (n, dim), or None if not requested
    namespaces: Optional[np.ndarray]  #: uint64, shape (n,), or None if not requested
    payloads: Optional[List[Optional[bytes]]]  #: bytes or None per id, or None if not requested


class Lag(NamedTuple):
    """How far behind its log the replica that answered a stale-read recall was (cluster mode;
    see :attr:`Kalos.last_lag`). Both 0 outside cluster mode and for an up-to-date replica."""

    entries: int  #: log entries known to be in the shard's stream and not applied
    ms: int  #: milliseconds since the replica's host last heard from the log (0 while connected)


def _token(min_seqs: ArrayLike) -> np.ndarray:
    """A write token (per shard log sequences) as a uint64 array."""
    if isinstance(min_seqs, (str, bytes, Mapping)):
        raise TypeError(f"min_seqs must be a sequence of ints (a write token), got {type(min_seqs).__name__}")
    try:
        return _u64_1d(min_seqs)
    except OverflowError:
        raise OverflowError("min_seqs must be a write token: log sequences in 0..2**64-1") from None
    except TypeError:
        raise TypeError(f"min_seqs must be a write token: a sequence of ints, got {min_seqs!r:.80}") from None


class _Scratch(threading.local):
    """Per-thread reusable payload buffer (grown on demand, never shared between threads)."""

    def __init__(self) -> None:
        self.buf = np.empty(64 * 1024, np.uint8)
        self.needed = c_size_t(0)


class _Frame:
    """A ``kalos_recall_args`` struct and result buffers of one thread on one handle (the fast
    path of :meth:`Kalos.recall`).

    A ctypes call costs about 70 ns per argument on the development VM even when every argument
    is a ctypes object of the exact type, and ``kalos_recall`` takes 10 (1.15 µs against 0.48
    for one). The fast path fills a ``kalos_recall_args`` once (handle, result buffers and
    their capacities) and calls ``kalos_recall_with`` with its address, one argument, through a
    binding without ``argtypes`` (``ap`` is a ``c_void_p``; checked by
    tests/test_header_drift.py). Per call it stores the query's data pointer, read from the
    query's own numpy header (see ``_from_address`` above), and the query length and k only
    when they change. Results land in buffers of ``KALOS_MAX_K`` entries and are copied out (a
    copy of ≤ k elements is cheaper than allocating two arrays and extracting their addresses);
    the views of the first ``c`` entries are kept for the next call with the same count, so the
    copy-out is two ``ndarray.copy()`` calls. ``busy`` is set while the struct and buffers are
    in use: a recall re-entered on the same thread (a signal handler or a finalizer run in
    between) takes the general path instead of overwriting them.

    When ``kalos._fastcall`` is installed (``_FASTCALL``), a ``_fastcall.Frame`` wrapping a
    ``_Frame`` runs these steps in C over the same struct and buffers (kalos/_fastcall.c).
    """

    __slots__ = ("a", "ap", "qlen", "k", "ids", "scores", "busy", "c", "ids_c", "scores_c", "p", "ns")

    def __init__(self, handle: int) -> None:
        self.ids = np.empty(KALOS_MAX_K, _U64)
        self.scores = np.empty(KALOS_MAX_K, _F32)
        a = self.a = _ffi.kalos_recall_args()
        _lib.kalos_recall_args_init(byref(a), ctypes.sizeof(a))
        a.handle = handle
        a.ids = self.ids.ctypes.data
        a.ids_len = KALOS_MAX_K
        a.scores = self.scores.ctypes.data
        a.scores_len = KALOS_MAX_K
        self.ap = c_void_p(addressof(a))
        # The scope of a C fast-path call with namespaces or a filter: a params struct and a
        # namespace buffer (kalos/_fastcall.c sets the namespaces, the filter and a.params per
        # call).
        p = self.p = _ffi.kalos_recall_params()
        _lib.kalos_recall_params_init(byref(p), ctypes.sizeof(p))
        self.ns = np.zeros(KALOS_MAX_FILTER_NAMESPACES, _U64)
        self.qlen = -1  # the values now in the struct (set on first use)
        self.k = -1
        self.busy = False
        self.c = 0
        self.ids_c = self.ids[:0]
        self.scores_c = self.scores[:0]


def _split_payloads(buf: np.ndarray, lens: np.ndarray) -> List[Optional[bytes]]:
    out: List[Optional[bytes]] = []
    raw = buf.data
    off = 0
    for n in lens.tolist():
        if n == KALOS_NO_PAYLOAD:
            out.append(None)
        else:
            out.append(bytes(raw[off : off + n]))
            off += n
    return out


class Kalos:
    """An open Kalos store (a ``kalos_handle``). Create it with :func:`kalos.open`.

    Thread-safe: any number of threads may call its methods at once. Use it as a context
    manager, or call :meth:`close`; after close every method raises :class:`ClosedError`.
    """

    def __init__(self, handle: int, name: str, role: str) -> None:
        self._h: int = handle
        self._name = name
        self._role = role
        # Calls in flight: a list used as an atomic counter (append/pop are atomic under the
        # GIL). A call appends, then checks _closing; close() sets _closing, then waits for the
        # list to empty. Under the GIL's sequential consistency either the call sees _closing
        # (and backs out) or close() sees the call (and waits): kalos_close never races a call.
        self._active: List[None] = []
        self._closing = False
        self._close_lock = threading.Lock()
        self._scratch = _Scratch()
        self._tls = threading.local()  # per thread: the recall fast path's _Frame, the last lag
        self._forked = False
        _LIVE.add(self)
        d = c_uint32(0)
        rc = _lib.kalos_dim(handle, byref(d))
        if rc:
            self._h = 0  # the caller (open) closes the handle; __del__ must not close it again
            _check(rc)
        self._dim = d.value

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The store name."""
        return self._name

    @property
    def dim(self) -> int:
        """The vector dimension of the store."""
        return self._dim

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closing

    @property
    def is_server(self) -> bool:
        """True when this process runs the store's server (role server, or auto that created it)."""
        return self.stats()["server_pid"] == os.getpid()

    def close(self, timeout: Optional[float] = None) -> None:
        """Closes the handle. Idempotent.

        Waits for calls in flight on other threads to return (each has its own deadline), then
        calls ``kalos_close``. If this handle runs the server, the server stops, the store's
        name is removed and clients of other processes get :class:`ServerGoneError`.
        ``timeout`` (seconds, default: forever) bounds the wait for calls in flight; if it
        passes, :class:`KalosTimeoutError` is raised and the handle stays open but refuses new
        calls.
        """
        with self._close_lock:
            if self._h == 0:
                return
            self._closing = True
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._active:
                if deadline is not None and time.monotonic() > deadline:
                    raise ERRORS_BY_STATUS[STATUS_CODES["TIMEOUT"]](
                        f"TIMEOUT: {len(self._active)} call(s) still in flight after {timeout} s"
                    )
                time.sleep(0.0005)
            h, self._h = self._h, 0
            _lib.kalos_close(h)

    def __enter__(self) -> "Kalos":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if getattr(self, "_h", 0) and not self._active:
                h, self._h = self._h, 0
                self._closing = True
                _lib.kalos_close(h)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __reduce__(self) -> Any:
        raise TypeError("a Kalos handle cannot be pickled; open the store by name in each process")

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<kalos.Kalos name={self._name!r} dim={self._dim} {state}>"

    def _enter(self) -> int:
        self._active.append(None)
        if self._closing:
            self._active.pop()
            raise self._closed_error()
        return self._h

    def _closed_error(self) -> KalosError:
        if self._forked:
            return ClosedError(
                "CLOSED: this handle was opened by the parent process before fork(); open the store again in the child",
                STATUS_CODES["CLOSED"],
            )
        return ClosedError("CLOSED: the Kalos handle is closed", STATUS_CODES["CLOSED"])

    def _disown_after_fork(self) -> None:
        # In a forked child the handle's threads (the server thread, if this process ran the
        # server) do not exist, and kalos_close would stop and unlink the parent's store.
        # Mark it closed without calling into the library; the parent is unaffected.
        self._forked = True
        self._closing = True
        self._h = 0
        self._active = []
        self._close_lock = threading.Lock()

    # -- recall ---------------------------------------------------------------------------------

    @staticmethod
    def _recall_params(
        namespace: Optional[int],
        namespaces: Optional[Iterable[int]],
        recency_weight: float,
        half_life: Optional[float],
        timeout: Optional[float],
        filter: Any = None,  # noqa: A002 - the name LangChain and LlamaIndex users know
        read_your_writes: bool = False,
        allow_stale: bool = False,
        min_seqs: Optional[ArrayLike] = None,
    ) -> Tuple[Optional[_ffi.kalos_recall_params], Any]:
        fb = _filter_bytes(filter)
        if (
            namespace is None and namespaces is None and not recency_weight and timeout is None and fb is None
            and not read_your_writes and not allow_stale and min_seqs is None
        ):
            return None, None
        p = _ffi.kalos_recall_params()
        _lib.kalos_recall_params_init(byref(p), ctypes.sizeof(p))
        keep = _scope_params(p, fb, namespace, namespaces)
        if recency_weight:
            p.recency_weight = recency_weight
            p.recency_half_life_ms = (half_life or 0.0) * 1000.0
        p.timeout_ms = _ms(timeout, "timeout")
        p.consistency = (_ffi.KALOS_RECALL_READ_YOUR_WRITES if read_your_writes else 0) | (
            _ffi.KALOS_RECALL_ALLOW_STALE if allow_stale else 0
        )
        if min_seqs is not None:
            t = _token(min_seqs)
            keep.append(t)
            p.min_seqs = t.ctypes.data_as(ctypes.POINTER(c_uint64))
            p.min_seqs_len = t.shape[0]
        return p, keep

    @overload
    def recall(
        self,
        query: ArrayLike,
        k: int = ...,
        namespace: Optional[int] = ...,
        *,
        namespaces: Optional[Iterable[int]] = ...,
        recency_weight: float = ...,
        half_life: Optional[float] = ...,
        timeout: Optional[float] = ...,
        filter: Any = ...,
        read_your_writes: bool = ...,
        allow_stale: bool = ...,
        min_seqs: Optional[ArrayLike] = ...,
        payloads: Literal[False] = ...,
    ) -> Tuple[np.ndarray, np.ndarray]: ...

    @overload
    def recall(
        self,
        query: ArrayLike,
        k: int = ...,
        namespace: Optional[int] = ...,
        *,
        namespaces: Optional[Iterable[int]] = ...,
        recency_weight: float = ...,
        half_life: Optional[float] = ...,
        timeout: Optional[float] = ...,
        filter: Any = ...,
        read_your_writes: bool = ...,
        allow_stale: bool = ...,
        min_seqs: Optional[ArrayLike] = ...,
        payloads: Literal[True],
    ) -> Tuple[np.ndarray, np.ndarray, List[Optional[bytes]]]: ...

    def recall(
        self,
        query: ArrayLike,
        k: int = 10,
        namespace: Optional[int] = None,
        *,
        namespaces: Optional[Iterable[int]] = None,
        recency_weight: float = 0.0,
        half_life: Optional[float] = None,
        timeout: Optional[float] = None,
        filter: Any = None,  # noqa: A002
        read_your_writes: bool = False,
        allow_stale: bool = False,
        min_seqs: Optional[ArrayLike] = None,
        payloads: bool = False,
    ) -> Union[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, List[Optional[bytes]]]]:
        """Top-``k`` memories most similar to ``query``.

        Args:
            query: ``dim`` floats (C-contiguous float32 passes with no copy).
            k: 1 to :data:`MAX_K` (1024).
            namespace: only memories of this namespace (``namespaces``: any of these, ≤ 64).
            recency_weight: w in [0, 1]; score' = (1-w)·score + w·2^(-age/half_life).
            half_life: recency half-life in seconds (> 0 when recency_weight > 0).
            timeout: deadline of this call in seconds (default: the handle's).
            filter: a metadata filter: a :class:`kalos.filters.Expr`, a Mongo-style dict
                (``{"user": "ann", "n": {"$gte": 3}}``, see :func:`kalos.filters.from_dict`) or
                its binary form. Applied inside the scan: ``min(k, matching memories)`` hits.
            read_your_writes: cluster mode: wait, up to the deadline, until the replica that
                answers has applied this handle's acknowledged writes (:meth:`write_seqs`).
                Satisfied at once on a single host.
            allow_stale: cluster mode: a replica that may be behind its log may answer
                (without it such a recall raises :class:`StaleError`); :attr:`last_lag` then
                says how far behind it was.
            min_seqs: cluster mode: a write token (:meth:`write_seqs` of any handle, in any
                process or language: a list of ints) whose writes the replica that answers
                must have applied first, waiting up to the deadline. Ignored on a single host.
            payloads: also return each hit's payload (bytes, or None).

        Returns:
            ``(ids, scores)``: uint64 and float32 arrays of ``min(k, matches)`` hits, best first
            (cosine/ip: higher is better; l2: squared distance, lower is better), and
            ``payloads`` as a third item when asked for.
        """
        # Fast path (the call whose overhead is budgeted): a 1-D C-contiguous, aligned float32
        # query, and a per-thread pre-built argument frame (see _Frame). With kalos._fastcall,
        # its C frame checks the query, k, the scope (`namespace`, or `namespaces` as a list or
        # tuple; a filter), the recency weighting and the timeout and makes the call (with
        # payloads: Frame.payloads); it returns None when they do not qualify or the frame is
        # busy, and the general path below runs. Without it, the ctypes fast path (elif) does
        # the same in Python for plain calls without payloads.
        plain = namespace is None and namespaces is None and filter is None and not recency_weight and timeout is None
        if (
            (namespace is None or namespaces is None)
            and not read_your_writes
            and not allow_stale
            and min_seqs is None
        ):
            if _FASTCALL is not None:
                try:
                    fc = self._tls.fastcall
                except AttributeError:
                    fc = self._tls.fastcall = _FASTCALL(_Frame(self._h))
                if plain and not payloads:
                    r = fc(self, query, k)
                elif namespaces is None or namespaces.__class__ is list or namespaces.__class__ is tuple:
                    if filter is not None:
                        filter = _filter_bytes(filter)
                    ns = namespaces if namespace is None else namespace
                    if payloads:
                        r = fc.payloads(self, query, k, ns, filter, recency_weight, half_life, timeout)
                    else:
                        r = fc(self, query, k, ns, filter, recency_weight, half_life, timeout)
                else:
                    r = None
                if r.__class__ is tuple:
                    return r
                if r is not None:
                    if r < 0:
                        raise self._closed_error()
                    _check(r)
            elif (
                plain
                and not payloads
                and type(query) is _NDARRAY
                and query.dtype is _F32
                and query.ndim == 1
                and query.flags.c_contiguous
                and query.flags.aligned
                and 0 < k <= _FAST_MAX_K
            ):
                try:
                    f = self._tls.frame
                except AttributeError:
                    f = self._tls.frame = _Frame(self._h)
                if not f.busy:
                    f.busy = True
                    try:
                        a = f.a
                        a.query = _from_address(id(query) + _DATA_OFFSET).value
                        n = len(query)
                        if n != f.qlen:
                            a.query_len = f.qlen = n
                        if k != f.k:
                            a.k = f.k = k
                        self._active.append(None)
                        try:
                            if self._closing:
                                raise self._closed_error()
                            rc = _recall_with_raw(f.ap)
                        finally:
                            self._active.pop()
                        if rc:
                            _check(rc)
                        c = a.count
                        if c != f.c:
                            f.c, f.ids_c, f.scores_c = c, f.ids[:c], f.scores[:c]
                        return f.ids_c.copy(), f.scores_c.copy()
                    finally:
                        f.busy = False
        if payloads:
            return self._recall_payloads(
                query, k, namespace, namespaces, recency_weight, half_life, timeout, filter,
                read_your_writes, allow_stale, min_seqs,
            )
        # General path: filters, recency, per-call timeout, cluster options, any array-like query.
        k = _index(k, "k")
        q = _f32_1d(query)
        params, keep = self._recall_params(
            namespace, namespaces, recency_weight, half_life, timeout, filter, read_your_writes, allow_stale, min_seqs,
        )
        n = k if 0 < k <= KALOS_MAX_K else self._bad_k(k)
        # The extra last elements receive the hit count (size_t) and, with allow_stale, the lag.
        ids = np.empty(n + (3 if allow_stale else 1), _U64)
        scores = np.empty(n, _F32)
        ia = _addr(ids)
        h = self._enter()
        try:
            if allow_stale:
                rc = _lib.kalos_recall_lag(
                    h, _addr(q), q.shape[0], k, addressof(params), ia, n, _addr(scores), n, ia + 8 * n,
                    ia + 8 * (n + 1), ia + 8 * (n + 2),
                )
            else:
                rc = _recall(h, _addr(q), q.shape[0], k, params and addressof(params), ia, n, _addr(scores), n, ia + 8 * n)
        finally:
            self._active.pop()
        _check(rc)
        c = int(ids[n])
        if allow_stale:
            self._tls.lag = Lag(int(ids[n + 1]), int(ids[n + 2]))
        return ids[:c], scores[:c]

    @property
    def last_lag(self) -> Optional[Lag]:
        """The :class:`Lag` that the calling thread's last :meth:`recall` on this handle with
        ``allow_stale=True`` reported: how far behind its log the replica that answered was
        (cluster mode; ``Lag(0, 0)`` on a single host and for an up-to-date replica). None
        before such a recall, and after one with ``payloads=True`` or a :meth:`recall_batch`
        with ``allow_stale=True``: the library reports the lag of single-query recalls
        without payloads only. Recalls without ``allow_stale`` leave it as it is."""
        return getattr(self._tls, "lag", None)

    def write_seqs(self) -> List[int]:
        """This handle's write token (cluster mode): per shard (index = shard), the log
        sequence of its last acknowledged write, 0 for none. Pass it as ``min_seqs`` to a
        recall through any host, from any process or language, to read these writes. Empty
        on a single host and before the first write."""
        cnt = c_size_t(0)
        buf = np.empty(64, _U64)
        for _ in range(4):
            h = self._enter()
            try:
                rc = _lib.kalos_last_write_seqs(h, _addr(buf), buf.shape[0], addressof(cnt))
            finally:
                self._active.pop()
            if rc == STATUS_CODES["BUFFER_TOO_SMALL"] and cnt.value > buf.shape[0]:
                buf = np.empty(cnt.value, _U64)
                continue
            _check(rc)
            return [int(x) for x in buf[: cnt.value]]
        raise error_for(STATUS_CODES["BUFFER_TOO_SMALL"], "BUFFER_TOO_SMALL: the write token kept growing")  # pragma: no cover

    @staticmethod
    def _bad_k(k: int) -> int:
        """Buffer length for a k the library will reject (it reports K_OUT_OF_RANGE itself)."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if k < 0 or k > 0xFFFFFFFF:
            raise KOutOfRangeError(f"K_OUT_OF_RANGE: k = {k}; k must be between 1 and {KALOS_MAX_K}", STATUS_CODES["K_OUT_OF_RANGE"])
        return 0

    def _recall_payloads(
        self, query, k, namespace, namespaces, recency_weight, half_life, timeout, filter=None,  # noqa: A002
        read_your_writes=False, allow_stale=False, min_seqs=None,
    ):
        k = _index(k, "k")
        q = _f32_1d(query)
        params, keep = self._recall_params(
            namespace, namespaces, recency_weight, half_life, timeout, filter, read_your_writes, allow_stale, min_seqs,
        )
        n = k if 0 < k <= KALOS_MAX_K else self._bad_k(k)
        ids = np.empty(n, _U64)
        scores = np.empty(n, _F32)
        lens = np.empty(n, _U32)
        count = c_size_t(0)
        s = self._scratch
        for _ in range(8):
            h = self._enter()
            try:
                rc = _lib.kalos_recall_payloads(
                    h, _addr(q), q.shape[0], k, params and addressof(params),
                    _addr(ids), n, _addr(scores), n,
                    _addr(s.buf), s.buf.shape[0], _addr(lens), n,
                    addressof(count), addressof(s.needed),
                )
            finally:
                self._active.pop()
            if rc == STATUS_CODES["BUFFER_TOO_SMALL"] and s.needed.value > s.buf.shape[0]:
                s.buf = np.empty(max(s.needed.value, 2 * s.buf.shape[0]), np.uint8)
                continue  # the table changed between calls at worst: retry with a larger buffer
            _check(rc)
            if allow_stale:
                self._tls.lag = None
            c = count.value
            return ids[:c], scores[:c], _split_payloads(s.buf, lens[:c])
        raise error_for(STATUS_CODES["BUFFER_TOO_SMALL"], "BUFFER_TOO_SMALL: payloads kept growing")  # pragma: no cover

    def recall_batch(
        self,
        queries: ArrayLike,
        k: int = 10,
        namespace: Optional[int] = None,
        *,
        namespaces: Optional[Iterable[int]] = None,
        recency_weight: float = 0.0,
        half_life: Optional[float] = None,
        timeout: Optional[float] = None,
        filter: Any = None,  # noqa: A002
        read_your_writes: bool = False,
        allow_stale: bool = False,
        min_seqs: Optional[ArrayLike] = None,
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top-``k`` for each row of ``queries`` (shape ``(nq, dim)``), run as one batch.

        Returns ``(ids, scores, counts)``: ids uint64 ``(nq, k)``, scores float32 ``(nq, k)``,
        counts ``(nq,)`` hits per row. Row i's hits are ``ids[i, :counts[i]]``; the rest of a
        row is padded with :data:`NO_ID` and NaN. Filters and cluster options as in
        :meth:`recall` (no lag is reported: :attr:`last_lag` becomes None). A batch of
        1 MiB or more of queries is checked and copied into the request slot by up to 8
        short-lived threads (``KALOS_COPY_THREADS=1``: this thread only).
        """
        k = _index(k, "k")
        q = _f32_c(queries)
        if q.ndim == 1:
            q = q.reshape(1, -1)
        nq = q.shape[0] if q.ndim >= 1 else 0
        params, keep = self._recall_params(
            namespace, namespaces, recency_weight, half_life, timeout, filter, read_your_writes, allow_stale, min_seqs,
        )
        n = k if 0 < k <= KALOS_MAX_K else self._bad_k(k)
        ids = np.full((nq, n), NO_ID, _U64)
        scores = np.full((nq, n), np.nan, _F32)
        counts = np.zeros(nq, np.uintp)
        h = self._enter()
        try:
            rc = _lib.kalos_recall_batch(
                h, _addr(q), q.size, nq, k, params and addressof(params),
                _addr(ids), ids.size, _addr(scores), scores.size, _addr(counts), nq,
            )
        finally:
            self._active.pop()
        _check(rc)
        if allow_stale:
            self._tls.lag = None
        return ids, scores, counts.astype(np.int64)

    # -- writes ---------------------------------------------------------------------------------

    def upsert(
        self,
        ids: ArrayLike,
        vectors: ArrayLike,
        *,
        namespace: int = 0,
        namespaces: Optional[ArrayLike] = None,
        payloads: Optional[Sequence[Payload]] = None,
        metadata: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
        ttl: Optional[float] = None,
        expires_at: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> None:
        """Inserts or replaces memories (a repeated id within one call: the last one wins).

        Args:
            ids: n uint64 ids (a single int is one id).
            vectors: n × dim floats (shape ``(n, dim)``, or ``(dim,)`` for one id).
            namespace: namespace of every item; or ``namespaces``: one per item.
            payloads: one per item: bytes, str (stored UTF-8) or None (no payload).
            metadata: one dict (or None) per item: typed fields that filters test (see
                :mod:`kalos.filters`); an upsert replaces every field a memory had.
            ttl: time to live in seconds; or ``expires_at``: absolute expiry, unix seconds.
            timeout: deadline of this call in seconds.

        Returns once the write is applied (and durable, with a data directory): every later
        recall from any process sees it.
        """
        i = _u64_1d(ids)
        v = _f32_c(vectors)
        p = _ffi.kalos_upsert_params()
        _lib.kalos_upsert_params_init(byref(p), ctypes.sizeof(p))
        p.namespace_id = _u64(namespace, "namespace")
        keep: List[Any] = []
        if namespaces is not None:
            ns = _u64_1d(namespaces)
            keep.append(ns)
            p.namespaces = ns.ctypes.data_as(ctypes.POINTER(c_uint64))
            p.namespaces_len = ns.shape[0]
        if payloads is not None:
            if isinstance(payloads, (bytes, str)):
                raise TypeError("payloads must be a sequence with one payload per id")
            chunks: List[bytes] = []
            lens = np.empty(len(payloads), _U32)
            for j, pl in enumerate(payloads):
                if pl is None:
                    lens[j] = KALOS_NO_PAYLOAD
                    continue
                b = pl.encode("utf-8") if isinstance(pl, str) else bytes(pl)
                if len(b) >= KALOS_NO_PAYLOAD:
                    raise ERRORS_BY_STATUS[STATUS_CODES["PAYLOAD_TOO_LARGE"]](f"PAYLOAD_TOO_LARGE: payload {j} is {len(b)} bytes")
                lens[j] = len(b)
                chunks.append(b)
            blob = np.frombuffer(b"".join(chunks) or b"\0", np.uint8)
            keep += [blob, lens]
            p.payloads = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            p.payloads_len = sum(len(c) for c in chunks)
            p.payload_lens = lens.ctypes.data_as(ctypes.POINTER(c_uint32))
            p.payload_lens_len = lens.shape[0]
        if metadata is not None:
            if isinstance(metadata, Mapping):
                raise TypeError("metadata must be a sequence with one dict per id")
            if len(metadata) != i.shape[0]:
                raise ValueError(f"{len(metadata)} metadata entries for {i.shape[0]} ids")
            try:
                fb = _filters.encode_fields(metadata)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"INVALID_ARGUMENT: metadata: {e}", STATUS_CODES["INVALID_ARGUMENT"]) from e
            fbuf = (ctypes.c_uint8 * len(fb)).from_buffer_copy(fb)
            keep.append(fbuf)
            p.fields = ctypes.cast(fbuf, ctypes.POINTER(ctypes.c_uint8))
            p.fields_len = len(fb)
        p.ttl_ms = _ms(ttl, "ttl")
        if expires_at is not None:
            p.expires_at_ms = max(int(expires_at * 1000.0), 1)
        p.timeout_ms = _ms(timeout, "timeout")
        h = self._enter()
        try:
            rc = _lib.kalos_upsert(h, _addr(i), i.shape[0], _addr(v), v.size, addressof(p))
        finally:
            self._active.pop()
        _check(rc)

    def delete(self, ids: ArrayLike) -> int:
        """Deletes ids, all or nothing: an unknown id raises :class:`NotFoundError` and deletes
        nothing. Returns the number deleted."""
        i = _u64_1d(ids)
        out = c_uint64(0)
        h = self._enter()
        try:
            rc = _lib.kalos_delete(h, _addr(i), i.shape[0], addressof(out))
        finally:
            self._active.pop()
        _check(rc)
        return out.value

    def delete_where(self, filter: Any, namespaces: Optional[Iterable[int]] = None) -> int:  # noqa: A002
        """Deletes every memory that matches ``filter`` (an Expr, a filter dict or its binary
        form) and, when given, lies in one of ``namespaces``. The server evaluates the filter, so
        any process deletes the same memories. Returns how many were deleted."""
        fb = _filter_bytes(filter)
        if fb is None:
            raise TypeError("delete_where needs a filter (use clear() to delete everything)")
        fbuf = np.frombuffer(fb or b"\0", np.uint8)
        ns = _u64_1d(list(namespaces)) if namespaces is not None else None
        out = c_uint64(0)
        h = self._enter()
        try:
            rc = _lib.kalos_delete_where(
                h, _addr(ns) if ns is not None else None, ns.shape[0] if ns is not None else 0,
                _addr(fbuf), len(fb), addressof(out),
            )
        finally:
            self._active.pop()
        _check(rc)
        return out.value

    def get_metadata(self, ids: ArrayLike) -> List[Dict[str, Any]]:
        """The metadata fields of each id (all must exist, else :class:`NotFoundError`), as
        dicts in request order (tags as sorted lists, timestamps as UTC datetimes)."""
        i = _u64_1d(ids)
        n = i.shape[0]
        lens = np.empty(n, _U32)
        s = self._scratch
        for _ in range(8):
            h = self._enter()
            try:
                rc = _lib.kalos_get_fields(h, _addr(i), n, _addr(s.buf), s.buf.shape[0], _addr(lens), n, addressof(s.needed))
            finally:
                self._active.pop()
            if rc == STATUS_CODES["BUFFER_TOO_SMALL"] and s.needed.value > s.buf.shape[0]:
                s.buf = np.empty(max(s.needed.value, 2 * s.buf.shape[0]), np.uint8)
                continue
            _check(rc)
            out, o = [], 0
            raw = s.buf.tobytes()[: int(lens.sum())]
            for ln in lens:
                out.append(_filters.decode_fields(raw[o:o + int(ln)]))
                o += int(ln)
            return out
        raise error_for(STATUS_CODES["BUFFER_TOO_SMALL"], "BUFFER_TOO_SMALL: fields kept growing")  # pragma: no cover

    def delete_namespace(self, namespace: int) -> int:
        """Deletes every memory of a namespace; returns how many."""
        out = c_uint64(0)
        h = self._enter()
        try:
            rc = _lib.kalos_delete_namespace(h, _u64(namespace, "namespace"), addressof(out))
        finally:
            self._active.pop()
        _check(rc)
        return out.value

    def clear(self) -> int:
        """Deletes every memory; returns how many."""
        out = c_uint64(0)
        h = self._enter()
        try:
            rc = _lib.kalos_clear(h, addressof(out))
        finally:
            self._active.pop()
        _check(rc)
        return out.value

    # -- reads ----------------------------------------------------------------------------------

    def get(
        self,
        ids: ArrayLike,
        *,
        vectors: bool = True,
        namespaces: bool = True,
        payloads: bool = True,
    ) -> Records:
        """Fetches memories by id (all must exist, else :class:`NotFoundError`).

        Returns :class:`Records` with the vectors (as written), namespaces and payloads of each
        id in request order; pass ``vectors=False`` etc. to skip a part.
        """
        i = _u64_1d(ids)
        n = i.shape[0]
        vec = np.empty((n, self._dim), _F32) if vectors else None
        nss = np.empty(n, _U64) if namespaces else None
        lens = np.empty(n, _U32) if payloads else None
        s = self._scratch
        for _ in range(8):
            buf = s.buf if payloads else None
            h = self._enter()
            try:
                rc = _lib.kalos_get(
                    h, _addr(i), n,
                    _addr(vec) if vec is not None else None, vec.size if vec is not None else 0,
                    _addr(nss) if nss is not None else None, n if nss is not None else 0,
                    _addr(buf) if buf is not None else None, buf.shape[0] if buf is not None else 0,
                    _addr(lens) if lens is not None else None, n if lens is not None else 0,
                    addressof(s.needed),
                )
            finally:
                self._active.pop()
            if rc == STATUS_CODES["BUFFER_TOO_SMALL"] and payloads and s.needed.value > s.buf.shape[0]:
                s.buf = np.empty(max(s.needed.value, 2 * s.buf.shape[0]), np.uint8)
                continue
            _check(rc)
            pls = _split_payloads(s.buf, lens) if lens is not None else None
            return Records(i.copy() if i is ids else i, vec, nss, pls)
        raise error_for(STATUS_CODES["BUFFER_TOO_SMALL"], "BUFFER_TOO_SMALL: payloads kept growing")  # pragma: no cover

    #: Ids one :meth:`list` call asks the library for at a time (512 KiB of ids).
    LIST_PAGE = 1 << 16

    def list_pages(
        self,
        filter: Any = None,  # noqa: A002
        *,
        namespace: Optional[int] = None,
        namespaces: Optional[Iterable[int]] = None,
        after: Optional[int] = None,
        page_size: int = LIST_PAGE,
        timeout: Optional[float] = None,
    ) -> Iterator[np.ndarray]:
        """The ids of the live memories that match ``filter`` (an Expr, a filter dict or its
        binary form; None: every memory) and the namespaces, ascending, as uint64 arrays of at
        most ``page_size`` ids (``kalos_list``). Each page is one call from the last id of the one
        before (``after`` starts the first past that id), so writes between pages show as they
        happen: a memory that lives and matches throughout is listed exactly once, no id twice.
        Each request scans the table once: prefer pages of thousands of ids."""
        page_size = _index(page_size, "page_size")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        fb = _filter_bytes(filter)
        p = _ffi.kalos_list_params()
        _lib.kalos_list_params_init(byref(p), ctypes.sizeof(p))
        keep = _scope_params(p, fb, namespace, namespaces)  # noqa: F841 - alive while pages are read
        if after is not None:
            p.has_after, p.after = 1, _u64(after, "after")
        p.timeout_ms = _ms(timeout, "timeout")
        cnt, remaining = c_size_t(0), c_uint64(0)
        while True:
            out = np.empty(page_size, _U64)
            h = self._enter()
            try:
                rc = _lib.kalos_list(h, addressof(p), _addr(out), page_size, addressof(cnt), addressof(remaining))
            finally:
                self._active.pop()
            _check(rc)
            n = cnt.value
            if n:
                yield out[:n]
            if n < page_size or remaining.value == 0:
                return
            p.has_after, p.after = 1, int(out[n - 1])

    def list(
        self,
        filter: Any = None,  # noqa: A002
        *,
        namespace: Optional[int] = None,
        namespaces: Optional[Iterable[int]] = None,
        after: Optional[int] = None,
        limit: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> np.ndarray:
        """The ids (uint64, ascending) of the live memories that match ``filter`` and the
        namespaces, greater than ``after`` when given: all of them, or the first ``limit``
        (see :meth:`list_pages`, which this pages through)."""
        if limit is not None:
            limit = _index(limit, "limit")
            if limit < 0:
                raise ValueError(f"limit must be >= 0, got {limit}")
            if limit == 0:
                return np.empty(0, _U64)
        page = self.LIST_PAGE if limit is None else min(limit, self.LIST_PAGE)
        parts: List[np.ndarray] = []
        n = 0
        for part in self.list_pages(filter, namespace=namespace, namespaces=namespaces, after=after, page_size=page,
                                    timeout=timeout):
            parts.append(part)
            n += len(part)
            if limit is not None and n >= limit:
                break
        ids = np.concatenate(parts) if parts else np.empty(0, _U64)
        return ids if limit is None else ids[:limit]

    def stats(self) -> Dict[str, Any]:
        """Server statistics as a dict (``count``, ``capacity``, ``dim``, ``metric``, ``engine``,
        ``engine_name``, ``requests``, ``queries``, ``batches``, ``errors``, ``p50_ns``,
        ``p99_ns``, ``queue_depth``, ``server_pid``, ``epoch``, ``payload_bytes``,
        ``uptime_ms``, ``engine_fallbacks``, ``fallback_reason``: why the CUDA engine is not serving, "" when
        nothing fell back, ...) and ``requests_by``: the requests answered since the server
        started by op and status, a list of ``{"op": "recall", "status": "OK", "count": 3}``
        ordered by op code, then status (kalosd's ``stats --json`` names; read with a second
        stats request, so it also counts the first)."""
        info = _ffi.kalos_stats_info()
        info.struct_size = ctypes.sizeof(info)
        h = self._enter()
        try:
            rc = _lib.kalos_stats(h, byref(info))
            ops = self._stats_ops(h) if rc == 0 else []
        finally:
            self._active.pop()
        _check(rc)
        out: Dict[str, Any] = {}
        for field in info._fields_:
            fname = field[0]
            if fname.startswith("_") or fname == "struct_size":
                continue
            out[fname] = getattr(info, fname)
        out["engine_name"] = info.engine_name.decode("utf-8", "replace")
        out["fallback_reason"] = info.fallback_reason.decode("utf-8", "replace")
        out["engine"] = _BACKEND_NAMES.get(info.engine, str(info.engine))
        out["metric"] = _METRIC_NAMES.get(info.metric, str(info.metric))
        out["dtype"] = _DTYPE_NAMES.get(info.dtype, str(info.dtype))
        out["requests_by"] = [
            {"op": _lib.kalos_op_name(c.op).decode(), "status": status_name(c.status), "count": int(c.count)} for c in ops
        ]
        return out

    @staticmethod
    def _stats_ops(h: int) -> List[Any]:
        """The server's (op, status) request counters (``kalos_stats_ops``)."""
        needed = c_size_t(0)
        for _ in range(4):
            buf = (_ffi.kalos_op_count * max(needed.value + 16, 64))()
            rc = _lib.kalos_stats_ops(h, buf, len(buf), byref(needed))
            if rc == 0:
                return list(buf[: needed.value])
            if rc != STATUS_CODES["BUFFER_TOO_SMALL"]:
                _check(rc)
        raise error_for(STATUS_CODES["BUFFER_TOO_SMALL"], "BUFFER_TOO_SMALL: op counters kept growing")  # pragma: no cover

    def __len__(self) -> int:
        """Number of live memories (``stats()["count"]``)."""
        return int(self.stats()["count"])


_LIVE: "weakref.WeakSet[Kalos]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for kv in list(_LIVE):
        kv._disown_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _enum(value: Union[str, int], table: Dict[str, int], what: str) -> int:
    if isinstance(value, str):
        try:
            return table[value.lower()]
        except KeyError:
            raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(table)}") from None
    return int(value)


def open(  # noqa: A001 - `kalos.open` is the documented entry point
    name: str,
    *,
    dim: int = 0,
    metric: Union[str, int] = "cosine",
    role: Union[str, int] = "auto",
    dtype: Union[str, int] = "f32",
    backend: Union[str, int] = "auto",
    capacity: Optional[int] = None,
    timeout: Optional[float] = None,
    data_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    sync: Union[str, int] = "always",
    sync_interval: Optional[float] = None,
    max_payload_bytes: Optional[int] = None,
    slots: Optional[int] = None,
    slot_bytes: Optional[int] = None,
    mode: Optional[int] = None,
    threads: Optional[int] = None,
    client_spin_ns: Optional[int] = None,
    server_spin_ns: Optional[int] = None,
    heartbeat_timeout: Optional[float] = None,
    gpu_memory_bytes: Optional[int] = None,
    ephemeral: bool = False,
    scan: Union[str, int] = "exact",
    rerank: Optional[int] = None,
    device_shards: int = 0,
    placement: Union[str, int] = "id",
    gpus: Union[str, Iterable[int], None] = None,
) -> Kalos:
    """Opens (or creates) the store ``name`` and returns a :class:`Kalos` handle.

    Args:
        name: 1-200 characters of ``[A-Za-z0-9._-]`` (segment ``/dev/shm/kalos.<name>``).
        dim: vector dimension; required to create a store, 0 (or the same value) to attach.
        metric: ``"cosine"`` (default), ``"ip"`` or ``"l2"``.
        role: ``"auto"`` (attach to a live server, else become it: the embedded default),
            ``"server"`` (create; fails with :class:`AlreadyExistsError` if one is live) or
            ``"client"`` (attach; :class:`NotFoundError` if none).
        dtype: GPU table storage ``"f32"``, ``"f16"`` or ``"bf16"``.
        backend: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        capacity: maximum number of memories (default 1,048,576).
        timeout: default deadline of every call, seconds (default 5).
        data_dir: directory for the write-ahead log and snapshots. Default: role ``"auto"``
            keeps the store in ``$XDG_DATA_HOME/kalos/<name>`` (or
            ``~/.local/share/kalos/<name>``), so it outlives this process: when the process
            running the server exits, another process's auto handle takes the store over from
            those files; role ``"server"`` keeps it in memory only.
        ephemeral: role ``"auto"`` without ``data_dir``: keep the store in memory only, alive
            exactly as long as the process that runs its server.
        sync: WAL policy ``"always"``, ``"interval"`` or ``"never"``; ``sync_interval`` in s.
        scan: ``"exact"`` (default) or ``"int8"``: scan an 8-bit copy of the table and
            re-score the best ``rerank`` candidates of each query exactly (the CPU engine, and
            the CUDA engine for single queries; scores
            stay exact; ``stats()["rerank_uncertain"]`` counts answers that may have missed a
            true neighbour).
        rerank: candidates re-scored per query with ``scan="int8"`` (default: max(8k, 64)).
        device_shards: split the table into this many shards (default 0 = one table; at most
            64), each with its own engine on its own server thread; a recall scans the shards
            in parallel and merges their top-k, so answers are the same as unsharded ones.
            On a CUDA store shard i runs on the i-th GPU of ``gpus`` (modulo their number);
            with the CPU backend CPU engines play the shards. More than 64 raises
            :class:`InvalidArgumentError`; ``stats()["engine_name"]`` starts with
            ``"shards<N>x["``.
        placement: how a sharded store assigns memories to shards: ``"id"`` (default: a hash
            of the id, balanced shards) or ``"namespace"`` (a hash of the namespace: a recall
            scoped to namespaces scans only the shards that hold them).
        gpus: the GPUs of a CUDA store: ``"all"``, or device ordinals such as ``[0, 1]``
            (default: device 0 alone). More than one shards the table over them. A device the
            host lacks raises :class:`InvalidArgumentError` with ``backend="cuda"``; with
            ``backend="auto"`` the store serves on the CPU (``stats()["fallback_reason"]``
            says why). Ignored by the CPU backend.
        max_payload_bytes, slots, slot_bytes, mode, threads, client_spin_ns, server_spin_ns,
        heartbeat_timeout (s), gpu_memory_bytes: see ``kalos_options`` in ``kalos.h``.

    Options other than ``name``, ``dim``, ``role`` and ``timeout``-like client settings only
    matter when this call creates the store.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if "\x00" in name:
        raise ERRORS_BY_STATUS[STATUS_CODES["INVALID_NAME"]]("INVALID_NAME: store name contains NUL")
    o = _ffi.kalos_options()
    _lib.kalos_options_init(byref(o), ctypes.sizeof(o))
    role_v = _enum(role, _ROLES, "role")
    o.role = role_v
    o.dim = dim
    o.metric = _enum(metric, _METRICS, "metric")
    o.dtype = _enum(dtype, _DTYPES, "dtype")
    o.backend = _enum(backend, _BACKENDS, "backend")
    o.scan = _enum(scan, _SCANS, "scan")
    o.placement = _enum(placement, _PLACEMENTS, "placement")
    if not 0 <= device_shards < 2**32:
        raise ValueError(f"device_shards must be a non-negative int, got {device_shards!r}")
    o.device_shards = device_shards
    if isinstance(gpus, str):
        if gpus.lower() != "all":
            raise ValueError(f'gpus must be "all" or device ordinals, got {gpus!r}')
        o.gpus = _ffi.KALOS_GPUS_ALL
    elif gpus is not None:
        mask = 0
        for g in gpus:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < 64:
                raise ValueError(f"gpus: device ordinals are ints from 0 to 63, got {g!r}")
            mask |= 1 << g
        o.gpus = mask
    o.sync_policy = _enum(sync, _SYNCS, "sync")
    for field, val in (
        ("capacity", capacity),
        ("max_payload_bytes", max_payload_bytes),
        ("slots", slots),
        ("slot_bytes", slot_bytes),
        ("mode", mode),
        ("threads", threads),
        ("client_spin_ns", client_spin_ns),
        ("server_spin_ns", server_spin_ns),
        ("gpu_memory_bytes", gpu_memory_bytes),
        ("rerank", rerank),
    ):
        if val is not None:
            setattr(o, field, val)
    if timeout is not None:
        o.timeout_ms = _ms(timeout, "timeout")
    if heartbeat_timeout is not None:
        o.heartbeat_timeout_ms = _ms(heartbeat_timeout, "heartbeat_timeout")
    if sync_interval is not None:
        o.sync_interval_ms = _ms(sync_interval, "sync_interval")
    o.ephemeral = 1 if ephemeral else 0
    dd = None
    if data_dir is not None:
        dd = os.fsencode(os.fspath(data_dir))
        o.data_dir = dd
    h = c_void_p(None)
    rc = _lib.kalos_open(name.encode("utf-8"), byref(o), byref(h))
    _check(rc)
    role_name = {v: k for k, v in _ROLES.items()}.get(role_v, str(role_v))
    assert h.value is not None
    try:
        return Kalos(h.value, name, role_name)
    except BaseException:
        _lib.kalos_close(h.value)
        raise

"""ctypes declarations of the Kalos C API (``include/kalos.h``).

This module is the only place that knows the C ABI. It is written by hand and checked against
``include/kalos.h`` by ``tests/test_header_drift.py``: every function prototype (return type and
each argument type), every struct layout (field names, types and order), every status code and
every ``KALOS_*`` constant used here must match the header exactly, so the binding cannot drift
silently from the C API.

Library discovery (first hit wins), see :func:`find_library`:

1. **``KALOS_LIBRARY``**: an explicit path to ``libkalos.so``; it overrides everything else.
2. **Bundled**: ``libkalos.so`` next to this file (the platform wheel, ``scripts/package.sh``).
3. **Cargo target directory** (a source install without a bundled library, for development):
   ``$CARGO_TARGET_DIR`` or the ``target/`` directory of the checkout that contains this package
   or the working directory, ``release`` before ``debug``.

The library is loaded with :class:`ctypes.CDLL`, which releases the GIL for the duration of each
foreign call, so a thread blocked in a recall never stalls other Python threads.
"""

from __future__ import annotations

import ctypes
import os
import sys
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

# --- constants (checked against include/kalos.h) ---------------------------------------------

KALOS_MAX_K = 1024
KALOS_MAX_FILTER_NAMESPACES = 64
KALOS_NO_PAYLOAD = 4294967295

KALOS_ROLE_AUTO = 0
KALOS_ROLE_SERVER = 1
KALOS_ROLE_CLIENT = 2

KALOS_METRIC_IP = 0
KALOS_METRIC_COSINE = 1
KALOS_METRIC_L2 = 2

KALOS_DTYPE_F32 = 0
KALOS_DTYPE_F16 = 1
KALOS_DTYPE_BF16 = 2

KALOS_BACKEND_AUTO = 0
KALOS_BACKEND_CPU = 1
KALOS_BACKEND_CUDA = 2

KALOS_SYNC_ALWAYS = 0
KALOS_SYNC_INTERVAL = 1
KALOS_SYNC_NEVER = 2

KALOS_OP_UNKNOWN = 0
KALOS_OP_RECALL = 1
KALOS_OP_UPSERT = 2
KALOS_OP_DELETE = 3
KALOS_OP_DELETE_NAMESPACE = 4
KALOS_OP_GET = 5
KALOS_OP_STATS = 6
KALOS_OP_CLEAR = 7
KALOS_OP_DELETE_WHERE = 8
KALOS_OP_LIST = 9

KALOS_SCAN_EXACT = 0
KALOS_SCAN_INT8 = 1
KALOS_RECALL_READ_YOUR_WRITES = 1
KALOS_RECALL_ALLOW_STALE = 2
KALOS_MAX_RERANK = 65536
KALOS_PLACEMENT_ID = 0
KALOS_PLACEMENT_NAMESPACE = 1
KALOS_MAX_DEVICE_SHARDS = 64
KALOS_GPUS_ALL = 0xFFFF_FFFF_FFFF_FFFF

#: Status codes: name (as in ``KALOS_<NAME>`` and ``kalos_status_str``) -> value.
STATUS_CODES = {
    "OK": 0,
    "INVALID_ARGUMENT": 1,
    "NULL_POINTER": 2,
    "DIMENSION_MISMATCH": 3,
    "K_OUT_OF_RANGE": 4,
    "NON_FINITE": 5,
    "INVALID_NAME": 6,
    "STORE_FULL": 7,
    "VERSION_MISMATCH": 8,
    "NOT_FOUND": 9,
    "ALREADY_EXISTS": 10,
    "TIMEOUT": 11,
    "SERVER_GONE": 12,
    "BUFFER_TOO_SMALL": 13,
    "PAYLOAD_TOO_LARGE": 14,
    "CORRUPT": 15,
    "IO": 16,
    "LOCKED": 17,
    "BACKEND_UNAVAILABLE": 18,
    "CUDA": 19,
    "PERMISSION_DENIED": 20,
    "TOO_LARGE": 21,
    "CLOSED": 22,
    "PANIC": 23,
    "INTERNAL": 24,
    "UNAVAILABLE": 25,
    "STALE": 26,
}

kalos_status = c_int32


# --- structs (checked against include/kalos.h) -----------------------------------------------


class kalos_options(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("role", c_uint32),
        ("dim", c_uint32),
        ("metric", c_uint32),
        ("dtype", c_uint32),
        ("backend", c_uint32),
        ("capacity", c_uint64),
        ("slots", c_uint32),
        ("slot_bytes", c_uint32),
        ("mode", c_uint32),
        ("max_payload_bytes", c_uint32),
        ("client_spin_ns", c_uint64),
        ("server_spin_ns", c_uint64),
        ("timeout_ms", c_uint64),
        ("heartbeat_timeout_ms", c_uint64),
        ("data_dir", c_char_p),
        ("sync_policy", c_uint32),
        ("threads", c_uint32),
        ("sync_interval_ms", c_uint64),
        ("gpu_memory_bytes", c_uint64),
        ("ephemeral", c_uint32),
        ("scan", c_uint32),
        ("rerank", c_uint32),
        ("device_shards", c_uint32),
        ("placement", c_uint32),
        ("gpus", c_uint64),
    ]


class kalos_recall_params(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("_reserved", c_uint32),
        ("namespaces", POINTER(c_uint64)),
        ("namespaces_len", c_size_t),
        ("recency_weight", c_float),
        ("_reserved2", c_uint32),
        ("recency_half_life_ms", c_double),
        ("timeout_ms", c_uint64),
        ("filter", POINTER(c_uint8)),
        ("filter_len", c_size_t),
        ("consistency", c_uint32),
        ("_reserved3", c_uint32),
        ("min_seqs", POINTER(c_uint64)),
        ("min_seqs_len", c_size_t),
    ]


class kalos_recall_args(Structure):
    """`kalos_recall`'s arguments in one struct (`kalos_recall_with`): the recall fast path's
    frame. Pointers are raw addresses (c_void_p)."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("k", c_uint32),
        ("handle", c_void_p),
        ("query", c_void_p),
        ("query_len", c_size_t),
        ("params", c_void_p),
        ("ids", c_void_p),
        ("ids_len", c_size_t),
        ("scores", c_void_p),
        ("scores_len", c_size_t),
        ("count", c_size_t),
    ]


class kalos_upsert_params(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("_reserved", c_uint32),
        ("namespace_id", c_uint64),
        ("namespaces", POINTER(c_uint64)),
        ("namespaces_len", c_size_t),
        ("payloads", POINTER(c_uint8)),
        ("payloads_len", c_size_t),
        ("payload_lens", POINTER(c_uint32)),
        ("payload_lens_len", c_size_t),
        ("ttl_ms", c_uint64),
        ("expires_at_ms", c_uint64),
        ("timeout_ms", c_uint64),
        ("fields", POINTER(c_uint8)),
        ("fields_len", c_size_t),
    ]


class kalos_list_params(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("has_after", c_uint32),
        ("after", c_uint64),
        ("namespaces", POINTER(c_uint64)),
        ("namespaces_len", c_size_t),
        ("filter", POINTER(c_uint8)),
        ("filter_len", c_size_t),
        ("timeout_ms", c_uint64),
    ]


class kalos_stats_info(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("engine", c_uint32),
        ("count", c_uint64),
        ("capacity", c_uint64),
        ("dim", c_uint32),
        ("metric", c_uint32),
        ("dtype", c_uint32),
        ("_reserved", c_uint32),
        ("requests", c_uint64),
        ("queries", c_uint64),
        ("batches", c_uint64),
        ("errors", c_uint64),
        ("p50_ns", c_uint64),
        ("p99_ns", c_uint64),
        ("queue_depth", c_uint64),
        ("server_pid", c_uint64),
        ("epoch", c_uint64),
        ("payload_bytes", c_uint64),
        ("uptime_ms", c_uint64),
        ("engine_fallbacks", c_uint64),
        ("engine_name", c_char * 48),
        ("fallback_reason", c_char * 256),
        ("rerank_queries", c_uint64),
        ("rerank_uncertain", c_uint64),
    ]


class kalos_op_count(Structure):
    _fields_ = [
        ("op", c_uint32),
        ("status", kalos_status),
        ("count", c_uint64),
    ]


class kalos_handle(Structure):
    """Opaque handle; only ever used through a pointer."""


kalos_handle_p = c_void_p  # `struct kalos_handle *` (opaque; kept as an integer address)

# Pointer arguments that carry numpy buffers are declared ``c_void_p`` so a raw integer address
# (``ndarray.ctypes.data``) passes with no conversion object: that is the zero-copy fast path.
# The header types they stand for are recorded in PROTOTYPES for the drift test.
_P = c_void_p

#: The ctypes type that carries each header C type; every other pointer is ``_P``.
_CTYPES: Dict[str, Any] = {
    "const char *": c_char_p,
    "kalos_status": kalos_status,
    "size_t": c_size_t,
    "uint32_t": c_uint32,
    "uint64_t": c_uint64,
    "struct kalos_handle *": kalos_handle_p,
    "const struct kalos_handle *": kalos_handle_p,
    "struct kalos_handle **": POINTER(c_void_p),
    "struct kalos_options *": POINTER(kalos_options),
    "const struct kalos_options *": POINTER(kalos_options),
    "struct kalos_recall_args *": POINTER(kalos_recall_args),
    "struct kalos_recall_params *": POINTER(kalos_recall_params),
    "struct kalos_upsert_params *": POINTER(kalos_upsert_params),
    "struct kalos_list_params *": POINTER(kalos_list_params),
    "struct kalos_stats_info *": POINTER(kalos_stats_info),
    "struct kalos_op_count *": POINTER(kalos_op_count),
}


def _sig(restype: Any, *params: str) -> Tuple[Any, List[Tuple[str, Any]]]:
    """(restype, [(header C type, ctypes type), ...]) of one function."""
    for c in params:
        if c not in _CTYPES and not c.endswith("*"):
            raise TypeError(f"no ctypes type for the C type {c!r}")
    return restype, [(c, _CTYPES.get(c, _P)) for c in params]


#: name -> (restype, [(header C type, ctypes type), ...]). The header C type strings are compared
#: with include/kalos.h by the drift test, and the ctypes type with the C type's size and kind.
PROTOTYPES: Dict[str, Tuple[Any, List[Tuple[str, Any]]]] = {
    "kalos_options_init": _sig(None, "struct kalos_options *", "size_t"),
    "kalos_recall_params_init": _sig(None, "struct kalos_recall_params *", "size_t"),
    "kalos_recall_args_init": _sig(None, "struct kalos_recall_args *", "size_t"),
    "kalos_recall_with": _sig(kalos_status, "struct kalos_recall_args *"),
    "kalos_upsert_params_init": _sig(None, "struct kalos_upsert_params *", "size_t"),
    "kalos_open": _sig(kalos_status,
        "const char *", "const struct kalos_options *", "struct kalos_handle **"),
    "kalos_close": _sig(None, "struct kalos_handle *"),
    "kalos_recall": _sig(kalos_status,
        "const struct kalos_handle *", "const float *", "size_t", "uint32_t",
        "const struct kalos_recall_params *", "uint64_t *", "size_t", "float *", "size_t", "size_t *"),
    "kalos_recall_batch": _sig(kalos_status,
        "const struct kalos_handle *", "const float *", "size_t", "size_t", "uint32_t",
        "const struct kalos_recall_params *", "uint64_t *", "size_t", "float *", "size_t", "size_t *",
        "size_t"),
    "kalos_recall_payloads": _sig(kalos_status,
        "const struct kalos_handle *", "const float *", "size_t", "uint32_t",
        "const struct kalos_recall_params *", "uint64_t *", "size_t", "float *", "size_t", "uint8_t *",
        "size_t", "uint32_t *", "size_t", "size_t *", "size_t *"),
    "kalos_upsert": _sig(kalos_status,
        "const struct kalos_handle *", "const uint64_t *", "size_t", "const float *", "size_t",
        "const struct kalos_upsert_params *"),
    "kalos_delete": _sig(kalos_status,
        "const struct kalos_handle *", "const uint64_t *", "size_t", "uint64_t *"),
    "kalos_delete_namespace": _sig(kalos_status, "const struct kalos_handle *", "uint64_t", "uint64_t *"),
    "kalos_clear": _sig(kalos_status, "const struct kalos_handle *", "uint64_t *"),
    "kalos_delete_where": _sig(kalos_status,
        "const struct kalos_handle *", "const uint64_t *", "size_t", "const uint8_t *", "size_t",
        "uint64_t *"),
    "kalos_get_fields": _sig(kalos_status,
        "const struct kalos_handle *", "const uint64_t *", "size_t", "uint8_t *", "size_t", "uint32_t *",
        "size_t", "size_t *"),
    "kalos_get": _sig(kalos_status,
        "const struct kalos_handle *", "const uint64_t *", "size_t", "float *", "size_t", "uint64_t *",
        "size_t", "uint8_t *", "size_t", "uint32_t *", "size_t", "size_t *"),
    "kalos_list_params_init": _sig(None, "struct kalos_list_params *", "size_t"),
    "kalos_list": _sig(kalos_status,
        "const struct kalos_handle *", "const struct kalos_list_params *", "uint64_t *", "size_t", "size_t *",
        "uint64_t *"),
    "kalos_stats": _sig(kalos_status, "const struct kalos_handle *", "struct kalos_stats_info *"),
    "kalos_stats_ops": (kalos_status, [
        ("const struct kalos_handle *", kalos_handle_p),
        ("struct kalos_op_count *", POINTER(kalos_op_count)),
        ("size_t", c_size_t),
        ("size_t *", POINTER(c_size_t)),
    ]),
    "kalos_op_name": _sig(c_char_p, "uint32_t"),
    "kalos_dim": _sig(kalos_status, "const struct kalos_handle *", "uint32_t *"),
    "kalos_recall_lag": _sig(kalos_status,
        "const struct kalos_handle *", "const float *", "size_t", "uint32_t",
        "const struct kalos_recall_params *", "uint64_t *", "size_t", "float *", "size_t", "size_t *",
        "uint64_t *", "uint64_t *"),
    "kalos_last_write_seqs": _sig(kalos_status, "const struct kalos_handle *", "uint64_t *", "size_t", "size_t *"),
    "kalos_status_str": _sig(c_char_p, "kalos_status"),
    "kalos_version": _sig(c_char_p),
    "kalos_last_error": _sig(c_char_p),
}

#: The header C type each restype stands for (for the drift test).
RESTYPE_C = {None: "void", kalos_status: "kalos_status", c_char_p: "const char *"}


# --- library discovery ------------------------------------------------------------------------

LIB_NAME = "libkalos.so" if sys.platform != "darwin" else "libkalos.dylib"


def candidate_paths() -> List[Path]:
    """Every place :func:`find_library` looks, in order (existing or not)."""
    here = Path(__file__).resolve().parent
    out: List[Path] = []
    env = os.environ.get("KALOS_LIBRARY")
    if env:
        out.append(Path(env))
    out.append(here / LIB_NAME)
    targets: List[Path] = []
    if os.environ.get("CARGO_TARGET_DIR"):
        targets.append(Path(os.environ["CARGO_TARGET_DIR"]))
    # bindings/python/kalos/_ffi.py -> repository root is three levels up; also walk up from the
    # working directory so an installed (non-editable) package still finds a checkout's target/.
    for base in [here, *here.parents, Path.cwd(), *Path.cwd().parents]:
        if (base / "Cargo.toml").is_file() and (base / "include" / "kalos.h").is_file():
            targets.append(base / "target")
            break
    for t in targets:
        out.append(t / "release" / LIB_NAME)
        out.append(t / "debug" / LIB_NAME)
    return out


def find_library() -> Path:
    """Returns the path of ``libkalos.so`` (see the module docstring for the order).

    ``KALOS_LIBRARY``, when set, must name an existing file: a typo there is an error rather
    than a silent fall back to another build.
    """
    env = os.environ.get("KALOS_LIBRARY")
    if env:
        p = Path(env)
        if not p.is_file():
            raise OSError(f"KALOS_LIBRARY={env!r} does not name an existing file")
        return p
    for p in candidate_paths():
        if p.is_file():
            return p
    raise OSError(
        "libkalos.so not found: this kalos package carries no native library (a source install). "
        "Looked in: "
        + ", ".join(str(p) for p in candidate_paths())
        + ". Install the platform wheel (scripts/package.sh builds it into dist/), set "
        "KALOS_LIBRARY=/path/to/libkalos.so, or run from a checkout after `cargo build --release`."
    )


def load(path: Optional[Path] = None) -> ctypes.CDLL:
    """Loads the library and declares argtypes/restype of every function in PROTOTYPES."""
    lib = ctypes.CDLL(str(path or find_library()))
    for name, (restype, args) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = [t for _, t in args]
    return lib


lib: ctypes.CDLL = load()
library_path: str = lib._name

#: The same library (dlopen returns the same instance) with no argtypes declared, for the
#: recall fast path in kalos/__init__.py, which passes ctypes objects of the prototype's exact
#: types. Only restype is set; the functions used this way are listed in RAW_FUNCTIONS.
lib_raw: ctypes.CDLL = ctypes.CDLL(library_path)
RAW_FUNCTIONS = ("kalos_recall_with",)
for _name in RAW_FUNCTIONS:
    getattr(lib_raw, _name).restype = PROTOTYPES[_name][0]

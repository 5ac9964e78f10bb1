"""The ctypes declarations and status codes must match include/kalos.h exactly."""

from __future__ import annotations

import ctypes
import re

import pytest

import kalos
from kalos import _ffi, errors

import os
from pathlib import Path

from conftest import HEADER

HEADER = Path(os.environ.get("KALOS_HEADER", HEADER))  # override to check another header

if not HEADER.is_file():  # an installed package without the source tree
    pytest.skip("include/kalos.h not found", allow_module_level=True)

TEXT = HEADER.read_text()
# Strip comments so prototypes and struct bodies parse cleanly.
CODE = re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", TEXT, flags=re.S))


_LIMITS = {"UINT32_MAX": 2**32 - 1, "UINT64_MAX": 2**64 - 1}


def header_defines() -> dict:
    """KALOS_* macros with an integer value."""
    out = {}
    for m in re.finditer(r"#define[ \t]+(KALOS_\w+)[ \t]+(\S+)", CODE):
        v = m[2]
        if v in _LIMITS:
            out[m[1]] = _LIMITS[v]
        elif re.fullmatch(r"-?\d+", v):
            out[m[1]] = int(v)
    return out


def header_status_enum() -> dict:
    """Status name (without the KALOS_ prefix) -> value, from the header's status enum (either
    `enum kalos_status_code { KALOS_OK = 0, ... }` or the older `typedef enum Status { OK = 0 }`)."""
    m = re.search(r"enum\s+(?:kalos_status_code|Status)\b[^{;]*\{(.*?)\}", CODE, re.S)
    assert m, "no status enum in kalos.h"
    return {e[1].removeprefix("KALOS_"): int(e[2]) for e in re.finditer(r"(\w+)\s*=\s*(\d+)", m[1])}


def norm(t: str) -> str:
    t = re.sub(r"\s+", " ", t.strip())
    return re.sub(r"\s*\*", " *", t).replace("* *", "**").strip()


def header_prototypes() -> dict:
    out = {}
    for m in re.finditer(r"(?:^|\n)\s*([A-Za-z_][\w ]*?\**)\s*\b(kalos_\w+)\s*\(([^)]*)\)\s*;", CODE):
        ret, name, args = norm(m[1]), m[2], m[3].strip()
        params = []
        if args and args != "void":
            for a in args.split(","):
                a = a.strip()
                pm = re.match(r"(.*?)(\w+)$", a, re.S)
                params.append(norm(pm[1]))
        out[name] = (ret, params)
    return out


def header_structs() -> dict:
    out = {}
    for m in re.finditer(r"typedef struct (kalos_\w+) \{(.*?)\} \1;", CODE, re.S):
        fields = []
        for line in m[2].split(";"):
            line = line.strip()
            if not line:
                continue
            fm = re.match(r"(.*?)(\w+)(?:\[(\d+)\])?$", line, re.S)
            fields.append((fm[2], norm(fm[1]), int(fm[3]) if fm[3] else None))
        out[m[1]] = fields
    return out


SCALARS = {
    "uint8_t": ctypes.c_uint8,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32,
    "size_t": ctypes.c_size_t,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "kalos_status": ctypes.c_int32,
    "char": ctypes.c_char,
}


def ctype_ok(c: str, t) -> bool:
    """Whether ctypes type t can stand for header C type c (same size and kind)."""
    if c.endswith("*"):
        base = c[:-1].replace("const", "").strip()
        if t is ctypes.c_void_p:
            return True  # raw address (numpy buffers, the opaque handle)
        if t is ctypes.c_char_p:
            return base == "char"
        if hasattr(t, "_type_") and issubclass(t, ctypes._Pointer):
            inner = t._type_
            if base.endswith("*"):
                return inner is ctypes.c_void_p
            if base.startswith("struct "):
                return getattr(inner, "__name__", "") == base.split()[1]
            return inner is SCALARS.get(base)
        return False
    return SCALARS.get(c) is t


def test_status_codes_match_header():
    defs = header_defines()
    enum = header_status_enum()
    assert enum == _ffi.STATUS_CODES, "kalos._ffi.STATUS_CODES differs from enum Status in kalos.h"
    for n, v in enum.items():
        if f"KALOS_{n}" in defs:  # older headers also #define every status
            assert defs[f"KALOS_{n}"] == v
        assert kalos.status_name(v) == n


def test_other_constants_match_header():
    defs = header_defines()
    for n, v in defs.items():
        if n[6:] in _ffi.STATUS_CODES:
            continue
        assert hasattr(_ffi, n), f"{n} is in kalos.h but not in kalos._ffi"
        assert getattr(_ffi, n) == v, n


def test_error_class_per_status():
    for n, v in header_status_enum().items():
        if v == 0:
            assert v not in errors.ERRORS_BY_STATUS
            continue
        cls = errors.ERRORS_BY_STATUS[v]
        assert cls.status == v and cls.status_name == n
        assert issubclass(cls, kalos.KalosError)
        assert getattr(kalos, cls.__name__) is cls
        e = errors.error_for(v, f"{n}: x")
        assert type(e) is cls and e.status == v and str(e) == f"{n}: x"
    assert len(set(errors.ERRORS_BY_STATUS.values())) == len(header_status_enum()) - 1
    assert type(errors.error_for(999, "")) is kalos.KalosError


def test_prototypes_match_header():
    protos = header_prototypes()
    assert set(protos) == set(_ffi.PROTOTYPES), "functions differ between kalos.h and kalos._ffi"
    for name, (ret, params) in protos.items():
        restype, args = _ffi.PROTOTYPES[name]
        assert _ffi.RESTYPE_C[restype] == ret, name
        assert [c for c, _ in args] == params, f"{name}: argument types differ from kalos.h"
        for c, t in args:
            assert ctype_ok(c, t), f"{name}: ctypes {t} cannot carry {c}"
        fn = getattr(_ffi.lib, name)
        assert fn.argtypes == [t for _, t in args] and len(fn.argtypes) == len(params)
        assert fn.restype is restype


def test_structs_match_header():
    structs = header_structs()
    for cname in ("kalos_options", "kalos_recall_params", "kalos_recall_args", "kalos_upsert_params", "kalos_stats_info"):
        py = getattr(_ffi, cname)
        hf = structs[cname]
        assert [f[0] for f in py._fields_] == [f[0] for f in hf], cname
        for (fname, ftype), (_, ctype, arr) in zip(py._fields_, hf):
            if arr is not None:
                assert ftype._length_ == arr and ftype._type_ is SCALARS[ctype], (cname, fname)
            else:
                assert ctype_ok(ctype, ftype), (cname, fname, ctype, ftype)


def test_struct_sizes_match_library():
    for cls, init in (
        (_ffi.kalos_options, _ffi.lib.kalos_options_init),
        (_ffi.kalos_recall_params, _ffi.lib.kalos_recall_params_init),
        (_ffi.kalos_recall_args, _ffi.lib.kalos_recall_args_init),
        (_ffi.kalos_upsert_params, _ffi.lib.kalos_upsert_params_init),
    ):
        s = cls()
        init(ctypes.byref(s), ctypes.sizeof(s))
        assert s.struct_size == ctypes.sizeof(cls), cls.__name__


def test_version():
    assert re.match(r"\d+\.\d+\.\d+", kalos.version())


def test_fast_path_frame_matches_prototype():
    """The recall fast path calls kalos_recall_with without argtypes: its one argument must be a
    c_void_p holding the address of a kalos_recall_args struct (whose layout
    test_structs_match_header checks), filled in by kalos_recall_args_init."""
    _, args = _ffi.PROTOTYPES["kalos_recall_with"]
    assert [c for c, _ in args] == ["struct kalos_recall_args *"]
    frame = kalos._Frame(12345)
    assert type(frame.a) is _ffi.kalos_recall_args and type(frame.ap) is ctypes.c_void_p
    assert frame.ap.value == ctypes.addressof(frame.a)
    a = frame.a
    assert a.struct_size == ctypes.sizeof(_ffi.kalos_recall_args)
    assert a.handle == 12345 and not a.params and a.count == 0
    assert a.ids == frame.ids.ctypes.data and a.ids_len == len(frame.ids) == kalos.KALOS_MAX_K
    assert a.scores == frame.scores.ctypes.data and a.scores_len == len(frame.scores)
    for name in _ffi.RAW_FUNCTIONS:
        assert getattr(_ffi.lib_raw, name).restype is _ffi.PROTOTYPES[name][0]
        assert getattr(_ffi.lib_raw, name).argtypes is None


def test_fast_path_call_passes_prototype_types(monkeypatch):
    """What the ctypes fast path really hands to kalos_recall_with: the frame's c_void_p, with
    the query's data pointer, its length and k stored in the struct it points to (the C
    extension's frame: test_fastcall.py)."""
    import numpy as np
    from conftest import unique_name

    monkeypatch.setattr(kalos, "_FASTCALL", None)
    calls = []
    real = kalos._recall_with_raw

    def spy(*a):
        st = _ffi.kalos_recall_args.from_address(a[0].value)
        calls.append((a, st.query, st.query_len, st.k))
        return real(*a)

    monkeypatch.setattr(kalos, "_recall_with_raw", spy)
    q = np.ones(8, np.float32)
    q2 = np.full(8, 2, np.float32)
    with kalos.open(unique_name("frame"), dim=8, role="server") as kv:
        kv.upsert([1], q)
        assert kv.recall(q, k=3)[0].tolist() == [1]
        assert kv.recall(q2, k=5)[0].tolist() == [1]
        frame = kv._tls.frame
    (p1, qa1, n1, k1), (p2, qa2, n2, k2) = calls
    assert len(p1) == 1 and p1[0] is frame.ap and p2[0] is frame.ap
    assert (qa1, n1, k1) == (q.ctypes.data, 8, 3)
    assert (qa2, n2, k2) == (q2.ctypes.data, 8, 5)


def test_gpu_test_wrapper_structs_are_prefixes_of_the_header_layout():
    """tests/gpu/kalos_ct.py declares its own ctypes structs (it runs on the GPU machine without
    the package). Each must be the header's layout or an older prefix of it: same fields at the
    same offsets with the same sizes, so that the library writes only within it."""
    path = HEADER.parent.parent / "tests" / "gpu" / "kalos_ct.py"
    if not path.is_file():
        pytest.skip("tests/gpu/kalos_ct.py not found")
    import importlib.util

    spec = importlib.util.spec_from_file_location("kalos_ct", path)
    ct = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ct)
    pairs = [
        (ct.Options, _ffi.kalos_options),
        (ct.RecallParams, _ffi.kalos_recall_params),
        (ct.UpsertParams, _ffi.kalos_upsert_params),
        (ct.StatsInfo, _ffi.kalos_stats_info),
    ]
    for mine, lib in pairs:
        assert len(mine._fields_) <= len(lib._fields_), mine.__name__
        for (name, ftype), (lname, ltype) in zip(mine._fields_, lib._fields_):
            where = (mine.__name__, name, lname)
            assert getattr(mine, name).offset == getattr(lib, lname).offset, where
            assert ctypes.sizeof(ftype) == ctypes.sizeof(ltype), where
            assert name.lstrip("_") == lname.lstrip("_"), where

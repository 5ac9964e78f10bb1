"""Minimal self-contained ctypes binding of include/kalos.h for the GPU checks and benchmark.

(The real Python binding lives in bindings/python; this file has no dependency on it so the GPU
scripts run from a bare copy: libkalos.so + these scripts + numpy.)
"""
import ctypes as C
import os

import numpy as np

ROLE_AUTO, ROLE_SERVER, ROLE_CLIENT = 0, 1, 2
IP, COSINE, L2 = 0, 1, 2
F32, F16, BF16 = 0, 1, 2
AUTO, CPU, CUDA = 0, 1, 2
STORE_FULL = 7
BACKEND_UNAVAILABLE = 18
INVALID_ARGUMENT = 1
GPUS_ALL = (1 << 64) - 1
PLACEMENT_ID, PLACEMENT_NAMESPACE = 0, 1


class Options(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("role", C.c_uint32), ("dim", C.c_uint32), ("metric", C.c_uint32),
        ("dtype", C.c_uint32), ("backend", C.c_uint32), ("capacity", C.c_uint64), ("slots", C.c_uint32),
        ("slot_bytes", C.c_uint32), ("mode", C.c_uint32), ("max_payload_bytes", C.c_uint32),
        ("client_spin_ns", C.c_uint64), ("server_spin_ns", C.c_uint64), ("timeout_ms", C.c_uint64),
        ("heartbeat_timeout_ms", C.c_uint64), ("data_dir", C.c_char_p), ("sync_policy", C.c_uint32),
        ("threads", C.c_uint32), ("sync_interval_ms", C.c_uint64), ("gpu_memory_bytes", C.c_uint64),
        ("ephemeral", C.c_uint32), ("scan", C.c_uint32), ("rerank", C.c_uint32),
        ("device_shards", C.c_uint32), ("placement", C.c_uint32), ("gpus", C.c_uint64),
    ]


class RecallParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("_reserved", C.c_uint32), ("namespaces", C.POINTER(C.c_uint64)),
        ("namespaces_len", C.c_size_t), ("recency_weight", C.c_float), ("_reserved2", C.c_uint32),
        ("recency_half_life_ms", C.c_double), ("timeout_ms", C.c_uint64),
        ("filter", C.POINTER(C.c_uint8)), ("filter_len", C.c_size_t),
    ]


class UpsertParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("_reserved", C.c_uint32), ("namespace_id", C.c_uint64),
        ("namespaces", C.POINTER(C.c_uint64)), ("namespaces_len", C.c_size_t),
        ("payloads", C.POINTER(C.c_uint8)), ("payloads_len", C.c_size_t),
        ("payload_lens", C.POINTER(C.c_uint32)), ("payload_lens_len", C.c_size_t),
        ("ttl_ms", C.c_uint64), ("expires_at_ms", C.c_uint64), ("timeout_ms", C.c_uint64),
        ("fields", C.POINTER(C.c_uint8)), ("fields_len", C.c_size_t),
    ]


class StatsInfo(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("engine", C.c_uint32), ("count", C.c_uint64), ("capacity", C.c_uint64),
        ("dim", C.c_uint32), ("metric", C.c_uint32), ("dtype", C.c_uint32), ("_reserved", C.c_uint32),
        ("requests", C.c_uint64), ("queries", C.c_uint64), ("batches", C.c_uint64), ("errors", C.c_uint64),
        ("p50_ns", C.c_uint64), ("p99_ns", C.c_uint64), ("queue_depth", C.c_uint64), ("server_pid", C.c_uint64),
        ("epoch", C.c_uint64), ("payload_bytes", C.c_uint64), ("uptime_ms", C.c_uint64),
        ("engine_fallbacks", C.c_uint64), ("engine_name", C.c_char * 48), ("fallback_reason", C.c_char * 256),
        ("rerank_queries", C.c_uint64), ("rerank_uncertain", C.c_uint64),
    ]


def load(path=None):
    path = path or os.environ.get("KALOS_LIB") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkalos.so")
    lib = C.CDLL(path)
    P = C.c_void_p
    lib.kalos_open.argtypes = [C.c_char_p, C.POINTER(Options), C.POINTER(P)]
    lib.kalos_close.argtypes = [P]
    lib.kalos_options_init.argtypes = [C.POINTER(Options), C.c_size_t]
    lib.kalos_recall_params_init.argtypes = [C.POINTER(RecallParams), C.c_size_t]
    lib.kalos_upsert_params_init.argtypes = [C.POINTER(UpsertParams), C.c_size_t]
    lib.kalos_recall.argtypes = [P, P, C.c_size_t, C.c_uint32, C.POINTER(RecallParams), P, C.c_size_t, P, C.c_size_t, C.POINTER(C.c_size_t)]
    lib.kalos_recall_batch.argtypes = [P, P, C.c_size_t, C.c_size_t, C.c_uint32, C.POINTER(RecallParams), P, C.c_size_t, P, C.c_size_t, P, C.c_size_t]
    lib.kalos_upsert.argtypes = [P, P, C.c_size_t, P, C.c_size_t, C.POINTER(UpsertParams)]
    lib.kalos_delete.argtypes = [P, P, C.c_size_t, C.POINTER(C.c_uint64)]
    lib.kalos_stats.argtypes = [P, C.POINTER(StatsInfo)]
    lib.kalos_last_error.restype = C.c_char_p
    lib.kalos_status_str.restype = C.c_char_p
    for f in ["kalos_open", "kalos_recall", "kalos_recall_batch", "kalos_upsert", "kalos_delete", "kalos_stats"]:
        getattr(lib, f).restype = C.c_int32
    return lib


class KalosError(Exception):
    def __init__(self, status, msg):
        super().__init__("%d %s" % (status, msg))
        self.status = status


class Store:
    def __init__(self, lib, name, dim=0, metric=COSINE, dtype=F32, backend=CUDA, role=ROLE_SERVER,
                 capacity=1 << 20, slots=32, slot_bytes=1 << 22, gpu_memory_bytes=0, server_spin_ns=2_000_000,
                 client_spin_ns=200_000, timeout_ms=60_000, scan=0, rerank=0, device_shards=0, placement=0, gpus=0):
        self.lib = lib
        o = Options()
        lib.kalos_options_init(C.byref(o), C.sizeof(o))
        o.role, o.dim, o.metric, o.dtype, o.backend = role, dim, metric, dtype, backend
        o.capacity, o.slots, o.slot_bytes, o.gpu_memory_bytes = capacity, slots, slot_bytes, gpu_memory_bytes
        o.server_spin_ns, o.client_spin_ns, o.timeout_ms = server_spin_ns, client_spin_ns, timeout_ms
        o.scan, o.rerank = scan, rerank
        o.device_shards, o.placement, o.gpus = device_shards, placement, gpus
        o.max_payload_bytes = min(o.max_payload_bytes, slot_bytes // 2)
        h = C.c_void_p()
        self._check(lib.kalos_open(name.encode(), C.byref(o), C.byref(h)))
        self.h = h
        self.dim = dim
        self._ids = None

    def _check(self, st):
        if st != 0:
            raise KalosError(st, self.lib.kalos_last_error().decode(errors="replace"))

    def close(self):
        if self.h:
            self.lib.kalos_close(self.h)
            self.h = None

    def upsert(self, ids, vecs, namespaces=None, ttl_ms=0, fields=None):
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        p = UpsertParams()
        self.lib.kalos_upsert_params_init(C.byref(p), C.sizeof(p))
        keep = None
        if namespaces is not None:
            keep = np.ascontiguousarray(namespaces, dtype=np.uint64)
            p.namespaces = keep.ctypes.data_as(C.POINTER(C.c_uint64))
            p.namespaces_len = len(keep)
        p.ttl_ms = ttl_ms
        if fields is not None:  # a fields block (docs/FORMATS.md)
            fbuf = (C.c_uint8 * len(fields)).from_buffer_copy(fields)
            p.fields, p.fields_len = C.cast(fbuf, C.POINTER(C.c_uint8)), len(fields)
        self._check(self.lib.kalos_upsert(self.h, ids.ctypes.data, len(ids), vecs.ctypes.data, vecs.size, C.byref(p)))

    def upsert_all(self, ids, vecs, namespaces=None, batch=None):
        dim = vecs.shape[1]
        batch = batch or max(1, (self.slot_rows_hint or 4096))
        for s in range(0, len(ids), batch):
            self.upsert(ids[s:s + batch], vecs[s:s + batch], None if namespaces is None else namespaces[s:s + batch])

    slot_rows_hint = None

    def delete(self, ids):
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        d = C.c_uint64()
        self._check(self.lib.kalos_delete(self.h, ids.ctypes.data, len(ids), C.byref(d)))
        return d.value

    def _params(self, namespaces, recency, filter=None):
        if namespaces is None and recency is None and filter is None:
            return None, None
        p = RecallParams()
        self.lib.kalos_recall_params_init(C.byref(p), C.sizeof(p))
        keep = None
        if filter is not None:  # a filter expression's binary form
            fbuf = (C.c_uint8 * len(filter)).from_buffer_copy(filter)
            p.filter, p.filter_len = C.cast(fbuf, C.POINTER(C.c_uint8)), len(filter)
            keep = [fbuf]
        if namespaces is not None:
            nsa = np.ascontiguousarray(namespaces, dtype=np.uint64)
            keep = [keep, nsa]
            p.namespaces = nsa.ctypes.data_as(C.POINTER(C.c_uint64))
            p.namespaces_len = len(nsa)
        if recency is not None:
            p.recency_weight, p.recency_half_life_ms = recency
        return p, keep

    def recall(self, q, k, namespaces=None, recency=None, filter=None):
        q = np.ascontiguousarray(q, dtype=np.float32)
        ids = np.empty(k, dtype=np.uint64)
        sc = np.empty(k, dtype=np.float32)
        cnt = C.c_size_t()
        p, keep = self._params(namespaces, recency, filter)
        self._check(self.lib.kalos_recall(self.h, q.ctypes.data, q.size, k, C.byref(p) if p else None,
                                          ids.ctypes.data, k, sc.ctypes.data, k, C.byref(cnt)))
        return ids[:cnt.value], sc[:cnt.value]

    def recall_batch(self, qs, k, namespaces=None, recency=None, filter=None):
        qs = np.ascontiguousarray(qs, dtype=np.float32)
        nq = qs.shape[0]
        ids = np.empty(nq * k, dtype=np.uint64)
        sc = np.empty(nq * k, dtype=np.float32)
        cnt = np.empty(nq, dtype=np.uintp)
        p, keep = self._params(namespaces, recency, filter)
        self._check(self.lib.kalos_recall_batch(self.h, qs.ctypes.data, qs.size, nq, k, C.byref(p) if p else None,
                                                ids.ctypes.data, nq * k, sc.ctypes.data, nq * k, cnt.ctypes.data, nq))
        return [(ids[i * k:i * k + cnt[i]], sc[i * k:i * k + cnt[i]]) for i in range(nq)]

    def stats(self):
        s = StatsInfo()
        s.struct_size = C.sizeof(StatsInfo)
        self._check(self.lib.kalos_stats(self.h, C.byref(s)))
        return s

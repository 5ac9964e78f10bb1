/* kalos._fastcall: the recall fast path of kalos.Kalos.recall in C.
 *
 * One call of a Frame does what the Python fast path does with several bytecodes and a ctypes
 * call: check the query, store its pointer, length and k in the thread's kalos_recall_args
 * struct, enter the handle's close guard, call kalos_recall_with with the GIL released, and
 * copy the first `count` ids and scores out of the frame's result buffers into two arrays
 * made by numpy.empty (with the (count, dtype) arguments kept from the last call with the same
 * count: cheaper than ndarray.copy() of views).
 *
 * Built against the stable ABI (Py_LIMITED_API 3.9: one build serves CPython 3.9+) with no
 * numpy headers and no link to libkalos.so: kalos/__init__.py hands each Frame the address of
 * kalos_recall_with (from ctypes), the offsets of the struct's fields (from the ctypes struct
 * that tests/test_header_drift.py checks against include/kalos.h), the ndarray type, the
 * float32 dtype and numpy.empty. Arrays are read and written through their ndarray header (the
 * layout numpy's own PyArray_DATA/NDIM/DIMS/DESCR/FLAGS accessors read); kalos/_fastpath.py
 * verifies that layout with probe() at import and uses the ctypes path when it does not hold.
 *
 * Frame(owner, query, k[, namespaces, filter[, recency_weight, half_life[, timeout]]]) scopes
 * the recall through the frame's own kalos_recall_params (owned by `keep`, like the args
 * struct):
 *   namespaces      None, an int in 0..2^64-1 (one namespace) or a list or tuple of 1 to ns_cap
 *                   such ints, copied into the frame's namespace buffer;
 *   filter          None or a bytes object (a filter expression's binary form, borrowed for the
 *                   call; the library validates it);
 *   recency_weight  a float or an int, 0 for none (then half_life is not read), else stored as
 *                   the struct's float with half_life (None, a float or an int: seconds) in ms,
 *                   as kalos/__init__.py's general path does; the library validates both;
 *   timeout         None (the handle's default) or seconds as a float or an int, stored in ms
 *                   as kalos/__init__.py's _ms does (rounded half to even, at least 1 ms when
 *                   positive).
 * The args struct's `params` points at that struct for a scoped call and is NULL otherwise.
 *
 * Frame.payloads(...) takes the same arguments and makes the call through
 * kalos_recall_payloads (the handle, query, k and params of the same struct; the frame's result
 * buffers; a payload buffer and one length per hit of its own), returning (ids, scores,
 * payloads) with payloads a list of bytes, None for a hit stored without one; otherwise as
 * below.
 *
 * A call returns:
 *   (ids, scores)  fresh uint64 and float32 arrays of the hits (copies, never the buffers);
 *   None           the call does not qualify: query not an exact ndarray of the float32 dtype,
 *                  1-D, C-contiguous and 4-byte aligned; k not an int in 1..max_k; namespaces
 *                  not None, an int in 0..2^64-1 (exactly int) or an exact list or tuple of 1
 *                  to ns_cap of them; filter not None or exactly bytes; recency_weight not
 *                  exactly a float or an int, or half_life (read when the weight is not 0) not
 *                  None or exactly a float or an int, or too large for a double; timeout not
 *                  None or a non-negative float or int below 2^53 ms (NaN, negative and other
 *                  values raise or convert on the general path); or the frame is in use by
 *                  a call further up this thread's stack (a finalizer or signal handler run
 *                  during the copy-out). The caller takes its general path;
 *   -1             the owner is closing (its `_closing` is true): nothing was called;
 *   a status > 0   kalos_recall_with failed with it (the library's message is in
 *                  kalos_last_error() of this thread).
 *
 * Close guard, as in kalos/__init__.py: the call appends to owner._active, then reads
 * owner._closing; Kalos.close() sets _closing, then waits for _active to empty. Both happen
 * under the GIL, so either the call sees _closing or close() sees the call.
 *
 * Threads: a Frame belongs to one thread (kalos/__init__.py keeps one per thread and handle);
 * the GIL is released only around kalos_recall_with, which may block up to its timeout.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int32_t (*recall_with_fn)(void *args);
typedef int32_t (*recall_payloads_fn)(const void *h, const float *query, size_t query_len, uint32_t k,
                                      const void *params, uint64_t *ids, size_t ids_len, float *scores,
                                      size_t scores_len, uint8_t *buf, size_t buf_len, uint32_t *lens,
                                      size_t lens_len, size_t *count, size_t *needed);

/* The leading fields of numpy's PyArrayObject_fields (numpy/ndarraytypes.h), unchanged since
 * numpy 1.7 and in numpy 2. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} np_fields;

#define NPY_C_CONTIGUOUS 0x0001
/* A frame's first payload buffer (the general path's per-thread scratch starts at the same). */
#define PBUF_START (64 * 1024)
/* Calls of payloads() that find the buffer too small (the table changing between calls) before
 * it gives up, as the general path does. */
#define PAYLOAD_TRIES 8

typedef struct {
    PyObject_HEAD
    PyObject *keep;     /* owns the kalos_recall_args memory (the ctypes struct) */
    char *args;         /* its address */
    recall_with_fn fn;  /* kalos_recall_with */
    Py_ssize_t off_query, off_query_len, off_k, off_count, off_params;
    char *params;       /* the frame's kalos_recall_params */
    uint64_t *ns;       /* the namespace buffer its `namespaces` points at in a call with some */
    Py_ssize_t ns_cap;  /* its length */
    /* offsets into the params struct */
    Py_ssize_t off_ns, off_ns_len, off_filter, off_filter_len, off_rw, off_hl, off_to;
    PyObject *nd_type;  /* numpy.ndarray */
    PyObject *f32;      /* numpy.dtype(numpy.float32) */
    PyObject *empty;    /* numpy.empty */
    PyObject *ids;      /* uint64 result buffer of cap entries, the struct's ids */
    PyObject *scores;   /* float32 result buffer of cap entries, the struct's scores */
    PyObject *ids_new;  /* (c, ids.dtype) and (c, scores.dtype) for the last count c */
    PyObject *scores_new;
    Py_ssize_t c;
    Py_ssize_t cap;     /* the buffers' length: the largest k and count */
    int busy;
    /* payloads(): kalos_recall_payloads, the args struct's handle field, the payload buffer
     * (grown when the library asks for more) and one length per hit (cap entries) */
    recall_payloads_fn payloads_fn;
    Py_ssize_t off_handle;
    uint8_t *pbuf;
    size_t pcap;
    uint32_t *lens;
    int32_t too_small;  /* KALOS_BUFFER_TOO_SMALL */
} Frame;

static PyObject *str_active, *str_closing;

static void frame_dealloc(PyObject *self) {
    Frame *f = (Frame *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(f->keep);
    Py_XDECREF(f->nd_type);
    Py_XDECREF(f->f32);
    Py_XDECREF(f->empty);
    Py_XDECREF(f->ids);
    Py_XDECREF(f->scores);
    Py_XDECREF(f->ids_new);
    Py_XDECREF(f->scores_new);
    PyMem_Free(f->pbuf);
    PyMem_Free(f->lens);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* (count, dtype of buf): the arguments of numpy.empty for a copy of count entries of buf. */
static PyObject *empty_args(PyObject *buf, Py_ssize_t count) {
    return Py_BuildValue("(nO)", count, ((np_fields *)buf)->descr);
}

/* Frame(keep, args_addr, fn_addr, off_query, off_query_len, off_k, off_count, ids, scores,
 *       cap, ndarray, float32_dtype, numpy_empty, off_params, params_addr, ns_addr, ns_cap,
 *       off_ns, off_ns_len, off_filter, off_filter_len, off_rw, off_hl, off_to, payloads_addr,
 *       off_handle, too_small): ids and
 *       scores are C-contiguous ndarrays of cap uint64 and float32 entries, the buffers the
 *       struct points to;
 *       params_addr is an initialised kalos_recall_params, ns_addr the address of ns_cap
 *       uint64s (8-aligned), payloads_addr the address of kalos_recall_payloads,
 *       off_handle the offset of the args struct's handle and too_small the value of
 *       KALOS_BUFFER_TOO_SMALL (for payloads()). */
static PyObject *frame_new(PyTypeObject *tp, PyObject *a, PyObject *kw) {
    PyObject *keep, *args_addr, *fn_addr, *ids, *scores, *nd_type, *f32, *empty, *params_addr, *ns_addr, *pl_addr;
    Py_ssize_t oq, oql, ok, oc, cap, op, nsc, on, onl, of, ofl, orw, ohl, oto, oh;
    int too_small;
    if (kw && PyObject_Length(kw) > 0) {
        PyErr_SetString(PyExc_TypeError, "Frame() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(a, "OOOnnnnOOnOOOnOOnnnnnnnnOni:Frame", &keep, &args_addr, &fn_addr, &oq, &oql, &ok, &oc,
                          &ids, &scores, &cap, &nd_type, &f32, &empty, &op, &params_addr, &ns_addr, &nsc, &on,
                          &onl, &of, &ofl, &orw, &ohl, &oto, &pl_addr, &oh, &too_small))
        return NULL;
    if ((PyObject *)Py_TYPE(ids) != nd_type || (PyObject *)Py_TYPE(scores) != nd_type) {
        PyErr_SetString(PyExc_TypeError, "Frame: ids and scores must be ndarrays");
        return NULL;
    }
    void *args = PyLong_AsVoidPtr(args_addr);
    if (!args && PyErr_Occurred()) return NULL;
    void *fn = PyLong_AsVoidPtr(fn_addr);
    if (!fn && PyErr_Occurred()) return NULL;
    void *params = PyLong_AsVoidPtr(params_addr);
    if (!params && PyErr_Occurred()) return NULL;
    void *ns = PyLong_AsVoidPtr(ns_addr);
    if (!ns && PyErr_Occurred()) return NULL;
    void *pl = PyLong_AsVoidPtr(pl_addr);
    if (!pl && PyErr_Occurred()) return NULL;
    if (!args || !fn || !params || !ns || !pl || oq < 0 || oql < 0 || ok < 0 || oc < 0 || op < 0 || on < 0 ||
        onl < 0 || of < 0 || ofl < 0 || orw < 0 || ohl < 0 || oto < 0 || oh < 0 || cap <= 0 || nsc <= 0 ||
        ((uintptr_t)ns & 7u)) {
        PyErr_SetString(PyExc_ValueError, "Frame: null or misaligned address, negative offset or empty buffers");
        return NULL;
    }
    PyObject *ids_new = empty_args(ids, 0);
    if (!ids_new) return NULL;
    PyObject *scores_new = empty_args(scores, 0);
    if (!scores_new) {
        Py_DECREF(ids_new);
        return NULL;
    }
    uint32_t *lens = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
    uint8_t *pbuf = PyMem_Malloc(PBUF_START);
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    Frame *f = (lens && pbuf) ? (Frame *)alloc(tp, 0) : NULL;
    if (!f) {
        PyMem_Free(lens);
        PyMem_Free(pbuf);
        Py_DECREF(ids_new);
        Py_DECREF(scores_new);
        return (lens && pbuf) ? NULL : PyErr_NoMemory();
    }
    Py_INCREF(keep);
    Py_INCREF(nd_type);
    Py_INCREF(f32);
    Py_INCREF(empty);
    Py_INCREF(ids);
    Py_INCREF(scores);
    f->keep = keep;
    f->args = (char *)args;
    /* A data pointer converted to a function pointer: POSIX guarantees they have the same
     * representation (dlsym returns functions as void *). */
    f->fn = (recall_with_fn)fn;
    f->off_query = oq;
    f->off_query_len = oql;
    f->off_k = ok;
    f->off_count = oc;
    f->off_params = op;
    f->params = (char *)params;
    f->ns = (uint64_t *)ns;
    f->ns_cap = nsc;
    f->off_ns = on;
    f->off_ns_len = onl;
    f->off_filter = of;
    f->off_filter_len = ofl;
    f->off_rw = orw;
    f->off_hl = ohl;
    f->off_to = oto;
    f->nd_type = nd_type;
    f->f32 = f32;
    f->empty = empty;
    f->ids = ids;
    f->scores = scores;
    f->ids_new = ids_new;
    f->scores_new = scores_new;
    f->c = 0;
    f->cap = cap;
    f->busy = 0;
    f->payloads_fn = (recall_payloads_fn)pl; /* a function's address, as fn above */
    f->off_handle = oh;
    f->pbuf = pbuf;
    f->pcap = PBUF_START;
    f->lens = lens;
    f->too_small = (int32_t)too_small;
    return (PyObject *)f;
}

/* Removes the entry this call appended to owner._active (list.pop() in Python). */
static void active_pop(PyObject *active) {
    Py_ssize_t n = PyList_Size(active);
    if (n > 0 && PyList_SetSlice(active, n - 1, n, NULL) == 0) return;
    PyErr_Clear(); /* not reached: the list holds at least this call's entry */
}

/* *out = o as a double when o is exactly a float or an int a double holds (returns 1); else 0,
 * with no exception set (bools, numpy scalars, ints beyond a double's range). */
static int exact_number(PyObject *o, double *out) {
    if (PyFloat_CheckExact(o)) {
        *out = PyFloat_AsDouble(o);
        return 1;
    }
    if (!PyLong_CheckExact(o)) return 0;
    *out = PyLong_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* What prepare() hands the call: the query, k and owner._active holding this call's entry. */
typedef struct {
    np_fields *q;
    long long k;
    PyObject *active; /* a new reference */
} Prepared;

/* Checks a call's arguments `a` (owner, query, k[, namespaces, filter[, recency_weight,
 * half_life[, timeout]]]) and readies the frame: returns 1 with the args struct (and the params
 * struct of a scoped call) filled, the frame busy and this call's entry appended to
 * owner._active; 0 with *ret set when the call does not qualify (None) or the owner is closing
 * (-1); -1 with an exception set. */
static int prepare(Frame *f, PyObject *a, Prepared *p, PyObject **ret) {
    Py_ssize_t na = PyTuple_Size(a);
    if (na != 3 && na != 5 && na != 7 && na != 8) {
        PyErr_SetString(PyExc_TypeError, "a Frame call takes (owner, query, k[, namespaces, filter"
                                         "[, recency_weight, half_life[, timeout]]])");
        return -1;
    }
    PyObject *owner = PyTuple_GetItem(a, 0);
    PyObject *query = PyTuple_GetItem(a, 1);
    PyObject *kobj = PyTuple_GetItem(a, 2);
    PyObject *nsobj = na >= 5 ? PyTuple_GetItem(a, 3) : Py_None;
    PyObject *fobj = na >= 5 ? PyTuple_GetItem(a, 4) : Py_None;
    PyObject *wobj = na >= 7 ? PyTuple_GetItem(a, 5) : NULL;
    PyObject *hobj = na >= 7 ? PyTuple_GetItem(a, 6) : NULL;
    PyObject *tobj = na == 8 ? PyTuple_GetItem(a, 7) : Py_None;
    *ret = NULL;
    if (f->busy || (PyObject *)Py_TYPE(query) != f->nd_type) goto pass;
    /* Scope: exactly ints in range and exactly bytes, else the general path (which raises the
     * errors or converts the int-likes, sequences and buffers it accepts). The namespaces go
     * into the frame's buffer, not in use by anyone else: the frame is not busy. */
    Py_ssize_t nns = 0;
    if (nsobj != Py_None) {
        int is_list = PyList_CheckExact(nsobj), is_tuple = PyTuple_CheckExact(nsobj);
        if (PyLong_CheckExact(nsobj)) {
            nns = 1;
        } else if (is_list || is_tuple) {
            nns = is_list ? PyList_Size(nsobj) : PyTuple_Size(nsobj);
            if (nns < 1 || nns > f->ns_cap) goto pass;
        } else {
            goto pass;
        }
        for (Py_ssize_t i = 0; i < nns; i++) {
            PyObject *v = is_list ? PyList_GetItem(nsobj, i) : is_tuple ? PyTuple_GetItem(nsobj, i) : nsobj;
            if (!v || !PyLong_CheckExact(v)) {
                PyErr_Clear();
                goto pass;
            }
            unsigned long long x = PyLong_AsUnsignedLongLong(v);
            if (x == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                goto pass;
            }
            f->ns[i] = (uint64_t)x;
        }
    }
    /* Recency: the general path's `if recency_weight:` then `(half_life or 0.0) * 1000.0`. */
    double w = 0.0, hl_ms = 0.0;
    if (wobj) {
        if (!exact_number(wobj, &w)) goto pass;
        if (w != 0.0 || w != w) { /* truthy: nonzero or NaN */
            double h = 0.0;
            if (hobj != Py_None && !exact_number(hobj, &h)) goto pass;
            hl_ms = h * 1000.0;
        } else {
            w = 0.0;
        }
    }
    /* Timeout: _ms(seconds): int(round(seconds * 1000.0)), at least 1 when seconds > 0. */
    uint64_t to_ms = 0;
    if (tobj != Py_None) {
        double t;
        if (!exact_number(tobj, &t)) goto pass;
        if (!(t >= 0.0)) goto pass; /* NaN or negative: the general path's ValueError */
        double ms = nearbyint(t * 1000.0); /* the default rounding mode: half to even, as round() */
        if (!(ms < 9007199254740992.0)) goto pass; /* 2^53 ms and up (and inf) */
        to_ms = (uint64_t)ms;
        if (t > 0.0 && to_ms == 0) to_ms = 1;
    }
    char *fdata = NULL;
    Py_ssize_t flen = 0;
    if (fobj != Py_None) {
        if (!PyBytes_CheckExact(fobj)) goto pass;
        fdata = PyBytes_AsString(fobj);
        if (!fdata) return -1;
        flen = PyBytes_Size(fobj);
    }
    np_fields *q = (np_fields *)query;
    if (q->nd != 1 || q->descr != f->f32 || !(q->flags & NPY_C_CONTIGUOUS) || ((uintptr_t)q->data & 3u) ||
        !PyLong_Check(kobj))
        goto pass;
    int overflow = 0;
    long long k = PyLong_AsLongLongAndOverflow(kobj, &overflow);
    if (overflow || k <= 0 || k > f->cap) goto pass;

    PyObject *active = PyObject_GetAttr(owner, str_active);
    if (!active) return -1;
    if (!PyList_Check(active)) {
        Py_DECREF(active);
        PyErr_SetString(PyExc_TypeError, "owner._active must be a list");
        return -1;
    }
    if (PyList_Append(active, Py_None) < 0) {
        Py_DECREF(active);
        return -1;
    }
    PyObject *closing = PyObject_GetAttr(owner, str_closing);
    int is_closing = closing ? PyObject_IsTrue(closing) : -1;
    Py_XDECREF(closing);
    if (is_closing != 0) {
        if (is_closing < 0) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            active_pop(active);
            PyErr_Restore(et, ev, tb);
            Py_DECREF(active);
            return -1;
        }
        active_pop(active);
        Py_DECREF(active);
        *ret = PyLong_FromLong(-1);
        return *ret ? 0 : -1;
    }

    f->busy = 1;
    char *s = f->args;
    *(char **)(s + f->off_query) = q->data;
    *(size_t *)(s + f->off_query_len) = (size_t)q->dimensions[0];
    *(uint32_t *)(s + f->off_k) = (uint32_t)k;
    if (nsobj == Py_None && fobj == Py_None && w == 0.0 && to_ms == 0) {
        *(char **)(s + f->off_params) = NULL;
    } else {
        /* No namespace: NULL and 0, which the header defines as every namespace. */
        *(uint64_t **)(f->params + f->off_ns) = nns ? f->ns : NULL;
        *(size_t *)(f->params + f->off_ns_len) = (size_t)nns;
        /* The bytes object stays referenced by the caller's argument tuple for the call. */
        *(const char **)(f->params + f->off_filter) = fdata;
        *(size_t *)(f->params + f->off_filter_len) = (size_t)flen;
        *(float *)(f->params + f->off_rw) = (float)w;
        *(double *)(f->params + f->off_hl) = hl_ms;
        *(uint64_t *)(f->params + f->off_to) = to_ms;
        *(char **)(s + f->off_params) = f->params;
    }
    p->q = q;
    p->k = k;
    p->active = active;
    return 1;
pass:
    Py_INCREF(Py_None);
    *ret = Py_None;
    return 0;
}

/* Fresh uint64 and float32 arrays of the first c ids and scores of the frame's buffers, in *ids
 * and *scores (new references); -1 with an exception set. */
static int copy_out(Frame *f, Py_ssize_t c, PyObject **ids, PyObject **scores) {
    *ids = *scores = NULL;
    if (c != f->c) {
        PyObject *in = empty_args(f->ids, c);
        if (!in) return -1;
        PyObject *sn = empty_args(f->scores, c);
        if (!sn) {
            Py_DECREF(in);
            return -1;
        }
        PyObject *old_i = f->ids_new, *old_s = f->scores_new;
        f->ids_new = in;
        f->scores_new = sn;
        f->c = c;
        Py_DECREF(old_i);
        Py_DECREF(old_s);
    }
    *ids = PyObject_CallObject(f->empty, f->ids_new);
    if (*ids) *scores = PyObject_CallObject(f->empty, f->scores_new);
    if (!*scores) goto fail;
    if ((PyObject *)Py_TYPE(*ids) != f->nd_type || (PyObject *)Py_TYPE(*scores) != f->nd_type) {
        PyErr_SetString(PyExc_SystemError, "numpy.empty returned something other than an ndarray");
        goto fail;
    }
    memcpy(((np_fields *)*ids)->data, ((np_fields *)f->ids)->data, (size_t)c * sizeof(uint64_t));
    memcpy(((np_fields *)*scores)->data, ((np_fields *)f->scores)->data, (size_t)c * sizeof(float));
    return 0;
fail:
    Py_CLEAR(*ids);
    Py_CLEAR(*scores);
    return -1;
}

static PyObject *frame_call(PyObject *self, PyObject *a, PyObject *kw) {
    Frame *f = (Frame *)self;
    if (kw) {
        PyErr_SetString(PyExc_TypeError, "a Frame call takes no keyword arguments");
        return NULL;
    }
    Prepared p;
    PyObject *ret;
    int r = prepare(f, a, &p, &ret);
    if (r <= 0) return r < 0 ? NULL : ret;
    char *s = f->args;
    recall_with_fn fn = f->fn;
    int32_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(s);
    Py_END_ALLOW_THREADS
    active_pop(p.active);
    Py_DECREF(p.active);
    if (rc != 0) {
        f->busy = 0;
        return PyLong_FromLong(rc);
    }
    PyObject *ids, *scores, *out = NULL;
    Py_ssize_t c = (Py_ssize_t)*(size_t *)(s + f->off_count);
    if (c < 0 || c > p.k)
        PyErr_Format(PyExc_SystemError, "kalos_recall_with reported %zd hits for k = %lld", c, p.k);
    else if (copy_out(f, c, &ids, &scores) == 0) {
        out = PyTuple_Pack(2, ids, scores);
        Py_DECREF(ids);
        Py_DECREF(scores);
    }
    f->busy = 0;
    return out;
}

/* Frame.payloads(owner, query, k[, ...]): the call above through kalos_recall_payloads, which
 * also returns each hit's payload: (ids, scores, payloads), payloads a list of bytes (None for
 * a hit without one), or None, -1 or a status > 0 as a call returns. The payloads arrive packed
 * in the frame's buffer, which grows (with the GIL held, the frame busy) when the library
 * returns KALOS_BUFFER_TOO_SMALL with a larger size needed, up to PAYLOAD_TRIES calls. */
static PyObject *frame_payloads(PyObject *self, PyObject *a) {
    Frame *f = (Frame *)self;
    Prepared p;
    PyObject *ret;
    int r = prepare(f, a, &p, &ret);
    if (r <= 0) return r < 0 ? NULL : ret;
    char *s = f->args;
    const void *h = *(void **)(s + f->off_handle);
    const void *params = *(void **)(s + f->off_params);
    const float *qd = (const float *)p.q->data;
    size_t qlen = (size_t)p.q->dimensions[0], cap = (size_t)f->cap, count = 0, needed = 0;
    uint64_t *ids_buf = (uint64_t *)((np_fields *)f->ids)->data;
    float *scores_buf = (float *)((np_fields *)f->scores)->data;
    int32_t rc = 0;
    int nomem = 0;
    for (int i = 0; i < PAYLOAD_TRIES; i++) {
        recall_payloads_fn fn = f->payloads_fn;
        uint8_t *buf = f->pbuf;
        size_t blen = f->pcap;
        uint32_t *lens = f->lens;
        Py_BEGIN_ALLOW_THREADS
        rc = fn(h, qd, qlen, (uint32_t)p.k, params, ids_buf, cap, scores_buf, cap, buf, blen, lens, cap, &count,
                &needed);
        Py_END_ALLOW_THREADS
        if (rc != f->too_small || needed <= f->pcap) break;
        size_t grown = needed > 2 * f->pcap ? needed : 2 * f->pcap;
        uint8_t *nb = PyMem_Realloc(f->pbuf, grown);
        if (!nb) {
            nomem = 1;
            break;
        }
        f->pbuf = nb;
        f->pcap = grown;
    }
    active_pop(p.active);
    Py_DECREF(p.active);
    if (nomem || rc != 0) {
        f->busy = 0;
        return nomem ? PyErr_NoMemory() : PyLong_FromLong(rc);
    }
    PyObject *ids = NULL, *scores = NULL, *list = NULL, *out = NULL;
    Py_ssize_t c = (Py_ssize_t)count;
    if (c < 0 || c > p.k) {
        PyErr_Format(PyExc_SystemError, "kalos_recall_payloads reported %zd hits for k = %lld", c, p.k);
        goto done;
    }
    list = PyList_New(c);
    if (!list) goto done;
    size_t off = 0;
    for (Py_ssize_t i = 0; i < c; i++) {
        uint32_t n = f->lens[i];
        PyObject *b;
        if (n == UINT32_MAX) { /* KALOS_NO_PAYLOAD */
            Py_INCREF(Py_None);
            b = Py_None;
        } else {
            if (off + n > needed || off + n > f->pcap) {
                PyErr_SetString(PyExc_SystemError, "kalos_recall_payloads: payload lengths past the bytes used");
                goto done;
            }
            b = PyBytes_FromStringAndSize((const char *)f->pbuf + off, (Py_ssize_t)n);
            if (!b) goto done;
            off += n;
        }
        PyList_SetItem(list, i, b); /* steals b */
    }
    if (copy_out(f, c, &ids, &scores) < 0) goto done;
    out = PyTuple_Pack(3, ids, scores, list);
done:
    Py_XDECREF(ids);
    Py_XDECREF(scores);
    Py_XDECREF(list);
    f->busy = 0;
    return out;
}

static PyObject *frame_get_busy(PyObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(((Frame *)self)->busy);
}

static int frame_set_busy(PyObject *self, PyObject *v, void *closure) {
    (void)closure;
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "cannot delete busy");
        return -1;
    }
    int b = PyObject_IsTrue(v);
    if (b < 0) return -1;
    ((Frame *)self)->busy = b;
    return 0;
}

static PyObject *frame_get_args(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((Frame *)self)->args);
}

static PyGetSetDef frame_getset[] = {
    {"busy", frame_get_busy, frame_set_busy,
     "True while a call uses the frame; a call that finds it set returns None.", NULL},
    {"args", frame_get_args, NULL, "Address of the kalos_recall_args struct.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef frame_methods[] = {
    {"payloads", frame_payloads, METH_VARARGS,
     "A call through kalos_recall_payloads: (ids, scores, payloads); see the module's source."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot frame_slots[] = {
    {Py_tp_new, (void *)frame_new},
    {Py_tp_methods, frame_methods},
    {Py_tp_dealloc, (void *)frame_dealloc},
    {Py_tp_call, (void *)frame_call},
    {Py_tp_getset, frame_getset},
    {Py_tp_doc, "A kalos_recall_args struct and result buffers of one thread on one handle; "
                "see the module's source for the call's contract."},
    {0, NULL},
};

static PyType_Spec frame_spec = {
    "kalos._fastcall.Frame",
    sizeof(Frame),
    0,
    Py_TPFLAGS_DEFAULT,
    frame_slots,
};

/* probe(obj): None when obj is not exactly of type `nd_type`; else (data address, ndim,
 * length of the first axis or -1, C-contiguous flag, descr is `f32`) as read from the array
 * header, for kalos/__init__.py to compare with numpy's own answers. */
static PyObject *probe(PyObject *mod, PyObject *a) {
    (void)mod;
    PyObject *obj, *nd_type, *f32;
    if (!PyArg_ParseTuple(a, "OOO:probe", &obj, &nd_type, &f32)) return NULL;
    if ((PyObject *)Py_TYPE(obj) != nd_type) Py_RETURN_NONE;
    np_fields *q = (np_fields *)obj;
    return Py_BuildValue("(NinOO)", PyLong_FromVoidPtr(q->data), q->nd,
                         (Py_ssize_t)(q->nd >= 1 ? q->dimensions[0] : -1),
                         (q->flags & NPY_C_CONTIGUOUS) ? Py_True : Py_False, q->descr == f32 ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"probe", probe, METH_VARARGS, "Reads an ndarray's header as a Frame call does (for the import check)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kalos._fastcall", "The recall fast path of kalos.Kalos.recall in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) {
    str_active = PyUnicode_InternFromString("_active");
    str_closing = PyUnicode_InternFromString("_closing");
    if (!str_active || !str_closing) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *tp = PyType_FromSpec(&frame_spec);
    if (!tp || PyModule_AddObject(m, "Frame", tp) < 0) {
        Py_XDECREF(tp);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

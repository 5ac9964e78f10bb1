package kalos

// This file is the only one that talks to C. Two rules shape it:
//
//  1. kalos_last_error() is thread-local, and a goroutine may move to another OS thread
//     between two cgo calls. Every call therefore goes through a small static wrapper that
//     calls the library function and, on failure, copies the message into a caller buffer
//     in the same C call (same thread). No runtime.LockOSThread is needed.
//  2. cgo pointer rules: Go memory passed to C must not contain Go pointers. The parameter
//     structs (kalos_recall_params, kalos_upsert_params) hold pointers to caller slices, so
//     they are never built in Go memory: the wrappers take the individual pointers and
//     build the struct on the C stack. Every Go pointer is only borrowed for the call
//     (the header promises Kalos keeps none), which the `noescape` annotations state, so
//     the compiler may keep small buffers such as the error message on the Go stack.

/*
#include <stdlib.h>
#include <string.h>
#include "kalos.h"

// The wrappers neither keep the Go pointers they get nor call back into Go.
#cgo noescape kgo_open
#cgo nocallback kgo_open
#cgo noescape kgo_dim
#cgo nocallback kgo_dim
#cgo noescape kgo_recall
#cgo nocallback kgo_recall
#cgo noescape kgo_recall_batch
#cgo nocallback kgo_recall_batch
#cgo noescape kgo_recall_payloads
#cgo nocallback kgo_recall_payloads
#cgo noescape kgo_upsert
#cgo nocallback kgo_upsert
#cgo noescape kgo_delete
#cgo nocallback kgo_delete
#cgo noescape kgo_delete_namespace
#cgo nocallback kgo_delete_namespace
#cgo noescape kgo_clear
#cgo nocallback kgo_clear
#cgo noescape kgo_get
#cgo nocallback kgo_get
#cgo noescape kgo_stats
#cgo nocallback kgo_stats
#cgo noescape kgo_stats_ops
#cgo nocallback kgo_stats_ops
#cgo noescape kgo_delete_where
#cgo nocallback kgo_delete_where
#cgo noescape kgo_get_fields
#cgo nocallback kgo_get_fields
#cgo noescape kgo_list
#cgo nocallback kgo_list
#cgo noescape kgo_last_write_seqs
#cgo nocallback kgo_last_write_seqs

#define KGO_ERRLEN 512

static void kgo_err(kalos_status st, char *eb) {
	if (st != KALOS_OK && eb != NULL) {
		const char *m = kalos_last_error();
		size_t n = 0;
		if (m != NULL) {
			n = strlen(m);
			if (n > KGO_ERRLEN - 1) n = KGO_ERRLEN - 1;
			memcpy(eb, m, n);
		}
		eb[n] = 0;
	}
}

static kalos_status kgo_open(const char *name, const kalos_options *o, kalos_handle **out, char *eb) {
	kalos_status st = kalos_open(name, o, out);
	kgo_err(st, eb);
	return st;
}

static void kgo_close(kalos_handle *h) { kalos_close(h); }

static kalos_status kgo_dim(const kalos_handle *h, uint32_t *dim, char *eb) {
	kalos_status st = kalos_dim(h, dim);
	kgo_err(st, eb);
	return st;
}

static void kgo_recall_params(kalos_recall_params *p, const uint64_t *ns, size_t ns_len,
                              float rw, double hl, uint64_t tmo, const uint8_t *flt, size_t flt_len,
                              uint32_t consistency, const uint64_t *seqs, size_t seqs_len) {
	kalos_recall_params_init(p, sizeof *p);
	p->filter = flt;
	p->filter_len = flt_len;
	p->namespaces = ns;
	p->namespaces_len = ns_len;
	p->recency_weight = rw;
	p->recency_half_life_ms = hl;
	p->timeout_ms = tmo;
	p->consistency = consistency;
	p->min_seqs = seqs;
	p->min_seqs_len = seqs_len;
}

// lag NULL: kalos_recall; else kalos_recall_lag, writing lag[0] (entries) and lag[1] (ms).
static kalos_status kgo_recall(const kalos_handle *h, const float *q, size_t qlen, uint32_t k,
                               const uint64_t *ns, size_t ns_len, float rw, double hl, uint64_t tmo,
                               const uint8_t *flt, size_t flt_len, uint32_t consistency,
                               const uint64_t *seqs, size_t seqs_len,
                               uint64_t *ids, size_t ids_len, float *scores, size_t scores_len,
                               size_t *count, uint64_t *lag, char *eb) {
	kalos_recall_params p;
	kgo_recall_params(&p, ns, ns_len, rw, hl, tmo, flt, flt_len, consistency, seqs, seqs_len);
	kalos_status st = lag == NULL
		? kalos_recall(h, q, qlen, k, &p, ids, ids_len, scores, scores_len, count)
		: kalos_recall_lag(h, q, qlen, k, &p, ids, ids_len, scores, scores_len, count, &lag[0], &lag[1]);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_recall_batch(const kalos_handle *h, const float *q, size_t qlen, size_t nq,
                                     uint32_t k, const uint64_t *ns, size_t ns_len, float rw,
                                     double hl, uint64_t tmo, const uint8_t *flt, size_t flt_len,
                                     uint32_t consistency, const uint64_t *seqs, size_t seqs_len,
                                     uint64_t *ids, size_t ids_len,
                                     float *scores, size_t scores_len, size_t *counts,
                                     size_t counts_len, char *eb) {
	kalos_recall_params p;
	kgo_recall_params(&p, ns, ns_len, rw, hl, tmo, flt, flt_len, consistency, seqs, seqs_len);
	kalos_status st = kalos_recall_batch(h, q, qlen, nq, k, &p, ids, ids_len, scores, scores_len,
	                                     counts, counts_len);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_recall_payloads(const kalos_handle *h, const float *q, size_t qlen,
                                        uint32_t k, const uint64_t *ns, size_t ns_len, float rw,
                                        double hl, uint64_t tmo, const uint8_t *flt, size_t flt_len,
                                        uint32_t consistency, const uint64_t *seqs, size_t seqs_len,
                                        uint64_t *ids, size_t ids_len,
                                        float *scores, size_t scores_len, uint8_t *buf,
                                        size_t buf_len, uint32_t *lens, size_t lens_len,
                                        size_t *count, size_t *needed, char *eb) {
	kalos_recall_params p;
	kgo_recall_params(&p, ns, ns_len, rw, hl, tmo, flt, flt_len, consistency, seqs, seqs_len);
	kalos_status st = kalos_recall_payloads(h, q, qlen, k, &p, ids, ids_len, scores, scores_len,
	                                        buf, buf_len, lens, lens_len, count, needed);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_upsert(const kalos_handle *h, const uint64_t *ids, size_t n,
                               const float *vecs, size_t vecs_len, uint64_t ns_id,
                               const uint64_t *ns, size_t ns_len, const uint8_t *payloads,
                               size_t payloads_len, const uint32_t *lens, size_t lens_len,
                               uint64_t ttl_ms, uint64_t expires_at_ms, uint64_t tmo,
                               const uint8_t *fields, size_t fields_len, char *eb) {
	kalos_upsert_params p;
	kalos_upsert_params_init(&p, sizeof p);
	p.namespace_id = ns_id;
	p.namespaces = ns;
	p.namespaces_len = ns_len;
	p.payloads = payloads;
	p.payloads_len = payloads_len;
	p.payload_lens = lens;
	p.payload_lens_len = lens_len;
	p.ttl_ms = ttl_ms;
	p.expires_at_ms = expires_at_ms;
	p.timeout_ms = tmo;
	p.fields = fields;
	p.fields_len = fields_len;
	kalos_status st = kalos_upsert(h, ids, n, vecs, vecs_len, &p);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_delete(const kalos_handle *h, const uint64_t *ids, size_t n, uint64_t *deleted, char *eb) {
	kalos_status st = kalos_delete(h, ids, n, deleted);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_delete_namespace(const kalos_handle *h, uint64_t ns, uint64_t *deleted, char *eb) {
	kalos_status st = kalos_delete_namespace(h, ns, deleted);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_clear(const kalos_handle *h, uint64_t *deleted, char *eb) {
	kalos_status st = kalos_clear(h, deleted);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_get(const kalos_handle *h, const uint64_t *ids, size_t n, float *vecs,
                            size_t vecs_len, uint64_t *ns, size_t ns_len, uint8_t *buf,
                            size_t buf_len, uint32_t *lens, size_t lens_len, size_t *needed,
                            char *eb) {
	kalos_status st = kalos_get(h, ids, n, vecs, vecs_len, ns, ns_len, buf, buf_len, lens, lens_len, needed);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_delete_where(const kalos_handle *h, const uint64_t *ns, size_t ns_len,
                                     const uint8_t *flt, size_t flt_len, uint64_t *deleted, char *eb) {
	kalos_status st = kalos_delete_where(h, ns, ns_len, flt, flt_len, deleted);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_list(const kalos_handle *h, const uint64_t *ns, size_t ns_len, const uint8_t *flt,
                             size_t flt_len, uint32_t has_after, uint64_t after, uint64_t tmo,
                             uint64_t *ids, size_t ids_len, size_t *count, uint64_t *remaining, char *eb) {
	kalos_list_params p;
	kalos_list_params_init(&p, sizeof p);
	p.namespaces = ns;
	p.namespaces_len = ns_len;
	p.filter = flt;
	p.filter_len = flt_len;
	p.has_after = has_after;
	p.after = after;
	p.timeout_ms = tmo;
	kalos_status st = kalos_list(h, &p, ids, ids_len, count, remaining);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_get_fields(const kalos_handle *h, const uint64_t *ids, size_t n, uint8_t *buf,
                                   size_t buf_len, uint32_t *lens, size_t lens_len, size_t *needed,
                                   char *eb) {
	kalos_status st = kalos_get_fields(h, ids, n, buf, buf_len, lens, lens_len, needed);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_last_write_seqs(const kalos_handle *h, uint64_t *seqs, size_t seqs_len, size_t *count,
                                        char *eb) {
	kalos_status st = kalos_last_write_seqs(h, seqs, seqs_len, count);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_stats(const kalos_handle *h, kalos_stats_info *out, char *eb) {
	out->struct_size = (uint32_t)sizeof(kalos_stats_info);
	kalos_status st = kalos_stats(h, out);
	kgo_err(st, eb);
	return st;
}

static kalos_status kgo_stats_ops(const kalos_handle *h, kalos_op_count *out, size_t out_len,
                                  size_t *needed, char *eb) {
	kalos_status st = kalos_stats_ops(h, out, out_len, needed);
	kgo_err(st, eb);
	return st;
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Limits and markers of the C API.
const (
	// MaxK is the largest k a recall accepts.
	MaxK = C.KALOS_MAX_K
	// MaxFilterNamespaces is the largest number of namespaces in one recall filter.
	MaxFilterNamespaces = C.KALOS_MAX_FILTER_NAMESPACES
	// MaxDeviceShards is the largest Options.DeviceShards.
	MaxDeviceShards = C.KALOS_MAX_DEVICE_SHARDS
	// GPUsAll is Options.GPUs for every CUDA device of the host.
	GPUsAll uint64 = C.KALOS_GPUS_ALL
	// noPayload marks "no payload" in a payload length array.
	noPayload = uint32(C.KALOS_NO_PAYLOAD)
	// The recall consistency flags (kalos_recall_params.consistency).
	flagReadYourWrites = uint32(C.KALOS_RECALL_READ_YOUR_WRITES)
	flagAllowStale     = uint32(C.KALOS_RECALL_ALLOW_STALE)
)

// Status codes of the C API (kalos_status). The values are the header's; they are never
// renumbered.
const (
	StatusOK                 Status = C.KALOS_OK
	StatusInvalidArgument    Status = C.KALOS_INVALID_ARGUMENT
	StatusNullPointer        Status = C.KALOS_NULL_POINTER
	StatusDimensionMismatch  Status = C.KALOS_DIMENSION_MISMATCH
	StatusKOutOfRange        Status = C.KALOS_K_OUT_OF_RANGE
	StatusNonFinite          Status = C.KALOS_NON_FINITE
	StatusInvalidName        Status = C.KALOS_INVALID_NAME
	StatusStoreFull          Status = C.KALOS_STORE_FULL
	StatusVersionMismatch    Status = C.KALOS_VERSION_MISMATCH
	StatusNotFound           Status = C.KALOS_NOT_FOUND
	StatusAlreadyExists      Status = C.KALOS_ALREADY_EXISTS
	StatusTimeout            Status = C.KALOS_TIMEOUT
	StatusServerGone         Status = C.KALOS_SERVER_GONE
	StatusBufferTooSmall     Status = C.KALOS_BUFFER_TOO_SMALL
	StatusPayloadTooLarge    Status = C.KALOS_PAYLOAD_TOO_LARGE
	StatusCorrupt            Status = C.KALOS_CORRUPT
	StatusIO                 Status = C.KALOS_IO
	StatusLocked             Status = C.KALOS_LOCKED
	StatusBackendUnavailable Status = C.KALOS_BACKEND_UNAVAILABLE
	StatusCUDA               Status = C.KALOS_CUDA
	StatusPermissionDenied   Status = C.KALOS_PERMISSION_DENIED
	StatusTooLarge           Status = C.KALOS_TOO_LARGE
	StatusClosed             Status = C.KALOS_CLOSED
	StatusPanic              Status = C.KALOS_PANIC
	StatusInternal           Status = C.KALOS_INTERNAL
	StatusUnavailable        Status = C.KALOS_UNAVAILABLE
	StatusStale              Status = C.KALOS_STALE
)

// errBuf receives kalos_last_error() from the wrappers. It lives on the caller's stack.
type errBuf [C.KGO_ERRLEN]byte

func (b *errBuf) ptr() *C.char { return (*C.char)(unsafe.Pointer(&b[0])) }

func (b *errBuf) String() string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b[:])
}

type cHandle = *C.kalos_handle

// Pointer helpers: the first element of a slice, or NULL for an empty one (the C API
// accepts NULL with length 0).
func f32p(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

func u64p(s []uint64) *C.uint64_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(&s[0]))
}

func u32p(s []uint32) *C.uint32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&s[0]))
}

func u8p(s []byte) *C.uint8_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.uint8_t)(unsafe.Pointer(&s[0]))
}

// sizep views a []int as size_t*: Go's int and C's size_t have the same size on every
// platform Go supports with cgo (checked at compile time below).
func sizep(s []int) *C.size_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.size_t)(unsafe.Pointer(&s[0]))
}

var _ [unsafe.Sizeof(C.size_t(0)) - unsafe.Sizeof(int(0))]struct{}
var _ [unsafe.Sizeof(int(0)) - unsafe.Sizeof(C.size_t(0))]struct{}

func cstatus(st C.kalos_status) Status { return Status(st) }

func cOpen(name string, o *Options) (cHandle, Status, string) {
	var opts C.kalos_options
	C.kalos_options_init(&opts, C.sizeof_struct_kalos_options)
	o.fill(&opts)
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if o.DataDir != "" {
		opts.data_dir = C.CString(o.DataDir)
		defer C.free(unsafe.Pointer(opts.data_dir))
	}
	var h cHandle
	var eb errBuf
	st := cstatus(C.kgo_open(cname, &opts, &h, eb.ptr()))
	if st != StatusOK {
		return nil, st, eb.String()
	}
	return h, st, ""
}

func (o *Options) fill(c *C.kalos_options) {
	c.role = C.uint32_t(o.Role)
	if o.Dim > 0 {
		c.dim = C.uint32_t(o.Dim)
	}
	if o.Metric != MetricDefault {
		c.metric = C.uint32_t(o.Metric.c())
	}
	if o.DType != DTypeDefault {
		c.dtype = C.uint32_t(o.DType.c())
	}
	c.backend = C.uint32_t(o.Backend)
	if o.Capacity > 0 {
		c.capacity = C.uint64_t(o.Capacity)
	}
	if o.Slots > 0 {
		c.slots = C.uint32_t(o.Slots)
	}
	if o.SlotBytes > 0 {
		c.slot_bytes = C.uint32_t(o.SlotBytes)
	}
	if o.Mode != 0 {
		c.mode = C.uint32_t(o.Mode)
	}
	if o.MaxPayloadBytes > 0 {
		c.max_payload_bytes = C.uint32_t(o.MaxPayloadBytes)
	}
	if o.ClientSpin > 0 {
		c.client_spin_ns = C.uint64_t(o.ClientSpin.Nanoseconds())
	} else if o.ClientSpin < 0 {
		c.client_spin_ns = 0
	}
	if o.ServerSpin > 0 {
		c.server_spin_ns = C.uint64_t(o.ServerSpin.Nanoseconds())
	} else if o.ServerSpin < 0 {
		c.server_spin_ns = 0
	}
	if o.Timeout > 0 {
		c.timeout_ms = C.uint64_t(durationMS(o.Timeout))
	}
	if o.HeartbeatTimeout > 0 {
		c.heartbeat_timeout_ms = C.uint64_t(durationMS(o.HeartbeatTimeout))
	}
	if o.Sync != SyncDefault {
		c.sync_policy = C.uint32_t(o.Sync - 1)
	}
	if o.Threads > 0 {
		c.threads = C.uint32_t(o.Threads)
	}
	if o.SyncInterval > 0 {
		c.sync_interval_ms = C.uint64_t(durationMS(o.SyncInterval))
	}
	if o.GPUMemoryBytes > 0 {
		c.gpu_memory_bytes = C.uint64_t(o.GPUMemoryBytes)
	}
	if o.Ephemeral {
		c.ephemeral = 1
	}
	if o.ScanInt8 {
		c.scan = C.KALOS_SCAN_INT8
	}
	c.rerank = C.uint32_t(o.Rerank)
	c.device_shards = C.uint32_t(o.DeviceShards)
	c.placement = C.uint32_t(o.Placement)
	c.gpus = C.uint64_t(o.GPUs)
}

func cClose(h cHandle) { C.kgo_close(h) }

func cDim(h cHandle) (int, Status, string) {
	var d C.uint32_t
	var eb errBuf
	st := cstatus(C.kgo_dim(h, &d, eb.ptr()))
	if st != StatusOK {
		return 0, st, eb.String()
	}
	return int(d), st, ""
}

// recallArgs carries the per-call recall parameters to the wrappers.
type recallArgs struct {
	namespaces  []uint64
	weight      float32
	halfLifeMS  float64
	timeoutMS   uint64
	filter      []byte
	consistency uint32   // flagReadYourWrites | flagAllowStale
	minSeqs     []uint64 // a write token (WithMinSeqs)
	lag         *Lag     // where WithAllowStale wants the lag, or nil
	err         error    // a filter that did not encode
}

func cRecall(h cHandle, q []float32, k int, a *recallArgs, ids []uint64, scores []float32) (int, Status, string) {
	var count C.size_t
	var eb errBuf
	var lag [2]C.uint64_t
	var lagp *C.uint64_t
	if a.lag != nil {
		lagp = &lag[0]
	}
	st := cstatus(C.kgo_recall(h, f32p(q), C.size_t(len(q)), C.uint32_t(k),
		u64p(a.namespaces), C.size_t(len(a.namespaces)), C.float(a.weight), C.double(a.halfLifeMS),
		C.uint64_t(a.timeoutMS), u8p(a.filter), C.size_t(len(a.filter)),
		C.uint32_t(a.consistency), u64p(a.minSeqs), C.size_t(len(a.minSeqs)),
		u64p(ids), C.size_t(len(ids)), f32p(scores), C.size_t(len(scores)),
		&count, lagp, eb.ptr()))
	runtime.KeepAlive(q)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(scores)
	runtime.KeepAlive(a.namespaces)
	runtime.KeepAlive(a.filter)
	runtime.KeepAlive(a.minSeqs)
	if st != StatusOK {
		return 0, st, eb.String()
	}
	if a.lag != nil {
		*a.lag = Lag{Entries: uint64(lag[0]), Disconnected: durationMS64(uint64(lag[1]))}
	}
	return int(count), st, ""
}

func cRecallBatch(h cHandle, q []float32, nq, k int, a *recallArgs, ids []uint64, scores []float32, counts []int) (Status, string) {
	var eb errBuf
	st := cstatus(C.kgo_recall_batch(h, f32p(q), C.size_t(len(q)), C.size_t(nq), C.uint32_t(k),
		u64p(a.namespaces), C.size_t(len(a.namespaces)), C.float(a.weight), C.double(a.halfLifeMS),
		C.uint64_t(a.timeoutMS), u8p(a.filter), C.size_t(len(a.filter)),
		C.uint32_t(a.consistency), u64p(a.minSeqs), C.size_t(len(a.minSeqs)),
		u64p(ids), C.size_t(len(ids)), f32p(scores), C.size_t(len(scores)),
		sizep(counts), C.size_t(len(counts)), eb.ptr()))
	runtime.KeepAlive(q)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(scores)
	runtime.KeepAlive(a.namespaces)
	runtime.KeepAlive(a.filter)
	runtime.KeepAlive(a.minSeqs)
	runtime.KeepAlive(counts)
	if st != StatusOK {
		return st, eb.String()
	}
	return st, ""
}

func cRecallPayloads(h cHandle, q []float32, k int, a *recallArgs, ids []uint64, scores []float32,
	buf []byte, lens []uint32) (count int, needed int, st Status, msg string) {
	var cnt, need C.size_t
	var eb errBuf
	st = cstatus(C.kgo_recall_payloads(h, f32p(q), C.size_t(len(q)), C.uint32_t(k),
		u64p(a.namespaces), C.size_t(len(a.namespaces)), C.float(a.weight), C.double(a.halfLifeMS),
		C.uint64_t(a.timeoutMS), u8p(a.filter), C.size_t(len(a.filter)),
		C.uint32_t(a.consistency), u64p(a.minSeqs), C.size_t(len(a.minSeqs)),
		u64p(ids), C.size_t(len(ids)), f32p(scores), C.size_t(len(scores)),
		u8p(buf), C.size_t(len(buf)), u32p(lens), C.size_t(len(lens)), &cnt, &need, eb.ptr()))
	runtime.KeepAlive(q)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(scores)
	runtime.KeepAlive(a.namespaces)
	runtime.KeepAlive(a.filter)
	runtime.KeepAlive(a.minSeqs)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(lens)
	if st != StatusOK {
		return 0, int(need), st, eb.String()
	}
	return int(cnt), int(need), st, ""
}

// upsertArgs carries the per-call upsert parameters to the wrapper.
type upsertArgs struct {
	namespace   uint64
	namespaces  []uint64
	payloads    []byte
	payloadLens []uint32
	ttlMS       uint64
	expiresAtMS uint64
	timeoutMS   uint64
	fields      []byte
	err         error // fields that did not encode
}

func cUpsert(h cHandle, ids []uint64, vecs []float32, a *upsertArgs) (Status, string) {
	var eb errBuf
	st := cstatus(C.kgo_upsert(h, u64p(ids), C.size_t(len(ids)), f32p(vecs), C.size_t(len(vecs)),
		C.uint64_t(a.namespace), u64p(a.namespaces), C.size_t(len(a.namespaces)),
		u8p(a.payloads), C.size_t(len(a.payloads)), u32p(a.payloadLens), C.size_t(len(a.payloadLens)),
		C.uint64_t(a.ttlMS), C.uint64_t(a.expiresAtMS), C.uint64_t(a.timeoutMS),
		u8p(a.fields), C.size_t(len(a.fields)), eb.ptr()))
	runtime.KeepAlive(ids)
	runtime.KeepAlive(vecs)
	runtime.KeepAlive(a.namespaces)
	runtime.KeepAlive(a.payloads)
	runtime.KeepAlive(a.payloadLens)
	runtime.KeepAlive(a.fields)
	if st != StatusOK {
		return st, eb.String()
	}
	return st, ""
}

func cDelete(h cHandle, ids []uint64) (uint64, Status, string) {
	var n C.uint64_t
	var eb errBuf
	st := cstatus(C.kgo_delete(h, u64p(ids), C.size_t(len(ids)), &n, eb.ptr()))
	runtime.KeepAlive(ids)
	if st != StatusOK {
		return 0, st, eb.String()
	}
	return uint64(n), st, ""
}

func cDeleteNamespace(h cHandle, ns uint64) (uint64, Status, string) {
	var n C.uint64_t
	var eb errBuf
	st := cstatus(C.kgo_delete_namespace(h, C.uint64_t(ns), &n, eb.ptr()))
	if st != StatusOK {
		return 0, st, eb.String()
	}
	return uint64(n), st, ""
}

func cClear(h cHandle) (uint64, Status, string) {
	var n C.uint64_t
	var eb errBuf
	st := cstatus(C.kgo_clear(h, &n, eb.ptr()))
	if st != StatusOK {
		return 0, st, eb.String()
	}
	return uint64(n), st, ""
}

func cGet(h cHandle, ids []uint64, vecs []float32, ns []uint64, buf []byte, lens []uint32) (needed int, st Status, msg string) {
	var need C.size_t
	var eb errBuf
	st = cstatus(C.kgo_get(h, u64p(ids), C.size_t(len(ids)), f32p(vecs), C.size_t(len(vecs)),
		u64p(ns), C.size_t(len(ns)), u8p(buf), C.size_t(len(buf)), u32p(lens), C.size_t(len(lens)),
		&need, eb.ptr()))
	runtime.KeepAlive(ids)
	runtime.KeepAlive(vecs)
	runtime.KeepAlive(ns)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(lens)
	if st != StatusOK {
		return int(need), st, eb.String()
	}
	return int(need), st, ""
}

func cDeleteWhere(h cHandle, ns []uint64, filter []byte) (uint64, Status, string) {
	var n C.uint64_t
	var eb errBuf
	st := cstatus(C.kgo_delete_where(h, u64p(ns), C.size_t(len(ns)), u8p(filter), C.size_t(len(filter)), &n, eb.ptr()))
	runtime.KeepAlive(ns)
	runtime.KeepAlive(filter)
	if st != StatusOK {
		return 0, st, eb.String()
	}
	return uint64(n), st, ""
}

func cList(h cHandle, ns []uint64, filter []byte, hasAfter bool, after, tmo uint64, ids []uint64) (int, uint64, Status, string) {
	var n C.size_t
	var rest C.uint64_t
	var eb errBuf
	ha := C.uint32_t(0)
	if hasAfter {
		ha = 1
	}
	st := cstatus(C.kgo_list(h, u64p(ns), C.size_t(len(ns)), u8p(filter), C.size_t(len(filter)), ha, C.uint64_t(after),
		C.uint64_t(tmo), u64p(ids), C.size_t(len(ids)), &n, &rest, eb.ptr()))
	runtime.KeepAlive(ns)
	runtime.KeepAlive(filter)
	runtime.KeepAlive(ids)
	if st != StatusOK {
		return 0, 0, st, eb.String()
	}
	return int(n), uint64(rest), st, ""
}

func cGetFields(h cHandle, ids []uint64, buf []byte, lens []uint32) (needed int, st Status, msg string) {
	var need C.size_t
	var eb errBuf
	st = cstatus(C.kgo_get_fields(h, u64p(ids), C.size_t(len(ids)), u8p(buf), C.size_t(len(buf)),
		u32p(lens), C.size_t(len(lens)), &need, eb.ptr()))
	runtime.KeepAlive(ids)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(lens)
	if st != StatusOK {
		return int(need), st, eb.String()
	}
	return int(need), st, ""
}

// cWriteSeqs fills seqs with the handle's write token and returns its length; with
// StatusBufferTooSmall the length is the one needed.
func cWriteSeqs(h cHandle, seqs []uint64) (int, Status, string) {
	var count C.size_t
	var eb errBuf
	st := cstatus(C.kgo_last_write_seqs(h, u64p(seqs), C.size_t(len(seqs)), &count, eb.ptr()))
	runtime.KeepAlive(seqs)
	if st != StatusOK {
		return int(count), st, eb.String()
	}
	return int(count), st, ""
}

func cStats(h cHandle) (Stats, Status, string) {
	var info C.kalos_stats_info
	var eb errBuf
	st := cstatus(C.kgo_stats(h, &info, eb.ptr()))
	if st != StatusOK {
		return Stats{}, st, eb.String()
	}
	return Stats{
		Engine:          Backend(info.engine),
		EngineName:      C.GoString(&info.engine_name[0]),
		Count:           uint64(info.count),
		Capacity:        uint64(info.capacity),
		Dim:             int(info.dim),
		Metric:          metricFromC(uint32(info.metric)),
		DType:           dtypeFromC(uint32(info.dtype)),
		Requests:        uint64(info.requests),
		Queries:         uint64(info.queries),
		Batches:         uint64(info.batches),
		Errors:          uint64(info.errors),
		P50:             durationNS(uint64(info.p50_ns)),
		P99:             durationNS(uint64(info.p99_ns)),
		QueueDepth:      uint64(info.queue_depth),
		ServerPID:       int(info.server_pid),
		Epoch:           uint64(info.epoch),
		PayloadBytes:    uint64(info.payload_bytes),
		Uptime:          durationMS64(uint64(info.uptime_ms)),
		EngineFallbacks: uint64(info.engine_fallbacks),
		FallbackReason:  C.GoString(&info.fallback_reason[0]),
		RerankQueries:   uint64(info.rerank_queries),
		RerankUncertain: uint64(info.rerank_uncertain),
	}, st, ""
}

// cStatsOps reads the server's request counters by op and status (kalos_stats_ops).
func cStatsOps(h cHandle) ([]OpCount, Status, string) {
	buf := make([]C.kalos_op_count, 64)
	for attempt := 0; ; attempt++ {
		var need C.size_t
		var eb errBuf
		st := cstatus(C.kgo_stats_ops(h, &buf[0], C.size_t(len(buf)), &need, eb.ptr()))
		if st == StatusBufferTooSmall && int(need) > len(buf) && attempt < 3 {
			buf = make([]C.kalos_op_count, int(need)+16)
			continue
		}
		if st != StatusOK {
			return nil, st, eb.String()
		}
		out := make([]OpCount, int(need))
		for i := range out {
			c := buf[i]
			out[i] = OpCount{Op: C.GoString(C.kalos_op_name(c.op)), Status: cstatus(c.status), Count: uint64(c.count)}
		}
		return out, st, ""
	}
}

// statusName is kalos_status_str.
func statusName(s Status) string { return C.GoString(C.kalos_status_str(C.kalos_status(s))) }

// Version returns the version of the libkalos.so loaded at run time, e.g. "0.1.0".
func Version() string { return C.GoString(C.kalos_version()) }

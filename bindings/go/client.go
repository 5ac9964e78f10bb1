package kalos

import (
	"context"
	"fmt"
	"iter"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

// Client is an open Kalos store: a client attached to a server, or the server itself
// (RoleServer, or RoleAuto when this process became the server).
//
// A Client is safe for concurrent use by many goroutines; each call is independent and
// goes straight to libkalos.so (there is no Go-side queue or lock on the request path other
// than a read lock that keeps Close from freeing the handle under a running call).
type Client struct {
	// mu guards h: calls hold the read lock for their duration, Close the write lock, so
	// kalos_close never races a call on the handle (the C API forbids that).
	mu   sync.RWMutex
	h    cHandle
	name string
	dim  int
	// payloadHint is the payload buffer size the last payload call needed; the next one
	// starts there, so a retry after BUFFER_TOO_SMALL is rare.
	payloadHint atomic.Int64
}

// Hit is one recalled memory. Payload is nil unless asked for (RecallWithPayloads) and
// the memory has one.
type Hit struct {
	ID      uint64
	Score   float32
	Payload []byte
}

// Memory is a stored memory as Get returns it.
type Memory struct {
	ID        uint64
	Namespace uint64
	Vector    []float32
	Payload   []byte // nil = none
}

// Open opens the store name (1-200 characters of [A-Za-z0-9._-]) in the role opts.Role.
//
// With RoleServer (or RoleAuto when no server is live) this process runs the server
// thread, and closing the Client stops it: other clients then get ErrServerGone. Close the
// Client when done (defer c.Close()); a finalizer closes a forgotten Client as a fallback
// only.
func Open(name string, opts Options) (*Client, error) {
	for _, f := range []struct {
		name string
		v    int
	}{{"Dim", opts.Dim}, {"Slots", opts.Slots}, {"SlotBytes", opts.SlotBytes},
		{"MaxPayloadBytes", opts.MaxPayloadBytes}, {"Threads", opts.Threads}, {"DeviceShards", opts.DeviceShards}} {
		if f.v < 0 || f.v > math.MaxUint32 {
			return nil, newError("open", StatusInvalidArgument, fmt.Sprintf("Options.%s = %d is out of range", f.name, f.v))
		}
	}
	if strings.IndexByte(name, 0) >= 0 {
		return nil, newError("open", StatusInvalidName, fmt.Sprintf("store name %q holds a NUL byte", name))
	}
	if strings.IndexByte(opts.DataDir, 0) >= 0 {
		return nil, newError("open", StatusInvalidArgument, "data_dir holds a NUL byte")
	}
	h, st, msg := cOpen(name, &opts)
	if st != StatusOK {
		return nil, newError("open", st, msg)
	}
	dim, st, msg := cDim(h)
	if st != StatusOK {
		cClose(h)
		return nil, newError("open", st, msg)
	}
	c := &Client{h: h, name: name, dim: dim}
	c.payloadHint.Store(4096)
	runtime.SetFinalizer(c, (*Client).Close)
	return c, nil
}

// Name is the store's name.
func (c *Client) Name() string { return c.name }

// Dim is the store's vector dimension.
func (c *Client) Dim() int { return c.dim }

// Close releases the handle. It waits for calls in progress on other goroutines (each is
// bounded by its deadline), is idempotent, and always returns nil. Calls after Close
// return an error matching ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil {
		return nil
	}
	cClose(c.h)
	c.h = nil
	runtime.SetFinalizer(c, nil)
	return nil
}

// acquire read-locks the handle for one call; release with c.mu.RUnlock().
func (c *Client) acquire(op string) (cHandle, error) {
	c.mu.RLock()
	if c.h == nil {
		c.mu.RUnlock()
		return nil, newError(op, StatusClosed, "the client is closed")
	}
	return c.h, nil
}

func applyRecall(opts []RecallOption) recallArgs {
	a := new(recallArgs)
	for _, o := range opts {
		if o != nil {
			o(a)
		}
	}
	return *a
}

func applyUpsert(opts []UpsertOption) upsertArgs {
	a := new(upsertArgs)
	for _, o := range opts {
		if o != nil {
			o(a)
		}
	}
	return *a
}

// kRangeMessage is the library's own wording of a k out of range.
func kRangeMessage(k int) string {
	return fmt.Sprintf("k = %d; k must be between 1 and %d", k, MaxK)
}

func checkK(op string, k int) error {
	if k < 0 || k > math.MaxUint32 {
		return newError(op, StatusKOutOfRange, kRangeMessage(k))
	}
	return nil
}

// Recall returns the top-k memories for query (len = Dim()), best first (ties by lower
// id), at most k and fewer when fewer memories match. The context's deadline becomes the
// request's deadline; without one the handle's Timeout applies. A context that is already
// done returns ctx.Err() without a request.
func (c *Client) Recall(ctx context.Context, query []float32, k int, opts ...RecallOption) ([]Hit, error) {
	if k < 0 || k > MaxK {
		return nil, newError("recall", StatusKOutOfRange, kRangeMessage(k))
	}
	// Small k: result buffers on the stack (the C wrapper does not let them escape).
	var idsA [64]uint64
	var scoresA [64]float32
	var ids []uint64
	var scores []float32
	if k <= len(idsA) {
		ids, scores = idsA[:k], scoresA[:k]
	} else {
		ids, scores = make([]uint64, k), make([]float32, k)
	}
	n, err := c.RecallInto(ctx, query, k, ids, scores, opts...)
	if err != nil {
		return nil, err
	}
	hits := make([]Hit, n)
	for i := range hits {
		hits[i] = Hit{ID: ids[i], Score: scores[i]}
	}
	return hits, nil
}

// RecallInto is Recall writing into caller slices: ids and scores must hold at least k
// elements. It returns the number of hits written (best first). The library writes
// directly into the slices; nothing is allocated.
func (c *Client) RecallInto(ctx context.Context, query []float32, k int, ids []uint64, scores []float32, opts ...RecallOption) (int, error) {
	if err := checkK("recall", k); err != nil {
		return 0, err
	}
	var a recallArgs
	if len(opts) > 0 {
		a = applyRecall(opts)
		if a.err != nil {
			return 0, a.err
		}
	}
	tmo, hasDL, err := deadline(ctx)
	if err != nil {
		return 0, err
	}
	a.timeoutMS = tmo
	h, err := c.acquire("recall")
	if err != nil {
		return 0, err
	}
	n, st, msg := cRecall(h, query, k, &a, ids, scores)
	c.mu.RUnlock()
	if st != StatusOK {
		return 0, callError("recall", st, msg, hasDL)
	}
	return n, nil
}

// RecallBatch recalls the top-k for each query of queries, nq×Dim() floats row-major,
// as one request; the server runs it as one batch. Result i belongs to query i.
func (c *Client) RecallBatch(ctx context.Context, queries []float32, k int, opts ...RecallOption) ([][]Hit, error) {
	if k < 0 || k > MaxK {
		return nil, newError("recall_batch", StatusKOutOfRange, kRangeMessage(k))
	}
	nq := 0
	if c.dim > 0 {
		nq = (len(queries) + c.dim - 1) / c.dim
	}
	ids := make([]uint64, nq*k)
	scores := make([]float32, nq*k)
	counts := make([]int, nq)
	if err := c.RecallBatchInto(ctx, queries, k, ids, scores, counts, opts...); err != nil {
		return nil, err
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	all := make([]Hit, total)
	out := make([][]Hit, nq)
	off := 0
	for q, n := range counts {
		hits := all[off : off+n : off+n]
		for i := range hits {
			hits[i] = Hit{ID: ids[q*k+i], Score: scores[q*k+i]}
		}
		out[q] = hits
		off += n
	}
	return out, nil
}

// RecallBatchInto is RecallBatch writing into caller slices: query i's hits go to
// ids[i*k:] and scores[i*k:] (at least nq×k each) and its hit count to counts[i] (at least
// nq), where nq = len(queries)/Dim().
func (c *Client) RecallBatchInto(ctx context.Context, queries []float32, k int, ids []uint64, scores []float32, counts []int, opts ...RecallOption) error {
	if err := checkK("recall_batch", k); err != nil {
		return err
	}
	var a recallArgs
	if len(opts) > 0 {
		a = applyRecall(opts)
		if a.err != nil {
			return a.err
		}
	}
	if a.lag != nil {
		return errLagUnreported("recall_batch")
	}
	tmo, hasDL, err := deadline(ctx)
	if err != nil {
		return err
	}
	a.timeoutMS = tmo
	nq := 0
	if c.dim > 0 {
		nq = (len(queries) + c.dim - 1) / c.dim
	}
	h, err := c.acquire("recall_batch")
	if err != nil {
		return err
	}
	st, msg := cRecallBatch(h, queries, nq, k, &a, ids, scores, counts)
	c.mu.RUnlock()
	if st != StatusOK {
		return callError("recall_batch", st, msg, hasDL)
	}
	return nil
}

// RecallWithPayloads is Recall that also returns each hit's payload. The payloads of
// one call share one buffer.
//
// The payload buffer is sized from the previous calls; when it is too small the library
// reports the size needed and the recall is repeated once with a buffer that fits.
func (c *Client) RecallWithPayloads(ctx context.Context, query []float32, k int, opts ...RecallOption) ([]Hit, error) {
	if k < 0 || k > MaxK {
		return nil, newError("recall_payloads", StatusKOutOfRange, kRangeMessage(k))
	}
	var a recallArgs
	if len(opts) > 0 {
		a = applyRecall(opts)
		if a.err != nil {
			return nil, a.err
		}
		if a.lag != nil {
			return nil, errLagUnreported("recall_payloads")
		}
	}
	ids := make([]uint64, k)
	scores := make([]float32, k)
	lens := make([]uint32, k)
	buf := make([]byte, c.payloadHint.Load())
	for attempt := 0; ; attempt++ {
		tmo, hasDL, err := deadline(ctx)
		if err != nil {
			return nil, err
		}
		a.timeoutMS = tmo
		h, err := c.acquire("recall_payloads")
		if err != nil {
			return nil, err
		}
		n, needed, st, msg := cRecallPayloads(h, query, k, &a, ids, scores, buf, lens)
		c.mu.RUnlock()
		if st == StatusBufferTooSmall && needed > len(buf) && attempt < 3 {
			c.raiseHint(needed)
			buf = make([]byte, needed)
			continue
		}
		if st != StatusOK {
			return nil, callError("recall_payloads", st, msg, hasDL)
		}
		hits := make([]Hit, n)
		off := 0
		for i := range hits {
			hits[i] = Hit{ID: ids[i], Score: scores[i]}
			if l := lens[i]; l != noPayload {
				hits[i].Payload = buf[off : off+int(l) : off+int(l)]
				off += int(l)
			}
		}
		return hits, nil
	}
}

// errLagUnreported is the error of a non-nil WithAllowStale lag on a recall that reports none.
func errLagUnreported(op string) error {
	return newError(op, StatusInvalidArgument,
		"WithAllowStale: the lag is reported by Recall and RecallInto only; pass a nil lag here")
}

// WriteSeqs returns this client's write token (cluster mode): per shard (index = shard), the
// log sequence of its last acknowledged write, 0 for none. Pass it to WithMinSeqs on a recall
// through any host, from any process or language, to read these writes. Empty on a single
// host and before the first write.
func (c *Client) WriteSeqs() ([]uint64, error) {
	seqs := make([]uint64, 16)
	for {
		h, err := c.acquire("write_seqs")
		if err != nil {
			return nil, err
		}
		n, st, msg := cWriteSeqs(h, seqs)
		c.mu.RUnlock()
		if st == StatusBufferTooSmall && n > len(seqs) {
			seqs = make([]uint64, n)
			continue
		}
		if st != StatusOK {
			return nil, callError("write_seqs", st, msg, false)
		}
		return seqs[:n:n], nil
	}
}

// maxPayloadHint caps the remembered payload buffer size: one huge response must not make
// every later call allocate that much (a response is bounded by the slot size anyway).
const maxPayloadHint = 1 << 20

func (c *Client) raiseHint(n int) {
	n = min(n, maxPayloadHint)
	for {
		old := c.payloadHint.Load()
		if int64(n) <= old || c.payloadHint.CompareAndSwap(old, int64(n)) {
			return
		}
	}
}

// Upsert inserts or replaces len(ids) memories; vectors holds len(ids)×Dim() floats,
// row-major. Both slices are passed to the library without a copy. It returns once the
// write is applied (and durable, with a data directory): every later recall from any
// process sees it.
func (c *Client) Upsert(ctx context.Context, ids []uint64, vectors []float32, opts ...UpsertOption) error {
	var a upsertArgs
	if len(opts) > 0 {
		a = applyUpsert(opts)
		if a.err != nil {
			return a.err
		}
	}
	tmo, hasDL, err := deadline(ctx)
	if err != nil {
		return err
	}
	a.timeoutMS = tmo
	h, err := c.acquire("upsert")
	if err != nil {
		return err
	}
	st, msg := cUpsert(h, ids, vectors, &a)
	c.mu.RUnlock()
	if st != StatusOK {
		return callError("upsert", st, msg, hasDL)
	}
	return nil
}

// The calls below have no per-call deadline in the C API: the handle's Timeout applies
// and the context is only checked before the request is sent.

// Delete deletes ids, all or nothing: if one is unknown nothing is deleted and the error
// matches ErrNotFound. It returns the number deleted.
func (c *Client) Delete(ctx context.Context, ids ...uint64) (int, error) {
	if _, _, err := deadline(ctx); err != nil {
		return 0, err
	}
	h, err := c.acquire("delete")
	if err != nil {
		return 0, err
	}
	n, st, msg := cDelete(h, ids)
	c.mu.RUnlock()
	if st != StatusOK {
		return 0, callError("delete", st, msg, false)
	}
	return int(n), nil
}

// DeleteNamespace deletes every memory of namespace ns and returns how many.
func (c *Client) DeleteNamespace(ctx context.Context, ns uint64) (int, error) {
	if _, _, err := deadline(ctx); err != nil {
		return 0, err
	}
	h, err := c.acquire("delete_namespace")
	if err != nil {
		return 0, err
	}
	n, st, msg := cDeleteNamespace(h, ns)
	c.mu.RUnlock()
	if st != StatusOK {
		return 0, callError("delete_namespace", st, msg, false)
	}
	return int(n), nil
}

// Clear deletes every memory and returns how many.
func (c *Client) Clear(ctx context.Context) (int, error) {
	if _, _, err := deadline(ctx); err != nil {
		return 0, err
	}
	h, err := c.acquire("clear")
	if err != nil {
		return 0, err
	}
	n, st, msg := cClear(h)
	c.mu.RUnlock()
	if st != StatusOK {
		return 0, callError("clear", st, msg, false)
	}
	return int(n), nil
}

// Get fetches memories by id: vector, namespace and payload. An unknown id fails the
// whole call with an error matching ErrNotFound.
func (c *Client) Get(ctx context.Context, ids ...uint64) ([]Memory, error) {
	n := len(ids)
	vecs := make([]float32, n*c.dim)
	nss := make([]uint64, n)
	lens := make([]uint32, n)
	buf := make([]byte, c.payloadHint.Load())
	for attempt := 0; ; attempt++ {
		if _, _, err := deadline(ctx); err != nil {
			return nil, err
		}
		h, err := c.acquire("get")
		if err != nil {
			return nil, err
		}
		needed, st, msg := cGet(h, ids, vecs, nss, buf, lens)
		c.mu.RUnlock()
		if st == StatusBufferTooSmall && needed > len(buf) && attempt < 3 {
			c.raiseHint(needed)
			buf = make([]byte, needed)
			continue
		}
		if st != StatusOK {
			return nil, callError("get", st, msg, false)
		}
		out := make([]Memory, n)
		off := 0
		for i := range out {
			out[i] = Memory{ID: ids[i], Namespace: nss[i], Vector: vecs[i*c.dim : (i+1)*c.dim : (i+1)*c.dim]}
			if l := lens[i]; l != noPayload {
				out[i].Payload = buf[off : off+int(l) : off+int(l)]
				off += int(l)
			}
		}
		return out, nil
	}
}

// DeleteWhere deletes every memory that matches filter and, when namespaces are given, lies
// in one of them (at most MaxFilterNamespaces). The server evaluates the filter, so every
// process deleting with the same filter deletes the same memories. It returns how many.
func (c *Client) DeleteWhere(ctx context.Context, filter *Filter, namespaces ...uint64) (int, error) {
	b, err := filter.Encode()
	if err != nil {
		return 0, err
	}
	if _, _, err := deadline(ctx); err != nil {
		return 0, err
	}
	h, err := c.acquire("delete_where")
	if err != nil {
		return 0, err
	}
	n, st, msg := cDeleteWhere(h, namespaces, b)
	c.mu.RUnlock()
	if st != StatusOK {
		return 0, callError("delete_where", st, msg, false)
	}
	return int(n), nil
}

// ListPage writes the ids of the live memories that opts selects, ascending, into ids (at
// most len(ids) of them) and returns how many it wrote and how many more match after the
// last one written. The listing is complete when n < len(ids) or remaining == 0; otherwise
// the next page starts after ids[n-1] (opts.After, opts.HasAfter). A memory that lives and
// matches throughout is listed exactly once and no id twice; writes between pages show in
// later pages. An empty ids only counts. Each request scans the table once, so pages of
// thousands of ids are cheap and pages of one are not. The context's deadline bounds each
// request of the call.
func (c *Client) ListPage(ctx context.Context, ids []uint64, opts ListOptions) (n int, remaining uint64, err error) {
	var filter []byte
	if opts.Filter != nil {
		if filter, err = opts.Filter.Encode(); err != nil {
			return 0, 0, err
		}
	}
	tmo, hasDL, err := deadline(ctx)
	if err != nil {
		return 0, 0, err
	}
	h, err := c.acquire("list")
	if err != nil {
		return 0, 0, err
	}
	n, remaining, st, msg := cList(h, opts.Namespaces, filter, opts.HasAfter, opts.After, tmo, ids)
	c.mu.RUnlock()
	if st != StatusOK {
		return 0, 0, callError("list", st, msg, hasDL)
	}
	return n, remaining, nil
}

// listPage is the page size of List and of ListPages given a size of 0 or less.
const listPage = 1 << 16

// ListPages iterates over the ids that opts selects, ascending, a page of at most pageSize
// ids at a time (listPage, 65536, for pageSize <= 0), each from the last id of the one
// before (see ListPage). An error ends the iteration as its last value. A page's slice is
// the caller's to keep.
func (c *Client) ListPages(ctx context.Context, opts ListOptions, pageSize int) iter.Seq2[[]uint64, error] {
	if pageSize <= 0 {
		pageSize = listPage
	}
	return func(yield func([]uint64, error) bool) {
		o := opts
		for {
			page := make([]uint64, pageSize)
			n, remaining, err := c.ListPage(ctx, page, o)
			if err != nil {
				yield(nil, err)
				return
			}
			if n > 0 && !yield(page[:n:n], nil) {
				return
			}
			if n < pageSize || remaining == 0 {
				return
			}
			o.After, o.HasAfter = page[n-1], true
		}
	}
}

// List returns every id that opts selects, ascending (ListPages in pages of 65536).
func (c *Client) List(ctx context.Context, opts ListOptions) ([]uint64, error) {
	var all []uint64
	for page, err := range c.ListPages(ctx, opts, 0) {
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
	}
	if all == nil {
		all = []uint64{}
	}
	return all, nil
}

// GetFields fetches the metadata fields of memories by id, one Fields per id (empty for a
// memory without fields). Timestamps come back as UTC time.Time, int64 fields as int64,
// tags sorted. An unknown id fails the whole call with an error matching ErrNotFound.
func (c *Client) GetFields(ctx context.Context, ids ...uint64) ([]Fields, error) {
	lens := make([]uint32, len(ids))
	buf := make([]byte, 64*len(ids))
	for attempt := 0; ; attempt++ {
		if _, _, err := deadline(ctx); err != nil {
			return nil, err
		}
		h, err := c.acquire("get_fields")
		if err != nil {
			return nil, err
		}
		needed, st, msg := cGetFields(h, ids, buf, lens)
		c.mu.RUnlock()
		if st == StatusBufferTooSmall && needed > len(buf) && attempt < 3 {
			buf = make([]byte, needed)
			continue
		}
		if st != StatusOK {
			return nil, callError("get_fields", st, msg, false)
		}
		out, err := decodeFields(buf, lens)
		if err != nil {
			return nil, newError("get_fields", StatusInternal, err.Error())
		}
		return out, nil
	}
}

// Stats returns the server's statistics.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	if _, _, err := deadline(ctx); err != nil {
		return Stats{}, err
	}
	h, err := c.acquire("stats")
	if err != nil {
		return Stats{}, err
	}
	s, st, msg := cStats(h)
	if st == StatusOK {
		s.RequestsBy, st, msg = cStatsOps(h)
	}
	c.mu.RUnlock()
	if st != StatusOK {
		return Stats{}, callError("stats", st, msg, false)
	}
	return s, nil
}

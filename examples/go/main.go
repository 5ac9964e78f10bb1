// Command memoryd is a small service-style example of the Kalos Go binding: an HTTP
// service that keeps per-user memories (one Kalos namespace per user) and recalls the most
// relevant ones for a query, as an LLM gateway would before each model call.
//
//	# a server in another process (or pass -role auto to embed one in this process)
//	kalosd serve --name memories --dim 64 &
//	PKG_CONFIG_PATH=/prefix/of/kalos/lib/pkgconfig go run ./examples/go -store memories -role client
//
//	curl -XPOST localhost:8080/users/alice/memories -d '{"id":1,"text":"alice drinks green tea"}'
//	curl -XPOST localhost:8080/users/alice/recall   -d '{"text":"what does alice drink?","k":3}'
//	curl -XDELETE localhost:8080/users/alice
//	curl localhost:8080/stats
//
// A real service computes embeddings with its embedding model and sends them in the
// "embedding" field; without one, this example uses a toy hashed bag-of-words embedding
// so that it runs with nothing else installed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"hash/fnv"
	"log"
	"math"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	kalos "github.com/kalos-dev/kalos/bindings/go"
)

func main() {
	store := flag.String("store", "memories", "Kalos store name")
	role := flag.String("role", "auto", "client (attach to kalosd) or auto (attach, else serve in-process)")
	dim := flag.Int("dim", 64, "embedding dimension (to create the store with -role auto)")
	addr := flag.String("addr", ":8080", "listen address")
	timeout := flag.Duration("timeout", 50*time.Millisecond, "deadline of one Kalos call")
	flag.Parse()

	opts := kalos.Options{Dim: *dim}
	switch *role {
	case "client":
		opts = kalos.Options{Role: kalos.RoleClient}
	case "auto":
	default:
		log.Fatalf("-role is client or auto")
	}
	m, err := newMemories(*store, opts, *timeout)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	srv := &http.Server{Addr: *addr, Handler: m.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	log.Printf("memoryd: store %q (dim %d, kalos %s) on %s", *store, m.dim, kalos.Version(), *addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// memories owns the Kalos client. If the server goes away (kalosd restarted), the next
// request reopens the store once.
type memories struct {
	name    string
	opts    kalos.Options
	timeout time.Duration
	dim     int

	mu sync.RWMutex
	c  *kalos.Client
}

func newMemories(name string, opts kalos.Options, timeout time.Duration) (*memories, error) {
	c, err := kalos.Open(name, opts)
	if err != nil {
		return nil, err
	}
	return &memories{name: name, opts: opts, timeout: timeout, dim: c.Dim(), c: c}, nil
}

func (m *memories) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.Close()
}

func (m *memories) client() *kalos.Client {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.c
}

// do runs f with the client, reopening the store once when its server is gone.
func (m *memories) do(f func(c *kalos.Client) error) error {
	c := m.client()
	err := f(c)
	if !errors.Is(err, kalos.ErrServerGone) {
		return err
	}
	m.mu.Lock()
	if m.c == c { // nobody reopened it meanwhile
		nc, oerr := kalos.Open(m.name, m.opts)
		if oerr != nil {
			m.mu.Unlock()
			return err
		}
		c.Close()
		m.c = nc
	}
	c = m.c
	m.mu.Unlock()
	return f(c)
}

// namespace maps a user to a Kalos namespace: every user's memories are scoped to it, and
// the scoped recall is exact (the filter runs inside the scan).
func namespace(user string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(user))
	return h.Sum64()
}

// embed is a toy embedding (hashed bag of words, L2-normalised). Replace with a model.
func embed(text string, dim int) []float32 {
	v := make([]float32, dim)
	for _, w := range strings.Fields(strings.ToLower(text)) {
		w = strings.Trim(w, ".,;:!?\"'()")
		if w == "" {
			continue
		}
		h := fnv.New32a()
		h.Write([]byte(w))
		x := h.Sum32()
		sign := float32(1)
		if x&1 == 1 {
			sign = -1
		}
		v[int(x>>1)%dim] += sign
	}
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	if n == 0 {
		v[0] = 1 // cosine needs a non-zero vector
		return v
	}
	for i := range v {
		v[i] /= float32(math.Sqrt(n))
	}
	return v
}

type memoryIn struct {
	ID        uint64    `json:"id"`
	Text      string    `json:"text"`
	Embedding []float32 `json:"embedding,omitempty"`
	TTLSec    int       `json:"ttl_seconds,omitempty"`
}

type recallIn struct {
	Text      string    `json:"text"`
	Embedding []float32 `json:"embedding,omitempty"`
	K         int       `json:"k"`
}

type hitOut struct {
	ID    uint64  `json:"id"`
	Score float32 `json:"score"`
	Text  string  `json:"text"`
}

func (m *memories) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /users/{user}/memories", m.handleRemember)
	mux.HandleFunc("POST /users/{user}/recall", m.handleRecall)
	mux.HandleFunc("DELETE /users/{user}", m.handleForget)
	mux.HandleFunc("GET /stats", m.handleStats)
	return mux
}

func (m *memories) handleRemember(w http.ResponseWriter, r *http.Request) {
	var in memoryIn
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	vec := in.Embedding
	if vec == nil {
		vec = embed(in.Text, m.dim)
	}
	opts := []kalos.UpsertOption{
		kalos.InNamespace(namespace(r.PathValue("user"))),
		kalos.WithPayloads([][]byte{[]byte(in.Text)}),
	}
	if in.TTLSec > 0 {
		opts = append(opts, kalos.WithTTL(time.Duration(in.TTLSec)*time.Second))
	}
	ctx, cancel := context.WithTimeout(r.Context(), m.timeout)
	defer cancel()
	// Note: ids are global to the store; a real service allocates them per memory.
	err := m.do(func(c *kalos.Client) error { return c.Upsert(ctx, []uint64{in.ID}, vec, opts...) })
	if err != nil {
		httpError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (m *memories) handleRecall(w http.ResponseWriter, r *http.Request) {
	var in recallIn
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if in.K == 0 {
		in.K = 5
	}
	q := in.Embedding
	if q == nil {
		q = embed(in.Text, m.dim)
	}
	ns := namespace(r.PathValue("user"))
	ctx, cancel := context.WithTimeout(r.Context(), m.timeout)
	defer cancel()
	var hits []kalos.Hit
	err := m.do(func(c *kalos.Client) (err error) {
		hits, err = c.RecallWithPayloads(ctx, q, in.K, kalos.WithNamespaces(ns))
		return err
	})
	if err != nil {
		httpError(w, err)
		return
	}
	out := make([]hitOut, len(hits))
	for i, h := range hits {
		out[i] = hitOut{ID: h.ID, Score: h.Score, Text: string(h.Payload)}
	}
	writeJSON(w, out)
}

func (m *memories) handleForget(w http.ResponseWriter, r *http.Request) {
	var n int
	err := m.do(func(c *kalos.Client) (err error) {
		n, err = c.DeleteNamespace(r.Context(), namespace(r.PathValue("user")))
		return err
	})
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, map[string]int{"deleted": n})
}

func (m *memories) handleStats(w http.ResponseWriter, r *http.Request) {
	var s kalos.Stats
	err := m.do(func(c *kalos.Client) (err error) {
		s, err = c.Stats(r.Context())
		return err
	})
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, map[string]any{
		"count": s.Count, "dim": s.Dim, "engine": s.EngineName, "requests": s.Requests,
		"server_p50_us": s.P50.Microseconds(), "server_p99_us": s.P99.Microseconds(),
	})
}

// httpError maps Kalos errors to HTTP statuses with errors.Is.
func httpError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, kalos.ErrDimensionMismatch), errors.Is(err, kalos.ErrNonFinite),
		errors.Is(err, kalos.ErrKOutOfRange), errors.Is(err, kalos.ErrInvalidArgument),
		errors.Is(err, kalos.ErrPayloadTooLarge), errors.Is(err, kalos.ErrTooLarge):
		code = http.StatusBadRequest
	case errors.Is(err, kalos.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, kalos.ErrStoreFull):
		code = http.StatusInsufficientStorage
	case errors.Is(err, kalos.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	case errors.Is(err, kalos.ErrServerGone):
		code = http.StatusServiceUnavailable
	}
	http.Error(w, err.Error(), code)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

package kalos

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"testing"
	"time"
)

func TestOpenServerAndClientRoundTrip(t *testing.T) {
	const dim, n = 16, 200
	srv := openServer(t, dim, Options{Metric: MetricIP})
	if srv.Dim() != dim {
		t.Fatalf("Dim() = %d", srv.Dim())
	}
	r := rand.New(rand.NewSource(1))
	vecs := randVecs(r, n, dim)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(1000 + i)
	}
	if err := srv.Upsert(bg(), ids, vecs); err != nil {
		t.Fatal(err)
	}
	// A second handle in the same process, attached as a client (dim 0 = the server's).
	cl, err := Open(srv.Name(), Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if cl.Dim() != dim {
		t.Fatalf("client Dim() = %d", cl.Dim())
	}
	for qi := 0; qi < 20; qi++ {
		q := randVecs(r, 1, dim)
		for _, k := range []int{1, 10, 64, 65, 300} {
			got, err := cl.Recall(bg(), q, k)
			if err != nil {
				t.Fatal(err)
			}
			checkHits(t, got, bruteForce(MetricIP, vecs, ids, dim, q, k, nil), 1e-3)
		}
	}
	// RoleAuto attaches to the live server.
	auto, err := Open(srv.Name(), Options{Dim: dim})
	if err != nil {
		t.Fatal(err)
	}
	st, err := auto.Stats(bg())
	if err != nil {
		t.Fatal(err)
	}
	if st.Count != n || st.Dim != dim || st.Metric != MetricIP || st.Engine != BackendCPU || st.EngineName == "" {
		t.Fatalf("stats %+v", st)
	}
	if st.FallbackReason != "" {
		t.Fatalf("an explicit CPU backend reports a fallback: %q", st.FallbackReason)
	}
	auto.Close()
}

// Backend auto: either the GPU serves, or Stats says why it does not.
func TestAutoBackendReportsFallbackReason(t *testing.T) {
	c, err := Open(storeName(t), Options{Role: RoleServer, Dim: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(bg())
	if err != nil {
		t.Fatal(err)
	}
	if st.Engine != BackendCUDA && st.FallbackReason == "" {
		t.Fatalf("CPU engine under backend auto without a reason: %+v", st)
	}
}

func TestRecallIntoWritesCallerSlices(t *testing.T) {
	const dim = 8
	c := openServer(t, dim, Options{Metric: MetricL2})
	r := rand.New(rand.NewSource(2))
	vecs := randVecs(r, 50, dim)
	ids := make([]uint64, 50)
	for i := range ids {
		ids[i] = uint64(i)
	}
	if err := c.Upsert(bg(), ids, vecs); err != nil {
		t.Fatal(err)
	}
	q := randVecs(r, 1, dim)
	outIDs := make([]uint64, 20)
	outScores := make([]float32, 20)
	n, err := c.RecallInto(bg(), q, 5, outIDs, outScores)
	if err != nil || n != 5 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	want := bruteForce(MetricL2, vecs, ids, dim, q, 5, nil)
	for i := 0; i < n; i++ {
		if outIDs[i] != want[i].ID {
			t.Fatalf("hit %d: id %d want %d", i, outIDs[i], want[i].ID)
		}
	}
	// k above the number of memories: count is the number of memories.
	n, err = c.RecallInto(bg(), q, 20, outIDs, outScores)
	if err != nil || n != 20 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.RecallInto(bg(), q, 10, outIDs, outScores); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("RecallInto allocates %.1f times per call", allocs)
	}
}

func TestRecallBatch(t *testing.T) {
	const dim, n, nq, k = 12, 300, 7, 9
	c := openServer(t, dim, Options{})
	r := rand.New(rand.NewSource(3))
	vecs := randVecs(r, n, dim)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i * 3)
	}
	if err := c.Upsert(bg(), ids, vecs); err != nil {
		t.Fatal(err)
	}
	qs := randVecs(r, nq, dim)
	res, err := c.RecallBatch(bg(), qs, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != nq {
		t.Fatalf("%d results", len(res))
	}
	for i := range res {
		checkHits(t, res[i], bruteForce(MetricCosine, vecs, ids, dim, qs[i*dim:(i+1)*dim], k, nil), 1e-4)
	}
	// Into form with caller buffers.
	bIDs := make([]uint64, nq*k)
	bScores := make([]float32, nq*k)
	counts := make([]int, nq)
	if err := c.RecallBatchInto(bg(), qs, k, bIDs, bScores, counts); err != nil {
		t.Fatal(err)
	}
	for i, cnt := range counts {
		if cnt != k || bIDs[i*k] != res[i][0].ID {
			t.Fatalf("query %d: count %d first %d want %d", i, cnt, bIDs[i*k], res[i][0].ID)
		}
	}
	// A ragged batch (not a multiple of dim) is rejected.
	if _, err := c.RecallBatch(bg(), qs[:len(qs)-1], k); err == nil {
		t.Fatal("ragged batch accepted")
	}
}

func TestNamespacesPayloadsGetDelete(t *testing.T) {
	const dim = 4
	c := openServer(t, dim, Options{Metric: MetricIP})
	vecs := []float32{
		1, 0, 0, 0,
		0.9, 0.1, 0, 0,
		0.8, 0, 0.2, 0,
		0, 1, 0, 0,
	}
	ids := []uint64{1, 2, 3, 4}
	payloads := [][]byte{[]byte("alice likes tea"), nil, {}, []byte("bob's memory")}
	if err := c.Upsert(bg(), ids, vecs, WithItemNamespaces([]uint64{7, 7, 8, 9}), WithPayloads(payloads)); err != nil {
		t.Fatal(err)
	}
	q := []float32{1, 0, 0, 0}
	hits, err := c.Recall(bg(), q, 10, WithNamespaces(7))
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) != 2 || hits[0].ID != 1 || hits[1].ID != 2 {
		t.Fatalf("namespace 7: %+v", hits)
	}
	hits, err = c.Recall(bg(), q, 10, WithNamespaces(8, 9))
	if err != nil || len(hits) != 2 || hits[0].ID != 3 || hits[1].ID != 4 {
		t.Fatalf("namespaces 8,9: %+v %v", hits, err)
	}
	ph, err := c.RecallWithPayloads(bg(), q, 4)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint64][]byte{}
	for _, h := range ph {
		byID[h.ID] = h.Payload
	}
	if string(byID[1]) != "alice likes tea" || byID[2] != nil || byID[3] == nil || len(byID[3]) != 0 || string(byID[4]) != "bob's memory" {
		t.Fatalf("payloads %q", byID)
	}
	mems, err := c.Get(bg(), 4, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if mems[0].ID != 4 || mems[0].Namespace != 9 || string(mems[0].Payload) != "bob's memory" || mems[0].Vector[1] != 1 {
		t.Fatalf("get: %+v", mems[0])
	}
	if mems[1].Namespace != 7 || string(mems[1].Payload) != "alice likes tea" || mems[2].Payload != nil {
		t.Fatalf("get: %+v", mems[1:])
	}
	// Upsert replaces: new vector, namespace and payload for id 1.
	if err := c.Upsert(bg(), []uint64{1}, []float32{0, 0, 0, 1}, InNamespace(8), WithPackedPayloads([]byte("new"), []uint32{3})); err != nil {
		t.Fatal(err)
	}
	mems, err = c.Get(bg(), 1)
	if err != nil || mems[0].Namespace != 8 || string(mems[0].Payload) != "new" || mems[0].Vector[3] != 1 {
		t.Fatalf("after replace: %+v %v", mems, err)
	}
	n, err := c.Delete(bg(), 2, 3)
	if err != nil || n != 2 {
		t.Fatalf("delete: %d %v", n, err)
	}
	n, err = c.DeleteNamespace(bg(), 8) // id 1 now
	if err != nil || n != 1 {
		t.Fatalf("delete namespace: %d %v", n, err)
	}
	n, err = c.Clear(bg())
	if err != nil || n != 1 {
		t.Fatalf("clear: %d %v", n, err)
	}
	hits, err = c.Recall(bg(), q, 5)
	if err != nil || len(hits) != 0 {
		t.Fatalf("after clear: %+v %v", hits, err)
	}
}

func TestPayloadBufferGrows(t *testing.T) {
	const dim = 4
	c := openServer(t, dim, Options{MaxPayloadBytes: 1 << 16})
	big := bytes.Repeat([]byte("x"), 60000)
	ids := []uint64{1, 2, 3}
	vecs := []float32{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}
	if err := c.Upsert(bg(), ids, vecs, WithPayloads([][]byte{big, big, big})); err != nil {
		t.Fatal(err)
	}
	hits, err := c.RecallWithPayloads(bg(), []float32{1, 1, 1, 0}, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hits {
		if !bytes.Equal(h.Payload, big) {
			t.Fatalf("payload of %d has %d bytes", h.ID, len(h.Payload))
		}
	}
	mems, err := c.Get(bg(), 3, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mems {
		if !bytes.Equal(m.Payload, big) {
			t.Fatalf("get payload of %d has %d bytes", m.ID, len(m.Payload))
		}
	}
}

func TestTTLAndRecency(t *testing.T) {
	const dim = 4
	c := openServer(t, dim, Options{Metric: MetricIP})
	if err := c.Upsert(bg(), []uint64{1}, []float32{1, 0, 0, 0}, WithTTL(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := c.Upsert(bg(), []uint64{2}, []float32{0.5, 0, 0, 0}, WithExpiry(time.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	hits, err := c.Recall(bg(), []float32{1, 0, 0, 0}, 5)
	if err != nil || len(hits) != 2 {
		t.Fatalf("before expiry: %+v %v", hits, err)
	}
	time.Sleep(120 * time.Millisecond)
	hits, err = c.Recall(bg(), []float32{1, 0, 0, 0}, 5)
	if err != nil || len(hits) != 1 || hits[0].ID != 2 {
		t.Fatalf("after expiry: %+v %v", hits, err)
	}
	// Recency: a fresh memory gets close to w*1 on top of (1-w)*score.
	hits, err = c.Recall(bg(), []float32{1, 0, 0, 0}, 5, WithRecency(0.5, time.Hour))
	if err != nil || len(hits) != 1 || hits[0].Score < 0.74 || hits[0].Score > 0.751 {
		t.Fatalf("recency: %+v %v", hits, err)
	}
}

func TestContextDeadlineAndCancel(t *testing.T) {
	c := openServer(t, 4, Options{})
	q := []float32{1, 0, 0, 0}
	ctx, cancel := context.WithCancel(bg())
	cancel()
	if _, err := c.Recall(ctx, q, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	if err := c.Upsert(ctx, []uint64{1}, q); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	if _, err := c.Get(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	ctx, cancel2 := context.WithDeadline(bg(), time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := c.Recall(ctx, q, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired ctx: %v", err)
	}
	// A live deadline is honoured and the call succeeds.
	ctx, cancel3 := context.WithTimeout(bg(), time.Second)
	defer cancel3()
	if _, err := c.Recall(ctx, q, 1); err != nil {
		t.Fatal(err)
	}
	// deadline() rounds up, never to 0 for a live deadline.
	ctx, cancel4 := context.WithTimeout(bg(), 100*time.Microsecond)
	defer cancel4()
	if ms, has, err := deadline(ctx); err == nil && (!has || ms != 1) {
		t.Fatalf("deadline of 100µs = %d ms", ms)
	}
}

func TestCloseIsIdempotentAndUseAfterCloseFails(t *testing.T) {
	c := openServer(t, 4, Options{})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	q := []float32{1, 0, 0, 0}
	checks := map[string]error{}
	_, checks["recall"] = c.Recall(bg(), q, 1)
	_, checks["recall_into"] = c.RecallInto(bg(), q, 1, make([]uint64, 1), make([]float32, 1))
	_, checks["recall_batch"] = c.RecallBatch(bg(), q, 1)
	_, checks["recall_payloads"] = c.RecallWithPayloads(bg(), q, 1)
	checks["upsert"] = c.Upsert(bg(), []uint64{1}, q)
	_, checks["delete"] = c.Delete(bg(), 1)
	_, checks["delete_namespace"] = c.DeleteNamespace(bg(), 1)
	_, checks["clear"] = c.Clear(bg())
	_, checks["get"] = c.Get(bg(), 1)
	_, checks["stats"] = c.Stats(bg())
	for op, err := range checks {
		var ke *Error
		if !errors.Is(err, ErrClosed) || !errors.As(err, &ke) || ke.Status != StatusClosed {
			t.Errorf("%s after Close: %v", op, err)
		}
	}
}

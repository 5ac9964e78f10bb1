package kalos

import (
	"errors"
	"math/rand"
	"testing"
)

// The cluster options on a single host (docs/CLUSTER.md): accepted, and satisfied at once.
// bindings/python/tests/test_cluster.py runs them against a cluster, with this package's
// testdata/clusterpeer as one of the writers and readers.
func TestConsistencyOptionsOnASingleHost(t *testing.T) {
	const dim = 8
	c := openServer(t, dim, Options{Metric: MetricIP})
	r := rand.New(rand.NewSource(7))
	vecs := randVecs(r, 20, dim)
	ids := make([]uint64, 20)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	if err := c.Upsert(bg(), ids, vecs, WithPayloads(make([][]byte, 20))); err != nil {
		t.Fatal(err)
	}
	tok, err := c.WriteSeqs()
	if err != nil || len(tok) != 0 {
		t.Fatalf("WriteSeqs on a single host = %v, %v; want an empty token", tok, err)
	}
	q := vecs[3*dim : 4*dim]
	want, err := c.Recall(bg(), q, 5)
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, got []Hit, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d hits, want %d", what, len(got), len(want))
		}
		for i := range got {
			if got[i].ID != want[i].ID || got[i].Score != want[i].Score {
				t.Fatalf("%s: hit %d = %+v, want %+v", what, i, got[i], want[i])
			}
		}
	}
	// A token with sequences no log has reached: ignored outside cluster mode, so the recall
	// answers instead of waiting for its deadline (TIMEOUT).
	far := []uint64{1 << 62, 1 << 62, 1 << 62}
	for name, opts := range map[string][]RecallOption{
		"read your writes":  {WithReadYourWrites()},
		"min seqs":          {WithMinSeqs(far)},
		"empty token":       {WithMinSeqs([]uint64{})},
		"allow stale (nil)": {WithAllowStale(nil)},
		"all":               {WithReadYourWrites(), WithMinSeqs(far), WithAllowStale(nil), WithNamespaces(0)},
	} {
		got, err := c.Recall(bg(), q, 5, opts...)
		same(name, got, err)
		got, err = c.RecallWithPayloads(bg(), q, 5, opts...)
		same(name+" with payloads", got, err)
		rows, err := c.RecallBatch(bg(), q, 5, opts...)
		if err != nil {
			t.Fatalf("%s batch: %v", name, err)
		}
		same(name+" batch", rows[0], nil)
	}
	// The lag of a stale-read recall is zero on a single host; it overwrites what was there.
	lag := Lag{Entries: 9, Disconnected: 9}
	got, err := c.Recall(bg(), q, 5, WithAllowStale(&lag), WithReadYourWrites())
	same("allow stale with lag", got, err)
	if lag != (Lag{}) {
		t.Fatalf("lag on a single host = %+v, want zero", lag)
	}
	idsBuf, scores := make([]uint64, 5), make([]float32, 5)
	lag = Lag{Entries: 1}
	if n, err := c.RecallInto(bg(), q, 5, idsBuf, scores, WithAllowStale(&lag)); err != nil || n != 5 || lag != (Lag{}) {
		t.Fatalf("RecallInto with lag: %d, %v, %+v", n, err, lag)
	}
	// A recall that cannot report the lag says so instead of leaving it untouched.
	if _, err := c.RecallWithPayloads(bg(), q, 5, WithAllowStale(&lag)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("RecallWithPayloads with a lag: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.RecallBatch(bg(), q, 5, WithAllowStale(&lag)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("RecallBatch with a lag: %v, want ErrInvalidArgument", err)
	}
	// A token of more shards than any store has is refused by every recall.
	big := make([]uint64, 4097)
	for name, err := range map[string]error{
		"recall":   second(c.Recall(bg(), q, 5, WithMinSeqs(big))),
		"payloads": second(c.RecallWithPayloads(bg(), q, 5, WithMinSeqs(big))),
		"batch":    second(c.RecallBatch(bg(), q, 5, WithMinSeqs(big))),
	} {
		var e *Error
		if !errors.As(err, &e) || e.Status != StatusInvalidArgument || e.Message == "" {
			t.Fatalf("%s with a 4097-entry token: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	c.Close()
	if _, err := c.WriteSeqs(); !errors.Is(err, ErrClosed) {
		t.Fatalf("WriteSeqs after Close: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }

// The cluster statuses are typed errors like every other status.
func TestClusterStatusesAreSentinels(t *testing.T) {
	for _, c := range []struct {
		st   Status
		name string
		err  error
	}{{StatusUnavailable, "UNAVAILABLE", ErrUnavailable}, {StatusStale, "STALE", ErrStale}} {
		e := callError("recall", c.st, c.name+": the replica of shard 1 may be behind its log", false)
		if !errors.Is(e, c.err) || c.st.String() != c.name || statusName(c.st) != c.name {
			t.Fatalf("%v: errors.Is(%v) = false, or name %q / %q", c.st, c.err, c.st.String(), statusName(c.st))
		}
	}
}

package kalos

import (
	"context"
	"errors"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many goroutines on one client: recalls checked against the reference, upserts, gets,
// stats and batches at once, under -race.
func TestManyGoroutinesOneClient(t *testing.T) {
	const dim, n = 32, 2000
	srv := openServer(t, dim, Options{Metric: MetricIP})
	r := rand.New(rand.NewSource(5))
	vecs := randVecs(r, n, dim)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)
	}
	if err := srv.Upsert(bg(), ids, vecs); err != nil {
		t.Fatal(err)
	}
	c, err := Open(srv.Name(), Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	workers := 4 * runtime.GOMAXPROCS(0)
	if workers < 16 {
		workers = 16
	}
	iters := 100
	if testing.Short() {
		iters = 30
	}
	var wg sync.WaitGroup
	var calls atomic.Int64
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rr := rand.New(rand.NewSource(int64(100 + w)))
			ids := make([]uint64, 10)
			scores := make([]float32, 10)
			for i := 0; i < iters; i++ {
				q := randVecs(rr, 1, dim)
				switch i % 5 {
				case 0, 1:
					ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
					got, err := c.Recall(ctx, q, 10, WithNamespaces(0))
					cancel()
					if err != nil {
						errc <- err
						return
					}
					ref := bruteForce(MetricIP, vecs, rowIDs(n), dim, q, 10, nil)
					for j := range ref {
						if got[j].ID != ref[j].ID {
							errc <- errors.New("concurrent recall differs from the reference")
							return
						}
					}
				case 2:
					if _, err := c.RecallInto(bg(), q, 10, ids, scores, WithNamespaces(0)); err != nil {
						errc <- err
						return
					}
				case 3:
					// Upserts of extra ids (namespace 1) that recalls in namespace 0 never see.
					id := uint64(100000 + w*1000 + i)
					if err := c.Upsert(bg(), []uint64{id}, q, InNamespace(1)); err != nil {
						errc <- err
						return
					}
					if m, err := c.Get(bg(), id); err != nil || m[0].Namespace != 1 {
						errc <- err
						return
					}
				case 4:
					if _, err := c.RecallBatch(bg(), append(q, q...), 3); err != nil {
						errc <- err
						return
					}
					if _, err := c.Stats(bg()); err != nil {
						errc <- err
						return
					}
				}
				calls.Add(1)
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("%d workers, %d calls", workers, calls.Load())
}

func rowIDs(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i)
	}
	return out
}

// Close while goroutines are calling: no crash, no race; every call either succeeds or
// fails with ErrClosed, and Close waits for calls in flight.
func TestCloseRacesCalls(t *testing.T) {
	const dim = 8
	srv := openServer(t, dim, Options{})
	if err := srv.Upsert(bg(), []uint64{1, 2, 3}, randVecs(rand.New(rand.NewSource(1)), 3, dim)); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		c, err := Open(srv.Name(), Options{Role: RoleClient})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var closedSeen atomic.Int64
		q := []float32{1, 2, 3, 4, 5, 6, 7, 8}
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					_, err := c.Recall(bg(), q, 2)
					if errors.Is(err, ErrClosed) {
						closedSeen.Add(1)
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		time.Sleep(time.Millisecond)
		var cw sync.WaitGroup
		for i := 0; i < 3; i++ { // concurrent Close calls too
			cw.Add(1)
			go func() { defer cw.Done(); c.Close() }()
		}
		cw.Wait()
		wg.Wait()
	}
}

// The finalizer closes a Client that was never closed (fallback only).
func TestFinalizerClosesForgottenClient(t *testing.T) {
	srv := openServer(t, 4, Options{})
	func() {
		c, err := Open(srv.Name(), Options{Role: RoleClient})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Recall(bg(), []float32{1, 0, 0, 0}, 1)
	}()
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	// Nothing to observe from outside but the absence of a crash or a leak report; the
	// store still serves.
	if _, err := srv.Recall(bg(), []float32{1, 0, 0, 0}, 1); err != nil {
		t.Fatal(err)
	}
}

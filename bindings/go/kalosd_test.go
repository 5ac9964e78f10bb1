package kalos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Cross-language: the table is loaded by kalosd (the Rust server, a separate process) from
// .npy files written here; Go recalls through shared memory and checks every result
// against a brute-force reference computed in Go.
func TestCrossLanguageKalosdLoadedTable(t *testing.T) {
	const n, dim, nsCount = 3000, 48, 5
	dir := t.TempDir()
	r := rand.New(rand.NewSource(42))
	vecs := randVecs(r, n, dim)
	ids := make([]uint64, n)
	nss := make([]uint64, n)
	seen := map[uint64]bool{}
	for i := range ids {
		for {
			id := r.Uint64() >> 1
			if !seen[id] {
				seen[id] = true
				ids[i] = id
				break
			}
		}
		nss[i] = uint64(100 + i%nsCount)
	}
	writeNpy(t, filepath.Join(dir, "v.npy"), vecs, n, dim)
	writeNpy(t, filepath.Join(dir, "ids.npy"), ids, n)
	writeNpy(t, filepath.Join(dir, "ns.npy"), nss, n)

	for _, metric := range []Metric{MetricCosine, MetricIP, MetricL2} {
		t.Run(metric.String(), func(t *testing.T) {
			name := storeName(t)
			d := startKalosd(t, name, "--dim", fmt.Sprint(dim), "--metric", metric.String(), "--backend", "cpu",
				"--load", filepath.Join(dir, "v.npy"), "--ids", filepath.Join(dir, "ids.npy"),
				"--namespaces", filepath.Join(dir, "ns.npy"))
			c, err := Open(name, Options{Role: RoleClient})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.Stats(bg())
			if err != nil {
				t.Fatal(err)
			}
			if st.Count != n || st.Dim != dim || st.Metric != metric || st.ServerPID != d.cmd.Process.Pid {
				t.Fatalf("stats %+v (kalosd pid %d)", st, d.cmd.Process.Pid)
			}
			tol := float32(1e-4)
			if metric == MetricL2 {
				tol = 1e-2
			}
			for qi := 0; qi < 25; qi++ {
				q := randVecs(r, 1, dim)
				got, err := c.Recall(bg(), q, 10)
				if err != nil {
					t.Fatal(err)
				}
				checkHits(t, got, bruteForce(metric, vecs, ids, dim, q, 10, nil), tol)
				ns := uint64(100 + qi%nsCount)
				got, err = c.Recall(bg(), q, 7, WithNamespaces(ns))
				if err != nil {
					t.Fatal(err)
				}
				checkHits(t, got, bruteForce(metric, vecs, ids, dim, q, 7, func(i int) bool { return nss[i] == ns }), tol)
			}
			// A batch too.
			qs := randVecs(r, 6, dim)
			res, err := c.RecallBatch(bg(), qs, 5)
			if err != nil {
				t.Fatal(err)
			}
			for i := range res {
				checkHits(t, res[i], bruteForce(metric, vecs, ids, dim, qs[i*dim:(i+1)*dim], 5, nil), tol)
			}
			// The stored vectors and namespaces are the ones written: bit for bit for ip and
			// l2; within float rounding for cosine (stored normalised, scaled back by Get).
			mems, err := c.Get(bg(), ids[0], ids[n-1])
			if err != nil {
				t.Fatal(err)
			}
			for j, row := range []int{0, n - 1} {
				if mems[j].Namespace != nss[row] {
					t.Fatalf("namespace of row %d: %d want %d", row, mems[j].Namespace, nss[row])
				}
				for x := 0; x < dim; x++ {
					got, want := mems[j].Vector[x], vecs[row*dim+x]
					if (metric != MetricCosine && got != want) || math.Abs(float64(got-want)) > 1e-6*(1+math.Abs(float64(want))) {
						t.Fatalf("vector of row %d differs at %d", row, x)
					}
				}
			}
		})
	}
}

// A kalosd killed with SIGKILL: the next call fails with ErrServerGone, well within its
// deadline, and does not hang.
func TestServerGoneAfterKill(t *testing.T) {
	name := storeName(t)
	d := startKalosd(t, name, "--dim", "8", "--backend", "cpu")
	c, err := Open(name, Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	if err := c.Upsert(bg(), []uint64{1}, q); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recall(bg(), q, 1); err != nil {
		t.Fatal(err)
	}
	d.kill()
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err = c.Recall(ctx, q, 1)
	wantErr(t, "recall after SIGKILL", err, ErrServerGone)
	if el := time.Since(t0); el > 3*time.Second {
		t.Fatalf("ErrServerGone took %v", el)
	}
	err = c.Upsert(bg(), []uint64{2}, q)
	wantErr(t, "upsert after SIGKILL", err, ErrServerGone)
	_, err = c.Stats(bg())
	wantErr(t, "stats after SIGKILL", err, ErrServerGone)
}

// A kalosd stopped cleanly with SIGTERM: ErrServerGone too, and reopening reaches a new
// server under the same name.
func TestServerGoneAfterSIGTERMAndReopen(t *testing.T) {
	name := storeName(t)
	d := startKalosd(t, name, "--dim", "4", "--backend", "cpu")
	c, err := Open(name, Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := []float32{1, 0, 0, 0}
	if _, err := c.Recall(bg(), q, 1); err != nil {
		t.Fatal(err)
	}
	d.stop()
	_, err = c.Recall(bg(), q, 1)
	wantErr(t, "recall after SIGTERM", err, ErrServerGone)
	startKalosd(t, name, "--dim", "4", "--backend", "cpu")
	c2, err := Open(name, Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Recall(bg(), q, 1); err != nil {
		t.Fatal(err)
	}
}

// A stopped (SIGSTOP) but live server: calls time out at the context deadline, or at the
// handle's Timeout without one, and work again once it continues.
func TestTimeouts(t *testing.T) {
	name := storeName(t)
	d := startKalosd(t, name, "--dim", "4", "--backend", "cpu")
	c, err := Open(name, Options{Role: RoleClient, Timeout: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := []float32{1, 0, 0, 0}
	if err := c.Upsert(bg(), []uint64{1}, q); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)

	ctx, cancel := context.WithTimeout(bg(), 80*time.Millisecond)
	t0 := time.Now()
	_, err = c.Recall(ctx, q, 1)
	el := time.Since(t0)
	cancel()
	wantErr(t, "recall, ctx deadline 80ms", err, ErrTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a timeout at the context deadline should match context.DeadlineExceeded: %v", err)
	}
	if el < 70*time.Millisecond || el > 2*time.Second {
		t.Fatalf("timed out after %v, deadline 80ms", el)
	}

	t0 = time.Now()
	_, err = c.Recall(bg(), q, 1)
	el = time.Since(t0)
	wantErr(t, "recall, handle timeout 150ms", err, ErrTimeout)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("the handle default timeout should not match context.DeadlineExceeded")
	}
	if el < 140*time.Millisecond || el > 2*time.Second {
		t.Fatalf("timed out after %v, handle timeout 150ms", el)
	}
	ctx, cancel = context.WithTimeout(bg(), 50*time.Millisecond)
	err = c.Upsert(ctx, []uint64{2}, q)
	cancel()
	wantErr(t, "upsert, ctx deadline 50ms", err, ErrTimeout)
	_, err = c.Delete(bg(), 1)
	wantErr(t, "delete, handle timeout", err, ErrTimeout)

	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := c.Recall(bg(), q, 1)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after SIGCONT: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package kalos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
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

// Cross-language, the other direction of writes: a C program writes memories through the C
// API (kalos_upsert with per-item namespaces and packed payloads) into a kalosd; Go reads
// them back bit for bit and checks recalls against a brute-force reference.
func TestCrossLanguageCWriter(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	libDir := os.Getenv("KALOS_LIB_DIR")
	if libDir == "" {
		libDir, _ = filepath.Abs("../../target/release")
	}
	inc, _ := filepath.Abs("../../include")
	bin := filepath.Join(t.TempDir(), "c_writer")
	out, err := exec.Command(gcc, "-O1", "-Wall", "-I", inc, "testdata/c_writer.c", "-L", libDir, "-lkalos",
		"-Wl,-rpath,"+libDir, "-o", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	const n, dim = 500, 24
	name := storeName(t)
	startKalosd(t, name, "--dim", fmt.Sprint(dim), "--metric", "ip", "--backend", "cpu")
	if out, err := exec.Command(bin, name, fmt.Sprint(n)).CombinedOutput(); err != nil {
		t.Fatalf("c_writer: %v\n%s", err, out)
	}
	c, err := Open(name, Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	vecs := make([]float32, n*dim)
	ids := make([]uint64, n)
	nss := make([]uint64, n)
	for i := 0; i < n; i++ {
		ids[i] = uint64(1000 + i)
		nss[i] = uint64(10 + i%3)
		for j := 0; j < dim; j++ {
			x := float32((i*31+j*17)%97)/97 - 0.5
			if j == i%dim {
				x += 1
			}
			vecs[i*dim+j] = x
		}
	}
	mems, err := c.Get(bg(), ids...)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range mems {
		if m.Namespace != nss[i] {
			t.Fatalf("id %d: namespace %d want %d", m.ID, m.Namespace, nss[i])
		}
		if i%5 == 4 {
			if m.Payload != nil {
				t.Fatalf("id %d: payload %q, want none", m.ID, m.Payload)
			}
		} else if string(m.Payload) != fmt.Sprintf("memory-%d", i) {
			t.Fatalf("id %d: payload %q", m.ID, m.Payload)
		}
		for j := range m.Vector {
			if m.Vector[j] != vecs[i*dim+j] {
				t.Fatalf("id %d: vector[%d] = %v want %v", m.ID, j, m.Vector[j], vecs[i*dim+j])
			}
		}
	}
	r := rand.New(rand.NewSource(9))
	for qi := 0; qi < 20; qi++ {
		q := randVecs(r, 1, dim)
		ns := uint64(10 + qi%3)
		got, err := c.RecallWithPayloads(bg(), q, 8, WithNamespaces(ns))
		if err != nil {
			t.Fatal(err)
		}
		want := bruteForce(MetricIP, vecs, ids, dim, q, 8, func(i int) bool { return nss[i] == ns })
		checkHits(t, got, want, 1e-4)
		for _, h := range got {
			i := int(h.ID - 1000)
			if (i%5 == 4) != (h.Payload == nil) {
				t.Fatalf("hit %d: payload %q", h.ID, h.Payload)
			}
		}
	}
}

// RoleAuto with no live server: this process becomes the server, and a client in the same
// process attaches to it.
func TestRoleAutoBecomesServer(t *testing.T) {
	name := storeName(t)
	a, err := Open(name, Options{Dim: 4, Backend: BackendCPU})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if st, err := a.Stats(bg()); err != nil || st.ServerPID != os.Getpid() {
		t.Fatalf("stats %+v %v; want this process (%d) as the server", st, err, os.Getpid())
	}
	b, err := Open(name, Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Upsert(bg(), []uint64{5}, []float32{0, 1, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if hits, err := b.Recall(bg(), []float32{0, 1, 0, 0}, 1); err != nil || len(hits) != 1 || hits[0].ID != 5 {
		t.Fatalf("%+v %v", hits, err)
	}
	// Closing the server handle stops the server: the client sees ErrServerGone.
	a.Close()
	_, err = b.Recall(bg(), []float32{0, 1, 0, 0}, 1)
	wantErr(t, "recall after the server handle closed", err, ErrServerGone)
}

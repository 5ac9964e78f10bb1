package kalos

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var nameSeq atomic.Int64

// storeName is unique per test and process, and valid for Kalos.
func storeName(t testing.TB) string {
	base := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		}
		return '_'
	}, t.Name())
	if len(base) > 60 {
		base = base[:60]
	}
	return fmt.Sprintf("gotest-%d-%d-%s", os.Getpid(), nameSeq.Add(1), base)
}

// openServer opens an in-process server (RoleServer) closed at test end.
func openServer(t testing.TB, dim int, o Options) *Client {
	t.Helper()
	o.Role = RoleServer
	o.Dim = dim
	if o.Backend == BackendAuto {
		o.Backend = BackendCPU
	}
	c, err := Open(storeName(t), o)
	if err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randVecs(r *rand.Rand, n, dim int) []float32 {
	v := make([]float32, n*dim)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// bruteForce is the reference top-k: cosine, ip or l2 over rows of vecs, ties by lower id.
func bruteForce(metric Metric, vecs []float32, ids []uint64, dim int, q []float32, k int, keep func(i int) bool) []Hit {
	norm := func(x []float32) float64 {
		s := 0.0
		for _, v := range x {
			s += float64(v) * float64(v)
		}
		return math.Sqrt(s)
	}
	qn := norm(q)
	var hits []Hit
	for i := 0; i*dim < len(vecs); i++ {
		if keep != nil && !keep(i) {
			continue
		}
		row := vecs[i*dim : (i+1)*dim]
		var s float64
		switch metric {
		case MetricL2:
			for j := range row {
				d := float64(row[j]) - float64(q[j])
				s += d * d
			}
		default:
			for j := range row {
				s += float64(row[j]) * float64(q[j])
			}
			if metric == MetricCosine || metric == MetricDefault {
				s /= norm(row) * qn
			}
		}
		hits = append(hits, Hit{ID: ids[i], Score: float32(s)})
	}
	sort.Slice(hits, func(a, b int) bool {
		if hits[a].Score != hits[b].Score {
			if metric == MetricL2 {
				return hits[a].Score < hits[b].Score
			}
			return hits[a].Score > hits[b].Score
		}
		return hits[a].ID < hits[b].ID
	})
	if len(hits) > k {
		hits = hits[:k]
	}
	return hits
}

// checkHits compares a result with the reference: same ids in order (random data has no
// near-ties at these sizes) and scores within tol.
func checkHits(t testing.TB, got, want []Hit, tol float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d hits, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i].ID || math.Abs(float64(got[i].Score-want[i].Score)) > float64(tol) {
			t.Fatalf("hit %d: got %+v, want %+v (all got %v want %v)", i, got[i], want[i], got, want)
		}
	}
}

// writeNpy writes a little-endian .npy file (format 1.0) of float32 or uint64 data.
func writeNpy(t testing.TB, path string, data any, shape ...int) {
	t.Helper()
	var descr string
	var body []byte
	switch d := data.(type) {
	case []float32:
		descr = "<f4"
		body = make([]byte, 4*len(d))
		for i, v := range d {
			binary.LittleEndian.PutUint32(body[4*i:], math.Float32bits(v))
		}
	case []uint64:
		descr = "<u8"
		body = make([]byte, 8*len(d))
		for i, v := range d {
			binary.LittleEndian.PutUint64(body[8*i:], v)
		}
	default:
		t.Fatalf("writeNpy: unsupported %T", data)
	}
	dims := make([]string, len(shape))
	for i, s := range shape {
		dims[i] = fmt.Sprint(s)
	}
	sh := strings.Join(dims, ", ")
	if len(shape) == 1 {
		sh += ","
	}
	hdr := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, sh)
	// magic(6) + version(2) + len(2) + header, padded with spaces to a multiple of 64, '\n'.
	pad := 64 - (10+len(hdr)+1)%64
	if pad == 64 {
		pad = 0
	}
	hdr += strings.Repeat(" ", pad) + "\n"
	out := []byte("\x93NUMPY\x01\x00")
	out = binary.LittleEndian.AppendUint16(out, uint16(len(hdr)))
	out = append(out, hdr...)
	out = append(out, body...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// kalosdPath finds the kalosd binary: $KALOSD, else the checkout's target/release or
// target/debug. Tests that need it skip without it.
func kalosdPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KALOSD"); p != "" {
		return p
	}
	for _, p := range []string{"../../target/release/kalosd", "../../target/debug/kalosd"} {
		if _, err := os.Stat(p); err == nil {
			abs, _ := filepath.Abs(p)
			return abs
		}
	}
	if os.Getenv("KALOS_REQUIRE_KALOSD") != "" {
		t.Fatal("kalosd not found (set KALOSD or build target/release/kalosd)")
	}
	t.Skip("kalosd not found (set KALOSD or run cargo build --release)")
	return ""
}

// kalosd is a server child process.
type kalosd struct {
	cmd  *exec.Cmd
	name string
	done chan struct{}
	out  strings.Builder
}

// startKalosd runs `kalosd serve --name NAME args...` and waits until it serves.
func startKalosd(t testing.TB, name string, args ...string) *kalosd {
	t.Helper()
	cmd := exec.Command(kalosdPath(t), append([]string{"serve", "--name", name}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k := &kalosd{cmd: cmd, name: name, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "serving") {
				close(ready)
				signalled = true
			}
		}
		if !signalled {
			close(ready)
		}
		cmd.Wait()
		close(k.done)
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		k.kill()
		t.Fatal("kalosd did not start within 60s")
	}
	select {
	case <-k.done:
		t.Fatalf("kalosd exited at start: %v", cmd.ProcessState)
	default:
	}
	t.Cleanup(k.stop)
	return k
}

func (k *kalosd) kill() {
	k.cmd.Process.Signal(syscall.SIGCONT)
	k.cmd.Process.Kill()
	<-k.done
	// A killed server leaves its segment and lock file behind; remove them so names do not
	// pile up.
	os.Remove("/dev/shm/kalos." + k.name)
	os.Remove("/dev/shm/kalos." + k.name + ".lock")
}

// stop ends the server with SIGTERM (a clean stop), or kills it after 10s.
func (k *kalosd) stop() {
	select {
	case <-k.done:
		os.Remove("/dev/shm/kalos." + k.name)
		return
	default:
	}
	k.cmd.Process.Signal(syscall.SIGCONT)
	k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		k.kill()
	}
}

func bg() context.Context { return context.Background() }

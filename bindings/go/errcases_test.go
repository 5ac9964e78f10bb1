package kalos

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wantErr checks that err is an *Error of the status, matching its sentinel, with the
// library's message (non-empty unless the error is made in Go).
func wantErr(t *testing.T, what string, err error, sentinel error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, sentinel)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: %v, want %v", what, err, sentinel)
	}
	var ke *Error
	if !errors.As(err, &ke) {
		t.Fatalf("%s: %T is not *Error", what, err)
	}
	if ke.Status.Err() != sentinel {
		t.Fatalf("%s: status %v does not map to %v", what, ke.Status, sentinel)
	}
	if ke.Message == "" {
		t.Fatalf("%s: empty library message in %v", what, err)
	}
	t.Logf("%s: %v", what, err)
}

func TestLibraryErrors(t *testing.T) {
	const dim = 4
	c := openServer(t, dim, Options{Capacity: 4, MaxPayloadBytes: 16, SlotBytes: 8192})
	q := []float32{1, 0, 0, 0}
	ids := make([]uint64, 8)
	scores := make([]float32, 8)

	t.Run("dimension", func(t *testing.T) {
		_, err := c.Recall(bg(), []float32{1, 0, 0}, 1)
		wantErr(t, "recall dim 3", err, ErrDimensionMismatch)
		err = c.Upsert(bg(), []uint64{1}, []float32{1, 2, 3, 4, 5})
		wantErr(t, "upsert 5 floats", err, ErrDimensionMismatch)
		_, err = Open(c.Name(), Options{Role: RoleClient, Dim: dim + 1})
		wantErr(t, "client with another dim", err, ErrDimensionMismatch)
	})
	t.Run("non-finite", func(t *testing.T) {
		_, err := c.Recall(bg(), []float32{float32(math.NaN()), 0, 0, 0}, 1)
		wantErr(t, "NaN query", err, ErrNonFinite)
		err = c.Upsert(bg(), []uint64{1}, []float32{float32(math.Inf(1)), 0, 0, 0})
		wantErr(t, "Inf vector", err, ErrNonFinite)
	})
	t.Run("k", func(t *testing.T) {
		_, err := c.RecallInto(bg(), q, 0, ids, scores)
		wantErr(t, "k=0", err, ErrKOutOfRange)
		_, err = c.RecallInto(bg(), q, 1025, ids, scores)
		wantErr(t, "k=1025", err, ErrKOutOfRange)
		_, err = c.Recall(bg(), q, 0)
		wantErr(t, "Recall k=0", err, ErrKOutOfRange)
		_, err = c.Recall(bg(), q, 1025)
		wantErr(t, "Recall k=1025", err, ErrKOutOfRange)
		_, err = c.RecallBatch(bg(), q, 1025)
		wantErr(t, "RecallBatch k=1025", err, ErrKOutOfRange)
		_, err = c.RecallWithPayloads(bg(), q, 0)
		wantErr(t, "RecallWithPayloads k=0", err, ErrKOutOfRange)
	})
	t.Run("buffer too small", func(t *testing.T) {
		_, err := c.RecallInto(bg(), q, 5, ids[:4], scores)
		wantErr(t, "ids shorter than k", err, ErrBufferTooSmall)
		err = c.RecallBatchInto(bg(), append(q, q...), 2, ids[:3], scores, make([]int, 2))
		wantErr(t, "batch ids shorter than nq*k", err, ErrBufferTooSmall)
	})
	t.Run("invalid argument", func(t *testing.T) {
		ns := make([]uint64, MaxFilterNamespaces+1)
		_, err := c.Recall(bg(), q, 1, WithNamespaces(ns...))
		wantErr(t, "65 namespaces", err, ErrInvalidArgument)
		_, err = c.Recall(bg(), q, 1, WithRecency(2, 1))
		wantErr(t, "recency weight 2", err, ErrInvalidArgument)
		err = c.Upsert(bg(), []uint64{1}, q, WithPackedPayloads([]byte("ab"), []uint32{3}))
		wantErr(t, "payload lengths past the buffer", err, ErrInvalidArgument)
	})
	t.Run("payload too large", func(t *testing.T) {
		err := c.Upsert(bg(), []uint64{1}, q, WithPayloads([][]byte{make([]byte, 17)}))
		wantErr(t, "17-byte payload, max 16", err, ErrPayloadTooLarge)
	})
	t.Run("store full", func(t *testing.T) {
		err := c.Upsert(bg(), []uint64{1}, make([]float32, dim))
		wantErr(t, "zero vector under cosine", err, ErrInvalidArgument)
		full := make([]float32, 16)
		for i := range full {
			full[i] = float32(i + 1)
		}
		if err := c.Upsert(bg(), []uint64{1, 2, 3, 4}, full); err != nil {
			t.Fatal(err)
		}
		err = c.Upsert(bg(), []uint64{5}, q)
		wantErr(t, "fifth memory, capacity 4", err, ErrStoreFull)
		// Replacing an existing id still works at capacity.
		if err := c.Upsert(bg(), []uint64{4}, q); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("not found", func(t *testing.T) {
		_, err := c.Delete(bg(), 1, 999)
		wantErr(t, "delete unknown id", err, ErrNotFound)
		if m, err := c.Get(bg(), 1); err != nil || len(m) != 1 {
			t.Fatalf("delete with an unknown id deleted something: %v %v", m, err)
		}
		_, err = c.Get(bg(), 999)
		wantErr(t, "get unknown id", err, ErrNotFound)
		_, err = Open("gotest-no-such-store-"+c.Name(), Options{Role: RoleClient})
		wantErr(t, "client of a missing store", err, ErrNotFound)
	})
	t.Run("too large for a slot", func(t *testing.T) {
		// One memory of 4 KB of vector and a 4 KB payload cannot fit an 8 KB slot: such options
		// are refused at open, naming the values.
		_, err := Open("gotest-toolarge-"+c.Name(), Options{Role: RoleServer, Dim: 1024, SlotBytes: 8192, MaxPayloadBytes: 4096})
		wantErr(t, "options whose largest memory cannot fit a slot", err, ErrInvalidArgument)
		if err == nil || !strings.Contains(err.Error(), "max_payload_bytes = 4096") {
			t.Fatalf("the error does not name the values: %v", err)
		}
		// With room for it, the same memory travels.
		const bigDim = 1024
		big := openServer(t, bigDim, Options{SlotBytes: 16384, MaxPayloadBytes: 4096})
		v := make([]float32, bigDim)
		v[0] = 1
		if err := big.Upsert(bg(), []uint64{1}, v, WithPayloads([][]byte{make([]byte, 4096)})); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("name", func(t *testing.T) {
		for _, name := range []string{"", "bad/name", "white space", strings.Repeat("a", 201), "nul\x00inside"} {
			_, err := Open(name, Options{Dim: 4})
			wantErr(t, "name "+name, err, ErrInvalidName)
		}
	})
	t.Run("already exists", func(t *testing.T) {
		_, err := Open(c.Name(), Options{Role: RoleServer, Dim: dim})
		wantErr(t, "second server", err, ErrAlreadyExists)
	})
	t.Run("invalid options", func(t *testing.T) {
		_, err := Open(storeName(t), Options{Role: RoleServer})
		wantErr(t, "server without dim", err, ErrInvalidArgument)
		_, err = Open(storeName(t), Options{Role: RoleServer, Dim: 4, Slots: -1})
		wantErr(t, "negative slots", err, ErrInvalidArgument)
		_, err = Open(storeName(t), Options{Role: RoleServer, Dim: 4, SlotBytes: 100})
		wantErr(t, "slot_bytes below 4096", err, ErrInvalidArgument)
	})
}

func TestLockedDataDir(t *testing.T) {
	// A directory the library creates (0700): t.TempDir() itself is 0755, which a data
	// directory may not be.
	dir := filepath.Join(t.TempDir(), "data")
	a, err := Open(storeName(t), Options{Role: RoleServer, Dim: 4, DataDir: dir, Backend: BackendCPU})
	if err != nil && strings.Contains(err.Error(), "not implemented") {
		t.Skipf("this library has no persistence yet: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = Open(storeName(t), Options{Role: RoleServer, Dim: 4, DataDir: dir, Backend: BackendCPU})
	wantErr(t, "second server on one data dir", err, ErrLocked)
}

func TestBackendUnavailable(t *testing.T) {
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Skip("a GPU is present")
	}
	_, err := Open(storeName(t), Options{Role: RoleServer, Dim: 4, Backend: BackendCUDA})
	wantErr(t, "CUDA backend without a GPU", err, ErrBackendUnavailable)
}

// A segment that is not Kalos's, or of another layout version, is refused on attach.
// (This writes /dev/shm/kalos.NAME by hand; the magic is the segment's first 8 bytes and
// the layout version the next 4.)
func TestForeignSegments(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	write := func(name string, magic string, version uint32) {
		b := make([]byte, 4096)
		copy(b, magic)
		binary.LittleEndian.PutUint32(b[8:], version)
		p := filepath.Join("/dev/shm", "kalos."+name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Skip(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	n1 := storeName(t)
	write(n1, "NOTKALOS", 1)
	_, err := Open(n1, Options{Role: RoleClient})
	wantErr(t, "foreign magic", err, ErrCorrupt)
	n2 := storeName(t)
	write(n2, "KALOSSHM", 999)
	_, err = Open(n2, Options{Role: RoleClient})
	wantErr(t, "layout version 999", err, ErrVersionMismatch)
	n3 := storeName(t)
	write(n3, "KALOSSHM", 1) // right magic and version, nonsense sizes
	_, err = Open(n3, Options{Role: RoleClient})
	wantErr(t, "inconsistent header", err, ErrCorrupt)
}

// A segment owned by another user is refused (needs root to chown the test segment).
func TestPermissionDenied(t *testing.T) {
	name := storeName(t)
	p := filepath.Join("/dev/shm", "kalos."+name)
	if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
		t.Skip(err)
	}
	defer os.Remove(p)
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Skipf("cannot chown (not root): %v", err)
	}
	_, err := Open(name, Options{Role: RoleClient})
	wantErr(t, "segment of another uid", err, ErrPermissionDenied)
}

package kalos

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Device shards (Options.DeviceShards, Options.Placement): a sharded store answers every recall
// exactly like an unsharded one holding the same memories (same ids, same scores, same order),
// with and without namespace filters, single and batched. Vectors and queries hold small
// integers, so every ip and l2 score is exact in float32 whatever the summation order, and ties
// are common: both stores must break them the same way (lower id first). The seed is logged;
// KALOS_TEST_SEED=n replays a run.

const (
	shardsDim        = 16
	shardsRows       = 4000
	shardsNamespaces = 12
)

func shardsRand(t *testing.T) *rand.Rand {
	seed, err := strconv.ParseInt(os.Getenv("KALOS_TEST_SEED"), 10, 64)
	if err != nil {
		seed = rand.Int63()
	}
	t.Logf("seed %d (KALOS_TEST_SEED=%d to replay)", seed, seed)
	return rand.New(rand.NewSource(seed))
}

func intVecs(r *rand.Rand, n int) []float32 {
	v := make([]float32, n*shardsDim)
	for i := range v {
		v[i] = float32(r.Intn(7) - 3)
	}
	return v
}

// writeSame applies one random history of writes to every client: upserts with payloads, a
// tenth replaced with new vectors and namespaces (moving between shards under namespace
// placement), 300 deleted by id, one namespace deleted. It returns the live count.
func writeSame(t *testing.T, r *rand.Rand, cs ...*Client) int {
	t.Helper()
	ids := make([]uint64, shardsRows)
	seen := map[uint64]bool{}
	for i := range ids {
		for ids[i] == 0 || seen[ids[i]] {
			ids[i] = uint64(r.Int63n(1 << 40))
		}
		seen[ids[i]] = true
	}
	vecs := intVecs(r, shardsRows)
	ns := make([]uint64, shardsRows)
	payloads := make([][]byte, shardsRows)
	for i := range ns {
		ns[i] = uint64(r.Intn(shardsNamespaces))
		payloads[i] = []byte(fmt.Sprintf("memory %d", ids[i]))
	}
	perm := r.Perm(shardsRows)
	again := make([]uint64, shardsRows/10)
	againNS := make([]uint64, len(again))
	for i := range again {
		again[i] = ids[perm[i]]
		againNS[i] = uint64(r.Intn(shardsNamespaces))
	}
	againVecs := intVecs(r, len(again))
	gone := make([]uint64, 300)
	for i := range gone {
		gone[i] = ids[perm[len(perm)-1-i]]
	}
	live := -1
	for _, c := range cs {
		if err := c.Upsert(bg(), ids, vecs, WithItemNamespaces(ns), WithPayloads(payloads)); err != nil {
			t.Fatal(err)
		}
		if err := c.Upsert(bg(), again, againVecs, WithItemNamespaces(againNS)); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Delete(bg(), gone...); err != nil || n != len(gone) {
			t.Fatalf("delete: %d, %v", n, err)
		}
		if _, err := c.DeleteNamespace(bg(), 5); err != nil {
			t.Fatal(err)
		}
		s, err := c.Stats(bg())
		if err != nil {
			t.Fatal(err)
		}
		if live >= 0 && int(s.Count) != live {
			t.Fatalf("counts differ: %d and %d", live, s.Count)
		}
		live = int(s.Count)
	}
	return live
}

// randomNamespaces: nil (every namespace) or 1 to 3 namespaces, sometimes the deleted one or
// one never used.
func randomNamespaces(r *rand.Rand) []RecallOption {
	if r.Float64() < 0.4 {
		return nil
	}
	ns := make([]uint64, 1+r.Intn(3))
	for i := range ns {
		ns[i] = uint64(r.Intn(shardsNamespaces + 2))
	}
	return []RecallOption{WithNamespaces(ns...)}
}

// sameAnswer runs call on both clients and fails unless both answer alike; it returns the answer.
func sameAnswer[T any](t *testing.T, what string, sharded, plain *Client, call func(*Client) (T, error)) T {
	t.Helper()
	a, err := call(sharded)
	if err != nil {
		t.Fatalf("%s: sharded: %v", what, err)
	}
	b, err := call(plain)
	if err != nil {
		t.Fatalf("%s: unsharded: %v", what, err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("%s: sharded %v, unsharded %v", what, a, b)
	}
	return a
}

func checkSameAnswers(t *testing.T, r *rand.Rand, sharded, plain *Client, live int) {
	t.Helper()
	for i := 0; i < 300; i++ {
		q, k, opts := intVecs(r, 1), 1+r.Intn(50), randomNamespaces(r)
		what := fmt.Sprintf("recall %d (k %d, filtered %v)", i, k, opts != nil)
		a := sameAnswer(t, what, sharded, plain, func(c *Client) ([]Hit, error) { return c.Recall(bg(), q, k, opts...) })
		if opts == nil && len(a) != min(k, live) {
			t.Fatalf("%s: %d hits, want %d", what, len(a), min(k, live))
		}
	}
	for i := 0; i < 20; i++ {
		q, k, opts := intVecs(r, 1), 1+r.Intn(50), randomNamespaces(r)
		sameAnswer(t, fmt.Sprintf("recall with payloads %d", i), sharded, plain,
			func(c *Client) ([]Hit, error) { return c.RecallWithPayloads(bg(), q, k, opts...) })
	}
	hits := 0
	for i := 0; i < 20; i++ {
		qs, k, opts := intVecs(r, 2+r.Intn(38)), 1+r.Intn(50), randomNamespaces(r)
		what := fmt.Sprintf("batch %d (k %d, filtered %v)", i, k, opts != nil)
		for _, row := range sameAnswer(t, what, sharded, plain,
			func(c *Client) ([][]Hit, error) { return c.RecallBatch(bg(), qs, k, opts...) }) {
			hits += len(row)
		}
	}
	if hits == 0 {
		t.Fatal("no batch found any memory")
	}
}

func TestShardedStoreAnswersLikeUnsharded(t *testing.T) {
	for _, tc := range []struct {
		placement Placement
		metric    Metric
	}{{PlacementID, MetricIP}, {PlacementNamespace, MetricL2}} {
		t.Run(tc.placement.String(), func(t *testing.T) {
			r := shardsRand(t)
			sharded := openServer(t, shardsDim, Options{Metric: tc.metric, Capacity: 20000, DeviceShards: 3, Placement: tc.placement})
			plain := openServer(t, shardsDim, Options{Metric: tc.metric, Capacity: 20000})
			for c, want := range map[*Client]bool{sharded: true, plain: false} {
				s, err := c.Stats(bg())
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(s.EngineName, "shards3x[") != want || (!want && strings.HasPrefix(s.EngineName, "shards")) {
					t.Fatalf("engine %q (sharded: %v)", s.EngineName, want)
				}
			}
			live := writeSame(t, r, sharded, plain)
			if live < shardsRows/2 {
				t.Fatalf("%d live memories", live)
			}
			checkSameAnswers(t, r, sharded, plain, live)
		})
	}
}

func TestDeviceShardsOptionsAreChecked(t *testing.T) {
	o := Options{Role: RoleServer, Dim: 4, Backend: BackendCPU}
	with := func(f func(*Options)) Options {
		c := o
		f(&c)
		return c
	}
	_, err := Open(storeName(t), with(func(o *Options) { o.DeviceShards = MaxDeviceShards + 1 }))
	wantErr(t, "65 shards", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "device_shards = 65") {
		t.Fatalf("65 shards: %v", err)
	}
	_, err = Open(storeName(t), with(func(o *Options) { o.DeviceShards = -1 }))
	wantErr(t, "negative shards", err, ErrInvalidArgument)
	_, err = Open(storeName(t), with(func(o *Options) { o.DeviceShards = 2; o.Placement = 7 }))
	wantErr(t, "placement 7", err, ErrInvalidArgument)
	// A sharded CUDA store: one CUDA engine a shard where there is a GPU, else a clear error.
	if g, err := Open(storeName(t), with(func(o *Options) { o.DeviceShards = 2; o.Backend = BackendCUDA })); err == nil {
		s, serr := g.Stats(bg())
		g.Close()
		if serr != nil || !strings.HasPrefix(s.EngineName, "shards2x[cuda") {
			t.Fatalf("sharded CUDA store: %v %v", s.EngineName, serr)
		}
	} else {
		wantErr(t, "sharded CUDA", err, ErrBackendUnavailable)
	}
	// GPUs: ignored by the CPU backend; on CUDA, device 63 exists on no host: a clear error
	// (or no CUDA at all).
	for _, mask := range []uint64{GPUsAll, 1, 0b11, 1 << 63} {
		g, err := Open(storeName(t), with(func(o *Options) { o.DeviceShards = 2; o.GPUs = mask }))
		if err != nil {
			t.Fatalf("GPUs %#x on the CPU backend: %v", mask, err)
		}
		s, serr := g.Stats(bg())
		g.Close()
		if serr != nil || !strings.HasPrefix(s.EngineName, "shards2x[cpu") {
			t.Fatalf("GPUs %#x: engine %q, %v", mask, s.EngineName, serr)
		}
	}
	if g, err := Open(storeName(t), with(func(o *Options) { o.GPUs = 1 << 63; o.Backend = BackendCUDA })); err == nil {
		g.Close()
		t.Fatal("GPUs = device 63 on CUDA opened")
	} else if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrBackendUnavailable) {
		t.Fatalf("GPUs = device 63 on CUDA: %v", err)
	}
	if Placement(7).String() != "Placement(7)" || PlacementNamespace.String() != "namespace" {
		t.Fatalf("placement names: %v %v", Placement(7), PlacementNamespace)
	}
	// One shard is one table; the largest count opens.
	for shards, prefix := range map[int]string{1: "cpu", MaxDeviceShards: "shards64x["} {
		c, err := Open(storeName(t), with(func(o *Options) { o.DeviceShards = shards; o.Placement = PlacementNamespace }))
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Stats(bg())
		c.Close()
		if err != nil || !strings.HasPrefix(s.EngineName, prefix) {
			t.Fatalf("%d shards: engine %q, %v", shards, s.EngineName, err)
		}
	}
}

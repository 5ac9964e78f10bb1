package kalos

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"
)

// Benchmarks of the recall round trip against a server in another process.
//
// With KALOS_BENCH_STORE=NAME they attach to a running store (bench.sh starts kalosd,
// fills it and runs the C reference program bench/recall_bench.c against the same
// store); otherwise they start their own kalosd with KALOS_BENCH_N (default 10000) random
// vectors of KALOS_BENCH_DIM (default 128). k is KALOS_BENCH_K (default 10).
//
// Besides ns/op they report the p50 and p99 of the individual round trips.

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func benchClient(b *testing.B) *Client {
	b.Helper()
	name := os.Getenv("KALOS_BENCH_STORE")
	if name == "" {
		n, dim := envInt("KALOS_BENCH_N", 10000), envInt("KALOS_BENCH_DIM", 128)
		name = storeName(b)
		startKalosd(b, name, "--dim", fmt.Sprint(dim))
		c, err := Open(name, Options{Role: RoleClient})
		if err != nil {
			b.Fatal(err)
		}
		r := rand.New(rand.NewSource(1))
		for at := 0; at < n; at += 4096 {
			m := min(4096, n-at)
			ids := make([]uint64, m)
			for i := range ids {
				ids[i] = uint64(at + i)
			}
			if err := c.Upsert(context.Background(), ids, randVecs(r, m, dim)); err != nil {
				b.Fatal(err)
			}
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	c, err := Open(name, Options{Role: RoleClient})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
}

func BenchmarkRecall(b *testing.B) {
	c := benchClient(b)
	k := envInt("KALOS_BENCH_K", 10)
	r := rand.New(rand.NewSource(2))
	const pool = 256
	qs := randVecs(r, pool, c.Dim())
	ctx := context.Background()
	ids := make([]uint64, k)
	scores := make([]float32, k)
	for i := 0; i < 2000; i++ { // warm up the server, the caches and the spin path
		if _, err := c.RecallInto(ctx, qs[(i%pool)*c.Dim():(i%pool+1)*c.Dim()], k, ids, scores); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("RecallInto", func(b *testing.B) {
		lat := make([]time.Duration, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			q := qs[(i%pool)*c.Dim() : (i%pool+1)*c.Dim()]
			t0 := time.Now()
			if _, err := c.RecallInto(ctx, q, k, ids, scores); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(t0)
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
	b.Run("Recall", func(b *testing.B) {
		lat := make([]time.Duration, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			q := qs[(i%pool)*c.Dim() : (i%pool+1)*c.Dim()]
			t0 := time.Now()
			if _, err := c.Recall(ctx, q, k); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(t0)
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
	b.Run("RecallCtxDeadline", func(b *testing.B) {
		dctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		lat := make([]time.Duration, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			q := qs[(i%pool)*c.Dim() : (i%pool+1)*c.Dim()]
			t0 := time.Now()
			if _, err := c.RecallInto(dctx, q, k, ids, scores); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(t0)
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
}

// BenchmarkCgoCall is the fixed cost of one cgo transition into libkalos.so (a call that
// does no work), the floor of what the binding adds per call.
func BenchmarkCgoCall(b *testing.B) {
	for i := 0; i < b.N; i++ {
		_ = statusName(StatusTimeout)
	}
}

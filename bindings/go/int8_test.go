package kalos

import (
	"context"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// TestInt8ScanAnswersLikeExact opens an exact and an int8 store with the same rows: every
// answer must be identical (ids and scores), and the int8 store counts its queries.
func TestInt8ScanAnswersLikeExact(t *testing.T) {
	ctx := context.Background()
	const dim, n = 24, 2000
	r := rand.New(rand.NewSource(9))
	vecs := randVecs(r, n, dim)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(3 * i)
	}
	ex := openServer(t, dim, Options{Metric: MetricL2})
	q8 := openServer(t, dim, Options{Metric: MetricL2, ScanInt8: true, Rerank: 100})
	for _, c := range []*Client{ex, q8} {
		if err := c.Upsert(ctx, ids, vecs); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 10; i++ {
		q := randVecs(r, 1, dim)
		a, err := ex.Recall(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		b, err := q8.Recall(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("query %d: exact %v, int8 %v", i, a, b)
		}
	}
	s, err := q8.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.EngineName, "int8") || s.RerankQueries != 10 || s.RerankUncertain > 10 {
		t.Fatalf("int8 stats: %+v", s)
	}
}

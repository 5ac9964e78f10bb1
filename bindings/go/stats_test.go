package kalos

import (
	"errors"
	"testing"
)

// Stats.RequestsBy counts each answered request under its op and status.
func TestStatsCountsRequestsByOpAndStatus(t *testing.T) {
	const dim = 8
	c := openServer(t, dim, Options{})
	vec := make([]float32, dim)
	vec[0] = 1
	for i := uint64(1); i <= 2; i++ {
		if err := c.Upsert(bg(), []uint64{i}, vec); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if _, err := c.Recall(bg(), vec, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Get(bg(), 99); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of an unknown id: %v, want ErrNotFound", err)
	}
	st, err := c.Stats(bg())
	if err != nil {
		t.Fatal(err)
	}
	by := map[[2]string]uint64{}
	for _, oc := range st.RequestsBy {
		if oc.Count == 0 {
			t.Errorf("zero counter listed: %+v", oc)
		}
		by[[2]string{oc.Op, oc.Status.String()}] = oc.Count
	}
	want := map[[2]string]uint64{
		{"upsert", "OK"}:     2,
		{"recall", "OK"}:     3,
		{"get", "NOT_FOUND"}: 1,
		{"stats", "OK"}:      1, // the first request of this Stats call
	}
	for k, n := range want {
		if by[k] != n {
			t.Errorf("RequestsBy[%v] = %d, want %d (all: %+v)", k, by[k], n, st.RequestsBy)
		}
	}
	if len(by) != len(want) {
		t.Errorf("RequestsBy has %d counters, want %d: %+v", len(by), len(want), st.RequestsBy)
	}
}

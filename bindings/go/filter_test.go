package kalos

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand"
	"os"
	"reflect"
	"sort"
	"testing"
	"time"
)

// filterCases are the filters of tests/data/filter_vectors.jsonl, built with the Go builders.
func filterCases() map[string]*Filter {
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	return map[string]*Filter{
		"eq_keyword":               Eq("user", "ann"),
		"eq_int":                   Eq("n", 42),
		"eq_negative_int":          Eq("n", int64(-7)),
		"eq_float":                 Eq("score", 0.5),
		"eq_bool":                  Eq("done", true),
		"eq_timestamp":             Eq("at", at),
		"lt_timestamp_before_1970": Lt("at", time.Date(1969, 12, 31, 23, 59, 59, 999500000, time.UTC)),
		"ne":                       Ne("user", "bob"),
		"gt_float":                 Gt("score", 1.25),
		"lte_int":                  Lte("n", -3),
		"range":                    And(Gte("n", 3), Lt("n", 9)),
		"in":                       In("kind", "fact", "pref"),
		"in_list_shorthand":        In("n", 1, 2),
		"nin":                      Nin("n", 1, 2, 3),
		"in_empty":                 In("kind"),
		"nin_empty":                Nin("kind"),
		"exists":                   Exists("archived"),
		"not_exists":               Not(Exists("archived")),
		"contains":                 Contains("tags", "urgent"),
		"field_not":                Not(Eq("user", "ann")),
		"and_flat":                 And(Eq("a", 1), And(Eq("b", 2), Eq("c", 3))),
		"or":                       Or(Eq("user", "ann"), Eq("agent", "x")),
		"nested":                   And(Or(Eq("user", "ann"), Contains("tags", "urgent")), Not(Exists("archived"))),
		"unicode":                  Eq("名前", "ünï"),
	}
}

// TestFilterVectors checks that the Go builders produce the bytes the Python builders
// produce for the same filters (the shared vectors file).
func TestFilterVectors(t *testing.T) {
	f, err := os.Open("../../tests/data/filter_vectors.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cases := filterCases()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var v struct{ Name, Hex string }
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		seen[v.Name] = true
		c, ok := cases[v.Name]
		if !ok {
			t.Errorf("vector %q has no Go case", v.Name)
			continue
		}
		b, err := c.Encode()
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		if got := hex.EncodeToString(b); got != v.Hex {
			t.Errorf("%s = %s: bytes\n got %s\nwant %s", v.Name, c, got, v.Hex)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for name := range cases {
		if !seen[name] {
			t.Errorf("Go case %q is not in the vectors file", name)
		}
	}
}

func TestFilterEncodeErrors(t *testing.T) {
	deep := Eq("a", 1)
	for i := 0; i < MaxFilterDepth; i++ {
		deep = Not(deep)
	}
	for _, c := range []struct {
		f    *Filter
		want string
	}{
		{Eq("", 1), "field name"},
		{Eq("x", []int{1}), "unsupported value"},
		{Eq("x", []string{"a"}), "tags value is not allowed"},
		{Gt("x", math.NaN()), "not finite"},
		{Lt("x", math.Inf(-1)), "not finite"},
		{Eq("x", uint64(math.MaxInt64)+1), "does not fit int64"},
		{In("x", 1, struct{}{}), "unsupported value"},
		{And(Eq("a", 1), nil), "nil filter"},
		{deep, "deeper than 32"},
	} {
		_, err := c.f.Encode()
		if !errors.Is(err, ErrInvalidArgument) || !contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want INVALID_ARGUMENT with %q", c.f, err, c.want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestFilteredRecall checks filtered recall against a brute-force reference, DeleteWhere and
// GetFields, through a client handle of an in-process server.
func TestFilteredRecall(t *testing.T) {
	const dim, n = 8, 600
	srv := openServer(t, dim, Options{Metric: MetricIP})
	cl, err := Open(srv.Name(), Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := rand.New(rand.NewSource(7))
	vecs := randVecs(r, n, dim)
	ids := make([]uint64, n)
	fields := make([]Fields, n)
	users := []string{"ann", "bob", "cy"}
	base := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	for i := range ids {
		ids[i] = uint64(i + 1)
		fields[i] = Fields{"user": users[i%3], "n": i, "score": float64(i) / 10, "at": base.Add(time.Duration(i) * time.Minute)}
		if i%5 == 0 {
			fields[i]["tags"] = []string{"urgent", "x"}
		}
		if i%7 == 0 {
			fields[i]["done"] = true
		}
	}
	if err := cl.Upsert(bg(), ids, vecs, WithFields(fields)); err != nil {
		t.Fatal(err)
	}
	match := map[string]func(i int) bool{
		"ann":         func(i int) bool { return i%3 == 0 },
		"ann_n>=300":  func(i int) bool { return i%3 == 0 && i >= 300 },
		"urgent|done": func(i int) bool { return i%5 == 0 || i%7 == 0 },
		"not_done":    func(i int) bool { return i%7 != 0 },
		"at<+10min":   func(i int) bool { return i < 10 },
		"score_in":    func(i int) bool { return i == 5 || i == 50 },
	}
	filters := map[string]*Filter{
		"ann":         Eq("user", "ann"),
		"ann_n>=300":  And(Eq("user", "ann"), Gte("n", 300)),
		"urgent|done": Or(Contains("tags", "urgent"), Eq("done", true)),
		"not_done":    Ne("done", true),
		"at<+10min":   Lt("at", base.Add(10*time.Minute)),
		"score_in":    In("score", 0.5, 5.0),
	}
	for name, f := range filters {
		for qi := 0; qi < 5; qi++ {
			q := randVecs(r, 1, dim)
			const k = 20
			got, err := cl.Recall(bg(), q, k, WithFilter(f))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			type hit struct {
				id uint64
				s  float64
			}
			var want []hit
			for i := 0; i < n; i++ {
				if match[name](i) {
					var s float64
					for d := 0; d < dim; d++ {
						s += float64(vecs[i*dim+d]) * float64(q[d])
					}
					want = append(want, hit{ids[i], s})
				}
			}
			sort.Slice(want, func(a, b int) bool { return want[a].s > want[b].s })
			if len(want) > k {
				want = want[:k]
			}
			if len(got) != len(want) {
				t.Fatalf("%s: %d hits, want %d", name, len(got), len(want))
			}
			// Ties aside, the ids are the reference's; every hit matches the filter and
			// has the reference's score at its rank.
			for j := range got {
				if !match[name](int(got[j].ID-1)) || math.Abs(float64(got[j].Score)-want[j].s) > 1e-4 {
					t.Fatalf("%s: hit %d = %d (%v), want %d (%v)", name, j, got[j].ID, got[j].Score, want[j].id, want[j].s)
				}
			}
		}
	}

	fs, err := cl.GetFields(bg(), 1, 6, 2)
	if err != nil {
		t.Fatal(err)
	}
	want0 := Fields{"user": "ann", "n": int64(0), "score": 0.0, "at": base, "tags": []string{"urgent", "x"}, "done": true}
	if !reflect.DeepEqual(fs[0], want0) {
		t.Errorf("fields of id 1 = %#v, want %#v", fs[0], want0)
	}
	if fs[1]["n"] != int64(5) || fs[2]["user"] != "bob" || len(fs[2]) != 4 {
		t.Errorf("fields of ids 6, 2 = %#v, %#v", fs[1], fs[2])
	}
	if _, err := cl.GetFields(bg(), 99999); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetFields(unknown) err = %v, want ErrNotFound", err)
	}

	// A field typed int64 by the first write cannot take a string.
	err = cl.Upsert(bg(), []uint64{1}, vecs[:dim], WithFields([]Fields{{"n": "five"}}))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("upsert of a string into an int64 field: err = %v", err)
	}
	if err := cl.Upsert(bg(), []uint64{1}, vecs[:dim], WithFields([]Fields{{"n": math.NaN()}})); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("upsert of NaN: err = %v", err)
	}
	if _, err := cl.Recall(bg(), vecs[:dim], 5, WithFilter(Eq("n", struct{}{}))); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("recall with a bad filter: err = %v", err)
	}
	if got, err := cl.Recall(bg(), vecs[:dim], 5, WithFilter(nil)); err != nil || len(got) != 5 {
		t.Errorf("recall WithFilter(nil) = %v, %v; want 5 unfiltered hits", got, err)
	}
	if _, err := cl.DeleteWhere(bg(), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("DeleteWhere(nil) err = %v", err)
	}

	// DeleteWhere from the client; the server's handle sees the same store.
	del, err := cl.DeleteWhere(bg(), Eq("user", "bob"))
	if err != nil || del != n/3 {
		t.Fatalf("DeleteWhere(user=bob) = %d, %v; want %d", del, err, n/3)
	}
	if got, err := srv.Recall(bg(), vecs[:dim], 10, WithFilter(Eq("user", "bob"))); err != nil || len(got) != 0 {
		t.Fatalf("recall of deleted: %v, %v", got, err)
	}
	// Namespaces narrow a DeleteWhere: everything is in namespace 0.
	if del, err := cl.DeleteWhere(bg(), Eq("user", "ann"), 5); err != nil || del != 0 {
		t.Fatalf("DeleteWhere in namespace 5 = %d, %v", del, err)
	}
	if del, err := srv.DeleteWhere(bg(), And(Eq("user", "ann"), Lt("n", 30)), 0); err != nil || del != 10 {
		t.Fatalf("DeleteWhere(ann, n<30) = %d, %v", del, err)
	}
}

// TestList checks List, ListPage and ListPages against a reference: filters, namespaces,
// pages of several sizes walked with the cursor, counting, deletes between pages, and errors,
// through a client handle of an in-process server with small slots (a page of a call takes
// several requests).
func TestList(t *testing.T) {
	const dim, n = 4, 3000
	srv := openServer(t, dim, Options{Metric: MetricIP, SlotBytes: 4096, MaxPayloadBytes: 1024})
	cl, err := Open(srv.Name(), Options{Role: RoleClient})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := rand.New(rand.NewSource(11))
	ids := make([]uint64, n)
	seen := map[uint64]bool{}
	for i := range ids {
		for {
			ids[i] = r.Uint64()
			if !seen[ids[i]] {
				seen[ids[i]] = true
				break
			}
		}
	}
	users := []string{"ann", "bob", "cy"}
	fields := make([]Fields, n)
	nss := make([]uint64, n)
	for i := range ids {
		fields[i] = Fields{"user": users[i%3], "n": i}
		nss[i] = uint64(i % 2)
	}
	if err := cl.Upsert(bg(), ids, randVecs(r, n, dim), WithFields(fields), WithItemNamespaces(nss)); err != nil {
		t.Fatal(err)
	}
	want := func(keep func(i int) bool) []uint64 {
		out := []uint64{}
		for i, id := range ids {
			if keep(i) {
				out = append(out, id)
			}
		}
		sort.Slice(out, func(a, b int) bool { return out[a] < out[b] })
		return out
	}
	cases := []struct {
		name string
		opts ListOptions
		keep func(i int) bool
	}{
		{"all", ListOptions{}, func(int) bool { return true }},
		{"bob", ListOptions{Filter: Eq("user", "bob")}, func(i int) bool { return i%3 == 1 }},
		{"ns1", ListOptions{Namespaces: []uint64{1}}, func(i int) bool { return i%2 == 1 }},
		{"ann_ns0_n<900", ListOptions{Filter: And(Eq("user", "ann"), Lt("n", 900)), Namespaces: []uint64{0}},
			func(i int) bool { return i%3 == 0 && i%2 == 0 && i < 900 }},
		{"none", ListOptions{Filter: Eq("user", "zed")}, func(int) bool { return false }},
	}
	for _, c := range cases {
		w := want(c.keep)
		got, err := cl.List(bg(), c.opts)
		if err != nil || !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: List = %d ids, %v; want %d", c.name, len(got), err, len(w))
		}
		for _, size := range []int{1, 13, 600} {
			var paged []uint64
			for page, err := range cl.ListPages(bg(), c.opts, size) {
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 || len(page) > size {
					t.Fatalf("%s: a page of %d ids (size %d)", c.name, len(page), size)
				}
				paged = append(paged, page...)
			}
			if len(paged) != len(w) || (len(w) > 0 && !reflect.DeepEqual(paged, w)) {
				t.Fatalf("%s: pages of %d: %d ids, want %d", c.name, size, len(paged), len(w))
			}
		}
		// Counting only, and the remaining count of a first page.
		if k, rest, err := cl.ListPage(bg(), nil, c.opts); err != nil || k != 0 || rest != uint64(len(w)) {
			t.Fatalf("%s: count = %d, %d, %v; want %d", c.name, k, rest, err, len(w))
		}
		buf := make([]uint64, 10)
		if k, rest, err := cl.ListPage(bg(), buf, c.opts); err != nil || k != min(10, len(w)) || rest != uint64(len(w)-k) {
			t.Fatalf("%s: first page = %d, %d, %v", c.name, k, rest, err)
		}
	}

	// Deletes between pages: an id ahead of the cursor is not listed; the rest are, once.
	all := want(func(int) bool { return true })
	page := make([]uint64, 100)
	k, _, err := cl.ListPage(bg(), page, ListOptions{})
	if err != nil || k != 100 {
		t.Fatalf("first page: %d, %v", k, err)
	}
	gone := all[500]
	if _, err := srv.Delete(bg(), gone); err != nil {
		t.Fatal(err)
	}
	rest, err := cl.List(bg(), ListOptions{After: page[99], HasAfter: true})
	if err != nil {
		t.Fatal(err)
	}
	wantRest := append(append([]uint64{}, all[100:500]...), all[501:]...)
	if !reflect.DeepEqual(rest, wantRest) {
		t.Fatalf("after a delete ahead of the cursor: %d ids, want %d", len(rest), len(wantRest))
	}

	if _, err := cl.List(bg(), ListOptions{Filter: Eq("n", struct{}{})}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("List with a bad filter: err = %v", err)
	}
	many := make([]uint64, MaxFilterNamespaces+1)
	if _, err := cl.List(bg(), ListOptions{Namespaces: many}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("List with %d namespaces: err = %v", len(many), err)
	}
	ctx, cancel := context.WithCancel(bg())
	cancel()
	if _, err := cl.List(ctx, ListOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("List with a cancelled context: err = %v", err)
	}
	cl.Close()
	if _, err := cl.List(bg(), ListOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("List on a closed client: err = %v", err)
	}
}

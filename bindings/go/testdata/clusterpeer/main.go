// clusterpeer: the Go side of the Python binding's cross-language tests
// (bindings/python/tests/test_cluster.py and test_device_shards.py). It attaches to a running
// store as a client and does one thing:
//
//	clusterpeer write STORE ID NAMESPACE V,V,...   upserts one memory; prints the client's
//	                                               write token (WriteSeqs), comma-separated
//	clusterpeer read STORE NAMESPACE TOKEN V,V,...  one recall (k = 1) of NAMESPACE with TOKEN
//	                                               (comma-separated; "" = none) as WithMinSeqs;
//	                                               prints the hit's id, or "none"
//	clusterpeer recall STORE                       reads requests from stdin, one a line:
//	                                               "K NAMESPACES QUERY;QUERY;..." (NAMESPACES
//	                                               comma-separated, "-" = all; a QUERY is
//	                                               V,V,...); one query is a Recall, several a
//	                                               RecallBatch. Prints one line per query: its
//	                                               hits as ID:SCORE separated by spaces (SCORE
//	                                               in the shortest form that reads back as the
//	                                               same float32)
//
// Errors go to stderr with exit status 1 (2 for bad usage).
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	kalos "github.com/kalos-dev/kalos/bindings/go"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: clusterpeer write STORE ID NAMESPACE V,V,... | read STORE NAMESPACE TOKEN V,V,... | recall STORE")
	os.Exit(2)
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "clusterpeer: %s: %v\n", what, err)
	os.Exit(1)
}

func u64(s string) uint64 {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		fail("argument", err)
	}
	return v
}

func list[T any](s string, parse func(string) (T, error)) []T {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		v, err := parse(f)
		if err != nil {
			fail("list "+s, err)
		}
		out = append(out, v)
	}
	return out
}

func parseF32(s string) (float32, error) {
	v, err := strconv.ParseFloat(s, 32)
	return float32(v), err
}

func parseU64(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }

// recall answers the requests of `clusterpeer recall` read from stdin.
func recall(ctx context.Context, c *kalos.Client) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			usage()
		}
		k := int(u64(f[0]))
		var opts []kalos.RecallOption
		if f[1] != "-" {
			opts = append(opts, kalos.WithNamespaces(list(f[1], parseU64)...))
		}
		var queries []float32
		qs := strings.Split(f[2], ";")
		for _, q := range qs {
			queries = append(queries, list(q, parseF32)...)
		}
		var hits [][]kalos.Hit
		if len(qs) == 1 {
			h, err := c.Recall(ctx, queries, k, opts...)
			if err != nil {
				fail("recall", err)
			}
			hits = [][]kalos.Hit{h}
		} else {
			h, err := c.RecallBatch(ctx, queries, k, opts...)
			if err != nil {
				fail("recall batch", err)
			}
			hits = h
		}
		for _, row := range hits {
			s := make([]string, len(row))
			for i, h := range row {
				s[i] = strconv.FormatUint(h.ID, 10) + ":" + strconv.FormatFloat(float64(h.Score), 'g', -1, 32)
			}
			fmt.Fprintln(out, strings.Join(s, " "))
		}
	}
	if err := in.Err(); err != nil {
		fail("stdin", err)
	}
}

func main() {
	args := map[string]int{"write": 6, "read": 6, "recall": 3}
	if len(os.Args) < 2 || args[os.Args[1]] != len(os.Args) {
		usage()
	}
	c, err := kalos.Open(os.Args[2], kalos.Options{Role: kalos.RoleClient, Timeout: 10 * time.Second})
	if err != nil {
		fail("open", err)
	}
	defer c.Close()
	ctx := context.Background()
	switch os.Args[1] {
	case "recall":
		recall(ctx, c)
	case "write":
		v := list(os.Args[5], parseF32)
		if err := c.Upsert(ctx, []uint64{u64(os.Args[3])}, v, kalos.InNamespace(u64(os.Args[4]))); err != nil {
			fail("upsert", err)
		}
		tok, err := c.WriteSeqs()
		if err != nil {
			fail("write token", err)
		}
		s := make([]string, len(tok))
		for i, q := range tok {
			s[i] = strconv.FormatUint(q, 10)
		}
		fmt.Println(strings.Join(s, ","))
	case "read":
		q := list(os.Args[5], parseF32)
		hits, err := c.Recall(ctx, q, 1, kalos.WithNamespaces(u64(os.Args[3])), kalos.WithMinSeqs(list(os.Args[4], parseU64)))
		if err != nil {
			fail("recall", err)
		}
		if len(hits) == 0 {
			fmt.Println("none")
		} else {
			fmt.Println(hits[0].ID)
		}
	default:
		usage()
	}
}

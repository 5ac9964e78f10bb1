// clusterpeer: the Go side of the Python binding's cross-language cluster test
// (bindings/python/tests/test_cluster.py). It attaches to one kalosd of a cluster as a client
// and does one thing:
//
//	clusterpeer write STORE ID NAMESPACE V,V,...   upserts one memory; prints the client's
//	                                               write token (WriteSeqs), comma-separated
//	clusterpeer read STORE NAMESPACE TOKEN V,V,...  one recall (k = 1) of NAMESPACE with TOKEN
//	                                               (comma-separated; "" = none) as WithMinSeqs;
//	                                               prints the hit's id, or "none"
//
// Errors go to stderr with exit status 1 (2 for bad usage).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	kalos "github.com/kalos-dev/kalos/bindings/go"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: clusterpeer write STORE ID NAMESPACE V,V,... | read STORE NAMESPACE TOKEN V,V,...")
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

func main() {
	if len(os.Args) != 6 {
		usage()
	}
	c, err := kalos.Open(os.Args[2], kalos.Options{Role: kalos.RoleClient, Timeout: 10 * time.Second})
	if err != nil {
		fail("open", err)
	}
	defer c.Close()
	ctx := context.Background()
	switch os.Args[1] {
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

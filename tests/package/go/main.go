// A Go program outside the checkout: its module requires the binding from the module proxy
// tree in dist/ and links the installed library through pkg-config (tests/package/run.sh).
// Usage: consumer STORE_NAME EXPECTED_VERSION
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	kalos "github.com/kalos-dev/kalos/bindings/go"
)

func main() {
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "go:", err)
		os.Exit(1)
	}
}

func run(name, version string) error {
	if v := kalos.Version(); v != version {
		return fmt.Errorf("library version %s, expected %s", v, version)
	}
	c, err := kalos.Open(name, kalos.Options{Role: kalos.RoleServer, Dim: 4, Metric: kalos.MetricIP, Backend: kalos.BackendCPU})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	vecs := []float32{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}
	if err := c.Upsert(ctx, []uint64{10, 20, 30}, vecs); err != nil {
		return err
	}
	hits, err := c.Recall(ctx, []float32{0, 0.2, 0.9, 0}, 2)
	if err != nil {
		return err
	}
	if len(hits) != 2 || hits[0].ID != 30 || hits[1].ID != 20 {
		return fmt.Errorf("recall gave %+v", hits)
	}
	if _, err := c.Get(ctx, 99); !errors.Is(err, kalos.ErrNotFound) {
		return fmt.Errorf("get of an unknown id: %v, want ErrNotFound", err)
	}
	fmt.Printf("go: ok, kalos %s, top ids %d %d\n", kalos.Version(), hits[0].ID, hits[1].ID)
	return nil
}

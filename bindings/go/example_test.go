package kalos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	kalos "github.com/kalos-dev/kalos/bindings/go"
)

// A process that opens with the default role (auto) and finds no server becomes it: the
// embedded mode, nothing else running. Other processes attach with RoleClient.
func Example() {
	name := fmt.Sprintf("example-%d", os.Getpid())
	c, err := kalos.Open(name, kalos.Options{Dim: 4, Metric: kalos.MetricIP})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	const alice, bob = 1, 2
	err = c.Upsert(ctx, []uint64{10, 11, 12}, []float32{
		1, 0, 0, 0,
		0, 1, 0, 0,
		0.9, 0.1, 0, 0,
	}, kalos.WithItemNamespaces([]uint64{alice, alice, bob}),
		kalos.WithPayloads([][]byte{[]byte("likes tea"), []byte("has a dog"), []byte("likes coffee")}))
	if err != nil {
		panic(err)
	}
	hits, err := c.RecallWithPayloads(ctx, []float32{1, 0, 0, 0}, 2, kalos.WithNamespaces(alice))
	if err != nil {
		panic(err)
	}
	for _, h := range hits {
		fmt.Printf("%d %.2f %s\n", h.ID, h.Score, h.Payload)
	}

	_, err = c.Recall(ctx, []float32{1, 0, 0}, 2)
	fmt.Println(errors.Is(err, kalos.ErrDimensionMismatch))
	// Output:
	// 10 1.00 likes tea
	// 11 0.00 has a dog
	// true
}

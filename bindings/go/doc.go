// Package kalos is the Go binding of Kalos, a memory-recall sidecar for LLM applications:
// exact top-k recall over embedding vectors held by one server process and reached
// through POSIX shared memory.
//
// The package is a thin cgo layer over libkalos.so (C API in include/kalos.h), linked
// dynamically. Query and result slices are passed to the library by pointer, never copied;
// the library keeps no pointer after a call returns. A Client is safe for concurrent use.
//
//	c, err := kalos.Open("memories", kalos.Options{Role: kalos.RoleClient})
//	if err != nil { ... }
//	defer c.Close()
//	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
//	defer cancel()
//	hits, err := c.Recall(ctx, query, 10, kalos.WithNamespaces(userID))
//	if errors.Is(err, kalos.ErrServerGone) { ... reopen ... }
//
// Errors: every failed call returns an *Error (operation, Status, library message) that
// wraps one sentinel per status code (ErrTimeout, ErrServerGone, ...), for errors.Is.
//
// Deadlines: a context deadline becomes the request's timeout_ms; without one the
// handle's Options.Timeout applies. Cancellation without a deadline cannot interrupt a
// request in flight (the C API has no cancel), so every request is bounded by a deadline.
package kalos

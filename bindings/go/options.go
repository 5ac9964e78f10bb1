package kalos

import (
	"context"
	"fmt"
	"time"
)

// Role says whether Open starts the server in this process or attaches to one.
type Role uint32

const (
	// RoleAuto attaches to a live server, else becomes it (the default).
	RoleAuto Role = 0
	// RoleServer creates the store and runs the server thread in this process.
	RoleServer Role = 1
	// RoleClient attaches to an existing server (e.g. kalosd).
	RoleClient Role = 2
)

// Metric is the similarity of a store. The zero value takes the library default (cosine).
type Metric uint32

const (
	MetricDefault Metric = iota
	MetricIP             // inner product, higher is better
	MetricCosine         // cosine similarity, higher is better
	MetricL2             // squared Euclidean distance, lower is better
)

func (m Metric) c() uint32 { return uint32(m) - 1 }

func metricFromC(v uint32) Metric { return Metric(v + 1) }

func (m Metric) String() string {
	switch m {
	case MetricIP:
		return "ip"
	case MetricCosine:
		return "cosine"
	case MetricL2:
		return "l2"
	}
	return "default"
}

// DType is the storage type of the GPU copy of the table. The zero value takes the default (f32).
type DType uint32

const (
	DTypeDefault DType = iota
	DTypeF32
	DTypeF16
	DTypeBF16
)

func (d DType) c() uint32 { return uint32(d) - 1 }

func dtypeFromC(v uint32) DType { return DType(v + 1) }

// Backend is the engine of a store.
type Backend uint32

const (
	BackendAuto Backend = 0 // pick by table size and device (KALOS_BACKEND may force one)
	BackendCPU  Backend = 1 // exact SIMD CPU scan
	BackendCUDA Backend = 2 // CUDA
)

// Sync is the write-ahead-log fsync policy. The zero value takes the default (always).
type Sync uint32

const (
	SyncDefault  Sync = iota
	SyncAlways        // fsync before every acknowledgement (group commit)
	SyncInterval      // fsync every SyncInterval
	SyncNever         // never fsync (the OS decides)
)

// Placement says how a sharded store (Options.DeviceShards > 1) assigns memories to its
// shards.
type Placement uint32

const (
	// PlacementID places a memory by a hash of its id (the default): the shards stay balanced
	// and every recall scans every shard.
	PlacementID Placement = 0
	// PlacementNamespace places a memory by a hash of its namespace: a recall scoped to
	// namespaces scans only the shards that hold them, but one large namespace fills its
	// shard alone.
	PlacementNamespace Placement = 1
)

func (p Placement) String() string {
	switch p {
	case PlacementID:
		return "id"
	case PlacementNamespace:
		return "namespace"
	}
	return fmt.Sprintf("Placement(%d)", uint32(p))
}

// Options configure Open. Every zero field takes the library's default, so
// Options{Role: RoleClient} attaches to a running server with default deadlines.
type Options struct {
	Role Role
	// Dim is the vector dimension: required to create a store; 0 or the server's value for
	// a client.
	Dim     int
	Metric  Metric
	DType   DType
	Backend Backend
	// Capacity is the maximum number of memories (default 1048576).
	Capacity uint64
	// Slots is the number of request slots in the segment (default 32).
	Slots int
	// SlotBytes bounds one request or response (default 1 MiB).
	SlotBytes int
	// Mode holds the permission bits of the segment (default 0600).
	Mode uint32
	// MaxPayloadBytes is the largest payload per memory (default 65536).
	MaxPayloadBytes int
	// ClientSpin is how long a caller busy-waits before sleeping (default 50µs; negative =
	// sleep at once). When the handle's recent answers took longer, the wait stretches to
	// twice their time, at most 500µs.
	ClientSpin time.Duration
	// ServerSpin is the server's busy-poll window after the last request (default 2ms;
	// negative = park at once).
	ServerSpin time.Duration
	// Timeout is the deadline of every call without a context deadline (default 5s).
	// Rounded up to whole milliseconds.
	Timeout time.Duration
	// HeartbeatTimeout: a server silent for longer is treated as gone (default 10s).
	HeartbeatTimeout time.Duration
	// DataDir holds the write-ahead log and snapshots. "": role auto keeps the store in
	// $XDG_DATA_HOME/kalos/<name> (or ~/.local/share/kalos/<name>) unless Ephemeral, so that
	// another process's auto handle takes it over when the server's process exits; role
	// server keeps it in memory only.
	DataDir string
	// Ephemeral: role auto without DataDir keeps the store in memory only, alive exactly as
	// long as the process that runs its server.
	Ephemeral    bool
	Sync         Sync
	SyncInterval time.Duration // for SyncInterval (default 100ms)
	// Threads is the number of CPU engine threads (default 0 = all cores; on hosts of 8 or
	// more cores, all but one, whose workers stay awake for ServerSpin after each request).
	Threads int
	// GPUMemoryBytes bounds the CUDA engine's memory (default 0 = 90% of free memory).
	GPUMemoryBytes uint64
	// ScanInt8 makes the engine (the CPU engine, and the CUDA engine for single queries)
	// scan an 8-bit copy of the table and re-score the best
	// Rerank candidates of each query exactly (scores stay exact; Stats.RerankUncertain counts
	// answers that may have missed a true neighbour). Default: the exact scan.
	ScanInt8 bool
	// Rerank is the int8 scan's candidate count per query (default 0 = max(8k, 64)).
	Rerank uint32
	// DeviceShards splits the table into this many shards (default 0 = one table, or one per
	// GPU that GPUs selects; at most MaxDeviceShards), each with its own engine on its own
	// server thread; a recall scans the shards in parallel and merges their top-k, so a
	// sharded store answers exactly like an unsharded one. On a CUDA store shard i runs on the
	// i-th selected GPU (modulo their number); with the CPU backend the shards share the
	// host's cores. A value above MaxDeviceShards fails with ErrInvalidArgument.
	// Stats.EngineName starts with "shards<N>x[".
	DeviceShards int
	// Placement assigns memories to shards when DeviceShards > 1 (default PlacementID).
	Placement Placement
	// GPUs are the GPUs of a CUDA store, as a bit mask of device ordinals (bit i = device i;
	// GPUsAll = every device; default 0 = device 0 alone). More than one device shards the
	// table over them (see DeviceShards). A bit naming a device the host lacks fails the open
	// with ErrInvalidArgument (BackendCUDA) or serves on the CPU (BackendAuto, the reason in
	// Stats.FallbackReason). Ignored by the CPU backend.
	GPUs uint64
}

// Stats are a server's statistics.
type Stats struct {
	Engine     Backend // BackendCPU or BackendCUDA
	EngineName string  // e.g. "cpu-avx2-x2"
	Count      uint64
	Capacity   uint64
	Dim        int
	Metric     Metric
	DType      DType
	Requests   uint64
	Queries    uint64
	Batches    uint64
	Errors     uint64
	// P50 and P99 are server-side service times over the last 4096 requests.
	P50, P99        time.Duration
	QueueDepth      uint64 // requests taken in the last batch
	ServerPID       int
	Epoch           uint64 // changes with every server incarnation
	PayloadBytes    uint64
	Uptime          time.Duration
	EngineFallbacks uint64 // times the GPU engine failed and the server fell back to the CPU
	// FallbackReason says why the CUDA engine is not serving: it could not start under
	// BackendAuto, or it failed while serving. Empty when nothing fell back.
	FallbackReason string
	// RerankQueries counts queries answered by the int8 scan (Options.ScanInt8);
	// RerankUncertain those whose k-th exact score fell inside the 8-bit error bound of the
	// rows left out of the candidates (a true neighbour may have been missed).
	RerankQueries, RerankUncertain uint64
	// RequestsBy counts the requests answered since the server started by op and status,
	// ordered by op code, then status. It is read with a second stats request, so it also
	// counts the first.
	RequestsBy []OpCount
}

// OpCount is one request counter of Stats.RequestsBy.
type OpCount struct {
	Op     string // "recall", "upsert", "delete", "delete_namespace", "get", "stats", "clear", "delete_where", "list"
	Status Status // the status the requests were answered with (StatusOK or an error)
	Count  uint64
}

// ListOptions select the memories that List, ListPage and ListPages list. The zero value
// selects every memory, from the smallest id.
type ListOptions struct {
	// Filter keeps the memories whose metadata fields match it; nil keeps them all.
	Filter *Filter
	// Namespaces keeps the memories of these namespaces (at most MaxFilterNamespaces); empty
	// keeps them all. Only read during a call.
	Namespaces []uint64
	// After, when HasAfter is set, is the cursor: only ids greater than After are listed
	// (the last id of the previous page).
	After    uint64
	HasAfter bool
}

// RecallOption changes one recall.
type RecallOption func(*recallArgs)

// WithNamespaces restricts a recall to memories of these namespaces (at most
// MaxFilterNamespaces). The filter is applied inside the scan, so the result is exact.
// The slice is only read during the call.
func WithNamespaces(ns ...uint64) RecallOption {
	return func(a *recallArgs) { a.namespaces = ns }
}

// WithFilter restricts a recall to memories whose metadata fields match f. The filter is
// applied inside the scan with the namespaces, before the top-k: the recall returns k hits
// whenever k memories match. A filter that does not encode fails the call with an error
// matching ErrInvalidArgument. WithFilter(nil) sets no filter.
func WithFilter(f *Filter) RecallOption {
	return func(a *recallArgs) {
		a.filter, a.err = nil, nil
		if f != nil {
			a.filter, a.err = f.Encode()
		}
	}
}

// WithRecency blends recency into the score (ip and cosine only):
// score' = (1-w)*score + w*2^(-age/halfLife), with w in [0, 1].
func WithRecency(weight float32, halfLife time.Duration) RecallOption {
	return func(a *recallArgs) {
		a.weight = weight
		a.halfLifeMS = float64(halfLife) / float64(time.Millisecond)
	}
}

// WithReadYourWrites makes a recall wait, up to its deadline, until the replica that answers
// has applied this client's acknowledged writes (WriteSeqs). Cluster mode (docs/CLUSTER.md);
// satisfied at once on a single host.
func WithReadYourWrites() RecallOption {
	return func(a *recallArgs) { a.consistency |= flagReadYourWrites }
}

// WithMinSeqs makes a recall wait, up to its deadline, until the replica that answers has
// applied the writes of a write token: WriteSeqs of any client, in any process or language
// (per shard log sequences; at most 4096 entries, else ErrInvalidArgument). Cluster mode;
// ignored on a single host. The slice is only read during the call.
func WithMinSeqs(token []uint64) RecallOption {
	return func(a *recallArgs) { a.minSeqs = token }
}

// WithAllowStale lets a replica that may be behind its log answer (cluster mode); without
// it such a recall fails with ErrStale. When lag is not nil, Recall and RecallInto store in
// it how far behind that replica was (zero on a single host and for an up-to-date replica).
// The library reports the lag of single-query recalls without payloads only: RecallBatch,
// RecallBatchInto and RecallWithPayloads accept WithAllowStale(nil) and fail with
// ErrInvalidArgument for a non-nil lag.
func WithAllowStale(lag *Lag) RecallOption {
	return func(a *recallArgs) {
		a.consistency |= flagAllowStale
		a.lag = lag
	}
}

// Lag says how far behind its log the replica that answered a stale-read recall was
// (WithAllowStale).
type Lag struct {
	// Entries counts log entries known to be in the shard's stream and not applied.
	Entries uint64
	// Disconnected is how long the replica's host has not heard from the log (0 while
	// connected).
	Disconnected time.Duration
}

// UpsertOption changes one upsert.
type UpsertOption func(*upsertArgs)

// InNamespace puts every upserted memory in namespace ns (default 0).
func InNamespace(ns uint64) UpsertOption {
	return func(a *upsertArgs) { a.namespace = ns }
}

// WithItemNamespaces gives each upserted memory its own namespace (one per id).
func WithItemNamespaces(ns []uint64) UpsertOption {
	return func(a *upsertArgs) { a.namespaces = ns }
}

// WithPayloads attaches one payload per id (nil = no payload). The payloads are packed
// into one buffer for the call; WithPackedPayloads avoids that copy.
func WithPayloads(p [][]byte) UpsertOption {
	return func(a *upsertArgs) {
		total := 0
		for _, b := range p {
			total += len(b)
		}
		buf := make([]byte, 0, total)
		lens := make([]uint32, len(p))
		for i, b := range p {
			if b == nil {
				lens[i] = noPayload
				continue
			}
			buf = append(buf, b...)
			lens[i] = uint32(len(b))
		}
		a.payloads, a.payloadLens = buf, lens
	}
}

// WithPackedPayloads attaches payloads already packed back to back in buf, with one
// length per id in lens (NoPayload = none). Passed to the library without a copy.
func WithPackedPayloads(buf []byte, lens []uint32) UpsertOption {
	return func(a *upsertArgs) { a.payloads, a.payloadLens = buf, lens }
}

// NoPayload marks "no payload" in the lengths of WithPackedPayloads.
const NoPayload = noPayload

// WithFields attaches typed metadata fields, one Fields per id (nil = none). An upsert
// replaces every field a memory had. Fields that do not encode fail the call with an error
// matching ErrInvalidArgument.
func WithFields(items []Fields) UpsertOption {
	return func(a *upsertArgs) {
		b, err := encodeFields(items)
		if err != nil {
			err = newError("upsert", StatusInvalidArgument, err.Error())
		}
		a.fields, a.err = b, err
	}
}

// WithTTL makes the upserted memories expire after d (rounded up to milliseconds).
func WithTTL(d time.Duration) UpsertOption {
	return func(a *upsertArgs) { a.ttlMS = durationMS(d) }
}

// WithExpiry makes the upserted memories expire at t (must be in the future).
func WithExpiry(t time.Time) UpsertOption {
	return func(a *upsertArgs) { a.expiresAtMS = uint64(t.UnixMilli()) }
}

// durationMS rounds a positive duration up to whole milliseconds (0 stays 0).
func durationMS(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

func durationNS(ns uint64) time.Duration   { return time.Duration(ns) }
func durationMS64(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }

// deadline turns a context into the call's timeout_ms: 0 (the handle's default) without a
// deadline, else the time left rounded up to a millisecond, so the library never gives up
// before the context does. A context that is already done returns its error.
func deadline(ctx context.Context) (ms uint64, has bool, err error) {
	if ctx == nil {
		return 0, false, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, false, nil
	}
	left := time.Until(dl)
	if left <= 0 {
		return 0, true, context.DeadlineExceeded
	}
	return durationMS(left), true, nil
}

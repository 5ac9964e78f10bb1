//! The C side's types: the status codes, the constants, the `#[repr(C)]` structs, and the
//! options struct's defaults, initialisers and reading (any `struct_size` from the first layout
//! on).

use std::ffi::{c_char, CStr};
use std::path::PathBuf;

use crate::client::{Kalos, Options};
use crate::error::{Error, Result, Status};
use crate::types::{Backend, Dtype, Metric, Placement, Role, Scan, SyncPolicy};

/// Status code returned by every function (`KALOS_OK` = 0).
#[allow(non_camel_case_types)]
pub type kalos_status = i32;

/// The values a `kalos_status` takes. Values are explicit and never renumbered; new codes are
/// appended. Functions return `kalos_status` (an `int32_t`), not this enum type, so any value
/// read back from C is well defined.
#[allow(non_camel_case_types)]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kalos_status_code {
    /// Success.
    KALOS_OK = 0,
    /// An argument is invalid (the message says which and why).
    KALOS_INVALID_ARGUMENT = 1,
    /// A required pointer argument was NULL.
    KALOS_NULL_POINTER = 2,
    /// A vector or query does not have the store's dimension.
    KALOS_DIMENSION_MISMATCH = 3,
    /// k is 0 or above KALOS_MAX_K.
    KALOS_K_OUT_OF_RANGE = 4,
    /// A query or vector holds NaN or Inf.
    KALOS_NON_FINITE = 5,
    /// The store name is invalid.
    KALOS_INVALID_NAME = 6,
    /// The store is at capacity; nothing was written.
    KALOS_STORE_FULL = 7,
    /// The segment was made by another layout version.
    KALOS_VERSION_MISMATCH = 8,
    /// An id, or the store itself (role client), does not exist.
    KALOS_NOT_FOUND = 9,
    /// A live server already owns the name (role server).
    KALOS_ALREADY_EXISTS = 10,
    /// The deadline passed.
    KALOS_TIMEOUT = 11,
    /// The server is gone; reopen to reach a new one.
    KALOS_SERVER_GONE = 12,
    /// A caller buffer is too small.
    KALOS_BUFFER_TOO_SMALL = 13,
    /// A payload exceeds max_payload_bytes.
    KALOS_PAYLOAD_TOO_LARGE = 14,
    /// Corrupt data file or segment.
    KALOS_CORRUPT = 15,
    /// An operating-system call failed.
    KALOS_IO = 16,
    /// The data directory is locked by another live server.
    KALOS_LOCKED = 17,
    /// The requested engine is not available here.
    KALOS_BACKEND_UNAVAILABLE = 18,
    /// The GPU engine failed.
    KALOS_CUDA = 19,
    /// Permission denied (segment or data directory of another user, a data directory open to
    /// group or others, or a link inside the data directory).
    KALOS_PERMISSION_DENIED = 20,
    /// The request does not fit in a slot; raise slot_bytes.
    KALOS_TOO_LARGE = 21,
    /// The handle is closed.
    KALOS_CLOSED = 22,
    /// A panic was caught at the API boundary.
    KALOS_PANIC = 23,
    /// An internal invariant failed.
    KALOS_INTERNAL = 24,
    /// Cluster mode: the replicated log cannot take the write (host cut off from NATS, or no
    /// quorum), or no host of a shard answered a forwarded recall.
    KALOS_UNAVAILABLE = 25,
    /// Cluster mode: the local replica may be behind its log and the recall did not opt in to
    /// stale reads (KALOS_RECALL_ALLOW_STALE).
    KALOS_STALE = 26,
}

/// Largest k a recall accepts.
pub const KALOS_MAX_K: u32 = 1024;
/// Largest number of namespaces in one recall filter.
pub const KALOS_MAX_FILTER_NAMESPACES: u32 = 64;
/// Marks "no payload" in a payload length array.
pub const KALOS_NO_PAYLOAD: u32 = u32::MAX;

/// Role: attach to a live server, else become it.
pub const KALOS_ROLE_AUTO: u32 = 0;
/// Role: create the store and run the server thread in this process.
pub const KALOS_ROLE_SERVER: u32 = 1;
/// Role: attach to an existing server.
pub const KALOS_ROLE_CLIENT: u32 = 2;
/// Metric: inner product (higher is better).
pub const KALOS_METRIC_IP: u32 = 0;
/// Metric: cosine similarity (higher is better).
pub const KALOS_METRIC_COSINE: u32 = 1;
/// Metric: squared Euclidean distance (lower is better).
pub const KALOS_METRIC_L2: u32 = 2;
/// Storage dtype f32.
pub const KALOS_DTYPE_F32: u32 = 0;
/// Storage dtype f16 (GPU copy).
pub const KALOS_DTYPE_F16: u32 = 1;
/// Storage dtype bf16 (GPU copy).
pub const KALOS_DTYPE_BF16: u32 = 2;
/// Engine: pick by table size and device (KALOS_BACKEND env may force one).
pub const KALOS_BACKEND_AUTO: u32 = 0;
/// Engine: exact SIMD CPU scan.
pub const KALOS_BACKEND_CPU: u32 = 1;
/// Engine: CUDA.
pub const KALOS_BACKEND_CUDA: u32 = 2;
/// WAL sync: fsync before every acknowledgement (group commit).
pub const KALOS_SYNC_ALWAYS: u32 = 0;
/// WAL sync: fsync every sync_interval_ms.
pub const KALOS_SYNC_INTERVAL: u32 = 1;
/// WAL sync: never fsync (the OS decides).
pub const KALOS_SYNC_NEVER: u32 = 2;
/// Scan: every score exact.
/// Recall consistency flag (cluster mode): read this handle's own acknowledged writes.
pub const KALOS_RECALL_READ_YOUR_WRITES: u32 = 1;
/// Recall consistency flag (cluster mode): accept a replica that may be behind its log.
pub const KALOS_RECALL_ALLOW_STALE: u32 = 2;
pub const KALOS_SCAN_EXACT: u32 = 0;
/// Scan: 8-bit quantized copy, the best `rerank` candidates re-scored exactly.
pub const KALOS_SCAN_INT8: u32 = 1;
/// Shard placement: by a hash of the id (shards stay balanced; every recall scans every shard).
pub const KALOS_PLACEMENT_ID: u32 = 0;
/// Shard placement: by a hash of the namespace (a namespace-scoped recall scans only its shards).
pub const KALOS_PLACEMENT_NAMESPACE: u32 = 1;
/// `kalos_options::gpus`: every CUDA device of the host.
pub const KALOS_GPUS_ALL: u64 = u64::MAX;
const _: () = assert!(KALOS_GPUS_ALL == crate::config::GPUS_ALL);
/// Largest `kalos_options::device_shards`.
pub const KALOS_MAX_DEVICE_SHARDS: u32 = 64;
const _: () = assert!(KALOS_MAX_DEVICE_SHARDS == crate::config::MAX_DEVICE_SHARDS);
/// Largest `kalos_options::rerank`.
pub const KALOS_MAX_RERANK: u32 = 65536;
const _: () = assert!(KALOS_MAX_RERANK == crate::config::MAX_RERANK);

/// Op code of `kalos_op_count`: a request of an op code the server does not know.
pub const KALOS_OP_UNKNOWN: u32 = 0;
/// Op code: recall (`kalos_recall`, `kalos_recall_batch`).
pub const KALOS_OP_RECALL: u32 = 1;
/// Op code: upsert.
pub const KALOS_OP_UPSERT: u32 = 2;
/// Op code: delete by id.
pub const KALOS_OP_DELETE: u32 = 3;
/// Op code: delete a namespace.
pub const KALOS_OP_DELETE_NAMESPACE: u32 = 4;
/// Op code: get by id.
pub const KALOS_OP_GET: u32 = 5;
/// Op code: stats (`kalos_stats`, `kalos_stats_ops`).
pub const KALOS_OP_STATS: u32 = 6;
/// Op code: clear.
pub const KALOS_OP_CLEAR: u32 = 7;
/// Op code: delete by filter expression.
pub const KALOS_OP_DELETE_WHERE: u32 = 8;
/// Op code: list ids (`kalos_list`).
pub const KALOS_OP_LIST: u32 = 9;

// The C op codes are the wire protocol's.
const _: () = {
    use crate::wire;
    assert!(KALOS_OP_RECALL == wire::OP_RECALL && KALOS_OP_UPSERT == wire::OP_UPSERT);
    assert!(KALOS_OP_DELETE == wire::OP_DELETE && KALOS_OP_DELETE_NAMESPACE == wire::OP_DELETE_NS);
    assert!(KALOS_OP_GET == wire::OP_GET && KALOS_OP_STATS == wire::OP_STATS);
    assert!(KALOS_OP_CLEAR == wire::OP_CLEAR && KALOS_OP_DELETE_WHERE == wire::OP_DELETE_WHERE);
    assert!(KALOS_OP_LIST == wire::OP_LIST);
};

/// One request counter of `kalos_stats_ops`: the requests of op `op` that the server answered
/// with status `status` since it started.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kalos_op_count {
    /// `KALOS_OP_*`; `kalos_op_name` names it.
    pub op: u32,
    /// The status of the answers counted (`KALOS_OK` or an error code).
    pub status: kalos_status,
    pub count: u64,
}

/// An open store. Opaque; created by `kalos_open`, closed by `kalos_close`.
#[allow(non_camel_case_types)]
pub struct kalos_handle {
    /// `HANDLE_LIVE` while open, `HANDLE_CLOSED` after `kalos_close`.
    pub(super) magic: std::sync::atomic::AtomicU64,
    /// The store; None once closed. Only `kalos_close` writes it, and no call may run on the
    /// handle while it does (the API's contract), so every other access is a shared read.
    pub(super) inner: std::cell::UnsafeCell<Option<Box<Kalos>>>,
}

/// `kalos_handle::magic` of an open handle.
pub(super) const HANDLE_LIVE: u64 = 0x4b41_4c4f_535f_4f4b;
/// `kalos_handle::magic` of a closed handle (the 16-byte husk is kept so that a second close,
/// or a call on a closed handle, is detected instead of touching freed memory).
pub(super) const HANDLE_CLOSED: u64 = 0x4b41_4c4f_535f_4344;

/// Options for `kalos_open`. Always initialise with `kalos_options_init` and then change
/// fields: `struct_size` lets later versions add fields without breaking old callers.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct kalos_options {
    /// `sizeof(kalos_options)`, set by `kalos_options_init`.
    pub struct_size: u32,
    /// `KALOS_ROLE_*` (default AUTO).
    pub role: u32,
    /// Vector dimension: required to create a store; 0 or the server's value for a client.
    pub dim: u32,
    /// `KALOS_METRIC_*` (default COSINE).
    pub metric: u32,
    /// `KALOS_DTYPE_*` (default F32).
    pub dtype: u32,
    /// `KALOS_BACKEND_*` (default AUTO).
    pub backend: u32,
    /// Maximum number of memories (default 1048576).
    pub capacity: u64,
    /// Request slots in the segment (default 32).
    pub slots: u32,
    /// Data bytes per slot (default 1 MiB); bounds one request or response.
    pub slot_bytes: u32,
    /// Permission bits of the segment (default 0600).
    pub mode: u32,
    /// Largest payload per memory (default 65536).
    pub max_payload_bytes: u32,
    /// Client busy-wait before sleeping, ns (default 50000; 0 = sleep at once). When the handle's
    /// recent answers took longer, the wait stretches to twice their time, at most 500 µs; when the
    /// expected answer is far enough off, the client sleeps until shortly before it and polls only
    /// across the recent answers' spread.
    pub client_spin_ns: u64,
    /// Server busy-poll window after the last request, ns (default 2000000; 0 = park at once).
    pub server_spin_ns: u64,
    /// Default deadline of every call, ms (default 5000).
    pub timeout_ms: u64,
    /// A server silent for longer is treated as gone, ms (default 10000).
    pub heartbeat_timeout_ms: u64,
    /// Data directory for the write-ahead log and snapshots, copied. NULL: role auto keeps the
    /// store in its default directory (see `ephemeral`), role server keeps it in memory only.
    pub data_dir: *const c_char,
    /// `KALOS_SYNC_*` (default ALWAYS).
    pub sync_policy: u32,
    /// CPU engine threads (default 0 = all cores; on hosts of 8 or more cores, all but one).
    /// On hosts of 8 or more cores the engine's worker threads stay awake (busy-polling) for
    /// `server_spin_ns` after each request, as the server thread does, so scans of tables from
    /// 256 KiB up are split across them; then they sleep. 1 = the server thread alone.
    pub threads: u32,
    /// Interval of `KALOS_SYNC_INTERVAL`, ms (default 100).
    pub sync_interval_ms: u64,
    /// GPU memory the CUDA engine may use, bytes (default 0 = 90% of free memory).
    pub gpu_memory_bytes: u64,
    /// Role auto without `data_dir`: 0 (default) keeps the store durable in
    /// `$XDG_DATA_HOME/kalos/<name>` (or `~/.local/share/kalos/<name>`), and when its server's
    /// process exits another process's auto handle takes the store over from those files;
    /// 1 keeps it in memory only, alive exactly as long as its server. Ignored by the other
    /// roles and when `data_dir` is set.
    pub ephemeral: u32,
    /// `KALOS_SCAN_*` (default EXACT). INT8 keeps an 8-bit quantized copy of every vector beside
    /// the full-precision table, scans the copy, and re-scores the best `rerank` candidates of
    /// each query exactly: scores are exact, and a true neighbour is missed only when its
    /// 8-bit score ranked below the candidates (see `kalos_stats_info::rerank_uncertain`).
    /// The CPU engine serves every request this way; the CUDA engine its single queries of
    /// dimensions up to 1536 (codes on the device, re-ranked on the host from the f32 rows),
    /// batches and larger dimensions exactly. A caller whose `struct_size` ends before this
    /// field gets EXACT.
    pub scan: u32,
    /// Candidates re-scored exactly per query with `KALOS_SCAN_INT8` (default 0 = adapt to k:
    /// max(8k, 64)); at most `KALOS_MAX_RERANK`, and never fewer than k.
    pub rerank: u32,
    /// Shards the table is split into (default 0 = one table, or one per GPU that `gpus`
    /// selects; at most `KALOS_MAX_DEVICE_SHARDS`). Each shard holds its part of the table with
    /// its own engine on its own server-side thread; a recall scans the shards in parallel and
    /// merges their top-k into the exact global top-k, and a write goes to the shard that owns
    /// the memory. On a CUDA store shard i runs on the i-th selected GPU (modulo their number:
    /// several shards may share one GPU, splitting its memory budget); with the CPU backend the
    /// shards share the host's cores (each engine gets `threads / shards` threads). The host
    /// keeps each shard's rows once more besides the server's table (no payloads). A caller
    /// whose `struct_size` ends before this field gets 0.
    pub device_shards: u32,
    /// `KALOS_PLACEMENT_*` (default ID): how memories are assigned to shards. A caller whose
    /// `struct_size` ends before this field gets ID.
    pub placement: u32,
    /// The GPUs of a CUDA store, as a bit mask of device ordinals (bit i = device i;
    /// `KALOS_GPUS_ALL` = every device; default 0 = device 0 alone). More than one device
    /// shards the table over them (see `device_shards`). A bit naming a device the host lacks
    /// fails the open with `KALOS_INVALID_ARGUMENT` (backend CUDA) or serves on the CPU
    /// (backend AUTO, with the reason in stats). Ignored by the CPU backend. A caller whose
    /// `struct_size` ends before this field gets 0.
    pub gpus: u64,
}

/// Per-call recall parameters; pass NULL for the defaults. Initialise with
/// `kalos_recall_params_init`.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct kalos_recall_params {
    /// `sizeof(kalos_recall_params)`.
    pub struct_size: u32,
    pub _reserved: u32,
    /// Namespace filter: NULL (and length 0) = all namespaces; else up to 64 namespaces.
    pub namespaces: *const u64,
    pub namespaces_len: usize,
    /// Recency weight w in [0, 1] (0 = off; ip and cosine only):
    /// `score' = (1-w)*score + w*2^(-age_ms/half_life_ms)`.
    pub recency_weight: f32,
    pub _reserved2: u32,
    /// Recency half-life in ms (> 0 when recency_weight > 0).
    pub recency_half_life_ms: f64,
    /// Deadline of this call in ms (0 = the handle's default).
    pub timeout_ms: u64,
    /// Metadata filter expression in its binary form (docs/FORMATS.md, "Filter expressions"),
    /// or NULL (and length 0) for none. Borrowed for the call only. A malformed expression
    /// fails the call with `KALOS_INVALID_ARGUMENT` before anything is sent to the server.
    /// A caller whose `struct_size` ends before this field gets no filter.
    pub filter: *const u8,
    pub filter_len: usize,
    /// Cluster mode (docs/CLUSTER.md): `KALOS_RECALL_*` flags, 0 for none.
    /// `KALOS_RECALL_READ_YOUR_WRITES`: wait, up to the deadline, until the answering replica
    /// has applied this handle's last acknowledged writes. `KALOS_RECALL_ALLOW_STALE`: a replica
    /// that may be behind its log may answer (`kalos_recall_lag` says how far); without it such
    /// a recall fails with `KALOS_STALE`. Ignored outside cluster mode. A caller whose
    /// `struct_size` ends before this field gets 0.
    pub consistency: u32,
    pub _reserved3: u32,
    /// Cluster mode: per shard (index = shard), a log sequence the answering replica must
    /// have applied first, e.g. another handle's `kalos_last_write_seqs`; NULL (and length 0)
    /// for none. Borrowed for the call only. At most 4096 entries; a nonzero entry for a shard
    /// the store does not have fails the call with `KALOS_INVALID_ARGUMENT`. Ignored outside
    /// cluster mode.
    pub min_seqs: *const u64,
    pub min_seqs_len: usize,
}

/// The arguments of one `kalos_recall` call in a struct, for `kalos_recall_with`: callers whose
/// foreign calls cost per argument (Python ctypes: ~70 ns each) fill it once and change only
/// `query` (and `k`) per call. Fields as the parameters of `kalos_recall`; `count` is written by
/// the call. Initialise with `kalos_recall_args_init`.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct kalos_recall_args {
    /// `sizeof(kalos_recall_args)`.
    pub struct_size: u32,
    /// Results wanted (1 to 1024).
    pub k: u32,
    pub handle: *const kalos_handle,
    pub query: *const f32,
    pub query_len: usize,
    /// NULL for the defaults.
    pub params: *const kalos_recall_params,
    pub ids: *mut u64,
    pub ids_len: usize,
    pub scores: *mut f32,
    pub scores_len: usize,
    /// Out: the number of hits written (on success only, like every output).
    pub count: usize,
}

/// Per-call upsert parameters; pass NULL for the defaults (namespace 0, no payloads, no
/// expiry). Initialise with `kalos_upsert_params_init`.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct kalos_upsert_params {
    /// `sizeof(kalos_upsert_params)`.
    pub struct_size: u32,
    pub _reserved: u32,
    /// Namespace of every item when `namespaces` is NULL.
    pub namespace_id: u64,
    /// One namespace per item, or NULL.
    pub namespaces: *const u64,
    pub namespaces_len: usize,
    /// Payload bytes of all items, back to back (may be NULL when every length is 0 or none).
    pub payloads: *const u8,
    pub payloads_len: usize,
    /// One length per item (`KALOS_NO_PAYLOAD` = none), or NULL for no payloads.
    pub payload_lens: *const u32,
    pub payload_lens_len: usize,
    /// Time to live from now in ms (0 = none).
    pub ttl_ms: u64,
    /// Absolute expiry in unix ms (0 = none); must be in the future.
    pub expires_at_ms: u64,
    /// Deadline of this call in ms (0 = the handle's default).
    pub timeout_ms: u64,
    /// Metadata fields of every item as one fields block (docs/FORMATS.md, "Metadata fields"),
    /// or NULL (and length 0) for none. An upsert replaces every field a memory had. A
    /// malformed block, or a field given a type other than the store's, fails the call with
    /// `KALOS_INVALID_ARGUMENT` and writes nothing. A caller whose `struct_size` ends before
    /// this field writes no fields.
    pub fields: *const u8,
    pub fields_len: usize,
}

/// What `kalos_list` lists; pass NULL for every memory from the smallest id. Initialise with
/// `kalos_list_params_init`.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct kalos_list_params {
    /// `sizeof(kalos_list_params)`.
    pub struct_size: u32,
    /// 1: list ids strictly greater than `after` (the cursor); 0 (the default): start at the
    /// smallest id. Any other value is `KALOS_INVALID_ARGUMENT`.
    pub has_after: u32,
    /// The cursor, read when `has_after` is 1: the last id of the previous page.
    pub after: u64,
    /// Namespace filter: NULL (and length 0) = all namespaces; else up to 64 namespaces.
    pub namespaces: *const u64,
    pub namespaces_len: usize,
    /// Metadata filter expression in its binary form (docs/FORMATS.md, "Filter expressions"),
    /// or NULL (and length 0) for none. Borrowed for the call only. A malformed expression
    /// fails the call with `KALOS_INVALID_ARGUMENT` before anything is sent to the server.
    pub filter: *const u8,
    pub filter_len: usize,
    /// Deadline of each request of the call in ms (0 = the handle's default).
    pub timeout_ms: u64,
}

/// Server statistics filled by `kalos_stats`. Set `struct_size` before the call.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct kalos_stats_info {
    /// `sizeof(kalos_stats_info)`, set by the caller.
    pub struct_size: u32,
    /// Engine that serves: `KALOS_BACKEND_CPU` or `KALOS_BACKEND_CUDA`.
    pub engine: u32,
    pub count: u64,
    pub capacity: u64,
    pub dim: u32,
    pub metric: u32,
    pub dtype: u32,
    pub _reserved: u32,
    pub requests: u64,
    pub queries: u64,
    pub batches: u64,
    pub errors: u64,
    /// Server-side service time percentiles of the last 4096 recall requests, ns.
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Requests taken in the last batch.
    pub queue_depth: u64,
    pub server_pid: u64,
    pub epoch: u64,
    pub payload_bytes: u64,
    pub uptime_ms: u64,
    /// Times the GPU engine failed and the server fell back to the CPU.
    pub engine_fallbacks: u64,
    /// NUL-terminated engine description, e.g. "cpu-avx2-x2".
    pub engine_name: [c_char; 48],
    /// NUL-terminated reason the CUDA engine is not serving (it could not start under
    /// `KALOS_BACKEND_AUTO`, or it failed while serving); "" when nothing fell back. Cut at 255
    /// bytes.
    pub fallback_reason: [c_char; 256],
    /// Queries answered by the int8 scan (`KALOS_SCAN_INT8`) with exact re-ranking.
    pub rerank_queries: u64,
    /// Of those, queries whose k-th exact score fell inside the 8-bit error bound of the best
    /// row left out of the candidates: a true neighbour may have been missed (a larger
    /// `rerank` makes this rarer). 0 means every int8 answer was provably the exact top-k.
    pub rerank_uncertain: u64,
}

/// Bytes of the first `kalos_stats_info` layout (up to `engine_name`): callers built against it
/// pass this `struct_size` and get every field they know.
pub(super) const STATS_V1_BYTES: usize = std::mem::offset_of!(kalos_stats_info, fallback_reason);

fn defaults() -> kalos_options {
    let d = Options::default();
    kalos_options {
        struct_size: std::mem::size_of::<kalos_options>() as u32,
        role: d.role as u32,
        dim: d.dim,
        metric: d.metric as u32,
        dtype: d.dtype as u32,
        backend: d.backend as u32,
        capacity: d.capacity,
        slots: d.slots,
        slot_bytes: d.slot_bytes,
        mode: d.mode,
        max_payload_bytes: d.max_payload_bytes,
        client_spin_ns: d.client_spin_ns,
        server_spin_ns: d.server_spin_ns,
        timeout_ms: d.timeout_ms,
        heartbeat_timeout_ms: d.heartbeat_timeout_ms,
        data_dir: std::ptr::null(),
        sync_policy: d.sync as u32,
        threads: d.threads,
        sync_interval_ms: d.sync_interval_ms,
        gpu_memory_bytes: d.gpu_memory_bytes,
        ephemeral: d.ephemeral as u32,
        scan: d.scan as u32,
        rerank: d.rerank,
        device_shards: d.device_shards,
        placement: d.placement as u32,
        gpus: d.gpus,
    }
}

/// Writes the first `min(size, size_of::<T>())` bytes of `value` to `dst` and sets its leading
/// `struct_size` field to that count: an initialiser called by a program built against an older,
/// smaller layout fills exactly the struct that program allocated.
///
/// # Safety
/// `dst` NULL or writable for `size` bytes; `T` is `#[repr(C)]` with a leading `u32`
/// `struct_size` field.
pub(super) unsafe fn write_prefix<T>(dst: *mut T, value: T, size: usize) {
    let n = size.min(std::mem::size_of::<T>());
    if dst.is_null() || n < std::mem::size_of::<u32>() {
        return;
    }
    // SAFETY: `value` is a live T of size_of::<T>() ≥ n bytes; `dst` is writable for
    // size ≥ n bytes per the contract; a stack value and the caller's struct do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(&value as *const T as *const u8, dst as *mut u8, n);
        (dst as *mut u32).write_unaligned(n as u32);
    }
}

/// Fills the caller's options struct with the defaults and sets `struct_size`. Pass
/// `sizeof(struct kalos_options)` as `size`: the library writes at most `size` bytes, so a
/// program built against an older header (a smaller struct) stays within what it allocated,
/// and fields the caller's layout lacks take their defaults in `kalos_open`. NULL, or `size`
/// below 4, is a no-op. Thread-safe (touches only `*opts`).
///
/// # Safety
/// `opts` must be NULL or point to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kalos_options_init(opts: *mut kalos_options, size: usize) {
    // SAFETY: the caller's contract, passed on.
    unsafe { write_prefix(opts, defaults(), size) };
}

/// Fills `params` with the defaults (all namespaces, no recency, default deadline) and sets
/// `struct_size`. Pass `sizeof(struct kalos_recall_params)` as `size`; at most `size` bytes are
/// written (see `kalos_options_init`). NULL, or `size` below 4, is a no-op. Thread-safe.
///
/// # Safety
/// `params` must be NULL or point to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall_params_init(params: *mut kalos_recall_params, size: usize) {
    let value = kalos_recall_params {
        struct_size: std::mem::size_of::<kalos_recall_params>() as u32,
        _reserved: 0,
        namespaces: std::ptr::null(),
        namespaces_len: 0,
        recency_weight: 0.0,
        _reserved2: 0,
        recency_half_life_ms: 0.0,
        timeout_ms: 0,
        filter: std::ptr::null(),
        filter_len: 0,
        consistency: 0,
        _reserved3: 0,
        min_seqs: std::ptr::null(),
        min_seqs_len: 0,
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { write_prefix(params, value, size) };
}

/// Fills `params` with the defaults (namespace 0, no payloads, no expiry, default deadline)
/// and sets `struct_size`. Pass `sizeof(struct kalos_upsert_params)` as `size`; at most `size`
/// bytes are written (see `kalos_options_init`). NULL, or `size` below 4, is a no-op.
/// Thread-safe.
///
/// # Safety
/// `params` must be NULL or point to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kalos_upsert_params_init(params: *mut kalos_upsert_params, size: usize) {
    let value = kalos_upsert_params {
        struct_size: std::mem::size_of::<kalos_upsert_params>() as u32,
        _reserved: 0,
        namespace_id: 0,
        namespaces: std::ptr::null(),
        namespaces_len: 0,
        payloads: std::ptr::null(),
        payloads_len: 0,
        payload_lens: std::ptr::null(),
        payload_lens_len: 0,
        ttl_ms: 0,
        expires_at_ms: 0,
        timeout_ms: 0,
        fields: std::ptr::null(),
        fields_len: 0,
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { write_prefix(params, value, size) };
}

/// Fills `params` with the defaults (every namespace, no filter, from the smallest id, default
/// deadline) and sets `struct_size`. Pass `sizeof(struct kalos_list_params)` as `size`; at most
/// `size` bytes are written (see `kalos_options_init`). NULL, or `size` below 4, is a no-op.
/// Thread-safe.
///
/// # Safety
/// `params` must be NULL or point to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kalos_list_params_init(params: *mut kalos_list_params, size: usize) {
    let value = kalos_list_params {
        struct_size: std::mem::size_of::<kalos_list_params>() as u32,
        has_after: 0,
        after: 0,
        namespaces: std::ptr::null(),
        namespaces_len: 0,
        filter: std::ptr::null(),
        filter_len: 0,
        timeout_ms: 0,
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { write_prefix(params, value, size) };
}

/// Reads an options struct of any size ≥ the v1 prefix (fields past `struct_size` take defaults).
///
/// # Safety
/// `o` must point to at least `(*o).struct_size` readable bytes.
pub(super) unsafe fn read_options(o: *const kalos_options) -> Result<Options> {
    let mut raw = defaults();
    if !o.is_null() {
        // SAFETY: struct_size is the first field; reading it is valid for any caller struct.
        let size = unsafe { (*o).struct_size } as usize;
        let min = std::mem::offset_of!(kalos_options, data_dir) + std::mem::size_of::<*const c_char>();
        if size < min {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("options.struct_size = {size}; call kalos_options_init first (need at least {min})"),
            ));
        }
        let n = size.min(std::mem::size_of::<kalos_options>());
        // SAFETY: the caller's struct has `size` ≥ n readable bytes; ours has n writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(o as *const u8, &mut raw as *mut kalos_options as *mut u8, n) };
    }
    let data_dir = if raw.data_dir.is_null() {
        None
    } else {
        // SAFETY: non-NULL data_dir must be a NUL-terminated string (documented).
        let s = unsafe { CStr::from_ptr(raw.data_dir) };
        Some(PathBuf::from(s.to_str().map_err(|_| Error::new(Status::InvalidArgument, "data_dir is not UTF-8"))?))
    };
    Ok(Options {
        role: Role::from_u32(raw.role)?,
        dim: raw.dim,
        metric: Metric::from_u32(raw.metric)?,
        dtype: Dtype::from_u32(raw.dtype)?,
        backend: Backend::from_u32(raw.backend)?,
        capacity: raw.capacity,
        slots: raw.slots,
        slot_bytes: raw.slot_bytes,
        mode: raw.mode,
        max_payload_bytes: raw.max_payload_bytes,
        client_spin_ns: raw.client_spin_ns,
        server_spin_ns: raw.server_spin_ns,
        timeout_ms: raw.timeout_ms,
        heartbeat_timeout_ms: raw.heartbeat_timeout_ms,
        data_dir,
        sync: SyncPolicy::from_u32(raw.sync_policy)?,
        sync_interval_ms: raw.sync_interval_ms,
        threads: raw.threads,
        gpu_memory_bytes: raw.gpu_memory_bytes,
        ephemeral: match raw.ephemeral {
            0 => false,
            1 => true,
            v => return Err(Error::new(Status::InvalidArgument, format!("options.ephemeral = {v}; expected 0 or 1"))),
        },
        scan: Scan::from_u32(raw.scan)?,
        rerank: raw.rerank,
        device_shards: raw.device_shards,
        placement: Placement::from_u32(raw.placement)?,
        gpus: raw.gpus,
    })
}

const _: () = assert!(std::mem::size_of::<kalos_handle>() == 16, "a closed handle keeps 16 bytes (kalos_close's doc)");

//! Kalos: a memory-recall sidecar for LLM applications.
//!
//! One server (a thread in `kalosd` or in any process that opens with role server/auto) owns
//! the memory table and the engine; any number of client processes attach to a POSIX
//! shared-memory segment and recall the exact top-k through request slots. See
//! `../shared/DESIGN.md`-derived docs in `docs/` and the C API in `include/kalos.h`.
//!
//! Module map:
//! - [`ffi`]: the C ABI (the only `extern "C"` surface besides [`ffi::jni`], the Java binding's).
//! - [`client`]: [`Kalos`] handle, per-call options, every request as a slot round trip.
//! - [`server`]: the server thread (batching, validation, engine, persistence).
//! - [`engine`]: engine trait, top-k selection, CPU and CUDA engines, the router that picks one.
//! - [`wire`]: the byte layout of requests and responses inside a slot.
//! - [`shm`]: segment layout v1, create/attach/validate, futex wait/wake.
//! - [`store`]: the table (columns, namespaces, payloads, expiry).
//! - [`persist`]: write-ahead log and snapshots.
//! - [`config`], [`types`], [`error`]: options and knobs, plain shared types, errors.
//!
//! Dependencies point one way: `ffi` → `client`/`server` → `engine` → `wire`/`shm`; `config`,
//! `types`, `error` and `store` are used from every layer.

// The shared-memory protocol writes f32 slices as their in-memory bytes and reads them as
// little-endian values (wire::codec::f32_bytes / f32_view).
#[cfg(target_endian = "big")]
compile_error!("Kalos supports little-endian targets only");

/// cbindgen:ignore
pub mod client;
/// cbindgen:ignore
pub mod config;
/// cbindgen:ignore
pub mod engine;
/// cbindgen:ignore
pub mod error;
pub mod ffi;
pub mod filter;
/// cbindgen:ignore
pub mod meta;
pub mod npy;
/// cbindgen:ignore
pub mod persist;
/// cbindgen:ignore
pub mod server;
/// cbindgen:ignore
pub mod shm;
/// cbindgen:ignore
pub mod store;
/// cbindgen:ignore
pub mod types;
/// cbindgen:ignore
pub mod wire;

pub use client::{Kalos, Lag, ListOptions, Namespaces, Options, PayloadHit, RecallOptions, UpsertOptions};
pub use error::{Error, Result, Status};
pub use store::{Record, NEVER};
pub use types::{Backend, Dtype, Filter, Hit, Metric, Placement, Recency, Role, Scan, SyncPolicy, MAX_K};
pub use wire::{op_name, OpLatency, OpStatusCount, Stats, LATENCY_BUCKETS_NS};

/// Library version string.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

//! Kalos: a memory-recall sidecar for LLM applications.
//!
//! One server (a thread in `kalosd` or in any process that opens with role server/auto) owns
//! the memory table and the engine; any number of client processes attach to a POSIX
//! shared-memory segment and recall the exact top-k through request slots. See
//! `../shared/DESIGN.md`-derived docs in `docs/` and the C API in `include/kalos.h`.
//!
//! Module map:
//! - [`client`]: [`Kalos`] handle, options, every request as a slot round trip.
//! - [`server`]: the server thread (batching, validation, engine, persistence).
//! - [`shm`]: segment layout v1, create/attach/validate, futex wait/wake.
//! - [`protocol`]: wire format inside a slot.
//! - [`store`]: the table (columns, namespaces, payloads, expiry).
//! - [`engine`]: engine trait, top-k selection, CPU and CUDA engines.
//! - [`persist`]: write-ahead log and snapshots.
//! - [`ffi`]: the C ABI (the only `extern "C"` surface besides `jni`).

// The shared-memory protocol writes f32 slices as their in-memory bytes and reads them as
// little-endian values (protocol::f32_bytes / f32_view).
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
/// cbindgen:ignore
pub mod jni;
/// cbindgen:ignore
pub mod npy;
/// cbindgen:ignore
pub mod persist;
/// cbindgen:ignore
pub mod protocol;
/// cbindgen:ignore
pub mod server;
/// cbindgen:ignore
pub mod shm;
/// cbindgen:ignore
pub mod store;
/// cbindgen:ignore
pub mod types;

pub use client::{Kalos, Namespaces, Options, PayloadHit, RecallOptions, UpsertOptions};
pub use error::{Error, Result, Status};
pub use protocol::Stats;
pub use store::{Record, NEVER};
pub use types::{Backend, Dtype, Filter, Hit, Metric, Recency, Role, SyncPolicy, MAX_K};

/// Library version string.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

//! The C ABI. Everything `extern "C"` that cbindgen puts into `include/kalos.h` lives here.
//!
//! Conventions (repeated in the header's top comment):
//! - Every function returns a `kalos_status` (`KALOS_OK` = 0); values are explicit and never
//!   renumbered. Details of a failure are in `kalos_last_error()` on the calling thread.
//! - Outputs come last and are written only on success (exception: `payload_needed`, which is
//!   also written with `KALOS_BUFFER_TOO_SMALL`). Every buffer is followed by its length in
//!   elements.
//! - Every body runs inside `catch_unwind`: a Rust panic becomes `KALOS_PANIC`, never an abort.
//!
//! - `abi`: status codes, constants, the `#[repr(C)]` structs, their initialisers and defaults.
//! - `api`: the exported functions.
//! - `panic`: the panic boundary and the thread's last error message.
//! - [`jni`]: the Java binding's exports (not part of the C header).
//!
//! cbindgen reads this module's files in the order they are declared here (`abi`, `api`,
//! `panic`); the header lists items in that order.

mod abi;
mod api;
/// cbindgen:ignore
pub mod jni;
mod panic;

pub use abi::*;
pub use api::*;
pub use panic::kalos_last_error;

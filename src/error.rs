//! Status codes and the crate's error type.
//!
//! The numeric values of [`Status`] are part of the C ABI: they are explicit, and a value is
//! never renumbered or reused. New codes are appended.

use std::fmt;

/// Result status of every exported function. `KALOS_OK` (0) is success; every other value is
/// an error whose details are in `kalos_last_error()` on the calling thread.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// An argument is invalid (the message says which and why).
    InvalidArgument = 1,
    /// A required pointer argument was NULL.
    NullPointer = 2,
    /// A vector or query does not have the store's dimension.
    DimensionMismatch = 3,
    /// `k` is 0 or above `KALOS_MAX_K` (1024).
    KOutOfRange = 4,
    /// A query or vector holds NaN or Inf.
    NonFinite = 5,
    /// The store name is not valid (1 to 200 characters of `[A-Za-z0-9._-]`).
    InvalidName = 6,
    /// The store is at its capacity; nothing was written.
    StoreFull = 7,
    /// The segment was made by a different layout version of Kalos.
    VersionMismatch = 8,
    /// An id (or the store, for role client) does not exist; the message names it.
    NotFound = 9,
    /// A live server already owns this name (role server).
    AlreadyExists = 10,
    /// The deadline passed before the request completed. The request may or may not have run.
    Timeout = 11,
    /// The server process is gone, stopped or unresponsive. Reopen to reach a new one.
    ServerGone = 12,
    /// A caller buffer is too small; the needed size is reported where the function says.
    BufferTooSmall = 13,
    /// A payload is larger than the store's `max_payload_bytes`.
    PayloadTooLarge = 14,
    /// A data file or the segment is corrupt (the message names the file and offset).
    Corrupt = 15,
    /// An operating-system call failed (the message carries errno's text).
    Io = 16,
    /// The data directory is locked by another live server.
    Locked = 17,
    /// The requested engine is not available on this machine (e.g. CUDA without a GPU).
    BackendUnavailable = 18,
    /// The GPU engine failed (launch failure, out of memory); the message says what.
    Cuda = 19,
    /// The segment or the data directory belongs to another user or its permissions forbid
    /// access; or the data directory is open to group or others (beyond `KALOS_DATA_DIR_MODE`),
    /// or holds a symbolic link (or another non-regular entry) where Kalos opens a file.
    PermissionDenied = 20,
    /// The request does not fit in a shared-memory slot; raise `slot_bytes`.
    TooLarge = 21,
    /// The handle was closed.
    Closed = 22,
    /// A Rust panic was caught at the API boundary; the handle may still be used.
    Panic = 23,
    /// An internal invariant failed; please report it.
    Internal = 24,
    /// Cluster mode: the replicated log (NATS JetStream) could not take the write within its
    /// deadline: this host is cut off from NATS, or the shard's stream has no quorum. A write
    /// refused while the host knew itself disconnected was not logged; one whose
    /// acknowledgement did not arrive in time may or may not have been (the message says
    /// which). Also: no host holding a shard answered a forwarded recall.
    Unavailable = 25,
    /// Cluster mode: the local replica of a shard may be behind its log (this host is cut off
    /// from NATS or still catching up) and the recall did not opt in to stale reads.
    Stale = 26,
}

impl Status {
    pub const ALL: [Status; 27] = [
        Status::Ok,
        Status::InvalidArgument,
        Status::NullPointer,
        Status::DimensionMismatch,
        Status::KOutOfRange,
        Status::NonFinite,
        Status::InvalidName,
        Status::StoreFull,
        Status::VersionMismatch,
        Status::NotFound,
        Status::AlreadyExists,
        Status::Timeout,
        Status::ServerGone,
        Status::BufferTooSmall,
        Status::PayloadTooLarge,
        Status::Corrupt,
        Status::Io,
        Status::Locked,
        Status::BackendUnavailable,
        Status::Cuda,
        Status::PermissionDenied,
        Status::TooLarge,
        Status::Closed,
        Status::Panic,
        Status::Internal,
        Status::Unavailable,
        Status::Stale,
    ];

    /// Errors that belong to the request (a bad query found only where the engine reads it, e.g.
    /// on the device), not to the engine: the server neither falls back to the CPU engine for
    /// them nor does the CUDA engine turn gated tiles off.
    pub fn is_request_error(self) -> bool {
        matches!(self, Status::NonFinite | Status::InvalidArgument)
    }

    pub fn from_u32(v: u32) -> Status {
        Status::ALL.get(v as usize).copied().unwrap_or(Status::Internal)
    }

    /// Stable upper-case name, e.g. `"SERVER_GONE"`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::InvalidArgument => "INVALID_ARGUMENT",
            Status::NullPointer => "NULL_POINTER",
            Status::DimensionMismatch => "DIMENSION_MISMATCH",
            Status::KOutOfRange => "K_OUT_OF_RANGE",
            Status::NonFinite => "NON_FINITE",
            Status::InvalidName => "INVALID_NAME",
            Status::StoreFull => "STORE_FULL",
            Status::VersionMismatch => "VERSION_MISMATCH",
            Status::NotFound => "NOT_FOUND",
            Status::AlreadyExists => "ALREADY_EXISTS",
            Status::Timeout => "TIMEOUT",
            Status::ServerGone => "SERVER_GONE",
            Status::BufferTooSmall => "BUFFER_TOO_SMALL",
            Status::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Status::Corrupt => "CORRUPT",
            Status::Io => "IO",
            Status::Locked => "LOCKED",
            Status::BackendUnavailable => "BACKEND_UNAVAILABLE",
            Status::Cuda => "CUDA",
            Status::PermissionDenied => "PERMISSION_DENIED",
            Status::TooLarge => "TOO_LARGE",
            Status::Closed => "CLOSED",
            Status::Panic => "PANIC",
            Status::Internal => "INTERNAL",
            Status::Unavailable => "UNAVAILABLE",
            Status::Stale => "STALE",
        }
    }

    /// A static, human-readable sentence for the status.
    pub fn describe(self) -> &'static str {
        match self {
            Status::Ok => "success",
            Status::InvalidArgument => "invalid argument",
            Status::NullPointer => "a required pointer was NULL",
            Status::DimensionMismatch => "vector dimension does not match the store",
            Status::KOutOfRange => "k must be between 1 and 1024",
            Status::NonFinite => "a query or vector holds NaN or Inf",
            Status::InvalidName => "invalid store name",
            Status::StoreFull => "the store is full",
            Status::VersionMismatch => "segment layout version mismatch",
            Status::NotFound => "not found",
            Status::AlreadyExists => "a live server already owns this name",
            Status::Timeout => "deadline exceeded",
            Status::ServerGone => "the server is gone",
            Status::BufferTooSmall => "a caller buffer is too small",
            Status::PayloadTooLarge => "payload too large",
            Status::Corrupt => "corrupt data",
            Status::Io => "I/O error",
            Status::Locked => "data directory is locked by another server",
            Status::BackendUnavailable => "requested engine is not available",
            Status::Cuda => "GPU engine error",
            Status::PermissionDenied => "permission denied",
            Status::TooLarge => "request does not fit in a shared-memory slot",
            Status::Closed => "handle is closed",
            Status::Panic => "internal panic caught at the API boundary",
            Status::Internal => "internal error",
            Status::Unavailable => "the cluster log or the hosts of a shard cannot be reached",
            Status::Stale => "the local replica may be behind its log",
        }
    }
}

/// The error type of the Rust API: a status plus a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    pub fn io(context: &str, e: std::io::Error) -> Error {
        Error::new(Status::Io, format!("{context}: {e}"))
    }
    pub fn last_os(context: &str) -> Error {
        Error::io(context, std::io::Error::last_os_error())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand: `err!(Status::X, "fmt", args)` builds an `Err(Error)`.
#[macro_export]
macro_rules! err {
    ($status:expr, $($arg:tt)*) => {
        Err($crate::error::Error::new($status, format!($($arg)*)))
    };
}

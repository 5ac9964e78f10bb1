//! Wire format of requests and responses inside a slot's data area. Every byte a request or a
//! response carries is written and read by this module; the client, the server and the engines
//! call into it.
//!
//! Little-endian, fixed order, no padding. Every read is bounds-checked: the server parses a
//! private copy of the client's bytes, and a malformed message is answered with an error status.
//!
//! Requests start with a `u32` op code. Layouts (after the op):
//! - RECALL: k u32, nq u32, flags u32, nns u32 (u32::MAX = all namespaces), recency_w f32,
//!   half_life_ms f64, `ns u64[nns]`, `queries f32[nq*dim]`.
//!   Response: `counts u32[nq]`, `ids u64[Σ]`, `scores f32[Σ]`; with FLAG_PAYLOADS also
//!   `lens u32[Σ]` (u32::MAX = no payload) and the payload bytes back to back.
//! - UPSERT: n u32, ns_mode u32 (0 = one namespace for all, 1 = per item), ttl_ms u64 (0 = none),
//!   expires_ms u64 (u64::MAX = none), ns u64 (mode 0) or `u64[n]`, `ids u64[n]`, `vectors f32[n*dim]`,
//!   has_payloads u32, then (if 1) `lens u32[n]` (u32::MAX = none) and bytes. Response: empty.
//! - DELETE: n u32, `ids u64[n]`. Response: deleted u64.
//! - DELETE_NS: ns u64. Response: deleted u64.
//! - GET: n u32, `ids u64[n]`. Response per id: ns u64, created u64, expires u64, `vector f32[dim]`,
//!   len u32 (u32::MAX = none), bytes.
//! - STATS: nothing. Response: [`Stats`] counters as u64s, then the engine name and the fallback
//!   reason (each a u32 length and the bytes).
//! - CLEAR: nothing. Response: deleted u64.
//! - DELETE_WHERE: nns u32 (u32::MAX = all namespaces), `ns u64[nns]`, len u32, filter bytes.
//!   Response: deleted u64.
//! - LIST: flags u32 (1 = after is set, 2 = a filter follows), limit u32, after u64, nns u32
//!   (u32::MAX = all namespaces), `ns u64[nns]`, then (flag 2) len u32 and the filter bytes.
//!   Response: remaining u64 (matching ids after the last one listed), count u32, `ids u64[count]`
//!   ascending.
//! - APPLY (cluster mode, from the server's own process): log entries; see [`cluster`], which
//!   also holds the recall's cluster section and the write token of cluster replies.
//!
//! An error response carries the UTF-8 message as its body and a non-zero status.
//!
//! - [`codec`]: [`Writer`] and [`Reader`], the values every message is built from.
//! - [`request`]: op codes, the client's request encoders and the server's decoders.
//! - [`response`]: the server's response encoders (the recall body also straight into a slot,
//!   [`DirectOut`]) and the client's parsers; [`Stats`].
//!
//! [`cluster`]: crate::wire::cluster
//! [`codec`]: crate::wire::codec
//! [`request`]: crate::wire::request
//! [`response`]: crate::wire::response
//! [`Writer`]: crate::wire::Writer
//! [`Reader`]: crate::wire::Reader
//! [`DirectOut`]: crate::wire::DirectOut
//! [`Stats`]: crate::wire::Stats

pub mod cluster;
pub mod codec;
pub mod request;
pub mod response;

pub use codec::{f32_bytes, f32_view, Reader, Writer, NONE_U32};
pub use request::{
    op_name, FLAG_FILTER, FLAG_PAYLOADS, OP_APPLY, OP_CLEAR, OP_DELETE, OP_DELETE_NS, OP_DELETE_WHERE, OP_GET, OP_LIST, OP_RECALL,
    OP_STATS, OP_UPSERT,
};
pub use request::{SearchRequest, SlotQueries};
pub use response::{DirectOut, OpLatency, OpStatusCount, Stats, LATENCY_BUCKETS_NS};

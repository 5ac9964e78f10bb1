//! Wire format of requests and responses inside a slot's data area.
//!
//! Little-endian, fixed order, no padding. Every read is bounds-checked: the server parses a
//! private copy of the client's bytes, and a malformed message is answered with an error status.
//!
//! Requests start with a `u32` op code. Layouts (after the op):
//! - RECALL: k u32, nq u32, flags u32, nns u32 (u32::MAX = all namespaces), recency_w f32,
//!   half_life_ms f64, ns u64[nns], queries f32[nq*dim].
//!   Response: counts u32[nq], ids u64[Σ], scores f32[Σ]; with FLAG_PAYLOADS also
//!   lens u32[Σ] (u32::MAX = no payload) and the payload bytes back to back.
//! - UPSERT: n u32, ns_mode u32 (0 = one namespace for all, 1 = per item), ttl_ms u64 (0 = none),
//!   expires_ms u64 (u64::MAX = none), ns u64 (mode 0) or u64[n], ids u64[n], vectors f32[n*dim],
//!   has_payloads u32, then (if 1) lens u32[n] (u32::MAX = none) and bytes. Response: empty.
//! - DELETE: n u32, ids u64[n]. Response: deleted u64.
//! - DELETE_NS: ns u64. Response: deleted u64.
//! - GET: n u32, ids u64[n]. Response per id: ns u64, created u64, expires u64, vector f32[dim],
//!   len u32 (u32::MAX = none), bytes.
//! - STATS: nothing. Response: [`StatsWire`] fields as u64s, then the engine name (u32 len + bytes).
//! - CLEAR: nothing. Response: deleted u64.
//!
//! An error response carries the UTF-8 message as its body and a non-zero status.

use std::borrow::Cow;

use crate::error::{Error, Result, Status};

pub const OP_RECALL: u32 = 1;
pub const OP_UPSERT: u32 = 2;
pub const OP_DELETE: u32 = 3;
pub const OP_DELETE_NS: u32 = 4;
pub const OP_GET: u32 = 5;
pub const OP_STATS: u32 = 6;
pub const OP_CLEAR: u32 = 7;

pub const FLAG_PAYLOADS: u32 = 1;
pub const NONE_U32: u32 = u32::MAX;

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer { buf: Vec::new() }
    }
    pub fn clear(&mut self) {
        self.buf.clear();
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64s(&mut self, v: &[u64]) -> &mut Self {
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.buf.extend_from_slice(f32_bytes(v));
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The wire bytes of an f32 slice: f32 slices are written in bulk, since on little-endian
/// targets (the only ones the crate builds for) the in-memory bytes are the wire bytes.
pub fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 slice is readable as bytes of 4× its length; the borrow keeps it alive.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Wire bytes read in place as f32 values, when they are 4-byte aligned (else None: copy them
/// with `Reader::f32s`; `Reader::f32s_cow` does either). `b.len()` must be a multiple of 4.
pub fn f32_view(b: &[u8]) -> Option<&[f32]> {
    if !cfg!(target_endian = "little") || !b.len().is_multiple_of(4) || !(b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        return None;
    }
    // SAFETY: aligned for f32 (checked), length a multiple of 4, every bit pattern is a valid
    // f32, and the view borrows `b`, so it lives no longer than the bytes.
    Some(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) })
}

pub struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

fn malformed(what: &str) -> Error {
    Error::new(Status::InvalidArgument, format!("malformed message: {what} runs past the end"))
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, pos: 0 }
    }
    pub fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(malformed(what));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    pub fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    pub fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    pub fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    pub fn u64s(&mut self, n: usize, what: &str) -> Result<Vec<u64>> {
        let b = self.take(n.checked_mul(8).ok_or_else(|| malformed(what))?, what)?;
        Ok(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    }
    pub fn u32s(&mut self, n: usize, what: &str) -> Result<Vec<u32>> {
        let b = self.take(n.checked_mul(4).ok_or_else(|| malformed(what))?, what)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
    }
    pub fn f32s_into(&mut self, n: usize, out: &mut Vec<f32>, what: &str) -> Result<()> {
        let b = self.take(n.checked_mul(4).ok_or_else(|| malformed(what))?, what)?;
        out.clear();
        out.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())));
        Ok(())
    }
    /// n f32 values read in place from the message when they are aligned (no copy), else
    /// copied as `f32s` does.
    pub fn f32s_cow(&mut self, n: usize, what: &str) -> Result<Cow<'a, [f32]>> {
        let b = self.take(n.checked_mul(4).ok_or_else(|| malformed(what))?, what)?;
        Ok(match f32_view(b) {
            Some(v) => Cow::Borrowed(v),
            None => Cow::Owned(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
        })
    }
    pub fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        self.f32s_into(n, &mut v, what)?;
        Ok(v)
    }
}

/// Server statistics as carried by an OP_STATS response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub count: u64,
    pub capacity: u64,
    pub dim: u64,
    pub metric: u64,
    pub dtype: u64,
    /// 1 = cpu, 2 = cuda.
    pub engine: u64,
    pub requests: u64,
    pub queries: u64,
    pub batches: u64,
    pub errors: u64,
    /// Server-side service time percentiles of the last 4096 recall requests, in nanoseconds.
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Submitted requests waiting when the last batch was taken.
    pub queue_depth: u64,
    pub server_pid: u64,
    pub epoch: u64,
    pub payload_bytes: u64,
    pub uptime_ms: u64,
    /// Number of times the GPU engine failed and the server fell back to the CPU.
    pub engine_fallbacks: u64,
    pub engine_name: String,
    /// Why the CUDA engine is not serving: it could not start under backend auto, or it failed
    /// while serving. Empty when nothing fell back.
    pub fallback_reason: String,
}

impl Stats {
    pub fn encode(&self, w: &mut Writer) {
        w.u64s(&[
            self.count,
            self.capacity,
            self.dim,
            self.metric,
            self.dtype,
            self.engine,
            self.requests,
            self.queries,
            self.batches,
            self.errors,
            self.p50_ns,
            self.p99_ns,
            self.queue_depth,
            self.server_pid,
            self.epoch,
            self.payload_bytes,
            self.uptime_ms,
            self.engine_fallbacks,
        ]);
        w.u32(self.engine_name.len() as u32).bytes(self.engine_name.as_bytes());
        w.u32(self.fallback_reason.len() as u32).bytes(self.fallback_reason.as_bytes());
    }
    pub fn decode(r: &mut Reader<'_>) -> Result<Stats> {
        let v = r.u64s(18, "stats")?;
        let n = r.u32("engine name length")? as usize;
        let name = String::from_utf8_lossy(r.take(n, "engine name")?).into_owned();
        let n = r.u32("fallback reason length")? as usize;
        let fallback_reason = String::from_utf8_lossy(r.take(n, "fallback reason")?).into_owned();
        Ok(Stats {
            count: v[0],
            capacity: v[1],
            dim: v[2],
            metric: v[3],
            dtype: v[4],
            engine: v[5],
            requests: v[6],
            queries: v[7],
            batches: v[8],
            errors: v[9],
            p50_ns: v[10],
            p99_ns: v[11],
            queue_depth: v[12],
            server_pid: v[13],
            epoch: v[14],
            payload_bytes: v[15],
            uptime_ms: v[16],
            engine_fallbacks: v[17],
            engine_name: name,
            fallback_reason,
        })
    }
}

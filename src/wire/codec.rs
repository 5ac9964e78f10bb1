//! The codec every message is built from: little-endian fixed-size values and arrays, written
//! by [`Writer`] and read back, bounds-checked, by [`Reader`].

use std::borrow::Cow;

use crate::error::{Error, Result, Status};

/// Marks an absent length or list where the layout has a u32 (no payload, all namespaces).
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
    /// The bytes not read yet (nothing is consumed).
    pub fn rest(&self) -> &'a [u8] {
        &self.b[self.pos..]
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

//! The encoding shared by both file kinds: the 48-byte file header, the size of the header that
//! frames log records and snapshot blocks (`len u32 | crc32c(len ‖ body) u32`), and the columnar
//! row encoding that upsert records and snapshot blocks both carry.

use std::path::Path;

use super::crc::crc32c;
use crate::error::{Error, Result, Status};
use crate::store::UpsertItem;
use crate::types::Metric;

/// Format version of both file kinds that this build writes. Version 2 added the metadata fields
/// section of row blocks; a version 1 file is a version 2 file without it, so both are read.
/// cbindgen:ignore
pub const FORMAT_VERSION: u32 = 2;
/// Oldest format version this build reads.
/// cbindgen:ignore
pub const OLDEST_FORMAT_VERSION: u32 = 1;
const WAL_MAGIC: &[u8; 8] = b"KALOSWAL";
const SNAP_MAGIC: &[u8; 8] = b"KALOSSNP";
/// File header size (both kinds).
/// cbindgen:ignore
pub const HEADER_BYTES: usize = 48;
/// Record (and snapshot block) header size: `len u32 | crc u32`.
pub(super) const REC_HEADER: usize = 8;
/// Payload length of a row without a payload.
const NO_PAYLOAD: u32 = u32::MAX;

/// A `Status::Corrupt` error naming the file and the offset of the damage.
pub(super) fn corrupt(path: &Path, offset: usize, what: impl std::fmt::Display) -> Error {
    Error::new(Status::Corrupt, format!("{} at offset {offset}: {what}", path.display()))
}

pub(super) fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
pub(super) fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// File kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Wal,
    Snap,
}

/// The 48-byte header of both file kinds (see docs/FORMATS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileHeader {
    pub(super) kind: Kind,
    /// Format version read from the file ([`FORMAT_VERSION`] for a header to write).
    pub(super) version: u32,
    pub(super) dim: u32,
    pub(super) metric: u32,
    pub(super) generation: u64,
    /// WAL: sequence number of its first record. Snapshot: first sequence number NOT included.
    pub(super) seq: u64,
}

impl FileHeader {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES);
        b.extend_from_slice(if self.kind == Kind::Wal { WAL_MAGIC } else { SNAP_MAGIC });
        put_u32(&mut b, self.version);
        put_u32(&mut b, self.dim);
        put_u32(&mut b, self.metric);
        put_u32(&mut b, 0);
        put_u64(&mut b, self.generation);
        put_u64(&mut b, self.seq);
        let c = crc32c(&b);
        put_u32(&mut b, c);
        put_u32(&mut b, 0);
        debug_assert_eq!(b.len(), HEADER_BYTES);
        b
    }
    pub(super) fn decode(path: &Path, b: &[u8], kind: Kind) -> Result<FileHeader> {
        if b.len() < HEADER_BYTES {
            return Err(corrupt(path, 0, format!("file of {} bytes is shorter than its {HEADER_BYTES}-byte header", b.len())));
        }
        let magic = if kind == Kind::Wal { WAL_MAGIC } else { SNAP_MAGIC };
        if &b[..8] != magic {
            return Err(corrupt(path, 0, format!("bad magic (expected {:?})", String::from_utf8_lossy(magic))));
        }
        if crc32c(&b[..40]) != get_u32(b, 40) {
            return Err(corrupt(path, 40, "header checksum mismatch"));
        }
        let v = get_u32(b, 8);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&v) {
            return Err(Error::new(
                Status::VersionMismatch,
                format!("{}: format version {v}; this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}", path.display()),
            ));
        }
        Ok(FileHeader { kind, version: v, dim: get_u32(b, 12), metric: get_u32(b, 16), generation: get_u64(b, 24), seq: get_u64(b, 32) })
    }
}

/// Appends the columnar encoding of `items` (shared by upsert records and snapshot blocks):
/// `count u32 | ids u64[n] | ns u64[n] | created u64[n] | expires u64[n] | plen u32[n] |
/// vectors f32[n*dim] | payload bytes (concatenated) | [fields]`, where the fields section
/// (`count u16 | (name, value)*` per row, in row order) is present only when some row has a
/// field: a block without fields is byte for byte a version 1 block.
pub(super) fn encode_rows(b: &mut Vec<u8>, items: &[UpsertItem<'_>]) {
    put_u32(b, items.len() as u32);
    for it in items {
        put_u64(b, it.id);
    }
    for it in items {
        put_u64(b, it.namespace);
    }
    for it in items {
        put_u64(b, it.created_ms);
    }
    for it in items {
        put_u64(b, it.expires_ms);
    }
    for it in items {
        put_u32(b, it.payload.map_or(NO_PAYLOAD, |p| p.len() as u32));
    }
    for it in items {
        for &x in it.vector {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    for it in items {
        if let Some(p) = it.payload {
            b.extend_from_slice(p);
        }
    }
    if items.iter().any(|it| !it.fields.is_empty()) {
        for it in items {
            crate::meta::encode_item(b, it.fields);
        }
    }
}

/// Decoded rows (owned), convertible to `UpsertItem`s.
pub(super) struct Rows {
    ids: Vec<u64>,
    ns: Vec<u64>,
    created: Vec<u64>,
    expires: Vec<u64>,
    plen: Vec<u32>,
    vectors: Vec<f32>,
    payloads: Vec<u8>,
    /// One list per row, or empty when the block has no fields section.
    fields: Vec<Vec<crate::meta::Field>>,
}

impl Rows {
    pub(super) fn items(&self, dim: usize) -> Vec<UpsertItem<'_>> {
        let mut off = 0usize;
        (0..self.ids.len())
            .map(|i| {
                let payload = if self.plen[i] == NO_PAYLOAD {
                    None
                } else {
                    let p = &self.payloads[off..off + self.plen[i] as usize];
                    off += self.plen[i] as usize;
                    Some(p)
                };
                UpsertItem {
                    id: self.ids[i],
                    namespace: self.ns[i],
                    vector: &self.vectors[i * dim..(i + 1) * dim],
                    payload,
                    created_ms: self.created[i],
                    expires_ms: self.expires[i],
                    fields: self.fields.get(i).map_or(&[][..], |f| f.as_slice()),
                }
            })
            .collect()
    }
}

/// Decodes rows; `Err(message)` when the bytes are inconsistent (checksum-valid but malformed
/// bodies only come from bugs or deliberate tampering; they are reported as corruption).
pub(super) fn decode_rows(b: &[u8], dim: usize) -> std::result::Result<Rows, String> {
    if b.len() < 4 {
        return Err("row block shorter than its count".into());
    }
    let n = get_u32(b, 0) as usize;
    let fixed = n.checked_mul(8 * 4 + 4 + dim * 4).ok_or("row count overflows")?;
    if 4 + fixed > b.len() {
        return Err(format!("{n} rows need {} bytes; the block holds {}", 4 + fixed, b.len()));
    }
    let mut o = 4;
    let col64 = |o: &mut usize| -> Vec<u64> {
        let v = (0..n).map(|i| get_u64(b, *o + 8 * i)).collect();
        *o += 8 * n;
        v
    };
    let ids = col64(&mut o);
    let ns = col64(&mut o);
    let created = col64(&mut o);
    let expires = col64(&mut o);
    let plen: Vec<u32> = (0..n).map(|i| get_u32(b, o + 4 * i)).collect();
    o += 4 * n;
    let vectors: Vec<f32> = b[o..o + n * dim * 4].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    o += n * dim * 4;
    let ptotal: usize = plen.iter().filter(|&&l| l != NO_PAYLOAD).map(|&l| l as usize).sum();
    if o + ptotal > b.len() {
        return Err(format!("payloads need {ptotal} bytes; {} remain", b.len() - o));
    }
    let payloads = b[o..o + ptotal].to_vec();
    o += ptotal;
    let mut fields = Vec::new();
    if o < b.len() {
        let mut c = crate::meta::Cursor::new(&b[o..], "fields section");
        for _ in 0..n {
            fields.push(crate::meta::decode_item(&mut c).map_err(|e| e.message)?);
        }
        if c.remaining() != 0 {
            return Err(format!("{} bytes after the fields section", c.remaining()));
        }
    }
    Ok(Rows { ids, ns, created, expires, plen, vectors, payloads, fields })
}

/// Checks that a file's header matches the store's dimension and metric.
pub(super) fn check_shape(path: &Path, h: &FileHeader, dim: u32, metric: u32) -> Result<()> {
    if h.dim != dim {
        return Err(Error::new(
            Status::DimensionMismatch,
            format!("{} holds vectors of dimension {}; the store was opened with dimension {dim}", path.display(), h.dim),
        ));
    }
    if h.metric != metric {
        let name = |m: u32| Metric::from_u32(m).map(|m| m.name()).unwrap_or("unknown");
        return Err(Error::new(
            Status::InvalidArgument,
            format!("{} was written with metric {}; the store was opened with metric {}", path.display(), name(h.metric), name(metric)),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_damage() {
        let h = FileHeader { kind: Kind::Wal, version: FORMAT_VERSION, dim: 7, metric: 1, generation: 3, seq: 99 };
        let b = h.encode();
        assert_eq!(FileHeader::decode(Path::new("x"), &b, Kind::Wal).unwrap(), h);
        let mut c = b.clone();
        c[30] ^= 1;
        assert_eq!(FileHeader::decode(Path::new("x"), &c, Kind::Wal).unwrap_err().status, Status::Corrupt);
        assert_eq!(FileHeader::decode(Path::new("x"), &b, Kind::Snap).unwrap_err().status, Status::Corrupt);
    }
}

//! Entry points for the fuzz harness (`tests/fuzz.rs`), not a supported API: the file header,
//! log and snapshot parsers of this module run on bytes in memory exactly as recovery
//! ([`super::Persist::open`]) and [`super::repair()`] run them on a mapped file, and the real
//! encoders build the valid inputs that the harness mutates. Errors and notes name the file
//! `<fuzz>`.

use std::path::Path;

use super::record::{decode_rows, encode_rows, FileHeader, Kind, FORMAT_VERSION, REC_HEADER};
use super::snapshot::{encode_snapshot as encode_snapshot_to, load_snapshot_bytes};
use super::wal::{apply_record, encode_record as encode_record_to, scan_log};
use super::WalOp;
use crate::error::Result;
use crate::store::Store;
use crate::types::Metric;

fn path() -> &'static Path {
    Path::new("<fuzz>")
}

/// The fields of a decoded file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub dim: u32,
    pub metric: u32,
    pub generation: u64,
    pub seq: u64,
}

/// The 48-byte header of a snapshot (`snapshot`) or a log.
pub fn encode_header(snapshot: bool, h: Header) -> Vec<u8> {
    let kind = if snapshot { Kind::Snap } else { Kind::Wal };
    FileHeader { kind, version: FORMAT_VERSION, dim: h.dim, metric: h.metric, generation: h.generation, seq: h.seq }.encode()
}

/// Decodes the header at the start of `b` (a snapshot when `snapshot`, else a log).
pub fn decode_header(b: &[u8], snapshot: bool) -> Result<Header> {
    let kind = if snapshot { Kind::Snap } else { Kind::Wal };
    let h = FileHeader::decode(path(), b, kind)?;
    Ok(Header { dim: h.dim, metric: h.metric, generation: h.generation, seq: h.seq })
}

/// Appends one log record (record header and body) for `op` with sequence number `seq`.
pub fn encode_record(buf: &mut Vec<u8>, seq: u64, op: &WalOp<'_>) {
    encode_record_to(buf, seq, op);
}

/// What [`replay_log`] found.
#[derive(Debug, Clone)]
pub struct LogReplay {
    pub header: Header,
    /// Body ranges of the intact records, in order.
    pub records: Vec<(usize, usize)>,
    /// Offset just after the last intact record.
    pub end: usize,
    /// `(offset, intact record after it?)` when the bytes after `end` are damaged.
    pub damage: Option<(usize, bool)>,
}

/// Replays the log bytes `b` into `store` as recovery does: the header is decoded, the records
/// are scanned from the header's sequence number and each intact record is applied (the first
/// that fails to apply is the error). The store's dimension is the one records are read with.
pub fn replay_log(b: &[u8], store: &mut Store) -> Result<LogReplay> {
    let h = FileHeader::decode(path(), b, Kind::Wal)?;
    let s = scan_log(b, h.seq);
    for &(st, en) in &s.records {
        apply_record(path(), st - REC_HEADER, &b[st..en], store.dim(), store)?;
    }
    let header = Header { dim: h.dim, metric: h.metric, generation: h.generation, seq: h.seq };
    Ok(LogReplay { header, records: s.records, end: s.end, damage: s.damage })
}

/// Repair's count of the intact records of a log from offset `from` on, any sequence number.
pub fn count_records(b: &[u8], from: usize) -> u64 {
    super::repair::count_records(b, from)
}

/// Decodes a row block (an upsert record's operands, a snapshot block's body) of vectors of
/// dimension `dim` and encodes the rows again; None when the block is refused.
pub fn rows_reencoded(b: &[u8], dim: usize) -> Option<Vec<u8>> {
    let rows = decode_rows(b, dim).ok()?;
    let mut out = Vec::with_capacity(b.len());
    encode_rows(&mut out, &rows.items(dim));
    Some(out)
}

/// What [`load_snapshot`] found.
#[derive(Debug, Clone)]
pub struct SnapshotLoad {
    pub header: Header,
    pub rows: u64,
    /// Bytes up to the end of the end block.
    pub size: u64,
    /// One per problem skipped (salvage only).
    pub notes: Vec<String>,
}

/// Loads the snapshot bytes `b` into `store`: recovery's load when `salvage` is false,
/// repair's when true. The header must name the store's dimension and metric.
pub fn load_snapshot(b: &[u8], store: &mut Store, salvage: bool) -> Result<SnapshotLoad> {
    let expect = Some((store.dim() as u32, store.metric() as u32));
    let (h, rows, size, notes) = load_snapshot_bytes(path(), b, expect, store, salvage)?;
    let header = Header { dim: h.dim, metric: h.metric, generation: h.generation, seq: h.seq };
    Ok(SnapshotLoad { header, rows, size, notes })
}

/// The snapshot bytes of `store` as generation `gen` covering sequence numbers `< seq`.
pub fn encode_snapshot(store: &Store, gen: u64, seq: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_snapshot_to(&mut out, gen, seq, store).expect("writing to a Vec cannot fail");
    out
}

/// A store of dimension `dim` and `metric` that takes any number of rows and payloads of any
/// length (what repair loads into).
pub fn unbounded_store(dim: usize, metric: Metric) -> Store {
    Store::new(dim, metric, u32::MAX as usize, u32::MAX as usize)
}

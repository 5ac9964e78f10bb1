//! Write-ahead log records: encoding one mutation as a record, finding intact records in a log
//! (checksum and sequence number), and applying a record to the store.
//!
//! A record is `len u32 | crc32c(len ‖ body) u32 | body`; the body is `seq u64 | op u8 | operands`
//! (docs/FORMATS.md). Sequence numbers are consecutive modulo 2^64 (2^64 - 1 is followed by 0).

use std::path::Path;

use super::crc::{crc32c, crc32c_update};
use super::record::{corrupt, decode_rows, encode_rows, get_u32, get_u64, put_u32, put_u64, HEADER_BYTES, REC_HEADER};
use super::WalOp;
use crate::error::{Error, Result};
use crate::store::{Store, UpsertItem};

const OP_UPSERT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_DELETE_NS: u8 = 3;
const OP_CLEAR: u8 = 4;
/// Smallest body: seq u64 + op u8.
const MIN_BODY: usize = 9;

/// Encodes one WAL record (header + body) onto `buf`.
pub(super) fn encode_record(buf: &mut Vec<u8>, seq: u64, op: &WalOp<'_>) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; REC_HEADER]);
    put_u64(buf, seq);
    match op {
        WalOp::Upsert(items) => {
            buf.push(OP_UPSERT);
            encode_rows(buf, items);
        }
        WalOp::Delete(ids) => {
            buf.push(OP_DELETE);
            put_u32(buf, ids.len() as u32);
            for &id in ids.iter() {
                put_u64(buf, id);
            }
        }
        WalOp::DeleteNamespace(ns) => {
            buf.push(OP_DELETE_NS);
            put_u64(buf, *ns);
        }
        WalOp::Clear => buf.push(OP_CLEAR),
    }
    let len = (buf.len() - start - REC_HEADER) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c_update(crc32c(&len.to_le_bytes()), &buf[start + REC_HEADER..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// If a valid record starts at `o`, returns its body range.
pub(super) fn record_at(b: &[u8], o: usize, min_seq: u64) -> Option<(usize, usize)> {
    if o + REC_HEADER > b.len() {
        return None;
    }
    let len = get_u32(b, o) as usize;
    if len < MIN_BODY || len > b.len() - o - REC_HEADER {
        return None;
    }
    let body = &b[o + REC_HEADER..o + REC_HEADER + len];
    let crc = crc32c_update(crc32c(&b[o..o + 4]), body);
    if crc != get_u32(b, o + 4) || get_u64(body, 0) < min_seq {
        return None;
    }
    Some((o + REC_HEADER, o + REC_HEADER + len))
}

/// Result of scanning a log.
pub(super) struct Scan {
    /// Body ranges of intact records, in order.
    pub(super) records: Vec<(usize, usize)>,
    /// Offset just after the last intact record.
    pub(super) end: usize,
    /// Set when the bytes after `end` are damaged: `(offset, intact record found after it?)`.
    pub(super) damage: Option<(usize, bool)>,
}

/// Scans the records of a log starting at `HEADER_BYTES`, checking checksums and sequence numbers.
pub(super) fn scan_log(b: &[u8], first_seq: u64) -> Scan {
    let mut o = HEADER_BYTES;
    let mut seq = first_seq;
    let mut records = Vec::new();
    while o < b.len() {
        match record_at(b, o, seq) {
            Some((s, e)) if get_u64(b, s) == seq => {
                records.push((s, e));
                seq = seq.wrapping_add(1);
                o = e;
            }
            _ => {
                // Damaged (or out-of-sequence) record: is there an intact record anywhere after?
                let later = (o + 1..b.len().saturating_sub(REC_HEADER + MIN_BODY - 1)).any(|p| record_at(b, p, seq).is_some());
                return Scan { records, end: o, damage: Some((o, later)) };
            }
        }
    }
    Scan { records, end: o, damage: None }
}

/// Applies one record body to the store.
pub(super) fn apply_record(path: &Path, off: usize, body: &[u8], dim: usize, store: &mut Store) -> Result<()> {
    let op = body[8];
    let rest = &body[9..];
    let bad = |m: String| corrupt(path, off, m);
    match op {
        OP_UPSERT => {
            let rows = decode_rows(rest, dim).map_err(bad)?;
            let items = rows.items(dim);
            store
                .validate_upsert(&items)
                .map_err(|e| Error::new(e.status, format!("{}: replaying record at offset {off}: {}", path.display(), e.message)))?;
            store.apply_upsert(&items);
        }
        OP_DELETE => {
            if rest.len() < 4 || rest.len() != 4 + 8 * get_u32(rest, 0) as usize {
                return Err(bad("malformed delete record".into()));
            }
            let ids: Vec<u64> = (0..get_u32(rest, 0) as usize).map(|i| get_u64(rest, 4 + 8 * i)).collect();
            store.delete_present(&ids);
        }
        OP_DELETE_NS => {
            if rest.len() != 8 {
                return Err(bad("malformed delete-namespace record".into()));
            }
            store.delete_namespace(get_u64(rest, 0));
        }
        OP_CLEAR => store.clear(),
        o => return Err(bad(format!("unknown record op {o}"))),
    }
    Ok(())
}

/// [`apply_record`] for repair: an upsert record (checksum intact) holding rows the store
/// refuses keeps the rows it accepts ([`apply_valid_rows`]). Returns a note per row left out.
pub(super) fn salvage_record(path: &Path, off: usize, body: &[u8], dim: usize, store: &mut Store) -> Result<Vec<String>> {
    if body[8] == OP_UPSERT {
        if let Ok(rows) = decode_rows(&body[9..], dim) {
            let items = rows.items(dim);
            if store.validate_upsert(&items).is_err() {
                return Ok(apply_valid_rows(store, &items, &format!("{}: record at offset {off}", path.display())));
            }
        }
    }
    apply_record(path, off, body, dim, store).map(|()| Vec::new())
}

/// Applies, one at a time, the rows of `items` that the store accepts, and leaves out the others
/// (a vector that is not finite, or whose norm passes f32): for repair, which keeps every row it
/// can of a checksum-intact record or snapshot block. Returns one note per row left out, each
/// starting with `at`.
pub(super) fn apply_valid_rows(store: &mut Store, items: &[UpsertItem<'_>], at: &str) -> Vec<String> {
    let mut notes = Vec::new();
    for it in items {
        let one = std::slice::from_ref(it);
        match store.validate_upsert(one) {
            Ok(()) => store.apply_upsert(one),
            Err(e) => notes.push(format!("{at}: left out the row of id {}: {}", it.id, e.message)),
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(n: u64, first_seq: u64) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES];
        for i in 0..n {
            encode_record(&mut b, first_seq.wrapping_add(i), &WalOp::DeleteNamespace(i));
        }
        b
    }

    #[test]
    fn scan_finds_records_torn_tail_and_middle_damage() {
        let b = log_of(3, 10);
        let s = scan_log(&b, 10);
        assert_eq!((s.records.len(), s.end, s.damage), (3, b.len(), None));
        // Each DeleteNamespace record: header, seq, op, namespace.
        let rec = REC_HEADER + MIN_BODY + 8;
        assert_eq!(b.len(), HEADER_BYTES + 3 * rec);
        // A log must continue the expected sequence numbers.
        assert_eq!(scan_log(&b, 11).damage, Some((HEADER_BYTES, true)));
        // Damage in the last record: a torn tail (nothing intact after it).
        let mut t = b.clone();
        t.truncate(b.len() - 3);
        let s = scan_log(&t, 10);
        assert_eq!((s.records.len(), s.end, s.damage), (2, HEADER_BYTES + 2 * rec, Some((HEADER_BYTES + 2 * rec, false))));
        // Damage in the first record: intact records follow it.
        let mut m = b.clone();
        m[HEADER_BYTES + REC_HEADER + 9] ^= 1;
        let s = scan_log(&m, 10);
        assert_eq!((s.records.len(), s.damage), (0, Some((HEADER_BYTES, true))));
    }

    /// Sequence numbers wrap: 2^64 - 1 is followed by 0 (the scan overflowed there; found by
    /// fuzz/, whose builds check arithmetic overflow as `cargo test` without --release does).
    #[test]
    fn sequence_numbers_wrap() {
        let b = log_of(3, u64::MAX - 1);
        let s = scan_log(&b, u64::MAX - 1);
        assert_eq!((s.records.len(), s.end, s.damage), (3, b.len(), None));
    }
}

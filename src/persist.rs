//! Durability: a checksummed write-ahead log plus snapshots in a data directory.
//!
//! The formats are specified in `docs/FORMATS.md` and the guarantees in `docs/DURABILITY.md`;
//! this comment is the short version.
//!
//! Directory `D` holds:
//! - `LOCK`: `flock`ed exclusively by the one server that owns `D` (the kernel drops the lock
//!   when that process dies, even by SIGKILL, so there is no stale-lock cleanup to get wrong).
//! - `snap-<G>.snap` (generation `G`, 16 hex digits): the whole table as of log sequence
//!   number `seq`, written as `snap-<G>.snap.tmp`, fsynced, renamed, and the directory fsynced.
//!   Generation 0 has no snapshot (the empty table).
//! - `wal-<G>.wal`: every mutation after snapshot `G`, one checksummed record per write request.
//!   Compaction starts log `G+1` at once and writes snapshot `G+1` on a background thread from a
//!   copy of the table, so until that snapshot is renamed the state is snapshot `G` + the log
//!   chain `wal-<G>`, `wal-<G+1>`.
//!
//! Recovery = newest snapshot + replay of its log chain. A record is `len u32 | crc32c(len ‖ body) u32 |
//! body`, the body starting with its sequence number, so a record can neither be skipped, repeated
//! nor misparsed without the checksum or the sequence check noticing. When the log ends in a
//! damaged record and no intact record follows it anywhere in the file, the damage is a torn
//! write of the last (unacknowledged, under `sync=always`) batch: it is truncated and reported in
//! [`Recovery::torn_tail`]. When an intact record follows the damage, the damage is in the middle
//! of the log and the open fails with `Status::Corrupt` naming the file and the offset; nothing
//! is truncated. [`repair`] then recovers the intact prefix and moves the damaged files aside.
//!
//! Checksum: CRC-32C (Castagnoli), computed with the SSE4.2 `crc32` instruction when the CPU has
//! it and a slice-by-8 table otherwise (`crc32c` below). It is what ext4, iSCSI, RocksDB and
//! LevelDB use for the same job; it detects all burst errors up to 32 bits and, unlike zlib's
//! CRC-32, has a hardware instruction on every x86-64 server, so checksumming the log costs
//! nothing next to the fsync. Implementing it here (≈60 lines, tested against the RFC 3720
//! check values) avoids a dependency for one function.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Status};
use crate::store::{Store, UpsertItem};
use crate::types::{now_unix_ms, Metric, SyncPolicy};

#[derive(Debug, Clone)]
pub struct PersistOptions {
    pub sync: SyncPolicy,
    pub sync_interval_ms: u64,
}

/// One logged mutation.
pub enum WalOp<'a> {
    Upsert(&'a [UpsertItem<'a>]),
    Delete(&'a [u64]),
    DeleteNamespace(u64),
    Clear,
}

/// What recovery found.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    pub snapshot_rows: u64,
    pub records_replayed: u64,
    /// Set when a torn tail was truncated: names the file, offset and bytes dropped.
    pub torn_tail: Option<String>,
    /// Generation of the snapshot/log pair in use.
    pub generation: u64,
    /// Bytes of log replayed (after the file header).
    pub log_bytes: u64,
    /// Rows dropped at recovery because their expiry had passed.
    pub expired: u64,
    /// Wall time of the whole recovery.
    pub elapsed_ms: u64,
}

/// Format version of both file kinds.
/// cbindgen:ignore
pub const FORMAT_VERSION: u32 = 1;
const WAL_MAGIC: &[u8; 8] = b"KALOSWAL";
const SNAP_MAGIC: &[u8; 8] = b"KALOSSNP";
/// File header size (both kinds).
/// cbindgen:ignore
pub const HEADER_BYTES: usize = 48;
const REC_HEADER: usize = 8;
const OP_UPSERT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_DELETE_NS: u8 = 3;
const OP_CLEAR: u8 = 4;
const NO_PAYLOAD: u32 = u32::MAX;
/// Smallest body: seq u64 + op u8.
const MIN_BODY: usize = 9;
/// Rows per snapshot block (blocks are checksummed one by one so a damaged block is located).
const SNAP_BLOCK_BYTES: usize = 4 << 20;
/// Default smallest log (bytes) before compaction is considered; `KALOS_COMPACT_MIN_BYTES`
/// overrides it (tests use a small value to exercise compaction).
/// cbindgen:ignore
pub const DEFAULT_COMPACT_MIN_BYTES: u64 = 64 << 20;

// ---------------------------------------------------------------------------------------------
// CRC-32C
// ---------------------------------------------------------------------------------------------

const CRC_POLY: u32 = 0x82F6_3B78; // reflected Castagnoli

static CRC_TABLES: once_cell::sync::Lazy<[[u32; 256]; 8]> = once_cell::sync::Lazy::new(|| {
    let mut t = [[0u32; 256]; 8];
    for i in 0..256u32 {
        let mut c = i;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ CRC_POLY } else { c >> 1 };
        }
        t[0][i as usize] = c;
    }
    for i in 0..256 {
        for k in 1..8 {
            t[k][i] = (t[k - 1][i] >> 8) ^ t[0][(t[k - 1][i] & 0xff) as usize];
        }
    }
    t
});

fn crc32c_sw(mut crc: u32, mut b: &[u8]) -> u32 {
    let t = &*CRC_TABLES;
    while b.len() >= 8 {
        let lo = u32::from_le_bytes(b[..4].try_into().unwrap()) ^ crc;
        let hi = u32::from_le_bytes(b[4..8].try_into().unwrap());
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][((hi >> 8) & 0xff) as usize]
            ^ t[1][((hi >> 16) & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
        b = &b[8..];
    }
    for &x in b {
        crc = t[0][((crc ^ x as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_hw(crc: u32, b: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = crc as u64;
    let mut chunks = b.chunks_exact(8);
    for ch in &mut chunks {
        c = _mm_crc32_u64(c, u64::from_le_bytes(ch.try_into().unwrap()));
    }
    let mut c = c as u32;
    for &x in chunks.remainder() {
        c = _mm_crc32_u8(c, x);
    }
    c
}

/// Continues a CRC-32C over `b` (start with `crc32c_update(0, ..)`; chaining is allowed).
pub fn crc32c_update(crc: u32, b: &[u8]) -> u32 {
    let c = !crc;
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the feature was detected at run time.
            return !unsafe { crc32c_hw(c, b) };
        }
    }
    !crc32c_sw(c, b)
}

/// CRC-32C (Castagnoli) of `b`.
pub fn crc32c(b: &[u8]) -> u32 {
    crc32c_update(0, b)
}

// ---------------------------------------------------------------------------------------------
// Encoding helpers
// ---------------------------------------------------------------------------------------------

fn corrupt(path: &Path, offset: usize, what: impl std::fmt::Display) -> Error {
    Error::new(Status::Corrupt, format!("{} at offset {offset}: {what}", path.display()))
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(&format!("{what} {}", path.display()), e)
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// File kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Wal,
    Snap,
}

/// The 48-byte header of both file kinds (see docs/FORMATS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileHeader {
    kind: Kind,
    dim: u32,
    metric: u32,
    generation: u64,
    /// WAL: sequence number of its first record. Snapshot: first sequence number NOT included.
    seq: u64,
}

impl FileHeader {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES);
        b.extend_from_slice(if self.kind == Kind::Wal { WAL_MAGIC } else { SNAP_MAGIC });
        put_u32(&mut b, FORMAT_VERSION);
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
    fn decode(path: &Path, b: &[u8], kind: Kind) -> Result<FileHeader> {
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
        if v != FORMAT_VERSION {
            return Err(Error::new(
                Status::VersionMismatch,
                format!("{}: format version {v}; this build reads version {FORMAT_VERSION}", path.display()),
            ));
        }
        Ok(FileHeader { kind, dim: get_u32(b, 12), metric: get_u32(b, 16), generation: get_u64(b, 24), seq: get_u64(b, 32) })
    }
}

/// Appends the columnar encoding of `items` (shared by upsert records and snapshot blocks):
/// `count u32 | ids u64[n] | ns u64[n] | created u64[n] | expires u64[n] | plen u32[n] |
/// vectors f32[n*dim] | payload bytes (concatenated)`.
fn encode_rows(b: &mut Vec<u8>, items: &[UpsertItem<'_>]) {
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
}

/// Decoded rows (owned), convertible to `UpsertItem`s.
struct Rows {
    ids: Vec<u64>,
    ns: Vec<u64>,
    created: Vec<u64>,
    expires: Vec<u64>,
    plen: Vec<u32>,
    vectors: Vec<f32>,
    payloads: Vec<u8>,
}

impl Rows {
    fn items(&self, dim: usize) -> Vec<UpsertItem<'_>> {
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
                }
            })
            .collect()
    }
}

/// Decodes rows; `Err(message)` when the bytes are inconsistent (checksum-valid but malformed
/// bodies only come from bugs or deliberate tampering; they are reported as corruption).
fn decode_rows(b: &[u8], dim: usize) -> std::result::Result<Rows, String> {
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
    if o + ptotal != b.len() {
        return Err(format!("payloads need {ptotal} bytes; {} remain", b.len() - o));
    }
    Ok(Rows { ids, ns, created, expires, plen, vectors, payloads: b[o..].to_vec() })
}

/// Encodes one WAL record (header + body) onto `buf`.
fn encode_record(buf: &mut Vec<u8>, seq: u64, op: &WalOp<'_>) {
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
fn record_at(b: &[u8], o: usize, min_seq: u64) -> Option<(usize, usize)> {
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
struct Scan {
    /// Body ranges of intact records, in order.
    records: Vec<(usize, usize)>,
    /// Offset just after the last intact record.
    end: usize,
    /// Set when the bytes after `end` are damaged: `(offset, intact record found after it?)`.
    damage: Option<(usize, bool)>,
}

/// Scans the records of a log starting at `HEADER_BYTES`, checking checksums and sequence numbers.
fn scan_log(b: &[u8], first_seq: u64) -> Scan {
    let mut o = HEADER_BYTES;
    let mut seq = first_seq;
    let mut records = Vec::new();
    while o < b.len() {
        match record_at(b, o, seq) {
            Some((s, e)) if get_u64(b, s) == seq => {
                records.push((s, e));
                seq += 1;
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

// ---------------------------------------------------------------------------------------------
// Directory layout
// ---------------------------------------------------------------------------------------------

fn snap_name(g: u64) -> String {
    format!("snap-{g:016x}.snap")
}
fn wal_name(g: u64) -> String {
    format!("wal-{g:016x}.wal")
}

struct Listing {
    snaps: Vec<u64>,
    wals: Vec<u64>,
    tmps: Vec<PathBuf>,
}

fn list_dir(dir: &Path) -> Result<Listing> {
    let mut l = Listing { snaps: Vec::new(), wals: Vec::new(), tmps: Vec::new() };
    for e in fs::read_dir(dir).map_err(|e| io_err("read directory", dir, e))? {
        let e = e.map_err(|e| io_err("read directory", dir, e))?;
        let name = e.file_name().to_string_lossy().to_string();
        let gen = |pre: &str, suf: &str| -> Option<u64> {
            let s = name.strip_prefix(pre)?.strip_suffix(suf)?;
            if s.len() == 16 {
                u64::from_str_radix(s, 16).ok()
            } else {
                None
            }
        };
        if name.ends_with(".tmp") {
            l.tmps.push(e.path());
        } else if let Some(g) = gen("snap-", ".snap") {
            l.snaps.push(g);
        } else if let Some(g) = gen("wal-", ".wal") {
            l.wals.push(g);
        }
    }
    l.snaps.sort_unstable();
    l.wals.sort_unstable();
    Ok(l)
}

fn fsync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| io_err("open directory", dir, e))?;
    d.sync_all().map_err(|e| io_err("fsync directory", dir, e))
}

fn map_file(path: &Path) -> Result<(File, Option<memmap2::Mmap>)> {
    let f = OpenOptions::new().read(true).open(path).map_err(|e| io_err("open", path, e))?;
    let len = f.metadata().map_err(|e| io_err("stat", path, e))?.len();
    if len == 0 {
        return Ok((f, None));
    }
    // SAFETY: the directory is locked by us, so nobody else writes the file while it is mapped.
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io_err("mmap", path, e))?;
    Ok((f, Some(m)))
}

/// Takes the directory lock (`D/LOCK`, `flock` exclusive, non-blocking).
fn lock_dir(dir: &Path) -> Result<File> {
    fs::create_dir_all(dir).map_err(|e| io_err("create data directory", dir, e))?;
    let p = dir.join("LOCK");
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).map_err(|e| {
        let st = if e.kind() == std::io::ErrorKind::PermissionDenied { Status::PermissionDenied } else { Status::Io };
        Error::new(st, format!("open {}: {e}", p.display()))
    })?;
    // SAFETY: valid fd owned by `f`.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let holder = fs::read_to_string(&p).unwrap_or_default();
            return Err(Error::new(
                Status::Locked,
                format!("data directory {} is in use by another live server (pid {})", dir.display(), holder.trim()),
            ));
        }
        return Err(io_err("flock", &p, e));
    }
    let _ = f.set_len(0);
    let _ = f.write_all(format!("{}\n", std::process::id()).as_bytes());
    Ok(f)
}

// ---------------------------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------------------------

/// Writes the whole store as snapshot generation `gen` covering sequence numbers `< seq`:
/// temp file, fsync, rename, fsync directory. Returns the snapshot size in bytes.
/// What a snapshot is written from: the live store (synchronous snapshots) or a copy of its
/// columns (background snapshots).
trait SnapSource {
    fn n(&self) -> usize;
    fn dim(&self) -> usize;
    fn metric(&self) -> Metric;
    fn id(&self, r: usize) -> u64;
    fn ns(&self, r: usize) -> u64;
    fn created(&self, r: usize) -> u64;
    fn expires(&self, r: usize) -> u64;
    fn payload(&self, r: usize) -> Option<&[u8]>;
    /// The vector as the caller wrote it.
    fn vector(&self, r: usize) -> Vec<f32>;
}

impl SnapSource for Store {
    fn n(&self) -> usize {
        self.len()
    }
    fn dim(&self) -> usize {
        Store::dim(self)
    }
    fn metric(&self) -> Metric {
        Store::metric(self)
    }
    fn id(&self, r: usize) -> u64 {
        self.ids()[r]
    }
    fn ns(&self, r: usize) -> u64 {
        self.namespaces()[r]
    }
    fn created(&self, r: usize) -> u64 {
        self.created_ms()[r]
    }
    fn expires(&self, r: usize) -> u64 {
        self.expires_ms()[r]
    }
    fn payload(&self, r: usize) -> Option<&[u8]> {
        self.payload_at(r)
    }
    fn vector(&self, r: usize) -> Vec<f32> {
        self.vector_of_row(r)
    }
}

/// A copy of the store's columns, taken by the server thread (a memcpy of the table) so that a
/// background thread can write the snapshot while the server keeps serving.
struct TableCopy {
    dim: usize,
    metric: Metric,
    vectors: Vec<f32>,
    norms: Vec<f32>,
    ids: Vec<u64>,
    ns: Vec<u64>,
    created: Vec<u64>,
    expires: Vec<u64>,
    payloads: Vec<Option<Box<[u8]>>>,
}

impl TableCopy {
    fn of(s: &Store) -> TableCopy {
        TableCopy {
            dim: s.dim(),
            metric: s.metric(),
            vectors: s.vectors().to_vec(),
            norms: s.norms().to_vec(),
            ids: s.ids().to_vec(),
            ns: s.namespaces().to_vec(),
            created: s.created_ms().to_vec(),
            expires: s.expires_ms().to_vec(),
            payloads: (0..s.len()).map(|r| s.payload_at(r).map(Box::from)).collect(),
        }
    }
}

impl SnapSource for TableCopy {
    fn n(&self) -> usize {
        self.ids.len()
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn id(&self, r: usize) -> u64 {
        self.ids[r]
    }
    fn ns(&self, r: usize) -> u64 {
        self.ns[r]
    }
    fn created(&self, r: usize) -> u64 {
        self.created[r]
    }
    fn expires(&self, r: usize) -> u64 {
        self.expires[r]
    }
    fn payload(&self, r: usize) -> Option<&[u8]> {
        self.payloads[r].as_deref()
    }
    fn vector(&self, r: usize) -> Vec<f32> {
        // Exactly what Store::vector_of_row computes.
        let v = &self.vectors[r * self.dim..(r + 1) * self.dim];
        match self.metric {
            Metric::Cosine => v.iter().map(|&x| x * self.norms[r]).collect(),
            _ => v.to_vec(),
        }
    }
}

fn write_snapshot<S: SnapSource>(dir: &Path, gen: u64, seq: u64, store: &S) -> Result<u64> {
    let tmp = dir.join(format!("{}.tmp", snap_name(gen)));
    let fin = dir.join(snap_name(gen));
    let f = File::create(&tmp).map_err(|e| io_err("create", &tmp, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let hdr = FileHeader { kind: Kind::Snap, dim: store.dim() as u32, metric: store.metric() as u32, generation: gen, seq };
    let mut total = 0u64;
    let werr = |e: std::io::Error| io_err("write", &tmp, e);
    w.write_all(&hdr.encode()).map_err(werr)?;
    total += HEADER_BYTES as u64;
    let dim = store.dim();
    let per_row = 8 * 4 + 4 + dim * 4;
    let mut block = Vec::with_capacity(SNAP_BLOCK_BYTES + per_row + 64);
    let mut row = 0usize;
    let n = store.n();
    let mut vecs: Vec<Vec<f32>> = Vec::new();
    loop {
        // One block: as many rows as fit in ~SNAP_BLOCK_BYTES (at least one), then an end block.
        let start = row;
        let mut bytes = 0usize;
        vecs.clear();
        while row < n && (row == start || bytes + per_row + store.payload(row).map_or(0, |p| p.len()) <= SNAP_BLOCK_BYTES) {
            bytes += per_row + store.payload(row).map_or(0, |p| p.len());
            vecs.push(store.vector(row));
            row += 1;
        }
        let items: Vec<UpsertItem<'_>> = (start..row)
            .map(|r| UpsertItem {
                id: store.id(r),
                namespace: store.ns(r),
                vector: &vecs[r - start],
                payload: store.payload(r),
                created_ms: store.created(r),
                expires_ms: store.expires(r),
            })
            .collect();
        block.clear();
        block.extend_from_slice(&[0u8; REC_HEADER]);
        encode_rows(&mut block, &items);
        if items.is_empty() {
            // End block: count 0, then the total row count.
            put_u64(&mut block, n as u64);
        }
        let len = (block.len() - REC_HEADER) as u32;
        block[..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c_update(crc32c(&len.to_le_bytes()), &block[REC_HEADER..]);
        block[4..8].copy_from_slice(&crc.to_le_bytes());
        w.write_all(&block).map_err(werr)?;
        total += block.len() as u64;
        if items.is_empty() {
            break;
        }
    }
    let f = w.into_inner().map_err(|e| io_err("write", &tmp, e.into_error()))?;
    f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, &fin).map_err(|e| io_err("rename", &tmp, e))?;
    fsync_dir(dir)?;
    Ok(total)
}

/// Loads a snapshot into `store`. `salvage` (repair): skip damaged blocks instead of failing and
/// return how many were skipped.
fn load_snapshot(path: &Path, hdr_expect: Option<(u32, u32)>, store: &mut Store, salvage: bool) -> Result<(FileHeader, u64, u64, Vec<String>)> {
    let (_f, m) = map_file(path)?;
    let b: &[u8] = m.as_deref().unwrap_or(&[]);
    let mut notes = Vec::new();
    let hdr = match (FileHeader::decode(path, b, Kind::Snap), hdr_expect) {
        (Ok(h), _) => {
            if let Some((dim, metric)) = hdr_expect {
                check_shape(path, &h, dim, metric)?;
            }
            h
        }
        // Repair: a damaged header does not make the blocks unreadable (the dimension comes from
        // the log); the snapshot's sequence number is then unknown (u64::MAX).
        (Err(e), Some((dim, metric))) if salvage && b.len() >= HEADER_BYTES => {
            notes.push(format!("{}: header unreadable ({e}); its blocks were read with dimension {dim}", path.display()));
            FileHeader { kind: Kind::Snap, dim, metric, generation: u64::MAX, seq: u64::MAX }
        }
        (Err(e), _) => return Err(e),
    };
    let dim = hdr.dim as usize;
    let mut o = HEADER_BYTES;
    let mut rows = 0u64;
    let mut ended = false;
    let mut size = b.len() as u64;
    while o < b.len() {
        let ok = (|| -> std::result::Result<(usize, usize), String> {
            if o + REC_HEADER > b.len() {
                return Err("truncated block header".into());
            }
            let len = get_u32(b, o) as usize;
            if len < 4 || len > b.len() - o - REC_HEADER {
                return Err(format!("block length {len} runs past the end of the file"));
            }
            let body = &b[o + REC_HEADER..o + REC_HEADER + len];
            if crc32c_update(crc32c(&b[o..o + 4]), body) != get_u32(b, o + 4) {
                return Err("block checksum mismatch".into());
            }
            Ok((o + REC_HEADER, o + REC_HEADER + len))
        })();
        match ok {
            Ok((s, e)) => {
                let body = &b[s..e];
                if get_u32(body, 0) == 0 && body.len() == 12 {
                    let total = get_u64(body, 4);
                    if total != rows && !salvage {
                        return Err(corrupt(path, o, format!("end block says {total} rows; the blocks hold {rows}")));
                    }
                    if total != rows {
                        notes.push(format!("{}: {} of {total} rows were in damaged blocks and are lost", path.display(), total - rows));
                    }
                    if e != b.len() {
                        if !salvage {
                            return Err(corrupt(path, e, format!("{} bytes after the end block", b.len() - e)));
                        }
                        notes.push(format!("{}: ignored {} bytes after the end block", path.display(), b.len() - e));
                    }
                    ended = true;
                    size = e as u64;
                    break;
                }
                let r = decode_rows(body, dim).map_err(|m| corrupt(path, o, m))?;
                let items = r.items(dim);
                store.validate_upsert(&items).map_err(|e| Error::new(e.status, format!("{}: loading block at offset {o}: {}", path.display(), e.message)))?;
                store.apply_upsert(&items);
                rows += items.len() as u64;
                o = e;
            }
            Err(m) => {
                if !salvage {
                    return Err(corrupt(path, o, m));
                }
                // Find the next intact block.
                let next = (o + 1..b.len()).find(|&p| {
                    p + REC_HEADER <= b.len() && {
                        let len = get_u32(b, p) as usize;
                        len >= 4 && len <= b.len() - p - REC_HEADER && crc32c_update(crc32c(&b[p..p + 4]), &b[p + REC_HEADER..p + REC_HEADER + len]) == get_u32(b, p + 4)
                    }
                });
                notes.push(format!("{}: damaged block at offset {o} ({m}); skipped {} bytes", path.display(), next.unwrap_or(b.len()) - o));
                match next {
                    Some(p) => o = p,
                    None => break,
                }
            }
        }
    }
    if !ended {
        if !salvage {
            return Err(corrupt(path, b.len(), "snapshot ends without its end block (truncated)"));
        }
        notes.push(format!("{}: no end block; the snapshot was truncated", path.display()));
    }
    Ok((hdr, rows, size, notes))
}

fn check_shape(path: &Path, h: &FileHeader, dim: u32, metric: u32) -> Result<()> {
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

/// Applies one record body to the store.
fn apply_record(path: &Path, off: usize, body: &[u8], dim: usize, store: &mut Store) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// Persist
// ---------------------------------------------------------------------------------------------

struct BgSnap {
    gen: u64,
    seq: u64,
    /// `log_since_snap` when it started (restored if it fails).
    pending_bytes: u64,
    handle: std::thread::JoinHandle<Result<u64>>,
}

pub struct Persist {
    dir: PathBuf,
    _lock: File,
    opts: PersistOptions,
    dim: usize,
    metric: Metric,
    /// Generation of the log being appended to (≥ `snap_gen`).
    gen: u64,
    /// Generation of the newest complete snapshot (0 = none).
    snap_gen: u64,
    /// Log bytes written after the newest complete snapshot (what recovery would replay).
    log_since_snap: u64,
    /// A snapshot being written by a background thread.
    bg: Option<BgSnap>,
    /// After a failed background snapshot, the next attempt waits until then (each attempt
    /// starts a new log generation, so retrying every tick would pile up files).
    retry_at: Option<Instant>,
    wal: File,
    wal_path: PathBuf,
    /// Bytes of the log that are written (committed) — the file length.
    wal_len: u64,
    /// Records appended since the last commit.
    buf: Vec<u8>,
    next_seq: u64,
    /// Sequence number of the first record after the current snapshot.
    snap_seq: u64,
    snap_bytes: u64,
    unsynced: bool,
    last_sync: Instant,
    compact_min: u64,
    /// Set after a failed write or fsync: the log can no longer be trusted to match memory, so
    /// every later write is refused (reads keep working).
    broken: Option<Error>,
}

impl Persist {
    /// Locks `dir`, loads the latest snapshot and replays the log into `store`.
    pub fn open(dir: &Path, dim: usize, metric: Metric, opts: &PersistOptions, store: &mut Store) -> Result<(Persist, Recovery)> {
        let t0 = Instant::now();
        let lock = lock_dir(dir)?;
        let mut rec = Recovery::default();
        let l = list_dir(dir)?;
        for t in &l.tmps {
            // An interrupted snapshot write: never renamed, so never part of the state.
            let _ = fs::remove_file(t);
        }
        let gen = l.snaps.last().copied().unwrap_or(0);
        rec.generation = gen;
        // No snapshot and no wal-0 but a later log: that log's snapshot is gone. (No snapshot
        // WITH wal-0 is the state of a crash during the first background snapshot: the chain
        // wal-0, wal-1, ... replays below.)
        if l.snaps.is_empty() && !l.wals.contains(&0) {
            if let Some(&g) = l.wals.iter().find(|&&g| g > 0) {
                return Err(Error::new(
                    Status::Corrupt,
                    format!("{}: log {} needs snapshot {} which is missing", dir.display(), wal_name(g), snap_name(g)),
                ));
            }
        }
        let (mut snap_seq, mut snap_bytes) = (0u64, 0u64);
        if l.snaps.contains(&gen) {
            let p = dir.join(snap_name(gen));
            let (h, rows, size, _) = load_snapshot(&p, Some((dim as u32, metric as u32)), store, false)?;
            if h.generation != gen {
                return Err(corrupt(&p, 24, format!("header says generation {}, the name says {gen}", h.generation)));
            }
            snap_seq = h.seq;
            snap_bytes = size;
            rec.snapshot_rows = rows;
        }
        // The log chain after the snapshot: wal-<gen>, wal-<gen+1>, ... (a log newer than the
        // newest snapshot exists when a snapshot was still being written at the crash). Each log
        // continues the previous one's sequence numbers.
        let chain: Vec<u64> = l.wals.iter().copied().filter(|&g| g >= gen).collect();
        for (i, &g) in chain.iter().enumerate() {
            if g != gen + i as u64 {
                return Err(Error::new(
                    Status::Corrupt,
                    format!("{}: log {} is missing (the logs after snapshot {gen} have a gap)", dir.display(), wal_name(gen + i as u64)),
                ));
            }
        }
        let mut next_seq = snap_seq;
        let mut last_gen = gen;
        let mut wal_len = 0u64;
        for (i, &g) in chain.iter().enumerate() {
            let last = i + 1 == chain.len();
            let path = dir.join(wal_name(g));
            last_gen = g;
            let (_f, m) = map_file(&path)?;
            let b: &[u8] = m.as_deref().unwrap_or(&[]);
            if b.len() < HEADER_BYTES {
                if !last {
                    return Err(corrupt(&path, 0, format!("log of {} bytes is shorter than its header, and later logs follow it", b.len())));
                }
                // Crash while creating the log (before any record could be written).
                rec.torn_tail = Some(format!("torn log header in {}: {} bytes; rewritten", path.display(), b.len()));
                wal_len = 0;
                break;
            }
            let h = FileHeader::decode(&path, b, Kind::Wal)?;
            check_shape(&path, &h, dim as u32, metric as u32)?;
            if h.generation != g || h.seq != next_seq {
                return Err(corrupt(
                    &path,
                    24,
                    format!("log header (generation {}, first seq {}) does not continue the log chain (generation {g}, seq {next_seq})", h.generation, h.seq),
                ));
            }
            let s = scan_log(b, next_seq);
            if let Some((off, later)) = s.damage {
                if later || !last {
                    return Err(corrupt(
                        &path,
                        off,
                        format!(
                            "damaged log record in the middle of the log ({}); nothing was changed — run `kalosd repair --data-dir {}` to keep the {} intact records before it",
                            if later { "intact records follow it" } else { "later logs follow it" },
                            dir.display(),
                            rec.records_replayed + s.records.len() as u64
                        ),
                    ));
                }
            }
            for &(st, en) in &s.records {
                apply_record(&path, st - REC_HEADER, &b[st..en], dim, store)?;
            }
            rec.records_replayed += s.records.len() as u64;
            next_seq += s.records.len() as u64;
            rec.log_bytes += (s.end - HEADER_BYTES) as u64;
            wal_len = s.end as u64;
            if let Some((off, _)) = s.damage {
                rec.torn_tail = Some(format!(
                    "torn tail in {}: truncated at offset {off}, dropped {} bytes (an incomplete last record; {} intact records kept)",
                    path.display(),
                    b.len() - off,
                    s.records.len()
                ));
            }
        }
        let wal_path = dir.join(wal_name(last_gen));
        let hdr = FileHeader { kind: Kind::Wal, dim: dim as u32, metric: metric as u32, generation: last_gen, seq: next_seq };
        let mut wal = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&wal_path).map_err(|e| io_err("open", &wal_path, e))?;
        if wal_len < HEADER_BYTES as u64 {
            wal.set_len(0).map_err(|e| io_err("truncate", &wal_path, e))?;
            wal.write_all(&hdr.encode()).map_err(|e| io_err("write", &wal_path, e))?;
            wal_len = HEADER_BYTES as u64;
            wal.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
            fsync_dir(dir)?;
        } else if rec.torn_tail.is_some() {
            wal.set_len(wal_len).map_err(|e| io_err("truncate", &wal_path, e))?;
            wal.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
        }
        use std::io::Seek;
        wal.seek(std::io::SeekFrom::Start(wal_len)).map_err(|e| io_err("seek", &wal_path, e))?;
        // Older generations are fully contained in the snapshot: finish an interrupted cleanup.
        for &g in l.snaps.iter().filter(|&&g| g < gen) {
            let _ = fs::remove_file(dir.join(snap_name(g)));
        }
        for &g in l.wals.iter().filter(|&&g| g < gen) {
            let _ = fs::remove_file(dir.join(wal_name(g)));
        }
        rec.expired = store.purge_expired(now_unix_ms()).len() as u64;
        store.take_dirty();
        let compact_min = std::env::var("KALOS_COMPACT_MIN_BYTES").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_COMPACT_MIN_BYTES);
        rec.elapsed_ms = t0.elapsed().as_millis() as u64;
        let p = Persist {
            dir: dir.to_path_buf(),
            _lock: lock,
            opts: opts.clone(),
            dim,
            metric,
            gen: last_gen,
            snap_gen: gen,
            log_since_snap: rec.log_bytes,
            bg: None,
            retry_at: None,
            wal,
            wal_path,
            wal_len,
            buf: Vec::new(),
            next_seq,
            snap_seq,
            snap_bytes,
            unsynced: false,
            last_sync: Instant::now(),
            compact_min,
            broken: None,
        };
        Ok((p, rec))
    }

    /// Appends one record (buffered until `commit`).
    pub fn append(&mut self, op: &WalOp<'_>) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(Error::new(e.status, format!("the write-ahead log failed earlier; writes are refused until restart: {}", e.message)));
        }
        encode_record(&mut self.buf, self.next_seq, op);
        self.next_seq += 1;
        Ok(())
    }

    /// Makes every appended record durable according to the sync policy (group commit).
    pub fn commit(&mut self) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if !self.buf.is_empty() {
            if let Err(e) = self.wal.write_all(&self.buf) {
                return Err(self.fail(io_err("write", &self.wal_path.clone(), e)));
            }
            self.wal_len += self.buf.len() as u64;
            self.log_since_snap += self.buf.len() as u64;
            self.buf.clear();
            self.unsynced = true;
        }
        if self.unsynced {
            let due = match self.opts.sync {
                SyncPolicy::Always => true,
                SyncPolicy::Interval => self.last_sync.elapsed() >= Duration::from_millis(self.opts.sync_interval_ms),
                SyncPolicy::Never => false,
            };
            if due {
                self.sync()?;
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        if let Err(e) = self.wal.sync_data() {
            // After a failed fsync the page cache state is unknown (the kernel may have dropped
            // the dirty pages): stop accepting writes rather than acknowledge on a lie.
            return Err(self.fail(io_err("fsync", &self.wal_path.clone(), e)));
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Error {
        // Best effort: cut any partial record so a restart sees a clean tail.
        let _ = self.wal.set_len(self.wal_len);
        self.buf.clear();
        self.broken = Some(e.clone());
        e
    }

    /// Periodic work when idle: interval fsync, snapshot + log compaction when the log is large.
    ///
    /// Compaction runs when the log written since the newest snapshot is at least
    /// `KALOS_COMPACT_MIN_BYTES` (64 MiB) and at least the snapshot's size. The server thread only
    /// copies the table (a memcpy) and starts a new log; a background thread writes the snapshot,
    /// and a later tick deletes the generations it replaces.
    pub fn tick(&mut self, store: &Store) -> Result<()> {
        if self.broken.is_some() {
            return Ok(());
        }
        self.commit()?;
        if self.unsynced && self.opts.sync == SyncPolicy::Interval {
            self.sync()?;
        }
        self.poll_bg(false);
        let may_retry = self.retry_at.map_or(true, |t| Instant::now() >= t);
        if self.bg.is_none() && may_retry && self.log_since_snap >= self.compact_min && self.log_since_snap >= self.snap_bytes {
            self.start_snapshot(store)?;
        }
        Ok(())
    }

    /// Starts a background snapshot of `store` (which must reflect every appended record): a new
    /// log generation starts now, the table is copied, and a thread writes and renames the
    /// snapshot. Waits for a previous background snapshot first. A later `tick` (or `snapshot`,
    /// or drop) collects it and deletes the generations it replaces.
    pub fn start_snapshot(&mut self, store: &Store) -> Result<()> {
        self.poll_bg(true);
        let g = self.switch_log()?;
        let copy = TableCopy::of(store);
        let (dir, seq) = (self.dir.clone(), self.next_seq);
        let handle = std::thread::Builder::new()
            .name("kalos-snapshot".into())
            .spawn(move || write_snapshot(&dir, g, seq, &copy))
            .map_err(|e| Error::io("spawn snapshot thread", e))?;
        self.bg = Some(BgSnap { gen: g, seq, pending_bytes: self.log_since_snap, handle });
        self.log_since_snap = 0;
        Ok(())
    }

    /// True while a background snapshot runs (for tests and tools).
    pub fn snapshot_in_progress(&self) -> bool {
        self.bg.as_ref().is_some_and(|b| !b.handle.is_finished())
    }

    /// Writes a snapshot of `store` (which must reflect every appended record) synchronously, and
    /// deletes the generations it replaces. Crash-safe at every step (docs/DURABILITY.md).
    pub fn snapshot(&mut self, store: &Store) -> Result<()> {
        self.poll_bg(true);
        let g = self.switch_log()?;
        let pending = self.log_since_snap;
        self.log_since_snap = 0;
        match write_snapshot(&self.dir, g, self.next_seq, store) {
            Ok(size) => {
                self.finish_snapshot(g, self.next_seq, size);
                Ok(())
            }
            Err(e) => {
                self.log_since_snap += pending;
                let _ = fs::remove_file(self.dir.join(format!("{}.tmp", snap_name(g))));
                Err(e)
            }
        }
    }

    /// Starts log generation `gen + 1` (continuing the sequence numbers) and appends there from
    /// now on. The current log is committed and fsynced first, whatever the policy, so that only
    /// the last log of a chain can ever end in a torn record.
    fn switch_log(&mut self) -> Result<u64> {
        self.commit()?;
        if self.unsynced {
            self.sync()?;
        }
        let g = self.gen + 1;
        let path = self.dir.join(wal_name(g));
        let hdr = FileHeader { kind: Kind::Wal, dim: self.dim as u32, metric: self.metric as u32, generation: g, seq: self.next_seq };
        let mut wal = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).map_err(|e| io_err("create", &path, e))?;
        wal.write_all(&hdr.encode()).map_err(|e| io_err("write", &path, e))?;
        wal.sync_all().map_err(|e| io_err("fsync", &path, e))?;
        fsync_dir(&self.dir)?;
        self.wal = wal;
        self.wal_path = path;
        self.wal_len = HEADER_BYTES as u64;
        self.gen = g;
        Ok(g)
    }

    /// Collects a finished background snapshot (or waits for it when `wait`).
    fn poll_bg(&mut self, wait: bool) {
        match &self.bg {
            Some(b) if wait || b.handle.is_finished() => {}
            _ => return,
        }
        let b = self.bg.take().expect("checked");
        let r = b.handle.join().unwrap_or_else(|_| Err(Error::new(Status::Panic, "the snapshot thread panicked")));
        match r {
            Ok(size) => self.finish_snapshot(b.gen, b.seq, size),
            Err(e) => {
                // The log chain still holds everything; the next tick retries.
                eprintln!("kalos: background snapshot {} failed: {e}; the logs are kept and it will be retried in 60 s", snap_name(b.gen));
                self.retry_at = Some(Instant::now() + Duration::from_secs(60));
                let _ = fs::remove_file(self.dir.join(format!("{}.tmp", snap_name(b.gen))));
                self.log_since_snap += b.pending_bytes;
            }
        }
    }

    /// Snapshot `g` is complete (renamed and the directory fsynced): drop what it replaces.
    fn finish_snapshot(&mut self, g: u64, seq: u64, size: u64) {
        self.retry_at = None;
        self.snap_gen = g;
        self.snap_seq = seq;
        self.snap_bytes = size;
        if let Ok(l) = list_dir(&self.dir) {
            for &old in l.snaps.iter().filter(|&&x| x < g) {
                let _ = fs::remove_file(self.dir.join(snap_name(old)));
            }
            for &old in l.wals.iter().filter(|&&x| x < g) {
                let _ = fs::remove_file(self.dir.join(wal_name(old)));
            }
        }
        let _ = fsync_dir(&self.dir);
    }

    /// Current generation (for tests and tools).
    pub fn generation(&self) -> u64 {
        self.gen
    }
    /// Bytes in the current log, header included (for tests and tools).
    pub fn log_len(&self) -> u64 {
        self.wal_len
    }
    /// Path of the current log.
    pub fn log_path(&self) -> &Path {
        &self.wal_path
    }
    /// Next sequence number.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    /// Sequence number of the first record after the current snapshot.
    pub fn snapshot_seq(&self) -> u64 {
        self.snap_seq
    }
}

impl Drop for Persist {
    fn drop(&mut self) {
        // A snapshot thread must not outlive the directory lock.
        self.poll_bg(true);
        // A clean stop flushes whatever the policy left unsynced (also under `never`).
        if self.broken.is_none() {
            let _ = self.commit();
            let _ = self.wal.sync_data();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Offline tools: inspect the shape of a directory, repair.
// ---------------------------------------------------------------------------------------------

/// Reads `(dim, metric)` from the newest snapshot or log header in `dir`.
pub fn dir_shape(dir: &Path) -> Result<Option<(usize, Metric)>> {
    if !dir.exists() {
        return Ok(None);
    }
    let l = list_dir(dir)?;
    let mut cands: Vec<(PathBuf, Kind)> = Vec::new();
    for &g in l.snaps.iter().rev() {
        cands.push((dir.join(snap_name(g)), Kind::Snap));
    }
    for &g in l.wals.iter().rev() {
        cands.push((dir.join(wal_name(g)), Kind::Wal));
    }
    for (p, k) in cands {
        let b = match fs::read(&p) {
            Ok(b) => b,
            Err(_) => continue,
        };
        let head = &b[..b.len().min(HEADER_BYTES)];
        if let Ok(h) = FileHeader::decode(&p, head, k) {
            return Ok(Some((h.dim as usize, Metric::from_u32(h.metric)?)));
        }
    }
    Ok(None)
}

/// Counts the intact records (any sequence number) from `from` on, skipping damage.
fn count_records(b: &[u8], from: usize) -> u64 {
    let mut n = 0u64;
    let mut p = from;
    while p + REC_HEADER < b.len() {
        if let Some((_, e)) = record_at(b, p, 0) {
            n += 1;
            p = e;
        } else {
            p += 1;
        }
    }
    n
}

/// What [`repair`] did.
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    pub rows: u64,
    pub snapshot_rows: u64,
    pub records_replayed: u64,
    /// Intact records after the first damage that were NOT applied (kept in the backup).
    pub records_after_damage: u64,
    /// Human-readable findings, one per problem.
    pub notes: Vec<String>,
    /// Where the original files were moved (None when nothing needed repair).
    pub backup: Option<PathBuf>,
}

/// Recovers everything intact from `dir` (which must not be in use): the intact blocks of the
/// newest snapshot, then the log's records up to the first damage (a consistent point in time:
/// later records are not applied because they may depend on the damaged one). The original
/// files are moved to `dir/repair-<unix ms>/` (nothing is deleted), and a fresh snapshot of the
/// recovered state is written as the next generation. When the directory is healthy, repair
/// changes nothing.
pub fn repair(dir: &Path) -> Result<RepairReport> {
    let Some((dim, metric)) = dir_shape(dir)? else {
        return Err(Error::new(Status::NotFound, format!("{} holds no readable snapshot or log header", dir.display())));
    };
    let lock = lock_dir(dir)?;
    let l = list_dir(dir)?;
    let mut store = Store::new(dim, metric, u32::MAX as usize, u32::MAX as usize);
    let mut rep = RepairReport::default();
    let gen = l.snaps.last().copied().unwrap_or(0);
    // Sequence number the log must start at (None: unknown, the snapshot header was damaged).
    let mut seq = Some(0u64);
    let mut damaged = false;
    if l.snaps.contains(&gen) {
        let p = dir.join(snap_name(gen));
        let (h, rows, _, notes) = load_snapshot(&p, Some((dim as u32, metric as u32)), &mut store, true)?;
        seq = if h.seq == u64::MAX { None } else { Some(h.seq) };
        rep.snapshot_rows = rows;
        damaged |= !notes.is_empty();
        rep.notes.extend(notes);
    }
    // The log chain, in order, up to the first damage (a consistent point in time).
    let chain: Vec<u64> = l.wals.iter().copied().filter(|&g| g >= gen).collect();
    let mut stopped = false;
    for (i, &g) in chain.iter().enumerate() {
        let wal_path = dir.join(wal_name(g));
        let b = fs::read(&wal_path).map_err(|e| io_err("read", &wal_path, e))?;
        if !stopped && g != gen + i as u64 {
            damaged = true;
            stopped = true;
            rep.notes.push(format!("{}: log {} is missing; the logs after it are not applied", dir.display(), wal_name(gen + i as u64)));
        }
        if stopped {
            rep.records_after_damage += count_records(&b, HEADER_BYTES);
            continue;
        }
        let first = match FileHeader::decode(&wal_path, &b, Kind::Wal) {
            Ok(h) if seq.map_or(true, |x| x == h.seq) => Some(h.seq),
            Ok(h) => {
                damaged = true;
                rep.notes.push(format!("{}: starts at sequence {} but {} was expected; not applied", wal_path.display(), h.seq, seq.unwrap_or(0)));
                None
            }
            Err(e) => {
                damaged = true;
                rep.notes.push(format!(
                    "log header unreadable ({e}); {}",
                    if seq.is_some() { "its records are read from the expected sequence number" } else { "the log is not applied" }
                ));
                seq
            }
        };
        let Some(first) = first else {
            stopped = true;
            rep.records_after_damage += count_records(&b, HEADER_BYTES);
            continue;
        };
        let s = scan_log(&b, first);
        for &(st, en) in &s.records {
            apply_record(&wal_path, st - REC_HEADER, &b[st..en], dim, &mut store)?;
        }
        rep.records_replayed += s.records.len() as u64;
        seq = Some(first + s.records.len() as u64);
        if let Some((off, later)) = s.damage {
            damaged = true;
            stopped = true;
            // Intact records after the damage are counted, not applied (kept in the backup).
            let n = count_records(&b, off + 1);
            rep.records_after_damage += n;
            rep.notes.push(format!(
                "{}: damage at offset {off} ({}); kept {} records before it, {} intact records after it were not applied; {} bytes not applied",
                wal_path.display(),
                if later { "middle of the log" } else { "torn tail" },
                s.records.len(),
                n,
                b.len() - off
            ));
        }
    }
    rep.rows = store.len() as u64;
    if !damaged {
        rep.notes.push("no damage found; nothing changed".into());
        return Ok(rep);
    }
    // Move every snapshot/log aside, then write the recovered state as a new generation.
    let backup = dir.join(format!("repair-{}", now_unix_ms()));
    fs::create_dir_all(&backup).map_err(|e| io_err("create", &backup, e))?;
    let newest = l.snaps.iter().chain(l.wals.iter()).copied().max().unwrap_or(0);
    for &g in &l.snaps {
        let n = snap_name(g);
        fs::rename(dir.join(&n), backup.join(&n)).map_err(|e| io_err("move", &dir.join(&n), e))?;
    }
    for &g in &l.wals {
        let n = wal_name(g);
        fs::rename(dir.join(&n), backup.join(&n)).map_err(|e| io_err("move", &dir.join(&n), e))?;
    }
    fsync_dir(&backup)?;
    let g = newest + 1;
    let next_seq = seq.unwrap_or(0);
    let wal_path = dir.join(wal_name(g));
    let hdr = FileHeader { kind: Kind::Wal, dim: dim as u32, metric: metric as u32, generation: g, seq: next_seq };
    let mut w = File::create(&wal_path).map_err(|e| io_err("create", &wal_path, e))?;
    w.write_all(&hdr.encode()).map_err(|e| io_err("write", &wal_path, e))?;
    w.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
    write_snapshot(dir, g, next_seq, &store)?;
    rep.backup = Some(backup);
    drop(lock);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_values() {
        // RFC 3720 B.4 and the standard "123456789" check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(!crc32c_sw(!0, &data), crc32c(&data));
        assert_eq!(crc32c_update(crc32c(&data[..333]), &data[333..]), crc32c(&data));
    }

    #[test]
    fn header_roundtrip_and_damage() {
        let h = FileHeader { kind: Kind::Wal, dim: 7, metric: 1, generation: 3, seq: 99 };
        let b = h.encode();
        assert_eq!(FileHeader::decode(Path::new("x"), &b, Kind::Wal).unwrap(), h);
        let mut c = b.clone();
        c[30] ^= 1;
        assert_eq!(FileHeader::decode(Path::new("x"), &c, Kind::Wal).unwrap_err().status, Status::Corrupt);
        assert_eq!(FileHeader::decode(Path::new("x"), &b, Kind::Snap).unwrap_err().status, Status::Corrupt);
    }
}

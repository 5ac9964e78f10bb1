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
//! is truncated. [`repair()`] then recovers the intact prefix and moves the damaged files aside.
//!
//! Checksum: CRC-32C (Castagnoli), from the `crc32c` crate, which uses the SSE4.2 `crc32`
//! instruction when the CPU has it and tables otherwise ([`crc32c()`]). It is what ext4, iSCSI,
//! RocksDB and LevelDB use for the same job; it detects all burst errors up to 32 bits and,
//! unlike zlib's CRC-32, has a hardware instruction on every x86-64 server, so checksumming the
//! log costs nothing next to the fsync.
//!
//! The directory must belong to the process's user and have mode 0700 (or at most
//! `KALOS_DATA_DIR_MODE`); every file in it is opened through one directory descriptor without
//! following links, and created 0600 (`dir`).
//!
//! Code: `record` (file header, row encoding), `wal` (log records: encode, scan, apply),
//! `snapshot` (write, load), `dir` (file names, the directory checks, every file operation,
//! listing, maps, the lock), `recover` ([`Persist::open`]), `repair` ([`dir_shape`],
//! [`repair()`]), `fuzz` (the parsers on bytes in memory, for `tests/fuzz.rs`); this file holds
//! the public types and the running [`Persist`]: append, group commit, compaction.
//!
//! [`Recovery::torn_tail`]: crate::persist::Recovery::torn_tail
//! [`repair()`]: crate::persist::repair()
//! [`crc32c()`]: crate::persist::crc32c()
//! [`Persist::open`]: crate::persist::Persist::open
//! [`dir_shape`]: crate::persist::dir_shape
//! [`Persist`]: crate::persist::Persist

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Status};
use crate::store::{Store, UpsertItem};
use crate::types::{Metric, SyncPolicy};

mod crc;
mod dir;
#[doc(hidden)]
pub mod fuzz;
mod record;
mod recover;
mod repair;
mod snapshot;
mod wal;

pub use crc::{crc32c, crc32c_update};
pub use record::{FORMAT_VERSION, HEADER_BYTES};
pub use repair::{dir_shape, repair, RepairReport};

use dir::{io_err, snap_name, wal_name, DataDir, OpenMode};
use record::{FileHeader, Kind};
use snapshot::{write_snapshot, TableCopy};
use wal::encode_record;

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

/// Default smallest log (bytes) before compaction is considered; `KALOS_COMPACT_MIN_BYTES`
/// overrides it (tests use a small value to exercise compaction).
/// cbindgen:ignore
pub const DEFAULT_COMPACT_MIN_BYTES: u64 = 64 << 20;

/// The cluster checkpoint's file name in the data directory: `"KCK1" | n u32 | applied u64[n] |
/// crc32c u32` (of everything before it), little-endian.
const CHECKPOINT: &str = "cluster-applied";
const CHECKPOINT_MAGIC: &[u8; 4] = b"KCK1";

fn encode_checkpoint(applied: &[u64]) -> Vec<u8> {
    let mut b = CHECKPOINT_MAGIC.to_vec();
    b.extend_from_slice(&(applied.len() as u32).to_le_bytes());
    for a in applied {
        b.extend_from_slice(&a.to_le_bytes());
    }
    let c = crc32c(&b);
    b.extend_from_slice(&c.to_le_bytes());
    b
}

fn decode_checkpoint(b: &[u8]) -> Option<Vec<u64>> {
    let body = b.get(..b.len().checked_sub(4)?)?;
    if body.get(..4)? != CHECKPOINT_MAGIC || crc32c(body).to_le_bytes() != b[body.len()..] {
        return None;
    }
    let n = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?) as usize;
    if body.len() != 8 + 8 * n {
        return None;
    }
    Some((0..n).map(|i| u64::from_le_bytes(body[8 + 8 * i..16 + 8 * i].try_into().unwrap())).collect())
}

struct BgSnap {
    gen: u64,
    seq: u64,
    /// `log_since_snap` when it started (restored if it fails).
    pending_bytes: u64,
    handle: std::thread::JoinHandle<Result<u64>>,
}

/// The durability of one store: the locked data directory, the log being appended to, and
/// compaction. Made by [`Persist::open`] (recovery, in `recover.rs`).
pub struct Persist {
    /// The data directory; shared with the background snapshot thread.
    dir: Arc<DataDir>,
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
    /// Unix time (ms) at which the newest complete snapshot was written; 0 = none.
    snap_unix_ms: u64,
    unsynced: bool,
    last_sync: Instant,
    compact_min: u64,
    /// Set after a failed write or fsync: the log can no longer be trusted to match memory, so
    /// every later write is refused (reads keep working).
    broken: Option<Error>,
}

impl Persist {
    /// Appends one record (buffered until `commit`).
    pub fn append(&mut self, op: &WalOp<'_>) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(Error::new(
                e.status,
                format!("the write-ahead log failed earlier; writes are refused until restart: {}", e.message),
            ));
        }
        encode_record(&mut self.buf, self.next_seq, op);
        self.next_seq = self.next_seq.wrapping_add(1);
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
        let may_retry = self.retry_at.is_none_or(|t| Instant::now() >= t);
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
        let (dir, seq) = (Arc::clone(&self.dir), self.next_seq);
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
        let name = wal_name(g);
        let path = self.dir.join(&name);
        let hdr = FileHeader {
            kind: Kind::Wal,
            version: FORMAT_VERSION,
            dim: self.dim as u32,
            metric: self.metric as u32,
            generation: g,
            seq: self.next_seq,
        };
        let mut wal = self.dir.open_file(&name, OpenMode::Truncate)?;
        wal.write_all(&hdr.encode()).map_err(|e| io_err("write", &path, e))?;
        wal.sync_all().map_err(|e| io_err("fsync", &path, e))?;
        self.dir.fsync()?;
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
                // The log chain still holds everything; the next tick retries. (`write_snapshot`
                // removed its temp file.)
                eprintln!("kalos: background snapshot {} failed: {e}; the logs are kept and it will be retried in 60 s", snap_name(b.gen));
                self.retry_at = Some(Instant::now() + Duration::from_secs(60));
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
        self.snap_unix_ms = crate::types::now_unix_ms();
        if let Ok(l) = self.dir.list() {
            for &old in l.snaps.iter().filter(|&&x| x < g) {
                let _ = self.dir.remove(&snap_name(old));
            }
            for &old in l.wals.iter().filter(|&&x| x < g) {
                let _ = self.dir.remove(&wal_name(old));
            }
        }
        let _ = self.dir.fsync();
    }

    /// Cluster mode: the last log sequence applied per shard, as recorded by
    /// [`Persist::write_checkpoint`] (empty when there is none). A checkpoint is written only
    /// after the writes it covers are committed, so it may lag the table but never lead it.
    pub fn read_checkpoint(&self) -> Result<Vec<u64>> {
        let path = self.dir.join(CHECKPOINT);
        let b = match self.dir.read(CHECKPOINT, 1 << 20) {
            Ok(b) => b,
            Err(_) if !path.exists() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        decode_checkpoint(&b).ok_or_else(|| Error::new(Status::Corrupt, format!("{}: damaged cluster checkpoint", path.display())))
    }

    /// Records `applied` (per shard, the last log sequence whose writes are in the table and
    /// committed) in the data directory: written to a temp file, fsynced and renamed.
    pub fn write_checkpoint(&mut self, applied: &[u64]) -> Result<()> {
        let tmp = format!("{CHECKPOINT}.tmp");
        let mut f = self.dir.open_file(&tmp, OpenMode::Truncate)?;
        let path = self.dir.join(&tmp);
        f.write_all(&encode_checkpoint(applied)).map_err(|e| io_err("write", &path, e))?;
        f.sync_data().map_err(|e| io_err("fsync", &path, e))?;
        self.dir.rename(&tmp, &self.dir, CHECKPOINT)?;
        self.dir.fsync()
    }

    /// Log bytes written since the newest complete snapshot (what recovery would replay).
    pub fn wal_bytes(&self) -> u64 {
        self.log_since_snap
    }
    /// Unix time (ms) of the newest complete snapshot; 0 when there is none.
    pub fn last_snapshot_unix_ms(&self) -> u64 {
        self.snap_unix_ms
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

#[cfg(test)]
mod checkpoint_tests {
    use super::{decode_checkpoint, encode_checkpoint};

    #[test]
    fn checkpoint_round_trips_and_detects_damage() {
        let b = encode_checkpoint(&[3, 0, u64::MAX]);
        assert_eq!(decode_checkpoint(&b), Some(vec![3, 0, u64::MAX]));
        assert_eq!(decode_checkpoint(&encode_checkpoint(&[])), Some(vec![]));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 1;
            assert_eq!(decode_checkpoint(&d), None, "byte {i} flipped");
        }
        assert_eq!(decode_checkpoint(&b[..b.len() - 1]), None);
        assert_eq!(decode_checkpoint(&[]), None);
    }
}

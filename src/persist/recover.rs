//! Recovery: opening a data directory loads the newest snapshot and replays its log chain,
//! truncating a torn tail and refusing damage in the middle of the log (docs/DURABILITY.md).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::dir::{io_err, snap_name, wal_name, DataDir, OpenMode};
use super::record::{check_shape, corrupt, FileHeader, Kind, FORMAT_VERSION, HEADER_BYTES, REC_HEADER};
use super::snapshot::load_snapshot;
use super::wal::{apply_record, scan_log};
use super::{Persist, PersistOptions, Recovery, DEFAULT_COMPACT_MIN_BYTES};
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{now_unix_ms, Metric};

impl Persist {
    /// Opens the data directory `dir_path` (created 0700 when missing; refused when it belongs to
    /// another user or is open to group or others beyond `KALOS_DATA_DIR_MODE`), locks it, loads
    /// the latest snapshot and replays the log into `store`.
    pub fn open(dir_path: &Path, dim: usize, metric: Metric, opts: &PersistOptions, store: &mut Store) -> Result<(Persist, Recovery)> {
        let t0 = Instant::now();
        let dir = DataDir::create(dir_path)?;
        let lock = dir.lock()?;
        let mut rec = Recovery::default();
        let l = dir.list()?;
        for t in &l.tmps {
            // An interrupted snapshot write: never renamed, so never part of the state. (A link
            // is removed itself, never its target.)
            let _ = dir.remove(t);
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
                    format!("{}: log {} needs snapshot {} which is missing", dir.path().display(), wal_name(g), snap_name(g)),
                ));
            }
        }
        let (mut snap_seq, mut snap_bytes, mut snap_unix_ms) = (0u64, 0u64, 0u64);
        if l.snaps.contains(&gen) {
            let p = dir.join(&snap_name(gen));
            // The snapshot's age (metrics) is its file's modification time: it is written once.
            snap_unix_ms = std::fs::symlink_metadata(&p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            let (h, rows, size, _) = load_snapshot(&dir, &snap_name(gen), Some((dim as u32, metric as u32)), store, false)?;
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
                    format!(
                        "{}: log {} is missing (the logs after snapshot {gen} have a gap)",
                        dir.path().display(),
                        wal_name(gen + i as u64)
                    ),
                ));
            }
        }
        let mut next_seq = snap_seq;
        let mut last_gen = gen;
        let mut wal_len = 0u64;
        // The header of the last log read, to bring an older format version up to date.
        let mut last_hdr: Option<FileHeader> = None;
        for (i, &g) in chain.iter().enumerate() {
            let last = i + 1 == chain.len();
            let path = dir.join(&wal_name(g));
            last_gen = g;
            let (_f, m) = dir.map(&wal_name(g))?;
            let b: &[u8] = m.as_deref().unwrap_or(&[]);
            if b.len() < HEADER_BYTES {
                if !last {
                    return Err(corrupt(
                        &path,
                        0,
                        format!("log of {} bytes is shorter than its header, and later logs follow it", b.len()),
                    ));
                }
                // Crash while creating the log (before any record could be written). Its header
                // is written anew below, in this build's version: the header of the log before
                // it is not this log's to bring up to date.
                rec.torn_tail = Some(format!("torn log header in {}: {} bytes; rewritten", path.display(), b.len()));
                wal_len = 0;
                last_hdr = None;
                break;
            }
            let h = FileHeader::decode(&path, b, Kind::Wal)?;
            check_shape(&path, &h, dim as u32, metric as u32)?;
            last_hdr = Some(h);
            if h.generation != g || h.seq != next_seq {
                return Err(corrupt(
                    &path,
                    24,
                    format!(
                        "log header (generation {}, first seq {}) does not continue the log chain (generation {g}, seq {next_seq})",
                        h.generation, h.seq
                    ),
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
                            dir.path().display(),
                            rec.records_replayed + s.records.len() as u64
                        ),
                    ));
                }
            }
            for &(st, en) in &s.records {
                apply_record(&path, st - REC_HEADER, &b[st..en], dim, store)?;
            }
            rec.records_replayed += s.records.len() as u64;
            next_seq = next_seq.wrapping_add(s.records.len() as u64);
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
        let wal_path = dir.join(&wal_name(last_gen));
        let hdr = FileHeader {
            kind: Kind::Wal,
            version: FORMAT_VERSION,
            dim: dim as u32,
            metric: metric as u32,
            generation: last_gen,
            seq: next_seq,
        };
        let mut wal = dir.open_file(&wal_name(last_gen), OpenMode::ReadWrite)?;
        if wal_len < HEADER_BYTES as u64 {
            wal.set_len(0).map_err(|e| io_err("truncate", &wal_path, e))?;
            wal.write_all(&hdr.encode()).map_err(|e| io_err("write", &wal_path, e))?;
            wal_len = HEADER_BYTES as u64;
            wal.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
            dir.fsync()?;
        } else if rec.torn_tail.is_some() {
            wal.set_len(wal_len).map_err(|e| io_err("truncate", &wal_path, e))?;
            wal.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
        }
        if let Some(h) = last_hdr.filter(|h| h.version < FORMAT_VERSION && wal_len >= HEADER_BYTES as u64) {
            // The log continues in this build's format: its header takes the current version
            // (the records of an older version are records of this one without fields, so the
            // file stays readable as a whole; an older build then refuses it by its version).
            use std::os::unix::fs::FileExt;
            let up = FileHeader { version: FORMAT_VERSION, ..h };
            wal.write_all_at(&up.encode(), 0).map_err(|e| io_err("write", &wal_path, e))?;
            wal.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
        }
        use std::io::Seek;
        wal.seek(std::io::SeekFrom::Start(wal_len)).map_err(|e| io_err("seek", &wal_path, e))?;
        // Older generations are fully contained in the snapshot: finish an interrupted cleanup.
        for &g in l.snaps.iter().filter(|&&g| g < gen) {
            let _ = dir.remove(&snap_name(g));
        }
        for &g in l.wals.iter().filter(|&&g| g < gen) {
            let _ = dir.remove(&wal_name(g));
        }
        rec.expired = store.purge_expired(now_unix_ms()).len() as u64;
        store.take_dirty();
        let compact_min = crate::config::tuning_or_default().compact_min_bytes.unwrap_or(DEFAULT_COMPACT_MIN_BYTES);
        rec.elapsed_ms = t0.elapsed().as_millis() as u64;
        let p = Persist {
            dir: Arc::new(dir),
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
            snap_unix_ms,
            unsynced: false,
            last_sync: Instant::now(),
            compact_min,
            broken: None,
        };
        Ok((p, rec))
    }
}

//! Offline tools on a data directory that no server holds: read its shape, repair it.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::dir::{io_err, snap_name, wal_name, DataDir, OpenMode};
use super::record::{FileHeader, Kind, FORMAT_VERSION, HEADER_BYTES, REC_HEADER};
use super::snapshot::{load_snapshot, write_snapshot};
use super::wal::{record_at, salvage_record, scan_log};
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{now_unix_ms, Metric, MAX_DIM};

/// Reads `(dim, metric)` from the newest snapshot or log header in `dir` that is intact and names
/// a dimension from 1 to `MAX_DIM` (`None` when there is no directory or no such header). The
/// directory is checked as [`Persist::open`] checks it.
///
/// [`Persist::open`]: super::Persist::open
pub fn dir_shape(dir: &Path) -> Result<Option<(usize, Metric)>> {
    match DataDir::open_existing(dir)? {
        None => Ok(None),
        Some(d) => shape_of(&d),
    }
}

fn shape_of(dir: &DataDir) -> Result<Option<(usize, Metric)>> {
    let l = dir.list()?;
    let mut cands: Vec<(String, Kind)> = Vec::new();
    for &g in l.snaps.iter().rev() {
        cands.push((snap_name(g), Kind::Snap));
    }
    for &g in l.wals.iter().rev() {
        cands.push((wal_name(g), Kind::Wal));
    }
    for (n, k) in cands {
        let head = match dir.read(&n, HEADER_BYTES as u64) {
            Ok(b) => b,
            Err(_) => continue,
        };
        // A dimension no store can have is not trusted either (it sizes repair's buffers).
        if let Some(h) = FileHeader::decode(&dir.join(&n), &head, k).ok().filter(|h| (1..=MAX_DIM).contains(&(h.dim as usize))) {
            return Ok(Some((h.dim as usize, Metric::from_u32(h.metric)?)));
        }
    }
    Ok(None)
}

/// The header of the file `name` in `dir` when it is intact (None when unreadable).
fn intact_header(dir: &DataDir, name: &str, kind: Kind) -> Option<FileHeader> {
    let b = dir.read(name, HEADER_BYTES as u64).ok()?;
    FileHeader::decode(&dir.join(name), &b, kind).ok()
}

/// Counts the intact records (any sequence number) from `from` on, skipping damage.
pub(super) fn count_records(b: &[u8], from: usize) -> u64 {
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
pub fn repair(dir_path: &Path) -> Result<RepairReport> {
    let no_data = || Error::new(Status::NotFound, format!("{} holds no readable snapshot or log header", dir_path.display()));
    let dir = DataDir::open_existing(dir_path)?.ok_or_else(no_data)?;
    let (dim, metric) = shape_of(&dir)?.ok_or_else(no_data)?;
    let lock = dir.lock()?;
    let l = dir.list()?;
    let mut store = Store::new(dim, metric, u32::MAX as usize, u32::MAX as usize);
    let mut rep = RepairReport::default();
    let gen = l.snaps.last().copied().unwrap_or(0);
    // Sequence number the log must start at (None: unknown, the snapshot header was damaged).
    let mut seq = Some(0u64);
    let mut damaged = false;
    if l.snaps.contains(&gen) {
        let p = dir.join(&snap_name(gen));
        let (_, rows, _, notes) = load_snapshot(&dir, &snap_name(gen), Some((dim as u32, metric as u32)), &mut store, true)?;
        // From the header itself: a damaged one is loaded with a stand-in whose fields (2^64 - 1)
        // an intact header may hold too.
        let intact = intact_header(&dir, &snap_name(gen), Kind::Snap);
        seq = intact.map(|h| h.seq);
        rep.snapshot_rows = rows;
        damaged |= !notes.is_empty();
        rep.notes.extend(notes);
        // An intact header naming another generation (recovery refuses it): its blocks are kept.
        if let Some(hg) = intact.map(|h| h.generation).filter(|&hg| hg != gen) {
            damaged = true;
            rep.notes.push(format!("{}: header says generation {hg}, the name says {gen}; its rows are kept", p.display()));
        }
    }
    // The log chain, in order, up to the first damage (a consistent point in time).
    let chain: Vec<u64> = l.wals.iter().copied().filter(|&g| g >= gen).collect();
    let mut stopped = false;
    for (i, &g) in chain.iter().enumerate() {
        let wal_path = dir.join(&wal_name(g));
        let b = dir.read(&wal_name(g), u64::MAX)?;
        if !stopped && g != gen + i as u64 {
            damaged = true;
            stopped = true;
            rep.notes.push(format!(
                "{}: log {} is missing; the logs after it are not applied",
                dir.path().display(),
                wal_name(gen + i as u64)
            ));
        }
        if stopped {
            rep.records_after_damage += count_records(&b, HEADER_BYTES);
            continue;
        }
        let first = match FileHeader::decode(&wal_path, &b, Kind::Wal) {
            Ok(h) if seq.is_none_or(|x| x == h.seq) => {
                // An intact header naming another generation (recovery refuses it): its records
                // continue the sequence, so they are applied.
                if h.generation != g {
                    damaged = true;
                    rep.notes.push(format!(
                        "{}: header says generation {}, the name says {g}; its records are applied",
                        wal_path.display(),
                        h.generation
                    ));
                }
                Some(h.seq)
            }
            Ok(h) => {
                damaged = true;
                rep.notes.push(format!(
                    "{}: starts at sequence {} but {} was expected; not applied",
                    wal_path.display(),
                    h.seq,
                    seq.unwrap_or(0)
                ));
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
            let left_out = salvage_record(&wal_path, st - REC_HEADER, &b[st..en], dim, &mut store)?;
            damaged |= !left_out.is_empty();
            rep.notes.extend(left_out);
        }
        rep.records_replayed += s.records.len() as u64;
        seq = Some(first.wrapping_add(s.records.len() as u64));
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
    let backup = dir.create_subdir(&format!("repair-{}", now_unix_ms()))?;
    let newest = l.snaps.iter().chain(l.wals.iter()).copied().max().unwrap_or(0);
    for n in l.snaps.iter().map(|&g| snap_name(g)).chain(l.wals.iter().map(|&g| wal_name(g))) {
        dir.rename(&n, &backup, &n)?;
    }
    backup.fsync()?;
    let g = newest + 1;
    let next_seq = seq.unwrap_or(0);
    let wal_path = dir.join(&wal_name(g));
    let hdr = FileHeader { kind: Kind::Wal, version: FORMAT_VERSION, dim: dim as u32, metric: metric as u32, generation: g, seq: next_seq };
    let mut w = dir.open_file(&wal_name(g), OpenMode::Truncate)?;
    w.write_all(&hdr.encode()).map_err(|e| io_err("write", &wal_path, e))?;
    w.sync_all().map_err(|e| io_err("fsync", &wal_path, e))?;
    write_snapshot(&dir, g, next_seq, &store)?;
    rep.backup = Some(backup.path().to_path_buf());
    drop(lock);
    Ok(rep)
}

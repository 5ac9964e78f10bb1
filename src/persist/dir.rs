//! The data directory: file names, listing, directory fsync, read-only maps, and the lock.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Status};

/// An I/O error naming what was done and the path.
pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(&format!("{what} {}", path.display()), e)
}

/// File name of snapshot generation `g`.
pub(super) fn snap_name(g: u64) -> String {
    format!("snap-{g:016x}.snap")
}
/// File name of log generation `g`.
pub(super) fn wal_name(g: u64) -> String {
    format!("wal-{g:016x}.wal")
}

/// The snapshot and log generations in a directory (ascending), and its leftover temp files.
pub(super) struct Listing {
    pub(super) snaps: Vec<u64>,
    pub(super) wals: Vec<u64>,
    pub(super) tmps: Vec<PathBuf>,
}

pub(super) fn list_dir(dir: &Path) -> Result<Listing> {
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

pub(super) fn fsync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| io_err("open directory", dir, e))?;
    d.sync_all().map_err(|e| io_err("fsync directory", dir, e))
}

/// Opens `path` read-only and maps it (`None` for an empty file, which cannot be mapped). The
/// caller must hold the directory lock.
pub(super) fn map_file(path: &Path) -> Result<(File, Option<memmap2::Mmap>)> {
    let f = OpenOptions::new().read(true).open(path).map_err(|e| io_err("open", path, e))?;
    let len = f.metadata().map_err(|e| io_err("stat", path, e))?.len();
    if len == 0 {
        return Ok((f, None));
    }
    // SAFETY: a file mapping is sound only while nothing modifies or truncates the file. The
    // caller holds the directory lock, so no other Kalos process writes in this directory, and
    // within this process the callers (`load_snapshot`, `Persist::open`) drop the map before any
    // file of the directory is written.
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io_err("mmap", path, e))?;
    Ok((f, Some(m)))
}

/// Takes the directory lock (`D/LOCK`, `flock` exclusive, non-blocking).
pub(super) fn lock_dir(dir: &Path) -> Result<File> {
    fs::create_dir_all(dir).map_err(|e| io_err("create data directory", dir, e))?;
    let p = dir.join("LOCK");
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).map_err(|e| {
        let st = if e.kind() == std::io::ErrorKind::PermissionDenied { Status::PermissionDenied } else { Status::Io };
        Error::new(st, format!("open {}: {e}", p.display()))
    })?;
    // SAFETY: `flock` only reads its two integer arguments; the fd is valid because `f` owns it
    // and lives across the call.
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

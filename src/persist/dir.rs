//! The data directory: file names, the directory checks (owner and mode), every file operation
//! inside it (relative to one directory descriptor, never following a link), listing,
//! read-only maps, and the lock.
//!
//! The directory is opened once ([`DataDir::create`], [`DataDir::open_existing`]) and checked
//! on that descriptor: it must belong to the user the process runs as and have no permission
//! bits beyond 0700 (or beyond `KALOS_DATA_DIR_MODE`). Every file in it is then reached with
//! `openat`/`renameat`/`unlinkat`/`fstatat` on that descriptor, with `O_NOFOLLOW | O_CLOEXEC`,
//! so what was checked is what is used, and a symbolic link (or any entry that is not a regular
//! file) placed at one of its names is refused instead of followed. Files are created 0600,
//! temporaries with `O_EXCL`.

use std::ffi::{CStr, CString};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Status};

/// Mode of the data directory (and of directories made inside it) when Kalos creates it.
const DIR_MODE: u32 = 0o700;
/// Mode of every file Kalos creates in the data directory.
const FILE_MODE: u32 = 0o600;

/// An I/O error naming what was done and the path.
pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(&format!("{what} {}", path.display()), e)
}

/// [`io_err`] for an open: one that the permissions forbid is `PermissionDenied`.
fn open_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => Error::new(Status::PermissionDenied, format!("{what} {}: {e}", path.display())),
        _ => io_err(what, path, e),
    }
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
    /// Names of the `*.tmp` entries.
    pub(super) tmps: Vec<String>,
}

/// How [`DataDir::open_file`] opens a file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; created (0600) when missing, kept as it is otherwise.
    ReadWrite,
    /// Read and write; created (0600) when missing, truncated otherwise.
    Truncate,
    /// Write only; created (0600) with `O_EXCL`: fails when the name exists in any form.
    CreateNew,
}

/// A checked, open data directory (or a directory made inside one): every operation on its
/// files goes through its descriptor. `path` is used for messages only.
pub(super) struct DataDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cname(name: &str) -> CString {
    // Names are the fixed file names of this module and names read from the directory itself.
    CString::new(name).expect("a directory entry name holds no NUL byte")
}

fn symlink_refused(path: &Path) -> Error {
    Error::new(
        Status::PermissionDenied,
        format!("{} is a symbolic link; Kalos never follows links inside its data directory (remove it)", path.display()),
    )
}

fn not_regular(path: &Path) -> Error {
    Error::new(Status::PermissionDenied, format!("{} is not a regular file; Kalos refuses it (remove it)", path.display()))
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fstat` writes only into `st`, which is valid for writes; an invalid fd is reported
    // as EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn is_type(st: &libc::stat, t: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == t
}

/// The permission bits the data directory may have: 0700, or `KALOS_DATA_DIR_MODE`.
fn allowed_mode() -> Result<u32> {
    Ok(crate::config::tuning()?.data_dir_mode.unwrap_or(DIR_MODE))
}

/// Refuses a directory that does not belong to `euid` or has permission bits outside `allowed`.
fn check_dir(path: &Path, uid: u32, mode: u32, euid: u32, allowed: u32) -> Result<()> {
    if uid != euid {
        return Err(Error::new(
            Status::PermissionDenied,
            format!(
                "data directory {} is owned by uid {uid}; it must be owned by uid {euid}, the user this process runs as (use a directory of that user)",
                path.display()
            ),
        ));
    }
    if mode & 0o777 & !allowed != 0 {
        let limit = if allowed == DIR_MODE {
            "it must be 0700 (no permission for group or others; KALOS_DATA_DIR_MODE can allow group or other read access)".to_string()
        } else {
            format!("KALOS_DATA_DIR_MODE={allowed:04o} allows at most {allowed:04o} (0700 without it)")
        };
        return Err(Error::new(
            Status::PermissionDenied,
            format!("data directory {} has mode {:04o}; {limit}: run `chmod 0700 {}`", path.display(), mode & 0o7777, path.display()),
        ));
    }
    Ok(())
}

impl DataDir {
    /// Opens the data directory `path`, creating it (mode 0700) and its parents when missing,
    /// and checks its owner and mode.
    pub(super) fn create(path: &Path) -> Result<DataDir> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| io_err("create data directory", parent, e))?;
        }
        let created = match fs::DirBuilder::new().mode(DIR_MODE).create(path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io_err("create data directory", path, e)),
        };
        let dd = DataDir::open_fd(path)?.ok_or_else(|| Error::new(Status::Io, format!("data directory {} vanished", path.display())))?;
        if created {
            // The umask may have taken bits from 0700; a new data directory is exactly 0700.
            // SAFETY: `fchmod` only reads its arguments; the fd is owned by `dd`.
            if unsafe { libc::fchmod(dd.fd.as_raw_fd(), DIR_MODE as libc::mode_t) } != 0 {
                return Err(io_err("chmod", path, std::io::Error::last_os_error()));
            }
        }
        dd.check()?;
        Ok(dd)
    }

    /// Opens the existing data directory `path` and checks its owner and mode; `None` when there
    /// is nothing at `path`.
    pub(super) fn open_existing(path: &Path) -> Result<Option<DataDir>> {
        match DataDir::open_fd(path)? {
            None => Ok(None),
            Some(dd) => {
                dd.check()?;
                Ok(Some(dd))
            }
        }
    }

    /// Opens `path` as a directory (following a link in the path itself: the checks run on what
    /// was opened); `None` when it does not exist.
    fn open_fd(path: &Path) -> Result<Option<DataDir>> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::new(Status::InvalidArgument, format!("data directory {} holds a NUL byte", path.display())))?;
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::NotFound {
                return Ok(None);
            }
            return Err(open_err("open data directory", path, e));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Some(DataDir { fd, path: path.to_path_buf() }))
    }

    /// Checks the owner and mode of the opened directory.
    fn check(&self) -> Result<()> {
        let st = fstat(self.fd.as_raw_fd()).map_err(|e| io_err("stat", &self.path, e))?;
        // SAFETY: `geteuid` has no arguments and cannot fail.
        let euid = unsafe { libc::geteuid() };
        check_dir(&self.path, st.st_uid, st.st_mode, euid, allowed_mode()?)
    }

    /// The directory's path (for messages).
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory (for messages).
    pub(super) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Opens the regular file `name`; a symbolic link or any other kind of entry there is
    /// refused. Files are created 0600.
    pub(super) fn open_file(&self, name: &str, how: OpenMode) -> Result<File> {
        let path = self.join(name);
        let flags = match how {
            OpenMode::Read => libc::O_RDONLY,
            OpenMode::ReadWrite => libc::O_RDWR | libc::O_CREAT,
            OpenMode::Truncate => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            OpenMode::CreateNew => libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        };
        // O_NONBLOCK: a FIFO placed at the name must not block the open; it is refused below.
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        let c = cname(name);
        // SAFETY: `c` is a NUL-terminated string that outlives the call; the directory fd is
        // owned by `self`; the mode argument is read only with O_CREAT.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, FILE_MODE as libc::c_uint) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ELOOP) => symlink_refused(&path),
                // A directory (opened for writing) or a socket at the name.
                Some(libc::EISDIR | libc::ENXIO) => not_regular(&path),
                Some(libc::EEXIST) if how == OpenMode::CreateNew => match self.lstat(name) {
                    Ok(Some(st)) if is_type(&st, libc::S_IFLNK) => symlink_refused(&path),
                    Ok(Some(st)) if !is_type(&st, libc::S_IFREG) => not_regular(&path),
                    _ => Error::new(Status::Io, format!("create {}: it already exists", path.display())),
                },
                _ => open_err(if matches!(how, OpenMode::Read | OpenMode::ReadWrite) { "open" } else { "create" }, &path, e),
            });
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let st = fstat(f.as_raw_fd()).map_err(|e| io_err("stat", &path, e))?;
        if !is_type(&st, libc::S_IFREG) {
            return Err(not_regular(&path));
        }
        // SAFETY: `fcntl` with F_GETFL/F_SETFL only reads its integer arguments; `f` owns the fd.
        let cleared = unsafe {
            let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
            fl >= 0 && libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) == 0
        };
        if !cleared {
            return Err(io_err("fcntl", &path, std::io::Error::last_os_error()));
        }
        Ok(f)
    }

    /// `fstatat` of `name` without following a link; `None` when there is no such entry.
    fn lstat(&self, name: &str) -> std::io::Result<Option<libc::stat>> {
        let c = cname(name);
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is NUL-terminated and `st` valid for writes, both for the whole call; the
        // directory fd is owned by `self`.
        if unsafe { libc::fstatat(self.fd.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::NotFound { Ok(None) } else { Err(e) };
        }
        Ok(Some(st))
    }

    /// Reads up to `limit` bytes of the regular file `name`.
    pub(super) fn read(&self, name: &str, limit: u64) -> Result<Vec<u8>> {
        let mut b = Vec::new();
        self.open_file(name, OpenMode::Read)?.take(limit).read_to_end(&mut b).map_err(|e| io_err("read", &self.join(name), e))?;
        Ok(b)
    }

    /// Removes the entry `name` (a link is removed itself, never its target).
    pub(super) fn remove(&self, name: &str) -> Result<()> {
        let c = cname(name);
        // SAFETY: `c` is NUL-terminated and outlives the call; the directory fd is owned by `self`.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(io_err("remove", &self.join(name), std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Renames `from` to `to` in directory `dst` (this one or one made inside it). An entry at
    /// `to` that is a link or not a regular file is refused rather than replaced.
    pub(super) fn rename(&self, from: &str, dst: &DataDir, to: &str) -> Result<()> {
        let target = dst.join(to);
        match dst.lstat(to) {
            Ok(None) => {}
            Ok(Some(st)) if is_type(&st, libc::S_IFLNK) => return Err(symlink_refused(&target)),
            Ok(Some(st)) if !is_type(&st, libc::S_IFREG) => return Err(not_regular(&target)),
            Ok(Some(_)) => {}
            Err(e) => return Err(io_err("stat", &target, e)),
        }
        let (cf, ct) = (cname(from), cname(to));
        // SAFETY: both names are NUL-terminated and outlive the call; both directory fds are
        // owned by `self` and `dst`.
        if unsafe { libc::renameat(self.fd.as_raw_fd(), cf.as_ptr(), dst.fd.as_raw_fd(), ct.as_ptr()) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(io_err("rename", &self.join(from), e));
        }
        Ok(())
    }

    /// Makes the directory's entries durable (after a create, rename or remove).
    pub(super) fn fsync(&self) -> Result<()> {
        // SAFETY: `fsync` only reads its argument; the fd is owned by `self`.
        if unsafe { libc::fsync(self.fd.as_raw_fd()) } != 0 {
            return Err(io_err("fsync directory", &self.path, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Creates (mode 0700) or opens the directory `name` inside this one; a link there is refused.
    pub(super) fn create_subdir(&self, name: &str) -> Result<DataDir> {
        let path = self.join(name);
        let c = cname(name);
        // SAFETY: `c` is NUL-terminated and outlives the call; the directory fd is owned by `self`.
        let made = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), DIR_MODE as libc::mode_t) } == 0;
        if !made {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(io_err("create", &path, e));
            }
        }
        // SAFETY: as above; O_NOFOLLOW refuses a link at `name`.
        let fd = unsafe {
            libc::openat(self.fd.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::ELOOP) { symlink_refused(&path) } else { io_err("open", &path, e) });
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let d = DataDir { fd: unsafe { OwnedFd::from_raw_fd(fd) }, path };
        if made {
            // SAFETY: `fchmod` only reads its arguments; the fd is owned by `d`.
            if unsafe { libc::fchmod(d.fd.as_raw_fd(), DIR_MODE as libc::mode_t) } != 0 {
                return Err(io_err("chmod", &d.path, std::io::Error::last_os_error()));
            }
        }
        Ok(d)
    }

    /// Every entry name of the directory, `.` and `..` excepted.
    fn names(&self) -> Result<Vec<String>> {
        let err = |e: std::io::Error| io_err("read directory", &self.path, e);
        // A descriptor of its own (not a dup), so the listing has its own position.
        // SAFETY: the name is a NUL-terminated literal; the directory fd is owned by `self`.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c".".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a directory fd that nothing else owns; on success the stream owns it.
        let d = unsafe { libc::fdopendir(fd) };
        if d.is_null() {
            let e = std::io::Error::last_os_error();
            // SAFETY: `fdopendir` failed, so `fd` is still ours to close.
            unsafe { libc::close(fd) };
            return Err(err(e));
        }
        let mut names = Vec::new();
        let result = loop {
            // SAFETY: `__errno_location` returns this thread's errno; readdir reports an error
            // only through errno, so it is cleared first.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `d` is an open directory stream used by this thread only.
            let ent = unsafe { libc::readdir(d) };
            if ent.is_null() {
                let e = std::io::Error::last_os_error();
                break if e.raw_os_error().unwrap_or(0) == 0 { Ok(()) } else { Err(err(e)) };
            }
            // SAFETY: `ent` points to a valid entry until the next readdir on `d`; `d_name` is
            // NUL-terminated. The name is copied before that.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        };
        // SAFETY: `d` is open and not used after this; closing it closes `fd`.
        unsafe { libc::closedir(d) };
        result.map(|()| names)
    }

    /// The snapshot and log generations and the temp files in the directory.
    pub(super) fn list(&self) -> Result<Listing> {
        let mut l = Listing { snaps: Vec::new(), wals: Vec::new(), tmps: Vec::new() };
        for name in self.names()? {
            let gen = |pre: &str, suf: &str| -> Option<u64> {
                let s = name.strip_prefix(pre)?.strip_suffix(suf)?;
                if s.len() == 16 {
                    u64::from_str_radix(s, 16).ok()
                } else {
                    None
                }
            };
            if name.ends_with(".tmp") {
                l.tmps.push(name);
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

    /// Opens the regular file `name` read-only and maps it (`None` for an empty file, which
    /// cannot be mapped). The caller must hold the directory lock.
    pub(super) fn map(&self, name: &str) -> Result<(File, Option<memmap2::Mmap>)> {
        let path = self.join(name);
        let f = self.open_file(name, OpenMode::Read)?;
        let len = f.metadata().map_err(|e| io_err("stat", &path, e))?.len();
        if len == 0 {
            return Ok((f, None));
        }
        // SAFETY: a file mapping is sound only while nothing modifies or truncates the file. The
        // caller holds the directory lock, so no other Kalos process writes in this directory,
        // and within this process the callers (`load_snapshot`, `Persist::open`) drop the map
        // before any file of the directory is written.
        let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io_err("mmap", &path, e))?;
        Ok((f, Some(m)))
    }

    /// Takes the directory lock (`LOCK`, `flock` exclusive, non-blocking) and writes this
    /// process's pid into it.
    pub(super) fn lock(&self) -> Result<File> {
        let p = self.join("LOCK");
        let mut f = self.open_file("LOCK", OpenMode::ReadWrite)?;
        // SAFETY: `flock` only reads its two integer arguments; the fd is valid because `f` owns
        // it and lives across the call.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = f.read_to_string(&mut holder);
                return Err(Error::new(
                    Status::Locked,
                    format!("data directory {} is in use by another live server (pid {})", self.path.display(), holder.trim()),
                ));
            }
            return Err(io_err("flock", &p, e));
        }
        let _ = f.set_len(0);
        let _ = f.write_all(format!("{}\n", std::process::id()).as_bytes());
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_dir_refuses_other_owners_and_extra_mode_bits() {
        let p = Path::new("/srv/kalos");
        assert!(check_dir(p, 1000, libc::S_IFDIR | 0o700, 1000, 0o700).is_ok());
        // Bits above the permission bits (setgid, sticky) are not permissions.
        assert!(check_dir(p, 1000, libc::S_IFDIR | 0o2700, 1000, 0o700).is_ok());
        assert!(check_dir(p, 1000, libc::S_IFDIR | 0o500, 1000, 0o700).is_ok());
        let e = check_dir(p, 0, libc::S_IFDIR | 0o700, 1000, 0o700).unwrap_err();
        assert_eq!(e.status, Status::PermissionDenied);
        assert!(e.message.contains("/srv/kalos") && e.message.contains("uid 0") && e.message.contains("uid 1000"), "{e}");
        for mode in [0o750, 0o755, 0o777, 0o701, 0o710] {
            let e = check_dir(p, 1000, libc::S_IFDIR | mode, 1000, 0o700).unwrap_err();
            assert_eq!(e.status, Status::PermissionDenied);
            assert!(e.message.contains(&format!("mode {mode:04o}")) && e.message.contains("0700"), "{e}");
        }
        // KALOS_DATA_DIR_MODE=0750.
        assert!(check_dir(p, 1000, libc::S_IFDIR | 0o750, 1000, 0o750).is_ok());
        assert!(check_dir(p, 1000, libc::S_IFDIR | 0o740, 1000, 0o750).is_ok());
        let e = check_dir(p, 1000, libc::S_IFDIR | 0o755, 1000, 0o750).unwrap_err();
        assert!(e.message.contains("mode 0755") && e.message.contains("KALOS_DATA_DIR_MODE=0750"), "{e}");
    }
}

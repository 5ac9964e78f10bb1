//! The shared-memory segment: layout v1, creation, attachment and validation.
//!
//! ```text
//! offset 0      Header (one 4 KiB page): magic, layout version, sizes, dim/metric/dtype,
//!               owner uid, server pid + start time, epoch, heartbeat, server state,
//!               doorbell futex word + parked flag (own cache lines)
//! offset 4096   slot 0: SlotHeader (64 B) + data area (slot_data_bytes, 64-aligned)
//!               slot 1 ...
//! ```
//!
//! The creator writes every field, then stores `magic` last with release ordering; an
//! attacher that sees the magic sees a complete header. Every field an attacher reads is
//! validated against the size of its own mapping before any offset is trusted.

pub mod futex;

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::error::{Error, Result, Status};

pub const MAGIC: u64 = u64::from_le_bytes(*b"KALOSSHM");
pub const LAYOUT_VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 4096;
pub const SLOT_HEADER_BYTES: usize = 64;

/// Server states stored in `Header::server_state`.
pub const SERVER_STARTING: u32 = 0;
pub const SERVER_RUNNING: u32 = 1;
pub const SERVER_STOPPED: u32 = 2;
pub const SERVER_DEAD: u32 = 3;

/// Slot states (low 8 bits of `SlotHeader::state`).
///
/// The state word is `pid << 32 | (generation & 0xFF_FFFF) << 8 | state`: the claimer's pid is
/// recorded by the same CAS that claims the slot, so a slot can always be traced to a process,
/// and the generation makes every claim distinct, so a late client can never complete or read
/// someone else's request. Futex waiters wait on the low 32 bits (generation + state).
pub const SLOT_FREE: u64 = 0;
pub const SLOT_CLAIMED: u64 = 1;
pub const SLOT_SUBMITTED: u64 = 2;
pub const SLOT_PROCESSING: u64 = 3;
pub const SLOT_DONE: u64 = 4;
pub const SLOT_ABANDONED: u64 = 5;
pub const GEN_MASK: u64 = 0xFF_FFFF;

#[inline]
pub fn pack(pid: u32, gen: u64, state: u64) -> u64 {
    ((pid as u64) << 32) | ((gen & GEN_MASK) << 8) | state
}
#[inline]
pub fn state_of(word: u64) -> u64 {
    word & 0xff
}
#[inline]
pub fn gen_of(word: u64) -> u64 {
    (word >> 8) & GEN_MASK
}
#[inline]
pub fn pid_of(word: u64) -> u32 {
    (word >> 32) as u32
}
/// Same claim (pid + generation), different state.
#[inline]
pub fn with_state(word: u64, state: u64) -> u64 {
    (word & !0xff) | state
}
/// What a client stores in `SlotHeader::waiting` while it may sleep on the request of the claim
/// `word` (its generation and the SUBMITTED state; never 0). The server wakes the client only
/// when the flag carries the tag of the request it finishes, so finishing one request cannot
/// consume the flag of the slot's next request, whose client would then sleep through its
/// answer (`tests/slot_model.rs`).
#[inline]
pub fn waiting_tag(word: u64) -> u32 {
    with_state(word, SLOT_SUBMITTED) as u32
}

#[repr(C, align(64))]
pub struct Header {
    pub magic: AtomicU64,
    pub layout_version: u32,
    pub header_bytes: u32,
    pub total_bytes: u64,
    pub slot_count: u32,
    pub slot_stride: u32,
    pub slot_data_bytes: u32,
    pub dim: u32,
    pub metric: u32,
    pub dtype: u32,
    pub max_k: u32,
    pub max_payload: u32,
    pub owner_uid: u32,
    pub _pad0: u32,
    pub capacity: u64,
    pub server_pid: AtomicU32,
    pub server_state: AtomicU32,
    pub server_start_ticks: AtomicU64,
    pub epoch: AtomicU64,
    /// CLOCK_MONOTONIC milliseconds of the server's last loop iteration or housekeeping tick.
    pub heartbeat_ms: AtomicU64,
    /// Requests the recently active clients may have in flight at once, as the server counted
    /// them at its last pass (`server::gather`); clients read it to choose how to wait. Advisory:
    /// any value only changes how a client waits, never what it gets.
    pub active_clients: AtomicU32,
    pub _pad1a: u32,
    pub _pad1: [u64; 3],
    // --- own cache line: the doorbell
    pub doorbell: AtomicU32,
    pub server_parked: AtomicU32,
    pub _pad2: [u64; 7],
}

#[repr(C, align(64))]
pub struct SlotHeader {
    /// `pid << 32 | gen << 8 | state` (see the slot state constants).
    pub state: AtomicU64,
    /// `waiting_tag` of the request while its client may be sleeping in a futex wait on
    /// `state`, else 0.
    pub waiting: AtomicU32,
    pub _reserved: AtomicU32,
    /// Start time of the claiming process (0 = not yet written), to detect pid reuse.
    pub client_start_ticks: AtomicU64,
    pub req_len: AtomicU32,
    pub resp_len: AtomicU32,
    pub status: AtomicU32,
    pub _pad: [u32; 7],
}

impl SlotHeader {
    /// Frees the slot if its state word is still `word`: clears the owner's start ticks first,
    /// then publishes FREE (same generation, pid cleared) with release ordering. Every path to
    /// FREE goes through here, so a free slot never carries a previous owner's ticks: the next
    /// claimer's CAS acquires the cleared value, and until it stores its own ticks the reaper
    /// reads 0 ("not recorded yet", liveness by pid alone) instead of a stale value that would
    /// make a live owner look dead. Returns whether the slot was freed.
    ///
    /// The ticks are cleared only while the word is still `word`: a caller with a stale word
    /// (the reaper, whose owner freed the slot and exited while it looked) must not clear the
    /// ticks of the slot's next owner. Once the word is seen unchanged it stays so until the
    /// CAS below: the callers are the owner itself, the server on a slot it holds (ABANDONED),
    /// and the reaper on a slot whose owner is dead (`tests/slot_model.rs`).
    pub fn free_if(&self, word: u64) -> bool {
        if self.state.load(Ordering::Acquire) != word {
            return false;
        }
        self.client_start_ticks.store(0, Ordering::Relaxed);
        self.state.compare_exchange(word, pack(0, gen_of(word), SLOT_FREE), Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }
}

const _: () = assert!(std::mem::size_of::<SlotHeader>() == SLOT_HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// Geometry and identity of a segment, as the creator chooses it.
#[derive(Debug, Clone)]
pub struct Geometry {
    pub slot_count: u32,
    pub slot_data_bytes: u32,
    pub dim: u32,
    pub metric: u32,
    pub dtype: u32,
    pub max_k: u32,
    pub max_payload: u32,
    pub capacity: u64,
}

impl Geometry {
    pub fn slot_stride(&self) -> usize {
        SLOT_HEADER_BYTES + (self.slot_data_bytes as usize).div_ceil(64) * 64
    }
    pub fn total_bytes(&self) -> usize {
        HEADER_BYTES + self.slot_count as usize * self.slot_stride()
    }
}

/// A mapped segment (either side). Unmapped on drop.
pub struct Segment {
    base: *mut u8,
    len: usize,
    pub shm_name: String,
    pub geometry: Geometry,
}

// SAFETY: the mapping is shared memory accessed only through atomics and bounded byte copies;
// the raw pointer is valid for `len` bytes until drop, and no thread-affine state is held.
unsafe impl Send for Segment {}
// SAFETY: as above; concurrent access is coordinated by the slot protocol's atomics.
unsafe impl Sync for Segment {}

pub fn shm_name(name: &str) -> String {
    format!("/kalos.{name}")
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("validated names hold no NUL")
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/pid/stat), used with the
/// pid to tell a live process from a reused pid. `None` when the process does not exist.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let mut f = after.split_whitespace();
    // Fields after ")" start at field 3 (state). A zombie (exited, not yet reaped) or dead
    // task is not alive, whatever its pid says.
    if matches!(f.next()?, "Z" | "X" | "x") {
        return None;
    }
    // starttime is field 22 → index 19 from the state field, 18 after consuming it.
    f.nth(18)?.parse().ok()
}

/// True when the process is stopped by a signal (SIGSTOP, SIGTSTP) or by a tracer: it cannot
/// answer until it is continued.
pub fn process_stopped(pid: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    s.rfind(')').and_then(|i| s.get(i + 2..)).and_then(|r| r.split_whitespace().next()).is_some_and(|st| st == "T" || st == "t")
}

pub fn self_start_ticks() -> u64 {
    process_start_ticks(std::process::id()).unwrap_or(0)
}

/// True if a process with this pid exists (not a zombie) and started at `start_ticks`;
/// `start_ticks == 0` means "not recorded yet" and checks only that the pid is alive.
pub fn process_alive(pid: u32, start_ticks: u64) -> bool {
    if pid == 0 {
        return false;
    }
    match process_start_ticks(pid) {
        Some(t) => start_ticks == 0 || t == start_ticks,
        None => false,
    }
}

pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into our local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Who holds `/dev/shm/<file>`: its owner's uid and mode and, when a process holds an flock on
/// it, that process's pid (from /proc/locks), for errors about a name someone else took.
pub fn describe_holder(file: &str) -> String {
    let path = format!("/dev/shm/{}", file.trim_start_matches('/'));
    let Ok(md) = std::fs::metadata(&path) else { return format!("{path} (not readable)") };
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut s =
        format!("{path} is owned by uid {}{} (mode {:04o})", md.uid(), if md.uid() == me { ", yours" } else { "" }, md.mode() & 0o7777);
    let ino = md.ino();
    let holder = std::fs::read_to_string("/proc/locks").ok().and_then(|locks| {
        locks.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 00:19:5678 0 EOF"
            let (pid, dev_ino) = (f.get(4)?, f.get(5)?);
            (dev_ino.rsplit(':').next()?.parse::<u64>().ok()? == ino).then(|| pid.to_string())
        })
    });
    if let Some(pid) = holder {
        s.push_str(&format!(", locked by pid {pid}"));
    }
    s
}

/// The lock that elects the one server of a name: an flock on `/kalos.<name>.lock`, held for the
/// server's life and released by the kernel when the process dies, even by SIGKILL.
pub struct ServerLock {
    fd: libc::c_int,
    path: CString,
}

impl ServerLock {
    /// Tries to take the lock without blocking. `Ok(None)` when another live process holds it.
    ///
    /// The lock file is removed when the server stops, so after taking the flock we check that
    /// the path still names the inode we locked (a stopping server may have unlinked it between
    /// our open and our flock); if not, we retry on the new file.
    pub fn try_acquire(name: &str, mode: u32) -> Result<Option<ServerLock>> {
        let path = cstr(&format!("{}.lock", shm_name(name)));
        for _ in 0..100 {
            // SAFETY: valid C string; shm_open returns a new fd or -1.
            let fd = unsafe { libc::shm_open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, mode as libc::mode_t) };
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EACCES) {
                    return Err(Error::new(
                        Status::PermissionDenied,
                        format!(
                            "open lock {}: {e}: {}; another user holds this store name (choose another name, e.g. with your own prefix; see SECURITY.md)",
                            path.to_string_lossy(),
                            describe_holder(&format!("{}.lock", shm_name(name)))
                        ),
                    ));
                }
                return Err(Error::new(Status::Io, format!("open lock {}: {e}", path.to_string_lossy())));
            }
            // SAFETY: fd is ours.
            let r = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                // SAFETY: fd is ours and closed once.
                unsafe { libc::close(fd) };
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Ok(None);
                }
                return Err(Error::io("flock", e));
            }
            // SAFETY: zeroed stat structs are valid out-parameters; fd is valid.
            let (mut a, mut b): (libc::stat, libc::stat) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
            let lock_path = cstr(&format!("/dev/shm{}.lock", shm_name(name)));
            // SAFETY: valid fd, valid C string, valid out pointers.
            let same = unsafe { libc::fstat(fd, &mut a) == 0 && libc::stat(lock_path.as_ptr(), &mut b) == 0 } && a.st_ino == b.st_ino;
            if same {
                return Ok(Some(ServerLock { fd, path }));
            }
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
        }
        Err(Error::new(Status::Io, format!("could not take the server lock {}", path.to_string_lossy())))
    }
}

impl Drop for ServerLock {
    fn drop(&mut self) {
        // SAFETY: we hold the flock, so no other server uses this file; unlink it, then close
        // (which releases the flock). A process that opened the old inode re-checks the inode
        // after locking (see try_acquire).
        unsafe {
            libc::shm_unlink(self.path.as_ptr());
            libc::close(self.fd);
        }
    }
}

impl Segment {
    /// Creates the segment `O_EXCL` with `mode`, pre-faults it (a full /dev/shm fails here rather
    /// than with SIGBUS later), writes the header and publishes the magic last. The caller must
    /// hold the name's [`ServerLock`]; a stale segment of a dead server is removed first.
    pub fn create(name: &str, g: &Geometry, mode: u32, epoch: u64) -> Result<Segment> {
        let sname = shm_name(name);
        let c = cstr(&sname);
        // The lock is ours, so whatever is at this name is stale.
        // SAFETY: valid C string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
        // SAFETY: valid C string; returns fd or -1.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, mode as libc::mode_t) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let st = match e.raw_os_error() {
                Some(libc::EEXIST) => Status::AlreadyExists,
                Some(libc::EACCES) => Status::PermissionDenied,
                _ => Status::Io,
            };
            return Err(Error::new(st, format!("shm_open /dev/shm{sname}: {e}: {}", describe_holder(&sname))));
        }
        let cleanup = |e: Error| -> Error {
            // SAFETY: fd is ours; the name is ours to remove since creation succeeded.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
            }
            e
        };
        // Override the umask so the requested mode is what the file gets.
        // SAFETY: fd is valid.
        unsafe { libc::fchmod(fd, mode as libc::mode_t) };
        let total = g.total_bytes();
        // SAFETY: fd is valid; ftruncate sets the size.
        if unsafe { libc::ftruncate(fd, total as libc::off_t) } != 0 {
            return Err(cleanup(Error::last_os("ftruncate segment")));
        }
        // SAFETY: fd is valid; posix_fallocate reserves tmpfs pages now (ENOSPC if full).
        let r = unsafe { libc::posix_fallocate(fd, 0, total as libc::off_t) };
        if r != 0 {
            let e = std::io::Error::from_raw_os_error(r);
            return Err(cleanup(Error::new(
                Status::Io,
                format!("cannot reserve {total} bytes of shared memory for /dev/shm{sname} (is /dev/shm full?): {e}"),
            )));
        }
        let seg = match Self::map(fd, total, sname.clone(), g.clone()) {
            Ok(s) => s,
            Err(e) => return Err(cleanup(e)),
        };
        // SAFETY: fd no longer needed once mapped.
        unsafe { libc::close(fd) };
        // SAFETY: base is a fresh, zeroed, writable mapping of `total` ≥ HEADER_BYTES bytes,
        // aligned to a page; nobody else can see it until the magic is published.
        let h = unsafe { &mut *(seg.base as *mut Header) };
        h.layout_version = LAYOUT_VERSION;
        h.header_bytes = HEADER_BYTES as u32;
        h.total_bytes = total as u64;
        h.slot_count = g.slot_count;
        h.slot_stride = g.slot_stride() as u32;
        h.slot_data_bytes = g.slot_data_bytes;
        h.dim = g.dim;
        h.metric = g.metric;
        h.dtype = g.dtype;
        h.max_k = g.max_k;
        h.max_payload = g.max_payload;
        // SAFETY: geteuid has no preconditions.
        h.owner_uid = unsafe { libc::geteuid() };
        h.capacity = g.capacity;
        h.server_pid.store(std::process::id(), Ordering::Relaxed);
        h.server_start_ticks.store(self_start_ticks(), Ordering::Relaxed);
        h.epoch.store(epoch, Ordering::Relaxed);
        h.heartbeat_ms.store(monotonic_ms(), Ordering::Relaxed);
        h.server_state.store(SERVER_STARTING, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    fn map(fd: libc::c_int, len: usize, shm_name: String, geometry: Geometry) -> Result<Segment> {
        // SAFETY: fd is a valid shm fd of at least `len` bytes; we ask for a fresh shared mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("mmap segment"));
        }
        Ok(Segment { base: p as *mut u8, len, shm_name, geometry })
    }

    /// Attaches to an existing segment, validating everything before trusting it.
    /// Returns `NotFound` when no segment exists, `VersionMismatch` for another layout,
    /// `PermissionDenied` for another owner, `Corrupt` for inconsistent sizes. A segment whose
    /// magic is not yet published returns `NotFound` with "starting" in the message.
    pub fn attach(name: &str) -> Result<Segment> {
        let sname = shm_name(name);
        let c = cstr(&sname);
        // SAFETY: valid C string.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => {
                    Error::new(Status::NotFound, format!("no Kalos store named {name:?} is being served (/dev/shm{sname} does not exist)"))
                }
                Some(libc::EACCES) => Error::new(Status::PermissionDenied, format!("shm_open /dev/shm{sname}: {e}")),
                _ => Error::new(Status::Io, format!("shm_open /dev/shm{sname}: {e}")),
            });
        }
        let r = Self::attach_fd(fd, name, sname);
        // SAFETY: fd is ours; the mapping (if any) stays valid after close.
        unsafe { libc::close(fd) };
        r
    }

    fn attach_fd(fd: libc::c_int, name: &str, sname: String) -> Result<Segment> {
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd valid, st is a valid out pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(Error::last_os("fstat segment"));
        }
        // SAFETY: no preconditions.
        let uid = unsafe { libc::geteuid() };
        if st.st_uid != uid {
            return Err(Error::new(
                Status::PermissionDenied,
                format!("/dev/shm{sname} belongs to uid {}, not to us (uid {uid})", st.st_uid),
            ));
        }
        let size = st.st_size as usize;
        if size < HEADER_BYTES {
            return Err(Error::new(Status::NotFound, format!("store {name:?} is starting (segment not sized yet)")));
        }
        let seg = Self::map(
            fd,
            size,
            sname.clone(),
            Geometry { slot_count: 0, slot_data_bytes: 0, dim: 0, metric: 0, dtype: 0, max_k: 0, max_payload: 0, capacity: 0 },
        )?;
        let h = seg.header();
        let magic = h.magic.load(Ordering::Acquire);
        if magic == 0 {
            return Err(Error::new(Status::NotFound, format!("store {name:?} is starting (header not published yet)")));
        }
        if magic != MAGIC {
            return Err(Error::new(Status::Corrupt, format!("/dev/shm{sname} is not a Kalos segment (magic {magic:#x})")));
        }
        if h.layout_version != LAYOUT_VERSION {
            return Err(Error::new(
                Status::VersionMismatch,
                format!("/dev/shm{sname} has layout version {}; this library speaks version {LAYOUT_VERSION}", h.layout_version),
            ));
        }
        let g = Geometry {
            slot_count: h.slot_count,
            slot_data_bytes: h.slot_data_bytes,
            dim: h.dim,
            metric: h.metric,
            dtype: h.dtype,
            max_k: h.max_k,
            max_payload: h.max_payload,
            capacity: h.capacity,
        };
        let consistent = h.header_bytes as usize == HEADER_BYTES
            && h.total_bytes as usize == size
            && h.slot_count >= 1
            && h.slot_count <= 4096
            && h.slot_data_bytes >= 4096
            && h.slot_stride as usize == g.slot_stride()
            && g.total_bytes() == size
            && h.dim >= 1
            && h.dim as usize <= crate::types::MAX_DIM
            && h.metric <= 2
            && h.dtype <= 2
            && h.max_k as usize == crate::types::MAX_K;
        if !consistent {
            return Err(Error::new(
                Status::Corrupt,
                format!("/dev/shm{sname}: header sizes are inconsistent with the {size}-byte mapping"),
            ));
        }
        if h.owner_uid != uid {
            return Err(Error::new(Status::PermissionDenied, format!("/dev/shm{sname} header names owner uid {}, not {uid}", h.owner_uid)));
        }
        let mut seg = seg;
        seg.geometry = g;
        Ok(seg)
    }

    pub fn header(&self) -> &Header {
        // SAFETY: base is page-aligned and the mapping is at least HEADER_BYTES long (checked at
        // creation/attach); Header is repr(C) of atomics and plain integers, valid for any bits.
        unsafe { &*(self.base as *const Header) }
    }

    pub fn slot_count(&self) -> usize {
        self.geometry.slot_count as usize
    }

    pub fn slot(&self, i: usize) -> &SlotHeader {
        assert!(i < self.slot_count());
        // SAFETY: i < slot_count, and HEADER_BYTES + slot_count*stride == len (validated), so the
        // slot header lies inside the mapping, 64-byte aligned; any bit pattern is valid.
        unsafe { &*(self.base.add(HEADER_BYTES + i * self.geometry.slot_stride()) as *const SlotHeader) }
    }

    /// The whole mapping (base address, length): what an engine registers to write responses
    /// into slots directly.
    pub fn region(&self) -> (*mut u8, usize) {
        (self.base, self.len)
    }

    /// Raw pointer to slot `i`'s data area (`slot_data_bytes` long).
    pub fn slot_data(&self, i: usize) -> *mut u8 {
        assert!(i < self.slot_count());
        // SAFETY: inside the mapping, as in `slot`.
        unsafe { self.base.add(HEADER_BYTES + i * self.geometry.slot_stride() + SLOT_HEADER_BYTES) }
    }

    pub fn data_bytes(&self) -> usize {
        self.geometry.slot_data_bytes as usize
    }

    /// Copies `len` bytes out of slot `i`'s data area into `dst` (len is clamped by the caller).
    pub fn read_data(&self, i: usize, dst: &mut Vec<u8>, len: usize) {
        let len = len.min(self.data_bytes());
        dst.clear();
        dst.reserve(len);
        // SAFETY: dst has capacity `len` (reserved above), and the copy initialises all of it.
        unsafe {
            self.copy_out(i, dst.as_mut_ptr(), len);
            dst.set_len(len);
        }
    }

    /// Copies the first `dst.len()` bytes of slot `i`'s data area into `dst` (at most the data
    /// area's length).
    pub fn copy_data(&self, i: usize, dst: &mut [u8]) {
        let len = dst.len().min(self.data_bytes());
        // SAFETY: dst is a distinct writable slice of at least `len` bytes.
        unsafe { self.copy_out(i, dst.as_mut_ptr(), len) };
    }

    /// # Safety
    /// `dst` must be valid for `len` writes and not overlap the segment; `len <= data_bytes()`.
    unsafe fn copy_out(&self, i: usize, dst: *mut u8, len: usize) {
        debug_assert!(len <= self.data_bytes());
        // SAFETY: the source lies within slot i's data area (len <= data_bytes, the caller's
        // contract), dst is the caller's. The bytes may be changed concurrently by a misbehaving
        // peer; we copy them once and only ever parse the private copy.
        unsafe { std::ptr::copy_nonoverlapping(self.slot_data(i), dst, len) };
    }

    /// Copies `src` into slot `i`'s data area at `offset`. Panics if it would overflow (callers
    /// check sizes first).
    pub fn write_data(&self, i: usize, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.data_bytes());
        // SAFETY: destination range is inside slot i's data area (asserted above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.slot_data(i).add(offset), src.len()) };
    }

    /// Copies `src` into slot `i`'s data area at `offset`, checking as it goes that every value
    /// is finite: one pass over the source instead of a check and then a copy (a 1024 x 768
    /// batch is 3 MB), fused into one SIMD loop on x86_64 (`copy_finite`). Copies of at least
    /// `PAR_COPY_MIN` bytes are shared by up to `copy_threads()` threads (scoped, spawned for
    /// the call), which take chunks of `COPY_CHUNK` values from a shared counter: on the H200's
    /// host a spawned thread may start copying only ~0.2 ms after it was started, so fixed parts
    /// left the caller waiting for the slowest starter; with chunks the threads already running
    /// take the work of those not yet running.
    /// Returns the index of the first non-finite value; the slot then holds a partial copy,
    /// which the caller must not submit. Panics if it would overflow.
    pub fn write_finite_f32(&self, i: usize, offset: usize, src: &[f32]) -> std::result::Result<(), usize> {
        let bytes = std::mem::size_of_val(src);
        assert!(offset + bytes <= self.data_bytes());
        let dst = self.slot_data(i).wrapping_add(offset) as usize;
        let threads = if bytes >= PAR_COPY_MIN { copy_threads() } else { 1 };
        if threads <= 1 {
            // SAFETY: [dst, dst + bytes) lies inside slot i's data area (asserted above).
            return unsafe { copy_finite(dst, src) }.map_or(Ok(()), Err);
        }
        let chunks = src.len().div_ceil(COPY_CHUNK);
        let next = AtomicUsize::new(0);
        // The first bad index is the smallest any chunk finds: every chunk is taken by some
        // thread (the caller's loop runs until none is left), each reports its own first.
        let bad = AtomicUsize::new(usize::MAX);
        let work = || loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            let lo = c * COPY_CHUNK;
            let part = &src[lo..(lo + COPY_CHUNK).min(src.len())];
            // SAFETY: as above; chunks are disjoint sub-ranges of the same area, each taken once.
            if let Some(j) = unsafe { copy_finite(dst + lo * 4, part) } {
                bad.fetch_min(lo + j, Ordering::Relaxed);
            }
        };
        std::thread::scope(|sc| {
            // A thread that cannot be started (a process at its thread limit) is simply not
            // there: this thread takes its chunks.
            for _ in 1..threads.min(chunks) {
                let _ = std::thread::Builder::new().spawn_scoped(sc, work);
            }
            work();
        });
        // The scope joined every helper: their stores (fenced in copy_finite) and reports are
        // visible here.
        match bad.into_inner() {
            usize::MAX => Ok(()),
            j => Err(j),
        }
    }

    /// Removes the name (server side, at shutdown). Mappings stay valid until unmapped.
    pub fn unlink(&self) {
        let c = cstr(&self.shm_name);
        // SAFETY: valid C string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }

    pub fn server_alive(&self) -> bool {
        let h = self.header();
        let st = h.server_state.load(Ordering::Acquire);
        if st == SERVER_STOPPED || st == SERVER_DEAD {
            return false;
        }
        process_alive(h.server_pid.load(Ordering::Relaxed), h.server_start_ticks.load(Ordering::Relaxed))
    }
}

/// Low 32 bits of a 64-bit atomic, for futex calls (little-endian x86-64 / aarch64).
pub fn low_word(a: &AtomicU64) -> &AtomicU32 {
    // SAFETY: an AtomicU64 is 8-byte aligned; its first 4 bytes are a valid, aligned AtomicU32
    // on little-endian targets, and mixed-size atomic access is what the futex ABI requires.
    unsafe { &*(a.as_ptr() as *const AtomicU32) }
}

#[cfg(not(target_endian = "little"))]
compile_error!("Kalos's futex-on-low-word scheme assumes a little-endian target");

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Values per finiteness verdict of `copy_finite` (the bad block's first bad value is then
/// looked up).
const COPY_BLOCK: usize = 1024;
/// Values per work item of a copy shared by several threads (64 KiB).
const COPY_CHUNK: usize = 16 * COPY_BLOCK;
/// Smallest checked copy split over several threads (`Segment::write_finite_f32`).
const PAR_COPY_MIN: usize = 1 << 20;

/// Threads for a large checked copy into a slot: `KALOS_COPY_THREADS` (1 = none), else up to
/// 8, at most half the CPUs this process may use (on the H200's 16-core host, 1024 x 768
/// batches, one sweep: client minus server time 0.51 ms with 1 thread, 0.37 with 2 and 4, 0.26
/// with 8, though other runs with 8 gave 0.39-0.54, so 8 over 4 is not firmly established).
fn copy_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        crate::config::tuning_or_default().copy_threads.unwrap_or((cpus / 2).clamp(1, 8))
    })
}

/// Copies `src` to the address `dst`, checking every value finite; returns the index of the
/// first non-finite value (the copy then stops after the block of `COPY_BLOCK` values that
/// holds it). On x86_64 the check and the store are one SSE2 loop (`copy_finite_sse`).
///
/// # Safety
/// `dst` must be valid for writes of `src.len() * 4` bytes, 4-byte aligned (slot data offsets
/// are multiples of 4), and must not overlap `src`.
unsafe fn copy_finite(dst: usize, src: &[f32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract, passed on.
    unsafe {
        if copy_nt() {
            copy_finite_sse::<true>(dst, src)
        } else {
            copy_finite_sse::<false>(dst, src)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        for (b, chunk) in src.chunks(COPY_BLOCK).enumerate() {
            if let Some(j) = crate::types::first_non_finite(chunk) {
                return Some(b * COPY_BLOCK + j);
            }
            // SAFETY: the caller's contract covers [dst, dst + src.len() * 4); this block is inside.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr() as *const u8, (dst + b * COPY_BLOCK * 4) as *mut u8, chunk.len() * 4) };
        }
        None
    }
}

/// `copy_finite` on x86_64: 16-byte loads, a value is non-finite when its exponent bits are all
/// set (the same test as `f32::is_finite`), and 16-byte stores, streaming ones when `NT`
/// (`copy_nt`). Scalar for the head up to `dst`'s 16-byte alignment and for the tail.
///
/// # Safety
/// As `copy_finite`.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_finite_sse<const NT: bool>(dst: usize, src: &[f32]) -> Option<usize> {
    use std::arch::x86_64::*;
    let d = dst as *mut f32;
    let head = (((16 - dst % 16) % 16) / 4).min(src.len());
    // SAFETY: every index written below is < src.len(), inside the caller's range; vector
    // stores go to d + i with i >= head, 16-byte aligned. SSE2 is part of the x86_64 baseline.
    unsafe {
        for (i, x) in src[..head].iter().enumerate() {
            if !x.is_finite() {
                return Some(i);
            }
            d.add(i).write(*x);
        }
        let exp = _mm_set1_epi32(0x7f80_0000);
        for (b, block) in src[head..].chunks(COPY_BLOCK).enumerate() {
            let base = head + b * COPY_BLOCK;
            let n4 = block.len() / 4 * 4;
            let mut acc = _mm_setzero_si128();
            let mut i = 0;
            while i < n4 {
                let v = _mm_loadu_ps(block.as_ptr().add(i));
                acc = _mm_or_si128(acc, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(v), exp), exp));
                if NT {
                    _mm_stream_ps(d.add(base + i), v);
                } else {
                    _mm_store_ps(d.add(base + i), v);
                }
                i += 4;
            }
            let mut ok = _mm_movemask_epi8(acc) == 0;
            for (j, x) in block[n4..].iter().enumerate() {
                ok &= x.is_finite();
                d.add(base + n4 + j).write(*x);
            }
            if !ok {
                if NT {
                    _mm_sfence();
                }
                return Some(base + crate::types::first_non_finite(block).unwrap_or(0));
            }
        }
        if NT {
            // The fence orders the streaming stores before the caller's release of the request
            // (they bypass the usual store order).
            _mm_sfence();
        }
    }
    None
}

/// Streaming (non-temporal) stores for checked copies into a slot (x86_64; `KALOS_COPY_NT=0`
/// turns them off): the batch goes to memory instead of sitting dirty in the copying cores'
/// caches, where the GPU's DMA (or the server) would have to fetch it from. On the H200's host,
/// 1024 x 768 batches with 4 copy threads: client p50 4.109 / 4.113 ms against 4.254 / 4.230
/// without, engine 3.62 / 3.65 against 3.70 / 3.69 ms (alternating runs).
#[cfg(target_arch = "x86_64")]
fn copy_nt() -> bool {
    static NT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NT.get_or_init(|| crate::config::tuning_or_default().copy_streaming)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// copy_finite on every store kind this machine has, at every 4-byte misalignment of the
    /// destination: clean data arrives intact; a bad value anywhere (head, vector body, a
    /// block's scalar tail, the last value) is the one reported, the first of two.
    #[test]
    fn copy_finite_copies_and_finds_the_first_bad_value() {
        type CopyFn = Box<dyn Fn(usize, &[f32]) -> Option<usize>>;
        let kinds: Vec<CopyFn> = vec![
            // SAFETY: the test's destinations hold src.len() values past dst.
            Box::new(|d, s| unsafe { copy_finite(d, s) }),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; SSE2 is part of x86_64.
            Box::new(|d, s| unsafe { copy_finite_sse::<true>(d, s) }),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Box::new(|d, s| unsafe { copy_finite_sse::<false>(d, s) }),
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [0usize, 1, 3, 7, 1023, 1024, 1029, 3 * 1024 + 5] {
            let mut src: Vec<f32> = (0..len).map(|_| (rnd() % 2001) as f32 / 1000.0 - 1.0).collect();
            // Finite extremes pass: the largest, a subnormal, negative zero.
            for (j, x) in [f32::MAX, f32::MIN, 1e-40, -0.0].into_iter().enumerate().filter(|&(j, _)| j < len) {
                src[(j * 977) % len] = x;
            }
            for (ki, copy) in kinds.iter().enumerate() {
                for mis in 0..4 {
                    let mut buf = vec![0u32; len + 8];
                    let d = (buf.as_mut_ptr() as usize).div_ceil(16) * 16 + 4 * mis;
                    assert_eq!(copy(d, &src), None, "kind {ki} len {len} mis {mis}");
                    // SAFETY: d..d + len * 4 lies inside buf (16-byte rounding + 12 bytes < 32).
                    let got = unsafe { std::slice::from_raw_parts(d as *const f32, len) };
                    assert_eq!(got, &src[..], "kind {ki} len {len} mis {mis}");
                    if len == 0 {
                        continue;
                    }
                    let mut positions = vec![0, len - 1, (rnd() as usize) % len];
                    positions.extend([1023usize, 1024, 1025, 2047].iter().filter(|&&p| p < len));
                    for &p in &positions {
                        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                            let mut s = src.clone();
                            s[p] = bad;
                            let later = p + 1 + (rnd() as usize) % len;
                            if later < len {
                                s[later] = f32::NAN;
                            }
                            assert_eq!(copy(d, &s), Some(p), "kind {ki} len {len} mis {mis} bad at {p}");
                        }
                    }
                }
            }
        }
    }
}

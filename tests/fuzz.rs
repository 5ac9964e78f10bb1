//! Fuzzing of every parser that reads bytes Kalos does not trust (issue #26): the server's request
//! decoders, through the functions and through a live server's slots; the client's response
//! parsers; write-ahead log records and snapshots, in memory and as data directories opened and
//! repaired on disk; the validation of a segment header on attach; `.npy` files. The targets are
//! in `fuzz/targets.rs`, the mutations in `fuzz/mutate.rs`; docs/RELIABILITY.md says what is
//! promised and how to run them for longer.
//!
//! Each case is generated from the run's seed and its number, fed to its target under
//! `catch_unwind`, and must not panic; a global allocator refuses (and reports) any single
//! allocation over 1 GiB, and each in-memory target must not allocate at once more than 64 times
//! its input plus 1 MiB while it parses (a length field must never size an allocation by itself;
//! what a check allocates after `targets::parsed()`, to re-encode what was accepted, is not
//! counted). A failing case
//! is saved under the target directory's `tmp/fuzz-failures/` for `KALOS_FUZZ_REPLAY`.
//!
//! Environment:
//! - `KALOS_FUZZ_CASES`: cases of each in-memory target (default 20000; the slower targets run a
//!   fixed fraction of it: the live server 1/4, segments 1/4, data directories 1/10, .npy 1/4).
//! - `KALOS_FUZZ_SECS`: run each target for this many seconds instead.
//! - `KALOS_FUZZ_SEED`: the seed (default: random, printed).
//! - `KALOS_FUZZ_REPLAY`: a saved case; only the target named in its file name runs it.
//! - `KALOS_FUZZ_CORPUS`: a directory; every input is also written to `<dir>/<target>/`, the seed
//!   corpus of the coverage-guided targets in `fuzz/` (cargo-fuzz).

#[path = "fuzz/mutate.rs"]
mod mutate;
#[path = "fuzz/targets.rs"]
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use targets::{PARSED_PEAK, PEAK};

/// Largest single allocation any thread of this test binary may make.
const HARD_CAP: usize = 1 << 30;

thread_local! {
    /// The case running on this thread: target, seed, case number (for the over-cap report).
    static CASE: Cell<(&'static str, u64, u64)> = const { Cell::new(("", 0, 0)) };
}

/// The system allocator, recording each thread's largest allocation and refusing those over
/// [`HARD_CAP`] (the process then aborts with Rust's allocation-failure message, after ours).
struct Guard;

fn admit(size: usize) -> bool {
    let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
    if size <= HARD_CAP {
        return true;
    }
    // Report without allocating: format into a stack buffer, write(2) it.
    struct Buf {
        b: [u8; 320],
        n: usize,
    }
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let k = s.len().min(self.b.len() - self.n);
            self.b[self.n..self.n + k].copy_from_slice(&s.as_bytes()[..k]);
            self.n += k;
            Ok(())
        }
    }
    let (target, seed, case) = CASE.try_with(|c| c.get()).unwrap_or(("", 0, 0));
    let mut m = Buf { b: [0; 320], n: 0 };
    let _ = std::fmt::write(
        &mut m,
        format_args!("\nfuzz: refused an allocation of {size} bytes (cap {HARD_CAP}) during target {target:?} case {case} of seed {seed} (target \"\": not the case's thread)\n"),
    );
    // SAFETY: writes m.n initialised bytes of a live stack buffer to stderr.
    unsafe { libc::write(2, m.b.as_ptr().cast(), m.n) };
    false
}

// SAFETY: every call is passed on to the system allocator unchanged, or refused with null, which
// the GlobalAlloc contract allows.
unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if !admit(l.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if !admit(l.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if !admit(new) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Guard = Guard;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

fn seed() -> u64 {
    env_u64("KALOS_FUZZ_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32)
    })
}

/// The seed of case `i` of `target`: splitmix64 of the run's seed, the target and `i`.
fn case_seed(seed: u64, target: &str, i: u64) -> u64 {
    let mut z = seed
        ^ target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
        ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `target`: `check` on `gen`'s input of each case. `share` divides the case count (slow
/// targets); `bound`, when set, is the largest single allocation allowed for an input of a length.
fn fuzz(
    target: &'static str,
    share: u64,
    bound: Option<fn(usize) -> usize>,
    mut gen: impl FnMut(&mut StdRng) -> Vec<u8>,
    mut check: impl FnMut(&[u8]),
) {
    if let Ok(p) = std::env::var("KALOS_FUZZ_REPLAY") {
        let file = PathBuf::from(&p);
        if file.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{target}-"))) {
            let input = std::fs::read(&file).unwrap();
            eprintln!("fuzz {target}: replaying {} ({} bytes)", file.display(), input.len());
            check(&input);
        }
        return;
    }
    let seed = seed();
    let secs = env_u64("KALOS_FUZZ_SECS");
    let cases = (env_u64("KALOS_FUZZ_CASES").unwrap_or(20000) / share).max(1);
    let deadline = secs.map(|s| Instant::now() + Duration::from_secs(s));
    let corpus = std::env::var_os("KALOS_FUZZ_CORPUS").map(|d| PathBuf::from(d).join(target));
    if let Some(d) = &corpus {
        std::fs::create_dir_all(d).unwrap();
    }
    let t0 = Instant::now();
    let (mut i, mut bytes, mut peak_ratio) = (0u64, 0u64, 0f64);
    while deadline.map_or(i < cases, |d| Instant::now() < d) {
        let mut rng = StdRng::seed_from_u64(case_seed(seed, target, i));
        let input = gen(&mut rng);
        bytes += input.len() as u64;
        if let Some(d) = &corpus {
            std::fs::write(d.join(format!("{i}.bin")), &input).unwrap();
        }
        CASE.set((target, seed, i));
        PEAK.set(0);
        PARSED_PEAK.set(None);
        let r = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let peak = PARSED_PEAK.get().unwrap_or(PEAK.get());
        CASE.set(("", 0, 0));
        let over = bound.map(|b| b(input.len())).filter(|&b| peak > b);
        if r.is_err() || over.is_some() {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{target}-{seed}-{i}.bin"));
            std::fs::write(&file, &input).unwrap();
            // A panic is reported first (its backtrace may be what allocated).
            let why = match over.filter(|_| r.is_ok()) {
                Some(b) => format!("allocated {peak} bytes at once for an input of {} bytes (bound {b})", input.len()),
                None => "panicked (message above)".into(),
            };
            panic!(
                "fuzz {target}: case {i} of seed {seed} {why}; input saved to {}\nreplay: KALOS_FUZZ_REPLAY={} cargo test --release --test fuzz {target}",
                file.display(),
                file.display()
            );
        }
        if !input.is_empty() {
            peak_ratio = peak_ratio.max(peak as f64 / input.len() as f64);
        }
        i += 1;
    }
    let t = t0.elapsed().as_secs_f64();
    eprintln!(
        "fuzz {target}: {i} cases in {t:.2} s ({:.0}/s, {:.0} bytes on average, largest allocation {peak_ratio:.1}x its input), seed {seed}",
        i as f64 / t.max(1e-9),
        bytes as f64 / i.max(1) as f64
    );
}

/// The bound of the in-memory targets: 64 bytes per input byte, and 1 MiB.
fn in_memory(len: usize) -> usize {
    64 * len + (1 << 20)
}

#[test]
fn fuzz_request_decoder() {
    fuzz("request", 1, Some(in_memory), targets::gen_request, targets::check_request);
}

#[test]
fn fuzz_response_parsers() {
    fuzz("response", 1, Some(in_memory), targets::gen_response, targets::check_response);
}

#[test]
fn fuzz_wal_records() {
    fuzz("wal", 1, Some(in_memory), targets::gen_wal, targets::check_wal);
}

#[test]
fn fuzz_snapshots() {
    fuzz("snapshot", 1, Some(in_memory), targets::gen_snapshot, targets::check_snapshot);
}

/// Removes a scratch directory when dropped, also when its test fails.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn fuzz_npy() {
    let _scratch = Scratch(targets::scratch_dir("npy-gen"));
    fuzz("npy", 4, Some(in_memory), targets::gen_npy, targets::check_npy);
}

#[test]
fn fuzz_server_requests() {
    let servers = targets::Servers::start("req");
    // The server thread's allocations are not this thread's: only the global cap applies.
    fuzz("server", 4, None, targets::gen_server, |b| targets::check_server(&servers, b));
    servers.check_healthy();
}

#[test]
fn fuzz_segment_headers() {
    let fake = targets::FakeSegment::new("seg");
    // A case reads a slot of up to 4 MiB back; the mapping itself is the kernel's, not the heap.
    fuzz("segment", 4, Some(|len| 64 * len + (8 << 20)), targets::gen_segment, |b| targets::check_segment(&fake, b));
}

#[test]
fn fuzz_data_directories() {
    let scratch = Scratch(targets::scratch_dir("dir"));
    let dir = scratch.0.clone();
    let mut stats = targets::DirStats::default();
    // Repair writes a snapshot through a 1 MiB buffer in blocks of up to 4 MiB.
    fuzz("dir", 10, Some(|len| 64 * len + (16 << 20)), targets::gen_dir, |b| targets::check_dir(&dir, b, &mut stats));
    eprintln!("fuzz dir: {stats:?}");
}

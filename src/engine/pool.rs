//! A persistent worker pool for the CPU engine's split scans.
//!
//! Why a pool and not threads spawned per search: a spawn costs ~20–50 µs, which is more than a
//! whole scan of a table that fits in the cores' caches (10k × 128 f32 is 5 MiB: ~320 KiB a
//! core on a 16-core host). A pool whose workers are *awake* when the request comes answers in
//! about a microsecond of fan-out; a sleeping one costs a futex wake, like a spawn.
//!
//! Shape of a job ([`Pool::run`]):
//! - The caller publishes a closure `f(thread_index)` and bumps an epoch. Any worker that is
//!   awake joins (a CAS on one state word: epoch | closed | participants) and calls `f` with
//!   its own index (1..=workers); the caller calls `f(0)` itself. `f` claims pieces of work
//!   from shared counters, so a worker that is asleep or descheduled never holds the job up:
//!   whatever it did not claim, the caller (and the others) take.
//! - When the caller's `f(0)` returns there is nothing left to claim; it closes the job (no
//!   new joins) and waits for the participants still inside `f` to leave. Only then does `run`
//!   return, so `f` may borrow the caller's stack, as with scoped threads.
//! - A panic inside `f` on a worker is caught there and re-raised on the caller after the job
//!   is closed (the server thread's own `catch_unwind` turns it into an error status).
//!
//! Idle policy: a worker polls for `spin` after its last job (the server thread does the same
//! for `server_spin_ns` after its last request): busy for the first `HOT_POLL`, then yielding
//! its CPU between polls, so a client or the server thread that needs the CPU gets it at once
//! where threads outnumber CPUs. Then it sleeps on a futex until the next job's epoch, so an
//! idle server uses no CPU. `spin` = 0 sleeps at once (every job then pays a wake, so only
//! large scans are worth splitting: see `CpuEngine`).
//!
//! Placement ([`Pool::pin_apart`]): on a host with few cores, where the workers sleep between
//! jobs, the scheduler often wakes a worker on the CPU of the thread that woke it (the server
//! thread, busy with its own share of the scan) while a spinning client holds the other CPU:
//! the split scan then runs one share after the other. On the 2-core dev VM a 10k × 128 recall
//! took 165 µs with the server thread and its worker on one CPU and 83 µs on two. Pinning the
//! caller and each worker to CPUs of their own keeps the shares side by side.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::shm::futex;

/// The job closure as the workers see it (its lifetime is erased: see `run`).
type JobFn = dyn Fn(usize) + Sync;

const CLOSED: u64 = 1 << 31;
const PARTS: u64 = CLOSED - 1;

struct Shared {
    /// Bumped once per job; workers sleep on it.
    bell: Bell,
    /// `epoch << 32 | closed << 31 | participants`.
    state: AtomicU64,
    panicked: AtomicBool,
    /// The current job; written by the caller only while no worker can read it (before the
    /// epoch is published, after the job is closed and every participant has left).
    job: UnsafeCell<Option<*const JobFn>>,
    spin: Duration,
}

// SAFETY: `job` is the only non-Sync field. It is written by the one caller of `run` (which
// holds `&mut Pool`) only while no worker may read it: before the state word that admits
// workers is published with Release, and after the job is closed and every participant has
// left (Acquire). Workers read it only between a successful join (Acquire CAS) and their leave.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw closure pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads. Dropping it stops and joins them.
pub struct Pool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `workers` threads (named `kalos-cpu-N`) that busy-poll for `spin` after each job.
    /// A thread that cannot be started is left out (the pool is smaller, never broken).
    pub fn new(workers: usize, spin: Duration) -> Pool {
        let shared = Arc::new(Shared {
            bell: Bell::new(),
            state: AtomicU64::new(CLOSED),
            panicked: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            spin,
        });
        let mut handles = Vec::with_capacity(workers);
        for i in 1..=workers {
            let sh = Arc::clone(&shared);
            match std::thread::Builder::new().name(format!("kalos-cpu-{i}")).spawn(move || worker(&sh, i)) {
                Ok(h) => handles.push(h),
                Err(_) => break,
            }
        }
        Pool { shared, handles }
    }

    /// Worker threads (the caller of `run` is one more participant).
    pub fn workers(&self) -> usize {
        self.handles.len()
    }

    /// Pins the calling thread (the participant that runs `f(0)`: call it from the thread that
    /// will call [`Pool::run`]) to the CPU it is running on and worker `i` to the `i`-th CPU
    /// after that one among the CPUs the caller may use, so no two participants share a CPU.
    /// Does nothing and returns false when those CPUs are fewer than the participants or the
    /// affinity calls fail (a worker left unpinned then is harmless; a caller pinned before a
    /// worker's call failed is put back on its former CPUs). Linux only.
    pub fn pin_apart(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::thread::JoinHandleExt;
            let size = std::mem::size_of::<libc::cpu_set_t>();
            let mut allowed = cpu_set(&[]);
            // SAFETY: pid 0 is the calling thread; the pointer and size describe `allowed`.
            if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
                return false;
            }
            let cpus = cpus_in(&allowed);
            if cpus.len() < self.handles.len() + 1 {
                return false;
            }
            // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's CPU.
            let here = unsafe { libc::sched_getcpu() };
            let first = cpus.iter().position(|&c| c as i64 == here as i64).unwrap_or(0);
            // SAFETY: pid 0 is the calling thread; the set is a valid local of `size` bytes.
            if unsafe { libc::sched_setaffinity(0, size, &cpu_set(&[cpus[first]])) } != 0 {
                return false;
            }
            for (i, h) in self.handles.iter().enumerate() {
                let set = cpu_set(&[cpus[(first + 1 + i) % cpus.len()]]);
                // SAFETY: the handle's thread is alive (the pool joins its workers only in
                // Drop), so its pthread_t is valid; `set` is a valid set of `size` bytes.
                if unsafe { libc::pthread_setaffinity_np(h.as_pthread_t(), size, &set) } != 0 {
                    // SAFETY: as for the caller's set above; `allowed` is its former set.
                    unsafe { libc::sched_setaffinity(0, size, &allowed) };
                    return false;
                }
            }
            true
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Median, over `rounds` jobs, of the time from publishing a job to the first worker
    /// joining it, each job started once every worker sleeps: what a split scan pays for its
    /// fan-out when the workers sleep between jobs. `None` when no worker joined within 2 ms in
    /// half the rounds or more (a machine too busy to count on them).
    pub fn wake_latency(&mut self, rounds: usize) -> Option<Duration> {
        const LIMIT: Duration = Duration::from_millis(2);
        let mut lat = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t_sleep = Instant::now();
            while (self.shared.bell.sleepers.load(Ordering::SeqCst) as usize) < self.workers() && t_sleep.elapsed() < LIMIT {
                std::thread::yield_now();
            }
            let joined = AtomicBool::new(false);
            let took_ns = AtomicU64::new(u64::MAX);
            let t0 = Instant::now();
            self.run(&|idx| {
                if idx != 0 {
                    joined.store(true, Ordering::Release);
                    return;
                }
                while t0.elapsed() < LIMIT {
                    if joined.load(Ordering::Acquire) {
                        took_ns.store(crate::types::nanos(t0.elapsed()), Ordering::Relaxed);
                        return;
                    }
                    std::hint::spin_loop();
                }
            });
            match took_ns.into_inner() {
                u64::MAX => {}
                ns => lat.push(Duration::from_nanos(ns)),
            }
        }
        if lat.len() * 2 <= rounds {
            return None;
        }
        lat.sort();
        Some(lat[lat.len() / 2])
    }

    /// Runs `f(0)` on the calling thread and `f(i)` on every worker `i` that is awake to join,
    /// and returns when all of those calls have returned. `f` must divide its work through
    /// shared claims (it cannot know who joins); indices are distinct within one job.
    pub fn run(&mut self, f: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        let e = sh.bell.epoch.load(Ordering::Relaxed).wrapping_add(1);
        // SAFETY: the previous job is closed and has no participants (run waited for that),
        // so no worker reads `job` now. The lifetime of `f` is erased; run does not return
        // before every worker that joined this job has left it, and none can join after the
        // job is closed, so the pointer is never used after `f`'s borrow ends.
        unsafe {
            let p: *const (dyn Fn(usize) + Sync + '_) = f;
            *sh.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const JobFn>(p));
        }
        sh.state.store((e as u64) << 32, Ordering::Release);
        sh.bell.ring(e);
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        // Close: no new participants; then wait for those inside f to leave.
        let mut s = sh.state.load(Ordering::Relaxed);
        loop {
            match sh.state.compare_exchange_weak(s, s | CLOSED, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(v) => s = v,
            }
        }
        let mut spins = 0u32;
        while sh.state.load(Ordering::Acquire) & PARTS != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if sh.panicked.swap(false, Ordering::AcqRel) {
            panic!("a CPU engine worker thread panicked during a scan");
        }
    }
}

/// The CPU set holding exactly `cpus` (each below `CPU_SETSIZE`).
#[cfg(target_os = "linux")]
fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data (a bit array), valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        assert!(c < libc::CPU_SETSIZE as usize, "CPU {c} beyond CPU_SETSIZE");
        // SAFETY: CPU_SET writes bit `c` of `set`, below its capacity (checked above).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// The CPUs in `set`, ascending.
#[cfg(target_os = "linux")]
fn cpus_in(set: &libc::cpu_set_t) -> Vec<usize> {
    // SAFETY: CPU_ISSET reads bit `c` of `set`, below its capacity (CPU_SETSIZE).
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, set) }).collect()
}

/// How long a pool worker (and the server thread, `server::serve`) busy-polls after a job or
/// request before it polls yielding its CPU (the rest of its spin window): a client's next
/// request arrives within microseconds of its answer, and past that a thread that kept its CPU
/// would hold it for a whole time slice from a client (or the server thread) that needs it where
/// the host has fewer free CPUs than spinning threads.
pub(crate) const HOT_POLL: Duration = Duration::from_micros(20);

/// The doorbell of threads that wait for jobs: an epoch bumped once per job (the futex word
/// they sleep on), a count of sleepers, and a stop flag.
pub(super) struct Bell {
    pub(super) epoch: AtomicU32,
    /// Threads sleeping (or about to) on `epoch`.
    pub(super) sleepers: AtomicU32,
    stop: AtomicBool,
}

impl Bell {
    pub(super) fn new() -> Bell {
        Bell { epoch: AtomicU32::new(0), sleepers: AtomicU32::new(0), stop: AtomicBool::new(false) }
    }

    /// Publishes epoch `e` (the job behind it already in place) and wakes the sleepers.
    pub(super) fn ring(&self, e: u32) {
        self.epoch.store(e, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex::wake(&self.epoch, i32::MAX);
        }
    }

    /// Raises `stop`, then bumps the epoch and wakes every waiter, in that order (see
    /// [`Bell::wait`]).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        futex::wake(&self.epoch, i32::MAX);
    }

    /// Waits for the epoch to differ from `seen` and returns its new value, or `None` once
    /// [`Bell::stop`] was called. Busy-polls until `hot` has passed since `last` (the end of the
    /// thread's last job), polls yielding its CPU between polls until `spin` has, then sleeps on
    /// the epoch, counted in `sleepers` meanwhile. The epoch is read before the stop flag, and
    /// `between` runs between the two reads (a test hook): `stop` raises the flag before it
    /// bumps the epoch, so its bump is never taken for a job.
    pub(super) fn wait(&self, seen: u32, last: Instant, hot: Duration, spin: Duration, between: impl Fn()) -> Option<u32> {
        let mut spins = 0u32;
        loop {
            let e = self.epoch.load(Ordering::Acquire);
            between();
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            if e != seen {
                return Some(e);
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) {
                std::hint::spin_loop();
                continue;
            }
            let idle = last.elapsed();
            if idle < hot.min(spin) {
                std::hint::spin_loop();
                continue;
            }
            if idle < spin {
                std::thread::yield_now();
                continue;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == seen && !self.stop.load(Ordering::SeqCst) {
                // Bounded sleep: a lost wake (there should be none) costs at most this.
                futex::wait(&self.epoch, seen, Duration::from_millis(200));
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn worker(sh: &Shared, idx: usize) {
    let mut seen = sh.bell.epoch.load(Ordering::Acquire);
    let mut last = Instant::now();
    loop {
        let Some(e) = sh.bell.wait(seen, last, HOT_POLL, sh.spin, || {}) else {
            return;
        };
        seen = e;
        // Join the job of epoch `seen`, unless it is closed already (or a newer one is up).
        let mut s = sh.state.load(Ordering::Acquire);
        let joined = loop {
            if (s >> 32) as u32 != seen || s & CLOSED != 0 {
                break false;
            }
            match sh.state.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break true,
                Err(v) => s = v,
            }
        };
        if joined {
            // SAFETY: we joined an open job: the caller published `job` before admitting
            // workers and will not touch it (nor end `f`'s borrow) until we leave below.
            let f = unsafe { (*sh.job.get()).expect("job published before the epoch") };
            // SAFETY: see above; the closure is alive and Sync.
            if catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(idx) })).is_err() {
                sh.panicked.store(true, Ordering::Release);
            }
            sh.state.fetch_sub(1, Ordering::AcqRel);
        }
        last = Instant::now();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.bell.stop();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn sum_job(pool: &mut Pool, n: usize) -> (usize, usize) {
        let next = AtomicUsize::new(0);
        let total = AtomicUsize::new(0);
        let seen = AtomicU64::new(0);
        pool.run(&|idx| {
            seen.fetch_or(1 << idx, Ordering::Relaxed);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                total.fetch_add(i, Ordering::Relaxed);
            }
        });
        (total.into_inner(), seen.into_inner().count_ones() as usize)
    }

    #[test]
    fn every_piece_is_done_once_spinning_or_sleeping() {
        for spin in [Duration::ZERO, Duration::from_millis(5)] {
            let mut p = Pool::new(3, spin);
            assert_eq!(p.workers(), 3);
            for round in 0..2000 {
                let n = 1 + round % 97;
                let (t, who) = sum_job(&mut p, n * 10);
                assert_eq!(t, (n * 10) * (n * 10 - 1) / 2, "round {round}");
                assert!((1..=4).contains(&who));
            }
        }
    }

    #[test]
    fn borrows_of_the_callers_stack_are_safe_and_workers_join() {
        let mut p = Pool::new(2, Duration::from_millis(50));
        let mut joined = 0;
        for _ in 0..200 {
            let v: Vec<u64> = (0..1000).collect();
            let seen = AtomicU64::new(0);
            let s = AtomicU64::new(0);
            p.run(&|idx| {
                seen.fetch_or(1 << idx, Ordering::Relaxed);
                for x in &v {
                    s.fetch_add(*x, Ordering::Relaxed);
                }
                // The caller gives awake workers time to join (bounded: on a loaded machine
                // they may not run at all).
                let t0 = Instant::now();
                while idx == 0 && seen.load(Ordering::Relaxed) == 1 && t0.elapsed() < Duration::from_millis(20) {
                    std::hint::spin_loop();
                }
            });
            joined += (seen.into_inner().count_ones() > 1) as usize;
            // Each participant adds the whole vector once.
            assert_eq!(s.into_inner() % 499_500, 0);
        }
        assert!(joined > 0, "no worker ever joined a job");
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_pool_keeps_working() {
        let mut p = Pool::new(2, Duration::from_millis(50));
        let mut caught = 0;
        for _ in 0..200 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                p.run(&|idx| {
                    if idx != 0 {
                        panic!("boom");
                    }
                    std::thread::sleep(Duration::from_micros(200));
                })
            }));
            caught += r.is_err() as usize;
        }
        assert!(caught > 0);
        let (t, _) = sum_job(&mut p, 100);
        assert_eq!(t, 4950);
    }

    #[test]
    fn wake_latency_is_measured_when_workers_sleep() {
        let mut p = Pool::new(1, Duration::ZERO);
        // On a machine too loaded to wake the worker within 2 ms the answer is None.
        if let Some(d) = p.wake_latency(9) {
            assert!(d > Duration::ZERO && d < Duration::from_millis(2), "{d:?}");
        }
        let (t, _) = sum_job(&mut p, 100);
        assert_eq!(t, 4950, "the pool works after the measurement");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn pin_apart_gives_every_participant_its_own_cpu() {
        use std::os::unix::thread::JoinHandleExt;
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let of_this_thread = || {
            let mut set = cpu_set(&[]);
            // SAFETY: pid 0 is this test's thread; the set is a valid local of `size` bytes.
            assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
            cpus_in(&set)
        };
        let mine = of_this_thread();
        let p = Pool::new(mine.len() - 1, Duration::ZERO);
        if p.workers() + 1 == mine.len() {
            assert!(p.pin_apart());
            let mut seen = vec![of_this_thread()];
            for h in &p.handles {
                let mut set = cpu_set(&[]);
                // SAFETY: the worker is alive (joined in Drop); the set is a valid local.
                assert_eq!(unsafe { libc::pthread_getaffinity_np(h.as_pthread_t(), size, &mut set) }, 0);
                seen.push(cpus_in(&set));
            }
            assert!(seen.iter().all(|c| c.len() == 1), "{seen:?}");
            let mut all: Vec<usize> = seen.iter().map(|c| c[0]).collect();
            all.sort_unstable();
            assert_eq!(all, mine, "one CPU each, all of them");
            // SAFETY: pid 0 is this thread; the set is a valid local of `size` bytes.
            assert_eq!(unsafe { libc::sched_setaffinity(0, size, &cpu_set(&mine)) }, 0);
        }
        // More participants than CPUs: nothing is pinned.
        let big = Pool::new(mine.len(), Duration::ZERO);
        if big.workers() == mine.len() {
            assert!(!big.pin_apart());
            assert_eq!(of_this_thread(), mine);
        }
    }

    #[test]
    fn drop_joins_sleeping_workers() {
        let p = Pool::new(4, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        drop(p);
    }
}

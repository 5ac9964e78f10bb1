//! The client side: opening a store (any role), and every request as a slot round trip.
//!
//! Wait strategy: after submitting, a client spins for `client_spin_ns` (bounded), then sleeps
//! in a shared futex wait on its slot's state word in steps of at most 20 ms, checking the
//! server's liveness and its own deadline between steps. Nothing blocks without a deadline.
//! When the handle's recent answers took longer than `client_spin_ns` (a GPU search of a large
//! table), the spin window stretches to twice the recent answer time, at most
//! [`ADAPTIVE_SPIN_CAP`]: a futex wake-up costs ~10 µs, which a 60 µs request should not pay.
//! `client_spin_ns = 0` still means "sleep at once".

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Status};
use crate::protocol::*;
use crate::server::{self, ServerHandle};
use crate::shm::{self, futex, Segment};
use crate::store::{Record, NEVER};
use crate::types::*;

pub use crate::config::{Options, ADAPTIVE_SPIN_CAP};

/// Per-call recall options.
#[derive(Debug, Clone, Default)]
pub struct RecallOptions {
    /// `None` = all namespaces; otherwise at most 64.
    pub namespaces: Option<Vec<u64>>,
    pub recency: Option<Recency>,
    /// Overrides the handle's default deadline.
    pub timeout_ms: Option<u64>,
}

/// Namespaces of an upsert.
#[derive(Debug, Clone)]
pub enum Namespaces<'a> {
    One(u64),
    PerItem(&'a [u64]),
}

/// Per-call upsert options.
#[derive(Debug, Clone)]
pub struct UpsertOptions<'a> {
    pub namespaces: Namespaces<'a>,
    /// One entry per item (`None` = no payload), or `None` for no payloads at all.
    pub payloads: Option<Vec<Option<&'a [u8]>>>,
    /// Time to live from now, in ms (0 = none).
    pub ttl_ms: u64,
    /// Absolute expiry in unix ms ([`NEVER`] = none). Must be in the future.
    pub expires_ms: u64,
    pub timeout_ms: Option<u64>,
}

impl Default for UpsertOptions<'_> {
    fn default() -> Self {
        UpsertOptions { namespaces: Namespaces::One(0), payloads: None, ttl_ms: 0, expires_ms: NEVER, timeout_ms: None }
    }
}

/// A recall result with payloads.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadHit {
    pub id: u64,
    pub score: f32,
    pub payload: Option<Vec<u8>>,
}

/// f32 values sent after a request's parts, checked to be finite as they are copied into the
/// slot; an error names `what` and the value's index in the caller's array (`base` + offset).
struct Finite<'a> {
    v: &'a [f32],
    what: &'static str,
    base: usize,
}

/// An open store. Safe to share between threads (`Sync`): each call claims its own slot.
pub struct Kalos {
    seg: Arc<Segment>,
    server: Mutex<Option<ServerHandle>>,
    name: String,
    dim: usize,
    metric: Metric,
    spin_ns: u64,
    timeout_ms: u64,
    heartbeat_timeout_ms: u64,
    pid: u32,
    start_ticks: u64,
    next_slot: AtomicUsize,
    closed: AtomicBool,
    /// Smoothed answer time of this handle's recent requests (ns): stretches the spin window.
    recent_ns: AtomicU64,
}

/// The spin window for a handle with `spin_ns` configured and recent answers of `recent_ns`.
fn spin_window(spin_ns: u64, recent_ns: u64) -> Duration {
    if spin_ns == 0 {
        return Duration::ZERO;
    }
    let adaptive = recent_ns.saturating_mul(2).min(ADAPTIVE_SPIN_CAP.as_nanos() as u64);
    Duration::from_nanos(spin_ns.max(adaptive))
}

thread_local! {
    static REQ: RefCell<Writer> = RefCell::new(Writer::new());
    static RESP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `KALOS_CLIENT_TRACE=1`: every batch call prints where its time went to stderr (a tuning aid
/// for the GPU benchmarks, where a batch's client side was once mis-estimated). Read once.
fn trace_batches() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::config::tuning_or_default().client_trace)
}

fn deadline_after(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms.min(365 * 24 * 3600 * 1000))
}

impl Kalos {
    /// Opens the store `name` in the role `opts.role` (see [`Role`]).
    pub fn open(name: &str, opts: &Options) -> Result<Kalos> {
        validate_name(name)?;
        // The environment's knobs are read here, once per process; a bad value fails the open.
        crate::config::tuning()?;
        let deadline = deadline_after(opts.timeout_ms);
        loop {
            match opts.role {
                Role::Server => {
                    let (seg, server) = server::start(name, opts)?;
                    return Ok(Self::from_segment(name, seg, Some(server), opts));
                }
                Role::Client => match Self::attach(name, opts) {
                    Ok(k) => return Ok(k),
                    Err(e) if e.status == Status::NotFound && e.message.contains("starting") && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(e),
                },
                Role::Auto => {
                    match Self::attach(name, opts) {
                        Ok(k) => return Ok(k),
                        Err(e) if matches!(e.status, Status::NotFound | Status::ServerGone) => {}
                        Err(e) => return Err(e),
                    }
                    match server::start(name, opts) {
                        Ok((seg, server)) => return Ok(Self::from_segment(name, seg, Some(server), opts)),
                        // Another process won the election and is starting: attach to it.
                        Err(e) if e.status == Status::AlreadyExists && Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::new(Status::Timeout, format!("store {name:?} did not become ready within {} ms", opts.timeout_ms)));
            }
        }
    }

    fn attach(name: &str, opts: &Options) -> Result<Kalos> {
        let seg = Segment::attach(name)?;
        if !seg.server_alive() {
            return Err(Error::new(Status::ServerGone, format!("the server of store {name:?} is gone (stale segment)")));
        }
        if opts.dim != 0 && opts.dim != seg.geometry.dim {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("store {name:?} has dimension {}, the options ask for {}", seg.geometry.dim, opts.dim),
            ));
        }
        Ok(Self::from_segment(name, Arc::new(seg), None, opts))
    }

    fn from_segment(name: &str, seg: Arc<Segment>, server: Option<ServerHandle>, opts: &Options) -> Kalos {
        let g = seg.geometry.clone();
        Kalos {
            seg,
            server: Mutex::new(server),
            name: name.to_string(),
            dim: g.dim as usize,
            metric: Metric::from_u32(g.metric).unwrap_or(Metric::InnerProduct),
            spin_ns: opts.client_spin_ns,
            timeout_ms: opts.timeout_ms,
            heartbeat_timeout_ms: opts.heartbeat_timeout_ms.max(100),
            pid: std::process::id(),
            start_ticks: shm::self_start_ticks(),
            next_slot: AtomicUsize::new(std::process::id() as usize),
            recent_ns: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn dim(&self) -> usize {
        self.dim
    }
    pub fn metric(&self) -> Metric {
        self.metric
    }
    /// True when this handle runs the server thread.
    pub fn is_server(&self) -> bool {
        self.server.lock().map(|s| s.is_some()).unwrap_or(false)
    }
    /// Largest request or response body one slot carries.
    pub fn slot_bytes(&self) -> usize {
        self.seg.data_bytes()
    }
    pub fn max_payload_bytes(&self) -> usize {
        self.seg.geometry.max_payload as usize
    }

    /// Stops the server thread (role server) and marks the handle closed. Idempotent; later
    /// calls fail with `Closed`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut s) = self.server.lock() {
            if let Some(srv) = s.take() {
                srv.stop();
            }
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(Status::Closed, "the handle is closed"));
        }
        Ok(())
    }

    fn server_gone_reason(&self) -> Option<String> {
        let h = self.seg.header();
        let st = h.server_state.load(Ordering::Acquire);
        if st == shm::SERVER_STOPPED {
            return Some(format!("the server of {:?} shut down", self.name));
        }
        if st == shm::SERVER_DEAD {
            return Some(format!("the server thread of {:?} failed and stopped", self.name));
        }
        let pid = h.server_pid.load(Ordering::Relaxed);
        if !shm::process_alive(pid, h.server_start_ticks.load(Ordering::Relaxed)) {
            return Some(format!("the server process {pid} of {:?} is gone", self.name));
        }
        let hb = h.heartbeat_ms.load(Ordering::Relaxed);
        let now = shm::monotonic_ms();
        if now > hb + self.heartbeat_timeout_ms {
            return Some(format!("the server of {:?} has not sent a heartbeat for {} ms", self.name, now - hb));
        }
        None
    }

    /// One request/response round trip through a slot. `parse` runs on a private copy of the
    /// response body.
    fn call<R>(&self, req: &[u8], timeout_ms: Option<u64>, parse: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        self.call_parts(&[req], None, timeout_ms, parse)
    }

    /// `call` with the request given as consecutive parts, written straight into the slot (a
    /// batch's queries are not copied into a request buffer first).
    /// `floats`, when given, follows the parts: values checked to be finite as they are copied
    /// (`Finite`); a non-finite one fails the call with `NON_FINITE` before anything is sent.
    fn call_parts<R>(
        &self,
        parts: &[&[u8]],
        floats: Option<Finite<'_>>,
        timeout_ms: Option<u64>,
        parse: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<R> {
        self.check_open()?;
        let req_len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + floats.as_ref().map_or(0, |f| f.v.len() * 4);
        if req_len > self.seg.data_bytes() {
            return Err(Error::new(
                Status::TooLarge,
                format!("request of {req_len} bytes exceeds the slot size of {} bytes (option slot_bytes)", self.seg.data_bytes()),
            ));
        }
        let t_start = (floats.is_some() && trace_batches()).then(Instant::now);
        let deadline = deadline_after(timeout_ms.unwrap_or(self.timeout_ms));
        let (slot_i, word) = self.claim(deadline)?;
        let slot = self.seg.slot(slot_i);
        slot.client_start_ticks.store(self.start_ticks, Ordering::Relaxed);
        slot.req_len.store(req_len as u32, Ordering::Relaxed);
        let mut off = 0;
        for p in parts {
            self.seg.write_data(slot_i, off, p);
            off += p.len();
        }
        if let Some(f) = &floats {
            if let Err(i) = self.seg.write_finite_f32(slot_i, off, f.v) {
                // Give the slot back unsubmitted (the same claim, state FREE).
                slot.client_start_ticks.store(0, Ordering::Relaxed);
                let _ =
                    slot.state.compare_exchange(word, shm::pack(0, shm::gen_of(word), shm::SLOT_FREE), Ordering::AcqRel, Ordering::Relaxed);
                return Err(non_finite(f.what, f.v[i], f.base + i));
            }
        }
        let submitted = shm::with_state(word, shm::SLOT_SUBMITTED);
        if slot.state.compare_exchange(word, submitted, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return Err(Error::new(Status::Internal, "request slot was reclaimed while being written"));
        }
        let t_submitted = t_start.map(|_| Instant::now());
        let h = self.seg.header();
        if h.server_parked.load(Ordering::SeqCst) != 0 {
            h.doorbell.fetch_add(1, Ordering::SeqCst);
            futex::wake(&h.doorbell, 1);
        }
        self.wait_done(slot_i, submitted, deadline)?;
        let t_answered = t_start.map(|_| Instant::now());
        let status = Status::from_u32(slot.status.load(Ordering::Acquire));
        let len = (slot.resp_len.load(Ordering::Acquire) as usize).min(self.seg.data_bytes());
        RESP.with(|r| {
            let mut buf = r.borrow_mut();
            self.seg.read_data(slot_i, &mut buf, len);
            // Release the slot (same claim, state FREE, pid cleared).
            slot.client_start_ticks.store(0, Ordering::Relaxed);
            let done = shm::with_state(submitted, shm::SLOT_DONE);
            let _ = slot.state.compare_exchange(done, shm::pack(0, shm::gen_of(done), shm::SLOT_FREE), Ordering::AcqRel, Ordering::Relaxed);
            if status != Status::Ok {
                return Err(Error::new(status, String::from_utf8_lossy(&buf).into_owned()));
            }
            let t_read = t_start.map(|_| Instant::now());
            let r = parse(&buf);
            if let (Some(t0), Some(t1), Some(t2), Some(t3)) = (t_start, t_submitted, t_answered, t_read) {
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                eprintln!(
                    "kalos client trace: {req_len} B batch request: claim + checked copy {:.1} us, submit -> answer {:.1} us, response read {:.1} us, parsed {:.1} us",
                    us(t1 - t0),
                    us(t2 - t1),
                    us(t3 - t2),
                    us(t3.elapsed())
                );
            }
            r
        })
    }

    fn claim(&self, deadline: Instant) -> Result<(usize, u64)> {
        let n = self.seg.slot_count();
        let mut spins = 0u32;
        loop {
            let start = self.next_slot.fetch_add(1, Ordering::Relaxed);
            for j in 0..n {
                let i = (start + j) % n;
                let slot = self.seg.slot(i);
                let w = slot.state.load(Ordering::Relaxed);
                if shm::state_of(w) == shm::SLOT_FREE {
                    let claimed = shm::pack(self.pid, shm::gen_of(w) + 1, shm::SLOT_CLAIMED);
                    if slot.state.compare_exchange(w, claimed, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        return Ok((i, claimed));
                    }
                }
            }
            if let Some(reason) = self.server_gone_reason() {
                return Err(Error::new(Status::ServerGone, reason));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(Status::Timeout, format!("all {n} request slots stayed busy until the deadline")));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn wait_done(&self, slot_i: usize, submitted: u64, deadline: Instant) -> Result<()> {
        let slot = self.seg.slot(slot_i);
        let done = shm::with_state(submitted, shm::SLOT_DONE);
        let t0 = Instant::now();
        let spin = spin_window(self.spin_ns, self.recent_ns.load(Ordering::Relaxed));
        // Smoothed answer time (1/4 of the new sample): only completed waits update it.
        let note = |t0: Instant| {
            let e = t0.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            let r = self.recent_ns.load(Ordering::Relaxed);
            self.recent_ns.store(if r == 0 { e } else { r - r / 4 + e / 4 }, Ordering::Relaxed);
        };
        if !spin.is_zero() {
            // Busy-wait for the first few microseconds (a warm server answers a small request in
            // about a microsecond), then keep polling but yield the CPU between polls: when the
            // machine has fewer free cores than spinners, a pure spin would hold the core the
            // server needs for the rest of its time slice.
            let hot = Duration::from_nanos(self.spin_ns.min(5_000));
            let mut i = 0u32;
            loop {
                if slot.state.load(Ordering::Acquire) == done {
                    note(t0);
                    return Ok(());
                }
                i = i.wrapping_add(1);
                if i.is_multiple_of(32) {
                    let e = t0.elapsed();
                    if e >= spin {
                        break;
                    }
                    if e >= hot {
                        std::thread::yield_now();
                        continue;
                    }
                }
                std::hint::spin_loop();
            }
        }
        loop {
            slot.waiting.store(1, Ordering::SeqCst);
            let w = slot.state.load(Ordering::SeqCst);
            if w == done {
                slot.waiting.store(0, Ordering::Relaxed);
                note(t0);
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                slot.waiting.store(0, Ordering::Relaxed);
                return self.abandon(slot_i, submitted);
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            futex::wait(shm::low_word(&slot.state), w as u32, step);
            if slot.state.load(Ordering::Acquire) != done {
                if let Some(reason) = self.server_gone_reason() {
                    slot.waiting.store(0, Ordering::Relaxed);
                    return Err(Error::new(Status::ServerGone, reason));
                }
            }
        }
    }

    /// Deadline passed: withdraw the request so its slot is recycled and no later result can
    /// reach this caller. If the result landed in the meantime, take it.
    fn abandon(&self, slot_i: usize, submitted: u64) -> Result<()> {
        let slot = self.seg.slot(slot_i);
        let free = shm::pack(0, shm::gen_of(submitted), shm::SLOT_FREE);
        if slot.state.compare_exchange(submitted, free, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return Err(Error::new(Status::Timeout, "deadline passed before the server took the request (it did not run)"));
        }
        let processing = shm::with_state(submitted, shm::SLOT_PROCESSING);
        let abandoned = shm::with_state(submitted, shm::SLOT_ABANDONED);
        if slot.state.compare_exchange(processing, abandoned, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return Err(Error::new(Status::Timeout, "deadline passed while the server was running the request (it may have taken effect)"));
        }
        if slot.state.load(Ordering::Acquire) == shm::with_state(submitted, shm::SLOT_DONE) {
            return Ok(());
        }
        Err(Error::new(Status::Timeout, "deadline passed and the request slot was reclaimed"))
    }

    fn check_query(&self, q: &[f32], what: &str) -> Result<()> {
        if q.len() != self.dim {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("{what} has {} values; the store's dimension is {}", q.len(), self.dim),
            ));
        }
        check_finite(q, what)
    }

    fn check_recall_opts(&self, opts: &RecallOptions) -> Result<()> {
        if let Some(ns) = &opts.namespaces {
            if ns.len() > MAX_FILTER_NAMESPACES {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!("namespace filter has {} entries; at most {MAX_FILTER_NAMESPACES}", ns.len()),
                ));
            }
        }
        if let Some(r) = opts.recency {
            if !(r.weight.is_finite() && (0.0..=1.0).contains(&r.weight)) {
                return Err(Error::new(Status::InvalidArgument, format!("recency weight {} must be in [0, 1]", r.weight)));
            }
            if !(r.half_life_ms.is_finite() && r.half_life_ms > 0.0) {
                return Err(Error::new(Status::InvalidArgument, format!("recency half-life {} ms must be > 0", r.half_life_ms)));
            }
        }
        Ok(())
    }

    /// The recall request up to its queries, which follow it in the slot (`call_parts`).
    fn write_recall(&self, w: &mut Writer, nq: usize, k: usize, flags: u32, opts: &RecallOptions) {
        w.clear();
        w.u32(OP_RECALL).u32(k as u32).u32(nq as u32).u32(flags);
        match &opts.namespaces {
            None => w.u32(NONE_U32),
            Some(ns) => w.u32(ns.len() as u32),
        };
        match opts.recency {
            Some(r) => w.f32(r.weight).f64(r.half_life_ms),
            None => w.f32(0.0).f64(1.0),
        };
        if let Some(ns) = &opts.namespaces {
            w.u64s(ns);
        }
    }

    /// Top-k for one query, written into `ids`/`scores` (each at least `min(k, len)` long);
    /// returns the number of hits.
    pub fn recall_into(&self, query: &[f32], k: usize, opts: &RecallOptions, ids: &mut [u64], scores: &mut [f32]) -> Result<usize> {
        check_k(k)?;
        self.check_query(query, "query")?;
        self.check_recall_opts(opts)?;
        REQ.with(|w| {
            let mut w = w.borrow_mut();
            self.write_recall(&mut w, 1, k, 0, opts);
            self.call_parts(&[&w.buf, f32_bytes(query)], None, opts.timeout_ms, |resp| {
                let mut r = Reader::new(resp);
                let c = r.u32("count")? as usize;
                if c > k || c > ids.len() || c > scores.len() {
                    return Err(Error::new(
                        Status::BufferTooSmall,
                        format!("{c} results do not fit in output buffers of {} ids / {} scores", ids.len(), scores.len()),
                    ));
                }
                let b = r.take(c * 8, "ids")?;
                for (o, ch) in ids.iter_mut().zip(b.chunks_exact(8)) {
                    *o = u64::from_le_bytes(ch.try_into().unwrap());
                }
                let b = r.take(c * 4, "scores")?;
                for (o, ch) in scores.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes(ch.try_into().unwrap());
                }
                Ok(c)
            })
        })
    }

    /// Top-k for one query.
    pub fn recall(&self, query: &[f32], k: usize, opts: &RecallOptions) -> Result<Vec<Hit>> {
        let mut ids = vec![0u64; k.min(MAX_K)];
        let mut scores = vec![0f32; k.min(MAX_K)];
        let n = self.recall_into(query, k, opts, &mut ids, &mut scores)?;
        Ok(ids[..n].iter().zip(&scores[..n]).map(|(&id, &score)| Hit { id, score }).collect())
    }

    /// Top-k for one query, with each hit's payload.
    pub fn recall_with_payloads(&self, query: &[f32], k: usize, opts: &RecallOptions) -> Result<Vec<PayloadHit>> {
        check_k(k)?;
        self.check_query(query, "query")?;
        self.check_recall_opts(opts)?;
        REQ.with(|w| {
            let mut w = w.borrow_mut();
            self.write_recall(&mut w, 1, k, FLAG_PAYLOADS, opts);
            self.call_parts(&[&w.buf, f32_bytes(query)], None, opts.timeout_ms, |resp| {
                let mut r = Reader::new(resp);
                let c = r.u32("count")? as usize;
                let ids = r.u64s(c, "ids")?;
                let scores = r.f32s(c, "scores")?;
                let lens = r.u32s(c, "payload lengths")?;
                let mut out = Vec::with_capacity(c);
                for i in 0..c {
                    let payload = if lens[i] == NONE_U32 { None } else { Some(r.take(lens[i] as usize, "payload")?.to_vec()) };
                    out.push(PayloadHit { id: ids[i], score: scores[i], payload });
                }
                Ok(out)
            })
        })
    }

    /// Top-k for `nq` queries (`queries` is `nq * dim`, row-major) in as few requests as the
    /// slot size allows. Writes `k` entries per query into `ids`/`scores` (each ≥ `nq * k`) and
    /// the per-query hit count into `counts` (≥ `nq`).
    #[allow(clippy::too_many_arguments)] // the C ABI's flat argument list, mirrored
    pub fn recall_batch_into(
        &self,
        queries: &[f32],
        nq: usize,
        k: usize,
        opts: &RecallOptions,
        ids: &mut [u64],
        scores: &mut [f32],
        counts: &mut [usize],
    ) -> Result<()> {
        check_k(k)?;
        if nq == 0 {
            return Err(Error::new(Status::InvalidArgument, "a batch needs at least one query"));
        }
        let need = nq.checked_mul(self.dim).ok_or_else(|| Error::new(Status::InvalidArgument, "batch too large"))?;
        if queries.len() != need {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("batch holds {} values; {nq} queries of dimension {} need {need}", queries.len(), self.dim),
            ));
        }
        if ids.len() < nq * k || scores.len() < nq * k || counts.len() < nq {
            return Err(Error::new(Status::BufferTooSmall, format!("outputs need {} ids/scores and {nq} counts", nq * k)));
        }
        // Finiteness is checked while the queries are copied into the slot (one pass).
        self.check_recall_opts(opts)?;
        // Queries per request: bounded by the request (queries) and the response (k hits each).
        let fixed = 64 + 8 * opts.namespaces.as_ref().map_or(0, |n| n.len());
        let per_q = (self.dim * 4).max(4 + k * 12);
        let chunk = ((self.seg.data_bytes().saturating_sub(fixed)) / per_q).max(1);
        let mut q0 = 0;
        while q0 < nq {
            let qn = chunk.min(nq - q0);
            REQ.with(|w| {
                let mut w = w.borrow_mut();
                self.write_recall(&mut w, qn, k, 0, opts);
                let qv = &queries[q0 * self.dim..(q0 + qn) * self.dim];
                let floats = Finite { v: qv, what: "batch", base: q0 * self.dim };
                self.call_parts(&[&w.buf], Some(floats), opts.timeout_ms, |resp| {
                    let mut r = Reader::new(resp);
                    let cs = r.u32s(qn, "counts")?;
                    let total: usize = cs.iter().map(|&c| c as usize).sum();
                    if cs.iter().any(|&c| c as usize > k) {
                        return Err(Error::new(Status::Internal, "server returned more than k hits"));
                    }
                    let idb = r.take(total * 8, "ids")?;
                    let scb = r.take(total * 4, "scores")?;
                    // Each query's hits, in order (the counts were checked <= k above).
                    let (mut idc, mut scc) = (idb.chunks_exact(8), scb.chunks_exact(4));
                    for (i, &c) in cs.iter().enumerate() {
                        let c = c as usize;
                        let base = (q0 + i) * k;
                        for (d, b) in ids[base..base + c].iter_mut().zip(idc.by_ref().take(c)) {
                            *d = u64::from_le_bytes(b.try_into().unwrap());
                        }
                        for (d, b) in scores[base..base + c].iter_mut().zip(scc.by_ref().take(c)) {
                            *d = f32::from_le_bytes(b.try_into().unwrap());
                        }
                        counts[q0 + i] = c;
                    }
                    Ok(())
                })
            })?;
            q0 += qn;
        }
        Ok(())
    }

    /// Top-k for each of `nq` queries.
    pub fn recall_batch(&self, queries: &[f32], nq: usize, k: usize, opts: &RecallOptions) -> Result<Vec<Vec<Hit>>> {
        let mut ids = vec![0u64; nq * k];
        let mut scores = vec![0f32; nq * k];
        let mut counts = vec![0usize; nq];
        self.recall_batch_into(queries, nq, k, opts, &mut ids, &mut scores, &mut counts)?;
        Ok((0..nq).map(|i| (0..counts[i]).map(|j| Hit { id: ids[i * k + j], score: scores[i * k + j] }).collect()).collect())
    }

    /// Inserts or replaces memories. `vectors` is `ids.len() * dim` values. Within one call a
    /// repeated id is applied in order, so the last occurrence wins. A call too large for one
    /// slot is split into several requests, each applied atomically in order.
    pub fn upsert(&self, ids: &[u64], vectors: &[f32], opts: &UpsertOptions<'_>) -> Result<()> {
        let n = ids.len();
        if n == 0 {
            return Ok(());
        }
        if vectors.len() != n * self.dim {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("{n} ids need {} vector values of dimension {}, got {}", n * self.dim, self.dim, vectors.len()),
            ));
        }
        check_finite(vectors, "vectors")?;
        if let Namespaces::PerItem(ns) = opts.namespaces {
            if ns.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("{} namespaces for {n} ids", ns.len())));
            }
        }
        let maxp = self.max_payload_bytes();
        if let Some(p) = &opts.payloads {
            if p.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("{} payloads for {n} ids", p.len())));
            }
            for (i, pl) in p.iter().enumerate() {
                if let Some(b) = pl {
                    if b.len() > maxp {
                        return Err(Error::new(
                            Status::PayloadTooLarge,
                            format!("payload of id {} is {} bytes; the limit is {maxp}", ids[i], b.len()),
                        ));
                    }
                }
            }
        }
        if opts.expires_ms != NEVER && opts.expires_ms <= now_unix_ms() {
            return Err(Error::new(Status::InvalidArgument, format!("expiry {} (unix ms) is in the past", opts.expires_ms)));
        }
        let cap = self.seg.data_bytes().saturating_sub(64);
        let item_fixed = 8 + 8 + self.dim * 4 + 4;
        let mut i0 = 0;
        while i0 < n {
            // Grow the chunk while it fits.
            let mut size = 0usize;
            let mut i1 = i0;
            while i1 < n {
                let p = opts.payloads.as_ref().and_then(|p| p[i1]).map_or(0, |b| b.len());
                if i1 > i0 && size + item_fixed + p > cap {
                    break;
                }
                size += item_fixed + p;
                i1 += 1;
            }
            if size > cap {
                return Err(Error::new(
                    Status::TooLarge,
                    format!("one memory of {size} bytes does not fit in the slot size of {} bytes", self.seg.data_bytes()),
                ));
            }
            let mut w = Writer::new();
            w.u32(OP_UPSERT).u32((i1 - i0) as u32);
            w.u32(match opts.namespaces {
                Namespaces::One(_) => 0,
                Namespaces::PerItem(_) => 1,
            });
            w.u64(opts.ttl_ms).u64(opts.expires_ms);
            match opts.namespaces {
                Namespaces::One(ns) => w.u64(ns),
                Namespaces::PerItem(ns) => w.u64s(&ns[i0..i1]),
            };
            w.u64s(&ids[i0..i1]).f32s(&vectors[i0 * self.dim..i1 * self.dim]);
            match &opts.payloads {
                None => {
                    w.u32(0);
                }
                Some(p) => {
                    w.u32(1);
                    for pl in &p[i0..i1] {
                        w.u32(pl.map_or(NONE_U32, |b| b.len() as u32));
                    }
                    for b in p[i0..i1].iter().flatten() {
                        w.bytes(b);
                    }
                }
            }
            self.call(&w.buf, opts.timeout_ms, |_| Ok(()))?;
            i0 = i1;
        }
        Ok(())
    }

    /// Deletes ids, all or nothing: if any id is unknown nothing is deleted and the error
    /// (`NotFound`) names it. Returns the number deleted.
    pub fn delete(&self, ids: &[u64]) -> Result<u64> {
        self.delete_timeout(ids, None)
    }

    pub fn delete_timeout(&self, ids: &[u64], timeout_ms: Option<u64>) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut w = Writer::new();
        w.u32(OP_DELETE).u32(ids.len() as u32).u64s(ids);
        self.call(&w.buf, timeout_ms, |resp| Reader::new(resp).u64("deleted"))
    }

    /// Deletes every memory of namespace `ns`; returns how many.
    pub fn delete_namespace(&self, ns: u64) -> Result<u64> {
        let mut w = Writer::new();
        w.u32(OP_DELETE_NS).u64(ns);
        self.call(&w.buf, None, |resp| Reader::new(resp).u64("deleted"))
    }

    /// Deletes every memory; returns how many.
    pub fn clear(&self) -> Result<u64> {
        let mut w = Writer::new();
        w.u32(OP_CLEAR);
        self.call(&w.buf, None, |resp| Reader::new(resp).u64("deleted"))
    }

    /// Fetches memories by id. An unknown id fails the call with `NotFound` naming it.
    pub fn get(&self, ids: &[u64]) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(ids.len());
        let per = 8 * 3 + self.dim * 4 + 4 + self.max_payload_bytes();
        let chunk = (self.seg.data_bytes() / per).max(1);
        for part in ids.chunks(chunk) {
            let mut w = Writer::new();
            w.u32(OP_GET).u32(part.len() as u32).u64s(part);
            let dim = self.dim;
            self.call(&w.buf, None, |resp| {
                let mut r = Reader::new(resp);
                for &id in part {
                    let namespace = r.u64("namespace")?;
                    let created_ms = r.u64("created")?;
                    let expires_ms = r.u64("expires")?;
                    let vector = r.f32s(dim, "vector")?;
                    let l = r.u32("payload length")?;
                    let payload = if l == NONE_U32 { None } else { Some(r.take(l as usize, "payload")?.to_vec()) };
                    out.push(Record { id, namespace, vector, payload, created_ms, expires_ms });
                }
                Ok(())
            })?;
        }
        Ok(out)
    }

    pub fn stats(&self) -> Result<Stats> {
        let mut w = Writer::new();
        w.u32(OP_STATS);
        self.call(&w.buf, None, |resp| Stats::decode(&mut Reader::new(resp)))
    }

    /// The segment (for tests and tools).
    pub fn segment(&self) -> &Segment {
        &self.seg
    }
}

impl Drop for Kalos {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_window_stretches_to_recent_answers_within_the_cap() {
        assert_eq!(spin_window(0, 80_000), Duration::ZERO, "0 keeps meaning sleep at once");
        assert_eq!(spin_window(50_000, 0), Duration::from_micros(50));
        assert_eq!(spin_window(50_000, 10_000), Duration::from_micros(50));
        assert_eq!(spin_window(50_000, 60_000), Duration::from_micros(120));
        assert_eq!(spin_window(50_000, 10_000_000), ADAPTIVE_SPIN_CAP);
        assert_eq!(spin_window(2_000_000, 10_000_000), Duration::from_millis(2), "a longer configured spin wins");
    }
}

//! The server thread: owns the store, the engine and the persistence; serves slots in batches.
//!
//! Loop: take every SUBMITTED slot (CAS to PROCESSING) as one batch; copy each request into a
//! private buffer before parsing it (the client's bytes are untrusted and may change under us);
//! run the writes in slot order (validate, log, apply), commit the log once for the batch (group
//! commit), then run all recalls that share a filter as one engine call; write each response,
//! mark the slot DONE and wake the client only if it sleeps. When no request has arrived for
//! `server_spin_ns` the server parks on the doorbell futex (clients ring it only when the
//! `server_parked` flag is set), waking every 250 ms for housekeeping: heartbeat, reclaiming
//! slots of dead clients, purging expired memories, log sync and snapshots.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Options;
use crate::engine::{self, cpu::CpuEngine, Engine, EngineKind};
use crate::error::{Error, Result, Status};
use crate::persist::{Persist, PersistOptions, WalOp};
use crate::protocol::*;
use crate::shm::{self, futex, Geometry, Segment, ServerLock};
use crate::store::{Store, UpsertItem, NEVER};
use crate::types::*;

const HOUSEKEEPING: Duration = Duration::from_millis(250);
/// Busy-poll without yielding for this long after a request (see `run`).
const HOT_SPIN: Duration = Duration::from_micros(20);
const LATENCY_RING: usize = 4096;

/// Owned by the handle that started the server; `stop` ends the thread and removes the name.
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    seg: Arc<Segment>,
    _lock: ServerLock,
}

impl ServerHandle {
    pub fn stop(mut self) {
        self.shutdown();
    }
    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let h = self.seg.header();
        h.doorbell.fetch_add(1, Ordering::SeqCst);
        futex::wake(&h.doorbell, i32::MAX);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.seg.unlink();
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

fn validate_options(o: &Options) -> Result<()> {
    let bad = |m: String| Err(Error::new(Status::InvalidArgument, m));
    if o.dim == 0 || o.dim as usize > MAX_DIM {
        return bad(format!("dim = {}; creating a store needs 1 <= dim <= {MAX_DIM}", o.dim));
    }
    if o.capacity == 0 || o.capacity > (1u64 << 32) - 1 {
        return bad(format!("capacity = {}; must be between 1 and 2^32-1", o.capacity));
    }
    if o.slots == 0 || o.slots > 4096 {
        return bad(format!("slots = {}; must be between 1 and 4096", o.slots));
    }
    if o.slot_bytes < 4096 || o.slot_bytes > (1 << 30) {
        return bad(format!("slot_bytes = {}; must be between 4096 and 2^30", o.slot_bytes));
    }
    let min_slot = (o.dim as usize) * 4 + 64;
    if (o.slot_bytes as usize) < min_slot {
        return bad(format!("slot_bytes = {} cannot hold one query of dimension {} ({min_slot} bytes)", o.slot_bytes, o.dim));
    }
    if o.mode & !0o777 != 0 || o.mode & 0o600 != 0o600 {
        return bad(format!("mode {:o} must be permission bits that include 0600", o.mode));
    }
    if o.max_payload_bytes as usize > o.slot_bytes as usize / 2 {
        return bad(format!("max_payload_bytes = {} must be at most half of slot_bytes ({})", o.max_payload_bytes, o.slot_bytes));
    }
    Ok(())
}

/// Resolves the engine choice: an explicit option wins; with `Auto`, `KALOS_BACKEND` decides.
pub fn resolve_backend(opt: Backend) -> Result<Backend> {
    if opt != Backend::Auto {
        return Ok(opt);
    }
    Ok(crate::config::tuning()?.backend.unwrap_or(Backend::Auto))
}

/// The engine for `backend`, and why the CUDA engine is not serving when `Auto` fell back to
/// the CPU engine (no driver, a compile error, out of memory, an unsupported device).
fn make_engine(backend: Backend, opts: &Options, store: &Store) -> Result<(Box<dyn Engine>, Option<String>)> {
    let cpu = || Box::new(CpuEngine::for_server(opts.threads as usize, opts.server_spin_ns)) as Box<dyn Engine>;
    match backend {
        Backend::Cpu => Ok((cpu(), None)),
        Backend::Cuda => Ok((engine::cuda::create(opts, store)?, None)),
        // Auto: the GPU when one is usable, with a cost model that keeps requests too small to
        // pay for a GPU round trip on the CPU (engine::cuda::create_auto); else the CPU engine.
        Backend::Auto => Ok(match engine::cuda::create_auto(opts, store) {
            Ok(e) => (e, None),
            Err(e) => (cpu(), Some(e.message)),
        }),
    }
}

/// Starts a server for `name`: takes the name's lock, recovers the data directory, creates the
/// segment and starts the server thread, returning once the thread serves.
pub fn start(name: &str, opts: &Options) -> Result<(Arc<Segment>, ServerHandle)> {
    validate_name(name)?;
    validate_options(opts)?;
    let backend = resolve_backend(opts.backend)?;
    let lock = ServerLock::try_acquire(name, opts.mode)?
        .ok_or_else(|| Error::new(Status::AlreadyExists, format!("a live server already owns store {name:?}")))?;
    let mut store = Store::new(opts.dim as usize, opts.metric, opts.capacity as usize, opts.max_payload_bytes as usize);
    let persist = match &opts.data_dir {
        None => None,
        Some(dir) => {
            let popts = PersistOptions { sync: opts.sync, sync_interval_ms: opts.sync_interval_ms };
            let (p, rec) = Persist::open(dir, opts.dim as usize, opts.metric, &popts, &mut store)?;
            if let Some(t) = &rec.torn_tail {
                eprintln!("kalos: {name}: recovered {} rows; {t}", store.len());
            }
            Some(p)
        }
    };
    let g = Geometry {
        slot_count: opts.slots,
        slot_data_bytes: opts.slot_bytes,
        dim: opts.dim,
        metric: opts.metric as u32,
        dtype: opts.dtype as u32,
        max_k: MAX_K as u32,
        max_payload: opts.max_payload_bytes,
        capacity: opts.capacity,
    };
    let epoch = (now_unix_ms() << 20) ^ (std::process::id() as u64);
    let seg = Arc::new(Segment::create(name, &g, opts.mode, epoch)?);
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Result<()>>();
    let thread = {
        let seg = seg.clone();
        let stop = stop.clone();
        let opts = opts.clone();
        std::thread::Builder::new()
            .name(format!("kalos-server-{name}"))
            .spawn(move || server_main(seg, stop, opts, backend, store, persist, tx))
            .map_err(|e| Error::io("spawn server thread", e))?
    };
    match rx.recv() {
        Ok(Ok(())) => Ok((seg.clone(), ServerHandle { stop, thread: Some(thread), seg, _lock: lock })),
        Ok(Err(e)) => {
            let _ = thread.join();
            seg.unlink();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            seg.unlink();
            Err(Error::new(Status::Internal, "server thread exited during start"))
        }
    }
}

fn server_main(
    seg: Arc<Segment>,
    stop: Arc<AtomicBool>,
    opts: Options,
    backend: Backend,
    store: Store,
    persist: Option<Persist>,
    ready: mpsc::Sender<Result<()>>,
) {
    let h = seg.header();
    // The engine is created on this thread: a CUDA context is bound to the thread that uses it.
    let (engine, fallback_reason) = match catch_unwind(AssertUnwindSafe(|| make_engine(backend, &opts, &store))) {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            h.server_state.store(shm::SERVER_STOPPED, Ordering::SeqCst);
            let _ = ready.send(Err(e));
            return;
        }
        Err(_) => {
            h.server_state.store(shm::SERVER_DEAD, Ordering::SeqCst);
            let _ = ready.send(Err(Error::new(Status::Panic, "engine initialisation panicked")));
            return;
        }
    };
    let mut srv = Server::new(seg.clone(), opts, store, engine, persist);
    srv.fallback_reason = fallback_reason.unwrap_or_default();
    if let Err(e) = srv.initial_sync() {
        h.server_state.store(shm::SERVER_STOPPED, Ordering::SeqCst);
        let _ = ready.send(Err(e));
        return;
    }
    h.server_state.store(shm::SERVER_RUNNING, Ordering::SeqCst);
    let _ = ready.send(Ok(()));
    let r = catch_unwind(AssertUnwindSafe(|| srv.run(&stop)));
    let final_state = if r.is_ok() { shm::SERVER_STOPPED } else { shm::SERVER_DEAD };
    h.server_state.store(final_state, Ordering::SeqCst);
    let status = if r.is_ok() { Status::ServerGone } else { Status::Panic };
    srv.fail_all_pending(status);
    if let Some(p) = srv.persist.as_mut() {
        let _ = p.commit();
    }
}

struct Pending {
    slot: usize,
    word: u64,
    req: Vec<u8>,
    /// A large request's private copy in the server's mirror (start, length) instead of `req`
    /// (see `Server::mirror`).
    ext: Option<(*const u8, usize)>,
    /// A large recall whose queries stay in the client's slot: `req` holds a private copy of
    /// its first bytes (the header, and then some of the queries, which are ignored) and this is
    /// the whole request's length. See `Server::collect`.
    slot_len: Option<usize>,
}

impl Pending {
    /// The private copy of the request.
    fn bytes(&self) -> &[u8] {
        match self.ext {
            // SAFETY: a region of the server's mirror, which outlives every Pending, written by
            // `collect` for this request and not touched again until the next `collect`, which
            // runs after this batch is published and its Pendings are gone.
            Some((p, len)) => unsafe { std::slice::from_raw_parts(p, len) },
            None => &self.req,
        }
    }
    /// The request's op code (0, an unknown op, when the request is shorter than one).
    fn op(&self) -> u32 {
        self.bytes().get(..4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
    }
    /// The request body after the op code.
    fn body(&self) -> &[u8] {
        self.bytes().get(4..).unwrap_or(&[])
    }
}

/// Requests of at least this many bytes are copied into the mirror (a batch of queries) rather
/// than into a pooled vector.
const MIRROR_MIN_BYTES: usize = 64 << 10;
/// The longest recall header: op, k, nq, flags, namespace count, recency weight and half-life,
/// and at most MAX_FILTER_NAMESPACES namespaces.
const RECALL_HEADER_MAX: usize = 32 + 8 * MAX_FILTER_NAMESPACES;

struct RecallJob {
    idx: usize, // index into batch
    k: usize,
    nq: usize,
    flags: u32,
    q_off: usize, // offset (in queries) into the group's query buffer
}

pub(crate) struct Server {
    // Dropped before `seg` (declaration order): the engine may have registered the mapping.
    engine: Box<dyn Engine>,
    /// The private copy of the first large request of a batch (one slot's `data_bytes`),
    /// offered to the engine (`attach_staging`): a GPU engine registers it and copies a batch's
    /// queries from there to the device without staging them again (~0.45 ms of 3 MB on the H200
    /// host). Reused by every batch, so it stays warm in the caches like a pooled buffer.
    /// Dropped after the engine, which unregisters it.
    mirror: Option<memmap2::MmapMut>,
    mirror_used: bool,
    seg: Arc<Segment>,
    opts: Options,
    store: Store,
    persist: Option<Persist>,
    dim: usize,
    metric: Metric,
    batch: Vec<Pending>,
    free_bufs: Vec<Vec<u8>>,
    resp: Writer,
    search_out: Vec<Vec<Hit>>,
    /// Set when a publish woke a sleeping client: the next idle poll yields the CPU at once.
    woke_client: std::cell::Cell<bool>,
    latencies: Vec<u64>,
    lat_pos: usize,
    requests: u64,
    queries: u64,
    batches: u64,
    errors: u64,
    queue_depth: u64,
    fallbacks: u64,
    /// Why the CUDA engine is not serving (it could not start under backend auto, or it failed
    /// and the server fell back to the CPU); empty otherwise.
    fallback_reason: String,
    started: Instant,
}

impl Server {
    fn new(seg: Arc<Segment>, opts: Options, store: Store, mut engine: Box<dyn Engine>, persist: Option<Persist>) -> Server {
        let dim = store.dim();
        let metric = store.metric();
        let (base, len) = seg.region();
        engine.attach_slots(base, len);
        // Every engine gets the mirror (its pages are touched only by large requests); a GPU
        // engine registers it.
        let mut mirror = (seg.data_bytes() >= MIRROR_MIN_BYTES).then(|| memmap2::MmapMut::map_anon(seg.data_bytes()).ok()).flatten();
        if let Some(m) = mirror.as_mut() {
            engine.attach_staging(m.as_mut_ptr(), m.len());
        }
        Server {
            mirror,
            mirror_used: false,
            seg,
            opts,
            store,
            engine,
            persist,
            dim,
            metric,
            batch: Vec::new(),
            free_bufs: Vec::new(),
            resp: Writer::new(),
            search_out: Vec::new(),
            woke_client: std::cell::Cell::new(false),
            latencies: Vec::with_capacity(LATENCY_RING),
            lat_pos: 0,
            requests: 0,
            queries: 0,
            batches: 0,
            errors: 0,
            queue_depth: 0,
            fallbacks: 0,
            fallback_reason: String::new(),
            started: Instant::now(),
        }
    }

    fn initial_sync(&mut self) -> Result<()> {
        let dirty: Vec<u32> = (0..self.store.len() as u32).collect();
        self.store.take_dirty();
        self.engine.sync(&self.store, &dirty)
    }

    fn run(&mut self, stop: &AtomicBool) {
        let seg = self.seg.clone();
        let h = seg.header();
        let spin = Duration::from_nanos(self.opts.server_spin_ns);
        let mut last_work = Instant::now();
        let mut last_house = Instant::now();
        loop {
            if stop.load(Ordering::Acquire) {
                return;
            }
            if self.collect() > 0 {
                self.process_batch();
                last_work = Instant::now();
                h.heartbeat_ms.store(shm::monotonic_ms(), Ordering::Relaxed);
                // Under sustained load there is never an idle poll: run housekeeping (reclaim,
                // expiry, log sync, compaction) between batches once it is due.
                if last_house.elapsed() >= HOUSEKEEPING {
                    self.housekeeping();
                    last_house = Instant::now();
                }
                continue;
            }
            if last_house.elapsed() >= HOUSEKEEPING {
                self.housekeeping();
                last_house = Instant::now();
            }
            let idle = last_work.elapsed();
            if idle < spin {
                // Pure spin for the first microseconds after a request; then keep polling but
                // yield between polls. The scheduler often places a client we just woke on our
                // CPU (wake-affine); a server that spins without yielding would hold that CPU for
                // its whole spin window while the client waits to read its answer.
                if idle < HOT_SPIN && !self.woke_client.get() {
                    std::hint::spin_loop();
                } else {
                    self.woke_client.set(false);
                    std::thread::yield_now();
                }
                continue;
            }
            // Park: announce, re-check (a client that missed the flag submitted before we
            // looked), then sleep until the doorbell rings or housekeeping is due.
            h.server_parked.store(1, Ordering::SeqCst);
            let bell = h.doorbell.load(Ordering::SeqCst);
            if !stop.load(Ordering::SeqCst) && !self.any_submitted() {
                futex::wait(&h.doorbell, bell, HOUSEKEEPING);
            }
            h.server_parked.store(0, Ordering::SeqCst);
            if last_house.elapsed() >= HOUSEKEEPING {
                self.housekeeping();
                last_house = Instant::now();
            }
            // `last_work` is not reset here: a housekeeping wake-up with no request goes straight
            // back to sleep instead of spinning another window; a doorbell wake-up finds its
            // request on the next scan, which restarts the spin window.
        }
    }

    fn any_submitted(&self) -> bool {
        (0..self.seg.slot_count()).any(|i| shm::state_of(self.seg.slot(i).state.load(Ordering::SeqCst)) == shm::SLOT_SUBMITTED)
    }

    /// Takes every submitted slot; returns how many.
    fn collect(&mut self) -> usize {
        let seg = self.seg.clone();
        self.mirror_used = false;
        // Large recalls leave their queries in the client's slot when the engine takes them
        // (cosine ones are then normalised by whoever reads them: SlotQueries::cosine_dim).
        let slot_queries = self.engine.takes_slot_queries();
        for i in 0..seg.slot_count() {
            let slot = seg.slot(i);
            let w = slot.state.load(Ordering::Acquire);
            if shm::state_of(w) != shm::SLOT_SUBMITTED {
                continue;
            }
            let p = shm::with_state(w, shm::SLOT_PROCESSING);
            if slot.state.compare_exchange(w, p, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            let len = (slot.req_len.load(Ordering::Acquire) as usize).min(seg.data_bytes());
            if len >= MIRROR_MIN_BYTES && slot_queries {
                // A large recall for an engine that copies queries from the slot itself (the CUDA
                // engine, by DMA, checking them on the device): only the header is copied here.
                let mut buf = self.free_bufs.pop().unwrap_or_default();
                seg.read_data(i, &mut buf, RECALL_HEADER_MAX);
                if buf.get(..4).is_some_and(|b| u32::from_le_bytes(b.try_into().unwrap()) == OP_RECALL) {
                    self.batch.push(Pending { slot: i, word: p, req: buf, ext: None, slot_len: Some(len) });
                    continue;
                }
                self.free_bufs.push(buf);
            }
            if let Some(m) = self.mirror.as_mut().filter(|_| len >= MIRROR_MIN_BYTES && !self.mirror_used) {
                self.mirror_used = true;
                let dst = &mut m[..len];
                seg.copy_data(i, dst);
                self.batch.push(Pending { slot: i, word: p, req: Vec::new(), ext: Some((dst.as_ptr(), len)), slot_len: None });
                continue;
            }
            let mut buf = self.free_bufs.pop().unwrap_or_default();
            seg.read_data(i, &mut buf, len);
            self.batch.push(Pending { slot: i, word: p, req: buf, ext: None, slot_len: None });
        }
        self.queue_depth = self.batch.len() as u64;
        self.batch.len()
    }

    fn process_batch(&mut self) {
        let t0 = Instant::now();
        let batch = std::mem::take(&mut self.batch);
        self.batches += 1;
        let mut results: Vec<Option<Reply>> = vec![None; batch.len()];
        // 1. Writes, in slot order; one log commit for all of them.
        let mut wrote = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            if let op @ (OP_UPSERT | OP_DELETE | OP_DELETE_NS | OP_CLEAR) = p.op() {
                let r = self.do_write(op, p.body());
                if r.is_ok() {
                    wrote.push(i);
                }
                results[i] = Some(encode_result(r));
            }
        }
        if !wrote.is_empty() {
            if let Some(pst) = self.persist.as_mut() {
                if let Err(e) = pst.commit() {
                    for &i in &wrote {
                        results[i] = Some(Reply::Body(e.status, format!("write applied but not made durable: {}", e.message).into_bytes()));
                    }
                }
            }
            let dirty = self.store.take_dirty();
            if let Err(e) = self.engine.sync(&self.store, &dirty) {
                self.engine_failed(e);
            }
        }
        // 2. Reads: recalls grouped by (filter, recency) into single engine calls.
        self.do_recalls(&batch, &mut results);
        for (i, p) in batch.iter().enumerate() {
            if results[i].is_none() {
                let r = match p.op() {
                    OP_GET => self.do_get(p.body()),
                    OP_STATS => self.do_stats(),
                    op => Err(Error::new(Status::InvalidArgument, format!("unknown request op {op}"))),
                };
                results[i] = Some(encode_result(r));
            }
        }
        // 3. Publish.
        let elapsed = t0.elapsed().as_nanos() as u64;
        for (p, r) in batch.into_iter().zip(results) {
            let r = r.unwrap_or_else(|| Reply::Body(Status::Internal, b"no result".to_vec()));
            let st = match &r {
                Reply::Body(st, _) => *st,
                Reply::InSlot(_) => Status::Ok,
            };
            self.requests += 1;
            if st != Status::Ok {
                self.errors += 1;
            }
            // The p50/p99 in stats describe recalls (what clients wait on); writes and stats
            // requests would otherwise dominate after a bulk load.
            if p.op() == OP_RECALL {
                self.record_latency(elapsed);
            }
            match r {
                Reply::Body(st, body) => self.publish(p.slot, p.word, st, &body),
                Reply::InSlot(len) => self.finish(p.slot, p.word, Status::Ok, len),
            }
            let mut buf = p.req;
            buf.clear();
            // (A request copied into the mirror leaves an empty vector: nothing to pool.)
            if buf.capacity() > 0 && self.free_bufs.len() < 256 {
                self.free_bufs.push(buf);
            }
        }
    }

    fn record_latency(&mut self, ns: u64) {
        if self.latencies.len() < LATENCY_RING {
            self.latencies.push(ns);
        } else {
            self.latencies[self.lat_pos] = ns;
        }
        self.lat_pos = (self.lat_pos + 1) % LATENCY_RING;
    }

    fn publish(&self, slot_i: usize, word: u64, status: Status, body: &[u8]) {
        let slot = self.seg.slot(slot_i);
        let (status, body): (Status, std::borrow::Cow<[u8]>) = if body.len() > self.seg.data_bytes() {
            (Status::TooLarge, too_large(body.len(), self.seg.data_bytes()).into())
        } else {
            (status, body.into())
        };
        // Only write into the slot while it is still this request's (the client may have
        // abandoned it; a reclaimed slot may belong to someone else now).
        if slot.state.load(Ordering::Acquire) != word {
            self.release_abandoned(slot_i, word);
            return;
        }
        self.seg.write_data(slot_i, 0, &body);
        self.finish(slot_i, word, status, body.len());
    }

    /// Publishes the response whose `len`-byte body is already in the slot's data area (written
    /// by `publish`, or by the engine itself) and wakes the client if it sleeps. A slot the
    /// client abandoned meanwhile is released instead.
    fn finish(&self, slot_i: usize, word: u64, status: Status, len: usize) {
        let slot = self.seg.slot(slot_i);
        slot.resp_len.store(len as u32, Ordering::Relaxed);
        slot.status.store(status as u32, Ordering::Relaxed);
        let done = shm::with_state(word, shm::SLOT_DONE);
        if slot.state.compare_exchange(word, done, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            self.release_abandoned(slot_i, word);
            return;
        }
        if slot.waiting.swap(0, Ordering::SeqCst) != 0 {
            futex::wake(shm::low_word(&slot.state), i32::MAX);
            self.woke_client.set(true);
        }
    }

    fn release_abandoned(&self, slot_i: usize, word: u64) {
        let slot = self.seg.slot(slot_i);
        let ab = shm::with_state(word, shm::SLOT_ABANDONED);
        let _ = slot.state.compare_exchange(ab, shm::pack(0, shm::gen_of(word), shm::SLOT_FREE), Ordering::AcqRel, Ordering::Relaxed);
    }

    fn fail_all_pending(&mut self, status: Status) {
        let msg: &[u8] = if status == Status::Panic { b"the server thread panicked and stopped" } else { b"the server shut down" };
        let batch = std::mem::take(&mut self.batch);
        for p in batch {
            self.publish(p.slot, p.word, status, msg);
        }
        // Requests submitted but never taken: answer them too, and wake every sleeper.
        let seg = self.seg.clone();
        for i in 0..seg.slot_count() {
            let slot = seg.slot(i);
            let w = slot.state.load(Ordering::Acquire);
            if shm::state_of(w) == shm::SLOT_SUBMITTED {
                let p = shm::with_state(w, shm::SLOT_PROCESSING);
                if slot.state.compare_exchange(w, p, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    self.publish(i, p, status, msg);
                }
            }
            futex::wake(shm::low_word(&slot.state), i32::MAX);
        }
    }

    fn engine_failed(&mut self, e: Error) {
        // The GPU engine failed: serve from the CPU from now on and say so in stats.
        if self.engine.kind() != EngineKind::Cpu {
            eprintln!("kalos: engine {} failed ({e}); falling back to the CPU engine", self.engine.describe());
            self.fallbacks += 1;
            self.fallback_reason = format!("the CUDA engine failed while serving: {e}");
            let mut cpu: Box<dyn Engine> = Box::new(CpuEngine::for_server(self.opts.threads as usize, self.opts.server_spin_ns));
            let _ = cpu.sync(&self.store, &[]);
            self.engine = cpu;
        }
    }

    fn housekeeping(&mut self) {
        let seg = self.seg.clone();
        seg.header().heartbeat_ms.store(shm::monotonic_ms(), Ordering::Relaxed);
        // Reclaim slots of dead clients.
        for i in 0..seg.slot_count() {
            let slot = seg.slot(i);
            let w = slot.state.load(Ordering::Acquire);
            let st = shm::state_of(w);
            if !(st == shm::SLOT_CLAIMED || st == shm::SLOT_SUBMITTED || st == shm::SLOT_DONE) {
                continue;
            }
            let pid = shm::pid_of(w);
            let ticks = slot.client_start_ticks.load(Ordering::Relaxed);
            if !shm::process_alive(pid, ticks)
                && slot.state.compare_exchange(w, shm::pack(0, shm::gen_of(w), shm::SLOT_FREE), Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                slot.client_start_ticks.store(0, Ordering::Relaxed);
            }
        }
        // Expired memories: never returned by the scan; their space is reclaimed here.
        let purged = self.store.purge_expired(now_unix_ms());
        if !purged.is_empty() {
            let dirty = self.store.take_dirty();
            if let Err(e) = self.engine.sync(&self.store, &dirty) {
                self.engine_failed(e);
            }
        }
        if let Some(p) = self.persist.as_mut() {
            if let Err(e) = p.tick(&self.store) {
                eprintln!("kalos: persistence housekeeping failed: {e}");
            }
        }
    }

    fn do_write(&mut self, op: u32, body: &[u8]) -> Result<Vec<u8>> {
        let mut r = Reader::new(body);
        let mut w = Writer::new();
        match op {
            OP_UPSERT => {
                let n = r.u32("count")? as usize;
                if n == 0 || n > body.len() {
                    return Err(Error::new(Status::InvalidArgument, format!("upsert of {n} items is malformed")));
                }
                let ns_mode = r.u32("namespace mode")?;
                let ttl_ms = r.u64("ttl")?;
                let expires_abs = r.u64("expiry")?;
                let namespaces = match ns_mode {
                    0 => vec![r.u64("namespace")?; n],
                    1 => r.u64s(n, "namespaces")?,
                    m => return Err(Error::new(Status::InvalidArgument, format!("unknown namespace mode {m}"))),
                };
                let ids = r.u64s(n, "ids")?;
                let vectors =
                    r.f32s(n.checked_mul(self.dim).ok_or_else(|| Error::new(Status::InvalidArgument, "size overflow"))?, "vectors")?;
                let has_p = r.u32("payload flag")?;
                let mut payloads: Vec<Option<&[u8]>> = vec![None; n];
                if has_p == 1 {
                    let lens = r.u32s(n, "payload lengths")?;
                    for (i, &l) in lens.iter().enumerate() {
                        if l != NONE_U32 {
                            payloads[i] = Some(r.take(l as usize, "payload")?);
                        }
                    }
                } else if has_p != 0 {
                    return Err(Error::new(Status::InvalidArgument, "bad payload flag"));
                }
                if r.remaining() != 0 {
                    return Err(Error::new(Status::InvalidArgument, format!("upsert carries {} trailing bytes", r.remaining())));
                }
                let now = now_unix_ms();
                let mut expires = expires_abs;
                if expires != NEVER && expires <= now {
                    return Err(Error::new(Status::InvalidArgument, format!("expiry {expires} (unix ms) is in the past")));
                }
                if ttl_ms > 0 {
                    expires = expires.min(now.saturating_add(ttl_ms));
                }
                let items: Vec<UpsertItem> = (0..n)
                    .map(|i| UpsertItem {
                        id: ids[i],
                        namespace: namespaces[i],
                        vector: &vectors[i * self.dim..(i + 1) * self.dim],
                        payload: payloads[i],
                        created_ms: now,
                        expires_ms: expires,
                    })
                    .collect();
                self.store.validate_upsert(&items)?;
                let new_rows = items.iter().filter(|it| self.store.row_of(it.id).is_none()).count();
                if let Err(e) = self.engine.reserve(self.store.len() + new_rows) {
                    if e.status == Status::StoreFull {
                        return Err(e); // out of GPU memory: the write is refused, nothing changed
                    }
                    self.engine_failed(e);
                }
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::Upsert(&items))?;
                }
                self.store.apply_upsert(&items);
            }
            OP_DELETE => {
                let n = r.u32("count")? as usize;
                let ids = r.u64s(n, "ids")?;
                self.store.check_ids_exist(&ids)?;
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::Delete(&ids))?;
                }
                let d = self.store.delete(&ids)?;
                w.u64(d as u64);
            }
            OP_DELETE_NS => {
                let ns = r.u64("namespace")?;
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::DeleteNamespace(ns))?;
                }
                w.u64(self.store.delete_namespace(ns) as u64);
            }
            OP_CLEAR => {
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::Clear)?;
                }
                let n = self.store.len();
                self.store.clear();
                w.u64(n as u64);
            }
            _ => unreachable!(),
        }
        Ok(w.buf)
    }

    fn do_get(&self, body: &[u8]) -> Result<Vec<u8>> {
        let mut r = Reader::new(body);
        let n = r.u32("count")? as usize;
        let ids = r.u64s(n, "ids")?;
        self.store.check_ids_exist(&ids)?;
        // An expired memory is gone for readers even before housekeeping reclaims its row.
        let now = now_unix_ms();
        for &id in &ids {
            let row = self.store.row_of(id).expect("checked");
            if self.store.expires_ms()[row] <= now {
                return Err(Error::new(Status::NotFound, format!("id {id} has expired")));
            }
        }
        let mut w = Writer::new();
        for id in ids {
            let rec = self.store.get(id).expect("checked");
            w.u64(rec.namespace).u64(rec.created_ms).u64(rec.expires_ms).f32s(&rec.vector);
            match &rec.payload {
                Some(p) => w.u32(p.len() as u32).bytes(p),
                None => w.u32(NONE_U32),
            };
        }
        Ok(w.buf)
    }

    fn do_stats(&self) -> Result<Vec<u8>> {
        let mut lat = self.latencies.clone();
        lat.sort_unstable();
        let pct = |p: f64| if lat.is_empty() { 0 } else { lat[((lat.len() - 1) as f64 * p).round() as usize] };
        let h = self.seg.header();
        let s = Stats {
            count: self.store.len() as u64,
            capacity: self.store.capacity() as u64,
            dim: self.dim as u64,
            metric: self.metric as u64,
            dtype: self.opts.dtype as u64,
            engine: self.engine.kind() as u64,
            requests: self.requests,
            queries: self.queries,
            batches: self.batches,
            errors: self.errors,
            p50_ns: pct(0.5),
            p99_ns: pct(0.99),
            queue_depth: self.queue_depth,
            server_pid: h.server_pid.load(Ordering::Relaxed) as u64,
            epoch: h.epoch.load(Ordering::Relaxed),
            payload_bytes: self.store.payload_bytes() as u64,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            engine_fallbacks: self.fallbacks,
            engine_name: self.engine.describe(),
            fallback_reason: self.fallback_reason.clone(),
        };
        let mut w = Writer::new();
        s.encode(&mut w);
        Ok(w.buf)
    }

    /// Parses every recall in the batch, groups them by (filter, recency) and runs each group as
    /// one engine call with the group's largest k.
    fn do_recalls(&mut self, batch: &[Pending], results: &mut [Option<Reply>]) {
        struct Group<'a> {
            filter: Filter,
            recency: Option<Recency>,
            // A lone request's queries are read in place from its (private) request copy.
            queries: Cow<'a, [f32]>,
            /// Or, for a large ip/l2 batch, left in the client's slot (`queries` is then empty).
            slot: Option<SlotQueries>,
            jobs: Vec<RecallJob>,
            k: usize,
        }
        type Key = (Option<Vec<u64>>, u32, u64);
        let mut groups: Vec<Group<'_>> = Vec::new();
        // The first group's key is kept aside: a lone recall (the latency path) never hashes.
        let mut first_key: Option<Key> = None;
        let mut keymap: HashMap<Key, usize> = HashMap::new();
        for (i, p) in batch.iter().enumerate() {
            if p.op() != OP_RECALL {
                continue;
            }
            #[allow(clippy::type_complexity)] // one parse of a recall's fields, used once below
            let parsed = (|| -> Result<(usize, usize, u32, Filter, Option<Recency>, Cow<'_, [f32]>, Option<SlotQueries>)> {
                let mut r = Reader::new(p.body());
                let k = r.u32("k")? as usize;
                check_k(k)?;
                let nq = r.u32("nq")? as usize;
                if nq == 0 {
                    return Err(Error::new(Status::InvalidArgument, "recall of zero queries"));
                }
                let flags = r.u32("flags")?;
                if flags & !FLAG_PAYLOADS != 0 {
                    return Err(Error::new(Status::InvalidArgument, format!("unknown recall flags {flags:#x}")));
                }
                let nns = r.u32("namespace count")?;
                let w = r.f32("recency weight")?;
                let hl = r.f64("half life")?;
                let filter = if nns == NONE_U32 { Filter::all() } else { Filter::new(&r.u64s(nns as usize, "namespaces")?)? };
                let recency = if w == 0.0 {
                    None
                } else {
                    if !(w.is_finite() && w > 0.0 && w <= 1.0 && hl.is_finite() && hl > 0.0) {
                        return Err(Error::new(Status::InvalidArgument, format!("recency weight {w} / half-life {hl} out of range")));
                    }
                    if self.metric == Metric::L2 {
                        return Err(Error::new(Status::InvalidArgument, "recency weighting applies to ip and cosine stores, not l2"));
                    }
                    Some(Recency { weight: w, half_life_ms: hl })
                };
                let nvals = nq.checked_mul(self.dim).ok_or_else(|| Error::new(Status::InvalidArgument, "size overflow"))?;
                // Query bytes: the rest of the private copy, or of the slot for queries left there.
                let head = p.body().len() - r.remaining();
                let qbytes = p.slot_len.map_or(r.remaining(), |len| len - 4 - head);
                if qbytes != nvals * 4 {
                    return Err(Error::new(
                        Status::DimensionMismatch,
                        format!("recall carries {qbytes} query bytes; {nq} queries of dimension {} need {}", self.dim, nvals * 4),
                    ));
                }
                if p.slot_len.is_some() {
                    // SAFETY: 4 + head + qbytes == slot_len <= the slot's data size (collect
                    // clamps it), so the range lies in slot p.slot's data area; only its address
                    // is taken here (SlotQueries reads it by DMA or by a private copy).
                    let ptr = unsafe { self.seg.slot_data(p.slot).add(4 + head) } as *const u8;
                    return Ok((
                        k,
                        nq,
                        flags,
                        filter,
                        recency,
                        Cow::Borrowed(&[][..]),
                        Some(SlotQueries { ptr, len: nvals, cosine_dim: if self.metric == Metric::Cosine { self.dim } else { 0 } }),
                    ));
                }
                let mut q = r.f32s_cow(nvals, "queries")?;
                check_finite(&q, "query")?;
                if self.metric == Metric::Cosine {
                    normalize_queries(q.to_mut(), self.dim)?;
                }
                Ok((k, nq, flags, filter, recency, q, None))
            })();
            match parsed {
                Err(e) => results[i] = Some(Reply::Body(e.status, e.message.into_bytes())),
                Ok((k, nq, flags, filter, recency, _, Some(sq))) => {
                    // Queries left in the slot: a group of their own (nothing can be appended).
                    groups.push(Group { filter, recency, queries: Cow::Borrowed(&[]), slot: Some(sq), jobs: Vec::new(), k });
                    groups.last_mut().unwrap().jobs.push(RecallJob { idx: i, k, nq, flags, q_off: 0 });
                }
                Ok((k, nq, flags, filter, recency, q, None)) => {
                    let key = (
                        filter.namespaces.clone(),
                        recency.map_or(0, |r| r.weight.to_bits()),
                        recency.map_or(0, |r| r.half_life_ms.to_bits()),
                    );
                    let gi = if groups.is_empty() {
                        first_key = Some(key);
                        groups.push(Group { filter, recency, queries: Cow::Borrowed(&[]), slot: None, jobs: Vec::new(), k: 0 });
                        0
                    } else {
                        if let Some(fk) = first_key.take() {
                            keymap.insert(fk, 0);
                        }
                        *keymap.entry(key).or_insert_with(|| {
                            groups.push(Group { filter, recency, queries: Cow::Borrowed(&[]), slot: None, jobs: Vec::new(), k: 0 });
                            groups.len() - 1
                        })
                    };
                    let g = &mut groups[gi];
                    let q_off = g.queries.len() / self.dim;
                    if g.queries.is_empty() {
                        g.queries = q; // a lone (or first) request's queries: no copy
                    } else {
                        g.queries.to_mut().extend_from_slice(&q);
                    }
                    g.k = g.k.max(k);
                    g.jobs.push(RecallJob { idx: i, k, nq, flags, q_off });
                }
            }
        }
        let now = now_unix_ms();
        // Result vectors are kept in the server between batches so the engine reuses them.
        let mut out: Vec<Vec<Hit>> = std::mem::take(&mut self.search_out);
        for g in groups {
            let nq = g.slot.map_or(g.queries.len(), |sq| sq.len) / self.dim;
            // A lone single query without payloads: the engine may write the response body into
            // the client's slot itself (the slot stays this request's until it is published or,
            // if abandoned, released by this thread).
            let dout = match g.jobs.as_slice() {
                [j] if j.nq == 1 && j.flags & FLAG_PAYLOADS == 0 => Some(DirectOut {
                    host: self.seg.slot_data(batch[j.idx].slot),
                    cap: self.seg.data_bytes(),
                    written: std::cell::Cell::new(0),
                }),
                _ => None,
            };
            let req = SearchRequest {
                queries: &g.queries,
                nq,
                k: g.k,
                filter: &g.filter,
                recency: g.recency,
                now_ms: now,
                direct: dout.as_ref(),
                slot: g.slot,
            };
            let mut r = self.engine.search(&self.store, &req, &mut out);
            if let Err(e) = &r {
                // A request error (slot queries the engine found bad on the device: NaN, an
                // all-zero cosine query) is the request's; the engine is fine.
                if self.engine.kind() != EngineKind::Cpu && !e.status.is_request_error() {
                    self.engine_failed(e.clone());
                    r = self.engine.search(&self.store, &req, &mut out);
                }
            }
            self.queries += nq as u64;
            if let (Ok(()), Some(d), [j]) = (&r, &dout, g.jobs.as_slice()) {
                if d.written.get() > 0 {
                    results[j.idx] = Some(Reply::InSlot(d.written.get()));
                    continue;
                }
            }
            for job in g.jobs {
                results[job.idx] = Some(match &r {
                    Err(e) => Reply::Body(e.status, e.message.clone().into_bytes()),
                    // Without payloads the body goes straight into the request's slot (the
                    // server thread owns it until it publishes or releases it, as for
                    // `DirectOut`): no encoding buffer, no copy of it into the slot.
                    Ok(()) if job.flags & FLAG_PAYLOADS == 0 => {
                        let lists = out[job.q_off..job.q_off + job.nq].iter().map(|h| &h[..h.len().min(job.k)]);
                        // SAFETY: the data area of the request's own slot, data_bytes long, which
                        // the server thread owns until it publishes or releases it (a client that
                        // gave up only marks it abandoned).
                        match unsafe { write_recall_body(self.seg.slot_data(batch[job.idx].slot), self.seg.data_bytes(), lists) } {
                            Ok(len) => Reply::InSlot(len),
                            Err(len) => Reply::Body(Status::TooLarge, too_large(len, self.seg.data_bytes())),
                        }
                    }
                    Ok(()) => {
                        let w = &mut self.resp;
                        w.clear();
                        let hits = &out[job.q_off..job.q_off + job.nq];
                        // Each query's first k hits (the group ran with its largest k), in order.
                        let kept = || hits.iter().flat_map(|h| &h[..h.len().min(job.k)]);
                        for h in hits {
                            w.u32(h.len().min(job.k) as u32);
                        }
                        for x in kept() {
                            w.u64(x.id);
                        }
                        for x in kept() {
                            w.f32(x.score);
                        }
                        if job.flags & FLAG_PAYLOADS != 0 {
                            let payloads: Vec<Option<&[u8]>> =
                                kept().map(|x| self.store.row_of(x.id).and_then(|row| self.store.payload_at(row))).collect();
                            for p in &payloads {
                                w.u32(p.map_or(NONE_U32, |b| b.len() as u32));
                            }
                            for b in payloads.iter().flatten() {
                                w.bytes(b);
                            }
                        }
                        Reply::Body(Status::Ok, w.buf.clone())
                    }
                });
            }
        }
        self.search_out = out;
    }
}

/// The TOO_LARGE message for a response of `len` bytes.
fn too_large(len: usize, cap: usize) -> Vec<u8> {
    format!("response of {len} bytes exceeds the slot size of {cap} bytes (option slot_bytes)").into_bytes()
}

/// A request's answer: a body to copy into the slot, or the length of one already written
/// there (by an engine for a lone recall, `SearchRequest::direct`, or by `do_recalls`).
#[derive(Clone)]
enum Reply {
    Body(Status, Vec<u8>),
    InSlot(usize),
}

fn encode_result(r: Result<Vec<u8>>) -> Reply {
    match r {
        Ok(b) => Reply::Body(Status::Ok, b),
        Err(e) => Reply::Body(e.status, e.message.into_bytes()),
    }
}

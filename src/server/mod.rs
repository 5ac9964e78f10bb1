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
//!
//! - this file: [`start`], [`ServerHandle`], option checks, the server's state.
//! - `serve`: the loop: collecting a batch, running it, parking, housekeeping.
//! - `gather`: how long to wait for more concurrent requests before running a batch.
//! - `write`: upsert, delete, clear and the batch's group commit.
//! - `recall`: parsing recalls, grouping them into engine calls, their responses.
//! - `get` (also LIST), `stats`: the other reads; `stats` also keeps the counters.
//! - `publish`: writing responses into slots and waking clients.
//! - `report`: `KALOS_SERVER_REPORT`, where the passes' time went.
//!
//! Requests and responses are encoded and decoded by [`crate::wire`]; the engine is chosen, and
//! replaced when the CUDA engine fails, by [`crate::engine::router`].
//!
//! [`start`]: crate::server::start
//! [`ServerHandle`]: crate::server::ServerHandle

mod cluster;
mod gather;
mod get;
mod publish;
mod recall;
mod report;
mod serve;
mod stats;
mod write;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::config::Options;
use crate::engine::router::{resolve_backend, Router};
use crate::engine::Engine;
use crate::error::{Error, Result, Status};
use crate::persist::{Persist, PersistOptions};
use crate::shm::{self, futex, Geometry, Segment, ServerLock};
use crate::store::Store;
use crate::types::{now_unix_ms, validate_name, Backend, Hit, Metric, MAX_DIM, MAX_K};
use crate::wire::request::{upsert_item_bytes, vector_bytes, HEAD_RESERVE};
use crate::wire::response::record_bytes;
use crate::wire::Writer;
pub use cluster::{Cluster, SlotReply};
use serve::{Pending, MIRROR_MIN_BYTES};
use stats::Metrics;

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
    let min_slot = vector_bytes(o.dim as usize) + HEAD_RESERVE;
    if (o.slot_bytes as usize) < min_slot {
        return bad(format!("slot_bytes = {} cannot hold one query of dimension {} ({min_slot} bytes)", o.slot_bytes, o.dim));
    }
    if o.rerank > crate::config::MAX_RERANK {
        return bad(format!("rerank = {}; must be at most {} (0 = adapt to k)", o.rerank, crate::config::MAX_RERANK));
    }
    if o.device_shards > crate::config::MAX_DEVICE_SHARDS {
        return bad(format!("device_shards = {}; must be at most {} (0 = one table)", o.device_shards, crate::config::MAX_DEVICE_SHARDS));
    }
    if o.mode & !0o777 != 0 || o.mode & 0o600 != 0o600 {
        return bad(format!("mode {:o} must be permission bits that include 0600", o.mode));
    }
    if o.max_payload_bytes as usize > o.slot_bytes as usize / 2 {
        return bad(format!("max_payload_bytes = {} must be at most half of slot_bytes ({})", o.max_payload_bytes, o.slot_bytes));
    }
    // One memory with the largest payload must fit a slot both ways: as an upsert, and as the
    // record a get returns.
    let (dim, payload) = (o.dim as usize, o.max_payload_bytes as usize);
    let one = (upsert_item_bytes(dim) + payload).max(record_bytes(dim, payload)) + HEAD_RESERVE;
    if one > o.slot_bytes as usize {
        return bad(format!(
            "slot_bytes = {} cannot hold one memory of dimension {dim} with a payload of max_payload_bytes = {payload} ({one} bytes): raise slot_bytes or lower max_payload_bytes",
            o.slot_bytes
        ));
    }
    Ok(())
}

/// Starts a server for `name`: takes the name's lock, recovers the data directory, creates the
/// segment and starts the server thread, returning once the thread serves.
pub fn start(name: &str, opts: &Options) -> Result<(Arc<Segment>, ServerHandle)> {
    start_with(name, opts, None)
}

/// [`start`], in cluster mode when `cluster` is given (`cluster.rs`).
pub fn start_with(name: &str, opts: &Options, cluster: Option<Arc<dyn Cluster>>) -> Result<(Arc<Segment>, ServerHandle)> {
    validate_name(name)?;
    validate_options(opts)?;
    let backend = resolve_backend(opts.backend)?;
    let lock = ServerLock::try_acquire(name, opts.mode)?.ok_or_else(|| {
        Error::new(
            Status::AlreadyExists,
            format!("a live server already owns store {name:?}: {}", shm::describe_holder(&format!("{}.lock", shm::shm_name(name)))),
        )
    })?;
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
            .spawn(move || server_main(seg, stop, opts, backend, store, persist, cluster, tx))
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

#[allow(clippy::too_many_arguments)] // what the thread takes over from `start_with`, one value each
fn server_main(
    seg: Arc<Segment>,
    stop: Arc<AtomicBool>,
    opts: Options,
    backend: Backend,
    store: Store,
    persist: Option<Persist>,
    cluster: Option<Arc<dyn Cluster>>,
    ready: mpsc::Sender<Result<()>>,
) {
    let h = seg.header();
    // The engine is created on this thread: a CUDA context is bound to the thread that uses it.
    let (engine, router) = match catch_unwind(AssertUnwindSafe(|| Router::start(backend, &opts, &store))) {
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
    let mut srv = Server::new(seg.clone(), opts, store, engine, router, persist);
    srv.cluster = cluster;
    if let Err(e) = srv.initial_sync().and_then(|()| srv.attach_cluster()) {
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

/// The server thread's state. Each concern's methods are in the submodule named for it.
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
    /// Request counters and recent recall latencies, for stats.
    metrics: Metrics,
    /// Replaces a failing CUDA engine with the CPU engine, and says why in stats.
    router: Router,
    /// The gathering window for concurrent requests.
    gather: gather::Gather,
    /// `KALOS_SERVER_REPORT`: the passes' phases, printed when the server stops.
    report: Option<report::PassReport>,
    /// Cluster mode: the replicated log and the other hosts (`cluster.rs`).
    cluster: Option<Arc<dyn Cluster>>,
    /// Cluster mode: per shard, the last log sequence applied to the table.
    applied: Vec<u64>,
    /// `applied` as of the last checkpoint written to the data directory.
    checkpointed: Vec<u64>,
}

impl Server {
    fn new(
        seg: Arc<Segment>,
        opts: Options,
        store: Store,
        mut engine: Box<dyn Engine>,
        router: Router,
        persist: Option<Persist>,
    ) -> Server {
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
            metrics: Metrics::new(),
            router,
            gather: gather::Gather::new(crate::config::tuning_or_default().gather_us.unwrap_or(gather::DEFAULT_GATHER_US)),
            report: report::PassReport::from_tuning(),
            cluster: None,
            applied: Vec::new(),
            checkpointed: Vec::new(),
        }
    }

    fn initial_sync(&mut self) -> Result<()> {
        let dirty: Vec<u32> = (0..self.store.len() as u32).collect();
        self.store.take_dirty();
        self.engine.sync(&self.store, &dirty)
    }

    /// The engine failed: the router replaces a GPU engine with the CPU engine.
    fn engine_failed(&mut self, e: Error) {
        self.router.engine_failed(&mut self.engine, &self.store, e);
    }
}

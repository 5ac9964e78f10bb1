//! The client side: opening a store (any role), and every request as a slot round trip.
//!
//! Wait strategy: after submitting, a client spins for `client_spin_ns` (bounded), then sleeps
//! in a shared futex wait on its slot's state word in steps of at most 20 ms, checking the
//! server's liveness and its own deadline between steps. Nothing blocks without a deadline.
//! When the handle's recent answers took longer than `client_spin_ns` (a GPU search of a large
//! table), the spin window stretches to twice the recent answer time, at most
//! [`ADAPTIVE_SPIN_CAP`]: a futex wake-up costs ~10 µs, which a 60 µs request should not pay.
//! `client_spin_ns = 0` still means "sleep at once".
//!
//! - this file: [`Kalos`] (open, attach, roles, close) and the per-call option types.
//! - `slot`: one request/response round trip: claiming a slot, waiting, deadlines, abandoning.
//! - `recall`: the recall calls (one query, with payloads, batches).
//! - `ops`: upsert, delete, clear, get and stats.
//!
//! Requests are encoded and responses parsed by [`crate::wire`].
//!
//! Store lifetime (role auto). A store opened with role auto is durable unless the caller asks
//! for an ephemeral one: without a `data_dir` it lives in [`crate::config::default_data_dir`].
//! When the process that runs its server exits (or its server stops or dies), the other
//! processes' auto handles take over: the first call that finds the server gone re-runs the
//! auto open with the store's geometry, so one survivor wins the server election and recovers
//! the store from its files, and the others attach to it. A call whose request had not reached
//! the old server is then sent to the new one; a call whose request the old server may have
//! run reports `SERVER_GONE` (its effect is unknown), and the handle's later calls go to the
//! new server. No child process is started: a JVM, Go or Python service keeps its own process
//! tree, and a store that must outlive every client runs under `kalosd`. Role server keeps its
//! meaning: the store lives in the calling process until it closes. Role client never takes
//! over. An ephemeral auto store has no files to take over from: when its server goes, its
//! clients get `SERVER_GONE`.
//!
//! [`ADAPTIVE_SPIN_CAP`]: crate::config::ADAPTIVE_SPIN_CAP

mod ops;
mod recall;
mod slot;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Status};
use crate::server::{self, ServerHandle};
use crate::shm::{self, Segment};
use crate::store::NEVER;
use crate::types::{validate_name, Dtype, Metric, Recency, Role};

pub use crate::config::{Options, ADAPTIVE_SPIN_CAP};
pub use crate::wire::request::Namespaces;

/// Per-call recall options.
#[derive(Debug, Clone, Default)]
pub struct RecallOptions {
    /// `None` = all namespaces; otherwise at most 64.
    pub namespaces: Option<Vec<u64>>,
    pub recency: Option<Recency>,
    /// A metadata filter expression in its binary form ([`crate::filter::Expr::encode`]).
    pub filter: Option<Vec<u8>>,
    /// Overrides the handle's default deadline.
    pub timeout_ms: Option<u64>,
    /// Cluster mode: wait (up to the deadline) until the replica that answers has applied this
    /// handle's last acknowledged writes ([`Kalos::write_seqs`]).
    pub read_your_writes: bool,
    /// Cluster mode: per shard, a log sequence the answering replica must have applied first
    /// (e.g. another handle's [`Kalos::write_seqs`]); 0 = none.
    pub min_seqs: Option<Vec<u64>>,
    /// Cluster mode: a replica that may be behind its log may answer; the reply says how far
    /// behind ([`Kalos::recall_lag`]). Without it such a recall fails with `Stale`.
    pub allow_stale: bool,
}

/// How far behind its log the replica that answered a stale-read recall was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lag {
    /// Log entries known to be in the shard's stream and not applied (the largest over the
    /// shards the recall read).
    pub entries: u64,
    /// Milliseconds since the replica last heard from the log; 0 while connected.
    pub ms: u64,
}

/// What [`Kalos::list`] lists: the live memories in one of `namespaces` (all when None) that
/// match `filter` (all when None), with ids greater than `after` (from the smallest when None).
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// `None` = all namespaces; otherwise at most 64.
    pub namespaces: Option<Vec<u64>>,
    /// A metadata filter expression in its binary form ([`crate::filter::Expr::encode`]).
    pub filter: Option<Vec<u8>>,
    /// The cursor: list ids strictly greater than this one.
    pub after: Option<u64>,
    /// Overrides the handle's default deadline (of each request).
    pub timeout_ms: Option<u64>,
}

/// Per-call upsert options.
#[derive(Debug, Clone)]
pub struct UpsertOptions<'a> {
    pub namespaces: Namespaces<'a>,
    /// One entry per item (`None` = no payload), or `None` for no payloads at all.
    pub payloads: Option<Vec<Option<&'a [u8]>>>,
    /// One entry per item (its metadata fields), or `None` for no fields at all.
    pub fields: Option<&'a [Vec<crate::meta::Field>]>,
    /// Time to live from now, in ms (0 = none).
    pub ttl_ms: u64,
    /// Absolute expiry in unix ms ([`NEVER`] = none). Must be in the future.
    pub expires_ms: u64,
    pub timeout_ms: Option<u64>,
}

impl Default for UpsertOptions<'_> {
    fn default() -> Self {
        UpsertOptions { namespaces: Namespaces::One(0), payloads: None, fields: None, ttl_ms: 0, expires_ms: NEVER, timeout_ms: None }
    }
}

/// A recall result with payloads.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadHit {
    pub id: u64,
    pub score: f32,
    pub payload: Option<Vec<u8>>,
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
    /// Smoothed deviation of those answer times from `recent_ns` (ns): widens the polling window
    /// around an expected answer (`slot::spin_plan`).
    jitter_ns: AtomicU64,
    /// Smoothed lateness of this handle's timed sleeps before polling (ns; the kernel's timer
    /// slack and the wake-up): starts that window earlier.
    oversleep_ns: AtomicU64,
    /// Role auto on a durable store: the options with which this handle takes over when the
    /// store's server goes away (the module's "Store lifetime"). `None`: it never does.
    takeover: Option<Options>,
    /// The handle that serves this one's calls after a takeover; `moved` is set once it is.
    successor: Mutex<Option<Arc<Kalos>>>,
    moved: AtomicBool,
    /// Cluster mode: per shard, the log sequence of this handle's last acknowledged write.
    seqs: Mutex<Vec<u64>>,
}

fn deadline_after(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms.min(365 * 24 * 3600 * 1000))
}

impl Kalos {
    /// Opens the store `name` in the role `opts.role` (see [`Role`]).
    /// Role auto without a `data_dir` keeps the store in [`crate::config::default_data_dir`]
    /// unless `opts.ephemeral` is set.
    pub fn open(name: &str, opts: &Options) -> Result<Kalos> {
        validate_name(name)?;
        // The environment's knobs are read here, once per process; a bad value fails the open.
        crate::config::tuning()?;
        if opts.role == Role::Auto && opts.data_dir.is_none() && !opts.ephemeral {
            let opts = Options { data_dir: Some(crate::config::default_data_dir(name)?), ..opts.clone() };
            return Self::open_role(name, &opts);
        }
        Self::open_role(name, opts)
    }

    /// Opens `name` with role server in cluster mode: the store holds the shards `cluster`
    /// says and logs every write there (docs/CLUSTER.md). kalosd's `serve --cluster` uses it.
    pub fn open_cluster_server(name: &str, opts: &Options, cluster: Arc<dyn server::Cluster>) -> Result<Kalos> {
        validate_name(name)?;
        crate::config::tuning()?;
        let opts = Options { role: Role::Server, ..opts.clone() };
        let (seg, srv) = server::start_with(name, &opts, Some(cluster))?;
        Ok(Self::from_segment(name, seg, Some(srv), &opts))
    }

    /// Cluster mode: per shard, the log sequence of this handle's last acknowledged write
    /// (empty before the first, and outside cluster mode). Pass it as
    /// [`RecallOptions::min_seqs`] to read these writes through another host.
    pub fn write_seqs(&self) -> Vec<u64> {
        self.seqs.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records the write token at `at` in a write's response (cluster mode).
    fn note_token(&self, resp: &[u8], at: usize) -> Result<()> {
        if let Some(t) = crate::wire::cluster::read_token(resp, at)? {
            let mut s = self.seqs.lock().unwrap_or_else(PoisonError::into_inner);
            for (shard, seq) in t {
                if s.len() <= shard as usize {
                    s.resize(shard as usize + 1, 0);
                }
                s[shard as usize] = s[shard as usize].max(seq);
            }
        }
        Ok(())
    }

    /// Sends a request as it is and returns the response body (the cluster layer's own
    /// requests; not a supported API).
    #[doc(hidden)]
    pub fn call_raw(&self, req: &[u8], timeout_ms: Option<u64>) -> Result<Vec<u8>> {
        self.call(req, timeout_ms, |r| Ok(r.to_vec()))
    }

    fn open_role(name: &str, opts: &Options) -> Result<Kalos> {
        let mut k = Self::open_once(name, opts)?;
        if opts.role == Role::Auto && opts.data_dir.is_some() {
            // A takeover recreates the segment the clients knew, whatever this caller asked for.
            let g = &k.seg.geometry;
            k.takeover = Some(Options {
                dim: g.dim,
                metric: k.metric,
                dtype: Dtype::from_u32(g.dtype).unwrap_or(opts.dtype),
                capacity: g.capacity,
                slots: g.slot_count,
                slot_bytes: g.slot_data_bytes,
                max_payload_bytes: g.max_payload,
                ..opts.clone()
            });
        }
        Ok(k)
    }

    fn open_once(name: &str, opts: &Options) -> Result<Kalos> {
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
                        // Another process won the election and is starting: attach to it. Or
                        // the previous server's process still holds the data directory while
                        // it exits: wait for it to let go.
                        Err(e) if matches!(e.status, Status::AlreadyExists | Status::Locked) && Instant::now() < deadline => {
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
            jitter_ns: AtomicU64::new(0),
            oversleep_ns: AtomicU64::new(slot::DEFAULT_TIMER_SLACK.as_nanos() as u64),
            closed: AtomicBool::new(false),
            takeover: None,
            successor: Mutex::new(None),
            moved: AtomicBool::new(false),
            seqs: Mutex::new(Vec::new()),
        }
    }

    /// The handle that took over this one's store, if a takeover happened.
    fn successor(&self) -> Option<Arc<Kalos>> {
        if !self.moved.load(Ordering::Acquire) {
            return None;
        }
        self.successor.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The store's server is gone: re-open the store with role auto from its files (becoming
    /// its server or attaching to the survivor that won the election). Called by every thread
    /// that saw the server go; the first one opens, the others get its handle.
    fn take_over(&self) -> Result<Arc<Kalos>> {
        let opts = self.takeover.as_ref().ok_or_else(|| Error::new(Status::Internal, "take_over on a handle that cannot"))?;
        let mut s = self.successor.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(k) = s.as_ref() {
            return Ok(k.clone());
        }
        self.check_open()?;
        let k = Arc::new(Self::open_role(&self.name, opts)?);
        *s = Some(k.clone());
        self.moved.store(true, Ordering::Release);
        Ok(k)
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
    /// True when this handle runs the server thread (after a takeover: the new one).
    pub fn is_server(&self) -> bool {
        if let Some(k) = self.successor() {
            return k.is_server();
        }
        self.server.lock().map(|s| s.is_some()).unwrap_or(false)
    }

    /// True when this handle takes over its store when the store's server goes away.
    pub fn takes_over(&self) -> bool {
        self.takeover.is_some()
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
        let next = self.successor.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(k) = next {
            k.close();
        }
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

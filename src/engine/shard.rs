//! Device shards (option `device_shards`): the table split into parts, each a table of its own
//! with its own engine on its own thread.
//!
//! Shape:
//! - The server keeps its one table ([`Store`]: the write-ahead log, `get`, payloads and the
//!   engine's fallback read it). Each shard keeps a [`Store`] of its own rows, without payloads,
//!   and an engine that serves from it. A shard's thread creates its engine, applies its share
//!   of every write and answers its part of every recall, so an engine bound to its thread (a
//!   CUDA context) never moves.
//! - [`Placement`] decides the shard of a memory: a hash of its id (balanced shards; every
//!   recall scans every shard) or of its namespace (a recall scoped to namespaces scans only the
//!   shards that hold them; one large namespace fills its shard alone). An upsert that changes a
//!   memory's namespace moves it between shards under namespace placement.
//! - Writes: [`Engine::sync`] receives the rows the server's table changed. The engine works out
//!   which ids are gone (the ids it last saw on those rows, and on rows past the end, that the
//!   table no longer holds) and which rows each shard must copy, then every shard applies its
//!   part in parallel and syncs its engine. Before an upsert, [`Engine::reserve_for`] asks each
//!   shard's engine for room for exactly the rows it will receive.
//! - Recall: every target shard runs the request on its own thread in parallel; the caller
//!   waits for all of them and merges their per-query top-k (best first, ties to the lower id,
//!   as every engine breaks them) into the exact global top-k. A shard that fails makes the
//!   recall fail: results are never partial. A shard whose table could not be brought up to
//!   date (an engine error or a panic during a write) breaks the sharded engine: every later
//!   recall fails with that error until the store is reopened.
//!
//! The hand-off to a shard's thread is a job pointer and an epoch (a futex word): the thread
//! busy-polls for `spin` after its last job, then sleeps. The caller waits until every target
//! shard has finished (so the job may borrow the caller's request): polling, yielding the core,
//! while the shard threads poll too; when they sleep between jobs (hosts with few cores) it
//! polls for `CALLER_SPIN`, then sleeps on the shard's `done` word, so it never holds a core
//! the shards need.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::pool::Bell;
use super::{key_to_score, reset_out, Engine, EngineKind, TopK};
use crate::error::{Error, Result, Status};
use crate::shm::futex;
use crate::store::{Store, UpsertItem};
use crate::types::{Hit, Metric, Placement};
use crate::wire::SearchRequest;

/// Builds shard `i`'s engine for its (empty) table, on that shard's thread.
pub type EngineFactory = dyn Fn(usize, &Store) -> Result<Box<dyn Engine>> + Send + Sync;

/// The shard of a memory: `key` (its id or namespace) hashed and mapped onto `shards`. The hash
/// differs from the cluster's namespace hash (`wire::cluster::shard_of`), so the namespaces of
/// one cluster shard still spread over a host's device shards.
pub fn shard_of_key(key: u64, shards: usize) -> usize {
    let mut z = key.wrapping_add(0x243f_6a88_85a3_08d3);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (((z >> 32) * shards as u64) >> 32) as usize
}

/// What a shard's thread owns. The caller reads it only between jobs.
struct Part {
    store: Store,
    engine: Option<Box<dyn Engine>>,
    /// The last search's hits, per query.
    out: Vec<Vec<Hit>>,
    /// The last job's outcome.
    result: Result<()>,
    /// The engine's int8-scan counts after its last search ([`Engine::rerank_counts`]).
    rerank: (u64, u64),
    describe: String,
}

type Job = dyn Fn(usize, &mut Part) + Sync;

struct Mailbox {
    /// Bumped once per job; the shard's thread sleeps on it.
    bell: Bell,
    /// Futex word: the epoch of the last job the thread finished; the caller may sleep on it.
    done: AtomicU32,
    /// The caller sleeps (or is about to) on `done`.
    waiting: AtomicBool,
    /// The current job; written by the caller only while the thread cannot read it (before the
    /// epoch that announces it is published, after the thread said it is done).
    job: UnsafeCell<Option<*const Job>>,
    part: UnsafeCell<Part>,
    spin: Duration,
}

// SAFETY: `job` and `part` are the non-Sync fields. The caller (the one `ShardedEngine`, through
// `&mut self`) writes `job` and reads `part` only while no job is running on the shard: before it
// publishes a new epoch (Release) and after it has seen `done` equal that epoch (Acquire). The
// shard's thread touches both only between reading the new epoch (Acquire) and storing `done`
// (Release).
unsafe impl Sync for Mailbox {}
// SAFETY: as above; the raw job pointer is dereferenced only under that protocol, and `Part`'s
// contents (stores, engines) are `Send`.
unsafe impl Send for Mailbox {}

struct Shard {
    mb: Arc<Mailbox>,
    handle: Option<JoinHandle<()>>,
    /// Rows of the shard's table as of its last job.
    len: usize,
}

impl Shard {
    /// The shard's state.
    fn part(&self) -> &Part {
        // SAFETY: called only by the engine (through `&self`/`&mut self`, one thread) while no job
        // runs on this shard: `run` returns only after every job it started is done.
        unsafe { &*self.mb.part.get() }
    }
}

pub struct ShardedEngine {
    placement: Placement,
    metric: Metric,
    shards: Vec<Shard>,
    kind: EngineKind,
    describe: String,
    /// Shard of every id the shards hold.
    owner: HashMap<u64, u32>,
    /// Id on every row of the server's table as of the last sync.
    row_ids: Vec<u64>,
    /// Why the shards can no longer answer (a write could not be applied to one of them).
    broken: Option<Error>,
    merge: TopK,
    /// The shard threads' busy-poll window after a job (zero: they sleep at once, and the caller
    /// sleeps too while it waits for them).
    spin: Duration,
}

/// How long a caller polls (yielding) for shard threads that sleep between jobs before it
/// sleeps itself until they finish.
const CALLER_SPIN: Duration = Duration::from_micros(20);

impl ShardedEngine {
    /// Starts `shards` threads (named `kalos-shard-N`), each building its engine with
    /// `factory(i)` on itself. `spin`: how long a thread busy-polls after a job before sleeping.
    /// Fails with the first engine's error, or when a thread cannot be started.
    pub fn new(shards: usize, placement: Placement, store: &Store, spin: Duration, factory: Arc<EngineFactory>) -> Result<ShardedEngine> {
        let (dim, metric, capacity) = (store.dim(), store.metric(), store.capacity());
        let mut out = ShardedEngine {
            placement,
            metric,
            shards: Vec::with_capacity(shards),
            kind: EngineKind::Cpu,
            describe: String::new(),
            owner: HashMap::new(),
            row_ids: Vec::new(),
            broken: None,
            merge: TopK::new(1),
            spin,
        };
        for i in 0..shards {
            let mb = Arc::new(Mailbox {
                bell: Bell::new(),
                done: AtomicU32::new(0),
                waiting: AtomicBool::new(false),
                job: UnsafeCell::new(None),
                part: UnsafeCell::new(Part {
                    store: Store::new(dim, metric, capacity, 0),
                    engine: None,
                    out: Vec::new(),
                    result: Ok(()),
                    rerank: (0, 0),
                    describe: String::new(),
                }),
                spin,
            });
            let m = Arc::clone(&mb);
            let handle = std::thread::Builder::new()
                .name(format!("kalos-shard-{i}"))
                .spawn(move || shard_thread(&m, i))
                .map_err(|e| Error::new(Status::Internal, format!("cannot start device shard thread {i}: {e}")))?;
            out.shards.push(Shard { mb, handle: Some(handle), len: 0 });
        }
        let all: Vec<usize> = (0..shards).collect();
        out.run(&all, &|i, p| {
            p.result = factory(i, &p.store).map(|e| {
                p.describe = e.describe();
                p.engine = Some(e);
            })
        });
        out.first_error(&all)?;
        let kinds: Vec<EngineKind> = out.shards.iter().filter_map(|s| s.part().engine.as_ref().map(|e| e.kind())).collect();
        out.kind = if kinds.contains(&EngineKind::Cuda) { EngineKind::Cuda } else { EngineKind::Cpu };
        out.describe = format!("shards{}x[{}]", shards, out.shards[0].part().describe);
        Ok(out)
    }

    /// Runs `job(i, part)` on the thread of every shard `i` in `targets` (distinct), in parallel,
    /// and returns when all have finished. A job that panics leaves `Err(PANIC)` as its result.
    fn run(&mut self, targets: &[usize], job: &(dyn Fn(usize, &mut Part) + Sync)) {
        for &i in targets {
            let mb = &*self.shards[i].mb;
            let e = mb.bell.epoch.load(Ordering::Relaxed).wrapping_add(1);
            // SAFETY: the shard's previous job is done (run waited for it), so its thread does not
            // read `job` until the new epoch below is published. The closure's lifetime is erased:
            // run does not return before the thread has finished this job, so the pointer is never
            // used after the borrow of `job` ends.
            unsafe {
                let p: *const (dyn Fn(usize, &mut Part) + Sync + '_) = job;
                *mb.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize, &mut Part) + Sync + '_), *const Job>(p));
            }
            mb.bell.ring(e);
        }
        for &i in targets {
            let mb = &*self.shards[i].mb;
            let e = mb.bell.epoch.load(Ordering::Relaxed);
            let t0 = Instant::now();
            let mut spins = 0u32;
            while mb.done.load(Ordering::Acquire) != e {
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(64) {
                    std::hint::spin_loop();
                } else if !self.spin.is_zero() || t0.elapsed() < CALLER_SPIN {
                    std::thread::yield_now();
                } else {
                    // Shard threads that sleep between jobs run where cores are few: a caller
                    // that kept polling would take a core from the shards it waits for.
                    mb.waiting.store(true, Ordering::SeqCst);
                    let d = mb.done.load(Ordering::SeqCst);
                    if d != e {
                        futex::wait(&mb.done, d, Duration::from_millis(50));
                    }
                    mb.waiting.store(false, Ordering::SeqCst);
                }
            }
            self.shards[i].len = self.shards[i].part().store.len();
        }
    }

    /// The first failed result among `targets`' last jobs, naming the shard.
    fn first_error(&self, targets: &[usize]) -> Result<()> {
        for &i in targets {
            if let Err(e) = &self.shards[i].part().result {
                return Err(Error::new(e.status, format!("device shard {i}: {}", e.message)));
            }
        }
        Ok(())
    }

    fn place(&self, id: u64, namespace: u64) -> u32 {
        let key = match self.placement {
            Placement::Id => id,
            Placement::Namespace => namespace,
        };
        shard_of_key(key, self.shards.len()) as u32
    }

    /// Rows each shard holds (tests, stats).
    pub fn shard_lens(&self) -> Vec<usize> {
        self.shards.iter().map(|s| s.len).collect()
    }

    /// The shards a recall with `req`'s filter must scan: those holding its namespaces under
    /// namespace placement, else all; never an empty one.
    fn targets(&self, req: &SearchRequest<'_>) -> Vec<usize> {
        let mut t: Vec<usize> = match (&self.placement, &req.filter.namespaces) {
            (Placement::Namespace, Some(ns)) => ns.iter().map(|&n| shard_of_key(n, self.shards.len())).collect(),
            _ => (0..self.shards.len()).collect(),
        };
        t.sort_unstable();
        t.dedup();
        t.retain(|&i| self.shards[i].len > 0);
        t
    }

    /// Applies the server table's changes (`dirty` rows) to the shards.
    fn apply(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        let n = store.len();
        let ns = self.shards.len();
        let mut dels: Vec<Vec<u64>> = vec![Vec::new(); ns];
        let mut ups: Vec<Vec<u32>> = vec![Vec::new(); ns];
        // Ids that were on changed rows, or on rows past the new end, and are gone from the table.
        let mut gone = |id: u64, owner: &mut HashMap<u64, u32>| {
            if store.row_of(id).is_none() {
                if let Some(s) = owner.remove(&id) {
                    dels[s as usize].push(id);
                }
            }
        };
        for &r in dirty {
            if let Some(&id) = self.row_ids.get(r as usize) {
                gone(id, &mut self.owner);
            }
        }
        for &id in self.row_ids.get(n..).unwrap_or(&[]) {
            gone(id, &mut self.owner);
        }
        self.row_ids.resize(n, u64::MAX);
        for &r in dirty {
            let r = r as usize;
            if r >= n {
                continue;
            }
            let id = store.ids()[r];
            self.row_ids[r] = id;
            let s = self.place(id, store.namespaces()[r]);
            if let Some(old) = self.owner.insert(id, s) {
                if old != s {
                    dels[old as usize].push(id);
                }
            }
            ups[s as usize].push(r as u32);
        }
        // A field retyped since a shard saw it (possible only after a clear): that shard starts
        // over from the rows it owns.
        let mut rebuild = vec![false; ns];
        for (i, flag) in rebuild.iter_mut().enumerate() {
            let cols = self.shards[i].part().store.fields();
            *flag = store.fields().columns().iter().any(|c| cols.column(&c.name).is_some_and(|mine| mine.ty != c.ty));
        }
        if rebuild.iter().any(|&b| b) {
            for (r, &id) in store.ids().iter().enumerate() {
                let s = self.owner[&id] as usize;
                if rebuild[s] {
                    ups[s].push(r as u32);
                }
            }
        }
        for u in &mut ups {
            u.sort_unstable();
            u.dedup();
        }
        let targets: Vec<usize> = (0..ns).filter(|&i| rebuild[i] || !dels[i].is_empty() || !ups[i].is_empty()).collect();
        self.run(&targets, &|i, p| {
            p.result = (|| {
                if rebuild[i] {
                    p.store = Store::new(store.dim(), store.metric(), store.capacity(), 0);
                } else {
                    p.store.delete_present(&dels[i]);
                }
                let e = p.engine.as_mut().ok_or_else(|| Error::new(Status::Internal, "no engine"))?;
                e.reserve(p.store.len() + ups[i].len())?;
                for &r in &ups[i] {
                    p.store.copy_row_from(store, r as usize);
                }
                let d = if rebuild[i] {
                    p.store.take_dirty();
                    (0..p.store.len() as u32).collect()
                } else {
                    p.store.take_dirty()
                };
                e.sync(&p.store, &d)
            })();
        });
        self.first_error(&targets)
    }
}

fn shard_thread(mb: &Mailbox, idx: usize) {
    let mut seen = 0u32;
    let mut last = Instant::now();
    loop {
        let widen = || {
            #[cfg(test)]
            if tests::WIDEN_STOP_WINDOW.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(300));
            }
        };
        let Some(e) = mb.bell.wait(seen, last, Duration::ZERO, mb.spin, widen) else {
            // SAFETY: the engine is stopping: no job runs or will run, and the owner waits for
            // this thread in `Drop` before it frees the mailbox's contents. The engine is
            // dropped here, on the thread that created it (a CUDA context is bound to it).
            unsafe { (*mb.part.get()).engine = None };
            return;
        };
        seen = e;
        // SAFETY: the caller published the job before this epoch (Acquire above) and leaves both
        // the job and the part alone until `done` says this epoch is finished.
        let (job, part) = unsafe { ((*mb.job.get()).expect("job published before its epoch"), &mut *mb.part.get()) };
        // SAFETY: the job closure outlives this call (see `ShardedEngine::run`).
        if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(idx, part) })).is_err() {
            part.result = Err(Error::new(Status::Panic, format!("device shard {idx} panicked")));
        }
        mb.done.store(seen, Ordering::SeqCst);
        if mb.waiting.load(Ordering::SeqCst) {
            futex::wake(&mb.done, 1);
        }
        last = Instant::now();
    }
}

impl Drop for ShardedEngine {
    fn drop(&mut self) {
        for s in &self.shards {
            s.mb.bell.stop();
        }
        for s in &mut self.shards {
            if let Some(h) = s.handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl Engine for ShardedEngine {
    fn kind(&self) -> EngineKind {
        self.kind
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let r = self.apply(store, dirty);
        if let Err(e) = &r {
            self.broken =
                Some(Error::new(e.status, format!("{}; the sharded table is out of date until the store is reopened", e.message)));
        }
        r
    }

    fn reserve_for(&mut self, store: &Store, items: &[UpsertItem<'_>]) -> Result<()> {
        let mut add = vec![0usize; self.shards.len()];
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        for it in items.iter().rev() {
            // The last write of an id wins: it decides where the id lands.
            if !seen.insert(it.id) {
                continue;
            }
            let s = self.place(it.id, it.namespace);
            if self.owner.get(&it.id) != Some(&s) || store.row_of(it.id).is_none() {
                add[s as usize] += 1;
            }
        }
        let targets: Vec<usize> = (0..add.len()).filter(|&i| add[i] > 0).collect();
        self.run(&targets, &|i, p| {
            p.result = match p.engine.as_mut() {
                Some(e) => e.reserve(p.store.len() + add[i]),
                None => Err(Error::new(Status::Internal, "no engine")),
            }
        });
        self.first_error(&targets)
    }

    fn search(&mut self, _store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        reset_out(out, req.nq);
        let targets = self.targets(req);
        if targets.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        let host = super::with_host_queries(req, &mut buf)?;
        // The shards get the request without its reply slot (the merged reply is the server's to
        // write) and with its queries in host memory.
        let (queries, nq, k, filter, recency, now_ms) = (host.queries, host.nq, host.k, host.filter, host.recency, host.now_ms);
        self.run(&targets, &|_, p| {
            let sub = SearchRequest { queries, nq, k, filter, recency, now_ms, direct: None, slot: None };
            p.result = match p.engine.as_mut() {
                Some(e) => {
                    let r = e.search(&p.store, &sub, &mut p.out);
                    p.rerank = e.rerank_counts();
                    r
                }
                None => Err(Error::new(Status::Internal, "no engine")),
            }
        });
        self.first_error(&targets)?;
        if let [only] = targets[..] {
            for (o, hits) in out.iter_mut().zip(&self.shards[only].part().out) {
                o.extend_from_slice(hits);
            }
            return Ok(());
        }
        let metric = self.metric;
        for (qi, o) in out.iter_mut().enumerate() {
            self.merge.reset(req.k);
            for &i in &targets {
                for h in &self.shards[i].part().out[qi] {
                    // The score back to its internal key (the conversion is its own inverse).
                    self.merge.push(key_to_score(metric, h.score), h.id);
                }
            }
            self.merge.drain_hits_into(metric, o);
        }
        Ok(())
    }

    fn rerank_counts(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |a, s| {
            let r = s.part().rerank;
            (a.0 + r.0, a.1 + r.1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::CpuEngine;
    use std::sync::atomic::AtomicUsize;

    /// Sleeps each polling shard thread between its epoch and `stop` reads, where a concurrent
    /// `Drop` lands.
    pub(super) static WIDEN_STOP_WINDOW: AtomicBool = AtomicBool::new(false);

    /// Dropping the engine right after a job, while its shard threads still poll, runs no job
    /// again: `Drop` raises `stop` and then bumps the epoch, and a thread must not take the bump
    /// for a job and call the last job's (by then dangling) closure. The job here outlives the
    /// engine, so a second run shows as a count, not as a crash.
    #[test]
    fn drop_after_a_job_runs_no_job_again() {
        let calls = AtomicUsize::new(0);
        let job = |_: usize, _: &mut Part| {
            calls.fetch_add(1, Ordering::SeqCst);
        };
        let store = Store::new(4, Metric::InnerProduct, 16, 0);
        let factory: Arc<EngineFactory> = Arc::new(|_: usize, _: &Store| -> Result<Box<dyn Engine>> { Ok(Box::new(CpuEngine::new(1))) });
        WIDEN_STOP_WINDOW.store(true, Ordering::Relaxed);
        for round in 0..50 {
            calls.store(0, Ordering::SeqCst);
            let mut e = ShardedEngine::new(3, Placement::Id, &store, Duration::from_millis(50), Arc::clone(&factory)).unwrap();
            e.run(&[0, 1, 2], &job);
            drop(e);
            assert_eq!(calls.load(Ordering::SeqCst), 3, "round {round}: a shard ran its last job again while stopping");
        }
        WIDEN_STOP_WINDOW.store(false, Ordering::Relaxed);
    }
}

//! The serve loop: take every submitted slot as one batch, run it (writes, then reads), publish
//! the answers; spin, then park on the doorbell when idle; housekeeping between batches and while
//! parked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::publish::{encode_result, Reply};
use super::Server;
use crate::engine::pool::HOT_POLL;
use crate::error::{Error, Status};
use crate::shm::{self, futex};
use crate::types::now_unix_ms;
use crate::wire::cluster::FLAG_CLUSTER;
use crate::wire::request::{body_of, op_of, RECALL_HEAD_MAX};
use crate::wire::{FLAG_FILTER, OP_GET, OP_LIST, OP_RECALL, OP_STATS};

const HOUSEKEEPING: Duration = Duration::from_millis(250);

/// Requests of at least this many bytes are copied into the mirror (a batch of queries) rather
/// than into a pooled vector.
pub(super) const MIRROR_MIN_BYTES: usize = 64 << 10;

/// A request taken from its slot for this batch.
pub(super) struct Pending {
    pub(super) slot: usize,
    pub(super) word: u64,
    pub(super) req: Vec<u8>,
    /// A large request's private copy in the server's mirror (start, length) instead of `req`
    /// (see `Server::mirror`).
    ext: Option<(*const u8, usize)>,
    /// A large recall whose queries stay in the client's slot: `req` holds a private copy of
    /// its first bytes (the header, and then some of the queries, which are ignored) and this is
    /// the whole request's length. See `Server::collect`.
    pub(super) slot_len: Option<usize>,
}

impl Pending {
    /// The private copy of the request.
    pub(super) fn bytes(&self) -> &[u8] {
        match self.ext {
            // SAFETY: a region of the server's mirror, which outlives every Pending, written by
            // `collect` for this request and not touched again until the next `collect`, which
            // runs after this batch is published and its Pendings are gone.
            Some((p, len)) => unsafe { std::slice::from_raw_parts(p, len) },
            None => &self.req,
        }
    }
    /// The request's op code (0, an unknown op, when the request is shorter than one).
    pub(super) fn op(&self) -> u32 {
        op_of(self.bytes())
    }
    /// The request body after the op code.
    pub(super) fn body(&self) -> &[u8] {
        body_of(self.bytes())
    }
}

impl Server {
    pub(super) fn run(&mut self, stop: &AtomicBool) {
        let seg = self.seg.clone();
        let h = seg.header();
        let spin = Duration::from_nanos(self.opts.server_spin_ns);
        let mut last_work = Instant::now();
        let mut last_house = Instant::now();
        loop {
            if stop.load(Ordering::Acquire) {
                if let Some(r) = &self.report {
                    for line in r.lines() {
                        eprintln!("{line}");
                    }
                }
                return;
            }
            if self.collect(true) > 0 {
                let found = Instant::now();
                self.gather_more();
                self.process_batch(found);
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
                if idle < HOT_POLL && !self.woke_client.get() {
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

    /// While fewer requests are in hand than the recently active clients may have in flight,
    /// keeps collecting for the gathering window (gather.rs).
    fn gather_more(&mut self) {
        let t0 = Instant::now();
        let window = self.gather.window(self.batch.len(), t0);
        if window.is_zero() {
            return;
        }
        let want = self.gather.expected(t0);
        while self.batch.len() < want && t0.elapsed() < window {
            std::hint::spin_loop();
            self.collect(false);
        }
    }

    /// Takes every submitted slot into the batch (`fresh`: a new batch, else more for the batch
    /// in hand); returns how many the batch holds.
    fn collect(&mut self, fresh: bool) -> usize {
        let seg = self.seg.clone();
        if fresh {
            self.mirror_used = false;
        }
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
                seg.read_data(i, &mut buf, RECALL_HEAD_MAX);
                // A recall with a metadata filter is copied whole (its header has no fixed bound).
                let flags = buf.get(12..16).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
                if op_of(&buf) == OP_RECALL && flags & (FLAG_FILTER | FLAG_CLUSTER) == 0 {
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
        self.metrics.queue_depth = self.batch.len() as u64;
        self.batch.len()
    }

    /// Runs and publishes the batch in hand, whose first request was found at `found`.
    fn process_batch(&mut self, found: Instant) {
        let t0 = Instant::now();
        let batch = std::mem::take(&mut self.batch);
        self.gather.note_batch(batch.iter().map(|p| shm::pid_of(p.word)), t0);
        let active = self.gather.expected(t0).min(u32::MAX as usize) as u32;
        self.seg.header().active_clients.store(active, Ordering::Relaxed);
        self.metrics.batches += 1;
        let mut results: Vec<Option<Reply>> = vec![None; batch.len()];
        // 0. Cluster mode: client writes go to the log, recalls this host cannot answer alone
        // to the cluster layer.
        self.route_cluster(&batch, &mut results);
        // 1. Writes, in slot order; one log commit for all of them.
        self.run_writes(&batch, &mut results);
        // 2. Reads: recalls grouped by (filter, recency) into single engine calls.
        self.do_recalls(&batch, &mut results);
        for (i, p) in batch.iter().enumerate() {
            if results[i].is_none() {
                let r = match p.op() {
                    OP_GET => self.do_get(p.body()),
                    OP_LIST => self.do_list(p.body()),
                    OP_STATS => self.do_stats(),
                    op => Err(Error::new(Status::InvalidArgument, format!("unknown request op {op}"))),
                };
                results[i] = Some(encode_result(r));
            }
        }
        // 3. Publish.
        let took = t0.elapsed();
        self.gather.note_pass(took);
        let n = batch.len();
        let ran = Instant::now();
        let woken = self.publish_batch(batch, results, crate::types::nanos(took));
        if let Some(r) = self.report.as_mut() {
            r.note(n, found, t0, ran, Instant::now(), woken);
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
            if !shm::process_alive(pid, ticks) {
                slot.free_if(w);
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
        self.checkpoint();
    }
}

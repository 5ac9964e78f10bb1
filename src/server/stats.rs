//! STATS: the server's counters, recent recall latencies and engine state.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Server;
use crate::error::Result;
use crate::error::Status;
use crate::wire::{OpLatency, OpStatusCount, Stats, Writer, LATENCY_BUCKETS_NS};

/// Op codes counted by op (1..OPS, up to OP_LIST); others count as op 0.
const OPS: usize = crate::wire::OP_LIST as usize + 1;
/// Status values counted (0..STATUSES); others count as INTERNAL.
const STATUSES: usize = 32;
const BUCKETS: usize = LATENCY_BUCKETS_NS.len() + 1;

/// Recall latencies kept for the percentiles.
const LATENCY_RING: usize = 4096;

/// Request counters and the service times of recent recalls.
pub(super) struct Metrics {
    latencies: Vec<u64>,
    lat_pos: usize,
    pub(super) requests: u64,
    pub(super) queries: u64,
    pub(super) batches: u64,
    pub(super) errors: u64,
    /// Requests taken in the last batch.
    pub(super) queue_depth: u64,
    started: Instant,
    /// Requests answered by op and status.
    by_op: [[u64; STATUSES]; OPS],
    /// Service-time histogram and sum (ns) by op.
    hist: [[u64; BUCKETS]; OPS],
    hist_sum: [u64; OPS],
}

impl Metrics {
    pub(super) fn new() -> Metrics {
        Metrics {
            latencies: Vec::with_capacity(LATENCY_RING),
            lat_pos: 0,
            requests: 0,
            queries: 0,
            batches: 0,
            errors: 0,
            queue_depth: 0,
            started: Instant::now(),
            by_op: [[0; STATUSES]; OPS],
            hist: [[0; BUCKETS]; OPS],
            hist_sum: [0; OPS],
        }
    }

    /// Counts one answered request of `op` with `status` that took `ns` (its batch's time).
    pub(super) fn count(&mut self, op: u32, status: Status, ns: u64) {
        let o = if (op as usize) < OPS { op as usize } else { 0 };
        let s = if (status as usize) < STATUSES { status as usize } else { Status::Internal as usize };
        self.by_op[o][s] += 1;
        let b = LATENCY_BUCKETS_NS.iter().position(|&ub| ns <= ub).unwrap_or(BUCKETS - 1);
        self.hist[o][b] += 1;
        self.hist_sum[o] = self.hist_sum[o].saturating_add(ns);
    }

    fn requests_by(&self) -> Vec<OpStatusCount> {
        let mut v = Vec::new();
        for (op, row) in self.by_op.iter().enumerate() {
            for (status, &count) in row.iter().enumerate().filter(|(_, &c)| c > 0) {
                v.push(OpStatusCount { op: op as u32, status: status as u32, count });
            }
        }
        v
    }

    fn latency(&self) -> Vec<OpLatency> {
        (0..OPS)
            .filter(|&o| self.hist[o].iter().any(|&c| c > 0))
            .map(|o| OpLatency { op: o as u32, buckets: self.hist[o].to_vec(), sum_ns: self.hist_sum[o] })
            .collect()
    }

    /// Keeps a recall's service time, replacing the oldest once LATENCY_RING are kept.
    pub(super) fn record_latency(&mut self, ns: u64) {
        if self.latencies.len() < LATENCY_RING {
            self.latencies.push(ns);
        } else {
            self.latencies[self.lat_pos] = ns;
        }
        self.lat_pos = (self.lat_pos + 1) % LATENCY_RING;
    }
}

impl Server {
    pub(super) fn do_stats(&self) -> Result<Vec<u8>> {
        let m = &self.metrics;
        let mut lat = m.latencies.clone();
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
            requests: m.requests,
            queries: m.queries,
            batches: m.batches,
            errors: m.errors,
            p50_ns: pct(0.5),
            p99_ns: pct(0.99),
            queue_depth: m.queue_depth,
            server_pid: h.server_pid.load(Ordering::Relaxed) as u64,
            epoch: h.epoch.load(Ordering::Relaxed),
            payload_bytes: self.store.payload_bytes() as u64,
            uptime_ms: m.started.elapsed().as_millis() as u64,
            engine_fallbacks: self.router.fallbacks(),
            engine_name: self.engine.describe(),
            fallback_reason: self.router.reason().to_string(),
            wal_bytes: self.persist.as_ref().map_or(0, |p| p.wal_bytes()),
            last_snapshot_unix_ms: self.persist.as_ref().map_or(0, |p| p.last_snapshot_unix_ms()),
            requests_by: m.requests_by(),
            latency: m.latency(),
            rerank_queries: 0,
            rerank_uncertain: 0,
        };
        let (rerank_queries, rerank_uncertain) = self.router.rerank_counts(&*self.engine);
        let s = Stats { rerank_queries, rerank_uncertain, ..s };
        let mut w = Writer::new();
        s.encode(&mut w);
        Ok(w.buf)
    }
}

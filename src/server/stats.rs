//! STATS: the server's counters, recent recall latencies and engine state.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Server;
use crate::error::Result;
use crate::wire::{Stats, Writer};

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
        }
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
        };
        let mut w = Writer::new();
        s.encode(&mut w);
        Ok(w.buf)
    }
}

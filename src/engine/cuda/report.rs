//! What the engine counts and times as it answers, and the summaries it prints when it is
//! dropped: `KALOS_CUDA_REPORT=1` (single-query round trips, batch times, batch paths taken) and
//! `KALOS_PROF=1` (the single-query kernel's phases, from its timestamps).

use super::CudaEngine;
use crate::engine::Engine;
use crate::types::Dtype;

/// Counters and timings for the reports.
pub(super) struct Stats {
    /// Single queries sent with the compact argument.
    pub(super) compact_sq: u64,
    /// Single-query responses written straight into a client's slot.
    pub(super) direct_writes: u64,
    /// GPU round trips (graph launch -> results published), ns.
    pub(super) rtt: Vec<u32>,
    /// Host time of the launch calls alone (set params + launch), beside each `rtt` entry.
    pub(super) rtt_api: Vec<u32>,
    /// KALOS_PROF=1: per request, the kernel's phase durations (ns) from its timestamps.
    pub(super) prof: Option<Vec<[u32; 9]>>,
    /// Engine time of each batched search (queries, ns).
    pub(super) batch_times: Vec<(usize, u64)>,
    /// Batches answered again from f32 tiles after an f16 overflow.
    pub(super) score16_overflows: u64,
    /// Batches answered with gated tiles.
    pub(super) gated_batches: u64,
    /// Batches answered from queries in a client's slot.
    pub(super) slot_batches: u64,
    /// Filtered searches: (plan, filter evaluation incl. the count read back, row list read
    /// back, scoring) in ns; plan 0 = empty, 1 = rows, 2 = mask, 3 = CPU.
    pub(super) filter_phases: Vec<(u8, [u32; 3])>,
}

impl CudaEngine {
    /// Prints the reports asked for (on drop).
    pub(super) fn report(&self) {
        let s = &self.stats;
        if !s.rtt.is_empty() && crate::config::tuning_or_default().cuda_report {
            let mut v = s.rtt.clone();
            v.sort_unstable();
            let mut a = s.rtt_api.clone();
            a.sort_unstable();
            eprintln!(
                "kalos cuda engine ({}): {} single-query GPU round trips (graph launch -> results in host memory): p50 {:.1} us, p99 {:.1} us (of which the launch calls on the host p50 {:.1} us; mode {:?}, {} with the compact argument); {} responses written into the client's slot by the kernel",
                self.describe(),
                v.len(),
                v[v.len() / 2] as f64 / 1000.0,
                v[(v.len() * 99) / 100] as f64 / 1000.0,
                a[a.len() / 2] as f64 / 1000.0,
                self.sq.mode,
                s.compact_sq,
                s.direct_writes
            );
        }
        if self.multi.passes > 0 && crate::config::tuning_or_default().cuda_report {
            eprintln!(
                "kalos cuda engine ({}): {} multi-query passes answered {} queries (blocks per SM of the 8/16/32-query variants: {:?})",
                self.describe(),
                self.multi.passes,
                self.multi.queries,
                self.multi.per_sm
            );
        }
        if !s.batch_times.is_empty() && crate::config::tuning_or_default().cuda_report {
            // Per batch size: a benchmark's 1024-query batches and its small recall checks apart.
            let mut sizes: Vec<usize> = s.batch_times.iter().map(|&(nq, _)| nq).collect();
            sizes.sort_unstable();
            sizes.dedup();
            for nq in sizes {
                let mut v: Vec<u64> = s.batch_times.iter().filter(|&&(m, _)| m == nq).map(|&(_, t)| t).collect();
                v.sort_unstable();
                eprintln!(
                    "kalos cuda engine ({}): {} batched searches of {} queries, engine time p50 {:.3} ms, min {:.3} ms, max {:.3} ms",
                    self.describe(),
                    v.len(),
                    nq,
                    v[v.len() / 2] as f64 / 1e6,
                    v[0] as f64 / 1e6,
                    v[v.len() - 1] as f64 / 1e6
                );
            }
            eprintln!(
                "kalos cuda engine ({}): batch score tiles {}; {} batch(es) answered again from f32 tiles after an f16 overflow; {} batch(es) copied to the device from the client's slot; {} gated batch(es){}{}",
                self.describe(),
                if self.batch.score16 { "f16" } else if self.dtype == Dtype::F32 { "f32" } else { "f32 (f16 off or overflowed)" },
                s.score16_overflows,
                s.slot_batches,
                s.gated_batches,
                self.gate.off.as_ref().map_or(String::new(), |m| format!(" (gating off: {m})")),
                self.gate.lt.as_ref().map_or(String::new(), |l| if l.tuned.is_empty() { String::new() } else { format!("; gated GEMM {}", l.tuned.join("; ")) })
            );
        }
        if !s.filter_phases.is_empty() && crate::config::tuning_or_default().cuda_report {
            for (plan, name) in [(0u8, "empty"), (1, "rows"), (2, "mask"), (3, "cpu")] {
                let v: Vec<[u32; 3]> = s.filter_phases.iter().filter(|(p, _)| *p == plan).map(|(_, t)| *t).collect();
                if v.is_empty() {
                    continue;
                }
                let p50 = |i: usize| {
                    let mut x: Vec<u32> = v.iter().map(|a| a[i]).collect();
                    x.sort_unstable();
                    x[x.len() / 2] as f64 / 1000.0
                };
                eprintln!(
                    "kalos cuda engine ({}): {} filtered searches planned '{name}', p50: filter evaluation {:.1} us, row list read back {:.1} us, scoring {:.1} us",
                    self.describe(),
                    v.len(),
                    p50(0),
                    p50(1),
                    p50(2)
                );
            }
        }
        if let Some(v) = s.prof.as_ref().filter(|v| !v.is_empty()) {
            let p50 = |i: usize| {
                let mut x: Vec<u32> = v.iter().map(|a| a[i]).collect();
                x.sort_unstable();
                x[x.len() / 2] as f64 / 1000.0
            };
            eprintln!(
                "kalos cuda kernel phases ({}), p50 of {}: block-0 scan {:.1} us, block-0 select {:.1} us, wait for the last block {:.1} us, final merge {:.1} us (read bound {:.1}, compact {:.1}, rank+write {:.1}), publish fence {:.1} us; merge candidates {:.0}, survivors {:.0}",
                self.describe(),
                v.len(),
                p50(0),
                p50(1),
                p50(2),
                p50(3) + p50(4) + p50(5),
                p50(3),
                p50(4),
                p50(5),
                p50(6),
                p50(7) * 1000.0,
                p50(8) * 1000.0
            );
        }
    }
}

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
    /// Filtered searches: (plan, three phases in ns). Plans waited for (`FILTER_EMPTY` ..
    /// `FILTER_CPU`): filter evaluation incl. the count read back, row list read back, scoring.
    /// Plans guessed from the filter's last count (`FILTER_GUESS_*`): the evaluation's launch
    /// calls, the gather's launch call, the rest until the answer (the evaluation, gather and
    /// scan on the GPU, and the count read).
    pub(super) filter_phases: Vec<(u8, [u32; 3])>,
    /// Single queries answered from a guessed plan: [the count then called for another plan,
    /// it confirmed the guess].
    pub(super) filter_guesses: [u64; 2],
    /// int8 single queries whose blocks kept `KCUT` candidates each, and those of them scanned
    /// again because the cut could have changed the answer.
    pub(super) cut_queries: u64,
    pub(super) cut_retries: u64,
    /// int8 single queries that took the 4-bit first pass.
    pub(super) nibble_queries: u64,
}

pub(super) const FILTER_EMPTY: u8 = 0;
pub(super) const FILTER_ROWS: u8 = 1;
pub(super) const FILTER_MASK: u8 = 2;
pub(super) const FILTER_CPU: u8 = 3;
/// Guessed dense: evaluation and masked scan enqueued together.
pub(super) const FILTER_GUESS_MASK: u8 = 4;
/// Guessed sparse: evaluation, gather and compact scan enqueued together, the compact table
/// large enough.
pub(super) const FILTER_GUESS_SPARSE: u8 = 5;
/// Guessed sparse, but more rows matched than the compact table took: scanned again with the
/// mask.
pub(super) const FILTER_GUESS_RESCAN: u8 = 6;

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
        if s.cut_queries + s.cut_retries > 0 && crate::config::tuning_or_default().cuda_report {
            eprintln!(
                "kalos cuda engine ({}): {} int8 single queries kept {} candidates a block; {} more were scanned again without the cut (it could have changed their answer)",
                self.describe(),
                s.cut_queries,
                super::compile::KCUT,
                s.cut_retries
            );
        }
        if s.nibble_queries > 0 && crate::config::tuning_or_default().cuda_report {
            eprintln!("kalos cuda engine ({}): {} int8 single queries took the 4-bit first pass", self.describe(), s.nibble_queries);
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
            let waited = ["filter evaluation (launch, kernel, count read back)", "row list read back", "scoring"];
            let guessed = ["evaluation launch calls", "gather launch call", "evaluation + scan on the GPU until the answer"];
            for (plan, name, phases) in [
                (FILTER_EMPTY, "empty", waited),
                (FILTER_ROWS, "rows", waited),
                (FILTER_MASK, "mask", waited),
                (FILTER_CPU, "cpu", waited),
                (FILTER_GUESS_MASK, "mask, guessed (no wait for the count)", guessed),
                (FILTER_GUESS_SPARSE, "sparse, guessed (no wait for the count)", guessed),
                (FILTER_GUESS_RESCAN, "sparse, guessed, too many rows: rescanned with the mask", guessed),
            ] {
                let v: Vec<[u32; 3]> = s.filter_phases.iter().filter(|(p, _)| *p == plan).map(|(_, t)| *t).collect();
                if v.is_empty() {
                    continue;
                }
                let p50 = |f: &dyn Fn(&[u32; 3]) -> u32| {
                    let mut x: Vec<u32> = v.iter().map(f).collect();
                    x.sort_unstable();
                    x[x.len() / 2] as f64 / 1000.0
                };
                eprintln!(
                    "kalos cuda engine ({}): {} filtered searches planned '{name}', p50: {} {:.1} us, {} {:.1} us, {} {:.1} us; total {:.1} us",
                    self.describe(),
                    v.len(),
                    phases[0],
                    p50(&|a| a[0]),
                    phases[1],
                    p50(&|a| a[1]),
                    phases[2],
                    p50(&|a| a[2]),
                    p50(&|a| a[0].saturating_add(a[1]).saturating_add(a[2]))
                );
            }
            let [wrong, right] = s.filter_guesses;
            if wrong + right > 0 {
                eprintln!(
                    "kalos cuda engine ({}): filtered searches planned from the filter's last count (single queries): {right} confirmed by the new count, {wrong} not (answered exactly all the same)",
                    self.describe()
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
